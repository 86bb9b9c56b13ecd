//! One layer's attention over a batch (`v41-flash.md` §3): the query and
//! window-KV paths, the KV source's compressor and index keys, the indexer
//! (with candidate blocks and reindexing) or the reused selection, the
//! sparse MQA with sink over the paged caches, the inverse RoPE and the
//! grouped output LoRA.
//!
//! Index lists (deepinfer's one layout for prefill, chunks and decode, as
//! `serving.md` §4 asks: the same KV layout and reduction order however a
//! token arrives): the window part of the query at position p has exactly
//! `window` entries, positions max(0, p + 1 − window) + k for k < window in
//! ascending order, −1 for those beyond p (trailing); the compressed part is
//! the indexer's list (ascending entry indices, −1 trailing). Relation to
//! the reference, which has only a whole-prompt prefill and one-token
//! decode and lays the two out differently:
//! - prefill of S ≥ window tokens: identical for every query;
//! - decode at p ≥ window − 1: identical;
//! - decode at p < window − 1 (the reference puts the −1 first) and prefill
//!   of S < window tokens (the reference's window part is S wide, so its
//!   compressed part starts at list position S): the same entries in the
//!   same order, shifted against the 64-entry blocks of the online softmax
//!   (§3.10), so the BF16 rounding of p can differ in the last bits where a
//!   list holds more than 64 entries. On configs whose lists fit one block
//!   (window + top-k ≤ 64, such as `models/tiny`) all layouts agree bitwise.
//!
//! The reference's GPU kernel accumulates P·V into the rescaled accumulator
//! inside its tensor-core GEMM, while its own CPU port (`kernel_cpu.py`),
//! the spec and our CPU reference (`ops::sparse_mqa` on the CPU) add each block's P·V sum to
//! it: the two orders differ in the last bits, as any two fp32 summation
//! orders do (the spec matches the reference "up to summation order").

use super::linear::{Bf16Linear, Fp8Linear, Normed};
use crate::contract::{KvRowFormat, RopeParams, Yarn};
use crate::dtype::DType;
use crate::model::batch::Batch;
use crate::model::config::{AttentionPlan, CandidateConfig, LayerPlan, ModelConfig, Selection};
use crate::model::error::Result;
use crate::model::inputs::Input;
use crate::model::marks::Marks;
use crate::model::pool::{PendingCopy, SeqId, StatePool, StepTables, TableKind};
use crate::ops::{self, RowNorm, RowRope, RowsOut};
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// A KV source's compressor.
#[derive(Clone, Debug)]
pub struct Compressor {
    /// `[head_dim, D]`: fp32 projection at ratio 2, BF16 at ratio 1.
    pub wkv: Bf16Linear,
    /// Present at ratio 2 only.
    pub wgate: Option<Bf16Linear>,
    pub norm: Tensor,
}

/// The index keys owned by a KV source that is also an index source.
#[derive(Clone, Debug)]
pub struct IndexKeys {
    /// `[index_head_dim, head_dim]`.
    pub wk: Bf16Linear,
    pub k_norm: Tensor,
}

/// An index source's query side (and its keys when it owns them).
#[derive(Clone, Debug)]
pub struct Indexer {
    /// `[index_heads · index_head_dim, q_lora_rank]`.
    pub wq_b: Fp8Linear,
    /// `[index_heads, D]`.
    pub weights_proj: Bf16Linear,
    pub keys: Option<IndexKeys>,
}

/// One layer's (or DSpark stage's) attention weights.
#[derive(Clone, Debug)]
pub struct Attention {
    pub wq_a: Fp8Linear,
    pub q_norm: Tensor,
    pub wq_b: Fp8Linear,
    pub wkv: Fp8Linear,
    pub kv_norm: Tensor,
    /// `wo_a` dequantised to BF16: `[groups · o_rank, (heads/groups) · head_dim]`.
    pub wo_a: Tensor,
    pub wo_b: Fp8Linear,
    /// `[heads]` F32.
    pub sink: Tensor,
    pub compressor: Option<Compressor>,
    pub indexer: Option<Indexer>,
}

/// Selections published by earlier layers of the same step, each one
/// tensor over all the step's rows (entries one after another, as the
/// batch lays them out), −1 padded to the widest entry's list.
#[derive(Default)]
pub struct Published {
    /// Index source → I32 `[T, k]` compressed entry indices (−1 = none);
    /// `None` while no entry has a compressed entry yet.
    pub topk: HashMap<usize, Option<Tensor>>,
    /// Candidate source → I32 `[T, W]` candidate block lists (−1 = none);
    /// `None` as for `topk`.
    pub candidates: HashMap<usize, Option<Tensor>>,
    /// (lists layer, KV source) → those lists as physical rows of the
    /// compressed pool, I32 `[T, k]` (`ops::paged_rows` through the
    /// source's block tables), made by the first layer that attends with
    /// them and reused by the rest of the step (a source's entries change
    /// only in its own layer, before any layer reads them). Cleared when
    /// the step narrows its rows.
    pub(crate) rows: HashMap<(usize, usize), Tensor>,
}

