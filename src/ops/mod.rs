//! The safe op API. Each op validates dtypes, shapes, arguments and devices,
//! returning a typed [`crate::Error`] that names the offending tensor, then
//! runs the CPU reference or the CUDA kernel for the device the inputs live on.
//! Outputs are allocated by the op on that same device.

mod act_quant;
mod gemm;
mod indexer;
mod mhc;
mod moe_route;
mod rms_norm;
mod rms_norm_act_quant;
mod rope;
mod sparse_mqa;
mod swiglu;

pub use act_quant::{
    ACT_QUANT_BLOCK, ActQuantImpl, act_quant_fp8, act_quant_fp8_into, act_quant_fp8_with,
};
pub use gemm::{
    GEMM_BLOCK, GemmImpl, SKINNY_MAX_M, bf16_linear, bf16_linear_into, mxfp4_grouped_contiguous,
    mxfp4_grouped_contiguous_into, mxfp4_grouped_masked, mxfp4_grouped_masked_into, mxfp8_linear,
    mxfp8_linear_into,
};
#[cfg_attr(not(deepinfer_cuda), allow(unused_imports))]
pub(crate) use indexer::ScoreShape;
pub use indexer::{
    INDEX_CANDIDATE_BLOCK, INDEX_CANDIDATE_KEEP, INDEX_KEY_GROUP, INDEX_MAX_CANDIDATE_BLOCK,
    INDEX_SCORE_MAX_HEADS_X_DIM, ScoreKernel, index_candidate_width, index_candidates,
    index_candidates_into, index_key_quant, index_key_quant_into, index_key_row_nibbles,
    index_mask_scores, index_mask_scores_into, index_reindex_topk, index_reindex_topk_into,
    index_scores, index_scores_into, index_scores_into_with, index_topk, index_topk_into,
};
pub use mhc::{MhcParams, MhcPre, mhc_expand, mhc_expand_into, mhc_pre, mhc_pre_into};
pub use moe_route::{
    MOE_ROUTE_MAX_EXPERTS, MOE_ROUTE_MAX_TOP_K, moe_layout, moe_layout_into, moe_route,
    moe_route_into,
};
pub use rms_norm::{rms_norm, rms_norm_into};
pub use rms_norm_act_quant::{
    RMS_NORM_ACT_QUANT_MAX_DIM, rms_norm_act_quant_fp8, rms_norm_act_quant_fp8_into,
};
pub use rope::{inverse_rope, inverse_rope_into, rope, rope_into};
#[cfg_attr(not(deepinfer_cuda), allow(unused_imports))]
pub(crate) use sparse_mqa::SparseMqaShape;
pub use sparse_mqa::{
    SPARSE_MQA_CUDA_DIM, SPARSE_MQA_CUDA_HEAD_GROUP, SparseMqaKernel, sparse_mqa, sparse_mqa_into,
    sparse_mqa_into_with,
};
pub use swiglu::{swiglu_act_quant_fp8, swiglu_act_quant_fp8_into};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The device shared by every named tensor of `op`, or a mismatch error.
fn common_device(op: &'static str, tensors: &[(&'static str, &Tensor)]) -> Result<Device> {
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
fn shape_error(op: &'static str, name: &'static str, t: &Tensor, expected: String) -> Error {
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

#[cfg(not(deepinfer_cuda))]
fn kernels_not_built(op: &'static str, device: &Device) -> Error {
    Error::DeviceUnavailable {
        device: device.to_string(),
        why: format!(
            "{op} has no CUDA kernels in this build; rebuild with DEEPINFER_ACCELERATOR=nvidia"
        ),
    }
}
