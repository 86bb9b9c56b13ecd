//! Launches of the large-M block-scaled GEMMs (`kernels-cuda/gemm/`): the
//! dense MXFP8 GEMM and the contiguous-grouped FP8 × FP4 MoE GEMM.
//!
//! Both compute `out[m, n] = Σ_kb (fp32 block sum of a·b over 32 of K) ·
//! a_s · b_s` with the numerics of `cpu_backend::gemm` up to the in-block
//! summation order (compare with `calc_diff`). On sm_90a they run the
//! persistent TMA + wgmma kernel with per-32 promotion; on other archs the
//! same entry points run a SIMT path (see the family README).
//!
//! Two kernel versions exist side by side ([`LargeKernel`]): `V1`
//! (`mx_gemm.cu`, verified on the H200) and `V2` (`mx_gemm_v2.cu`: wgmma of
//! the next k32 step overlapped with the promotion of the previous one, a
//! cheaper FP4 decode, L2-friendly tile order). Both take the same inputs,
//! limits and launch shape; [`mxfp8_gemm`] and [`mxfp4_grouped_contiguous`]
//! run [`LargeKernel::DEFAULT`], the `_with` forms a chosen version.
//!
//! Callers (the ops layer) have validated dtypes, shapes and devices. These
//! functions check only the kernels' own limits and return typed errors for
//! them before launching: K > 0 and K % 16 == 0 (FP8 rows are TMA rows whose
//! stride must be a multiple of 16 bytes), K % 32 == 0 for FP4 weights (a
//! packed row is K / 2 bytes), sizes that fit the kernels' 32-bit indices,
//! and 16-byte aligned bases (tensors own whole allocations, so this holds).

use super::params::di_mx_gemm_params;
use super::tma::{Swizzle, encode_u8};
use super::u32_param;
use super::{allow_smem, launch, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, KernelRef};
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA: one producer and two consumer warpgroups. The sm_90a
/// kernel needs exactly this (wgmma runs on whole warpgroups).
const THREADS: u32 = 384;
/// Output tile (rows × columns) of one CTA step.
const BLOCK_M: usize = 128;
const BLOCK_N: usize = 128;
/// Dynamic shared memory of each kernel (static_asserted in mx_gemm.cu;
/// version 2 uses the same layout).
const SMEM_FP8: u32 = 210_448;
const SMEM_FP4: u32 = 226_424;

/// Which version of the large-M kernels runs (same contract and limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LargeKernel {
    /// `mx_gemm.cu`: each k32 wgmma waited for, then promoted (verified on
    /// the H200, 450–510 TFLOP/s dense).
    V1,
    /// `mx_gemm_v2.cu`: n64 wgmma units in a 2-deep ring (the next unit runs
    /// while the previous one is promoted), prmt FP4 decode, banded tile
    /// order. Passed the GPU tests on the H200 (bundle of cda0a8c).
    V2,
}

impl LargeKernel {
    /// The version [`mxfp8_gemm`] and [`mxfp4_grouped_contiguous`] run (the
    /// faster one in `benches/results/*-h200-gemm.json`).
    pub const DEFAULT: LargeKernel = LargeKernel::V2;
    /// Both versions, for tests and benchmarks.
    pub const ALL: [LargeKernel; 2] = [LargeKernel::V1, LargeKernel::V2];
}

impl Default for LargeKernel {
    fn default() -> Self {
        LargeKernel::DEFAULT
    }
}

/// Dense `out = A · Bᵀ` with 1×32 activation and 32×32 weight E8M0 scales,
/// by [`LargeKernel::DEFAULT`].
///
/// `a` `[M, K]` e4m3, `a_s` `[M, ⌈K/32⌉]`, `b` `[N, K]` e4m3, `b_s`
/// `[⌈N/32⌉, ⌈K/32⌉]`, `out` `[M, N]` BF16 or F32 (rounded once from the
/// fp32 accumulator). Errors: K == 0 or K % 16 != 0 (tensor `a`).
pub fn mxfp8_gemm(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    mxfp8_gemm_with(dev, a, a_s, b, b_s, out, LargeKernel::DEFAULT)
}

