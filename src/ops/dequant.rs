//! FP8 weight dequantisation (`v41-flash.md` §10): an e4m3 weight `[N, K]`
//! with 32 × 32 E8M0 block scales `[⌈N/32⌉, ⌈K/32⌉]` to BF16 `[N, K]`, as
//! the reference does for `wo_a`. Bit-exact on every backend: the contract
//! is [`crate::cpu_backend::mxfp8_dequantize`] (one fp32 product, one
//! rounding, NaN as the canonical `0x7FC0`).

use super::{common_device, shape_error};
use crate::contract::MX_BLOCK;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::Result;
use crate::tensor::Tensor;

const OP: &str = "mxfp8_dequantize";

/// `w` (e4m3 `[N, K]`) times its block scales `w_s` (E8M0
/// `[⌈N/32⌉, ⌈K/32⌉]`), as a new BF16 `[N, K]` tensor on their device.
pub fn mxfp8_dequantize(w: &Tensor, w_s: &Tensor) -> Result<Tensor> {
    w.expect_dtype(OP, "w", DType::F8E4M3)?;
    w_s.expect_dtype(OP, "w_s", DType::E8M0)?;
    let &[n, k] = w.shape() else {
        return Err(shape_error(OP, "w", w, "[N, K]".into()));
    };
    let scales = [n.div_ceil(MX_BLOCK), k.div_ceil(MX_BLOCK)];
    if w_s.shape() != scales {
        return Err(shape_error(OP, "w_s", w_s, format!("{scales:?}")));
    }
    let device = common_device(OP, &[("w", w), ("w_s", w_s)])?;
    let mut out = Tensor::empty(&device, DType::BF16, &[n, k])?;
    if n * k == 0 {
        return Ok(out);
    }
    match &device {
        Device::Cpu => {
            let v =
                cpu_backend::mxfp8_dequantize(w.as_slice::<E4M3>()?, w_s.as_slice::<E8M0>()?, n, k);
            out.as_mut_slice()?.copy_from_slice(&v);
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::mxfp8_dequantize(dev, w, w_s, &mut out, n, k)?,
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, d)),
    }
    Ok(out)
}
