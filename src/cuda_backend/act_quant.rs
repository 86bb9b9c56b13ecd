//! FP8 1×32 activation quantiser launch: the 8-wide vector kernel when
//! k % 32 == 0, the one-warp-per-block kernel otherwise, or the TileLang kernel;
//! and the quant family's other launches (weight dequantisation, exact scale
//! sharing, and the quantiser with sharing fused).

use super::params::{
    di_act_quant_params, di_act_quant_shared_params, di_dequant_params, di_share_scales_params,
};
use super::{flat_launch, grid_for, launch, read_ptr, write_ptr};
use super::{i32_param, u32_param};
use crate::contract::ActQuantImpl;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

const THREADS: usize = 256;

pub fn act_quant_fp8(
    dev: &CudaDevice,
    x: &Tensor,
    q: &mut Tensor,
    scale: &mut Tensor,
    rows: usize,
    k: usize,
    imp: ActQuantImpl,
) -> Result<()> {
    if imp == ActQuantImpl::TileLang && !k.is_multiple_of(32) {
        return Err(Error::Shape {
            op: "act_quant_fp8 (TileLang)",
            tensor: "x",
            got: x.shape().to_vec(),
            expected: "a last dimension that is a multiple of 32".into(),
        });
    }
    let blocks = rows * k.div_ceil(32);
    if rows > 0 {
        let xb = x.cuda()?;
        let (xp, _gx) = read_ptr(xb, dev);
        let (qp, _gq) = write_ptr(q.cuda_mut()?, dev);
        let (sp, _gs) = write_ptr(scale.cuda_mut()?, dev);
        let p = di_act_quant_params {
            x: xp,
            q: qp,
            scale: sp,
            rows: rows as i64,
            k: i32_param("k", k)?,
        };
        match imp {
            ActQuantImpl::Cuda => {
                let (kernel, work, per_cta) = if k.is_multiple_of(32) {
                    (kernels::quant::ACT_QUANT_FP8_VEC8, rows * k / 8, THREADS)
                } else {
                    (kernels::quant::ACT_QUANT_FP8_TAIL, blocks, THREADS / 32)
                };
                let cfg = LaunchConfig {
                    grid_dim: (grid_for(work, per_cta), 1, 1),
                    block_dim: (u32_param("THREADS", THREADS)?, 1, 1),
                    shared_mem_bytes: 0,
                };
                launch(dev, kernel, cfg, &p)?;
            }
            ActQuantImpl::TileLang => super::tilelang::act_quant_fp8(dev, &p)?,
        }
    }
    Ok(())
}

/// `out = w · w_s` dequantised to BF16 (`ops::mxfp8_dequantize`, which
/// validated the dtypes and shapes: `w` `[n, k]`, `w_s`
/// `[⌈n/32⌉, ⌈k/32⌉]`, `out` `[n, k]`, n · k > 0).
pub fn mxfp8_dequantize(
    dev: &CudaDevice,
    w: &Tensor,
    w_s: &Tensor,
    out: &mut Tensor,
    n: usize,
    k: usize,
) -> Result<()> {
    let (wp, _gw) = read_ptr(w.cuda()?, dev);
    let (sp, _gs) = read_ptr(w_s.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_dequant_params {
        w: wp,
        s: sp,
        out: op,
        n: n as i64,
        k: k as i64,
    };
    launch(
        dev,
        kernels::quant::MXFP8_DEQUANT_BF16,
        flat_launch(n * k),
        &p,
    )
}

/// `codes` and `scales` rewritten in place so that every run of `per`
/// blocks shares its largest scale where exact (`ops::mx_share_scales`,
/// which validated the dtypes, the shapes `[rows, k]` and
/// `[⌈rows / rows_per_scale⌉, ⌈k / 32⌉]`, `per` in 1..=8 and rows · k > 0).
pub fn mx_share_scales(
    dev: &CudaDevice,
    codes: &mut Tensor,
    scales: &mut Tensor,
    rows: usize,
    k: usize,
    rows_per_scale: usize,
    per: usize,
) -> Result<()> {
    let units = rows.div_ceil(rows_per_scale) * k.div_ceil(32).div_ceil(per);
    let (cp, _gc) = write_ptr(codes.cuda_mut()?, dev);
    let (sp, _gs) = write_ptr(scales.cuda_mut()?, dev);
    let p = di_share_scales_params {
        codes: cp,
        scales: sp,
        rows: rows as i64,
        k: k as i64,
        rows_per_scale: i32_param("rows_per_scale", rows_per_scale)?,
        per: i32_param("per", per)?,
    };
    // One warp per unit, 8 warps per CTA.
    let cfg = LaunchConfig {
        grid_dim: (grid_for(units, THREADS / 32), 1, 1),
        block_dim: (u32_param("THREADS", THREADS)?, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::quant::MX_SHARE_SCALES, cfg, &p)
}

/// Whether `act_quant_fp8_vec8_shared` serves runs of `per` blocks over a
/// last dimension `k`: whole runs in every row, a run 8, 16 or 32 lanes.
pub fn act_quant_shared_fuses(k: usize, per: usize) -> bool {
    matches!(per, 2 | 4 | 8) && k.is_multiple_of(32 * per)
}

/// `x` quantised into `q`, `scale` with every run of `per` blocks sharing
/// its largest scale where exact, in one pass (`ops::act_quant_fp8_shared`,
/// which validated the dtypes and shapes, rows · k > 0, and
/// [`act_quant_shared_fuses`]`(k, per)`).
pub fn act_quant_fp8_shared(
    dev: &CudaDevice,
    x: &Tensor,
    q: &mut Tensor,
    scale: &mut Tensor,
    rows: usize,
    k: usize,
    per: usize,
) -> Result<()> {
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (qp, _gq) = write_ptr(q.cuda_mut()?, dev);
    let (sp, _gs) = write_ptr(scale.cuda_mut()?, dev);
    let p = di_act_quant_shared_params {
        x: xp,
        q: qp,
        scale: sp,
        rows: rows as i64,
        k: i32_param("k", k)?,
        per: i32_param("per", per)?,
    };
    // One thread per 8 values, like act_quant_fp8_vec8.
    let cfg = LaunchConfig {
        grid_dim: (grid_for(rows * k / 8, THREADS), 1, 1),
        block_dim: (u32_param("THREADS", THREADS)?, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::quant::ACT_QUANT_FP8_VEC8_SHARED, cfg, &p)
}