/// The layer whose compressed index lists `plan` attends with: its own (an
/// index source) or its index source's (a reuse layer); `None` for a
/// window-only layer.
fn lists_layer(plan: &LayerPlan) -> Option<usize> {
    match plan.attention {
        AttentionPlan::WindowOnly => None,
        AttentionPlan::Sparse { selection, .. } => Some(match selection {
            Selection::Indexer { .. } => plan.layer,
            Selection::Reuse { index_source } => index_source,
        }),
    }
}

impl Published {
    /// The compressed index lists layer `plan` attends with ([`lists_layer`]);
    /// `None` for a window-only layer or while there are none.
    pub fn lists_of(&self, plan: &LayerPlan) -> Option<&Tensor> {
        self.topk.get(&lists_layer(plan)?).and_then(Option::as_ref)
    }
}

/// Entries of at most this many tokens (decode steps) are indexed
/// together, one score row per token against its own entry's keys; longer
/// ones (prompts, prefill chunks, speculative verification) one at a time,
/// their tokens sharing one copy of the keys. At 1 no key is copied twice;
/// a larger bound would copy an entry's keys once per token.
const BATCHED_TOKENS: usize = 1;

/// The most bytes of BF16 scores the batched pass makes (every row padded
/// to the batch's longest; its keys are read in place through the pages,
/// `ops::index_scores_paged`): past it the entries are indexed one at a
/// time, so a step mixing one very long sequence with many short ones never
/// allocates the padded scores. A decode batch of 256 sequences at 1M
/// tokens (ratio 4) makes 128 MiB.
const BATCHED_SCORE_BYTES: usize = 256 << 20;

/// The RoPE of a layer.
pub fn rope_params(plan: &LayerPlan) -> RopeParams {
    RopeParams {
        theta: plan.rope.theta,
        yarn: plan.rope.yarn.map(|y| Yarn {
            factor: y.factor,
            original_seq_len: y.original_seq_len as u64,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
        }),
    }
}

/// `v` as the kernels' int32 index (rows and positions; the engine's
/// MAX_CONTEXT keeps them far below 2^31).
fn i32_of(what: &'static str, v: usize) -> Result<i32> {
    Ok(i32::try_from(v).map_err(|_| crate::Error::Argument {
        op: "attention",
        arg: what,
        value: v.to_string(),
        why: "beyond the int32 index space",
    })?)
}

/// `start .. start + len` as int32 indices.
fn i32_range(what: &'static str, start: usize, len: usize) -> Result<std::ops::Range<i32>> {
    Ok(i32_of(what, start)?..i32_of(what, start.saturating_add(len))?)
}

fn host_i32(v: Vec<i32>, shape: &[usize], device: &crate::device::Device) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape)?.to_device(device)?)
}

