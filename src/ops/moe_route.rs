//! MoE routing (`v41-flash.md` §7.1, §7.3): from the fp32 gate logits
//! `[.., E]` (already divided by `gate_temp`) and the selection bias `[E]`,
//! the `top_k` selected expert ids (int32, ascending) and their routing
//! weights (fp32, same order) of every token: scores s = √softplus(z), the
//! top k by s + bias (ties to the lower id), weights
//! s / (Σ selected s in rank order + 1e-20) · route_scale.
//!
//! Numerics: bit-exact on every backend: [`moe::route`] per token (softplus
//! evaluated in f64 and rounded once, IEEE sqrt and division, the selection
//! ordered by `f32::total_cmp`). The CUDA kernel is the TileLang program
//! `tilelang/moe_route.py`. NaN logits are outside the bitwise contract: the
//! GPU canonicalises every NaN to the positive one, the CPU keeps its sign,
//! and `total_cmp` orders the two differently.
//!
//!
//! [`moe_layout`] then lays the routed entries out for the grouped expert
//! GEMMs: per-expert counts, exclusive offsets and the permutation grouped
//! by expert ([`moe_layout::moe_layout`], TileLang `tilelang/moe_layout.py`).
//!
//! [`moe::route`]: crate::cpu_backend::moe::route
//! [`moe_layout::moe_layout`]: crate::cpu_backend::moe_layout::moe_layout

use super::{common_device, rows_and_last};
use crate::cpu_backend::{moe, moe_layout as layout};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const OP: &str = "moe_route";
const LAYOUT_OP: &str = "moe_layout";

/// Most experts a routing kernel handles (V4.1 has 384, DSpark 128).
pub const MOE_ROUTE_MAX_EXPERTS: usize = 1024;
/// Largest `top_k` (V4.1 selects 6, DSpark 3).
pub const MOE_ROUTE_MAX_TOP_K: usize = 16;

/// Routes every token of `logits` (F32, any leading shape, last dimension E
/// with 1 ≤ E ≤ 1024) with `bias` (F32 `[E]`), selecting `top_k` experts
/// (1 ≤ top_k ≤ min(E, 16)) and scaling the weights by `route_scale`
/// (finite). Returns new tensors on the logits' device: `ids` I32 and
/// `weights` F32, both of logits' shape with the last dimension `top_k`, ids
/// ascending within each token.
pub fn moe_route(
    logits: &Tensor,
    bias: &Tensor,
    top_k: usize,
    route_scale: f32,
) -> Result<(Tensor, Tensor)> {
    let (device, out_shape) = validate(logits, bias, top_k, route_scale)?;
    let mut ids = Tensor::empty(&device, DType::I32, &out_shape)?;
    let mut weights = Tensor::empty(&device, DType::F32, &out_shape)?;
    moe_route_into(logits, bias, top_k, route_scale, &mut ids, &mut weights)?;
    Ok((ids, weights))
}

