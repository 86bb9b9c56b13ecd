//! Launches of the TileLang mHC kernels: the front half (`tilelang/mhc_pre.py`:
//! collapse, mixes, split, Sinkhorn) and the expand (`tilelang/mhc.py`), generated
//! into `tilelang/generated/mhc{,_pre}.sm_*.cu`. Like the other TileLang launchers it
//! passes raw device addresses and scalars in the order TileLang emits
//! (buffers by name, then scalars by name), not the program's order.

use super::u32_param;
use super::{Arg, launch_raw, read_ptr, write_ptr};
use crate::contract::MhcPre;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`THREADS` in `tilelang/mhc.py`).
const THREADS: u32 = 128;
/// 16-byte vectors of each stream per CTA (`CHUNK`: 2 per thread).
const CHUNK: usize = 256;
/// BF16 values per vector.
const VEC: usize = 8;

/// `deepinfer_mhc_expand_kernel(const float* comb, const bfloat16_t* f,
/// bfloat16_t* out, const float* post, const bfloat16_t* streams,
/// int n_tokens, int n_vec)` with `n_vec = d / 8`: grid
/// `(tokens, ceil(n_vec / 256))`, 128 threads, no dynamic shared memory,
/// launch bounds (128, 1). Needs `d % 8 == 0` (checked here) and
/// `tokens · 4 · d < 2^31` (checked by the caller).
#[allow(clippy::too_many_arguments)]
pub fn mhc_expand(
    dev: &CudaDevice,
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
    out: &mut Tensor,
    tokens: usize,
    d: usize,
) -> Result<()> {
    const OP: &str = "mhc_expand (TileLang)";
    let kernel = kernels::tilelang_mhc::DEEPINFER_MHC_EXPAND_KERNEL;
    if !d.is_multiple_of(VEC) {
        return Err(Error::Shape {
            op: OP,
            tensor: "streams",
            got: streams.shape().to_vec(),
            expected: "[T, 4, D] with D a multiple of 8 (16-byte vectors)".into(),
        });
    }
    let (Ok(n_tokens), Ok(n_vec)) = (i32::try_from(tokens), i32::try_from(d / VEC)) else {
        return Err(Error::Argument {
            op: OP,
            arg: "tokens",
            value: tokens.to_string(),
            why: "the generated kernel takes the token count as a 32-bit int",
        });
    };
    if tokens == 0 {
        return Ok(());
    }
    let (sp, _gs) = read_ptr(streams.cuda()?, dev);
    let (fp, _gf) = read_ptr(f_out.cuda()?, dev);
    let (pp, _gp) = read_ptr(post.cuda()?, dev);
    let (cp, _gc) = read_ptr(comb.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let (comb, f, out, post, streams) = (cp as u64, fp as u64, op as u64, pp as u64, sp as u64);
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("tokens", tokens)?,
            u32_param("chunks", (d / VEC).div_ceil(CHUNK))?,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (five 8-byte device addresses, two ints). The addresses
    // come from whole allocations (256-byte aligned, so the 16-byte vector
    // loads and stores are aligned: D % 8 == 0 puts every row on a 16-byte
    // boundary) of tokens·4·d·2 (streams, out), tokens·d·2 (f_out),
    // tokens·16 (post) and tokens·64 (comb) bytes, as the caller validated;
    // the guards live until after the launch, the inputs are only read and
    // out is a distinct buffer (&mut). Grid x covers every token once, grid
    // y every vector below n_vec once (the rest are masked); tokens ≤ 2^31
    // fits grid x.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                comb.into(),
                f.into(),
                out.into(),
                post.into(),
                streams.into(),
                n_tokens.into(),
                n_vec.into(),
            ],
        )
    }?;
    Ok(())
}

/// Threads per CTA of the front half (`THREADS` in `tilelang/mhc_pre.py`).
const PRE_THREADS: u32 = 128;
/// Its dynamic shared memory: the [25, 128] fp32 partial sums.
const PRE_SMEM_BYTES: u32 = 25 * 128 * 4;

