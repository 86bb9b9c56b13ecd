//! The BF16 linear (`bf16_linear`): the CPU reference or cuBLAS (see the
//! family doc in `mod.rs`).

use super::*;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::common_device;
use crate::tensor::Tensor;
use half::bf16;

pub(super) const BF16_OP: &str = "bf16_linear";

/// BF16 linear: `a` `[M, K]` BF16 times `w` `[N, K]` BF16 transposed, fp32
/// accumulation, into a new `[M, N]` tensor of `out_dtype` (BF16, rounded
/// once, or F32). CPU: [`crate::cpu_backend::bf16_gemm`] /
/// [`crate::cpu_backend::f32_gemm`] (products summed in increasing k);
/// CUDA: cuBLAS `cublasGemmEx` with FP32 compute (its own summation order,
/// so the two agree to rounding, `calc_diff` < 1e-5, not bitwise), or on a
/// batch-invariant device ([`Device::batch_invariant`]) one cuBLASLt
/// algorithm pinned per (stream, N, K, output dtype) with no split-K
/// reduction (and no workspace where cuBLASLt has such an algorithm), so a
/// row's result does not depend on M.
pub fn bf16_linear(a: &Tensor, w: &Tensor, out_dtype: DType) -> Result<Tensor> {
    check_out_dtype(BF16_OP, "out_dtype", out_dtype)?;
    let (device, m, n, _) = validate_bf16(a, w)?;
    let mut out = Tensor::empty(&device, out_dtype, &[m, n])?;
    bf16_linear_into(a, w, &mut out)?;
    Ok(out)
}

/// [`bf16_linear`] into a preallocated `out` (`[M, N]`, BF16 or F32, on the
/// inputs' device).
pub fn bf16_linear_into(a: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
    let (_, m, n, k) = validate_bf16(a, w)?;
    check_out(BF16_OP, out, &[m, n])?;
    let device = common_device(BF16_OP, &[("a", a), ("w", w), ("out", out)])?;
    if m == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {
            let y = cpu_backend::f32_gemm(a.as_slice::<bf16>()?, w.as_slice::<bf16>()?, m, n, k);
            store_rows(out, &y, &[(0, m * n)])
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) if dev.batch_invariant() => {
            crate::cuda_backend::blas::pinned_bf16_linear(&dev, a, w, out, (m, 1, n, k))
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::blas::bf16_linear(&dev, a, w, out, m, n, k),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(BF16_OP, &d)),
    }
}

pub(super) fn validate_bf16(a: &Tensor, w: &Tensor) -> Result<(Device, usize, usize, usize)> {
    const OP: &str = BF16_OP;
    a.expect_dtype(OP, "a", DType::BF16)?;
    w.expect_dtype(OP, "w", DType::BF16)?;
    let (m, n, k) = linear_dims(OP, a, w)?;
    let device = common_device(OP, &[("a", a), ("w", w)])?;
    Ok((device, m, n, k))
}
