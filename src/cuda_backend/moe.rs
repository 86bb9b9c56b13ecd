//! Launches of `kernels-cuda/moe/`: the permutation of rows and routing
//! weights into expert order, and the combine (the inverse permutation by
//! atomicMax over a zeroed scratch, then the slot-ordered sum).

use super::params::di_moe_params;
use super::{BadSlot, flat_launch, i32_param, launch, read_ptr, row_launch, write_ptr};
use crate::device::{CudaDevice, Device};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;

/// `x_out[i] = x[perm[i] / top_k]`, `w_out[i] = weights[perm[i]]` for
/// `n = tokens · top_k` entries of width `d`. Returns the first entry of
/// `perm` outside `0..n`, after waiting for the kernel.
#[allow(clippy::too_many_arguments)]
pub fn moe_permute(
    dev: &CudaDevice,
    x: &Tensor,
    weights: &Tensor,
    perm: &Tensor,
    x_out: &mut Tensor,
    w_out: &mut Tensor,
    (n, d, top_k): (usize, usize, usize),
) -> Result<Option<usize>> {
    if n == 0 {
        return Ok(None);
    }
    i32_param("T · top_k", n)?;
    let mut bad = BadSlot::new(dev)?;
    {
        let (xp, _gx) = read_ptr(x.cuda()?, dev);
        let (wp, _gw) = read_ptr(weights.cuda()?, dev);
        let (pp, _gp) = read_ptr(perm.cuda()?, dev);
        let (op, _go) = write_ptr(x_out.cuda_mut()?, dev);
        let (wo, _gwo) = write_ptr(w_out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev)?;
        let p = di_moe_params {
            x: xp,
            weights: wp.cast(),
            shared: std::ptr::null(),
            perm: pp.cast(),
            pos: std::ptr::null_mut(),
            out: op,
            w_out: wo.cast(),
            bad: bp,
            tokens: (n / top_k.max(1)) as i64,
            n: n as i64,
            d: d as i64,
            top_k: i32_param("top_k", top_k)?,
        };
        launch(
            dev,
            kernels::moe::MOE_PERMUTE_BF16,
            row_launch(n, d, 256)?,
            &p,
        )?;
    }
    bad.first()
}

/// `out[t] = BF16(Σ_slot routed[pos(t · top_k + slot)] + shared[t])`.
/// Returns the first entry of `perm` outside `0..n`, after waiting.
pub fn moe_combine(
    dev: &CudaDevice,
    routed: &Tensor,
    perm: &Tensor,
    shared: &Tensor,
    out: &mut Tensor,
    (tokens, d, top_k): (usize, usize, usize),
) -> Result<Option<usize>> {
    let n = tokens.saturating_mul(top_k);
    // D = 0 still runs the inversion, which checks every entry.
    if tokens == 0 {
        return Ok(None);
    }
    i32_param("T · top_k", n)?;
    let mut pos = Tensor::zeros(&Device::Cuda(dev.clone()), DType::I32, &[n])?;
    let mut bad = BadSlot::new(dev)?;
    {
        let (rp, _gr) = read_ptr(routed.cuda()?, dev);
        let (pp, _gp) = read_ptr(perm.cuda()?, dev);
        let (sp, _gs) = read_ptr(shared.cuda()?, dev);
        let (posp, _gpos) = write_ptr(pos.cuda_mut()?, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev)?;
        let p = di_moe_params {
            x: rp,
            weights: std::ptr::null(),
            shared: sp,
            perm: pp.cast(),
            pos: posp.cast(),
            out: op,
            w_out: std::ptr::null_mut(),
            bad: bp,
            tokens: tokens as i64,
            n: n as i64,
            d: d as i64,
            top_k: i32_param("top_k", top_k)?,
        };
        // Same stream: the combine reads pos after the inversion wrote it.
        launch(dev, kernels::moe::MOE_COMBINE_INVERT, flat_launch(n), &p)?;
        launch(
            dev,
            kernels::moe::MOE_COMBINE_BF16,
            flat_launch(tokens.saturating_mul(d)),
            &p,
        )?;
    }
    bad.first()
}
