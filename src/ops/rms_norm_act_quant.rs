//! RMSNorm fused with the FP8 1×32 activation quantiser (`v41-flash.md`
//! §10.6 then §10.1): the input of every FP8-weight linear that follows a
//! norm. From BF16 `x` `[.., dim]` and `weight` `[dim]` it produces the BF16
//! norm output `y` (kept for residual paths and tests), its e4m3 values `q`
//! and E8M0 scales `[.., dim/32]`, reading `x` once on the GPU.
//!
//! Numerics: `y` is [`rms_norm`](super::rms_norm)'s (within one BF16 ulp on
//! CUDA, where only the fp32 summation order differs); `q` and `scale` are
//! bit-exactly [`act_quant_fp8`](super::act_quant_fp8) of that `y`, on every
//! backend. The CUDA kernel is the TileLang program
//! `tilelang/rms_norm_act_quant_fp8.py`.

use super::{MX_BLOCK, check_i32, common_device, rows_and_last};
pub use crate::contract::RMS_NORM_ACT_QUANT_MAX_DIM;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "rms_norm_act_quant_fp8";

/// RMSNorm of `x` (BF16, any leading shape, last dimension a multiple of 32
/// and at most [`RMS_NORM_ACT_QUANT_MAX_DIM`]) with BF16 `weight` `[dim]`,
/// then FP8 1×32 quantisation of the BF16 result. Returns new tensors
/// (`y` BF16 of x's shape, `q` e4m3 of x's shape, `scale` E8M0 of x's shape
/// with the last dimension dim/32) on x's device.
pub fn rms_norm_act_quant_fp8(
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (device, scale_shape) = validate(x, weight, eps)?;
    let mut y = Tensor::empty(&device, DType::BF16, x.shape())?;
    let mut q = Tensor::empty(&device, DType::F8E4M3, x.shape())?;
    let mut s = Tensor::empty(&device, DType::E8M0, &scale_shape)?;
    rms_norm_act_quant_fp8_into(x, weight, eps, &mut y, &mut q, &mut s)?;
    Ok((y, q, s))
}

/// [`rms_norm_act_quant_fp8`] into preallocated outputs on x's device: `y`
/// BF16 and `q` e4m3 of x's shape, `scale` E8M0 of x's shape with the last
/// dimension dim/32.
pub fn rms_norm_act_quant_fp8_into(
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    y: &mut Tensor,
    q: &mut Tensor,
    scale: &mut Tensor,
) -> Result<()> {
    let (_, scale_shape) = validate(x, weight, eps)?;
    y.expect_output(OP, "y", DType::BF16, x.shape())?;
    q.expect_output(OP, "q", DType::F8E4M3, x.shape())?;
    scale.expect_output(OP, "scale", DType::E8M0, &scale_shape)?;
    let (rows, dim) = rows_and_last(OP, "x", x)?;
    let device = common_device(
        OP,
        &[
            ("x", x),
            ("weight", weight),
            ("y", y),
            ("q", q),
            ("scale", scale),
        ],
    )?;
    match device {
        Device::Cpu => {
            let (yv, qv, sv) = cpu_backend::rms_norm_act_quant_fp8(
                x.as_slice::<bf16>()?,
                weight.as_slice::<bf16>()?,
                rows,
                dim,
                eps,
            );
            y.as_mut_slice::<bf16>()?.copy_from_slice(&yv);
            q.as_mut_slice::<E4M3>()?.copy_from_slice(&qv);
            scale.as_mut_slice::<E8M0>()?.copy_from_slice(&sv);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::rms_norm_act_quant_fp8(
            &dev, x, weight, eps, y, q, scale, rows, dim,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// Checks dtypes, shapes and eps; returns x's device and the scale shape.
fn validate(x: &Tensor, weight: &Tensor, eps: f32) -> Result<(Device, Vec<usize>)> {
    x.expect_dtype(OP, "x", DType::BF16)?;
    weight.expect_dtype(OP, "weight", DType::BF16)?;
    let (_, dim) = rows_and_last(OP, "x", x)?;
    check_i32(OP, "x", x, dim)?;
    if !dim.is_multiple_of(MX_BLOCK) || dim > RMS_NORM_ACT_QUANT_MAX_DIM {
        return Err(Error::Shape {
            op: OP,
            tensor: "x",
            got: x.shape().to_vec(),
            expected: format!(
                "a last dimension that is a multiple of {MX_BLOCK} and at most \
                 {RMS_NORM_ACT_QUANT_MAX_DIM}"
            ),
        });
    }
    if weight.shape() != [dim] {
        return Err(Error::Shape {
            op: OP,
            tensor: "weight",
            got: weight.shape().to_vec(),
            expected: format!("[{dim}] (the last dimension of x)"),
        });
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Argument {
            op: OP,
            arg: "eps",
            value: eps.to_string(),
            why: "must be finite and non-negative",
        });
    }
    let scale_shape = super::with_last(x.shape(), dim / MX_BLOCK);
    Ok((
        common_device(OP, &[("x", x), ("weight", weight)])?,
        scale_shape,
    ))
}
