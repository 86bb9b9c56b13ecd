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

mod candidates;
mod keys;
mod scores;
mod topk;

pub use crate::contract::{ScoreKernel, ScoreShape};
pub use candidates::{
    INDEX_CANDIDATE_BLOCK, INDEX_CANDIDATE_KEEP, INDEX_MAX_CANDIDATE_BLOCK, index_candidate_width,
    index_candidates, index_candidates_into, index_mask_scores, index_mask_scores_into,
    index_reindex_topk, index_reindex_topk_into,
};
pub use keys::{index_key_quant, index_key_quant_into};
pub use scores::{
    index_scores, index_scores_into, index_scores_into_with, index_scores_paged,
    index_scores_paged_with,
};
pub use topk::{index_topk, index_topk_into};

use crate::dtype::DType;
use crate::error::Result;
use crate::ops::shape_error;
use crate::tensor::Tensor;
use half::bf16;

/// Largest `heads × dim` of a score query (its decoded fp32 copy lives in
/// 48 KiB of shared memory together with the head weights).
pub const INDEX_SCORE_MAX_HEADS_X_DIM: usize = 11_776;

/// Nibbles (the `F4E2M1x2` last dimension) of an index-key row of `dim` values.
pub fn index_key_row_nibbles(dim: usize) -> usize {
    dim + dim / 16
}

/// `dim` of an index-key row tensor's last dimension, if it is one.
pub(super) fn dim_of_row(nibbles: usize) -> Option<usize> {
    (nibbles > 0 && nibbles.is_multiple_of(34)).then_some(nibbles / 17 * 16)
}

/// `visible` is `[batch]`, one count per row of `source` (named in the error).
pub(super) fn check_visible(
    op: &'static str,
    visible: &Tensor,
    batch: usize,
    source: &str,
) -> Result<()> {
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
pub(super) fn widen(v: bf16) -> f32 {
    f32::from_bits(u32::from(v.to_bits()) << 16)
}

/// Per batch row of the host BF16 `scores` `[batch, n]` and I32 `visible`
/// `[batch]`: the row widened to f32 ([`widen`]) and its visible count
/// clamped to `[0, n]`.
pub(super) fn widened_rows<'a>(
    scores: &'a Tensor,
    visible: &'a Tensor,
    n: usize,
) -> Result<impl Iterator<Item = (Vec<f32>, usize)> + 'a> {
    let (sc, vis) = (scores.as_slice::<bf16>()?, visible.as_slice::<i32>()?);
    Ok(vis.iter().enumerate().map(move |(b, &v)| {
        let row = sc[b * n..(b + 1) * n].iter().map(|x| widen(*x)).collect();
        (row, usize::try_from(v).map_or(0, |v| v.min(n)))
    }))
}

/// `[batch, n]` of a BF16 score tensor with n < 2^31.
pub(super) fn score_rows(op: &'static str, scores: &Tensor) -> Result<(usize, usize)> {
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
