//! Launches of the TileLang-generated MoE routing and layout kernels
//! (`tilelang/moe_route.py`, `tilelang/moe_layout.py`, generated into
//! `tilelang/generated/moe_{route,layout}.sm_*.cu`). Like the other TileLang
//! launchers it passes raw device addresses and scalars in the order
//! TileLang emits (buffers by name, then scalars by name), not the
//! program's order.

use super::{i32_param, u32_param};
use super::{launch_raw, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`THREADS` in `tilelang/moe_route.py`): one token a CTA.
const THREADS: u32 = 256;
/// `MAX_EXPERTS` and `MAX_TOP_K` of the program.
const MAX_EXPERTS: usize = 1024;
const MAX_TOP_K: usize = 16;

/// `deepinfer_moe_route_kernel(const float* bias, int* ids, const float*
/// logits, float* weights, int n_experts, int n_tokens, float route_scale,
/// int top_k)`: one CTA of 256 threads per token, `tokens` CTAs, 12.4 KB of
/// static shared memory, launch bounds (256, 1). Needs experts ≤ 1024,
/// 1 ≤ top_k ≤ min(experts, 16) (checked by the caller and again here: the
/// kernel's shared arrays are sized for them) and `tokens < 2^31`.
#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    dev: &CudaDevice,
    logits: &Tensor,
    bias: &Tensor,
    route_scale: f32,
    ids: &mut Tensor,
    weights: &mut Tensor,
    tokens: usize,
    experts: usize,
    top_k: usize,
) -> Result<()> {
    const OP: &str = "moe_route (TileLang)";
    let kernel = kernels::tilelang_moe_route::DEEPINFER_MOE_ROUTE_KERNEL;
    if experts == 0 || experts > MAX_EXPERTS || top_k == 0 || top_k > experts.min(MAX_TOP_K) {
        return Err(Error::Argument {
            op: OP,
            arg: "experts, top_k",
            value: format!("{experts}, {top_k}"),
            why: "the kernel handles 1 <= top_k <= min(experts, 16) and experts <= 1024",
        });
    }
    let Ok(n_tokens) = i32::try_from(tokens) else {
        return Err(Error::Argument {
            op: OP,
            arg: "tokens",
            value: tokens.to_string(),
            why: "the generated kernel indexes tokens (one CTA each) with a 32-bit int",
        });
    };
    if tokens == 0 {
        return Ok(());
    }
    let (n_experts, k) = (i32_param("experts", experts)?, i32_param("top_k", top_k)?);
    let (lp, _gl) = read_ptr(logits.cuda()?, dev);
    let (bp, _gb) = read_ptr(bias.cuda()?, dev);
    let (ip, _gi) = write_ptr(ids.cuda_mut()?, dev);
    let (wp, _gw) = write_ptr(weights.cuda_mut()?, dev);
    let (bias, ids, logits, weights) = (bp as u64, ip as u64, lp as u64, wp as u64);
    let cfg = LaunchConfig {
        grid_dim: (u32_param("grid", tokens)?, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (four 8-byte device addresses, two ints, one float, one
    // int). The addresses come from whole allocations of tokens*experts*4
    // (logits), experts*4 (bias) and tokens*top_k*4 (ids, weights) bytes, as
    // the caller validated; their guards live until after the launch, logits
    // and bias are only read and ids, weights are distinct buffers (&mut).
    // CTA t (< n_tokens) reads experts < n_experts of row t only, and thread
    // r < top_k writes position p < top_k of row t (p counts the other
    // selected ids below its own). experts <= 1024 and top_k <= 16 fit the
    // kernel's shared arrays, and top_k <= experts leaves a live expert for
    // every round (a winner id in range).
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                bias.into(),
                ids.into(),
                logits.into(),
                weights.into(),
                n_experts.into(),
                n_tokens.into(),
                route_scale.into(),
                k.into(),
            ],
        )
    }?;
    Ok(())
}

/// Threads per CTA of the layout kernel (`THREADS` in `tilelang/moe_layout.py`).
const LAYOUT_THREADS: u32 = 512;
/// Its dynamic shared memory (16 warps × 2 int32 slots).
const LAYOUT_SMEM: u32 = 128;

/// `deepinfer_moe_layout_kernel(int* counts, const int* ids, int* offsets,
/// int* perm, int n_entries, int n_experts)`: one CTA of 512 threads per
/// expert (grid = n_experts), 128 bytes of dynamic shared memory, launch
/// bounds (512, 1). Needs `entries + 512 < 2^31` and every id in
/// `0..experts` (an id out of range is counted nowhere and leaves
/// permutation elements unwritten; the kernel never writes out of bounds).
pub fn moe_layout(
    dev: &CudaDevice,
    ids: &Tensor,
    counts: &mut Tensor,
    offsets: &mut Tensor,
    perm: &mut Tensor,
    entries: usize,
    experts: usize,
) -> Result<()> {
    const OP: &str = "moe_layout (TileLang)";
    let kernel = kernels::tilelang_moe_layout::DEEPINFER_MOE_LAYOUT_KERNEL;
    let (Ok(n_entries), Ok(n_experts), Ok(_)) = (
        i32::try_from(entries),
        i32::try_from(experts),
        i32::try_from(entries + LAYOUT_THREADS as usize),
    ) else {
        return Err(Error::Argument {
            op: OP,
            arg: "entries, experts",
            value: format!("{entries}, {experts}"),
            why: "the generated kernel indexes entries (plus one tile) and experts with 32-bit ints",
        });
    };
    if experts == 0 {
        return Ok(());
    }
    let (ip, _gi) = read_ptr(ids.cuda()?, dev);
    let (cp, _gc) = write_ptr(counts.cuda_mut()?, dev);
    let (op, _go) = write_ptr(offsets.cuda_mut()?, dev);
    let (pp, _gp) = write_ptr(perm.cuda_mut()?, dev);
    let (counts, ids, offsets, perm) = (cp as u64, ip as u64, op as u64, pp as u64);
    let cfg = LaunchConfig {
        grid_dim: (u32_param("experts", experts)?, 1, 1),
        block_dim: (LAYOUT_THREADS, 1, 1),
        shared_mem_bytes: LAYOUT_SMEM,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (four 8-byte device addresses, two ints). The addresses
    // come from whole allocations of entries*4 (ids, perm), experts*4
    // (counts) and (experts+1)*4 (offsets) bytes, as the caller validated;
    // their guards live until after the launch, ids is only read and the
    // outputs are distinct buffers (&mut). CTA e reads ids[0..n_entries),
    // writes counts[e], offsets[e] (and offsets[n_experts] in the last CTA),
    // and permutation elements whose index the kernel checks against
    // n_entries; the 128 bytes of dynamic shared memory are its 2 × 16 slots.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                counts.into(),
                ids.into(),
                offsets.into(),
                perm.into(),
                n_entries.into(),
                n_experts.into(),
            ],
        )
    }?;
    Ok(())
}