impl Attention {
    /// The query `[T, H, hd]` (after RoPE) and `qr` (the `q_norm` output,
    /// quantised once for `wq_b` and the indexer's `wq_b`).
    pub fn query(
        &self,
        cfg: &ModelConfig,
        x: &Normed,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<(Tensor, Normed)> {
        let a = cfg.attention;
        let eps = crate::numerics::round_f32(cfg.norm_eps);
        let qr = Normed::new(&self.wq_a.forward_normed(x)?, &self.q_norm, eps)?;
        let q = ops::rope(
            &self.wq_b.forward_normed(&qr)?,
            positions,
            a.n_heads,
            a.rope_head_dim,
            rope,
        )?;
        Ok((q.reshape(&[x.rows(), a.n_heads, a.head_dim])?, qr))
    }

    /// The encoded window rows U8 `[T, 528]` of the inputs: FP8 of
    /// RoPE(kv_norm(wkv · x)), in one row-writer pass after the projection.
    pub fn window_kv(
        &self,
        cfg: &ModelConfig,
        x: &Normed,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<Tensor> {
        let (norm, rope) = self.window_prologue(cfg, positions, rope);
        Ok(ops::kv_rows(
            &self.wkv.forward_normed(x)?,
            KvRowFormat::Window,
            Some(norm),
            Some(rope),
        )?)
    }

    /// [`Attention::window_kv`] stored straight into the window pool at
    /// `slots` (I32 `[T]`).
    fn write_window_kv(
        &self,
        cfg: &ModelConfig,
        x: &Normed,
        positions: &Tensor,
        rope: &RopeParams,
        pool: &mut Tensor,
        slots: &Tensor,
    ) -> Result<()> {
        let (norm, rope) = self.window_prologue(cfg, positions, rope);
        Ok(ops::kv_rows_into(
            &self.wkv.forward_normed(x)?,
            KvRowFormat::Window,
            Some(norm),
            Some(rope),
            RowsOut {
                pool,
                slots,
                latent: None,
            },
        )?)
    }

    /// The window row's `kv_norm` and RoPE (the last `rope_head_dim` dims).
    fn window_prologue<'a>(
        &'a self,
        cfg: &ModelConfig,
        positions: &'a Tensor,
        rope: &'a RopeParams,
    ) -> (RowNorm<'a>, RowRope<'a>) {
        (
            RowNorm {
                weight: &self.kv_norm,
                eps: crate::numerics::round_f32(cfg.norm_eps),
            },
            RowRope {
                positions,
                rope_dim: cfg.attention.rope_head_dim,
                params: rope,
            },
        )
    }

    /// Sparse MQA of `q` over the window pool and (for sparse layers) the
    /// compressed pool, then inverse RoPE and the output projection.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        cfg: &ModelConfig,
        pool: &StatePool,
        q: &Tensor,
        window_idx: &Tensor,
        compressed_idx: Option<&Tensor>,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<Tensor> {
        let o = self.mqa(cfg, pool, q, window_idx, compressed_idx)?;
        self.output(cfg, &o, positions, rope)
    }

    /// The sparse MQA of [`Attention::attend`]: `[T, H · hd]`.
    fn mqa(
        &self,
        cfg: &ModelConfig,
        pool: &StatePool,
        q: &Tensor,
        window_idx: &Tensor,
        compressed_idx: Option<&Tensor>,
    ) -> Result<Tensor> {
        let a = cfg.attention;
        let comp = compressed_idx.map(|i| (pool.compressed_rows(), i));
        let (o, _) = ops::sparse_mqa(q, pool.window_rows(), window_idx, comp, &self.sink)?;
        Ok(o.reshape(&[q.rows(), a.n_heads * a.head_dim])?)
    }

    /// The inverse RoPE and output projection of [`Attention::attend`].
    fn output(
        &self,
        cfg: &ModelConfig,
        o: &Tensor,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<Tensor> {
        let a = cfg.attention;
        let o = ops::inverse_rope(o, positions, a.n_heads, a.rope_head_dim, rope)?;
        let y = ops::grouped_bf16_linear(&o, &self.wo_a, a.o_groups)?;
        Ok(self.wo_b.forward(&y)?)
    }

    /// The host half of layer `plan.layer`'s attention over the batch `b`:
    /// claims the step's window rows and compressor entries in the pool,
    /// plans its partial groups, and uploads everything the device half
    /// ([`Attention::run`]) reads: ring slots, compressor positions, slots
    /// and members, the indexer's visible counts, the block tables.
    /// `tables` holds the (lists layer, KV source) pairs whose compressed
    /// block tables an earlier layer of the step already made (the first
    /// layer attending with a pair makes them); the caller clears it when
    /// the step narrows its rows.
    pub(crate) fn prepare(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        b: &Batch,
        pool: &mut StatePool,
        tables: &mut HashSet<(usize, usize)>,
    ) -> Result<AttentionStep> {
        let mut slots = vec![-1i32; b.positions.rows()];
        for e in &b.entries {
            let rows = pool.claim_ring_rows(e.seq, plan.layer, e.start, e.len)?;
            slots
                .get_mut(e.row..e.row + e.len)
                .ok_or_else(|| missing(plan, "a batch entry past the step's rows"))?
                .copy_from_slice(&rows);
        }
        let rows = b.positions.rows();
        let ring_slots = pool
            .inputs()
            .upload(slots, &[rows], &b.positions.device())?;
        let compress = match &self.compressor {
            Some(c) => Some(self.prepare_compress(plan, c, b, pool)?),
            None => None,
        };
        let index = match plan.attention {
            AttentionPlan::Sparse {
                selection: Selection::Indexer { .. },
                ..
            } => Some(prepare_index(cfg, plan, b, pool)?),
            _ => None,
        };
        let window_tables = pool.ring_tables(&seqs_of(b), plan.layer)?;
        let source_tables = match plan.kv_source().zip(lists_layer(plan)) {
            Some((src, ll)) if tables.insert((ll, src)) => {
                Some(pool.source_tables(&seqs_of(b), src)?)
            }
            _ => None,
        };
        Ok(AttentionStep {
            ring_slots,
            compress,
            index,
            window_tables,
            source_tables,
        })
    }

    /// The device half of layer `plan.layer`'s attention over the batch `b`
    /// (inputs `x` `[T, D]`, the `attn_norm` output), from its host half
    /// `step`: writes the layer's window rows, runs the compressor of a KV
    /// source, publishes the selection of an index source
    /// ([`Published::lists_of`] gives the lists it attended with), and
    /// returns `[T, D]`. Touches the pool's device tensors only. Marks its
    /// parts (`attention.query`, `.kv`, `.index`, `.lists`, `.mqa`, `.out`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        x: &Normed,
        b: &Batch,
        step: &AttentionStep,
        pool: &mut StatePool,
        published: &mut Published,
        marks: &mut Marks,
    ) -> Result<Tensor> {
        let rope = rope_params(plan);
        let (q, qr) = self.query(cfg, x, &b.positions, &rope)?;
        marks.mark("attention.query")?;
        self.write_window_kv(
            cfg,
            x,
            &b.positions,
            &rope,
            pool.window_rows_mut(),
            &step.ring_slots,
        )?;
        if let (Some(c), Some(s)) = (&self.compressor, &step.compress) {
            self.compress(cfg, plan, c, s, x, b, pool)?;
        }
        marks.mark("attention.kv")?;
        if let (
            AttentionPlan::Sparse {
                selection: Selection::Indexer { candidates_from },
                ..
            },
            Some(s),
        ) = (plan.attention, &step.index)
        {
            let iw = self
                .indexer
                .as_ref()
                .ok_or_else(|| missing(plan, "an index source without indexer weights"))?;
            self.index(
                cfg,
                plan,
                iw,
                s,
                x,
                &qr,
                b,
                pool,
                published,
                candidates_from,
            )?;
            marks.mark("attention.index")?;
        }
        if let AttentionPlan::Sparse {
            selection: Selection::Reuse { index_source },
            ..
        } = plan.attention
            && !published.topk.contains_key(&index_source)
        {
            return Err(missing(
                plan,
                "a reuse layer whose index source published nothing in this step",
            )
            .into());
        }
        let window_pages = pool.step_pages(&step.window_tables)?;
        let window_idx = ops::paged_window_rows(
            &b.positions,
            &b.owners,
            step.window_tables.view(&window_pages),
            cfg.attention.window,
        )?;
        let key = plan.kv_source().zip(lists_layer(plan));
        if let (Some((src, ll)), Some(tables)) = (key, &step.source_tables)
            && let Some(lists) = published.lists_of(plan)
        {
            let pages = pool.step_pages(tables)?;
            let rows = ops::paged_rows(lists, &b.owners, tables.view(&pages))?;
            published.rows.insert((ll, src), rows);
        }
        let comp_idx = key.and_then(|(src, ll)| published.rows.get(&(ll, src)));
        if comp_idx.is_none() && published.lists_of(plan).is_some() {
            return Err(missing(plan, "index lists without their compressed rows").into());
        }
        marks.mark("attention.lists")?;
        let o = self.mqa(cfg, pool, &q, &window_idx, comp_idx)?;
        marks.mark("attention.mqa")?;
        let f = self.output(cfg, &o, &b.positions, &rope)?;
        marks.mark("attention.out")?;
        Ok(f)
    }

    /// The host half of a KV source's compressor over every entry's new
    /// (not replayed) tokens: claims the entries of each group completed in
    /// this step (and their index keys), plans the partial groups a ratio-2
    /// source keeps (an odd trailing token), and uploads the members,
    /// positions and slots.
    ///
    /// A step in which every entry brings one new token (a decode step)
    /// gives a ratio-2 source a fixed `[B, 2]` of groups, one row per entry:
    /// an entry whose group does not complete has its new row twice as
    /// members and slot −1, which the row writers skip, so the step's
    /// launches and shapes depend on B alone (`docs/graph-decode.md`).
    fn prepare_compress(
        &self,
        plan: &LayerPlan,
        c: &Compressor,
        b: &Batch,
        pool: &mut StatePool,
    ) -> Result<CompressStep> {
        let device = b.positions.device();
        let keys = self.indexer.as_ref().is_some_and(|i| i.keys.is_some());
        // Per entry, the members of its new groups in token order: its
        // partial group's pending token (r < 0: pending row −1 − r) first,
        // then its new rows; and the row left pending afterwards.
        let decode = b.entries.iter().all(|e| e.len - e.replay == 1);
        let mut members = Vec::new();
        let mut tails = Vec::new();
        // Per entry: its completed groups, and whether it takes a skipped
        // row (a decode step's entry without a completed group).
        let mut counts = Vec::with_capacity(b.entries.len());
        let mut skipped = Vec::with_capacity(b.entries.len());
        for e in &b.entries {
            let mut m = Vec::with_capacity(e.len + 1);
            let new = i32_range("batch row", e.row + e.replay, e.len - e.replay)?;
            if c.wgate.is_some() {
                if let Some(r) = pool.pending_row_of(e.seq, plan.layer)? {
                    m.push(-1 - r);
                }
                m.extend(new.clone());
                tails.push((e.seq, (m.len() % 2 == 1).then(|| e.row + e.len - 1)));
                m.truncate(m.len() / 2 * 2);
                counts.push(m.len() / 2);
                let skip = decode && m.is_empty();
                if skip {
                    m.extend([new.start, new.start]);
                }
                skipped.push(skip);
            } else {
                m.extend(new);
                counts.push(e.len - e.replay);
                skipped.push(false);
            }
            members.extend(m);
        }
        // Their entry positions and pool rows.
        let mut positions = Vec::new();
        let (mut slots, mut key_slots) = (Vec::new(), Vec::new());
        for ((e, &n), &skip) in b.entries.iter().zip(&counts).zip(&skipped) {
            let (j0, rows, key_rows) = pool.claim_entries(e.seq, plan.layer, n)?;
            positions.extend((j0..j0 + n).map(|j| (j * plan.ratio) as i64));
            slots.extend(rows);
            if skip {
                positions.push(0);
                slots.push(-1);
            }
            if let Some(k) = key_rows {
                key_slots.extend(k);
                if skip {
                    key_slots.push(-1);
                }
            }
        }
        let n = positions.len();
        let inputs = pool.inputs().clone();
        let positions = inputs.upload(positions, &[n], &device)?;
        let slots = inputs.upload(slots, &[n], &device)?;
        let gated = c.wgate.is_some();
        let groups = (gated && n > 0)
            .then(|| inputs.upload(members, &[n, 2], &device))
            .transpose()?;
        let pending = if gated {
            pool.plan_pending(plan.layer, &tails)?
        } else {
            None
        };
        let key_slots = (keys && n > 0)
            .then(|| inputs.upload(key_slots, &[n], &device))
            .transpose()?;
        Ok(CompressStep {
            n,
            positions,
            slots,
            groups,
            key_slots,
            pending,
        })
    }

    /// The device half of a KV source's compressor ([`Attention::prepare_compress`]):
    /// stores the entries (and index keys) of each group completed in this
    /// step straight into the pools and copies the partial groups.
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        c: &Compressor,
        s: &CompressStep,
        x: &Tensor,
        b: &Batch,
        pool: &mut StatePool,
    ) -> Result<()> {
        let eps = crate::numerics::round_f32(cfg.norm_eps);
        let rd = cfg.attention.rope_head_dim;
        let device = x.device();
        let rope = rope_params(plan);
        let keys = self.indexer.as_ref().and_then(|i| i.keys.as_ref());
        let n = s.n;
        let norm = RowNorm {
            weight: &c.norm,
            eps,
        };
        let row_rope = RowRope {
            positions: &s.positions,
            rope_dim: rd,
            params: &rope,
        };
        let mut latent = match keys {
            Some(_) if n > 0 => Some(Tensor::empty(
                &device,
                DType::BF16,
                &[n, cfg.attention.head_dim],
            )?),
            _ => None,
        };
        let io = pool.compressor_io();
        let out = RowsOut {
            pool: io.entries,
            slots: &s.slots,
            latent: latent.as_mut(),
        };
        match &c.wgate {
            Some(wgate) => {
                let kv = c.wkv.forward_f32(x)?;
                let score = wgate.forward_f32(x)?;
                if let Some(groups) = &s.groups {
                    ops::compressor_rows_into(
                        &kv,
                        &score,
                        Some(io.pending),
                        groups,
                        norm,
                        row_rope,
                        out,
                    )?;
                }
                if let Some(p) = &s.pending {
                    pool.copy_pending(p, &kv, &score)?;
                }
                for e in &b.entries {
                    pool.record_group_rows(e.seq, plan.layer, &kv, &score, e.row, e.len)?;
                }
            }
            None => ops::kv_rows_into(
                &c.wkv.forward(new_rows(x, b)?.as_ref().unwrap_or(x))?,
                KvRowFormat::Compressed,
                Some(norm),
                Some(row_rope),
                out,
            )?,
        }
        if let (Some(kw), Some(latent), Some(key_slots)) = (keys, latent, &s.key_slots) {
            ops::kv_rows_into(
                &kw.wk.forward(&latent)?,
                KvRowFormat::IndexKey,
                Some(RowNorm {
                    weight: &kw.k_norm,
                    eps,
                }),
                Some(row_rope),
                RowsOut {
                    pool: pool.compressor_io().keys,
                    slots: key_slots,
                    latent: None,
                },
            )?;
        }
        Ok(())
    }

