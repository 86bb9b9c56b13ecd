//! The V4.1 text model over the op API: embedding into the mHC streams,
//! Engram before its blocks, attention and MoE sublayers with the
//! single-pass mHC (lagged pre, one-hot first pre), and the final collapse,
//! norm and fp32 head (`v41-flash.md` §4–§8), for a ragged batch of
//! sequences whose state lives in a [`StatePool`].
//!
//! Invariant: [`Model::step`] takes any mix of whole prompts, prefill
//! chunks and single decode tokens, one entry per sequence, and returns
//! fp32 logits for every token it was given. A token's logits depend only
//! on its own sequence's tokens: decoding token t gives the logits of a
//! prefill of the first t + 1 tokens, a prompt fed in chunks gives those of
//! one prefill, and a sequence gives the same logits alone or in any batch
//! (bitwise on the CPU, where every op computes each row on its own).
//! [`Model::step_shaped`] also takes replayed tokens and decoder truncation
//! ([`EntryShape`]): it then returns logits for each entry's late rows only.

use super::batch::{Batch, Entry};
use super::config::{LayerPlan, ModelConfig, ScoreFunc};
use super::inputs::Input;
use super::layers::Block;
use super::layers::attention::AttentionStep;
use super::layers::engram::{EngramPlacement, StagedRows};
use super::layers::linear::Bf16Linear;
use super::layers::mhc::Streams;
pub use super::layers::moe::MoeLayout;
use super::layers::moe::MoeParams;
use super::marks::Marks;
pub use super::marks::PartTime;
use super::pool::{SeqId, StatePool};
use super::truncate::{EntryShape, Tails, late_layer_start};
use crate::contract::{HC_STREAMS, ONE_HOT_PRE, ngram_ids};
use crate::device::Device;
use crate::dtype::DType;
use crate::model::error::{Error, Result};
use crate::ops::{self, MhcParams};
use crate::tensor::Tensor;
use half::bf16;
use std::collections::HashSet;
use std::ops::Range;

/// The whole text model's weights (the DSpark stages come with the drafter).
#[derive(Clone, Debug)]
pub struct ModelWeights {
    /// `[vocab, D]` BF16.
    pub embed: Tensor,
    /// `[vocab, D]`, used as an fp32 GEMM.
    pub head: Bf16Linear,
    pub norm: Tensor,
    pub blocks: Vec<Block>,
    /// Token id → Engram compressed id (host data, like the token ids).
    pub engram_token_map: Vec<i64>,
}

/// A loaded model: its config, derived layer plans and weights.
pub struct Model {
    pub cfg: ModelConfig,
    pub plans: Vec<LayerPlan>,
    pub weights: ModelWeights,
    /// The routed experts' layout ([`MoeLayout::Auto`] by default: masked
    /// for decode-sized steps off a batch-invariant device). Every layout
    /// gives the same bits on the CPU; on a GPU the layouts' GEMMs sum in
    /// different orders.
    pub moe_layout: MoeLayout,
    /// Whether a sublayer's mHC expand runs fused with the next front half
    /// (`ops::mhc_expand_pre`, one pass over the streams on CUDA) or alone
    /// before it (`ops::mhc_expand`, then `ops::mhc_pre`; the default). The
    /// same bits either way. Off by default because the fused kernel is the
    /// slower path on the H200 (2026-12-05, `mhc_gpu`, tensor-core front:
    /// 1286 µs against 1053 for the two kernels at 16,384 tokens, 41.7
    /// against 29.7 µs at 256 in a graph): it runs the expand's streaming at
    /// pass 1's occupancy.
    pub mhc_fusion: bool,
    /// This model among the process's (`model::graph` replays a graph only
    /// for the model that captured it).
    pub(super) id: u64,
    /// Held for reading by every entry point that launches the model's
    /// work (`step_shaped`, the drafter's `dspark_seed_batch` and
    /// `dspark_draft_batch`, `decode_graphed`), and for writing while
    /// `model::graph` captures a step: no other thread's launches on the
    /// model's stream join a capture.
    pub(super) launches: std::sync::RwLock<()>,
}

/// One sequence's new tokens in a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
}

/// What a step records per backbone layer besides the logits (all off by
/// default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Capture {
    /// The 4-stream residual entering each block, after Engram.
    pub streams: bool,
    /// Each attention sublayer's output `[T, D]`.
    pub attention: bool,
    /// Each MoE sublayer's output `[T, D]`.
    pub moe: bool,
    /// Each token's selected experts `[T, top_k]` (ascending).
    pub routing: bool,
    /// Each entry's compressed index list `[len, k]` (entry indices; k
    /// the step's widest list, −1 padded; `[len, 0]` on a layer without
    /// one).
    pub index_lists: bool,
    /// The time of each op family and part ([`StepOutput::families`],
    /// [`StepOutput::parts`]): CUDA events between them on a GPU, the host
    /// clock on the CPU, and the host's issue time beside. The step then
    /// waits for the device at its end.
    pub timing: bool,
}

