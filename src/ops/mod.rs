//! The safe op API. Each op validates dtypes, shapes, arguments and devices,
//! returning a typed [`crate::Error`] that names the offending tensor, then
//! runs the CPU reference or the CUDA kernel for the device the inputs live on.
//! Outputs are allocated by the op on that same device.
//!
//! Indexing invariant: an op's CPU path indexes host slices only with the
//! dims it validated at its entry (every tensor's length equals its shape's
//! product, `Tensor`'s own invariant), and every index read from a tensor
//! (ids, offsets, permutations, slots, candidate lists) is range-checked
//! before use, which the error tests cover. So the crate's
//! `indexing_slicing` lint is lifted here; `unwrap`, `expect` and narrowing
//! casts stay denied.
#![allow(clippy::indexing_slicing)]

mod act_quant;
mod checks;
mod compressor;
mod dequant;
mod elementwise;
mod embedding;
mod engram;
mod gather;
mod gemm;
mod grouped_linear;
mod hc_streams;
mod indexer;
mod kv_cache;
mod mhc;
mod moe;
mod moe_masked;
mod moe_route;
mod mx_scales;
mod paged;
mod random;
mod rms_norm;
mod rms_norm_act_quant;
mod rope;
mod sparse_mqa;
mod swiglu;

pub use crate::contract::{FP4_KV_GROUP, KvRowFormat, MX_BLOCK};
pub use act_quant::{ActQuantImpl, act_quant_fp8, act_quant_fp8_into, act_quant_fp8_with};
pub use checks::{DeviceChecks, Failure};
pub use compressor::{compress_ratio2, compressor_rows_into};
pub use dequant::mxfp8_dequantize;
pub use elementwise::{add, cat_cols, div_scalar, scale};
pub use embedding::{argmax, embedding, embedding_deferred, first_non_finite};
pub use engram::{engram_gate_update, engram_lookup, engram_lookup_deferred, engram_rows};
pub use gather::{copy_rows_into, copy_rows_where, gather_blocks, gather_row_blocks, gather_rows};
pub use gemm::{
    GemmImpl, SKINNY_MAX_M, bf16_linear, bf16_linear_into, mxfp4_grouped_contiguous,
    mxfp4_grouped_contiguous_into, mxfp4_grouped_masked, mxfp4_grouped_masked_into, mxfp8_linear,
    mxfp8_linear_into,
};
pub use grouped_linear::{grouped_bf16_linear, grouped_bf16_linear_into};
pub use hc_streams::{hc_collapse, hc_init, hc_stream_mean};
pub use indexer::{
    INDEX_CANDIDATE_BLOCK, INDEX_CANDIDATE_KEEP, INDEX_MAX_CANDIDATE_BLOCK,
    INDEX_SCORE_MAX_HEADS_X_DIM, ScoreKernel, index_candidate_width, index_candidates,
    index_candidates_into, index_key_quant, index_key_quant_into, index_key_row_nibbles,
    index_mask_scores, index_mask_scores_into, index_reindex_topk, index_reindex_topk_into,
    index_scores, index_scores_into, index_scores_into_with, index_scores_paged,
    index_scores_paged_with, index_topk, index_topk_into,
};
pub use kv_cache::{
    RowNorm, RowRope, RowsOut, compressed_rows, kv_row_layout, kv_rows, kv_rows_into, window_rows,
};
pub use mhc::{
    MhcParams, MhcPre, MhcWeights, mhc_expand, mhc_expand_into, mhc_expand_pre,
    mhc_expand_pre_into, mhc_pre, mhc_pre_into,
};
pub(crate) use moe::bad_expert_id;
pub use moe::{
    check_ids, check_ids_deferred, moe_combine, moe_combine_deferred, moe_permute,
    moe_permute_deferred, moe_permute_fp8, moe_permute_fp8_deferred,
};
pub use moe_masked::{moe_masked_combine_into, moe_masked_layout_into, moe_masked_scatter_into};
pub use moe_route::{
    MOE_ROUTE_MAX_EXPERTS, MOE_ROUTE_MAX_TOP_K, moe_layout, moe_layout_into, moe_route,
    moe_route_into,
};
pub use mx_scales::{MX_SHARE_MAX_GROUP, act_quant_fp8_shared, mx_share_scales};
pub use paged::{BlockTables, paged_rows, paged_window_rows};
pub use random::random_param;
pub use rms_norm::{rms_norm, rms_norm_into};
pub use rms_norm_act_quant::{
    RMS_NORM_ACT_QUANT_MAX_DIM, rms_norm_act_quant_fp8, rms_norm_act_quant_fp8_into,
};
pub use rope::{inverse_rope, inverse_rope_into, rope, rope_into};
pub use sparse_mqa::{
    SPARSE_MQA_CUDA_DIM, SPARSE_MQA_CUDA_HEAD_GROUP, SPARSE_MQA_GENERIC_MAX_DIM,
    SPARSE_MQA_SPLIT_UNIT, SparseMqaKernel, SparseMqaSplit, sparse_mqa, sparse_mqa_into,
    sparse_mqa_into_split, sparse_mqa_into_with,
};
pub use swiglu::{swiglu_act_quant_fp8, swiglu_act_quant_fp8_into};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How many times the GEMMs' per-stream split-K scratch has been replaced
/// by a larger buffer (the old one freed) in this process: a CUDA graph
/// that captured a GEMM launch holds the scratch's address at its capture,
/// so it may be replayed only while this is unchanged (`model::graph`).
/// Always 0 without the CUDA kernels.
pub fn gemm_scratch_generation() -> u64 {
    #[cfg(deepinfer_cuda)]
    {
        crate::cuda_backend::scratch::generation()
    }
    #[cfg(not(deepinfer_cuda))]
    {
        0
    }
}

