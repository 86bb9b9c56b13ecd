//! Exact scale sharing of an MXFP8 operand in place (issue 13): inside every
//! run of `group / 32` blocks of K, each 32-block moves to the run's largest
//! E8M0 scale where every one of its e4m3 codes stays exact, so a GEMM can
//! promote once per run wherever the scales it sees are equal. Bit-exact on
//! every backend: the contract is [`crate::numerics::share_mx_scales`]
//! (every element's value code · scale unchanged, a run that cannot be
//! shared left as it is).

use super::{act_quant_fp8, common_device, shape_error};
use crate::contract::MX_BLOCK;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::{Error, Result};
use crate::numerics;
use crate::tensor::Tensor;

const OP: &str = "mx_share_scales";

/// The longest run a kernel chains: 8 blocks (256 of K).
pub const MX_SHARE_MAX_GROUP: usize = 8 * MX_BLOCK;

/// `numerics::check_share_args` and the kernels' longest run.
fn check_args(op: &'static str, group: usize, rows_per_scale: usize) -> Result<()> {
    numerics::check_share_args(op, group, rows_per_scale)?;
    if group > MX_SHARE_MAX_GROUP {
        return Err(Error::Argument {
            op,
            arg: "group",
            value: group.to_string(),
            why: "at most 256 (8 blocks: the kernel's longest run)",
        });
    }
    Ok(())
}

/// Rewrites `codes` (e4m3 `[R, K]`) and `scales` (E8M0 `[⌈R /
/// rows_per_scale⌉, ⌈K / 32⌉]`: `rows_per_scale` 1 for 1 × 32 activation
/// scales, 32 for 32 × 32 weight scales) in place, runs of `group` (a
/// multiple of 32 up to [`MX_SHARE_MAX_GROUP`]) of K.
pub fn mx_share_scales(
    codes: &mut Tensor,
    scales: &mut Tensor,
    rows_per_scale: usize,
    group: usize,
) -> Result<()> {
    codes.expect_dtype(OP, "codes", DType::F8E4M3)?;
    scales.expect_dtype(OP, "scales", DType::E8M0)?;
    check_args(OP, group, rows_per_scale)?;
    let &[rows, k] = codes.shape() else {
        return Err(shape_error(OP, "codes", codes, "[R, K]".into()));
    };
    let want = [rows.div_ceil(rows_per_scale), k.div_ceil(MX_BLOCK)];
    if scales.shape() != want {
        return Err(shape_error(OP, "scales", scales, format!("{want:?}")));
    }
    let device = common_device(OP, &[("codes", codes), ("scales", scales)])?;
    if rows * k == 0 {
        return Ok(());
    }
    match &device {
        Device::Cpu => {
            numerics::share_mx_scales(
                codes.as_mut_slice::<E4M3>()?,
                scales.as_mut_slice::<E8M0>()?,
                rows,
                k,
                rows_per_scale,
                group,
            )?;
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::mx_share_scales(
            dev,
            codes,
            scales,
            rows,
            k,
            rows_per_scale,
            group / MX_BLOCK,
        )?,
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, d)),
    }
    Ok(())
}

const OP_QUANT: &str = "act_quant_fp8_shared";

/// [`act_quant_fp8`] of `x` (BF16 `[.., K]`) followed by
/// [`mx_share_scales`] with one row per scale and runs of `group` of K,
/// bitwise: the activation quantisation a chained GEMM
/// (`GemmImpl::LargeShared`) wants. On CUDA one fused pass
/// (`act_quant_fp8_vec8_shared`) where K is a multiple of `group` and a run
/// is 2, 4 or 8 blocks; the two launches otherwise.
pub fn act_quant_fp8_shared(x: &Tensor, group: usize) -> Result<(Tensor, Tensor)> {
    check_args(OP_QUANT, group, 1)?;
    x.expect_dtype(OP_QUANT, "x", DType::BF16)?;
    let shape = x.shape().to_vec();
    let k = shape.last().copied().unwrap_or(0);
    let rows = x.numel().checked_div(k).unwrap_or(0);
    #[cfg(deepinfer_cuda)]
    if let Device::Cuda(dev) = &x.device() {
        let per = group / MX_BLOCK;
        if rows > 0 && crate::cuda_backend::act_quant_shared_fuses(k, per) {
            super::check_i32(OP_QUANT, "x", x, k)?;
            let mut q = Tensor::empty(&x.device(), DType::F8E4M3, &shape)?;
            let mut s = Tensor::empty(
                &x.device(),
                DType::E8M0,
                &super::with_last(&shape, k / MX_BLOCK),
            )?;
            crate::cuda_backend::act_quant_fp8_shared(dev, x, &mut q, &mut s, rows, k, per)?;
            return Ok((q, s));
        }
    }
    let (q, s) = act_quant_fp8(x)?;
    let scale_shape = s.shape().to_vec();
    let mut q = q.reshape(&[rows, k])?;
    let mut s = s.reshape(&[rows, k.div_ceil(MX_BLOCK)])?;
    mx_share_scales(&mut q, &mut s, 1, group)?;
    Ok((q.reshape(&shape)?, s.reshape(&scale_shape)?))
}