/// `deepinfer_mhc_pre_kernel(float* comb, const float* hc_base, const float*
/// hc_fn, const float* hc_scale, float* mixes, float* post, float* pre,
/// const float* pre_in, const bfloat16_t* streams, bfloat16_t* u, float eps,
/// float hc_eps, int iters, int n_tokens, int n_vec)` with `n_vec = d / 8`:
/// one token per CTA of 128 threads (grid `(tokens, 1, 1)`), 12800 bytes of
/// dynamic shared memory, launch bounds (128, 1). Needs `d % 8 == 0`
/// (checked here), `tokens · 4 · d < 2^31` and `1 ≤ iters < 2^31` (checked
/// by the caller).
#[allow(clippy::too_many_arguments)]
pub fn mhc_pre(
    dev: &CudaDevice,
    streams: &Tensor,
    hc_fn: &Tensor,
    hc_base: &Tensor,
    hc_scale: &Tensor,
    pre_in: &Tensor,
    eps: f32,
    hc_eps: f32,
    iters: usize,
    out: &mut MhcPre,
    tokens: usize,
    d: usize,
) -> Result<()> {
    const OP: &str = "mhc_pre (TileLang)";
    let kernel = kernels::tilelang_mhc_pre::DEEPINFER_MHC_PRE_KERNEL;
    if !d.is_multiple_of(VEC) {
        return Err(Error::Shape {
            op: OP,
            tensor: "streams",
            got: streams.shape().to_vec(),
            expected: "[T, 4, D] with D a multiple of 8 (16-byte vectors)".into(),
        });
    }
    let (Ok(n_tokens), Ok(n_vec), Ok(iters)) = (
        i32::try_from(tokens),
        i32::try_from(d / VEC),
        i32::try_from(iters),
    ) else {
        return Err(Error::Argument {
            op: OP,
            arg: "tokens",
            value: tokens.to_string(),
            why: "the generated kernel takes tokens, D/8 and iters as 32-bit ints",
        });
    };
    if tokens == 0 {
        return Ok(());
    }
    let (sp, _g0) = read_ptr(streams.cuda()?, dev);
    let (fp, _g1) = read_ptr(hc_fn.cuda()?, dev);
    let (bp, _g2) = read_ptr(hc_base.cuda()?, dev);
    let (cp, _g3) = read_ptr(hc_scale.cuda()?, dev);
    let (lp, _g4) = read_ptr(pre_in.cuda()?, dev);
    let (up, _g5) = write_ptr(out.u.cuda_mut()?, dev);
    let (mp, _g6) = write_ptr(out.mixes.cuda_mut()?, dev);
    let (pp, _g7) = write_ptr(out.pre.cuda_mut()?, dev);
    let (qp, _g8) = write_ptr(out.post.cuda_mut()?, dev);
    let (kp, _g9) = write_ptr(out.comb.cuda_mut()?, dev);
    let args = [
        kp as u64, bp as u64, fp as u64, cp as u64, mp as u64, qp as u64, pp as u64, lp as u64,
        sp as u64, up as u64,
    ];
    let cfg = LaunchConfig {
        grid_dim: (u32_param("tokens", tokens)?, 1, 1),
        block_dim: (PRE_THREADS, 1, 1),
        shared_mem_bytes: PRE_SMEM_BYTES,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (ten 8-byte device addresses in TileLang's order: comb,
    // hc_base, hc_fn, hc_scale, mixes, post, pre, pre_in, streams, u; two
    // floats, three ints). The addresses come from whole allocations
    // (256-byte aligned, so the 16-byte loads of streams and hc_fn and the
    // stores of u are aligned: D % 8 == 0) whose shapes the caller validated
    // (streams [T, 4, D], hc_fn [24, 4D], hc_base [24], hc_scale [3], pre_in
    // [T, 4]; outputs u [T, D], mixes [T, 24], pre/post [T, 4], comb [T, 16]);
    // the guards live until after the launch, inputs are only read and the
    // five outputs are distinct buffers (&mut). One CTA per token writes
    // exactly that token's outputs; the 12800 bytes of dynamic shared memory
    // are below the 48 KiB default limit.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &args
                .iter()
                .map(|&a| Arg::from(a))
                .chain([
                    eps.into(),
                    hc_eps.into(),
                    iters.into(),
                    n_tokens.into(),
                    n_vec.into(),
                ])
                .collect::<Vec<Arg>>(),
        )
    }?;
    Ok(())
}
