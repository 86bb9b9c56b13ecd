//! Builds [`ModelWeights`] and [`DsparkWeights`] from a loaded checkpoint,
//! or from any other [`TensorSource`] (the in-memory random weights of
//! [`random_weights_on`]), following the tensor names of `v41-flash.md` §12 and the layer roles of
//! the config; applies the reference's load-time conversions (`wo_a`
//! dequantised to BF16, expert I8 bytes read as packed e2m1 pairs).
//!
//! Invariant: the source (a checkpoint, or random weights) was validated
//! against the same config's manifest, so every name asked for here exists with the expected dtype
//! and shape; the dense weights are FP8 (a BF16-dense checkpoint is
//! rejected with an error).
//!
//! Weights land on the device the load names. A stored tensor goes from the
//! memory-mapped shard straight to it (on a GPU, one upload from the page
//! cache, with no host tensor between), or, for random weights on a GPU, is
//! generated there (`TensorSource::on_device`, the experts stacked on the
//! device). The conversions run on the weights' device too: `wo_a` is
//! dequantised by `ops::mxfp8_dequantize` and the Engram rows are joined
//! by `ops::cat_cols`; only the experts of a checkpoint (stacked) and the
//! mHC vectors (checked) pass through the host, one tensor at a time.
//! Engram tables placed on the host (`WeightOptions::engram`) are the
//! exception: each is joined on the host from its stored values and scales
//! read in place and stays there (one copy of the table, about 101 GB at
//! V4.1's size). Once a
//! tensor is converted its pages leave the page cache (`Src`), and a shard
//! leaves it whole once all its tensors are converted (the kernel drops
//! cache only in whole folios), so a host holds a second copy of at most
//! the shards being converted, and none once the load returns. Random
//! weights are generated tensor by tensor as the loader asks for them, so
//! the host never holds more than one parameter's bytes.

use super::checkpoint::{Checkpoint, CheckpointError, RandomWeights, TensorSource, TensorView};
use super::config::{LayerPlan, ModelConfig, WeightFormat};
use super::dspark::DsparkWeights;
use super::forward::ModelWeights;
use super::layers::Block;
use super::layers::attention::{Attention, Compressor, IndexKeys, Indexer};
use super::layers::engram::{Engram, EngramPlacement};
use super::layers::linear::{Bf16Linear, Fp4Experts, Fp8Linear};
use super::layers::mhc::Hc;
use super::layers::moe::{Moe, SharedExpert};
use crate::contract::MX_BLOCK;
use crate::device::Device;
use crate::dtype::Fp4x2;
use crate::model::error::{Error, Result};
use crate::numpy_rng::engram_multipliers;
use crate::ops;
use crate::tensor::Tensor;

/// The tensor source, the device its weights are loaded onto and where the
/// Engram tables go.
struct Src<'a, S> {
    ck: &'a S,
    dev: &'a Device,
    engram: EngramPlacement,
}

impl<S> Clone for Src<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Src<'_, S> {}

/// Every read of a stored tensor goes through these methods, which release
/// it from the source (`TensorSource::release`: a checkpoint's pages leave
/// the page cache) once the loader holds its own copy: on the CPU a host
/// then keeps one copy of a weight (the heap tensor), not two; on a GPU,
/// none.
impl<S: TensorSource> Src<'_, S> {
    /// Stored tensor `name` on the device, as `shape` (the manifest checked
    /// its element count; the reshape restates it).
    fn raw(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        Ok(self.stored(name)?.reshape(shape)?)
    }

    /// A stored vector on the device.
    fn vector(&self, name: &str) -> Result<Tensor> {
        let t = self.stored(name)?;
        let n = t.numel();
        Ok(t.reshape(&[n])?)
    }

    /// Stored tensor `name` on the device, made there by the source when it
    /// can (random weights on a GPU), else read from its bytes.
    fn stored(&self, name: &str) -> Result<Tensor> {
        let t = match self.ck.on_device(name, self.dev)? {
            Some(t) => t,
            None => self.ck.read(name, |v| v.to_tensor_on(self.dev))?,
        };
        self.ck.release(name);
        Ok(t)
    }

    /// A stored tensor's values on the host, converted by `read`.
    fn host<T>(
        &self,
        name: &str,
        read: impl FnOnce(&TensorView<'_>) -> std::result::Result<Vec<T>, CheckpointError>,
    ) -> Result<Vec<T>> {
        let v = self.ck.read(name, |view| Ok(read(&view)?))?;
        self.ck.release(name);
        Ok(v)
    }

    /// A tensor built on the host, moved to the device.
    fn moved(&self, host: Tensor) -> Result<Tensor> {
        Ok(match self.dev {
            Device::Cpu => host,
            d => host.to_device(d)?,
        })
    }
}