/// One backbone layer's captured tensors (`None` where not asked for).
#[derive(Clone, Debug, Default)]
pub struct LayerTrace {
    pub streams: Option<Tensor>,
    pub attention: Option<Tensor>,
    pub moe: Option<Tensor>,
    pub routing: Option<Tensor>,
    /// Per batch entry (`[len, 0]` each on a window-only layer).
    pub index_lists: Option<Vec<Tensor>>,
}

/// What a step returns.
#[derive(Debug)]
pub struct StepOutput {
    /// F32 `[T, vocab]`: every new token's logits, entries in batch order.
    pub logits: Tensor,
    /// BF16 `[T, targets · D]`: the DSpark target features (the streams
    /// entering each target layer, averaged); `None` without targets.
    pub features: Option<Tensor>,
    /// Rows of each entry in `logits` and `features`.
    pub rows: Vec<Range<usize>>,
    /// Per backbone layer, what [`Capture`] asked for.
    pub layers: Vec<LayerTrace>,
    /// With [`Capture::timing`]: milliseconds per op family over the step
    /// (`embed`, `engram`, `mhc`, `attention`, `moe`, `head`), in the order
    /// they first ran; empty otherwise.
    pub families: Vec<(&'static str, f64)>,
    /// With [`Capture::timing`]: the families split into their parts
    /// (`attention.query`, `.kv`, `.index`, `.lists`, `.mqa`, `.out`;
    /// `moe.route`, `.experts`, `.shared`, `.combine`; the others whole),
    /// each on the device's clock and on the host's (the time issuing it
    /// took: a part whose host time is near its device time kept the GPU
    /// waiting for the host); empty otherwise.
    pub parts: Vec<(&'static str, PartTime)>,
}

/// Where a step first produced a NaN or ±Inf ([`StepOutput::first_non_finite`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NonFinite {
    /// The backbone layer, or `None` when only the logits hold it (or
    /// nothing was captured).
    pub layer: Option<usize>,
    /// `"streams"` (entering the layer), `"attention"`, `"moe"` or `"logits"`.
    pub what: &'static str,
    /// The first non-finite element's flat index in that tensor.
    pub index: usize,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.layer {
            Some(l) => write!(f, "layer {l} {} (element {})", self.what, self.index),
            None => write!(f, "{} (element {})", self.what, self.index),
        }
    }
}

impl StepOutput {
    /// The first captured tensor, in layer order (streams, attention, then
    /// MoE of each layer), then the logits, that holds a NaN or ±Inf; `None`
    /// when all are finite. With [`Capture`] on, a non-finite logit is
    /// traced to the layer where it first appeared.
    pub fn first_non_finite(&self) -> Result<Option<NonFinite>> {
        fn first(t: &Tensor) -> Result<Option<usize>> {
            Ok(match t.dtype() {
                DType::F32 => t.to_vec::<f32>()?.iter().position(|x| !x.is_finite()),
                DType::BF16 => t.to_vec::<bf16>()?.iter().position(|x| !x.is_finite()),
                _ => None,
            })
        }
        for (layer, trace) in self.layers.iter().enumerate() {
            for (what, t) in [
                ("streams", &trace.streams),
                ("attention", &trace.attention),
                ("moe", &trace.moe),
            ] {
                if let Some(t) = t
                    && let Some(index) = first(t)?
                {
                    return Ok(Some(NonFinite {
                        layer: Some(layer),
                        what,
                        index,
                    }));
                }
            }
        }
        Ok(first(&self.logits)?.map(|index| NonFinite {
            layer: None,
            what: "logits",
            index,
        }))
    }
}

fn invalid(arg: &'static str, value: String, why: &'static str) -> Error {
    Error::Op(crate::Error::Argument {
        op: "Model",
        arg,
        value,
        why,
    })
}

