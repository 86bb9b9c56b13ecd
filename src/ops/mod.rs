//! The safe op API. Each op validates dtypes, shapes, arguments and devices,
//! returning a typed [`crate::Error`] that names the offending tensor, then
//! runs the CPU reference or the CUDA kernel for the device the inputs live on.
//! Outputs are allocated by the op on that same device.

mod act_quant;
mod compressor;
mod elementwise;
mod embedding;
mod engram;
mod gemm;
mod grouped_linear;
mod hc_streams;
mod indexer;
mod kv_cache;
mod mhc;
mod moe;
mod moe_route;
mod rms_norm;
mod rms_norm_act_quant;
mod rope;
mod sparse_mqa;
mod swiglu;

pub use crate::contract::{FP4_KV_GROUP, KvRowFormat, MX_BLOCK};
pub use act_quant::{ActQuantImpl, act_quant_fp8, act_quant_fp8_into, act_quant_fp8_with};
pub use compressor::{compress_ratio2, compressor_rows_into};
pub use elementwise::{add, cat_cols, div_scalar, scale};
pub use embedding::{argmax, embedding};
pub use engram::{engram_gate_update, engram_lookup, engram_rows};
pub use gemm::{
    GemmImpl, SKINNY_MAX_M, bf16_linear, bf16_linear_into, mxfp4_grouped_contiguous,
    mxfp4_grouped_contiguous_into, mxfp4_grouped_masked, mxfp4_grouped_masked_into, mxfp8_linear,
    mxfp8_linear_into,
};
pub use grouped_linear::grouped_bf16_linear;
pub use hc_streams::{hc_collapse, hc_init, hc_stream_mean};
pub use indexer::{
    INDEX_CANDIDATE_BLOCK, INDEX_CANDIDATE_KEEP, INDEX_MAX_CANDIDATE_BLOCK,
    INDEX_SCORE_MAX_HEADS_X_DIM, ScoreKernel, index_candidate_width, index_candidates,
    index_candidates_into, index_key_quant, index_key_quant_into, index_key_row_nibbles,
    index_mask_scores, index_mask_scores_into, index_reindex_topk, index_reindex_topk_into,
    index_scores, index_scores_into, index_scores_into_with, index_topk, index_topk_into,
};
pub use kv_cache::{
    RowNorm, RowRope, RowsOut, compressed_rows, kv_row_layout, kv_rows, kv_rows_into, window_rows,
};
pub use mhc::{MhcParams, MhcPre, mhc_expand, mhc_expand_into, mhc_pre, mhc_pre_into};
pub use moe::{moe_combine, moe_permute};
pub use moe_route::{
    MOE_ROUTE_MAX_EXPERTS, MOE_ROUTE_MAX_TOP_K, moe_layout, moe_layout_into, moe_route,
    moe_route_into,
};
pub use rms_norm::{rms_norm, rms_norm_into};
pub use rms_norm_act_quant::{
    RMS_NORM_ACT_QUANT_MAX_DIM, rms_norm_act_quant_fp8, rms_norm_act_quant_fp8_into,
};
pub use rope::{inverse_rope, inverse_rope_into, rope, rope_into};
pub use sparse_mqa::{
    SPARSE_MQA_CUDA_DIM, SPARSE_MQA_CUDA_HEAD_GROUP, SparseMqaKernel, sparse_mqa, sparse_mqa_into,
    sparse_mqa_into_with,
};
pub use swiglu::{swiglu_act_quant_fp8, swiglu_act_quant_fp8_into};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The device shared by every named tensor of `op`, or a mismatch error.
pub(crate) fn common_device(
    op: &'static str,
    tensors: &[(&'static str, &Tensor)],
) -> Result<Device> {
    let device = tensors[0].1.device();
    for (name, t) in &tensors[1..] {
        let d = t.device();
        if !d.same_as(&device) {
            return Err(Error::DeviceMismatch {
                op,
                tensor: name,
                got: d.to_string(),
                expected: device.to_string(),
            });
        }
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

/// Ops with only the CPU reference so far: any other device gets
/// [`Error::Unsupported`] naming the op.
fn cpu_only(op: &'static str, device: &Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        d => Err(Error::Unsupported {
            op,
            device: d.to_string(),
            why: "only the CPU reference exists; its CUDA kernel has not landed",
        }),
    }
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
