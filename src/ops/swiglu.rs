//! The clamped SwiGLU times the routing weight, fused with the FP8 1×32
//! activation quantiser (`v41-flash.md` §7.2 then §10.1): the W2 input of a
//! routed or shared expert. From the BF16 W1 and W3 outputs `g`, `u`
//! `[.., inter]`, the fp32 routing weight of each row and the limit L it
//! produces the e4m3 values `q` `[.., inter]` and E8M0 scales
//! `[.., inter/32]` of `h = BF16(SiLU(min(g, L)) · clamp(u, −L, L) · weight)`,
//! reading `g` and `u` once on the GPU; `h` itself is never stored.
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

/// SwiGLU of `g` and `u` (BF16, same shape, any leading shape, last
/// dimension `inter` a multiple of 32) clamped at `limit` (finite, > 0; 10 in
/// V4.1), times `weight` (F32 `[rows]`, rows = the product of the leading
/// dimensions; 1.0 for the shared expert), rounded to BF16 and FP8 1×32
/// quantised. Returns new tensors on g's device: `q` e4m3 of g's shape and
/// `scale` E8M0 of g's shape with the last dimension inter/32.
pub fn swiglu_act_quant_fp8(
    g: &Tensor,
    u: &Tensor,
    weight: &Tensor,
    limit: f32,
) -> Result<(Tensor, Tensor)> {
    let (device, scale_shape) = validate(g, u, weight, limit)?;
    let mut q = Tensor::empty(&device, DType::F8E4M3, g.shape())?;
    let mut s = Tensor::empty(&device, DType::E8M0, &scale_shape)?;
    swiglu_act_quant_fp8_into(g, u, weight, limit, &mut q, &mut s)?;
    Ok((q, s))
}

/// [`swiglu_act_quant_fp8`] into preallocated outputs on g's device: `q`
/// e4m3 of g's shape and `scale` E8M0 of g's shape with the last dimension
/// inter/32.
pub fn swiglu_act_quant_fp8_into(
    g: &Tensor,
    u: &Tensor,
    weight: &Tensor,
    limit: f32,
    q: &mut Tensor,
    scale: &mut Tensor,
) -> Result<()> {
    let (_, scale_shape) = validate(g, u, weight, limit)?;
    q.expect_output(OP, "q", DType::F8E4M3, g.shape())?;
    scale.expect_output(OP, "scale", DType::E8M0, &scale_shape)?;
    let (rows, inter) = rows_and_last(OP, "g", g)?;
    let device = common_device(
        OP,
        &[
            ("g", g),
            ("u", u),
            ("weight", weight),
            ("q", q),
            ("scale", scale),
        ],
    )?;
    match device {
        Device::Cpu => {
            let (qv, sv) = cpu_backend::swiglu_act_quant_fp8(
                g.as_slice::<bf16>()?,
                u.as_slice::<bf16>()?,
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
            &dev, g, u, weight, limit, q, scale, rows, inter,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// Checks dtypes, shapes and the limit; returns g's device and the scale shape.
fn validate(g: &Tensor, u: &Tensor, weight: &Tensor, limit: f32) -> Result<(Device, Vec<usize>)> {
    g.expect_dtype(OP, "g", DType::BF16)?;
    u.expect_dtype(OP, "u", DType::BF16)?;
    weight.expect_dtype(OP, "weight", DType::F32)?;
    let (rows, inter) = rows_and_last(OP, "g", g)?;
    check_i32(OP, "g", g, inter)?;
    if !inter.is_multiple_of(MX_BLOCK) {
        return Err(Error::Shape {
            op: OP,
            tensor: "g",
            got: g.shape().to_vec(),
            expected: format!("a last dimension that is a multiple of {MX_BLOCK}"),
        });
    }
    if u.shape() != g.shape() {
        return Err(Error::Shape {
            op: OP,
            tensor: "u",
            got: u.shape().to_vec(),
            expected: format!("{:?} (the shape of g)", g.shape()),
        });
    }
    if weight.shape() != [rows] {
        return Err(Error::Shape {
            op: OP,
            tensor: "weight",
            got: weight.shape().to_vec(),
            expected: format!("[{rows}] (one routing weight per row of g)"),
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
    let scale_shape = super::with_last(g.shape(), inter / MX_BLOCK);
    Ok((
        common_device(OP, &[("g", g), ("u", u), ("weight", weight)])?,
        scale_shape,
    ))
}