/// [`moe_route`] into preallocated outputs on the logits' device: `ids` I32
/// and `weights` F32 of logits' shape with the last dimension `top_k`.
pub fn moe_route_into(
    logits: &Tensor,
    bias: &Tensor,
    top_k: usize,
    route_scale: f32,
    ids: &mut Tensor,
    weights: &mut Tensor,
) -> Result<()> {
    let (_, out_shape) = validate(logits, bias, top_k, route_scale)?;
    ids.expect_output(OP, "ids", DType::I32, &out_shape)?;
    weights.expect_output(OP, "weights", DType::F32, &out_shape)?;
    let (tokens, experts) = rows_and_last(OP, "logits", logits)?;
    let device = common_device(
        OP,
        &[
            ("logits", logits),
            ("bias", bias),
            ("ids", ids),
            ("weights", weights),
        ],
    )?;
    match device {
        Device::Cpu => {
            let z = logits.as_slice::<f32>()?;
            let b = bias.as_slice::<f32>()?;
            let mut id_out = Vec::with_capacity(tokens * top_k);
            let mut w_out = Vec::with_capacity(tokens * top_k);
            for row in z.chunks_exact(experts) {
                let r = moe::route(row, b, top_k, route_scale);
                id_out.extend(r.experts.iter().map(|&e| super::i32_sat(e)));
                w_out.extend_from_slice(&r.weights);
            }
            ids.as_mut_slice::<i32>()?.copy_from_slice(&id_out);
            weights.as_mut_slice::<f32>()?.copy_from_slice(&w_out);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::moe_route(
            &dev,
            logits,
            bias,
            route_scale,
            ids,
            weights,
            tokens,
            experts,
            top_k,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// Checks dtypes, shapes and arguments; returns the logits' device and the
/// output shape.
fn validate(
    logits: &Tensor,
    bias: &Tensor,
    top_k: usize,
    route_scale: f32,
) -> Result<(Device, Vec<usize>)> {
    logits.expect_dtype(OP, "logits", DType::F32)?;
    bias.expect_dtype(OP, "bias", DType::F32)?;
    let (_, experts) = rows_and_last(OP, "logits", logits)?;
    if experts > MOE_ROUTE_MAX_EXPERTS {
        return Err(Error::Shape {
            op: OP,
            tensor: "logits",
            got: logits.shape().to_vec(),
            expected: format!("a last dimension (experts) of at most {MOE_ROUTE_MAX_EXPERTS}"),
        });
    }
    if bias.shape() != [experts] {
        return Err(Error::Shape {
            op: OP,
            tensor: "bias",
            got: bias.shape().to_vec(),
            expected: format!("[{experts}] (one bias per expert)"),
        });
    }
    if top_k == 0 || top_k > experts.min(MOE_ROUTE_MAX_TOP_K) {
        return Err(Error::Argument {
            op: OP,
            arg: "top_k",
            value: top_k.to_string(),
            why: "must be at least 1 and at most min(experts, 16)",
        });
    }
    if !route_scale.is_finite() {
        return Err(Error::Argument {
            op: OP,
            arg: "route_scale",
            value: route_scale.to_string(),
            why: "must be finite",
        });
    }
    let out_shape = super::with_last(logits.shape(), top_k);
    Ok((
        common_device(OP, &[("logits", logits), ("bias", bias)])?,
        out_shape,
    ))
}

/// The grouped-GEMM layout of routed expert ids (`ids` I32, any shape, N
/// elements = tokens · top_k entries in row-major order, every id in
/// `0..n_experts`; the `ids` of [`moe_route`]): returns new tensors on ids'
/// device: `counts` I32 `[n_experts]` (entries per expert), `offsets` I32
/// `[n_experts + 1]` (exclusive prefix sums, the last = N) and `permutation`
/// I32 `[N]` (entry indices token · top_k + slot grouped by ascending expert
/// id, ascending within an expert). The CPU checks the ids' range (typed
/// error); the GPU cannot: an id out of range there is counted nowhere and
/// leaves permutation elements unwritten.
pub fn moe_layout(ids: &Tensor, n_experts: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let device = validate_layout(ids, n_experts)?;
    let mut counts = Tensor::empty(&device, DType::I32, &[n_experts])?;
    let mut offsets = Tensor::empty(&device, DType::I32, &[n_experts + 1])?;
    let mut perm = Tensor::empty(&device, DType::I32, &[ids.numel()])?;
    moe_layout_into(ids, n_experts, &mut counts, &mut offsets, &mut perm)?;
    Ok((counts, offsets, perm))
}

/// [`moe_layout`] into preallocated I32 outputs on ids' device: `counts`
/// `[n_experts]`, `offsets` `[n_experts + 1]`, `permutation` `[N]`.
pub fn moe_layout_into(
    ids: &Tensor,
    n_experts: usize,
    counts: &mut Tensor,
    offsets: &mut Tensor,
    permutation: &mut Tensor,
) -> Result<()> {
    validate_layout(ids, n_experts)?;
    let entries = ids.numel();
    counts.expect_output(LAYOUT_OP, "counts", DType::I32, &[n_experts])?;
    offsets.expect_output(LAYOUT_OP, "offsets", DType::I32, &[n_experts + 1])?;
    permutation.expect_output(LAYOUT_OP, "permutation", DType::I32, &[entries])?;
    let device = common_device(
        LAYOUT_OP,
        &[
            ("ids", ids),
            ("counts", counts),
            ("offsets", offsets),
            ("permutation", permutation),
        ],
    )?;
    match device {
        Device::Cpu => {
            let v = ids.as_slice::<i32>()?;
            if let Some(&bad) = v
                .iter()
                .find(|&&e| !usize::try_from(e).is_ok_and(|e| e < n_experts))
            {
                return Err(Error::Argument {
                    op: LAYOUT_OP,
                    arg: "ids",
                    value: bad.to_string(),
                    why: "every expert id must lie in 0..n_experts",
                });
            }
            let l = layout::moe_layout(v, n_experts);
            counts.as_mut_slice::<i32>()?.copy_from_slice(&l.counts);
            offsets.as_mut_slice::<i32>()?.copy_from_slice(&l.offsets);
            permutation
                .as_mut_slice::<i32>()?
                .copy_from_slice(&l.permutation);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::moe_layout(
            &dev,
            ids,
            counts,
            offsets,
            permutation,
            entries,
            n_experts,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(LAYOUT_OP, &d)),
    }
}

/// Checks ids' dtype, the entry count and `n_experts`; returns ids' device.
fn validate_layout(ids: &Tensor, n_experts: usize) -> Result<Device> {
    ids.expect_dtype(LAYOUT_OP, "ids", DType::I32)?;
    if n_experts == 0 || n_experts > crate::contract::MOE_MAX_EXPERTS {
        return Err(Error::Argument {
            op: LAYOUT_OP,
            arg: "n_experts",
            value: n_experts.to_string(),
            why: "must be at least 1 and at most MOE_MAX_EXPERTS (16384)",
        });
    }
    if i32::try_from(ids.numel() + 512).is_err() {
        return Err(Error::Shape {
            op: LAYOUT_OP,
            tensor: "ids",
            got: ids.shape().to_vec(),
            expected: "fewer than 2^31 - 512 entries (the layout is int32)".into(),
        });
    }
    Ok(ids.device())
}
