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
use crate::model::marks::Marks;
use crate::model::pool::{SeqId, StatePool};
use crate::ops::{self, RowNorm, RowRope, RowsOut};
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::HashMap;

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

/// The most bytes the batched pass gathers its keys into (every row padded
/// to the batch's longest): past it the entries are indexed one at a time,
/// so a step mixing one very long sequence with many short ones, or a huge
/// batch at a long context, never allocates the padded copy.
const BATCHED_KEY_BYTES: usize = 256 << 20;

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

    /// Attention of layer `plan.layer` over the batch `b` (inputs `x`
    /// `[T, D]`, the `attn_norm` output). Writes the layer's window rows,
    /// runs the compressor of a KV source, publishes the selection of an
    /// index source ([`Published::lists_of`] gives the lists it attended
    /// with), and returns `[T, D]`. Marks its parts (`attention.query`,
    /// `.kv`, `.index`, `.lists`, `.mqa`, `.out`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        x: &Normed,
        b: &Batch,
        pool: &mut StatePool,
        published: &mut Published,
        marks: &mut Marks,
    ) -> Result<Tensor> {
        let rope = rope_params(plan);
        let (q, qr) = self.query(cfg, x, &b.positions, &rope)?;
        marks.mark("attention.query")?;
        let mut slots = vec![-1i32; x.rows()];
        for e in &b.entries {
            let rows = pool.claim_ring_rows(e.seq, plan.layer, e.start, e.len)?;
            slots
                .get_mut(e.row..e.row + e.len)
                .ok_or_else(|| missing(plan, "a batch entry past the step's rows"))?
                .copy_from_slice(&rows);
        }
        let slots = pool.inputs().upload(slots, &[x.rows()], &x.device())?;
        self.write_window_kv(cfg, x, &b.positions, &rope, pool.window_rows_mut(), &slots)?;
        if let Some(c) = &self.compressor {
            self.compress(cfg, plan, c, x, b, pool)?;
        }
        marks.mark("attention.kv")?;
        if let AttentionPlan::Sparse {
            selection: Selection::Indexer { candidates_from },
            ..
        } = plan.attention
        {
            let iw = self
                .indexer
                .as_ref()
                .ok_or_else(|| missing(plan, "an index source without indexer weights"))?;
            self.index(cfg, plan, iw, x, &qr, b, pool, published, candidates_from)?;
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
        let window_idx = window_lists(pool, b, plan.layer, cfg.attention.window)?;
        let key = plan.kv_source().zip(lists_layer(plan));
        if let Some((src, ll)) = key
            && !published.rows.contains_key(&(ll, src))
            && let Some(lists) = published.lists_of(plan)
        {
            let tables = pool.source_tables(&seqs_of(b), src)?;
            let rows = ops::paged_rows(lists, &b.owners, tables.view())?;
            published.rows.insert((ll, src), rows);
        }
        let comp_idx = key.and_then(|(src, ll)| published.rows.get(&(ll, src)));
        marks.mark("attention.lists")?;
        let o = self.mqa(cfg, pool, &q, &window_idx, comp_idx)?;
        marks.mark("attention.mqa")?;
        let f = self.output(cfg, &o, &b.positions, &rope)?;
        marks.mark("attention.out")?;
        Ok(f)
    }

    /// A KV source's compressor over every entry's new (not replayed)
    /// tokens: stores the entries (and index keys) of each group completed
    /// in this step straight into the pools; a ratio-2 source keeps an odd
    /// trailing token as the partial group.
    ///
    /// A step in which every entry brings one new token (a decode step)
    /// gives a ratio-2 source a fixed `[B, 2]` of groups, one row per entry:
    /// an entry whose group does not complete has its new row twice as
    /// members and slot −1, which the row writers skip, so the step's
    /// launches and shapes depend on B alone (`docs/graph-decode.md`).
    fn compress(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        c: &Compressor,
        x: &Tensor,
        b: &Batch,
        pool: &mut StatePool,
    ) -> Result<()> {
        let eps = crate::numerics::round_f32(cfg.norm_eps);
        let rd = cfg.attention.rope_head_dim;
        let device = x.device();
        let rope = rope_params(plan);
        let keys = self.indexer.as_ref().and_then(|i| i.keys.as_ref());
        // A handle on the pool's upload arena, usable while the pool's
        // compressor buffers are borrowed.
        let inputs = pool.inputs().clone();
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
        // Their entry positions and pool rows (claimed now, stored below).
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
        let pos = inputs.upload(positions, &[n], &device)?;
        let slots = inputs.upload(slots, &[n], &device)?;
        let norm = RowNorm {
            weight: &c.norm,
            eps,
        };
        let row_rope = RowRope {
            positions: &pos,
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
            slots: &slots,
            latent: latent.as_mut(),
        };
        match &c.wgate {
            Some(wgate) => {
                let kv = c.wkv.forward_f32(x)?;
                let score = wgate.forward_f32(x)?;
                if n > 0 {
                    let groups = inputs.upload(members, &[n, 2], &device)?;
                    ops::compressor_rows_into(
                        &kv,
                        &score,
                        Some(io.pending),
                        &groups,
                        norm,
                        row_rope,
                        out,
                    )?;
                }
                pool.set_pending(plan.layer, &tails, &kv, &score)?;
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
        if let (Some(kw), Some(latent)) = (keys, latent) {
            let key_slots = inputs.upload(key_slots, &[n], &device)?;
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
                    slots: &key_slots,
                    latent: None,
                },
            )?;
        }
        Ok(())
    }

    /// The indexer of an index source: publishes I32 `[T, k]` compressed
    /// entry indices (per row ascending, −1 trailing; an entry's own k is
    /// min(topk, end / ratio), its list −1 padded to the widest) and, for a
    /// candidate source, the candidate block lists. Entries of at most
    /// [`BATCHED_TOKENS`] tokens are scored in one pass (while their padded
    /// keys fit [`BATCHED_KEY_BYTES`]) (every token a row
    /// against its entry's keys, padded to the widest entry's pages; a
    /// row's scores past its visible count are −∞, so the padding never
    /// changes a pick: with k ≥ an entry's entries every one is picked
    /// either way, the visible ones ascending, then −1), the others one
    /// entry at a time.
    #[allow(clippy::too_many_arguments)]
    fn index(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        iw: &Indexer,
        x: &Tensor,
        qr: &Normed,
        b: &Batch,
        pool: &StatePool,
        published: &mut Published,
        candidates_from: Option<usize>,
    ) -> Result<()> {
        let ic = cfg.indexer;
        let device = x.device();
        let src = plan
            .kv_source()
            .ok_or_else(|| missing(plan, "a sparse layer without a KV source"))?;
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
            published.topk.insert(plan.layer, None);
            if plan.candidate_source {
                published.candidates.insert(plan.layer, None);
            }
            return Ok(());
        }
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
        let visible_of = |e: &crate::model::batch::Entry| -> Result<Vec<i32>> {
            (e.start..e.start + e.len)
                .map(|p| i32_of("visible entries", (p + 1) / plan.ratio))
                .collect()
        };
        // Rows of the step's [T, ..] tensors in batch order: the batched
        // entries' rows come from one pass, each other entry's from its own.
        let mut in_batch: Vec<bool> = b
            .entries
            .iter()
            .zip(&ks)
            .map(|(e, &(_, k))| e.len <= BATCHED_TOKENS && k > 0)
            .collect();
        let batched = || {
            b.entries
                .iter()
                .zip(&ks)
                .zip(&in_batch)
                .filter_map(|(ek, &on)| on.then_some(ek))
        };
        let pr = pool.config().page_rows.max(1);
        let widest = batched()
            .map(|(_, &(n, _))| n.div_ceil(pr) * pr)
            .max()
            .unwrap_or(0);
        let rows: usize = batched().map(|(e, _)| e.len).sum();
        let key_bytes = ops::index_key_row_nibbles(ic.head_dim) / 2;
        if rows.saturating_mul(widest).saturating_mul(key_bytes) > BATCHED_KEY_BYTES {
            in_batch.fill(false);
        }
        let mut batch_out: Option<(Tensor, Option<Tensor>)> = None;
        if in_batch.contains(&true) {
            let (mut rows, mut key_rows, mut visible) = (Vec::new(), Vec::new(), Vec::new());
            let mut k = 0;
            for (e, &(n, ke)) in b
                .entries
                .iter()
                .zip(&ks)
                .zip(&in_batch)
                .filter_map(|(ek, &on)| on.then_some(ek))
            {
                rows.extend(e.row..e.row + e.len);
                key_rows.extend(std::iter::repeat_n((e.seq, n), e.len));
                visible.extend(visible_of(e)?);
                k = k.max(ke);
            }
            let all = rows.len() == x.rows();
            let pick = |t| pick_rows(t, all, &rows);
            let keys = pool.gather_keys_rows(src, &key_rows)?;
            let tb = rows.len();
            let visible = pool.inputs().upload(visible, &[tb], &device)?;
            let scores = ops::index_scores(&*pick(&q)?, &*pick(&w)?, &keys, &visible)?;
            let mask = mask_all
                .map(|m| match m {
                    Some(m) => pick(m),
                    None => Ok(Cow::Owned(host_i32(Vec::new(), &[tb, 0], &device)?)),
                })
                .transpose()?;
            let (lb, cb) = select(plan, cand, &scores, &visible, mask.as_deref(), k)?;
            // Every entry in the one pass (a decode step): its results are
            // the step's, row for row.
            if in_batch.iter().all(|&on| on) {
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
        for ((e, &(n, k)), &on) in b.entries.iter().zip(&ks).zip(&in_batch) {
            if let Some((lb, cb)) = batch_out.as_ref().filter(|_| on) {
                lists.push(Piece::Rows(lb, at, e.len));
                cands.extend(cb.as_ref().map(|cb| Piece::Rows(cb, at, e.len)));
                at += e.len;
                continue;
            }
            if k == 0 {
                lists.push(Piece::Empty(e.len));
                cands.push(Piece::Empty(e.len));
                continue;
            }
            let visible = pool.inputs().upload(visible_of(e)?, &[e.len], &device)?;
            let keys = pool.gather_keys(e.seq, src, n)?;
            let scores = ops::index_scores(
                &q.narrow_rows(e.row, e.len)?,
                &w.narrow_rows(e.row, e.len)?,
                &keys,
                &visible,
            )?;
            let mask = mask_all
                .map(|m| match m {
                    Some(m) => Ok(m.narrow_rows(e.row, e.len)?),
                    None => host_i32(Vec::new(), &[e.len, 0], &device),
                })
                .transpose()?;
            let (l, c) = select(plan, cand, &scores, &visible, mask.as_ref(), k)?;
            lists.push(Piece::Own(l));
            cands.extend(c.map(Piece::Own));
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

/// The window part of every query's list as physical ring rows:
/// I32 `[T, window]`, built on the device from the ring's block tables.
pub(crate) fn window_lists(
    pool: &StatePool,
    b: &Batch,
    ring: usize,
    window: usize,
) -> Result<Tensor> {
    let tables = pool.ring_tables(&seqs_of(b), ring)?;
    Ok(ops::paged_window_rows(
        &b.positions,
        &b.owners,
        tables.view(),
        window,
    )?)
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