fn fp8<S: TensorSource>(w: Src<S>, base: &str, out_dim: usize, in_dim: usize) -> Result<Fp8Linear> {
    Ok(Fp8Linear {
        weight: w.raw(&format!("{base}.weight"), &[out_dim, in_dim])?,
        scale: w.raw(
            &format!("{base}.scale"),
            &[out_dim.div_ceil(MX_BLOCK), in_dim.div_ceil(MX_BLOCK)],
        )?,
    })
}

/// An FP8 weight dequantised to BF16 on the device (`ops::mxfp8_dequantize`:
/// e4m3 × 2^e, rounded once), as the reference does for `wo_a`.
fn fp8_dequantized<S: TensorSource>(
    src: Src<S>,
    base: &str,
    out_dim: usize,
    in_dim: usize,
) -> Result<Tensor> {
    let w = fp8(src, base, out_dim, in_dim)?;
    Ok(ops::mxfp8_dequantize(&w.weight, &w.scale)?)
}

/// One projection of experts `0..n` stacked `[E, out, in]`.
fn fp4_experts<S: TensorSource>(
    src: Src<S>,
    p: &str,
    which: &str,
    n: usize,
    out_dim: usize,
    in_dim: usize,
) -> Result<Fp4Experts> {
    let name = |e: usize, what: &str| format!("{p}.ffn.experts.{e}.{which}.{what}");
    if let Some((w, s)) = fp4_experts_on_device(src, &name, n)? {
        let stack = |parts: &[Tensor], cols: usize| -> Result<Tensor> {
            let refs: Vec<&Tensor> = parts.iter().collect();
            Ok(Tensor::cat_rows(&refs)?.reshape(&[n, out_dim, cols])?)
        };
        return Ok(Fp4Experts {
            weight: stack(&w, in_dim)?,
            scale: stack(&s, in_dim.div_ceil(MX_BLOCK))?,
        });
    }
    let (mut w, mut s): (Vec<Fp4x2>, Vec<_>) = (Vec::new(), Vec::new());
    for e in 0..n {
        w.extend(src.host(&name(e, "weight"), |v| v.to_fp4x2())?);
        s.extend(src.host(&name(e, "scale"), |v| v.to_e8m0())?);
    }
    Ok(Fp4Experts {
        weight: src.moved(Tensor::from_vec(w, &[n, out_dim, in_dim])?)?,
        scale: src.moved(Tensor::from_vec(
            s,
            &[n, out_dim, in_dim.div_ceil(MX_BLOCK)],
        )?)?,
    })
}

/// The experts' weights and scales made on the device by the source (see
/// [`Src::stored`]), or `None` when the source has only host bytes (or
/// there are no experts).
fn fp4_experts_on_device<S: TensorSource>(
    src: Src<S>,
    name: &dyn Fn(usize, &str) -> String,
    n: usize,
) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
    let (mut weights, mut scales) = (Vec::with_capacity(n), Vec::with_capacity(n));
    if n == 0 {
        return Ok(None);
    }
    for e in 0..n {
        let (w, s) = (name(e, "weight"), name(e, "scale"));
        let Some(weight) = src.ck.on_device(&w, src.dev)? else {
            return Ok(None);
        };
        let scale = src.ck.on_device(&s, src.dev)?.ok_or_else(|| {
            Error::Op(crate::Error::Argument {
                op: "load weights",
                arg: "source",
                value: s.clone(),
                why: "the source made an expert's weight on the device but not its scale",
            })
        })?;
        src.ck.release(&w);
        src.ck.release(&s);
        weights.push(weight);
        scales.push(scale);
    }
    Ok(Some((weights, scales)))
}

