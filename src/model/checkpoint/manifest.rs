//! The exact tensor list of a checkpoint (spec §12), derived from a
//! [`ModelConfig`] and its layer plans; no dimension or layer id is
//! hard-coded.
//!
//! With D = hidden, H heads of width hd, query rank qr, G output groups of
//! rank or, m = `hc_mult`, E experts of width I, an "FP8 linear `[out, in]`"
//! is `name.weight` F8_E4M3 `[out, in]` + `name.scale` F8_E8M0
//! `[⌈out/32⌉, ⌈in/32⌉]` (BF16 `[out, in]` without scale when the dense
//! format is BF16), and a routed-expert linear is `name.weight` I8
//! `[out, in/2]` (packed e2m1 pairs) + `name.scale` F8_E8M0 `[out, in/32]`
//! (FP8 or BF16 when `expert_dtype` says so). Per backbone layer `layers.L`
//! and DSpark stage `mtp.k`:
//!
//! - `attn_norm.weight`, `ffn_norm.weight` BF16 `[D]`; `hc_{attn,ffn}_fn`
//!   F32 `[(2+m)·m, m·D]`, `_base` F32 `[(2+m)·m]`, `_scale` F32 `[3]`;
//! - `attn.attn_sink` F32 `[H]`; FP8 `attn.wq_a` `[qr, D]`, `attn.wq_b`
//!   `[H·hd, qr]`, `attn.wkv` `[hd, D]`, `attn.wo_a` `[G·or, H·hd/G]`,
//!   `attn.wo_b` `[D, G·or]`; BF16 `attn.q_norm.weight` `[qr]`,
//!   `attn.kv_norm.weight` `[hd]`;
//! - KV sources only: `attn.compressor.wkv.weight` BF16 `[hd, D]`,
//!   `attn.compressor.wgate.weight` (gated compressors only, ratio > 1),
//!   `attn.compressor.norm.weight` `[hd]`;
//! - index sources only: FP8 `attn.indexer.wq_b` `[ih·ihd, qr]`,
//!   `attn.indexer.weights_proj.weight` BF16 `[ih, D]`; index sources that
//!   own their keys also `attn.indexer.wk.weight` BF16 `[ihd, hd]` and
//!   `attn.indexer.k_norm.weight` `[ihd]`;
//! - `ffn.gate.weight` BF16 `[E, D]`, `ffn.gate.bias` and `ffn.gate.bias_vl`
//!   F32 `[E]` (E from the DSpark config on stages); routed
//!   `ffn.experts.e.{w1,w3}` `[I, D]` and `w2` `[D, I]`; FP8
//!   `ffn.shared_experts.{w1,w3}` `[n_shared·I, D]` and `w2` `[D, n_shared·I]`;
//! - Engram layers only: `engram.embed.weight` F8_E4M3 `[rows, ehd]` +
//!   `engram.embed.scale` F8_E8M0 `[rows, ehd/32]` (one scale per 32 of a
//!   row), FP8 `engram.wkv` `[(m+1)·D, (max_ngram−1)·eheads·ehd]`,
//!   `engram.q_weight`, `engram.k_weight` BF16 `[m, D]`.
//!
//! Model level: `embed.weight`, `head.weight` BF16 `[vocab, D]`,
//! `norm.weight` `[D]`; with DSpark stages, FP8 `mtp.0.main_proj`
//! `[D, targets·D]`, `mtp.0.main_norm.weight` `[D]`, and on the last stage
//! s `mtp.s.norm.weight` `[D]`, `mtp.s.markov_head.{embed,head}.weight` BF16
//! `[vocab, rank]`, `mtp.s.confidence_head.proj.weight` BF16 `[1, D + rank]`.
//!
//! Ignored if present (a checkpoint holding them still loads; they are not
//! loaded): `vision.*`, `aligner.*`, `image_start`, `image_end`,
//! `image_newline` (the vision path is out of scope) and the reference's
//! aliases `mtp.k.embed.weight`, `mtp.k.head.weight` (the shared `embed` and
//! `head` are used). Any other tensor outside the manifest is an error.
//!
//! Invariant: a [`Manifest`] comes from a validated config, lists each name
//! once, and every tensor's element and byte counts fit in `usize`.

use std::collections::HashMap;

use super::error::CheckpointError;
use super::param::{Format, Param, Role, TensorSpec};
use crate::model::config::{LayerPlan, ModelConfig, WeightFormat};

