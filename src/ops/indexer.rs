//! The indexer ops (`v41-flash.md` §3.5–3.7): FP4 index-key rows, the BF16
//! index scores, the exact top-k selection, the candidate-block pre-filter
//! and reindexing inside the candidates, on the CPU reference or the CUDA
//! kernels of `kernels-cuda/indexer/`.
//!
//! An index-key row (keys and queries alike) is
//! [`crate::kv_format`]'s row: `dim/2` bytes of packed e2m1 then
//! `dim/32` E8M0 scale bytes. As a tensor it is an `F4E2M1x2` tensor whose last
//! dimension is `dim + dim/16` nibbles (`17·dim/32` bytes, 68 at dim 128).
//!
//! Invariants a caller must know: scores are BF16 and bitwise equal to
//! [`cpu_backend::indexer::index_scores`] on both devices and with either
//! GPU kernel ([`ScoreKernel`]); the top-k is exact
//! with ties to the lower entry index and returns exactly
//! [`cpu_backend::indexer::select`]'s list; the candidate list is exactly
//! [`cpu_backend::indexer::candidate_mask`]'s kept blocks (ties to the lower
//! block index), and the masked scores are [`cpu_backend::indexer::mask_scores`]
//! on the BF16 bits; `visible` values live on the
//! inputs' device and are clamped to `[0, n]` (they are not read back for
//! validation).

use super::{common_device, shape_error};
pub use crate::contract::{ScoreKernel, ScoreShape};
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, Fp4x2};
use crate::error::{Error, Result};
use crate::kv_format;
use crate::tensor::Tensor;
use half::bf16;

/// Values sharing one E8M0 scale in an index-key row.
pub const INDEX_KEY_GROUP: usize = 32;
/// Largest `heads × dim` of a score query (its decoded fp32 copy lives in
/// 48 KiB of shared memory together with the head weights).
pub const INDEX_SCORE_MAX_HEADS_X_DIM: usize = 11_776;

/// Nibbles (the `F4E2M1x2` last dimension) of an index-key row of `dim` values.
pub fn index_key_row_nibbles(dim: usize) -> usize {
    dim + dim / 16
}

/// `dim` of an index-key row tensor's last dimension, if it is one.
fn dim_of_row(nibbles: usize) -> Option<usize> {
    (nibbles > 0 && nibbles.is_multiple_of(34)).then_some(nibbles / 17 * 16)
}

/// `visible` is `[batch]`, one count per row of `source` (named in the error).
fn check_visible(op: &'static str, visible: &Tensor, batch: usize, source: &str) -> Result<()> {
    if visible.shape() != [batch] {
        return Err(shape_error(
            op,
            "visible",
            visible,
            format!("[{batch}] ({source} batch)"),
        ));
    }
    Ok(())
}

/// BF16 → f32 by widening the bit pattern. Unlike `bf16::to_f32`, which sets
/// the quiet bit of a signalling NaN, this keeps every payload, so
/// `f32::total_cmp` orders the widened scores exactly as the GPU kernels order
/// the raw 16-bit keys (NaNs included).
fn widen(v: bf16) -> f32 {
    f32::from_bits(u32::from(v.to_bits()) << 16)
}

/// Per batch row of the host BF16 `scores` `[batch, n]` and I32 `visible`
/// `[batch]`: the row widened to f32 ([`widen`]) and its visible count
/// clamped to `[0, n]`.
fn widened_rows<'a>(
    scores: &'a Tensor,
    visible: &'a Tensor,
    n: usize,
) -> Result<impl Iterator<Item = (Vec<f32>, usize)> + 'a> {
    let (sc, vis) = (scores.as_slice::<bf16>()?, visible.as_slice::<i32>()?);
    Ok(vis.iter().enumerate().map(move |(b, &v)| {
        let row = sc[b * n..(b + 1) * n].iter().map(|x| widen(*x)).collect();
        (row, v.clamp(0, n as i32) as usize)
    }))
}