fn bf16_linear<S: TensorSource>(
    w: Src<S>,
    base: &str,
    out_dim: usize,
    in_dim: usize,
) -> Result<Bf16Linear> {
    Ok(Bf16Linear {
        weight: w.raw(&format!("{base}.weight"), &[out_dim, in_dim])?,
    })
}

fn hc<S: TensorSource>(src: Src<S>, cfg: &ModelConfig, prefix: &str, which: &str) -> Result<Hc> {
    let base = src.host(&format!("{prefix}.hc_{which}_base"), |v| v.to_f32())?;
    let scale = src.host(&format!("{prefix}.hc_{which}_scale"), |v| v.to_f32())?;
    if base.len() != 24 || scale.len() != 3 {
        return Err(Error::Op(crate::Error::Argument {
            op: "load weights",
            arg: "hc",
            value: format!(
                "{prefix}.hc_{which}_base has {} values, _scale {}",
                base.len(),
                scale.len()
            ),
            why: "mHC with 4 streams needs 24 base values and 3 scales",
        }));
    }
    Ok(Hc {
        func: src.raw(
            &format!("{prefix}.hc_{which}_fn"),
            &[24, 4 * cfg.hidden_size],
        )?,
        base: src.moved(Tensor::from_vec(base, &[24])?)?,
        scale: src.moved(Tensor::from_vec(scale, &[3])?)?,
    })
}

fn attention<S: TensorSource>(
    ck: Src<S>,
    cfg: &ModelConfig,
    plan: &LayerPlan,
    p: &str,
) -> Result<Attention> {
    let (d, a) = (cfg.hidden_size, cfg.attention);
    let (hd, qr) = (a.head_dim, a.q_lora_rank);
    let wo_a = fp8_dequantized(
        ck,
        &format!("{p}.attn.wo_a"),
        a.o_groups * a.o_lora_rank,
        a.n_heads * hd / a.o_groups,
    )?;
    let compressor = match plan.compressor {
        Some(c) => Some(Compressor {
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
            norm: ck.vector(&format!("{p}.attn.compressor.norm.weight"))?,
        }),
        None => None,
    };
    let (ih, ihd) = (cfg.indexer.n_heads, cfg.indexer.head_dim);
    let indexer = if plan.is_index_source() {
        Some(Indexer {
            wq_b: fp8(ck, &format!("{p}.attn.indexer.wq_b"), ih * ihd, qr)?,
            weights_proj: bf16_linear(ck, &format!("{p}.attn.indexer.weights_proj"), ih, d)?,
            keys: if plan.owns_index_keys() {
                Some(IndexKeys {
                    wk: bf16_linear(ck, &format!("{p}.attn.indexer.wk"), ihd, hd)?,
                    k_norm: ck.vector(&format!("{p}.attn.indexer.k_norm.weight"))?,
                })
            } else {
                None
            },
        })
    } else {
        None
    };
    Ok(Attention {
        wq_a: fp8(ck, &format!("{p}.attn.wq_a"), qr, d)?,
        q_norm: ck.vector(&format!("{p}.attn.q_norm.weight"))?,
        wq_b: fp8(ck, &format!("{p}.attn.wq_b"), a.n_heads * hd, qr)?,
        wkv: fp8(ck, &format!("{p}.attn.wkv"), hd, d)?,
        kv_norm: ck.vector(&format!("{p}.attn.kv_norm.weight"))?,
        wo_a,
        wo_b: fp8(ck, &format!("{p}.attn.wo_b"), d, a.o_groups * a.o_lora_rank)?,
        sink: ck.vector(&format!("{p}.attn.attn_sink"))?,
        compressor,
        indexer,
    })
}

