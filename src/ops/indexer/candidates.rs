//! The candidate-block pre-filter (`index_candidates`), the reindex mask
//! (`index_mask_scores`) and their composition (`index_reindex_topk`).

use super::topk::validate_topk;
use super::*;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;
use half::bf16;

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

pub(super) fn check_block(op: &'static str, block: usize) -> Result<()> {
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

pub(super) const CANDIDATES: &str = "index_candidates";

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
                    .map(crate::ops::i32_sat)
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
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(CANDIDATES, &d)),
    }
}

pub(super) fn validate_candidates(
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

pub(super) const MASK: &str = "index_mask_scores";

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
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(MASK, &d)),
    }
}

pub(super) fn validate_mask(
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

pub(super) const REINDEX: &str = "index_reindex_topk";

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
    // k is checked (k ≤ n) before the [batch, k] output is allocated.
    validate_topk(scores, visible, k, offset)?;
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