/// Every tensor a checkpoint of one config holds, in a fixed order: `embed`,
/// the backbone layers, `norm` and `head`, the DSpark stages and heads.
#[derive(Debug, Clone)]
pub struct Manifest {
    params: Vec<Param>,
    tensors: Vec<TensorSpec>,
    index: HashMap<String, usize>,
    n_stages: usize,
}

impl Manifest {
    /// Validates the config and derives its tensor list.
    pub fn new(config: &ModelConfig) -> Result<Manifest, CheckpointError> {
        config.validate()?;
        let plans = config.layer_plans()?;
        let mut b = Builder {
            config,
            dims: Dims::new(config)?,
            params: Vec::new(),
        };
        let (backbone, stages) = plans.split_at(config.n_layers.min(plans.len()));
        let (d, vocab) = (b.dims.d, config.vocab_size);
        b.push(
            "embed.weight",
            vec![vocab, d],
            Format::Bf16,
            Role::Embedding,
        );
        for plan in backbone {
            b.block(&format!("layers.{}", plan.layer), plan)?;
        }
        b.norm("norm.weight", d);
        b.push("head.weight", vec![vocab, d], Format::Bf16, linear(d));
        for (stage, plan) in stages.iter().enumerate() {
            b.block(&format!("mtp.{stage}"), plan)?;
        }
        if let Some(last) = stages.len().checked_sub(1) {
            b.dspark_heads(last);
        }
        Manifest::from_params(b.params, config.dspark.n_stages)
    }

    fn from_params(params: Vec<Param>, n_stages: usize) -> Result<Manifest, CheckpointError> {
        let mut tensors = Vec::new();
        for param in &params {
            let stored = param.tensors();
            for spec in &stored {
                let bytes = spec
                    .shape
                    .iter()
                    .try_fold(spec.dtype.size(), |n, &d| n.checked_mul(d));
                if bytes.is_none() {
                    return Err(CheckpointError::TooLarge {
                        what: format!("tensor `{}`", spec.name),
                    });
                }
            }
            tensors.extend(stored);
        }
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Manifest {
            params,
            tensors,
            index,
            n_stages,
        })
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Every stored tensor, values before their scales.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&TensorSpec> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Bytes of all stored tensors (without safetensors headers).
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.bytes() as u64))
    }

    /// Whether `name` may appear in a checkpoint without being expected:
    /// vision and aligner tensors, the image delimiters and the stages'
    /// `embed`/`head` aliases.
    pub fn is_ignored(&self, name: &str) -> bool {
        const PREFIXES: [&str; 2] = ["vision.", "aligner."];
        const DELIMITERS: [&str; 3] = ["image_start", "image_end", "image_newline"];
        let delimiter = |d: &str| {
            name.strip_prefix(d)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        };
        let stage_alias = || {
            let Some((stage, tail)) = name.strip_prefix("mtp.").and_then(|r| r.split_once('.'))
            else {
                return false;
            };
            !stage.is_empty()
                && stage.bytes().all(|c| c.is_ascii_digit())
                && stage.parse::<usize>().is_ok_and(|s| s < self.n_stages)
                && matches!(tail, "embed.weight" | "head.weight")
        };
        PREFIXES.iter().any(|p| name.starts_with(p))
            || DELIMITERS.into_iter().any(delimiter)
            || stage_alias()
    }
}

fn linear(fan_in: usize) -> Role {
    Role::Linear { fan_in }
}

/// The derived widths, computed once with overflow checks.
struct Dims {
    d: usize,
    head_dim: usize,
    q_rank: usize,
    q_out: usize,
    wo_a_out: usize,
    wo_a_in: usize,
    mix: usize,
    hc_in: usize,
    index_q: usize,
    shared_inter: usize,
    engram_in: usize,
    engram_out: usize,
    main_in: usize,
    confidence_in: usize,
}

