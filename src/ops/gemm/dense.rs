//! The block-scaled FP8 × FP8 dense linear (`mxfp8_linear`): validation
//! and dispatch to the CPU reference or the skinny / large CUDA kernels
//! (see the family doc in `mod.rs`).

use super::*;
use crate::contract::MX_BLOCK;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::Result;
use crate::ops::common_device;
use crate::tensor::Tensor;

pub(super) const MXFP8_OP: &str = "mxfp8_linear";

/// Block-scaled FP8 linear: `a` `[M, K]` e4m3 with `a_s` `[M, ⌈K/32⌉]`,
/// `w` `[N, K]` e4m3 with `w_s` `[⌈N/32⌉, ⌈K/32⌉]`, all E8M0-scaled; returns
/// a new `[M, N]` tensor of `out_dtype` (BF16 or F32) on the inputs' device,
/// computed by the kernel [`GemmImpl::Auto`] picks (on a batch-invariant
/// device, [`Device::batch_invariant`], kernels with one summation order
/// at every M).
pub fn mxfp8_linear(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    out_dtype: DType,
) -> Result<Tensor> {
    check_out_dtype(MXFP8_OP, "out_dtype", out_dtype)?;
    let (device, m, n, _) = validate_mxfp8(a, a_s, w, w_s)?;
    let mut out = Tensor::empty(&device, out_dtype, &[m, n])?;
    mxfp8_linear_into(a, a_s, w, w_s, &mut out, GemmImpl::Auto)?;
    Ok(out)
}

/// [`mxfp8_linear`] into a preallocated `out` (`[M, N]`, BF16 or F32, on
/// the inputs' device), with a chosen CUDA kernel (ignored on the CPU, but
/// a skinny kernel with M > [`SKINNY_MAX_M`] is an error everywhere).
pub fn mxfp8_linear_into(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    out: &mut Tensor,
    imp: GemmImpl,
) -> Result<()> {
    let (_, m, n, k) = validate_mxfp8(a, a_s, w, w_s)?;
    check_out(MXFP8_OP, out, &[m, n])?;
    let device = common_device(
        MXFP8_OP,
        &[("a", a), ("a_s", a_s), ("w", w), ("w_s", w_s), ("out", out)],
    )?;
    // A batch-invariant device runs kernels that sum every output the same
    // way at every M (the skinny kernel's K split, from N and K only):
    // Auto's large kernel with a last-wave split would give a row another
    // order in another batch.
    let imp = imp.resolve(MXFP8_OP, m, device.batch_invariant())?;
    if m == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {
            let y = cpu_backend::fp8_gemm_f32(
                a.as_slice::<E4M3>()?,
                a_s.as_slice::<E8M0>()?,
                w.as_slice::<E4M3>()?,
                w_s.as_slice::<E8M0>()?,
                m,
                n,
                k,
            );
            store_rows(out, &y, &[(0, m * n)])
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => match imp {
            GemmImpl::Skinny => {
                crate::cuda_backend::gemm_skinny::mxfp8_gemm_skinny(&dev, a, a_s, w, w_s, out)
            }
            GemmImpl::SkinnyWholeK => crate::cuda_backend::gemm_skinny::mxfp8_gemm_skinny_whole_k(
                &dev, a, a_s, w, w_s, out,
            ),
            // The large kernel (`Auto` is resolved above): whole tiles for
            // `Large`, the split plans as their names say.
            imp => {
                use crate::cuda_backend::gemm::{DensePlan, TileSplit, mxfp8_gemm};
                let split = match imp {
                    GemmImpl::LargeSkinnySplit => {
                        let (splits, stages_per_piece) =
                            crate::cuda_backend::gemm_skinny::split_k(n, k);
                        TileSplit::Pieces {
                            splits,
                            stages_per_piece,
                        }
                    }
                    GemmImpl::LargeSplit | GemmImpl::LargeShared => TileSplit::LastWave,
                    _ => TileSplit::Whole,
                };
                let chain = imp == GemmImpl::LargeShared;
                mxfp8_gemm(&dev, a, a_s, w, w_s, out, DensePlan { split, chain })
            }
        },
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = imp;
            Err(crate::ops::kernels_not_built(MXFP8_OP, &d))
        }
    }
}

/// Checks the dtypes and shapes of a dense FP8 linear; returns the device
/// and (M, N, K).
pub(super) fn validate_mxfp8(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
) -> Result<(Device, usize, usize, usize)> {
    const OP: &str = MXFP8_OP;
    a.expect_dtype(OP, "a", DType::F8E4M3)?;
    a_s.expect_dtype(OP, "a_s", DType::E8M0)?;
    w.expect_dtype(OP, "w", DType::F8E4M3)?;
    w_s.expect_dtype(OP, "w_s", DType::E8M0)?;
    let (m, n, k) = linear_dims(OP, a, w)?;
    let kb = k.div_ceil(MX_BLOCK);
    expect_act_scales(OP, a_s, &[m, kb])?;
    expect_shape(
        OP,
        "w_s",
        w_s,
        &[n.div_ceil(MX_BLOCK), kb],
        "(one E8M0 scale per 32 × 32 block of w)",
    )?;
    let device = common_device(OP, &[("a", a), ("a_s", a_s), ("w", w), ("w_s", w_s)])?;
    Ok((device, m, n, k))
}