    /// The device half of an index source's indexer ([`prepare_index`]):
    /// publishes I32 `[T, k]` compressed entry indices (per row ascending,
    /// −1 trailing; an entry's own k is min(topk, end / ratio), its list −1
    /// padded to the widest) and, for a candidate source, the candidate
    /// block lists.
    #[allow(clippy::too_many_arguments)]
    fn index(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        iw: &Indexer,
        s: &IndexStep,
        x: &Tensor,
        qr: &Normed,
        b: &Batch,
        pool: &StatePool,
        published: &mut Published,
        candidates_from: Option<usize>,
    ) -> Result<()> {
        let ic = cfg.indexer;
        let device = x.device();
        let cand = match (
            plan.candidate_source || candidates_from.is_some(),
            cfg.candidate,
        ) {
            (false, _) => None,
            (true, Some(c)) => Some(c),
            (true, None) => {
                return Err(missing(plan, "a candidate layer without candidate settings").into());
            }
        };
        let mask_all =
            match candidates_from {
                Some(cs) => Some(published.candidates.get(&cs).ok_or_else(|| {
                    missing(plan, "the candidate source did not publish its blocks")
                })?),
                None => None,
            };
        let IndexStep::Lists { batched, entries } = s else {
            published.topk.insert(plan.layer, None);
            if plan.candidate_source {
                published.candidates.insert(plan.layer, None);
            }
            return Ok(());
        };
        let q = ops::rope(
            &iw.wq_b.forward_normed(qr)?,
            &b.positions,
            ic.n_heads,
            cfg.attention.rope_head_dim,
            &rope_params(plan),
        )?;
        let q = ops::index_key_quant(&q.reshape(&[x.rows(), ic.n_heads, ic.head_dim])?)?;
        let c = crate::numerics::round_f32(((ic.head_dim * ic.n_heads) as f64).powf(-0.5));
        let w = ops::scale(&iw.weights_proj.forward(x)?, c)?;
        let mut batch_out: Option<(Tensor, Option<Tensor>)> = None;
        if let Some(bt) = batched {
            let pick = |t| pick_rows(t, bt.all, &bt.rows);
            let tb = bt.rows.len();
            let pages = pool.gather_table(bt.src, TableKind::Keys, &bt.slots)?;
            let scores = ops::index_scores_paged(
                &*pick(&q)?,
                &*pick(&w)?,
                pool.key_rows(),
                &pages,
                pool.config().page_rows,
                &bt.visible,
            )?;
            let mask = mask_all
                .map(|m| match m {
                    Some(m) => pick(m),
                    None => Ok(Cow::Owned(host_i32(Vec::new(), &[tb, 0], &device)?)),
                })
                .transpose()?;
            let (lb, cb) = select(plan, cand, &scores, &bt.visible, mask.as_deref(), bt.k)?;
            // Every entry in the one pass (a decode step): its results are
            // the step's, row for row.
            if entries.iter().all(|e| matches!(e, EntryIndex::Batched)) {
                published.topk.insert(plan.layer, Some(lb));
                if plan.candidate_source {
                    published.candidates.insert(plan.layer, cb);
                }
                return Ok(());
            }
            batch_out = Some((lb, cb));
        }
        let (mut lists, mut cands) = (Vec::new(), Vec::new());
        let mut at = 0;
        for (e, ei) in b.entries.iter().zip(entries) {
            match ei {
                EntryIndex::Batched => {
                    let (lb, cb) = batch_out
                        .as_ref()
                        .ok_or_else(|| missing(plan, "a batched entry without the batched pass"))?;
                    lists.push(Piece::Rows(lb, at, e.len));
                    cands.extend(cb.as_ref().map(|cb| Piece::Rows(cb, at, e.len)));
                    at += e.len;
                }
                EntryIndex::Empty => {
                    lists.push(Piece::Empty(e.len));
                    cands.push(Piece::Empty(e.len));
                }
                EntryIndex::Own(own) => {
                    let OwnIndex {
                        visible,
                        blocks,
                        n,
                        k,
                    } = &**own;
                    let keys = pool.gather_key_blocks(blocks, *n)?;
                    let scores = ops::index_scores(
                        &q.narrow_rows(e.row, e.len)?,
                        &w.narrow_rows(e.row, e.len)?,
                        &keys,
                        visible,
                    )?;
                    let mask = mask_all
                        .map(|m| match m {
                            Some(m) => Ok(m.narrow_rows(e.row, e.len)?),
                            None => host_i32(Vec::new(), &[e.len, 0], &device),
                        })
                        .transpose()?;
                    let (l, c) = select(plan, cand, &scores, visible, mask.as_ref(), *k)?;
                    lists.push(Piece::Own(l));
                    cands.extend(c.map(Piece::Own));
                }
            }
        }
        published.topk.insert(plan.layer, assemble(lists, &device)?);
        if plan.candidate_source {
            published
                .candidates
                .insert(plan.layer, assemble(cands, &device)?);
        }
        Ok(())
    }
}