impl Dims {
    fn new(c: &ModelConfig) -> Result<Dims, CheckpointError> {
        let mul = |what: &str, a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| CheckpointError::TooLarge {
                what: what.to_string(),
            })
        };
        let a = &c.attention;
        let m = c.mhc.mult;
        let q_out = mul("n_heads × head_dim", a.n_heads, a.head_dim)?;
        Ok(Dims {
            d: c.hidden_size,
            head_dim: a.head_dim,
            q_rank: a.q_lora_rank,
            q_out,
            wo_a_out: mul("o_groups × o_lora_rank", a.o_groups, a.o_lora_rank)?,
            wo_a_in: q_out / a.o_groups,
            mix: mul("the hc mix count", m + 2, m)?,
            hc_in: mul("hc_mult × hidden", m, c.hidden_size)?,
            index_q: mul("index heads × dim", c.indexer.n_heads, c.indexer.head_dim)?,
            shared_inter: mul(
                "the shared-expert width",
                c.moe.n_shared_experts,
                c.moe.inter_dim,
            )?,
            engram_in: mul(
                "the Engram wkv input",
                c.engram.columns(),
                c.engram.head_dim,
            )?,
            engram_out: mul("the Engram wkv output", m + 1, c.hidden_size)?,
            main_in: mul(
                "the DSpark main_proj input",
                c.dspark.target_layers.len(),
                c.hidden_size,
            )?,
            confidence_in: c
                .hidden_size
                .checked_add(c.dspark.markov_rank)
                .ok_or_else(|| CheckpointError::TooLarge {
                    what: "the confidence-head input".into(),
                })?,
        })
    }
}

struct Builder<'a> {
    config: &'a ModelConfig,
    dims: Dims,
    params: Vec<Param>,
}

