//! FP8 1×32 activation quantisation with E8M0 scales (`v41-flash.md` §10.1):
//! BF16 `[.., k]` → e4m3 `[.., k]` and E8M0 scales `[.., ⌈k/32⌉]`. A last
//! block shorter than 32 (k not a multiple of 32) is quantised over its own
//! elements. Bit-exact on every backend.

use super::{common_device, rows_and_last};
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "act_quant_fp8";

/// Elements per scale block.
pub const ACT_QUANT_BLOCK: usize = 32;

/// Which CUDA implementation runs the quantiser (the CPU has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuantImpl {
    /// The hand-written kernel in `kernels-cuda/quant/`.
    Cuda,
    /// The TileLang program in `tilelang/act_quant_fp8.py` (k % 32 == 0 only).
    TileLang,
}

/// Quantises `x` (BF16) to (e4m3 values, E8M0 scales).
pub fn act_quant_fp8(x: &Tensor) -> Result<(Tensor, Tensor)> {
    act_quant_fp8_with(x, ActQuantImpl::Cuda)
}

/// [`act_quant_fp8`] with a chosen CUDA implementation (ignored on the CPU).
pub fn act_quant_fp8_with(x: &Tensor, imp: ActQuantImpl) -> Result<(Tensor, Tensor)> {
    x.expect_dtype(OP, "x", DType::BF16)?;
    let (rows, k) = rows_and_last(OP, "x", x)?;
    let mut scale_shape = x.shape().to_vec();
    *scale_shape.last_mut().expect("rank >= 1") = k.div_ceil(ACT_QUANT_BLOCK);
    match common_device(OP, &[("x", x)])? {
        Device::Cpu => {
            let (q, s) = cpu_backend::act_quant_fp8(x.as_slice::<bf16>()?, rows, k);
            Ok((
                Tensor::from_vec(q, x.shape())?,
                Tensor::from_vec(s, &scale_shape)?,
            ))
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::act_quant_fp8(&dev, x, rows, k, &scale_shape, imp)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = imp;
            Err(super::kernels_not_built(OP, &d))
        }
    }
}
