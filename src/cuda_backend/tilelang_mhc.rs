//! Launches of the TileLang mHC kernels: the front half in two passes
//! (`tilelang/mhc_pre.py`: collapse and the fixed-split partial sums of the
//! mixes; `tilelang/mhc_split.py`: their fixed-order total, split, Sinkhorn),
//! the expand (`tilelang/mhc.py`) and the expand fused with the next front's
//! pass 1 (`tilelang/mhc_expand_pre.py`), generated into
//! `tilelang/generated/mhc{,_pre,_split,_expand_pre}.sm_*.cu`. Like the other TileLang launchers it
//! passes raw device addresses and scalars in the order TileLang emits
//! (buffers by name, then scalars by name), not the program's order.

use super::u32_param;
use super::{launch_raw, read_ptr, write_ptr};
use crate::contract::MhcPre;
use crate::device::{CudaDevice, Device};
use crate::dtype::DType;
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

/// Threads per CTA of pass 1 of the front half (`THREADS` in
/// `tilelang/mhc_pre.py`).
const PRE_THREADS: u32 = 128;
/// Threads per CTA of pass 2 (`THREADS` in `tilelang/mhc_split.py`).
const SPLIT_THREADS: u32 = 128;
/// Pass 1: 16-byte vectors of each stream per chunk (`CHUNK_VEC`).
const PRE_CHUNK_VEC: usize = 16;
/// Pass 1: tokens per CTA (`TOK`).
const PRE_TOKENS: usize = 64;
/// Pass 1: dynamic shared memory (`SMEM_BYTES`: one step's hc_fn slice as
/// its hi, mid and lo BF16 terms, and the staged streams).
const PRE_SMEM_BYTES: u32 = 36992;
/// Pass 1's partial sums per token and chunk: 24 dots and the squares.
const PRE_PARTS: usize = 25;
/// The most CTAs a grid's y dimension takes.
const MAX_GRID_Y: usize = 65_535;
/// Pass 2: tokens per CTA (`TOK` in `tilelang/mhc_split.py`).
const SPLIT_TOKENS: usize = 8;

/// The launch sizes of the front half for `tokens` tokens of width `d`:
/// pass 1's chunks and token tiles and the ints the kernels take.
struct Front {
    tokens: usize,
    chunks: usize,
    tiles: usize,
    n_tokens: i32,
    n_vec: i32,
    n_chunks: i32,
    iters: i32,
}

impl Front {
    /// Needs `d % 8 == 0`, every count in an i32 and at most 65535 token
    /// tiles (a grid's y dimension).
    fn new(
        op: &'static str,
        streams: &Tensor,
        tokens: usize,
        d: usize,
        iters: usize,
    ) -> Result<Front> {
        if !d.is_multiple_of(VEC) {
            return Err(Error::Shape {
                op,
                tensor: "streams",
                got: streams.shape().to_vec(),
                expected: "[T, 4, D] with D a multiple of 8 (16-byte vectors)".into(),
            });
        }
        let chunks = (d / VEC).div_ceil(PRE_CHUNK_VEC);
        let (Ok(n_tokens), Ok(n_vec), Ok(n_chunks), Ok(iters)) = (
            i32::try_from(tokens),
            i32::try_from(d / VEC),
            i32::try_from(chunks),
            i32::try_from(iters),
        ) else {
            return Err(Error::Argument {
                op,
                arg: "tokens, D, iters",
                value: format!("{tokens}, {d}, {iters}"),
                why: "the generated kernels take tokens, D/8, the chunk count and iters as 32-bit ints",
            });
        };
        let tiles = tokens.div_ceil(PRE_TOKENS);
        if tiles > MAX_GRID_Y {
            return Err(Error::Argument {
                op,
                arg: "tokens",
                value: tokens.to_string(),
                why: "pass 1 takes a grid row of 64 tokens, and a grid has at most 65535 rows",
            });
        }
        Ok(Front {
            tokens,
            chunks,
            tiles,
            n_tokens,
            n_vec,
            n_chunks,
            iters,
        })
    }

    /// Pass 1's partial sums, F32 `[n_chunks, tokens, 25]` (pass 2 reads
    /// them).
    fn part(&self, dev: &CudaDevice) -> Result<Tensor> {
        let device = Device::Cuda(dev.clone());
        Tensor::empty(&device, DType::F32, &[self.chunks, self.tokens, PRE_PARTS])
    }

    /// Pass 1's grid: one CTA per chunk and token tile.
    fn pass1(&self, shared_mem_bytes: u32) -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (
                u32_param("chunks", self.chunks)?,
                u32_param("token tiles", self.tiles)?,
                1,
            ),
            block_dim: (PRE_THREADS, 1, 1),
            shared_mem_bytes,
        })
    }
}

