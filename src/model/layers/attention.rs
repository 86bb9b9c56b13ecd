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

use super::linear::{Bf16Linear, Fp8Linear};
use crate::contract::{KvRowFormat, RopeParams, Yarn};
use crate::dtype::DType;
use crate::model::batch::Batch;
use crate::model::config::{AttentionPlan, LayerPlan, ModelConfig, Selection};
use crate::model::error::Result;
use crate::model::pool::{SeqId, StatePool};
use crate::ops::{self, RowNorm, RowRope, RowsOut};
use crate::tensor::Tensor;
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

/// Selections published by earlier layers of the same step, one tensor per
/// batch entry.
#[derive(Default)]
pub struct Published {
    /// Index source → per entry I32 `[len, k]` compressed entry indices
    /// (−1 = none).
    pub topk: HashMap<usize, Vec<Tensor>>,
    /// Candidate source → per entry I32 `[len, W]` candidate block lists.
    pub candidates: HashMap<usize, Vec<Tensor>>,
}

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

fn host_i64(v: Vec<i64>, device: &crate::device::Device) -> Result<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, &[n])?.to_device(device)?)
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
    /// The query `[T, H, hd]` (after RoPE) and `qr` (the `q_norm` output).
    pub fn query(
        &self,
        cfg: &ModelConfig,
        x: &Tensor,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<(Tensor, Tensor)> {
        let a = cfg.attention;
        let eps = crate::numerics::round_f32(cfg.norm_eps);
        let qr = ops::rms_norm(&self.wq_a.forward(x)?, &self.q_norm, eps)?;
        let q = ops::rope(
            &self.wq_b.forward(&qr)?,
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
        x: &Tensor,
        positions: &Tensor,
        rope: &RopeParams,
    ) -> Result<Tensor> {
        let (norm, rope) = self.window_prologue(cfg, positions, rope);
        Ok(ops::kv_rows(
            &self.wkv.forward(x)?,
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
        x: &Tensor,
        positions: &Tensor,
        rope: &RopeParams,
        pool: &mut Tensor,
        slots: &Tensor,
    ) -> Result<()> {
        let (norm, rope) = self.window_prologue(cfg, positions, rope);
        Ok(ops::kv_rows_into(
            &self.wkv.forward(x)?,
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
        let a = cfg.attention;
        let comp = compressed_idx.map(|i| (pool.compressed_rows(), i));
        let (o, _) = ops::sparse_mqa(q, pool.window_rows(), window_idx, comp, &self.sink)?;
        let t = q.rows();
        let o = o.reshape(&[t, a.n_heads * a.head_dim])?;
        let o = ops::inverse_rope(&o, positions, a.n_heads, a.rope_head_dim, rope)?;
        let y = ops::grouped_bf16_linear(&o, &self.wo_a, a.o_groups)?;
        Ok(self.wo_b.forward(&y)?)
    }

    /// Attention of layer `plan.layer` over the batch `b` (inputs `x`
    /// `[T, D]`, the `attn_norm` output). Writes the layer's window rows,
    /// runs the compressor of a KV source, publishes the selection, and
    /// returns `[T, D]` and each entry's compressed index list.
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        x: &Tensor,
        b: &Batch,
        pool: &mut StatePool,
        published: &mut Published,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let rope = rope_params(plan);
        let (q, qr) = self.query(cfg, x, &b.positions, &rope)?;
        let mut slots = vec![-1i32; x.rows()];
        for e in &b.entries {
            let rows = pool.claim_ring_rows(e.seq, plan.layer, e.start, e.len)?;
            slots
                .get_mut(e.row..e.row + e.len)
                .ok_or_else(|| missing(plan, "a batch entry past the step's rows"))?
                .copy_from_slice(&rows);
        }
        let slots = host_i32(slots, &[x.rows()], &x.device())?;
        self.write_window_kv(cfg, x, &b.positions, &rope, pool.window_rows_mut(), &slots)?;
        if let Some(c) = &self.compressor {
            self.compress(cfg, plan, c, x, b, pool)?;
        }
        let lists = match plan.attention {
            AttentionPlan::WindowOnly => Vec::new(),
            AttentionPlan::Sparse { selection, .. } => {
                let lists = match selection {
                    Selection::Indexer { candidates_from } => {
                        let iw = self.indexer.as_ref().ok_or_else(|| {
                            missing(plan, "an index source without indexer weights")
                        })?;
                        self.index(cfg, plan, iw, x, &qr, b, pool, published, candidates_from)?
                    }
                    Selection::Reuse { index_source } => {
                        published.topk.get(&index_source).cloned().ok_or_else(|| {
                            missing(
                                plan,
                                "a reuse layer whose index source published nothing in this step",
                            )
                        })?
                    }
                };
                published.topk.insert(plan.layer, lists.clone());
                lists
            }
        };
        let window_idx = window_lists(pool, b, plan.layer, cfg.attention.window)?;
        let comp_idx = match plan.kv_source() {
            Some(src) => compressed_lists(pool, b, src, &lists)?,
            None => None,
        };
        let f = self.attend(
            cfg,
            pool,
            &q,
            &window_idx,
            comp_idx.as_ref(),
            &b.positions,
            &rope,
        )?;
        Ok((f, lists))
    }

    /// A KV source's compressor over every entry's new (not replayed)
    /// tokens: stores the entries (and index keys) of each group completed
    /// in this step straight into the pools; a ratio-2 source keeps an odd
    /// trailing token as the partial group.
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
        // Per entry, the members of its new groups in token order: its
        // partial group's pending token (r < 0: pending row −1 − r) first,
        // then its new rows; and the row left pending afterwards.
        let mut members = Vec::new();
        let mut tails = Vec::new();
        let mut counts = Vec::with_capacity(b.entries.len());
        for e in &b.entries {
            let mut m = Vec::with_capacity(e.len + 1);
            if c.wgate.is_some() {
                if let Some(r) = pool.pending_row_of(e.seq, plan.layer)? {
                    m.push(-1 - r);
                }
                m.extend(i32_range("batch row", e.row + e.replay, e.len - e.replay)?);
                tails.push((e.seq, (m.len() % 2 == 1).then(|| e.row + e.len - 1)));
                m.truncate(m.len() / 2 * 2);
                counts.push(m.len() / 2);
            } else {
                m.extend(i32_range("batch row", e.row + e.replay, e.len - e.replay)?);
                counts.push(e.len - e.replay);
            }
            members.extend(m);
        }
        // Their entry positions and pool rows (claimed now, stored below).
        let mut positions = Vec::new();
        let (mut slots, mut key_slots) = (Vec::new(), Vec::new());
        for (e, &n) in b.entries.iter().zip(&counts) {
            let (j0, rows, key_rows) = pool.claim_entries(e.seq, plan.layer, n)?;
            positions.extend((j0..j0 + n).map(|j| (j * plan.ratio) as i64));
            slots.extend(rows);
            key_slots.extend(key_rows.unwrap_or_default());
        }
        let n = positions.len();
        let pos = host_i64(positions, &device)?;
        let slots = host_i32(slots, &[n], &device)?;
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
                    let groups = host_i32(members, &[n, 2], &device)?;
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
                for (seq, tail) in tails {
                    pool.set_pending(seq, plan.layer, tail.map(|r| (&kv, &score, r)))?;
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
        if let (Some(kw), Some(latent)) = (keys, latent) {
            let key_slots = host_i32(key_slots, &[n], &device)?;
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

    /// The indexer of an index source: per entry, I32 `[len, k]` compressed
    /// entry indices (ascending, −1 trailing), k = min(topk, end / ratio).
    #[allow(clippy::too_many_arguments)]
    fn index(
        &self,
        cfg: &ModelConfig,
        plan: &LayerPlan,
        iw: &Indexer,
        x: &Tensor,
        qr: &Tensor,
        b: &Batch,
        pool: &StatePool,
        published: &mut Published,
        candidates_from: Option<usize>,
    ) -> Result<Vec<Tensor>> {
        let ic = cfg.indexer;
        let device = x.device();
        let src = plan
            .kv_source()
            .ok_or_else(|| missing(plan, "a sparse layer without a KV source"))?;
        let q = ops::rope(
            &iw.wq_b.forward(qr)?,
            &b.positions,
            ic.n_heads,
            cfg.attention.rope_head_dim,
            &rope_params(plan),
        )?;
        let q = ops::index_key_quant(&q.reshape(&[x.rows(), ic.n_heads, ic.head_dim])?)?;
        let c = crate::numerics::round_f32(((ic.head_dim * ic.n_heads) as f64).powf(-0.5));
        let w = ops::scale(&iw.weights_proj.forward(x)?, c)?;
        let mut lists = Vec::with_capacity(b.entries.len());
        let mut cands = Vec::new();
        for (i, e) in b.entries.iter().enumerate() {
            let end = e.start + e.len;
            let n = end / plan.ratio;
            let k = ic.topk.min(n);
            if k == 0 {
                lists.push(Tensor::from_vec(Vec::<i32>::new(), &[e.len, 0])?.to_device(&device)?);
                if plan.candidate_source {
                    cands.push(
                        Tensor::from_vec(Vec::<i32>::new(), &[e.len, 0])?.to_device(&device)?,
                    );
                }
                continue;
            }
            let visible: Vec<i32> = (e.start..end)
                .map(|p| i32_of("visible entries", (p + 1) / plan.ratio))
                .collect::<Result<_>>()?;
            let visible = host_i32(visible, &[e.len], &device)?;
            let keys = pool.gather_keys(e.seq, src, n)?;
            let scores = ops::index_scores(
                &q.narrow_rows(e.row, e.len)?,
                &w.narrow_rows(e.row, e.len)?,
                &keys,
                &visible,
            )?;
            if plan.candidate_source {
                let cand = cfg
                    .candidate
                    .ok_or_else(|| missing(plan, "a candidate layer without candidate settings"))?;
                cands.push(ops::index_candidates(
                    &scores,
                    &visible,
                    cand.block_size,
                    cand.topk_blocks,
                )?);
            }
            lists.push(match candidates_from {
                Some(cs) => {
                    let cand = cfg.candidate.ok_or_else(|| {
                        missing(plan, "a candidate layer without candidate settings")
                    })?;
                    let mask = published
                        .candidates
                        .get(&cs)
                        .and_then(|v| v.get(i))
                        .ok_or_else(|| {
                            missing(plan, "the candidate source did not publish its blocks")
                        })?;
                    ops::index_reindex_topk(&scores, mask, cand.block_size, &visible, k, 0)?
                }
                None => ops::index_topk(&scores, &visible, k, 0)?,
            });
        }
        if plan.candidate_source {
            published.candidates.insert(plan.layer, cands);
        }
        Ok(lists)
    }
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

/// The compressed part of every query's list as physical rows of the
/// compressed pool: I32 `[T, Kc]`, Kc the widest entry's k (−1 padded);
/// `None` while no entry has any (the list is the window alone). Built on
/// the device: the entries' lists side by side (a narrower one padded with
/// −1 columns), then mapped through the source's block tables.
fn compressed_lists(
    pool: &StatePool,
    b: &Batch,
    src: usize,
    lists: &[Tensor],
) -> Result<Option<Tensor>> {
    let width = |l: &Tensor| l.shape().get(1).copied().unwrap_or(0);
    let kc = lists.iter().map(width).max().unwrap_or(0);
    if kc == 0 {
        return Ok(None);
    }
    let device = b.positions.device();
    let padded = lists
        .iter()
        .zip(&b.entries)
        .map(|(l, e)| {
            let w = width(l);
            if w == kc {
                return Ok(None);
            }
            let fill = host_i32(vec![-1; e.len * (kc - w)], &[e.len, kc - w], &device)?;
            Ok(Some(if w == 0 {
                fill
            } else {
                ops::cat_cols(&[l, &fill])?
            }))
        })
        .collect::<Result<Vec<Option<Tensor>>>>()?;
    let parts: Vec<&Tensor> = lists
        .iter()
        .zip(&padded)
        .map(|(l, p)| p.as_ref().unwrap_or(l))
        .collect();
    let cat;
    let logical = match parts.as_slice() {
        [one] => *one,
        _ => {
            cat = Tensor::cat_rows(&parts)?;
            &cat
        }
    };
    let tables = pool.source_tables(&seqs_of(b), src)?;
    Ok(Some(ops::paged_rows(logical, &b.owners, tables.view())?))
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