/// [`mxfp8_gemm`] by the chosen kernel version.
pub fn mxfp8_gemm_with(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
    version: LargeKernel,
) -> Result<()> {
    const OP: &str = "mxfp8_gemm";
    let (&[m, k], Some(&n)) = (a.shape(), b.shape().first()) else {
        return Err(rank_error(OP, a, "A [M, K] and B [N, K]"));
    };
    check_k(OP, "a", a, k, 16)?;
    let kernel = match (out.dtype(), version) {
        (DType::BF16, LargeKernel::V1) => kernels::gemm::MXFP8_GEMM_BF16,
        (DType::F32, LargeKernel::V1) => kernels::gemm::MXFP8_GEMM_F32,
        (DType::BF16, LargeKernel::V2) => kernels::gemm::MXFP8_GEMM_V2_BF16,
        (DType::F32, LargeKernel::V2) => kernels::gemm::MXFP8_GEMM_V2_F32,
        (got, _) => return Err(out_dtype_error(OP, got)),
    };
    let (m32, n32, k32) = (
        fit_i32(OP, "a", a, m)?,
        fit_i32(OP, "b", b, n)?,
        fit_i32(OP, "a", a, k)?,
    );
    if m == 0 || n == 0 {
        return Ok(());
    }
    let tiles = m.div_ceil(BLOCK_M) * n.div_ceil(BLOCK_N);
    fit_i32(OP, "out", out, tiles)?;
    let (ap, _ga) = read_ptr(a.cuda()?, dev);
    let (asp, _gas) = read_ptr(a_s.cuda()?, dev);
    let (bp, _gb) = read_ptr(b.cuda()?, dev);
    let (bsp, _gbs) = read_ptr(b_s.cuda()?, dev);
    let a_map = encode_u8(
        OP,
        "a",
        ap,
        &[k as u64, m as u64],
        &[k as u64],
        &[128, u32_param("BLOCK_M", BLOCK_M)?],
        Swizzle::B128,
    )?;
    let b_map = encode_u8(
        OP,
        "b",
        bp,
        &[k as u64, n as u64],
        &[k as u64],
        &[128, u32_param("BLOCK_N", BLOCK_N)?],
        Swizzle::B128,
    )?;
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_mx_gemm_params {
        a_map,
        b_map,
        a: ap,
        a_s: asp,
        b: bp,
        b_s: bsp,
        offsets: std::ptr::null(),
        out: op,
        m: m32,
        n: n32,
        k: k32,
        groups: 1,
    };
    run(dev, kernel, SMEM_FP8, tiles, &p)
}

/// Contiguous-grouped MoE GEMM with FP4 expert weights, by
/// [`LargeKernel::DEFAULT`]: rows `offsets[e]..offsets[e+1]` of `a` are
/// multiplied by expert `e`'s weights.
///
/// `a` `[T, K]` e4m3, `a_s` `[T, ⌈K/32⌉]`, `b` `[E, N, K]` packed e2m1,
/// `b_s` `[E, N, ⌈K/32⌉]` (one scale per output row and 32 of K), `offsets`
/// `[E+1]` I32 on the device, `out` `[T, N]` BF16 or F32. The kernel clamps
/// the offsets to `[0, T]` and makes them monotone, so garbage offsets stay in
/// bounds; rows outside every group (before `offsets[0]` or from
/// `offsets[E]` on) are not written. Experts with no rows cost nothing.
/// Errors: K == 0 or K % 32 != 0 (tensor `b`).
pub fn mxfp4_grouped_contiguous(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    offsets: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    mxfp4_grouped_contiguous_with(dev, a, a_s, b, b_s, offsets, out, LargeKernel::DEFAULT)
}