/// The host half of one layer's attention in a step ([`Attention::prepare`]),
/// everything its device half ([`Attention::run`]) reads from the host:
/// uploaded through the pool's step arena, so a step of the same shapes
/// refills the same tensors.
pub(crate) struct AttentionStep {
    /// The window-ring rows of the step's tokens, I32 `[T]` (−1: none).
    ring_slots: Input,
    /// A KV source's compressor.
    compress: Option<CompressStep>,
    /// An index source's indexer.
    index: Option<IndexStep>,
    /// The window ring's block tables for the step's entries.
    window_tables: StepTables,
    /// The compressed pool's block tables of (lists layer, KV source), for
    /// the first layer of the step attending with that pair.
    source_tables: Option<StepTables>,
}

/// The host half of a compressor's step ([`Attention::prepare_compress`]).
struct CompressStep {
    /// The entries completed in the step (with a decode step's skipped
    /// rows).
    n: usize,
    /// I64 `[n]`: each entry's position (its group's first token).
    positions: Input,
    /// I32 `[n]`: each entry's row in the compressed pool (−1: skipped).
    slots: Input,
    /// I32 `[n, 2]`: a ratio-2 group's two members (step rows, or −1 − r
    /// for pending row r); `None` at ratio 1 or when no group completes.
    groups: Option<Input>,
    /// I32 `[n]`: each entry's row in the key pool, for a source owning
    /// index keys (when n > 0).
    key_slots: Option<Input>,
    /// A ratio-2 source's partial groups.
    pending: Option<PendingCopy>,
}