fn moe<S: TensorSource>(ck: Src<S>, cfg: &ModelConfig, p: &str, n_experts: usize) -> Result<Moe> {
    let (d, i) = (cfg.hidden_size, cfg.moe.inter_dim);
    let s = format!("{p}.ffn.shared_experts");
    let si = cfg.moe.n_shared_experts * i;
    // Image spans are not served, so `bias_vl` is not loaded; releasing it
    // lets its shard leave the page cache as soon as the rest is converted.
    ck.ck.release(&format!("{p}.ffn.gate.bias_vl"));
    Ok(Moe {
        gate: bf16_linear(ck, &format!("{p}.ffn.gate"), n_experts, d)?,
        bias: ck.vector(&format!("{p}.ffn.gate.bias"))?,
        w13: {
            let (w1, w3) = (
                fp4_experts(ck, p, "w1", n_experts, i, d)?,
                fp4_experts(ck, p, "w3", n_experts, i, d)?,
            );
            Fp4Experts {
                weight: gate_up(w1.weight, w3.weight, MX_BLOCK)?,
                scale: gate_up(w1.scale, w3.scale, MX_BLOCK)?,
            }
        },
        w2: fp4_experts(ck, p, "w2", n_experts, d, i)?,
        shared: SharedExpert {
            w13: {
                let (w1, w3) = (
                    fp8(ck, &format!("{s}.w1"), si, d)?,
                    fp8(ck, &format!("{s}.w3"), si, d)?,
                );
                Fp8Linear {
                    weight: gate_up(w1.weight, w3.weight, MX_BLOCK)?,
                    scale: gate_up(w1.scale, w3.scale, 1)?,
                }
            },
            w2: fp8(ck, &format!("{s}.w2"), d, si)?,
        },
    })
}

/// The gate (`w1`) and up (`w3`) projections (`[.., rows, cols]`, one
/// shape) as one `[.., 2 · rows, cols]`, their rows interleaved in units of
/// `unit` rows (32 weight rows, or one row of a 32 × 32 block-scale grid):
/// unit j of `g`, then unit j of `u`, over the experts' rows too. The layout
/// the SwiGLU reads (`ops::swiglu_act_quant_fp8`); built on the weights'
/// device by `ops::cat_cols` (the config keeps inter a multiple of 32, so
/// units are whole).
fn gate_up(g: Tensor, u: Tensor, unit: usize) -> Result<Tensor> {
    let mut shape = g.shape().to_vec();
    let cols = shape.last().copied().unwrap_or(0);
    if let Some(rows) = shape.iter_mut().rev().nth(1) {
        *rows *= 2;
    }
    let width = unit * cols;
    let units = g.numel() / width.max(1);
    let (g, u) = (g.reshape(&[units, width])?, u.reshape(&[units, width])?);
    Ok(ops::cat_cols(&[&g, &u])?.reshape(&shape)?)
}

/// A host Engram table U8 `[rows, head_dim + head_dim/32]` joined straight
/// from the stored values `[rows, head_dim]` and scales `[rows,
/// head_dim/32]` (one byte each), read in place: the host holds one copy of
/// the table (about 101 GB at V4.1's size), not the parts and the join.
fn host_table<S: TensorSource>(
    src: Src<S>,
    values: &str,
    scales: &str,
    head_dim: usize,
) -> Result<Tensor> {
    let per_row = head_dim / MX_BLOCK;
    if per_row == 0 || !head_dim.is_multiple_of(MX_BLOCK) {
        return Err(Error::Op(crate::Error::Argument {
            op: "load engram table",
            arg: "engram_head_dim",
            value: head_dim.to_string(),
            why: "a positive multiple of 32 (one E8M0 scale per 32 values)",
        }));
    }
    let rb = head_dim + per_row;
    let (n, joined) = src.ck.read(values, |v| {
        src.ck.read(scales, |s| {
            let (vb, sb) = (v.bytes(), s.bytes());
            let n = vb.len() / head_dim.max(1);
            if vb.len() != n * head_dim {
                return Err(Error::Op(crate::Error::Shape {
                    op: "load engram table",
                    tensor: "engram.embed.weight",
                    got: v.shape().to_vec(),
                    expected: format!("rows of {head_dim} values"),
                }));
            }
            if sb.len() != n * per_row {
                return Err(Error::Op(crate::Error::Shape {
                    op: "load engram table",
                    tensor: "engram.embed.scale",
                    got: s.shape().to_vec(),
                    expected: format!("[{n}, {per_row}] (one scale per 32 of the values' rows)"),
                }));
            }
            let mut out = Vec::new();
            out.try_reserve_exact(n.saturating_mul(rb)).map_err(|_| {
                Error::Op(crate::Error::Argument {
                    op: "load engram table",
                    arg: "engram_tables",
                    value: format!("host, {} bytes", n.saturating_mul(rb)),
                    why: "the host could not hold the Engram table",
                })
            })?;
            for (vr, sr) in vb.chunks_exact(head_dim).zip(sb.chunks_exact(per_row)) {
                out.extend_from_slice(vr);
                out.extend_from_slice(sr);
            }
            Ok((n, out))
        })
    })?;
    src.ck.release(values);
    src.ck.release(scales);
    Ok(Tensor::from_vec(joined, &[n, rb])?)
}