/// The mHC front half in two launches:
///
/// 1. `deepinfer_mhc_pre_kernel(const float* hc_fn, float* part, const
///    float* pre_in, const bfloat16_t* streams, bfloat16_t* u, int n_chunks,
///    int n_tokens, int n_vec)`: grid `(n_chunks, ceil(tokens / 64))` with
///    `n_chunks = ceil(n_vec / 16)`, 128 threads, 36992 bytes of dynamic
///    shared memory; writes u and the partial sums `part` F32
///    `[n_chunks, tokens, 25]` (a scratch tensor here).
/// 2. `deepinfer_mhc_split_kernel` ([`split`]): adds the chunks in order
///    and writes mixes, pre, post and comb.
///
/// `n_vec = d / 8`. Needs `d % 8 == 0` (checked here), `tokens · 4 · d <
/// 2^31` and `1 ≤ iters < 2^31` (checked by the caller).
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
    let pass1 = kernels::tilelang_mhc_pre::DEEPINFER_MHC_PRE_KERNEL;
    let front = Front::new(OP, streams, tokens, d, iters)?;
    if tokens == 0 {
        return Ok(());
    }
    let mut part = front.part(dev)?;
    {
        let (sp, _g0) = read_ptr(streams.cuda()?, dev);
        let (fp, _g1) = read_ptr(hc_fn.cuda()?, dev);
        let (lp, _g4) = read_ptr(pre_in.cuda()?, dev);
        let (up, _g5) = write_ptr(out.u.cuda_mut()?, dev);
        let (tp, _g10) = write_ptr(part.cuda_mut()?, dev);
        // SAFETY: the argument list matches pass 1's generated signature
        // above in order and size (five 8-byte device addresses in
        // TileLang's order: hc_fn, part, pre_in, streams, u; three ints).
        // The addresses come from whole allocations (256-byte aligned, so
        // the 16-byte loads of streams and hc_fn and the stores of u are
        // aligned: D % 8 == 0) whose shapes the caller validated (streams
        // [T, 4, D], hc_fn [24, 4D], pre_in [T, 4], u [T, D]); part was just
        // allocated as [n_chunks, T, 25]. The kernel clamps every load to
        // the tensors' bounds and writes u and part only for tokens below T
        // and vectors below n_vec; each (chunk, token tile) is one CTA. The
        // guards live until after the launch; u and part are distinct
        // buffers (&mut). 36992 bytes of dynamic shared memory are below the
        // 48 KiB default limit.
        unsafe {
            launch_raw(
                dev,
                pass1,
                front.pass1(PRE_SMEM_BYTES)?,
                &[
                    (fp as u64).into(),
                    (tp as u64).into(),
                    (lp as u64).into(),
                    (sp as u64).into(),
                    (up as u64).into(),
                    front.n_chunks.into(),
                    front.n_tokens.into(),
                    front.n_vec.into(),
                ],
            )
        }?;
    }
    split(dev, &front, &part, hc_base, hc_scale, eps, hc_eps, out)
}

/// Pass 1 of the fused kernel: dynamic shared memory (`FUSED_SMEM_BYTES` in
/// `tilelang/mhc_pre.py`: pass 1's and the tile's post and comb).
const FUSED_SMEM_BYTES: u32 = 42112;