/// The host half of an indexer's step ([`prepare_index`]).
enum IndexStep {
    /// No entry has a compressed entry to pick yet: the layer publishes no
    /// lists.
    Nothing,
    /// The score passes: one over the batched entries, one per other entry.
    Lists {
        batched: Option<Box<BatchedIndex>>,
        /// One per batch entry.
        entries: Vec<EntryIndex>,
    },
}

/// The one score pass of the entries of at most [`BATCHED_TOKENS`] tokens:
/// every token a row against its entry's keys, through the source's key
/// table (as wide as the widest live sequence's).
struct BatchedIndex {
    /// The step rows it scores, in batch order (`all`: every row).
    rows: Vec<usize>,
    all: bool,
    /// The KV source's layer, whose device key table
    /// ([`StatePool::gather_table`]) the scores read.
    src: usize,
    /// I32 `[rows]`: each row's sequence slot, its row of that table.
    slots: Input,
    /// I32 `[rows]`: each row's visible entries.
    visible: Input,
    /// The widest of its entries' k.
    k: usize,
}

/// How one entry of an index step is scored.
enum EntryIndex {
    /// In the batched pass.
    Batched,
    /// Nothing to pick yet (k = 0): its lists are −1.
    Empty,
    /// A pass of its own.
    Own(Box<OwnIndex>),
}