/// The device shared by every named tensor of `op`, or a mismatch error.
/// The handle returned is batch-invariant when any input's is
/// ([`Device::batch_invariant`]), so the mode reaches the op, and the
/// outputs it allocates, from whichever operand carries it.
pub(crate) fn common_device(
    op: &'static str,
    tensors: &[(&'static str, &Tensor)],
) -> Result<Device> {
    let Some(((_, first), rest)) = tensors.split_first() else {
        return Err(Error::Argument {
            op,
            arg: "tensors",
            value: "[]".into(),
            why: "an op names at least one tensor",
        });
    };
    let device = first.device();
    for (name, t) in rest {
        let d = t.device();
        if !d.same_as(&device) {
            let (got, expected) = Device::mismatch_names(&d, &device);
            return Err(Error::DeviceMismatch {
                op,
                tensor: name,
                got,
                expected,
            });
        }
    }
    if !device.batch_invariant() && rest.iter().any(|(_, t)| t.device().batch_invariant()) {
        return Ok(device.with_batch_invariant_kernels());
    }
    Ok(device)
}

/// The shape error of tensor `name` of `op`: its actual shape and what was
/// expected.
pub(crate) fn shape_error(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    expected: String,
) -> Error {
    Error::Shape {
        op,
        tensor: name,
        got: t.shape().to_vec(),
        expected,
    }
}

/// Splits a shape into (rows, last dim), rejecting rank 0 and an empty last dim.
fn rows_and_last(op: &'static str, name: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match t.shape().split_last() {
        Some((&last, lead)) if last > 0 => Ok((lead.iter().product(), last)),
        _ => Err(shape_error(
            op,
            name,
            t,
            "rank >= 1 with a non-empty last dimension".into(),
        )),
    }
}

/// `shape` with its last dimension replaced by `last` (a rank-0 shape,
/// which every op rejects first, becomes `[last]`).
pub(crate) fn with_last(shape: &[usize], last: usize) -> Vec<usize> {
    let lead = shape.split_last().map_or(&[][..], |(_, lead)| lead);
    lead.iter().copied().chain([last]).collect()
}

/// The first `N` values of `values` as an array: a short slice (a shape
/// the op failed to check) is an error naming tensor `name`.
pub(crate) fn array<T: Copy, const N: usize>(
    op: &'static str,
    name: &'static str,
    values: &[T],
) -> Result<[T; N]> {
    values
        .get(..N)
        .and_then(|v| <[T; N]>::try_from(v).ok())
        .ok_or_else(|| Error::Argument {
            op,
            arg: name,
            value: format!("{} values", values.len()),
            why: "fewer values than the op reads",
        })
}

/// `v` as an int32 index or count of a CPU path. The op bounded it below
/// 2^31 first (`check_i32` or its own limit); a value past i32 would be a
/// missing check, and saturates to `i32::MAX`, an index every consumer
/// rejects as out of range, rather than wrapping to a valid one.
pub(crate) fn i32_sat(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// Kernels index rows with 32-bit ints: a last dimension must fit.
fn check_i32(op: &'static str, name: &'static str, t: &Tensor, last: usize) -> Result<()> {
    if i32::try_from(last).is_err() {
        return Err(shape_error(
            op,
            name,
            t,
            "a last dimension below 2^31".into(),
        ));
    }
    Ok(())
}

#[cfg(not(deepinfer_cuda))]
pub(crate) fn kernels_not_built(op: &'static str, device: &Device) -> Error {
    Error::DeviceUnavailable {
        device: device.to_string(),
        why: format!(
            "{op} has no CUDA kernels in this build; rebuild with DEEPINFER_ACCELERATOR=nvidia"
        ),
    }
}