impl Model {
    /// Checks that the weights fit the config's layer roles.
    pub fn new(cfg: ModelConfig, weights: ModelWeights) -> Result<Model> {
        let plans = cfg.layer_plans()?;
        if cfg.moe.score_func != ScoreFunc::SqrtSoftplus {
            return Err(invalid(
                "score_func",
                format!("{:?}", cfg.moe.score_func),
                "only sqrtsoftplus routing is implemented",
            ));
        }
        if weights.blocks.len() != cfg.n_layers {
            return Err(invalid(
                "blocks",
                weights.blocks.len().to_string(),
                "one block of weights per backbone layer",
            ));
        }
        let has_engram = !cfg.engram.layer_ids.is_empty();
        if has_engram && weights.engram_token_map.len() != cfg.vocab_size {
            return Err(invalid(
                "engram_token_map",
                weights.engram_token_map.len().to_string(),
                "the Engram token map needs one compressed id per vocabulary entry",
            ));
        }
        for (plan, b) in plans.iter().zip(&weights.blocks) {
            let a = &b.attn;
            let keys = a.indexer.as_ref().is_some_and(|i| i.keys.is_some());
            if a.compressor.is_some() != plan.is_kv_source()
                || a.indexer.is_some() != plan.is_index_source()
                || keys != plan.owns_index_keys()
                || b.engram.is_some() != plan.engram.is_some()
            {
                return Err(invalid(
                    "blocks",
                    format!("layer {}", plan.layer),
                    "the weights' compressor, indexer or Engram parts contradict the layer's role",
                ));
            }
        }
        static MODELS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Ok(Model {
            cfg,
            plans,
            weights,
            moe_layout: MoeLayout::Auto,
            mhc_fusion: false,
            id: MODELS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            launches: std::sync::RwLock::new(()),
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.weights.embed.device()
    }

    pub(crate) fn mhc_params(&self) -> MhcParams {
        MhcParams {
            eps: crate::numerics::round_f32(self.cfg.norm_eps),
            hc_eps: crate::numerics::round_f32(self.cfg.mhc.eps),
            iters: self.cfg.mhc.sinkhorn_iters,
        }
    }

    pub(crate) fn moe_params(&self, top_k: usize) -> MoeParams {
        let m = self.cfg.moe;
        MoeParams {
            top_k,
            route_scale: crate::numerics::round_f32(m.route_scale),
            gate_temp: crate::numerics::round_f32(m.gate_temp),
            swiglu_limit: crate::numerics::round_f32(m.swiglu_limit),
            layout: self.moe_layout,
        }
    }

    /// One sequence's tokens as a step of its own.
    pub fn forward(&self, pool: &mut StatePool, seq: SeqId, tokens: &[u32]) -> Result<StepOutput> {
        self.step(pool, &[SeqInput { seq, tokens }], Capture::default())
    }

    /// The first layer after the last KV source (see [`late_layer_start`]).
    pub fn late_layer_start(&self) -> usize {
        late_layer_start(&self.plans, self.cfg.n_layers)
    }

    /// Checks a step's inputs and lays them out; reserves their pages.
    fn layout(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        shapes: &[EntryShape],
    ) -> Result<Batch> {
        if inputs.is_empty() {
            return Err(invalid(
                "inputs",
                "[]".into(),
                "a step needs at least one sequence",
            ));
        }
        let mut entries = Vec::with_capacity(inputs.len());
        let mut positions = Vec::new();
        let mut row = 0;
        for inp in inputs {
            if inp.tokens.is_empty() {
                return Err(invalid(
                    "tokens",
                    format!("[] for sequence {}", inp.seq),
                    "every sequence of a step brings at least one token",
                ));
            }
            if let Some(&t) = inp
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(invalid(
                    "tokens",
                    t.to_string(),
                    "token id is not below the vocabulary size",
                ));
            }
            if entries.iter().any(|e: &Entry| e.seq == inp.seq) {
                return Err(invalid(
                    "inputs",
                    format!("sequence {} twice", inp.seq),
                    "a step takes each sequence at most once",
                ));
            }
            let replay = shapes.get(entries.len()).map_or(0, |s| s.replay);
            let pos = pool.position(inp.seq)?;
            if replay >= inp.tokens.len() || replay > pos {
                return Err(invalid(
                    "replay",
                    format!(
                        "{replay} of {} tokens at position {pos} for sequence {}",
                        inp.tokens.len(),
                        inp.seq
                    ),
                    "replayed tokens must be fewer than the entry's and lie before its position",
                ));
            }
            // A replay rewrites ring rows an open checkpoint would restore.
            if replay > 0 && pool.has_checkpoint(inp.seq)? {
                return Err(invalid(
                    "replay",
                    format!("{replay} tokens for sequence {}", inp.seq),
                    "a sequence with an open rollback checkpoint cannot replay (commit or roll back first)",
                ));
            }
            let start = pos - replay;
            let end = start + inp.tokens.len();
            if end > i32::MAX as usize {
                return Err(invalid(
                    "tokens",
                    format!("positions up to {end}"),
                    "positions must stay below 2^31 (the caches index rows with i32)",
                ));
            }
            positions.extend((start..end).map(|p| p as i64));
            entries.push(Entry {
                seq: inp.seq,
                start,
                len: inp.tokens.len(),
                replay,
                row,
            });
            row += inp.tokens.len();
        }
        let reserve: Vec<(SeqId, usize)> =
            entries.iter().map(|e| (e.seq, e.len - e.replay)).collect();
        pool.reserve_step(&reserve)?;
        Ok(Batch::new(
            entries,
            positions,
            pool.inputs(),
            &self.device(),
        )?)
    }

    /// Runs one batched step: every entry's tokens at its sequence's next
    /// positions. On error the pool's sequences keep their positions (pages
    /// reserved for the step stay with their sequences and are reused).
    pub fn step(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        capture: Capture,
    ) -> Result<StepOutput> {
        self.step_shaped(pool, inputs, &[], capture)
    }

    /// [`Model::step`] with each entry shaped by `shapes` (one per input;
    /// empty: every entry [`EntryShape::full`]): replayed leading tokens,
    /// and the layers from [`Model::late_layer_start`] on only over each
    /// entry's last `late_rows` tokens. Logits, features and the late
    /// layers' traces then cover those rows only (`rows` says where each
    /// entry's are; an entry without late rows gets an empty range).
    pub fn step_shaped(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        shapes: &[EntryShape],
        capture: Capture,
    ) -> Result<StepOutput> {
        let _launching = self.launching();
        let p = self.prepare_step(pool, inputs, shapes)?;
        self.run_prepared(pool, &p, capture)
    }

    /// The read side of [`Model::launches`] (a poisoned lock only means a
    /// step panicked; the model's weights are unchanged).
    pub(super) fn launching(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.launches
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The device half of the prepared step `p`, launched eagerly, its
    /// checks read and the pool advanced.
    pub(super) fn run_prepared(
        &self,
        pool: &mut StatePool,
        p: &PreparedStep,
        capture: Capture,
    ) -> Result<StepOutput> {
        let device = self.device();
        let mut marks = Marks::new(&device, capture.timing)?;
        // Device range checks of the step (ids, Engram rows, MoE
        // permutations), read once at its end.
        let mut checks = ops::DeviceChecks::new();
        let ran = self.run_step(p, pool, capture, &mut marks, &mut checks)?;
        // The step's device range checks, in one sync, before the pool
        // advances past a step that may be invalid.
        checks.verdict()?;
        self.finish_step(pool, p)?;
        let targets: Option<Vec<&Tensor>> = ran.targets.iter().map(Option::as_ref).collect();
        let features = match targets {
            Some(t) if !t.is_empty() => Some(ops::cat_cols(&t)?),
            _ => None,
        };
        let parts = marks.parts()?;
        Ok(StepOutput {
            logits: ran.logits,
            features,
            rows: p.rows(),
            layers: ran.layers,
            families: Marks::totals(&parts),
            parts,
        })
    }

    /// The host half of a step: checks the inputs, lays out the batch and
    /// prepares every layer ([`Model::prepare_layers`]); every upload goes
    /// through the pool's step arena, numbered from here (`model::inputs`).
    pub(super) fn prepare_step(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        shapes: &[EntryShape],
    ) -> Result<PreparedStep> {
        let device = self.device();
        if !shapes.is_empty() && shapes.len() != inputs.len() {
            return Err(invalid(
                "shapes",
                format!("{} for {} inputs", shapes.len(), inputs.len()),
                "one EntryShape per input (or none)",
            ));
        }
        let shapes: Vec<EntryShape> = if shapes.is_empty() {
            inputs
                .iter()
                .map(|i| EntryShape::full(i.tokens.len()))
                .collect()
        } else {
            shapes.to_vec()
        };
        pool.inputs().begin();
        let b = self.layout(pool, inputs, &shapes)?;
        let truncated = inputs
            .iter()
            .zip(&shapes)
            .any(|(i, s)| s.late_rows < i.tokens.len());
        tracing::debug!(
            entries = b.entries.len(),
            tokens = b.positions.rows(),
            free_pages = ?pool.free_pages(),
            "model step"
        );
        let ids: Vec<i32> = inputs
            .iter()
            .flat_map(|i| i.tokens.iter().map(|&t| t as i32))
            .collect();
        let t = ids.len();
        let ids = pool.inputs().upload(ids, &[t], &device)?;
        let map = &self.weights.engram_token_map;
        let compressed: Vec<Vec<Option<i64>>> = inputs
            .iter()
            .map(|i| {
                i.tokens
                    .iter()
                    .map(|&tok| map.get(tok as usize).copied())
                    .collect()
            })
            .collect();
        let (ngrams, engram_rows) = if map.is_empty() {
            (None, Vec::new())
        } else {
            let values = self.ngram_values(pool, &b, &compressed)?;
            let staged = self.stage_engram_rows(pool, &values)?;
            let n = values.len() / 4;
            (
                Some(pool.inputs().upload(values, &[n, 4], &device)?),
                staged,
            )
        };
        let one_hot: Vec<f32> = (0..t).flat_map(|_| ONE_HOT_PRE).collect();
        let first_pre = pool.inputs().upload(one_hot, &[t, HC_STREAMS], &device)?;
        let (layers, tails) = self.prepare_layers(pool, &b, &shapes, truncated)?;
        Ok(PreparedStep {
            b,
            ids,
            ngrams,
            engram_rows,
            first_pre,
            layers,
            tails,
            compressed,
        })
    }

    /// The device half of a step from its host half `p`: launches every
    /// layer and the head, reading from the host only what `p` uploaded
    /// (and touching only the pool's device tensors), its range checks in
    /// `checks`, unread.
    pub(super) fn run_step(
        &self,
        p: &PreparedStep,
        pool: &mut StatePool,
        capture: Capture,
        marks: &mut Marks,
        checks: &mut ops::DeviceChecks,
    ) -> Result<RanStep> {
        let cfg = &self.cfg;
        let late_start = self.late_layer_start();
        let mut streams = Streams::new(
            ops::hc_init(&ops::embedding_deferred(
                &self.weights.embed,
                &p.ids,
                checks,
            )?)?,
            self.mhc_fusion,
        );
        marks.mark("embed")?;
        let mut pre: Tensor = (*p.first_pre).clone();
        let mut published = Default::default();
        let mut targets = vec![None; cfg.dspark.target_layers.len()];
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let hp = self.mhc_params();
        let moe_p = self.moe_params(cfg.moe.n_activated_experts);
        // Past the late start a truncated step runs on the tails' rows: an
        // Engram layer there reads its n-gram ids, and a host table's index,
        // narrowed with the streams (the staged rows stay whole: the index
        // picks the tails' rows out of them).
        let late_engram = self
            .plans
            .iter()
            .any(|q| q.layer >= late_start && q.engram.is_some());
        let mut late_ngrams: Option<Tensor> = None;
        let mut late_index: Vec<(usize, Tensor)> = Vec::new();
        for ((plan, block), step) in self.plans.iter().zip(&self.weights.blocks).zip(&p.layers) {
            let mut trace = LayerTrace::default();
            if let Some(t) = p.tails.as_ref().filter(|_| plan.layer == late_start) {
                streams.replace(|s| t.rows(s))?;
                pre = t.rows(&pre)?;
                if late_engram {
                    late_ngrams = p.ngrams.as_deref().map(|n| t.rows(n)).transpose()?;
                    late_index = p
                        .engram_rows
                        .iter()
                        .map(|r| Ok((r.layer, t.rows(&r.index)?)))
                        .collect::<Result<_>>()?;
                }
                t.narrow_published(&mut published)?;
                for f in targets.iter_mut().flatten() {
                    *f = t.rows(f)?;
                }
            }
            let b = p
                .tails
                .as_ref()
                .filter(|_| plan.layer >= late_start)
                .map_or(&p.b, |t| &t.batch);
            let Some(step) = step else {
                layers.push(trace);
                continue;
            };
            if let (Some(e), Some(ng)) = (&block.engram, &p.ngrams) {
                // The last sublayer's expand, charged to the mHC part.
                streams.ready()?;
                marks.mark("mhc")?;
                let ng: &Tensor = late_ngrams.as_ref().unwrap_or(ng);
                let staged = p
                    .engram_rows
                    .iter()
                    .find(|r| r.layer == plan.layer)
                    .map(|r| StagedRows {
                        rows: &r.rows,
                        index: late_index
                            .iter()
                            .find(|(l, _)| *l == r.layer)
                            .map_or(&*r.index, |(_, i)| i),
                    });
                streams.replace(|s| {
                    e.forward(
                        s,
                        ng,
                        staged,
                        crate::numerics::round_f32(cfg.norm_eps),
                        checks,
                    )
                })?;
                marks.mark("engram")?;
            }
            if let Some(i) = plan.dspark_target {
                let slot = targets.get_mut(i).ok_or_else(|| crate::Error::Argument {
                    op: "forward",
                    arg: "dspark_target",
                    value: i.to_string(),
                    why: "a target index past the config's target layers",
                })?;
                *slot = Some(ops::hc_stream_mean(streams.ready()?)?);
            }
            if capture.streams {
                trace.streams = Some(streams.ready()?.clone());
            }
            let (x, mix) = block
                .hc_attn
                .input(&mut streams, &mut pre, &block.attn_norm, hp)?;
            marks.mark("mhc")?;
            let f = block
                .attn
                .run(cfg, plan, &x, b, step, pool, &mut published, marks)?;
            if capture.attention {
                trace.attention = Some(f.clone());
            }
            streams.expand_later(f, mix)?;
            if capture.index_lists {
                trace.index_lists = Some(entry_lists(published.lists_of(plan), b)?);
            }
            let (x, mix) = block
                .hc_ffn
                .input(&mut streams, &mut pre, &block.ffn_norm, hp)?;
            marks.mark("mhc")?;
            let (f, selected) = block.ffn.forward_marked(&x, moe_p, marks, checks)?;
            if capture.moe {
                trace.moe = Some(f.clone());
            }
            // The expand runs now, or with `mhc_fusion` with the next
            // layer's front half (or when the streams are next read).
            streams.expand_later(f, mix)?;
            if capture.routing {
                trace.routing = Some(selected);
            }
            layers.push(trace);
        }
        let streams = streams.ready()?;
        marks.mark("mhc")?;
        let logits = if streams.rows() == 0 {
            Tensor::zeros(&self.device(), DType::F32, &[0, cfg.vocab_size])?
        } else {
            self.head(streams, &pre)?
        };
        marks.mark("head")?;
        Ok(RanStep {
            logits,
            targets,
            layers,
        })
    }

    /// Ends a step whose device half ran and passed its checks: every
    /// entry's sequence advances past its new tokens.
    pub(super) fn finish_step(&self, pool: &mut StatePool, p: &PreparedStep) -> Result<()> {
        advance_entries(pool, &p.b.entries, &p.compressed)
    }

    /// The host half of every layer of a step, in layer order: each
    /// layer's claims, plans and uploads ([`Attention::prepare`]; `None` for
    /// a layer with no entry left), and the entries' tails when the step is
    /// `truncated` (made for the late layers, which prepare over them).
    /// The device half of the step then launches without host work.
    ///
    /// [`Attention::prepare`]: super::layers::attention::Attention::prepare
    fn prepare_layers(
        &self,
        pool: &mut StatePool,
        b: &Batch,
        shapes: &[EntryShape],
        truncated: bool,
    ) -> Result<(Vec<Option<AttentionStep>>, Option<Tails>)> {
        let late_start = self.late_layer_start();
        // The sources' device tables: the rows of the step's sequences.
        let seqs: Vec<SeqId> = b.entries.iter().map(|e| e.seq).collect();
        pool.sync_tables(&seqs)?;
        let mut tails: Option<Tails> = None;
        // The (lists layer, KV source) pairs whose block tables a layer
        // already made, for the rows the step has now.
        let mut tables = HashSet::new();
        let mut steps = Vec::with_capacity(self.plans.len());
        for (plan, block) in self.plans.iter().zip(&self.weights.blocks) {
            if truncated && plan.layer == late_start {
                tails = Some(Tails::of(b, shapes, pool.inputs())?);
                tables.clear();
            }
            let b = tails.as_ref().map_or(b, |t| &t.batch);
            steps.push(if b.entries.is_empty() {
                None
            } else {
                Some(block.attn.prepare(&self.cfg, plan, b, pool, &mut tables)?)
            });
        }
        Ok((steps, tails))
    }

    /// The rows every host-table Engram layer reads for the n-gram ids
    /// `values` (I64 `[T, 4]`, row after row), checked against its table on
    /// the host, in layer order. Empty when every table is on the device.
    fn host_engram_rows(&self, values: &[i64]) -> Result<Vec<LayerGather<'_>>> {
        let host: Vec<(usize, &super::layers::engram::Engram)> = self
            .plans
            .iter()
            .zip(&self.weights.blocks)
            .filter_map(|(plan, block)| {
                block
                    .engram
                    .as_ref()
                    .filter(|e| e.placement == EngramPlacement::Host)
                    .map(|e| (plan.layer, e))
            })
            .collect();
        if host.is_empty() {
            return Ok(Vec::new());
        }
        let ids = Tensor::from_vec(values.to_vec(), &[values.len() / 4, 4])?;
        host.iter()
            .map(|&(layer, e)| {
                Ok(LayerGather {
                    layer,
                    cols: e.primes.len(),
                    row_bytes: e.row_bytes()?,
                    rows: e.host_rows(&ids)?,
                })
            })
            .collect()
    }

    /// [`Model::host_engram_rows`] copied into the step arena (each layer's
    /// rows straight into the slot's kept bytes, then one upload) with
    /// their index (0 .. T · columns, the lookup that reads them back in
    /// place).
    fn stage_engram_rows(&self, pool: &StatePool, values: &[i64]) -> Result<Vec<HostRows>> {
        let t = values.len() / 4;
        let device = self.device();
        self.host_engram_rows(values)?
            .into_iter()
            .map(|g| {
                let n = t * g.cols;
                let last = i64::try_from(n).map_err(|_| {
                    invalid(
                        "tokens",
                        n.to_string(),
                        "Engram rows of a step are counted in i64",
                    )
                })?;
                let index: Vec<i64> = (0..last).collect();
                let rows = pool
                    .inputs()
                    .upload_bytes_with(&[n, g.row_bytes], &device, |out| g.rows.copy_into(out))?;
                Ok(HostRows {
                    layer: g.layer,
                    rows,
                    index: pool.inputs().upload(index, &[t, g.cols], &device)?,
                })
            })
            .collect()
    }

    /// Each token's four n-gram ids (newest first) from its sequence's
    /// history and the step's own earlier tokens: I64 `[T, 4]`, row after
    /// row.
    fn ngram_values(
        &self,
        pool: &StatePool,
        b: &Batch,
        compressed: &[Vec<Option<i64>>],
    ) -> Result<Vec<i64>> {
        let pad_id = self.cfg.engram.pad_id;
        let pad = usize::try_from(pad_id)
            .ok()
            .and_then(|p| self.weights.engram_token_map.get(p))
            .copied()
            .ok_or_else(|| crate::Error::Argument {
                op: "engram",
                arg: "engram_pad_id",
                value: pad_id.to_string(),
                why: "outside the Engram token map",
            })?;
        let mut out = Vec::with_capacity(b.positions.rows() * 4);
        for (e, c) in b.entries.iter().zip(compressed) {
            let mut hist = pool.history(e.seq)?;
            for &id in c {
                hist.push(id);
                out.extend(ngram_ids(&hist, pad));
            }
        }
        Ok(out)
    }

    /// Replaces the token ids of the prepared step `p` (one token per entry,
    /// a decode step) with `tokens`: the ids and Engram n-gram inputs are
    /// rewritten in place (the same arena tensors, so the step's signature
    /// does not change) and the history the step leaves follows the new
    /// tokens. What else the host half made does not depend on the tokens.
    /// A token outside the vocabulary is a typed error that changes nothing.
    pub(super) fn set_step_tokens(
        &self,
        pool: &StatePool,
        p: &mut PreparedStep,
        tokens: &[u32],
    ) -> Result<()> {
        if tokens.len() != p.b.entries.len() || p.b.entries.iter().any(|e| e.len != 1) {
            return Err(invalid(
                "tokens",
                format!("{} for {} entries", tokens.len(), p.b.entries.len()),
                "one token per entry of a one-token-per-entry step",
            ));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(invalid(
                "tokens",
                t.to_string(),
                "a token id outside the vocabulary",
            ));
        }
        let map = &self.weights.engram_token_map;
        let compressed: Vec<Vec<Option<i64>>> = tokens
            .iter()
            .map(|&t| vec![map.get(t as usize).copied()])
            .collect();
        let ngrams = match &p.ngrams {
            Some(_) => Some(self.ngram_values(pool, &p.b, &compressed)?),
            None => None,
        };
        // A host table's rows follow the new n-grams: every layer's checked
        // against the step's before anything is rewritten (the copies
        // themselves cannot fail past their length, checked here), so an
        // error leaves the prepared step as it was.
        let rows = match &ngrams {
            Some(v) => self.host_engram_rows(v)?,
            None => Vec::new(),
        };
        if rows.len() != p.engram_rows.len()
            || rows
                .iter()
                .zip(&p.engram_rows)
                .any(|(g, s)| g.layer != s.layer || g.rows.bytes() != s.rows.numel())
        {
            return Err(invalid(
                "p",
                format!("{} staged Engram layers", p.engram_rows.len()),
                "a prepared step stages the rows of the model's host-table Engram layers",
            ));
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        p.ids.rewrite(&ids)?;
        if let (Some(n), Some(v)) = (&mut p.ngrams, ngrams) {
            n.rewrite(&v)?;
        }
        for (s, g) in p.engram_rows.iter_mut().zip(&rows) {
            s.rows.rewrite_bytes_with(|out| g.rows.copy_into(out))?;
        }
        p.compressed = compressed;
        Ok(())
    }

    /// Final collapse with the last pre, `norm`, and the fp32 head.
    fn head(&self, streams: &Tensor, pre: &Tensor) -> Result<Tensor> {
        let u = ops::hc_collapse(streams, pre)?;
        let h = ops::rms_norm(
            &u,
            &self.weights.norm,
            crate::numerics::round_f32(self.cfg.norm_eps),
        )?;
        Ok(self.weights.head.forward_f32(&h)?)
    }
}

/// The host half of a step ([`Model::prepare_step`]): the batch, and
/// everything the device half reads from the host, uploaded.
pub(super) struct PreparedStep {
    b: Batch,
    /// I32 `[T]` token ids.
    ids: Input,
    /// I64 `[T, 4]` Engram n-gram ids (a model with Engram).
    ngrams: Option<Input>,
    /// The rows each host-table Engram layer gathered for the step.
    engram_rows: Vec<HostRows>,
    /// F32 `[T, 4]`: the one-hot first pre.
    first_pre: Input,
    /// Per layer, its host half (`None`: no entry left at that layer).
    layers: Vec<Option<AttentionStep>>,
    /// The entries' tails of a truncated step.
    tails: Option<Tails>,
    /// Per entry, its tokens' Engram compressed ids (for the history).
    compressed: Vec<Vec<Option<i64>>>,
}

/// One host-table Engram layer's rows for a step, checked on the host
/// ([`Model::host_engram_rows`]): `T · cols` rows of `row_bytes`,
/// token-major.
struct LayerGather<'a> {
    layer: usize,
    cols: usize,
    row_bytes: usize,
    rows: super::layers::engram::HostGather<'a>,
}

/// The rows a host-table Engram layer gathered for a step
/// ([`Model::stage_engram_rows`]).
struct HostRows {
    layer: usize,
    /// U8 `[T · cols, row bytes]`.
    rows: Input,
    /// I64 `[T, cols]`: 0 .. T · cols.
    index: Input,
}

/// What advances the pool past a step ([`Model::finish_step`]): its
/// entries and their tokens' Engram compressed ids, host data only.
pub(super) struct StepAdvance {
    entries: Vec<crate::model::batch::Entry>,
    compressed: Vec<Vec<Option<i64>>>,
}

impl StepAdvance {
    /// Advances every entry past its new tokens.
    pub(super) fn apply(&self, pool: &mut StatePool) -> Result<()> {
        advance_entries(pool, &self.entries, &self.compressed)
    }
}

/// Advances each entry's sequence past its new tokens (`compressed`: their
/// Engram compressed ids, one list per entry).
fn advance_entries(
    pool: &mut StatePool,
    entries: &[crate::model::batch::Entry],
    compressed: &[Vec<Option<i64>>],
) -> Result<()> {
    for (e, c) in entries.iter().zip(compressed) {
        pool.advance(e.seq, e.len - e.replay, c)?;
    }
    Ok(())
}

impl PreparedStep {
    /// A copy of what advances the pool past the step.
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(super) fn advance_list(&self) -> StepAdvance {
        StepAdvance {
            entries: self.b.entries.clone(),
            compressed: self.compressed.clone(),
        }
    }