/// The expand of one sublayer fused with the next sublayer's front half,
/// in two launches:
///
/// 1. `deepinfer_mhc_expand_pre_kernel(const float* comb, const bfloat16_t*
///    f, const float* hc_fn, bfloat16_t* out, float* part, const float*
///    post, const float* pre_in, const bfloat16_t* streams, bfloat16_t* u,
///    int n_chunks, int n_tokens, int n_vec)`: pass 1's grid, 128 threads,
///    42112 bytes of dynamic shared memory; writes the new streams `out`
///    (the expand of streams, f, post and comb), u (their collapse with
///    pre_in) and the partial sums of their mixes under hc_fn;
/// 2. [`split`], as in [`mhc_pre`].
///
/// Needs `d % 8 == 0` (checked here), `tokens · 4 · d < 2^31` and `1 ≤
/// iters < 2^31` (checked by the caller).
#[allow(clippy::too_many_arguments)]
pub fn mhc_expand_pre(
    dev: &CudaDevice,
    expand: [&Tensor; 4],
    hc: [&Tensor; 3],
    pre_in: &Tensor,
    eps: f32,
    hc_eps: f32,
    iters: usize,
    out_streams: &mut Tensor,
    out: &mut MhcPre,
    tokens: usize,
    d: usize,
) -> Result<()> {
    const OP: &str = "mhc_expand_pre (TileLang)";
    let kernel = kernels::tilelang_mhc_expand_pre::DEEPINFER_MHC_EXPAND_PRE_KERNEL;
    let [streams, f_out, post, comb] = expand;
    let [hc_fn, hc_base, hc_scale] = hc;
    let front = Front::new(OP, streams, tokens, d, iters)?;
    if tokens == 0 {
        return Ok(());
    }
    let mut part = front.part(dev)?;
    {
        let (cp, _g0) = read_ptr(comb.cuda()?, dev);
        let (fp, _g1) = read_ptr(f_out.cuda()?, dev);
        let (wp, _g2) = read_ptr(hc_fn.cuda()?, dev);
        let (op, _g3) = write_ptr(out_streams.cuda_mut()?, dev);
        let (tp, _g4) = write_ptr(part.cuda_mut()?, dev);
        let (pp, _g5) = read_ptr(post.cuda()?, dev);
        let (lp, _g6) = read_ptr(pre_in.cuda()?, dev);
        let (sp, _g7) = read_ptr(streams.cuda()?, dev);
        let (up, _g8) = write_ptr(out.u.cuda_mut()?, dev);
        // SAFETY: the argument list matches the generated signature above in
        // order and size (nine 8-byte device addresses in TileLang's order:
        // comb, f, hc_fn, out, part, post, pre_in, streams, u; three ints).
        // The addresses come from whole allocations (256-byte aligned, so
        // the 16-byte loads of streams, f and hc_fn and the stores of out and
        // u are aligned: D % 8 == 0) whose shapes the caller validated
        // (streams and out [T, 4, D], f [T, D], post and pre_in [T, 4], comb
        // [T, 16], hc_fn [24, 4D], u [T, D]); part was just allocated as
        // [n_chunks, T, 25]. Every load is clamped to its tensor's bounds
        // and out, u and part are written only for tokens below T and
        // vectors below n_vec, each (chunk, token tile) by one CTA. The
        // guards live until after the launch; out, u and part are distinct
        // buffers (&mut), so out never aliases the streams it is computed
        // from. 42112 bytes of dynamic shared memory are below the 48 KiB
        // default limit.
        unsafe {
            launch_raw(
                dev,
                kernel,
                front.pass1(FUSED_SMEM_BYTES)?,
                &[
                    (cp as u64).into(),
                    (fp as u64).into(),
                    (wp as u64).into(),
                    (op as u64).into(),
                    (tp as u64).into(),
                    (pp as u64).into(),
                    (lp as u64).into(),
                    (sp as u64).into(),
                    (up as u64).into(),
                    front.n_chunks.into(),
                    front.n_tokens.into(),
                    front.n_vec.into(),
                ],
            )
        }?;
    }
    split(dev, &front, &part, hc_base, hc_scale, eps, hc_eps, out)
}

/// Pass 2, `deepinfer_mhc_split_kernel(float* comb, const float* hc_base,
/// const float* hc_scale, float* mixes, const float* part, float* post,
/// float* pre, float eps, float hc_eps, int iters, int n_chunks, int
/// n_tokens, int n_vec)`: grid `ceil(tokens / 8)`, 128 threads; adds pass
/// 1's chunks of `part` in order and writes mixes, pre, post and comb.
#[allow(clippy::too_many_arguments)]
fn split(
    dev: &CudaDevice,
    front: &Front,
    part: &Tensor,
    hc_base: &Tensor,
    hc_scale: &Tensor,
    eps: f32,
    hc_eps: f32,
    out: &mut MhcPre,
) -> Result<()> {
    let pass2 = kernels::tilelang_mhc_split::DEEPINFER_MHC_SPLIT_KERNEL;
    let (tp, _g0) = read_ptr(part.cuda()?, dev);
    let (bp, _g1) = read_ptr(hc_base.cuda()?, dev);
    let (cp, _g2) = read_ptr(hc_scale.cuda()?, dev);
    let (mp, _g3) = write_ptr(out.mixes.cuda_mut()?, dev);
    let (pp, _g4) = write_ptr(out.pre.cuda_mut()?, dev);
    let (qp, _g5) = write_ptr(out.post.cuda_mut()?, dev);
    let (kp, _g6) = write_ptr(out.comb.cuda_mut()?, dev);
    let cfg2 = LaunchConfig {
        grid_dim: (
            u32_param("token groups", front.tokens.div_ceil(SPLIT_TOKENS))?,
            1,
            1,
        ),
        block_dim: (SPLIT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches pass 2's generated signature above
    // (seven 8-byte device addresses in TileLang's order: comb, hc_base,
    // hc_scale, mixes, part, post, pre; two floats, four ints). part is the
    // [n_chunks, T, 25] tensor pass 1 filled on the same stream (every
    // element: each chunk CTA writes all 25 sums of each of its tokens);
    // the outputs are mixes [T, 24], pre/post [T, 4], comb [T, 16] as the
    // caller validated, hc_base [24] and hc_scale [3]. Loads are clamped to
    // token T - 1 and stores masked to tokens below T. Guards live until
    // after the launch; the five outputs are distinct buffers (&mut).
    unsafe {
        launch_raw(
            dev,
            pass2,
            cfg2,
            &[
                (kp as u64).into(),
                (bp as u64).into(),
                (cp as u64).into(),
                (mp as u64).into(),
                (tp as u64).into(),
                (qp as u64).into(),
                (pp as u64).into(),
                eps.into(),
                hc_eps.into(),
                front.iters.into(),
                front.n_chunks.into(),
                front.n_tokens.into(),
                front.n_vec.into(),
            ],
        )
    }?;
    Ok(())
}
