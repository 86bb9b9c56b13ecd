//! The clamped SwiGLU times the routing weight, fused with the FP8 1×32
//! activation quantiser (`v41-flash.md` §7.2 then §10.1): the W2 input of a
//! routed or shared expert. Its input is the output of the gate-up
//! projection, whose W1 and W3 rows are interleaved in blocks of 32
//! (`model::load` builds it so, one GEMM for both): `gu` `[.., 2·inter]`
//! holds g's 32-column block b at columns 64b .. 64b + 31 and u's at
//! 64b + 32 .. 64b + 63. With the fp32 routing weight of each row and the
//! limit L it produces the e4m3 values `q` `[.., inter]` and E8M0 scales
//! `[.., inter/32]` of `h = BF16(SiLU(min(g, L)) · clamp(u, −L, L) · weight)`,
//! reading `gu` once on the GPU; `h` itself is never stored.
//!
//! Numerics: bit-exact on every backend: [`moe::swiglu`] per row (e^x is
//! the correctly rounded fp32 value, evaluated in f64), then
//! [`act_quant_fp8`](super::act_quant_fp8) of the BF16 result. The CUDA
//! kernel is the TileLang program `tilelang/swiglu_act_quant_fp8.py`.
//!
//! [`moe::swiglu`]: crate::cpu_backend::moe::swiglu

use super::{MX_BLOCK, check_i32, common_device, rows_and_last};
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "swiglu_act_quant_fp8";

/// SwiGLU of the interleaved gate-up output `gu` (BF16, any leading shape,
/// last dimension 2·inter with inter a multiple of 32) clamped at `limit`
/// (finite, > 0; 10 in V4.1), times `weight` (F32 `[rows]`, rows = the
/// product of the leading dimensions; 1.0 for the shared expert), rounded to
/// BF16 and FP8 1×32 quantised. Returns new tensors on gu's device: `q`
/// e4m3 of gu's shape with the last dimension inter, and `scale` E8M0 with
/// the last dimension inter/32.
pub fn swiglu_act_quant_fp8(gu: &Tensor, weight: &Tensor, limit: f32) -> Result<(Tensor, Tensor)> {
    let (device, q_shape, scale_shape) = validate(gu, weight, limit)?;
    let mut q = Tensor::empty(&device, DType::F8E4M3, &q_shape)?;
    let mut s = Tensor::empty(&device, DType::E8M0, &scale_shape)?;
    swiglu_act_quant_fp8_into(gu, weight, limit, &mut q, &mut s)?;
    Ok((q, s))
}

/// [`swiglu_act_quant_fp8`] into preallocated outputs on gu's device: `q`
/// e4m3 of gu's shape with the last dimension inter, `scale` E8M0 with the
/// last dimension inter/32.
pub fn swiglu_act_quant_fp8_into(
    gu: &Tensor,
    weight: &Tensor,
    limit: f32,
    q: &mut Tensor,
    scale: &mut Tensor,
) -> Result<()> {
    let (_, q_shape, scale_shape) = validate(gu, weight, limit)?;
    q.expect_output(OP, "q", DType::F8E4M3, &q_shape)?;
    scale.expect_output(OP, "scale", DType::E8M0, &scale_shape)?;
    let (rows, inter) = (weight.numel(), q_shape.last().copied().unwrap_or(0));
    let device = common_device(
        OP,
        &[("gu", gu), ("weight", weight), ("q", q), ("scale", scale)],
    )?;
    match device {
        Device::Cpu => {
            let (g, u) = split_gate_up(gu.as_slice::<bf16>()?);
            let (qv, sv) = cpu_backend::swiglu_act_quant_fp8(
                &g,
                &u,
                weight.as_slice::<f32>()?,
                rows,
                inter,
                limit,
            );
            q.as_mut_slice::<E4M3>()?.copy_from_slice(&qv);
            scale.as_mut_slice::<E8M0>()?.copy_from_slice(&sv);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::swiglu_act_quant_fp8(
            &dev, gu, weight, limit, q, scale, rows, inter,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// The interleaved `[rows, 2·inter]` values (validated: whole 64-column
/// pairs of blocks) as separate g and u `[rows, inter]`.
fn split_gate_up(gu: &[bf16]) -> (Vec<bf16>, Vec<bf16>) {
    let mut g = Vec::with_capacity(gu.len() / 2);
    let mut u = Vec::with_capacity(gu.len() / 2);
    for pair in gu.chunks(2 * MX_BLOCK) {
        let (a, b) = pair.split_at(MX_BLOCK.min(pair.len()));
        g.extend_from_slice(a);
        u.extend_from_slice(b);
    }
    (g, u)
}

/// Checks dtypes, shapes and the limit; returns gu's device and the shapes
/// of `q` (gu's with the last dimension inter) and `scale` (inter/32).
fn validate(gu: &Tensor, weight: &Tensor, limit: f32) -> Result<(Device, Vec<usize>, Vec<usize>)> {
    gu.expect_dtype(OP, "gu", DType::BF16)?;
    weight.expect_dtype(OP, "weight", DType::F32)?;
    let (rows, width) = rows_and_last(OP, "gu", gu)?;
    check_i32(OP, "gu", gu, width)?;
    if !width.is_multiple_of(2 * MX_BLOCK) {
        return Err(Error::Shape {
            op: OP,
            tensor: "gu",
            got: gu.shape().to_vec(),
            expected: format!(
                "a last dimension 2 x inter with inter a multiple of {MX_BLOCK} (g and u blocks alternating)"
            ),
        });
    }
    if weight.shape() != [rows] {
        return Err(Error::Shape {
            op: OP,
            tensor: "weight",
            got: weight.shape().to_vec(),
            expected: format!("[{rows}] (one routing weight per row of gu)"),
        });
    }
    if !(limit.is_finite() && limit > 0.0) {
        return Err(Error::Argument {
            op: OP,
            arg: "limit",
            value: limit.to_string(),
            why: "must be finite and positive",
        });
    }
    Ok((
        common_device(OP, &[("gu", gu), ("weight", weight)])?,
        super::with_last(gu.shape(), width / 2),
        super::with_last(gu.shape(), width / 2 / MX_BLOCK),
    ))
}