fn engram<S: TensorSource>(
    src: Src<S>,
    cfg: &ModelConfig,
    p: &str,
    table: usize,
    layer: usize,
) -> Result<Engram> {
    let (d, e) = (cfg.hidden_size, &cfg.engram);
    // Rows of the table: the 256 e4m3 values, then their 8 E8M0 scales
    // (`kv_format`-style bytes), joined on the weights' device, or on the
    // host for host tables.
    let per_row = e.head_dim / MX_BLOCK;
    let (values, scales) = (
        format!("{p}.engram.embed.weight"),
        format!("{p}.engram.embed.scale"),
    );
    let rows = match src.engram {
        EngramPlacement::Host => host_table(src, &values, &scales, e.head_dim)?,
        EngramPlacement::Device => {
            let values = src.stored(&values)?;
            let n_rows = values.numel() / e.head_dim.max(1);
            let values = values.reshape(&[n_rows, e.head_dim])?.into_bytes()?;
            let scales = src.raw(&scales, &[n_rows, per_row])?.into_bytes()?;
            ops::cat_cols(&[&values, &scales])?
        }
    };
    let primes = e.table_primes()?.swap_remove(table);
    let streams = cfg.mhc.mult;
    Ok(Engram {
        table: rows,
        placement: src.engram,
        wkv: fp8(
            src,
            &format!("{p}.engram.wkv"),
            (cfg.mhc.mult + 1) * d,
            e.columns() * e.head_dim,
        )?,
        q_weight: src.raw(&format!("{p}.engram.q_weight"), &[streams, d])?,
        k_weight: src.raw(&format!("{p}.engram.k_weight"), &[streams, d])?,
        primes,
        multipliers: engram_multipliers(layer as u64, e.compressed_vocab as u64),
        head_dim: e.head_dim,
    })
}

