//! RMSNorm: y = weight · x · rsqrt(mean(x²) + eps), fp32 math, BF16 in and out
//! (`v41-flash.md` §10.6). V4.1 uses eps = 1e-20 everywhere in the text model.

use super::{check_i32, common_device, rows_and_last};
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "rms_norm";

/// RMSNorm over the last dimension of `x` (BF16, any leading shape) with a
/// BF16 `weight` of shape `[dim]`; returns a new tensor on x's device.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let device = validate(x, weight, eps)?;
    let mut out = Tensor::empty(&device, DType::BF16, x.shape())?;
    rms_norm_into(x, weight, eps, &mut out)?;
    Ok(out)
}

/// [`rms_norm`] into a preallocated BF16 `out` of x's shape, on x's device.
pub fn rms_norm_into(x: &Tensor, weight: &Tensor, eps: f32, out: &mut Tensor) -> Result<()> {
    validate(x, weight, eps)?;
    out.expect_output(OP, "out", DType::BF16, x.shape())?;
    let (rows, dim) = rows_and_last(OP, "x", x)?;
    match common_device(OP, &[("x", x), ("weight", weight), ("out", out)])? {
        Device::Cpu => {
            let y = cpu_backend::rms_norm(
                x.as_slice::<bf16>()?,
                weight.as_slice::<bf16>()?,
                rows,
                dim,
                eps,
            );
            out.as_mut_slice::<bf16>()?.copy_from_slice(&y);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::rms_norm(&dev, x, weight, out, rows, dim, eps),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

fn validate(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Device> {
    x.expect_dtype(OP, "x", DType::BF16)?;
    let (_, dim) = rows_and_last(OP, "x", x)?;
    check_i32(OP, "x", x, dim)?;
    check_norm_args(OP, weight, dim, eps)?;
    common_device(OP, &[("x", x), ("weight", weight)])
}

/// The checks of an RMSNorm's BF16 `weight` (`[dim]`) and `eps` (finite,
/// non-negative), shared with the row writers that normalise in place.
pub(super) fn check_norm_args(
    op: &'static str,
    weight: &Tensor,
    dim: usize,
    eps: f32,
) -> Result<()> {
    weight.expect_dtype(op, "weight", DType::BF16)?;
    if weight.shape() != [dim] {
        return Err(Error::Shape {
            op,
            tensor: "weight",
            got: weight.shape().to_vec(),
            expected: format!("[{dim}] (the last dimension of x)"),
        });
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Argument {
            op,
            arg: "eps",
            value: eps.to_string(),
            why: "must be finite and non-negative",
        });
    }
    Ok(())
}
