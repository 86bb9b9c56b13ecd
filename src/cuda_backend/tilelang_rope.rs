//! Launch of the TileLang RoPE kernel (`tilelang/rope.py`,
//! `tilelang/generated/rope.sm_*.cu`): the forward rotation and its inverse
//! on BF16 `[T, H, hd]`, one kernel with a sign flag.

use super::{i32_param, u32_param};
use super::{launch_raw, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`THREADS` in `tilelang/rope.py`).
const THREADS: u32 = 256;
/// 16-byte vectors per CTA (`CHUNK` = THREADS × VPT): a CTA covers this many
/// vectors of one token.
const CHUNK: usize = 1024;
/// BF16 elements per vector: hd and rope_dim must be multiples of it.
const VEC: usize = 8;
/// Widest rope slice: the kernel's shared cos/sin table holds 128 pairs
/// (`ROPE_DIM_MAX`).
const ROPE_DIM_MAX: usize = 256;
/// Dynamic shared memory: cos and sin, 128 fp32 each (`TABLE_BYTES`;
/// generate.py checks it against the lowered kernel).
const TABLE_BYTES: u32 = 1024;
/// gridDim.y covers the vectors of one token.
const GRID_Y_MAX: usize = 65_535;

/// `deepinfer_rope_kernel(const float* freq, bfloat16_t* out,
/// const int64_t* positions, const bfloat16_t* x, int head_vecs, int inverse,
/// int n_tok_vec, int n_tokens, int rope_vecs)` (every pointer
/// `__restrict__`), with `head_vecs = hd / 8`, `n_tok_vec = heads · hd / 8`
/// and `rope_vecs = rope_dim / 8`: grid `(n_tokens, ceil(n_tok_vec / 1024))`
/// of 256 threads, 1024 bytes of dynamic shared memory.
///
/// `x` and `out` are BF16 `[tokens, heads, head_dim]` (any shape of that
/// size), `positions` I64 `[tokens]`, all on `dev` and validated by the
/// caller; `freqs` is the layer's table (`cpu_backend::rope_freqs`, length
/// rope_dim / 2), uploaded once per device ([`CudaDevice::constant`]).
/// `inverse` selects the rotation by −angle.
/// Returns typed errors for shapes the kernel does not cover: `head_dim`
/// and `rope_dim` multiples of 8, `rope_dim` ≤ 256, at most
/// 65,535 × 1024 vectors (536,862,720 elements) per token, `tokens` < 2^31.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    dev: &CudaDevice,
    op: &'static str,
    x: &Tensor,
    positions: &Tensor,
    freqs: &[f32],
    out: &mut Tensor,
    tokens: usize,
    heads: usize,
    head_dim: usize,
    inverse: bool,
) -> Result<()> {
    let kernel = kernels::tilelang_rope::DEEPINFER_ROPE_KERNEL;
    let rope_dim = 2 * freqs.len();
    if !head_dim.is_multiple_of(VEC) {
        return Err(Error::Shape {
            op,
            tensor: "x",
            got: x.shape().to_vec(),
            expected: format!(
                "a head dimension that is a multiple of {VEC} (got {head_dim}; CUDA kernel)"
            ),
        });
    }
    if rope_dim == 0 || !rope_dim.is_multiple_of(VEC) || rope_dim > ROPE_DIM_MAX.min(head_dim) {
        return Err(Error::Argument {
            op,
            arg: "rope_dim",
            value: rope_dim.to_string(),
            why: "the CUDA kernel needs a positive multiple of 8, at most 256 and the head dimension",
        });
    }
    let n_tok_vec = heads * head_dim / VEC;
    let chunks = n_tok_vec.div_ceil(CHUNK);
    if chunks > GRID_Y_MAX {
        return Err(Error::Shape {
            op,
            tensor: "x",
            got: x.shape().to_vec(),
            expected: format!(
                "at most {} elements per token (CUDA grid)",
                GRID_Y_MAX * CHUNK * VEC
            ),
        });
    }
    let n_tokens = i32::try_from(tokens).map_err(|_| Error::Argument {
        op,
        arg: "tokens",
        value: tokens.to_string(),
        why: "the CUDA kernel takes the token count (its grid) as a 32-bit int",
    })?;
    if tokens == 0 {
        return Ok(());
    }
    // Both fit: n_tok_vec <= 65,535 * 1024 (so the kernel's int32 vector
    // index, below n_tok_vec + 1024, cannot overflow either).
    let (n_tok_vec, head_vecs, rope_vecs) = (
        i32_param("n_tok_vec", n_tok_vec)?,
        i32_param("head vectors", head_dim / VEC)?,
        i32_param("rope vectors", rope_dim / VEC)?,
    );
    let inverse = i32::from(inverse);
    // Uploaded once per table and device (a step captured as a CUDA graph
    // reads the copy an earlier step made).
    let table = dev.constant(
        &freqs
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let (fp, _gf) = read_ptr(&table, dev);
    let (pp, _gp) = read_ptr(positions.cuda()?, dev);
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (op_, _go) = write_ptr(out.cuda_mut()?, dev);
    let (freq, out, positions, x) = (fp as u64, op_ as u64, pp as u64, xp as u64);
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("tokens", tokens)?,
            u32_param("chunks", chunks)?,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: TABLE_BYTES,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (four 8-byte device addresses, five ints). The addresses
    // come from whole allocations (256-byte aligned; token rows are
    // heads*head_dim*2 bytes with head_dim % 8 == 0, so every 16-byte vector
    // access is aligned) of tokens*heads*head_dim*2 bytes (x, out: the caller
    // validated both shapes), tokens*8 (positions) and rope_dim*2 (the table
    // uploaded above, rope_vecs*4 floats: the kernel reads pairs
    // < rope_vecs*4 only). Their guards live until after the launch; the
    // stream-ordered free of `table` runs after the kernel. x, positions and
    // the table are only read; out is a distinct buffer (&mut), as the
    // kernel's __restrict__ pointers require. The grid is exactly n_tokens
    // CTAs by ceil(n_tok_vec / 1024) chunks; vectors past n_tok_vec are
    // masked in the kernel, and rope_vecs <= 32 pairs-of-4 fit the
    // 128-entry shared table given as dynamic shared memory.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                freq.into(),
                out.into(),
                positions.into(),
                x.into(),
                head_vecs.into(),
                inverse.into(),
                n_tok_vec.into(),
                n_tokens.into(),
                rope_vecs.into(),
            ],
        )
    }?;
    Ok(())
}