const QUANT: &str = "index_key_quant";

/// BF16 `x` `[.., dim]` (dim a positive multiple of 32) → index-key rows
/// `[.., dim + dim/16]` (`F4E2M1x2`), bitwise `kv_format::encode_index_key_row`
/// per row. Used for the key cache and for the FP4 index queries.
pub fn index_key_quant(x: &Tensor) -> Result<Tensor> {
    let (device, dim) = validate_quant(x)?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = index_key_row_nibbles(dim);
    let mut out = Tensor::empty(&device, DType::F4E2M1x2, &shape)?;
    index_key_quant_into(x, &mut out)?;
    Ok(out)
}

/// [`index_key_quant`] into a preallocated `out` of the matching shape.
pub fn index_key_quant_into(x: &Tensor, out: &mut Tensor) -> Result<()> {
    let (_, dim) = validate_quant(x)?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = index_key_row_nibbles(dim);
    out.expect_output(QUANT, "out", DType::F4E2M1x2, &shape)?;
    match common_device(QUANT, &[("x", x), ("out", out)])? {
        Device::Cpu => {
            let rows_out: Vec<Fp4x2> = x
                .as_slice::<bf16>()?
                .chunks_exact(dim)
                .flat_map(kv_format::encode_index_key_row)
                .map(Fp4x2)
                .collect();
            out.as_mut_slice::<Fp4x2>()?.copy_from_slice(&rows_out);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::indexer::index_key_quant(&dev, x, out, x.numel() / dim, dim)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(QUANT, &d)),
    }
}

fn validate_quant(x: &Tensor) -> Result<(Device, usize)> {
    x.expect_dtype(QUANT, "x", DType::BF16)?;
    let dim = match x.shape().last() {
        Some(&d) if d > 0 && d.is_multiple_of(INDEX_KEY_GROUP) && d <= i32::MAX as usize => d,
        _ => {
            return Err(shape_error(
                QUANT,
                "x",
                x,
                "rank >= 1 with a last dimension that is a positive multiple of 32".into(),
            ));
        }
    };
    Ok((x.device(), dim))
}

const SCORES: &str = "index_scores";

/// Index scores `[batch, n]` (BF16) of FP4 queries `q` `[batch, heads, R]`
/// against FP4 keys `[n, R]` (one cache shared by every query, as in a
/// prefill) or `[batch, n, R]` (one cache per query row, as in a batched
/// decode), with head weights `w` `[batch, heads]` (BF16, already × 2^−6) and
/// `visible` `[batch]` (I32): s_t = Σ_h bf16(w_h·relu(bf16(q_h·k_t))) in
/// head order, −∞ for t ≥ visible. `R = dim + dim/16` nibbles, dim a multiple
/// of 32, heads × dim ≤ [`INDEX_SCORE_MAX_HEADS_X_DIM`].
pub fn index_scores(q: &Tensor, w: &Tensor, keys: &Tensor, visible: &Tensor) -> Result<Tensor> {
    let (device, s) = validate_scores(q, w, keys, visible)?;
    let mut out = Tensor::empty(&device, DType::BF16, &[s.batch, s.n])?;
    index_scores_into(q, w, keys, visible, &mut out)?;
    Ok(out)
}

/// [`index_scores`] into a preallocated BF16 `out` `[batch, n]`.
pub fn index_scores_into(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    index_scores_into_with(q, w, keys, visible, out, ScoreKernel::Auto)
}