/// The score pass of one entry of its own: its first `n` keys (pages
/// `blocks`), its tokens' visible counts `visible`, top-`k`.
struct OwnIndex {
    visible: Input,
    blocks: Vec<usize>,
    n: usize,
    k: usize,
}

/// The host half of an index source's indexer over the batch `b`
/// ([`IndexStep`]): each entry's k (min(topk, its entries at its end)),
/// which entries share the batched pass, their key pages and visible
/// counts. Entries of at most [`BATCHED_TOKENS`] tokens are scored in one
/// pass (while their padded scores fit [`BATCHED_SCORE_BYTES`]; a row's scores
/// past its visible count are −∞, so the padding never changes a pick:
/// with k ≥ an entry's entries every one is picked either way, the visible
/// ones ascending, then −1), the others one entry at a time.
fn prepare_index(
    cfg: &ModelConfig,
    plan: &LayerPlan,
    b: &Batch,
    pool: &StatePool,
) -> Result<IndexStep> {
    let ic = cfg.indexer;
    let device = b.positions.device();
    let src = plan
        .kv_source()
        .ok_or_else(|| missing(plan, "a sparse layer without a KV source"))?;
    // Per entry: its entries at its end and its k.
    let ks: Vec<(usize, usize)> = b
        .entries
        .iter()
        .map(|e| {
            let n = (e.start + e.len) / plan.ratio;
            (n, ic.topk.min(n))
        })
        .collect();
    if ks.iter().all(|&(_, k)| k == 0) {
        return Ok(IndexStep::Nothing);
    }
    let visible_of = |e: &crate::model::batch::Entry| -> Result<Vec<i32>> {
        (e.start..e.start + e.len)
            .map(|p| i32_of("visible entries", (p + 1) / plan.ratio))
            .collect()
    };
    let mut in_batch: Vec<bool> = b
        .entries
        .iter()
        .zip(&ks)
        .map(|(e, &(_, k))| e.len <= BATCHED_TOKENS && k > 0)
        .collect();
    let batched = |in_batch: &[bool]| -> Vec<(&crate::model::batch::Entry, (usize, usize))> {
        b.entries
            .iter()
            .zip(&ks)
            .zip(in_batch)
            .filter_map(|((e, &nk), &on)| on.then_some((e, nk)))
            .collect()
    };
    // A batched row scores every key its table's width holds.
    let widest = pool
        .table_width(src, TableKind::Keys)?
        .saturating_mul(pool.config().page_rows);
    let rows: usize = batched(&in_batch).iter().map(|&(e, _)| e.len).sum();
    if rows.saturating_mul(widest).saturating_mul(2) > BATCHED_SCORE_BYTES {
        in_batch.fill(false);
    }
    let mut batched_pass = None;
    let members = batched(&in_batch);
    if !members.is_empty() {
        let (mut rows, mut seqs, mut visible) = (Vec::new(), Vec::new(), Vec::new());
        let mut k = 0;
        for &(e, (_, ke)) in &members {
            rows.extend(e.row..e.row + e.len);
            seqs.extend(std::iter::repeat_n(e.seq, e.len));
            visible.extend(visible_of(e)?);
            k = k.max(ke);
        }
        let all = rows.len() == b.positions.rows();
        let tb = rows.len();
        let slots = pool
            .inputs()
            .upload(pool.slots_of(&seqs)?, &[tb], &device)?;
        let visible = pool.inputs().upload(visible, &[tb], &device)?;
        // The lists' width, a launch parameter no upload's shape gives.
        pool.inputs().fix(k);
        batched_pass = Some(Box::new(BatchedIndex {
            rows,
            all,
            src,
            slots,
            visible,
            k,
        }));
    }
    let mut entries = Vec::with_capacity(b.entries.len());
    for ((e, &(n, k)), &on) in b.entries.iter().zip(&ks).zip(&in_batch) {
        entries.push(if on {
            EntryIndex::Batched
        } else if k == 0 {
            EntryIndex::Empty
        } else {
            pool.inputs().fix(k);
            EntryIndex::Own(Box::new(OwnIndex {
                visible: pool.inputs().upload(visible_of(e)?, &[e.len], &device)?,
                blocks: pool.key_pages_of(e.seq, src, n)?,
                n,
                k,
            }))
        });
    }
    Ok(IndexStep::Lists {
        batched: batched_pass,
        entries,
    })
}