/// [`mxfp4_grouped_contiguous`] by the chosen kernel version.
#[allow(clippy::too_many_arguments)]
pub fn mxfp4_grouped_contiguous_with(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    offsets: &Tensor,
    out: &mut Tensor,
    version: LargeKernel,
) -> Result<()> {
    const OP: &str = "mxfp4_grouped_contiguous";
    let (&[t, k], &[e, n, ..]) = (a.shape(), b.shape()) else {
        return Err(rank_error(OP, a, "A [T, K] and B [E, N, K/2]"));
    };
    check_k(OP, "b", b, k, 32)?;
    let kernel = match (out.dtype(), version) {
        (DType::BF16, LargeKernel::V1) => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_BF16,
        (DType::F32, LargeKernel::V1) => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_F32,
        (DType::BF16, LargeKernel::V2) => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_V2_BF16,
        (DType::F32, LargeKernel::V2) => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_V2_F32,
        (got, _) => return Err(out_dtype_error(OP, got)),
    };
    let (t32, n32, k32) = (
        fit_i32(OP, "a", a, t)?,
        fit_i32(OP, "b", b, n)?,
        fit_i32(OP, "a", a, k)?,
    );
    let e32 = fit_i32(OP, "b", b, e)?;
    if t == 0 || n == 0 || e == 0 {
        return Ok(());
    }
    // Σ_e ⌈rows_e / 128⌉ ≤ T / 128 + E for any clamped, monotone offsets.
    let tiles_bound = (t / BLOCK_M + e) * n.div_ceil(BLOCK_N);
    fit_i32(OP, "out", out, tiles_bound)?;
    let (ap, _ga) = read_ptr(a.cuda()?, dev);
    let (asp, _gas) = read_ptr(a_s.cuda()?, dev);
    let (bp, _gb) = read_ptr(b.cuda()?, dev);
    let (bsp, _gbs) = read_ptr(b_s.cuda()?, dev);
    let (offp, _goff) = read_ptr(offsets.cuda()?, dev);
    let a_map = encode_u8(
        OP,
        "a",
        ap,
        &[k as u64, t as u64],
        &[k as u64],
        &[128, u32_param("BLOCK_M", BLOCK_M)?],
        Swizzle::B128,
    )?;
    let row_bytes = (k / 2) as u64;
    let b_map = encode_u8(
        OP,
        "b",
        bp,
        &[row_bytes, n as u64, e as u64],
        &[row_bytes, row_bytes * n as u64],
        &[64, u32_param("BLOCK_N", BLOCK_N)?, 1],
        Swizzle::None,
    )?;
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_mx_gemm_params {
        a_map,
        b_map,
        a: ap,
        a_s: asp,
        b: bp,
        b_s: bsp,
        offsets: offp as *const i32,
        out: op,
        m: t32,
        n: n32,
        k: k32,
        groups: e32,
    };
    run(dev, kernel, SMEM_FP4, tiles_bound, &p)
}

/// K must be positive and a multiple of `multiple` (TMA row strides).
fn check_k(
    op: &'static str,
    tensor: &'static str,
    t: &Tensor,
    k: usize,
    multiple: usize,
) -> Result<()> {
    if k == 0 || !k.is_multiple_of(multiple) {
        return Err(Error::Shape {
            op,
            tensor,
            got: t.shape().to_vec(),
            expected: format!(
                "K (last dimension) a positive multiple of {multiple}: the kernel loads rows \
                 with TMA, whose row stride must be a multiple of 16 bytes"
            ),
        });
    }
    Ok(())
}

/// The op validated the ranks first: this names a broken check.
fn rank_error(op: &'static str, a: &Tensor, expected: &str) -> Error {
    Error::Shape {
        op,
        tensor: "a",
        got: a.shape().to_vec(),
        expected: expected.into(),
    }
}

fn fit_i32(op: &'static str, tensor: &'static str, t: &Tensor, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape {
        op,
        tensor,
        got: t.shape().to_vec(),
        expected: format!("sizes and tile counts below 2^31 (got {v})"),
    })
}

fn out_dtype_error(op: &'static str, got: DType) -> Error {
    Error::DType {
        op,
        tensor: "out",
        got,
        expected: DType::BF16,
    }
}

/// Launches a persistent grid of at most one CTA per SM over `tiles` tiles
/// (an upper bound for the grouped kernel, whose surplus CTAs exit at once).
fn run(
    dev: &CudaDevice,
    kernel: KernelRef,
    smem: u32,
    tiles: usize,
    p: &di_mx_gemm_params,
) -> Result<()> {
    allow_smem(dev, kernel, smem)?;
    let grid = u32_param("grid", tiles.clamp(1, dev.sm_count()))?;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    launch(dev, kernel, cfg, p)
}