fn block<S: TensorSource>(
    ck: Src<S>,
    cfg: &ModelConfig,
    plan: &LayerPlan,
    prefix: &str,
    n_experts: usize,
) -> Result<Block> {
    Ok(Block {
        attn_norm: ck.vector(&format!("{prefix}.attn_norm.weight"))?,
        ffn_norm: ck.vector(&format!("{prefix}.ffn_norm.weight"))?,
        hc_attn: hc(ck, cfg, prefix, "attn")?,
        hc_ffn: hc(ck, cfg, prefix, "ffn")?,
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

/// Loads the backbone and (when the config has stages) the drafter on the
/// CPU.
pub fn load_weights(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    load_weights_on(ck, cfg, token_map, &Device::Cpu)
}

/// [`load_weights`] onto `device`. Afterwards, on success or error, the
/// shards hold no page cache (unless the checkpoint keeps it: the tensors
/// the model does not load, such as `gate.bias_vl`, are dropped too).
pub fn load_weights_on(
    ck: &Checkpoint,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
    device: &Device,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    load_weights_from(ck, cfg, token_map, device, true)
}

/// The weights of `cfg` from any [`TensorSource`] onto `device`, with the
/// DSpark drafter when `drafter` is set and the config has stages (the
/// source's caches are released afterwards, on success or error).
pub fn load_weights_from<S: TensorSource>(
    source: &S,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
    device: &Device,
    drafter: bool,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    let options = WeightOptions {
        drafter,
        ..WeightOptions::default()
    };
    load_weights_with(source, cfg, token_map, device, options)
}

/// What [`load_weights_with`] loads beside the backbone, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightOptions {
    /// The DSpark drafter, when the config has stages.
    pub drafter: bool,
    /// Where the Engram tables go (the rest of the weights go to the device).
    pub engram: EngramPlacement,
}

/// [`load_weights_from`] with every option.
pub fn load_weights_with<S: TensorSource>(
    source: &S,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
    device: &Device,
    options: WeightOptions,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    let loaded = load_all(
        Src {
            ck: source,
            dev: device,
            engram: options.engram,
        },
        cfg,
        token_map,
        options.drafter,
    );
    source.release_all();
    loaded
}

/// The generator's random weights of `cfg` for `seed`
/// ([`RandomWeights`]) built straight onto `device`, one tensor at a time,
/// without a checkpoint file: bitwise the weights [`load_weights_on`] loads
/// from `generate(cfg, dir, seed)`'s shards. The Engram token map is
/// [`modulo_token_map`]; `drafter` as in [`load_weights_from`].
pub fn random_weights_on(
    cfg: &ModelConfig,
    seed: u64,
    device: &Device,
    drafter: bool,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    let options = WeightOptions {
        drafter,
        ..WeightOptions::default()
    };
    random_weights_with(cfg, seed, device, options)
}

/// [`random_weights_on`] with every option.
pub fn random_weights_with(
    cfg: &ModelConfig,
    seed: u64,
    device: &Device,
    options: WeightOptions,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    let source = RandomWeights::new(cfg, seed)?;
    load_weights_with(&source, cfg, modulo_token_map(cfg), device, options)
}

fn load_all<S: TensorSource>(
    ck: Src<S>,
    cfg: &ModelConfig,
    token_map: Vec<i64>,
    drafter: bool,
) -> Result<(ModelWeights, Option<DsparkWeights>)> {
    if cfg.quant.weights != WeightFormat::Fp8 || cfg.quant.experts != WeightFormat::Fp4 {
        return Err(Error::Op(crate::Error::Argument {
            op: "load weights",
            arg: "quantization_config",
            value: format!(
                "{:?} dense, {:?} experts",
                cfg.quant.weights, cfg.quant.experts
            ),
            why: "the CPU model runs FP8 dense weights with FP4 experts (V4.1's formats)",
        }));
    }
    let plans = cfg.layer_plans()?;
    let d = cfg.hidden_size;
    let blocks = plans
        .iter()
        .take(cfg.n_layers)
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
        embed: ck.raw("embed.weight", &[cfg.vocab_size, d])?,
        head: bf16_linear(ck, "head", cfg.vocab_size, d)?,
        norm: ck.vector("norm.weight")?,
        blocks,
        engram_token_map: token_map,
    };
    let ds = &cfg.dspark;
    if ds.n_stages == 0 || !drafter {
        return Ok((weights, None));
    }
    let last = format!("mtp.{}", ds.n_stages - 1);
    let stages = plans
        .iter()
        .skip(cfg.n_layers)
        .enumerate()
        .map(|(s, plan)| block(ck, cfg, plan, &format!("mtp.{s}"), ds.n_routed_experts))
        .collect::<Result<Vec<_>>>()?;
    let dspark = DsparkWeights {
        main_proj: fp8(ck, "mtp.0.main_proj", d, ds.target_layers.len() * d)?,
        main_norm: ck.vector("mtp.0.main_norm.weight")?,
        stages,
        norm: ck.vector(&format!("{last}.norm.weight"))?,
        markov_embed: ck.raw(
            &format!("{last}.markov_head.embed.weight"),
            &[cfg.vocab_size, ds.markov_rank],
        )?,
        markov_head: bf16_linear(
            ck,
            &format!("{last}.markov_head.head"),
            cfg.vocab_size,
            ds.markov_rank,
        )?,
        confidence: bf16_linear(
            ck,
            &format!("{last}.confidence_head.proj"),
            1,
            d + ds.markov_rank,
        )?,
    };
    Ok((weights, Some(dspark)))
}