/// [`index_scores_into`] with an explicit CUDA kernel (tests and benches).
pub fn index_scores_into_with(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
    kernel: ScoreKernel,
) -> Result<()> {
    let (_, s) = validate_scores(q, w, keys, visible)?;
    out.expect_output(SCORES, "out", DType::BF16, &[s.batch, s.n])?;
    match common_device(SCORES, &[("q", q), ("out", out)])? {
        Device::Cpu => {
            let (qb, wb) = (q.as_slice::<Fp4x2>()?, w.as_slice::<bf16>()?);
            let (kb, vis) = (keys.as_slice::<Fp4x2>()?, visible.as_slice::<i32>()?);
            let row = s.dim / 2 + s.dim / 32;
            let decode = |rows: &[Fp4x2]| -> Vec<bf16> {
                rows.chunks_exact(row)
                    .flat_map(|r| {
                        let bytes: Vec<u8> = r.iter().map(|b| b.0).collect();
                        kv_format::decode_index_key_row(&bytes, s.dim)
                    })
                    .collect()
            };
            let shared = (!s.per_row_keys).then(|| decode(kb));
            let o = out.as_mut_slice::<bf16>()?;
            for b in 0..s.batch {
                let qd = decode(&qb[b * s.heads * row..(b + 1) * s.heads * row]);
                let own;
                let kd = match &shared {
                    Some(k) => k,
                    None => {
                        own = decode(&kb[b * s.n * row..(b + 1) * s.n * row]);
                        &own
                    }
                };
                let visible = vis[b].clamp(0, s.n as i32) as usize;
                let wh = &wb[b * s.heads..(b + 1) * s.heads];
                let sc = cpu_backend::indexer::index_scores(&qd, kd, wh, s.dim, visible);
                for (d, v) in o[b * s.n..(b + 1) * s.n].iter_mut().zip(sc) {
                    *d = bf16::from_f32(v);
                }
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::indexer::index_scores(&dev, q, w, keys, visible, out, s, kernel)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = kernel;
            Err(super::kernels_not_built(SCORES, &d))
        }
    }
}

fn validate_scores(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
) -> Result<(Device, ScoreShape)> {
    q.expect_dtype(SCORES, "q", DType::F4E2M1x2)?;
    w.expect_dtype(SCORES, "w", DType::BF16)?;
    keys.expect_dtype(SCORES, "keys", DType::F4E2M1x2)?;
    visible.expect_dtype(SCORES, "visible", DType::I32)?;
    let device = common_device(
        SCORES,
        &[("q", q), ("w", w), ("keys", keys), ("visible", visible)],
    )?;
    let row_expect =
        "an index-key row as last dimension (dim + dim/16 nibbles, dim a positive multiple of 32)";
    let (batch, heads, nib) = match *q.shape() {
        [b, h, r] if h > 0 => (b, h, r),
        _ => {
            return Err(shape_error(
                SCORES,
                "q",
                q,
                format!("[batch, heads > 0, R] with R {row_expect}"),
            ));
        }
    };
    let dim = dim_of_row(nib).ok_or_else(|| {
        shape_error(
            SCORES,
            "q",
            q,
            format!("[batch, heads, R] with R {row_expect}"),
        )
    })?;
    if heads * dim > INDEX_SCORE_MAX_HEADS_X_DIM {
        return Err(shape_error(
            SCORES,
            "q",
            q,
            format!("heads × dim ≤ {INDEX_SCORE_MAX_HEADS_X_DIM}"),
        ));
    }
    let (n, per_row_keys) = match *keys.shape() {
        [n, r] if r == nib => (n, false),
        [b, n, r] if b == batch && r == nib => (n, true),
        _ => {
            return Err(shape_error(
                SCORES,
                "keys",
                keys,
                format!("[n, {nib}] or [{batch}, n, {nib}] (q's batch and row)"),
            ));
        }
    };
    if n > i32::MAX as usize {
        return Err(shape_error(
            SCORES,
            "keys",
            keys,
            "fewer than 2^31 rows".into(),
        ));
    }
    if w.shape() != [batch, heads] {
        return Err(shape_error(
            SCORES,
            "w",
            w,
            format!("[{batch}, {heads}] (q's batch and heads)"),
        ));
    }
    check_visible(SCORES, visible, batch, "q's")?;
    Ok((
        device,
        ScoreShape {
            batch,
            heads,
            dim,
            n,
            per_row_keys,
        },
    ))
}

const TOPK: &str = "index_topk";

/// The published index lists `[batch, k]` (I32) of BF16 `scores`
/// `[batch, n]`: per row exactly `cpu_backend::indexer::select(row, k,
/// visible[b], offset)` — the k best entries (ties to the lower index),
/// ascending, picks ≥ visible replaced by −1 at the end, the others + offset.
/// Needs k ≤ n and n − 1 + offset < 2^31.
pub fn index_topk(scores: &Tensor, visible: &Tensor, k: usize, offset: usize) -> Result<Tensor> {
    let (device, batch, _) = validate_topk(scores, visible, k, offset)?;
    let mut out = Tensor::empty(&device, DType::I32, &[batch, k])?;
    index_topk_into(scores, visible, k, offset, &mut out)?;
    Ok(out)
}

/// [`index_topk`] into a preallocated I32 `out` `[batch, k]`.
pub fn index_topk_into(
    scores: &Tensor,
    visible: &Tensor,
    k: usize,
    offset: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (_, batch, n) = validate_topk(scores, visible, k, offset)?;
    out.expect_output(TOPK, "out", DType::I32, &[batch, k])?;
    match common_device(TOPK, &[("scores", scores), ("out", out)])? {
        Device::Cpu => {
            let rows = widened_rows(scores, visible, n)?;
            let o = out.as_mut_slice::<i32>()?;
            for (b, (row, visible)) in rows.enumerate() {
                let list = cpu_backend::indexer::select(&row, k, visible, offset);
                o[b * k..(b + 1) * k].copy_from_slice(&list);
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::indexer::index_topk(
            &dev, scores, visible, out, batch, n, k, offset,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(TOPK, &d)),
    }
}

fn validate_topk(
    scores: &Tensor,
    visible: &Tensor,
    k: usize,
    offset: usize,
) -> Result<(Device, usize, usize)> {
    scores.expect_dtype(TOPK, "scores", DType::BF16)?;
    visible.expect_dtype(TOPK, "visible", DType::I32)?;
    let device = common_device(TOPK, &[("scores", scores), ("visible", visible)])?;
    let (batch, n) = match *scores.shape() {
        [b, n] => (b, n),
        _ => return Err(shape_error(TOPK, "scores", scores, "[batch, n]".into())),
    };
    check_visible(TOPK, visible, batch, "scores'")?;
    if k > n {
        return Err(Error::Argument {
            op: TOPK,
            arg: "k",
            value: k.to_string(),
            why: "must not exceed the number of scored entries n",
        });
    }
    if n.saturating_sub(1).saturating_add(offset) > i32::MAX as usize {
        return Err(Error::Argument {
            op: TOPK,
            arg: "offset",
            value: offset.to_string(),
            why: "n - 1 + offset must fit an i32 index",
        });
    }
    Ok((device, batch, n))
}

/// Entries per candidate block in V4.1 (`v41-flash.md` §3.6).
pub const INDEX_CANDIDATE_BLOCK: usize = 8;
/// Candidate blocks kept per query in V4.1 (`v41-flash.md` §3.6).
pub const INDEX_CANDIDATE_KEEP: usize = 2048;
/// Largest candidate block the ops take (a mask CTA covers up to 2048
/// blocks and indexes them with 32-bit offsets).
pub const INDEX_MAX_CANDIDATE_BLOCK: usize = 4096;

/// Width of a candidate list: min(`keep`, ceil(`n` / `block`)), `block` ≥ 1.
pub fn index_candidate_width(n: usize, block: usize, keep: usize) -> usize {
    keep.min(n.div_ceil(block.max(1)))
}

fn check_block(op: &'static str, block: usize) -> Result<()> {
    if block == 0 || block > INDEX_MAX_CANDIDATE_BLOCK {
        return Err(Error::Argument {
            op,
            arg: "block",
            value: block.to_string(),
            why: "must be in 1..=4096 (INDEX_MAX_CANDIDATE_BLOCK)",
        });
    }
    Ok(())
}

/// `[batch, n]` of a BF16 score tensor with n < 2^31.
fn score_rows(op: &'static str, scores: &Tensor) -> Result<(usize, usize)> {
    scores.expect_dtype(op, "scores", DType::BF16)?;
    match *scores.shape() {
        [b, n] if n <= i32::MAX as usize => Ok((b, n)),
        _ => Err(shape_error(
            op,
            "scores",
            scores,
            "[batch, n] with n < 2^31".into(),
        )),
    }
}

const CANDIDATES: &str = "index_candidates";

/// The candidate blocks `[batch, W]` (I32, W = [`index_candidate_width`]) of
/// BF16 `scores` `[batch, n]` with `visible` `[batch]` (I32): blocks of
/// `block` entries scored by their largest non-NaN visible score (−∞ when
/// none), the block of the newest visible entry pinned to +∞, the best W
/// kept (ties to the lower block index), the −∞ ones dropped; per row the
/// kept block indices ascending, then −1. Block j covers entries
/// `j·block .. j·block + block`, so the row's mask is exactly
/// `cpu_backend::indexer::candidate_mask(row, visible, block, keep)`.
///
/// The one case the reference leaves open: a block whose largest visible
/// score is a zero present with both signs (`f32::max` may return either);
/// both devices here take +0 (the `total_cmp` maximum).
pub fn index_candidates(
    scores: &Tensor,
    visible: &Tensor,
    block: usize,
    keep: usize,
) -> Result<Tensor> {
    let (device, batch, n) = validate_candidates(scores, visible, block)?;
    let width = index_candidate_width(n, block, keep);
    let mut out = Tensor::empty(&device, DType::I32, &[batch, width])?;
    index_candidates_into(scores, visible, block, keep, &mut out)?;
    Ok(out)
}

/// [`index_candidates`] into a preallocated I32 `out` `[batch, W]`.
pub fn index_candidates_into(
    scores: &Tensor,
    visible: &Tensor,
    block: usize,
    keep: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (_, batch, n) = validate_candidates(scores, visible, block)?;
    let width = index_candidate_width(n, block, keep);
    out.expect_output(CANDIDATES, "out", DType::I32, &[batch, width])?;
    match common_device(CANDIDATES, &[("scores", scores), ("out", out)])? {
        Device::Cpu => {
            let rows = widened_rows(scores, visible, n)?;
            let o = out.as_mut_slice::<i32>()?;
            for (b, (row, visible)) in rows.enumerate() {
                let mask = cpu_backend::indexer::candidate_mask(&row, visible, block, keep);
                let kept = (0..n.div_ceil(block))
                    .filter(|&j| mask[j * block])
                    .map(|j| j as i32)
                    .chain(std::iter::repeat(-1));
                for (d, v) in o[b * width..(b + 1) * width].iter_mut().zip(kept) {
                    *d = v;
                }
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::indexer::index_candidates(
            &dev, scores, visible, out, batch, n, block, width,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(CANDIDATES, &d)),
    }
}

fn validate_candidates(
    scores: &Tensor,
    visible: &Tensor,
    block: usize,
) -> Result<(Device, usize, usize)> {
    check_block(CANDIDATES, block)?;
    let (batch, n) = score_rows(CANDIDATES, scores)?;
    visible.expect_dtype(CANDIDATES, "visible", DType::I32)?;
    let device = common_device(CANDIDATES, &[("scores", scores), ("visible", visible)])?;
    check_visible(CANDIDATES, visible, batch, "scores'")?;
    Ok((device, batch, n))
}

const MASK: &str = "index_mask_scores";

/// Reindex masking (`v41-flash.md` §3.7): BF16 `[batch, n]` equal to
/// `scores` (bit for bit) on the entries whose block (t / `block`) is listed
/// in the row of `candidates` `[batch, W]` (I32, any width and order;
/// entries outside `[0, ceil(n / block))`, such as −1, are ignored) and −∞
/// elsewhere: `cpu_backend::indexer::mask_scores` with the mask of
/// [`index_candidates`]' list when the list is one.
pub fn index_mask_scores(scores: &Tensor, candidates: &Tensor, block: usize) -> Result<Tensor> {
    let (device, batch, n) = validate_mask(MASK, scores, candidates, block)?;
    let mut out = Tensor::empty(&device, DType::BF16, &[batch, n])?;
    index_mask_scores_into(scores, candidates, block, &mut out)?;
    Ok(out)
}

/// [`index_mask_scores`] into a preallocated BF16 `out` `[batch, n]`.
pub fn index_mask_scores_into(
    scores: &Tensor,
    candidates: &Tensor,
    block: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (_, batch, n) = validate_mask(MASK, scores, candidates, block)?;
    out.expect_output(MASK, "out", DType::BF16, &[batch, n])?;
    let width = candidates.shape()[1];
    match common_device(MASK, &[("scores", scores), ("out", out)])? {
        Device::Cpu => {
            let (sc, cand) = (scores.as_slice::<bf16>()?, candidates.as_slice::<i32>()?);
            let o = out.as_mut_slice::<bf16>()?;
            let blocks = n.div_ceil(block);
            for b in 0..batch {
                let mut listed = vec![false; blocks];
                for &c in &cand[b * width..(b + 1) * width] {
                    if c >= 0 && (c as usize) < blocks {
                        listed[c as usize] = true;
                    }
                }
                let (src, dst) = (&sc[b * n..(b + 1) * n], &mut o[b * n..(b + 1) * n]);
                for (t, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
                    *d = if listed[t / block] {
                        s
                    } else {
                        bf16::NEG_INFINITY
                    };
                }
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::indexer::index_mask_scores(
            &dev, scores, candidates, out, batch, n, block, width,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(MASK, &d)),
    }
}

fn validate_mask(
    op: &'static str,
    scores: &Tensor,
    candidates: &Tensor,
    block: usize,
) -> Result<(Device, usize, usize)> {
    check_block(op, block)?;
    let (batch, n) = score_rows(op, scores)?;
    candidates.expect_dtype(op, "candidates", DType::I32)?;
    let device = common_device(op, &[("scores", scores), ("candidates", candidates)])?;
    match *candidates.shape() {
        [b, w] if b == batch && w <= i32::MAX as usize => {}
        _ => {
            return Err(shape_error(
                op,
                "candidates",
                candidates,
                format!("[{batch}, W] (scores' batch)"),
            ));
        }
    }
    Ok((device, batch, n))
}

const REINDEX: &str = "index_reindex_topk";

/// Reindex (`v41-flash.md` §3.7): [`index_topk`] of
/// [`index_mask_scores`]`(scores, candidates, block)`, i.e. per row exactly
/// `select(mask_scores(row, mask), k, visible[b], offset)`. The masked scores
/// go to a BF16 workspace `[batch, n]` on the inputs' device.
pub fn index_reindex_topk(
    scores: &Tensor,
    candidates: &Tensor,
    block: usize,
    visible: &Tensor,
    k: usize,
    offset: usize,
) -> Result<Tensor> {
    let (device, batch, _) = validate_mask(REINDEX, scores, candidates, block)?;
    let mut out = Tensor::empty(&device, DType::I32, &[batch, k])?;
    index_reindex_topk_into(scores, candidates, block, visible, k, offset, &mut out)?;
    Ok(out)
}

/// [`index_reindex_topk`] into a preallocated I32 `out` `[batch, k]`.
pub fn index_reindex_topk_into(
    scores: &Tensor,
    candidates: &Tensor,
    block: usize,
    visible: &Tensor,
    k: usize,
    offset: usize,
    out: &mut Tensor,
) -> Result<()> {
    validate_mask(REINDEX, scores, candidates, block)?;
    validate_topk(scores, visible, k, offset)?;
    let masked = index_mask_scores(scores, candidates, block)?;
    index_topk_into(&masked, visible, k, offset, out)
}
