//! Builds [`ModelWeights`] and [`DsparkWeights`] from a loaded checkpoint,
//! following the tensor names of `v41-flash.md` §12 and the layer roles of
//! the config; applies the reference's load-time conversions (`wo_a`
//! dequantised to BF16, expert I8 bytes read as packed e2m1 pairs).
//!
//! Invariant: the checkpoint was validated against the same config's
//! manifest, so every name asked for here exists with the expected dtype
//! and shape; the dense weights are FP8 (a BF16-dense checkpoint is
//! rejected with an error).

use super::checkpoint::Checkpoint;
use super::config::{LayerPlan, ModelConfig, WeightFormat};
use super::dspark::DsparkWeights;
use super::weights::*;
use crate::cpu_backend::numpy_rng::engram_multipliers;
use crate::error::{Error, Result};

fn fp8(ck: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Fp8Linear> {
    Ok(Fp8Linear {
        weight: ck.e4m3(&format!("{base}.weight"))?,
        scale: ck.e8m0(&format!("{base}.scale"))?,
        out_dim,
        in_dim,
    })
}

fn fp4(ck: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Fp4Linear> {
    Ok(Fp4Linear {
        weight: ck.fp4x2(&format!("{base}.weight"))?,
        scale: ck.e8m0(&format!("{base}.scale"))?,
        out_dim,
        in_dim,
    })
}

fn bf16_linear(ck: &Checkpoint, base: &str, out_dim: usize, in_dim: usize) -> Result<Bf16Linear> {
    Ok(Bf16Linear {
        weight: ck.bf16(&format!("{base}.weight"))?,
        out_dim,
        in_dim,
    })
}

fn hc(ck: &Checkpoint, prefix: &str, which: &str) -> Result<HcWeights> {
    let base = ck.f32(&format!("{prefix}.hc_{which}_base"))?;
    let scale = ck.f32(&format!("{prefix}.hc_{which}_scale"))?;
    let bad = |name: &str, len: usize| Error::Argument {
        op: "load weights",
        arg: "hc",
        value: format!("{prefix}.hc_{which}_{name} has {len} values"),
        why: "mHC with 4 streams needs 24 base values and 3 scales",
    };
    Ok(HcWeights {
        func: ck.f32(&format!("{prefix}.hc_{which}_fn"))?,
        base: base
            .as_slice()
            .try_into()
            .map_err(|_| bad("base", base.len()))?,
        scale: scale
            .as_slice()
            .try_into()
            .map_err(|_| bad("scale", scale.len()))?,
    })
}

fn attention(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    plan: &LayerPlan,
    p: &str,
) -> Result<AttentionWeights> {
    let (d, a) = (cfg.hidden_size, cfg.attention);
    let (hd, qr) = (a.head_dim, a.q_lora_rank);
    let wo_a = fp8(
        ck,
        &format!("{p}.attn.wo_a"),
        a.o_groups * a.o_lora_rank,
        a.n_heads * hd / a.o_groups,
    )?;
    let compressor = match plan.compressor {
        Some(c) => Some(CompressorWeights {
            wkv: bf16_linear(ck, &format!("{p}.attn.compressor.wkv"), hd, d)?,
            wgate: if c.gated {
                Some(bf16_linear(
                    ck,
                    &format!("{p}.attn.compressor.wgate"),
                    hd,
                    d,
                )?)
            } else {
                None
            },
            norm: ck.bf16(&format!("{p}.attn.compressor.norm.weight"))?,
        }),
        None => None,
    };
    let (ih, ihd) = (cfg.indexer.n_heads, cfg.indexer.head_dim);
    let indexer = if plan.is_index_source() {
        Some(IndexerWeights {
            wq_b: fp8(ck, &format!("{p}.attn.indexer.wq_b"), ih * ihd, qr)?,
            weights_proj: bf16_linear(ck, &format!("{p}.attn.indexer.weights_proj"), ih, d)?,
            keys: if plan.owns_index_keys() {
                Some(IndexKeyWeights {
                    wk: bf16_linear(ck, &format!("{p}.attn.indexer.wk"), ihd, hd)?,
                    k_norm: ck.bf16(&format!("{p}.attn.indexer.k_norm.weight"))?,
                })
            } else {
                None
            },
        })
    } else {
        None
    };
    Ok(AttentionWeights {
        wq_a: fp8(ck, &format!("{p}.attn.wq_a"), qr, d)?,
        q_norm: ck.bf16(&format!("{p}.attn.q_norm.weight"))?,
        wq_b: fp8(ck, &format!("{p}.attn.wq_b"), a.n_heads * hd, qr)?,
        wkv: fp8(ck, &format!("{p}.attn.wkv"), hd, d)?,
        kv_norm: ck.bf16(&format!("{p}.attn.kv_norm.weight"))?,
        wo_a: wo_a.dequantize(),
        wo_b: fp8(ck, &format!("{p}.attn.wo_b"), d, a.o_groups * a.o_lora_rank)?,
        sink: ck.f32(&format!("{p}.attn.attn_sink"))?,
        compressor,
        indexer,
    })
}

fn moe(ck: &Checkpoint, cfg: &ModelConfig, p: &str, n_experts: usize) -> Result<MoeWeights> {
    let (d, i) = (cfg.hidden_size, cfg.moe.inter_dim);
    let experts = (0..n_experts)
        .map(|e| {
            let b = format!("{p}.ffn.experts.{e}");
            Ok(Expert {
                w1: fp4(ck, &format!("{b}.w1"), i, d)?,
                w2: fp4(ck, &format!("{b}.w2"), d, i)?,
                w3: fp4(ck, &format!("{b}.w3"), i, d)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let s = format!("{p}.ffn.shared_experts");
    let si = cfg.moe.n_shared_experts * i;
    Ok(MoeWeights {
        gate: bf16_linear(ck, &format!("{p}.ffn.gate"), n_experts, d)?,
        bias: ck.f32(&format!("{p}.ffn.gate.bias"))?,
        experts,
        shared: Expert {
            w1: fp8(ck, &format!("{s}.w1"), si, d)?,
            w2: fp8(ck, &format!("{s}.w2"), d, si)?,
            w3: fp8(ck, &format!("{s}.w3"), si, d)?,
        },
    })
}

fn engram(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    p: &str,
    table: usize,
    layer: usize,
) -> Result<EngramWeights> {
    let (d, e) = (cfg.hidden_size, &cfg.engram);
    let values = ck.e4m3(&format!("{p}.engram.embed.weight"))?;
    let scales = ck.e8m0(&format!("{p}.engram.embed.scale"))?;
    let per_row = e.head_dim / 32;
    let rows_bytes = values
        .chunks(e.head_dim)
        .zip(scales.chunks(per_row))
        .flat_map(|(v, s)| {
            v.iter()
                .map(|x| x.0)
                .chain(s.iter().map(|x| x.0))
                .collect::<Vec<_>>()
        })
        .collect();
    let primes = e.table_primes()?.swap_remove(table);
    Ok(EngramWeights {
        table: rows_bytes,
        wkv: fp8(
            ck,
            &format!("{p}.engram.wkv"),
            (cfg.mhc.mult + 1) * d,
            e.columns() * e.head_dim,
        )?,
        q_weight: ck.bf16(&format!("{p}.engram.q_weight"))?,
        k_weight: ck.bf16(&format!("{p}.engram.k_weight"))?,
        primes,
        multipliers: engram_multipliers(layer as u64, e.compressed_vocab as u64),
    })
}

fn block(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    plan: &LayerPlan,
    prefix: &str,
    n_experts: usize,
) -> Result<BlockWeights> {
    Ok(BlockWeights {
        attn_norm: ck.bf16(&format!("{prefix}.attn_norm.weight"))?,
        ffn_norm: ck.bf16(&format!("{prefix}.ffn_norm.weight"))?,
        hc_attn: hc(ck, prefix, "attn")?,
        hc_ffn: hc(ck, prefix, "ffn")?,
        attn: attention(ck, cfg, plan, prefix)?,
        ffn: moe(ck, cfg, prefix, n_experts)?,
        engram: match plan.engram {
            Some(t) => Some(engram(ck, cfg, prefix, t, plan.layer)?),
            None => None,
        },
    })
}

/// The Engram token map when no tokenizer-derived map is supplied: token id
/// modulo the compressed vocabulary. Real checkpoints need the map computed
/// from the tokenizer (spec §8.1); test configs use this one.
pub fn modulo_token_map(cfg: &ModelConfig) -> Vec<i64> {
    (0..cfg.vocab_size)
        .map(|t| (t % cfg.engram.compressed_vocab.max(1)) as i64)
        .collect()
}

/// Loads the backbone and (when the config has stages) the drafter.
pub fn load_weights(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    if cfg.quant.weights != WeightFormat::Fp8 || cfg.quant.experts != WeightFormat::Fp4 {
        return Err(Error::Argument {
            op: "load weights",
            arg: "quantization_config",
            value: format!(
                "{:?} dense, {:?} experts",
                cfg.quant.weights, cfg.quant.experts
            ),
            why: "the CPU model runs FP8 dense weights with FP4 experts (V4.1's formats)",
        });
    }
    let plans = cfg.layer_plans()?;
    let d = cfg.hidden_size;
    let blocks = plans[..cfg.n_layers]
        .iter()
        .map(|plan| {
            block(
                ck,
                cfg,
                plan,
                &format!("layers.{}", plan.layer),
                cfg.moe.n_routed_experts,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let weights = ModelWeights {
        embed: ck.bf16("embed.weight")?,
        head: bf16_linear(ck, "head", cfg.vocab_size, d)?,
        norm: ck.bf16("norm.weight")?,
        blocks,
        engram_token_map: token_map,
    };
    let ds = &cfg.dspark;
    if ds.n_stages == 0 {
        return Ok((weights, None));
    }
    let last = format!("mtp.{}", ds.n_stages - 1);
    let stages = plans[cfg.n_layers..]
        .iter()
        .enumerate()
        .map(|(s, plan)| block(ck, cfg, plan, &format!("mtp.{s}"), ds.n_routed_experts))
        .collect::<Result<Vec<_>>>()?;
    let dspark = DsparkWeights {
        main_proj: fp8(ck, "mtp.0.main_proj", d, ds.target_layers.len() * d)?,
        main_norm: ck.bf16("mtp.0.main_norm.weight")?,
        stages,
        norm: ck.bf16(&format!("{last}.norm.weight"))?,
        markov_embed: ck.bf16(&format!("{last}.markov_head.embed.weight"))?,
        markov_head: bf16_linear(
            ck,
            &format!("{last}.markov_head.head"),
            cfg.vocab_size,
            ds.markov_rank,
        )?,
        confidence: ck.bf16(&format!("{last}.confidence_head.proj.weight"))?,
    };
    Ok((weights, Some(dspark)))
}
