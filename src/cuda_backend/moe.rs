//! Launches of `kernels-cuda/moe/`: the permutation of rows and routing
//! weights into expert order, and the combine (the inverse permutation by
//! atomicMax over a zeroed scratch, then the slot-ordered sum).

use super::params::{
    di_check_ids_params, di_moe_masked_params, di_moe_params, di_moe_permute_fp8_params,
};
use super::{BadSlots, flat_launch, i32_param, launch, read_ptr, row_launch, write_ptr};
use crate::device::{CudaDevice, Device};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Records in slot `slot` of `bad` the first of the `n` I32 `ids` outside
/// `0..bound` (nothing waits here).
pub fn check_ids(
    dev: &CudaDevice,
    ids: &Tensor,
    n: usize,
    bound: usize,
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (ip, _gi) = read_ptr(ids.cuda()?, dev);
    let (bp, _gb) = bad.ptr(dev, slot)?;
    let p = di_check_ids_params {
        ids: ip.cast(),
        bad: bp,
        n: n as i64,
        bound: i32_param("bound", bound)?,
    };
    launch(dev, kernels::moe::CHECK_IDS, flat_launch(n), &p)
}

/// `x_out[i] = x[perm[i] / top_k]`, `w_out[i] = weights[perm[i]]` for
/// `n = tokens · top_k` entries of width `d`. The kernel skips an entry of
/// `perm` outside `0..n` and records the first in slot `slot` of `bad`
/// (nothing waits here).
#[allow(clippy::too_many_arguments)]
pub fn moe_permute(
    dev: &CudaDevice,
    x: &Tensor,
    weights: &Tensor,
    perm: &Tensor,
    x_out: &mut Tensor,
    w_out: &mut Tensor,
    (n, d, top_k): (usize, usize, usize),
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    i32_param("T · top_k", n)?;
    {
        let (xp, _gx) = read_ptr(x.cuda()?, dev);
        let (wp, _gw) = read_ptr(weights.cuda()?, dev);
        let (pp, _gp) = read_ptr(perm.cuda()?, dev);
        let (op, _go) = write_ptr(x_out.cuda_mut()?, dev);
        let (wo, _gwo) = write_ptr(w_out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev, slot)?;
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
    Ok(())
}

/// `q_out[i] = q[perm[i] / top_k]`, `s_out[i] = s[perm[i] / top_k]` (the
/// e4m3 rows of width `d` and their E8M0 scale rows of width `sd`),
/// `w_out[i] = weights[perm[i]]` for `n = tokens · top_k` entries; bad
/// entries as [`moe_permute`] (nothing waits here).
#[allow(clippy::too_many_arguments)]
pub fn moe_permute_fp8(
    dev: &CudaDevice,
    (q, s): (&Tensor, &Tensor),
    weights: &Tensor,
    perm: &Tensor,
    (q_out, s_out): (&mut Tensor, &mut Tensor),
    w_out: &mut Tensor,
    (n, d, sd, top_k): (usize, usize, usize, usize),
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    i32_param("T · top_k", n)?;
    let (qp, _gq) = read_ptr(q.cuda()?, dev);
    let (sp, _gs) = read_ptr(s.cuda()?, dev);
    let (wp, _gw) = read_ptr(weights.cuda()?, dev);
    let (pp, _gp) = read_ptr(perm.cuda()?, dev);
    let (qo, _gqo) = write_ptr(q_out.cuda_mut()?, dev);
    let (so, _gso) = write_ptr(s_out.cuda_mut()?, dev);
    let (wo, _gwo) = write_ptr(w_out.cuda_mut()?, dev);
    let (bp, _gb) = bad.ptr(dev, slot)?;
    let p = di_moe_permute_fp8_params {
        q: qp,
        s: sp,
        weights: wp.cast(),
        perm: pp.cast(),
        q_out: qo,
        s_out: so,
        w_out: wo.cast(),
        bad: bp,
        n: n as i64,
        d: d as i64,
        sd: sd as i64,
        top_k: i32_param("top_k", top_k)?,
    };
    let units = if d.is_multiple_of(16) { d / 16 } else { d };
    launch(
        dev,
        kernels::moe::MOE_PERMUTE_FP8,
        row_launch(n, units.max(sd), 256)?,
        &p,
    )
}

/// `out[t] = BF16(Σ_slot routed[pos(t · top_k + slot)] + shared[t])`.
/// The first entry of `perm` outside `0..n` goes to slot `slot` of `bad`
/// (nothing waits here).
pub fn moe_combine(
    dev: &CudaDevice,
    routed: &Tensor,
    perm: &Tensor,
    shared: &Tensor,
    out: &mut Tensor,
    (tokens, d, top_k): (usize, usize, usize),
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    let n = tokens.saturating_mul(top_k);
    // D = 0 still runs the inversion, which checks every entry.
    if tokens == 0 {
        return Ok(());
    }
    i32_param("T · top_k", n)?;
    let mut pos = Tensor::zeros(&Device::Cuda(dev.clone()), DType::I32, &[n])?;
    {
        let (rp, _gr) = read_ptr(routed.cuda()?, dev);
        let (pp, _gp) = read_ptr(perm.cuda()?, dev);
        let (sp, _gs) = read_ptr(shared.cuda()?, dev);
        let (posp, _gpos) = write_ptr(pos.cuda_mut()?, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev, slot)?;
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
    Ok(())
}

/// Sizes of a masked-layout launch (`kernels-cuda/moe/masked.cu`): tokens,
/// top_k, row width d, experts E and capacity C (E · C < 2^31, checked by
/// the op).
#[derive(Clone, Copy, Debug)]
pub struct MaskedDims {
    pub tokens: usize,
    pub top_k: usize,
    pub d: usize,
    pub experts: usize,
    pub capacity: usize,
}

/// Threads of a layout CTA (16 warps: a tile of 512 entries).
const MASKED_LAYOUT_THREADS: u32 = 512;

fn masked_params(dims: MaskedDims) -> Result<di_moe_masked_params> {
    let n = dims.tokens.saturating_mul(dims.top_k);
    i32_param("E · C", dims.experts.saturating_mul(dims.capacity))?;
    Ok(di_moe_masked_params {
        ids: std::ptr::null(),
        weights: std::ptr::null(),
        x: std::ptr::null(),
        shared: std::ptr::null(),
        pos: std::ptr::null_mut(),
        counts: std::ptr::null_mut(),
        dropped: std::ptr::null_mut(),
        w_out: std::ptr::null_mut(),
        out: std::ptr::null_mut(),
        scale: std::ptr::null_mut(),
        tokens: i64::from(i32_param("tokens", dims.tokens)?),
        n: i64::from(i32_param("T · top_k", n)?),
        d: i64::from(i32_param("d", dims.d)?),
        top_k: i32_param("top_k", dims.top_k)?,
        experts: i32_param("experts", dims.experts)?,
        capacity: i32_param("capacity", dims.capacity)?,
    })
}

/// The masked layout of `ids` / `weights` (`[tokens · top_k]`) into `pos`
/// (its first tokens · top_k elements), `counts` `[E]`, `w_out` `[E · C]`
/// and `dropped` `[E + 1]`: one launch, nothing read back.
pub fn moe_masked_layout(
    dev: &CudaDevice,
    (ids, weights): (&Tensor, &Tensor),
    pos: &mut Tensor,
    counts: &mut Tensor,
    w_out: &mut Tensor,
    dropped: &mut Tensor,
    dims: MaskedDims,
) -> Result<()> {
    let mut p = masked_params(dims)?;
    let (ip, _gi) = read_ptr(ids.cuda()?, dev);
    let (wp, _gw) = read_ptr(weights.cuda()?, dev);
    let (pp, _gp) = write_ptr(pos.cuda_mut()?, dev);
    let (cp, _gc) = write_ptr(counts.cuda_mut()?, dev);
    let (wo, _gwo) = write_ptr(w_out.cuda_mut()?, dev);
    let (dp, _gd) = write_ptr(dropped.cuda_mut()?, dev);
    p.ids = ip.cast();
    p.weights = wp.cast();
    p.pos = pp.cast();
    p.counts = cp.cast();
    p.w_out = wo.cast();
    p.dropped = dp.cast();
    let cfg = LaunchConfig {
        grid_dim: (super::grid_for(dims.experts, 1), 1, 1),
        block_dim: (MASKED_LAYOUT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::moe::MOE_MASKED_LAYOUT, cfg, &p)
}

/// `out[pos[j]] = x[j / top_k]` (BF16), or its FP8 quantisation with the
/// scales into `scale` (e4m3 `out`), for every entry whose row is in range.
pub fn moe_masked_scatter(
    dev: &CudaDevice,
    x: &Tensor,
    pos: &Tensor,
    out: &mut Tensor,
    scale: Option<&mut Tensor>,
    dims: MaskedDims,
) -> Result<()> {
    if dims.tokens == 0 || dims.d == 0 {
        return Ok(());
    }
    let mut p = masked_params(dims)?;
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (pp, _gp) = read_ptr(pos.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let scale_ptr = match scale {
        Some(s) => Some(write_ptr(s.cuda_mut()?, dev)),
        None => None,
    };
    p.x = xp;
    p.pos = pp.cast_mut().cast();
    p.out = op;
    let kernel = match &scale_ptr {
        Some((sp, _)) => {
            p.scale = *sp;
            kernels::moe::MOE_MASKED_SCATTER_FP8
        }
        None => kernels::moe::MOE_MASKED_SCATTER_BF16,
    };
    let cfg = row_launch(dims.tokens, dims.d / 8, 256)?;
    launch(dev, kernel, cfg, &p)
}

/// `out[t] = BF16(Σ_slot rows[pos[t · top_k + slot]] + shared[t])`, a
/// dropped slot adding 0.0.
pub fn moe_masked_combine(
    dev: &CudaDevice,
    rows: &Tensor,
    pos: &Tensor,
    shared: &Tensor,
    out: &mut Tensor,
    dims: MaskedDims,
) -> Result<()> {
    if dims.tokens == 0 || dims.d == 0 {
        return Ok(());
    }
    let mut p = masked_params(dims)?;
    let (rp, _gr) = read_ptr(rows.cuda()?, dev);
    let (pp, _gp) = read_ptr(pos.cuda()?, dev);
    let (sp, _gs) = read_ptr(shared.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    p.x = rp;
    p.pos = pp.cast_mut().cast();
    p.shared = sp;
    p.out = op;
    let per_thread = if dims.d.is_multiple_of(8) { 8 } else { 1 };
    let cfg = flat_launch(dims.tokens.saturating_mul(dims.d / per_thread));
    launch(dev, kernels::moe::MOE_MASKED_COMBINE_BF16, cfg, &p)
}