    /// The step's output rows.
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(super) fn rows_total(&self) -> usize {
        match &self.tails {
            Some(t) => t.batch.positions.rows(),
            None => self.b.positions.rows(),
        }
    }

    /// Rows of each entry in the step's outputs.
    pub(super) fn rows(&self) -> Vec<Range<usize>> {
        match &self.tails {
            Some(t) => t.entry_rows(self.b.entries.len()),
            None => self
                .b
                .entries
                .iter()
                .map(|e| e.row..e.row + e.len)
                .collect(),
        }
    }
}

/// What the device half of a step made.
pub(super) struct RanStep {
    pub(super) logits: Tensor,
    /// Per DSpark target, the streams' mean entering it.
    targets: Vec<Option<Tensor>>,
    layers: Vec<LayerTrace>,
}

/// Each entry's rows of a layer's compressed index lists (`[len, 0]` when
/// the layer has none).
fn entry_lists(lists: Option<&Tensor>, b: &Batch) -> Result<Vec<Tensor>> {
    b.entries
        .iter()
        .map(|e| {
            Ok(match lists {
                Some(l) => l.narrow_rows(e.row, e.len)?,
                None => Tensor::from_vec(Vec::<i32>::new(), &[e.len, 0])?
                    .to_device(&b.positions.device())?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::engram::EngramPlacement;
    use crate::model::load::{WeightOptions, random_weights_with};
    use crate::model::pool::PoolConfig;

    /// A decode step prepared with placeholder tokens and then given its
    /// real tokens (`set_step_tokens`, as the pipelined engine does on a
    /// GPU) gives the logits of the step prepared with them, bit for bit,
    /// with the Engram tables on the host (their rows gathered again) and
    /// on the device.
    #[test]
    fn set_step_tokens_gathers_host_engram_rows_again() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny");
        let cfg = ModelConfig::from_dir(&dir).unwrap();
        for engram in [EngramPlacement::Host, EngramPlacement::Device] {
            let options = WeightOptions {
                drafter: false,
                engram,
            };
            let (w, _) = random_weights_with(&cfg, 7, &Device::Cpu, options).unwrap();
            let model = Model::new(cfg.clone(), w).unwrap();
            let staged = model
                .weights
                .blocks
                .iter()
                .filter(|b| b.engram.as_ref().is_some_and(|e| e.placement == engram))
                .count();
            assert!(staged > 0, "the tiny config has Engram layers");
            let run = |placeholder: bool| -> Vec<u32> {
                let pc = PoolConfig::fitting(&model.cfg, 2, 32, 16, 4).unwrap();
                let mut pool = StatePool::new(&model.cfg, &Device::Cpu, pc).unwrap();
                let seqs = [pool.add_sequence().unwrap(), pool.add_sequence().unwrap()];
                let prompts: [&[u32]; 2] = [&[5, 9, 13, 2, 7], &[11, 3, 8]];
                let inputs: Vec<SeqInput> = seqs
                    .iter()
                    .zip(prompts)
                    .map(|(&seq, tokens)| SeqInput { seq, tokens })
                    .collect();
                model.step(&mut pool, &inputs, Capture::default()).unwrap();
                let real = [17u32, 23];
                let first: &[u32] = if placeholder { &[1, 1] } else { &real };
                let inputs: Vec<SeqInput> = seqs
                    .iter()
                    .zip(first)
                    .map(|(&seq, t)| SeqInput {
                        seq,
                        tokens: std::slice::from_ref(t),
                    })
                    .collect();
                let mut p = model.prepare_step(&mut pool, &inputs, &[]).unwrap();
                if placeholder {
                    model.set_step_tokens(&pool, &mut p, &real).unwrap();
                }
                let out = model
                    .run_prepared(&mut pool, &p, Capture::default())
                    .unwrap();
                let logits = out.logits.to_vec::<f32>().unwrap();
                logits.iter().map(|x| x.to_bits()).collect()
            };
            assert!(run(true) == run(false), "{engram:?} tables");
        }
    }
}