impl Builder<'_> {
    fn push(&mut self, name: impl Into<String>, shape: Vec<usize>, format: Format, role: Role) {
        self.params.push(Param {
            name: name.into(),
            shape,
            format,
            role,
        });
    }

    fn f32(&mut self, name: String, shape: Vec<usize>, role: Role) {
        self.push(name, shape, Format::F32, role);
    }

    fn norm(&mut self, name: impl Into<String>, width: usize) {
        self.push(name, vec![width], Format::Bf16, Role::Norm);
    }

    fn bf16_linear(&mut self, name: String, out: usize, fan_in: usize) {
        self.push(name, vec![out, fan_in], Format::Bf16, linear(fan_in));
    }

    /// A weight in `format` with its 32 × 32 (weight-block) scale grid.
    fn linear_as(&mut self, format: WeightFormat, name: String, out: usize, fan_in: usize) {
        let format = match format {
            WeightFormat::Bf16 => Format::Bf16,
            WeightFormat::Fp8 => Format::Fp8Block(self.config.quant.weight_block),
            WeightFormat::Fp4 => Format::Fp4,
        };
        self.push(name, vec![out, fan_in], format, linear(fan_in));
    }

    /// An FP8-family dense linear (`quantization_config` / `dtype`).
    fn dense(&mut self, name: String, out: usize, fan_in: usize) {
        self.linear_as(self.config.quant.weights, name, out, fan_in);
    }

    fn block(&mut self, p: &str, plan: &LayerPlan) -> Result<(), CheckpointError> {
        let d = self.dims.d;
        if let Some(table) = plan.engram {
            self.engram(p, table)?;
        }
        self.norm(format!("{p}.attn_norm.weight"), d);
        self.norm(format!("{p}.ffn_norm.weight"), d);
        for sublayer in ["attn", "ffn"] {
            let (mix, hc_in) = (self.dims.mix, self.dims.hc_in);
            let role = Role::HcFn { fan_in: hc_in };
            self.f32(format!("{p}.hc_{sublayer}_fn"), vec![mix, hc_in], role);
            self.f32(format!("{p}.hc_{sublayer}_base"), vec![mix], Role::HcBase);
            self.f32(format!("{p}.hc_{sublayer}_scale"), vec![3], Role::HcScale);
        }
        self.attention(p, plan);
        let experts = match plan.dspark_stage {
            Some(_) => self.config.dspark.n_routed_experts,
            None => self.config.moe.n_routed_experts,
        };
        self.moe(p, experts);
        Ok(())
    }

    fn attention(&mut self, p: &str, plan: &LayerPlan) {
        let Dims {
            d,
            head_dim,
            q_rank,
            q_out,
            wo_a_out,
            wo_a_in,
            index_q,
            ..
        } = self.dims;
        let heads = self.config.attention.n_heads;
        self.f32(format!("{p}.attn.attn_sink"), vec![heads], Role::AttnSink);
        self.dense(format!("{p}.attn.wq_a.weight"), q_rank, d);
        self.norm(format!("{p}.attn.q_norm.weight"), q_rank);
        self.dense(format!("{p}.attn.wq_b.weight"), q_out, q_rank);
        self.dense(format!("{p}.attn.wkv.weight"), head_dim, d);
        self.norm(format!("{p}.attn.kv_norm.weight"), head_dim);
        self.dense(format!("{p}.attn.wo_a.weight"), wo_a_out, wo_a_in);
        self.dense(format!("{p}.attn.wo_b.weight"), d, wo_a_out);
        if let Some(compressor) = plan.compressor {
            self.bf16_linear(format!("{p}.attn.compressor.wkv.weight"), head_dim, d);
            if compressor.gated {
                self.bf16_linear(format!("{p}.attn.compressor.wgate.weight"), head_dim, d);
            }
            self.norm(format!("{p}.attn.compressor.norm.weight"), head_dim);
        }
        if plan.is_index_source() {
            let index = self.config.indexer;
            self.dense(format!("{p}.attn.indexer.wq_b.weight"), index_q, q_rank);
            self.bf16_linear(
                format!("{p}.attn.indexer.weights_proj.weight"),
                index.n_heads,
                d,
            );
            if plan.owns_index_keys() {
                self.bf16_linear(
                    format!("{p}.attn.indexer.wk.weight"),
                    index.head_dim,
                    head_dim,
                );
                self.norm(format!("{p}.attn.indexer.k_norm.weight"), index.head_dim);
            }
        }
    }

    fn moe(&mut self, p: &str, experts: usize) {
        let (d, inter, shared) = (
            self.dims.d,
            self.config.moe.inter_dim,
            self.dims.shared_inter,
        );
        self.bf16_linear(format!("{p}.ffn.gate.weight"), experts, d);
        for bias in ["bias", "bias_vl"] {
            self.f32(
                format!("{p}.ffn.gate.{bias}"),
                vec![experts],
                Role::GateBias,
            );
        }
        let format = self.config.quant.experts;
        for e in 0..experts {
            let x = format!("{p}.ffn.experts.{e}");
            self.linear_as(format, format!("{x}.w1.weight"), inter, d);
            self.linear_as(format, format!("{x}.w2.weight"), d, inter);
            self.linear_as(format, format!("{x}.w3.weight"), inter, d);
        }
        self.dense(format!("{p}.ffn.shared_experts.w1.weight"), shared, d);
        self.dense(format!("{p}.ffn.shared_experts.w2.weight"), d, shared);
        self.dense(format!("{p}.ffn.shared_experts.w3.weight"), shared, d);
    }

    fn engram(&mut self, p: &str, table: usize) -> Result<(), CheckpointError> {
        let engram = &self.config.engram;
        let name = format!("{p}.engram.embed.weight");
        let rows = engram
            .table_rows
            .get(table)
            .and_then(|&r| usize::try_from(r).ok())
            .ok_or_else(|| CheckpointError::TooLarge {
                what: format!("tensor `{name}`"),
            })?;
        let format = match self.config.quant.weights {
            WeightFormat::Bf16 => Format::Bf16,
            WeightFormat::Fp8 | WeightFormat::Fp4 => Format::Fp8Row,
        };
        self.push(name, vec![rows, engram.head_dim], format, Role::Embedding);
        let (out, fan_in) = (self.dims.engram_out, self.dims.engram_in);
        self.dense(format!("{p}.engram.wkv.weight"), out, fan_in);
        let (m, d) = (self.config.mhc.mult, self.dims.d);
        for which in ["q_weight", "k_weight"] {
            let name = format!("{p}.engram.{which}");
            self.push(name, vec![m, d], Format::Bf16, Role::Norm);
        }
        Ok(())
    }

    fn dspark_heads(&mut self, last: usize) {
        let (d, vocab) = (self.dims.d, self.config.vocab_size);
        let rank = self.config.dspark.markov_rank;
        self.dense("mtp.0.main_proj.weight".into(), d, self.dims.main_in);
        self.norm("mtp.0.main_norm.weight", d);
        let s = format!("mtp.{last}");
        self.norm(format!("{s}.norm.weight"), d);
        let embed = format!("{s}.markov_head.embed.weight");
        self.push(embed, vec![vocab, rank], Format::Bf16, Role::Embedding);
        self.bf16_linear(format!("{s}.markov_head.head.weight"), vocab, rank);
        let confidence = self.dims.confidence_in;
        self.bf16_linear(format!("{s}.confidence_head.proj.weight"), 1, confidence);
    }
}
