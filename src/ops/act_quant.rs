//! FP8 1×32 activation quantisation with E8M0 scales (`v41-flash.md` §10.1):
//! BF16 `[.., k]` → e4m3 `[.., k]` and E8M0 scales `[.., ⌈k/32⌉]`. A last
//! block shorter than 32 (k not a multiple of 32) is quantised over its own
//! elements. Bit-exact on every backend.

use super::{check_i32, common_device, rows_and_last};
pub use crate::contract::ActQuantImpl;
use crate::contract::MX_BLOCK;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::Result;
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "act_quant_fp8";

/// Quantises `x` (BF16) to new (e4m3 values, E8M0 scales) on x's device.
pub fn act_quant_fp8(x: &Tensor) -> Result<(Tensor, Tensor)> {
    act_quant_fp8_with(x, ActQuantImpl::Cuda)
}

/// [`act_quant_fp8`] with a chosen CUDA implementation (ignored on the CPU).
pub fn act_quant_fp8_with(x: &Tensor, imp: ActQuantImpl) -> Result<(Tensor, Tensor)> {
    let (device, scale_shape) = validate(x)?;
    let mut q = Tensor::empty(&device, DType::F8E4M3, x.shape())?;
    let mut s = Tensor::empty(&device, DType::E8M0, &scale_shape)?;
    act_quant_fp8_into(x, &mut q, &mut s, imp)?;
    Ok((q, s))
}

/// Quantises into preallocated outputs: `q` e4m3 of x's shape and `scale`
/// E8M0 of x's shape with the last dimension ⌈k/32⌉, both on x's device.
pub fn act_quant_fp8_into(
    x: &Tensor,
    q: &mut Tensor,
    scale: &mut Tensor,
    imp: ActQuantImpl,
) -> Result<()> {
    let (_, scale_shape) = validate(x)?;
    q.expect_output(OP, "q", DType::F8E4M3, x.shape())?;
    scale.expect_output(OP, "scale", DType::E8M0, &scale_shape)?;
    let (rows, k) = rows_and_last(OP, "x", x)?;
    match common_device(OP, &[("x", x), ("q", q), ("scale", scale)])? {
        Device::Cpu => {
            let (qv, sv) = cpu_backend::act_quant_fp8(x.as_slice::<bf16>()?, rows, k);
            q.as_mut_slice::<E4M3>()?.copy_from_slice(&qv);
            scale.as_mut_slice::<E8M0>()?.copy_from_slice(&sv);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::act_quant_fp8(&dev, x, q, scale, rows, k, imp),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = imp;
            Err(super::kernels_not_built(OP, &d))
        }
    }
}

fn validate(x: &Tensor) -> Result<(Device, Vec<usize>)> {
    x.expect_dtype(OP, "x", DType::BF16)?;
    let (_, k) = rows_and_last(OP, "x", x)?;
    check_i32(OP, "x", x, k)?;
    let scale_shape = super::with_last(x.shape(), k.div_ceil(MX_BLOCK));
    Ok((common_device(OP, &[("x", x)])?, scale_shape))
}