/// The selection over rows of index scores: the index lists (top-k, or
/// reindexed inside `mask`'s candidate blocks when the layer reads a
/// candidate source's) and, for a candidate source, its candidate blocks.
fn select(
    plan: &LayerPlan,
    cand: Option<CandidateConfig>,
    scores: &Tensor,
    visible: &Tensor,
    mask: Option<&Tensor>,
    k: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let blocks = match (plan.candidate_source, cand) {
        (true, Some(cd)) => Some(ops::index_candidates(
            scores,
            visible,
            cd.block_size,
            cd.topk_blocks,
        )?),
        _ => None,
    };
    let lists = match (mask, cand) {
        (Some(mask), Some(cd)) => {
            ops::index_reindex_topk(scores, mask, cd.block_size, visible, k, 0)?
        }
        _ => ops::index_topk(scores, visible, k, 0)?,
    };
    Ok((lists, blocks))
}

/// A part of a published `[T, ..]` tensor, one entry's rows: rows of a
/// batched result, a result of its own, or none (−1).
enum Piece<'a> {
    Rows(&'a Tensor, usize, usize),
    Own(Tensor),
    Empty(usize),
}

/// The pieces one after another as I32 `[T, widest]`, narrower ones −1
/// padded; `None` when every piece is empty or of width 0. A single piece
/// of its own is taken as it is.
fn assemble(pieces: Vec<Piece>, device: &crate::device::Device) -> Result<Option<Tensor>> {
    let width = |p: &Piece| match p {
        Piece::Rows(t, ..) => t.shape().get(1).copied().unwrap_or(0),
        Piece::Own(t) => t.shape().get(1).copied().unwrap_or(0),
        Piece::Empty(_) => 0,
    };
    let wide = pieces.iter().map(width).max().unwrap_or(0);
    if wide == 0 {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(pieces.len());
    for p in pieces {
        let w = width(&p);
        let (own, rows) = match p {
            Piece::Rows(t, at, n) => (Some(t.narrow_rows(at, n)?), n),
            Piece::Own(t) => {
                let n = t.rows();
                (Some(t), n)
            }
            Piece::Empty(n) => (None, n),
        };
        let fill = (w < wide)
            .then(|| host_i32(vec![-1; rows * (wide - w)], &[rows, wide - w], device))
            .transpose()?;
        parts.push(match (own, fill) {
            (Some(t), None) => t,
            (Some(t), Some(f)) if w > 0 => ops::cat_cols(&[&t, &f])?,
            (_, Some(f)) => f,
            // Only a piece of width `wide` = 0, which returned above.
            (None, None) => host_i32(Vec::new(), &[rows, 0], device)?,
        });
    }
    if parts.len() == 1 {
        return Ok(parts.pop());
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Ok(Some(Tensor::cat_rows(&refs)?))
}

/// `rows` of `t`, or all of it as it is.
fn pick_rows<'t>(t: &'t Tensor, all: bool, rows: &[usize]) -> Result<Cow<'t, Tensor>> {
    Ok(if all {
        Cow::Borrowed(t)
    } else {
        Cow::Owned(ops::gather_rows(t, rows)?)
    })
}

/// The rows of `x` of every entry's new (not replayed) tokens; `None`
/// when that is all of `x`.
fn new_rows(x: &Tensor, b: &Batch) -> Result<Option<Tensor>> {
    if b.entries.iter().all(|e| e.replay == 0) {
        return Ok(None);
    }
    let parts: Vec<Tensor> = b
        .entries
        .iter()
        .map(|e| x.narrow_rows(e.row + e.replay, e.len - e.replay))
        .collect::<std::result::Result<_, _>>()?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    Ok(Some(Tensor::cat_rows(&refs)?))
}

/// The error of a layer whose weights or published inputs contradict its
/// role (the config validation rules it out; `why` says which part).
fn missing(plan: &LayerPlan, why: &'static str) -> crate::Error {
    crate::Error::Argument {
        op: "Attention::forward",
        arg: "layer",
        value: plan.layer.to_string(),
        why,
    }
}

/// The step's sequences in entry order (the rows of its block tables).
fn seqs_of(b: &Batch) -> Vec<SeqId> {
    b.entries.iter().map(|e| e.seq).collect()
}

/// The DSpark stage list shared by every block query of `seq`
/// (`v41-flash.md` §9.2): ring slots 0 … min(window, p + 1) − 1 in slot
/// order (slot s holds the newest position ≤ p congruent to s), then the
/// block's own `n` rows (positions p + 1 …): the host list of one query,
/// its physical rows (−1 where a slot is empty).
pub(crate) fn stage_list(
    pool: &StatePool,
    seq: SeqId,
    ring: usize,
    window: usize,
    p: usize,
    n: usize,
) -> Result<Vec<i32>> {
    let mut list = Vec::with_capacity(window.min(p + 1) + n);
    for slot in 0..window.min(p + 1) {
        let pos = p - (p + window - slot) % window;
        list.push(pool.ring_row(seq, ring, pos)?.unwrap_or(-1));
    }
    for q in p + 1..p + 1 + n {
        list.push(pool.ring_row(seq, ring, q)?.unwrap_or(-1));
    }
    Ok(list)
}
