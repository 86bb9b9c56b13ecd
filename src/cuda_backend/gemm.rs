//! Launches of the large-M block-scaled GEMMs (`kernels-cuda/gemm/`): the
//! dense MXFP8 GEMM and the contiguous-grouped FP8 × FP4 MoE GEMM.
//!
//! Both compute `out[m, n] = Σ_kb (fp32 block sum of a·b over 32 of K) ·
//! a_s · b_s` with the numerics of `cpu_backend::gemm` up to the in-block
//! summation order (compare with `calc_diff`). On sm_90a they run the
//! persistent TMA + wgmma kernel with per-32 promotion; on other archs the
//! same entry points run a SIMT path (see the family README).
//!
//! One kernel version is built (`mx_gemm.cu`, the measured winner: n64 wgmma
//! units in a 2-deep ring, prmt FP4 decode, banded tile order); version 1
//! (each k32 wgmma waited for, then promoted) left the build after the H200
//! bench (1.09–1.22× dense, 1.06–1.09× FP4 in favour of the winner); its
//! lab record is in `kernels-cuda/gemm/README.md`. The launchers are named
//! like their kernels (`mxfp8_gemm_{bf16,f32}`,
//! `mxfp4_grouped_contiguous_{bf16,f32}`).
//!
//! Callers (the ops layer) have validated dtypes, shapes and devices. These
//! functions check only the kernels' own limits and return typed errors for
//! them before launching: K > 0 and K % 16 == 0 (FP8 rows are TMA rows whose
//! stride must be a multiple of 16 bytes), K % 32 == 0 for FP4 weights (a
//! packed row is K / 2 bytes), sizes that fit the kernels' 32-bit indices,
//! and 16-byte aligned bases (tensors own whole allocations, so this holds).

use super::params::{di_mx_gemm_params, di_tensor_map};
use super::scratch::{self, Scratch};
use super::tma::{Swizzle, encode_u8};
use super::u32_param;
use super::{launch, read_ptr, write_ptr};
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
/// Dynamic shared memory of each kernel (static_asserted in mx_gemm.cu).
const SMEM_FP8: u32 = 210_472;
const SMEM_FP4: u32 = 226_444;

/// Most pieces one split tile is cut into: the last piece to finish reads
/// all of them (64 KiB of fp32 partials each) before it writes the tile.
pub const MAX_SPLITS: usize = 8;
/// Fewest 128-deep K stages in one piece of a split tile.
const MIN_PIECE_STAGES: usize = 2;

/// How the dense kernel covers its output tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileSplit {
    /// Every tile on one CTA over all of K: a row's result does not depend
    /// on M (batch invariance).
    Whole,
    /// The tiles of a part-filled last wave of CTAs split over K
    /// ([`split_plan`]): pieces on separate CTAs, their fp32 partials added
    /// in piece order by the last to finish. Deterministic for a given
    /// shape and SM count, but a row's bits may change with M.
    LastWave,
    /// Every tile in `splits` pieces of `stages_per_piece` 128-deep stages
    /// (the last piece shorter, none empty), their partials added in piece
    /// order from +0.0: the skinny kernel's K split
    /// (`gemm_skinny::split_k`, from N and K only), so each output has the
    /// skinny kernel's bits at every M (the batch-invariant mode). The
    /// partials of a launch are bounded by launching bands of rows. A
    /// typed error unless `splits` = ⌈⌈K/128⌉ / `stages_per_piece`⌉ and
    /// `chain` is off.
    Pieces {
        splits: usize,
        stages_per_piece: usize,
    },
}

/// The most fp32 partial bytes one [`TileSplit::Pieces`] launch writes;
/// more rows go in further launches of whole 128-row bands (a single band
/// of 128 rows may need more: N / 128 · splits · 64 KiB). The workspace
/// stays in the stream's scratch (`cuda_backend::scratch`) for later
/// launches.
const PIECES_WORKSPACE: usize = 256 << 20;

/// How the dense kernel runs: its tile split, and whether a consumer
/// warpgroup chains the four k32 steps of a stage whose scales are equal
/// over its rows and the tile's weight blocks (one promotion per 128 of K
/// there; `GemmImpl::LargeShared`). `chain` makes a row's bits depend on
/// the 63 rows sharing its warpgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DensePlan {
    pub split: TileSplit,
    pub chain: bool,
}

/// The dense kernel's split of `tiles` output tiles of `stages` 128-deep K
/// stages over `ctas` persistent CTAs: `(whole, splits)`, tiles `[0, whole)`
/// whole and each later tile in `splits` pieces. The tiles of the last wave
/// are split when it is at most half full, into as many pieces as fill the
/// CTAs (at most [`MAX_SPLITS`], at least `MIN_PIECE_STAGES` stages each);
/// otherwise `(tiles, 1)`.
pub fn split_plan(tiles: usize, stages: usize, ctas: usize) -> (usize, usize) {
    let rem = tiles % ctas.max(1);
    if rem == 0 {
        return (tiles, 1);
    }
    let splits = (ctas / rem).min(stages / MIN_PIECE_STAGES).min(MAX_SPLITS);
    if splits < 2 {
        return (tiles, 1);
    }
    (tiles - rem, splits)
}

/// Dense `out = A · Bᵀ` with 1×32 activation and 32×32 weight E8M0 scales.
///
/// `a` `[M, K]` e4m3, `a_s` `[M, ⌈K/32⌉]`, `b` `[N, K]` e4m3, `b_s`
/// `[⌈N/32⌉, ⌈K/32⌉]`, `out` `[M, N]` BF16 or F32 (rounded once from the
/// fp32 accumulator), run as `plan` says. Errors: K == 0 or K % 16 != 0
/// (tensor `a`).
pub fn mxfp8_gemm(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
    plan: DensePlan,
) -> Result<()> {
    const OP: &str = "mxfp8_gemm";
    let (&[m, k], Some(&n)) = (a.shape(), b.shape().first()) else {
        return Err(rank_error(OP, a, "A [M, K] and B [N, K]"));
    };
    check_k(OP, "a", a, k, 16)?;
    let kernel = match (out.dtype(), plan.chain) {
        (DType::BF16, false) => kernels::gemm::MXFP8_GEMM_BF16,
        (DType::F32, false) => kernels::gemm::MXFP8_GEMM_F32,
        (DType::BF16, true) => kernels::gemm::MXFP8_GEMM_CHAINED_BF16,
        (DType::F32, true) => kernels::gemm::MXFP8_GEMM_CHAINED_F32,
        (got, _) => return Err(out_dtype_error(OP, got)),
    };
    fit_i32(OP, "a", a, m)?;
    let (n32, k32) = (fit_i32(OP, "b", b, n)?, fit_i32(OP, "a", a, k)?);
    let tiles = m.div_ceil(BLOCK_M) * n.div_ceil(BLOCK_N);
    fit_i32(OP, "out", out, tiles)?;
    let stages = k.div_ceil(128);
    // (whole tiles, pieces a split tile, stages a piece or 0 for the even
    // split), and the rows a launch covers (all but for Pieces).
    let (whole, splits, per, band) = match plan.split {
        TileSplit::Whole => (tiles, 1, 0, m),
        TileSplit::LastWave => {
            let (whole, splits) = split_plan(tiles, stages, dev.sm_count());
            (whole, splits, 0, m)
        }
        TileSplit::Pieces {
            splits,
            stages_per_piece,
        } => {
            // Exactly the pieces that cover K, none empty: the skinny
            // kernel's split (`split_k` gives ceil(stages / per) pieces).
            if stages_per_piece == 0 || splits != stages.div_ceil(stages_per_piece) || plan.chain {
                return Err(Error::Argument {
                    op: OP,
                    arg: "plan",
                    value: format!(
                        "{splits} pieces of {stages_per_piece} stages for K = {k}, chain {}",
                        plan.chain
                    ),
                    why: "Pieces needs ceil(ceil(K / 128) / stages_per_piece) pieces (every \
                          stage in one, none empty) and no chained stages",
                });
            }
            fit_i32(OP, "out", out, splits)?;
            let per_block = n.div_ceil(BLOCK_N) * splits * BLOCK_M * BLOCK_N * 4;
            let band = (PIECES_WORKSPACE / per_block).max(1) * BLOCK_M;
            match splits {
                1 => (tiles, 1, 0, m),
                _ => (0, splits, stages_per_piece, band),
            }
        }
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (ap, _ga) = read_ptr(a.cuda()?, dev);
    let (asp, _gas) = read_ptr(a_s.cuda()?, dev);
    let (bp, _gb) = read_ptr(b.cuda()?, dev);
    let (bsp, _gbs) = read_ptr(b_s.cuda()?, dev);
    let b_map = k_major_map(OP, "b", bp, k, n)?;
    let out_dtype = out.dtype();
    let (whole32, splits32, per32) = (
        fit_i32(OP, "out", out, whole)?,
        fit_i32(OP, "out", out, splits)?,
        fit_i32(OP, "out", out, per)?,
    );
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    // Rows [r0, r0 + rows) of A, its scales and out, as one launch (a band
    // of a Pieces plan; the rows of a tile never change with the band, since
    // bands are whole 128-row blocks).
    for r0 in (0..m).step_by(band) {
        let rows = band.min(m - r0);
        let a0 = ap.wrapping_byte_add(r0 * k);
        // A plan with whole tiles has one band, so `whole` ≤ its tiles; a
        // Pieces plan has none.
        let band_tiles = rows.div_ceil(BLOCK_M) * n.div_ceil(BLOCK_N);
        let mut p = di_mx_gemm_params {
            a_map: k_major_map(OP, "a", a0, k, rows)?,
            b_map,
            a: a0,
            a_s: asp.wrapping_byte_add(r0 * k.div_ceil(32)),
            b: bp,
            b_s: bsp,
            offsets: std::ptr::null(),
            out: op.wrapping_byte_add(out_dtype.storage_bytes(r0 * n)),
            partials: std::ptr::null_mut(),
            tickets: std::ptr::null_mut(),
            m: fit_i32(OP, "a", a, rows)?,
            n: n32,
            k: k32,
            groups: 1,
            whole_tiles: whole32,
            splits: splits32,
            stages_per_piece: per32,
        };
        if splits == 1 {
            run(dev, kernel, SMEM_FP8, band_tiles, &p)?;
            continue;
        }
        // Split tiles: partials [split tiles, splits, 128 × 128] fp32 and
        // one ticket per split tile in the stream's scratch, held locked
        // until the launch is queued.
        let split_tiles = band_tiles - whole;
        let mut table = scratch::lock();
        let (ws, tickets) = Scratch::of(&mut table, dev).workspace_and_tickets(
            dev,
            split_tiles * splits * BLOCK_M * BLOCK_N * 4,
            split_tiles * 4,
        )?;
        let (wp, _gw) = write_ptr(ws, dev);
        let (tp, _gt) = write_ptr(tickets, dev);
        p.partials = wp as *mut f32;
        p.tickets = tp as *mut u32;
        run(dev, kernel, SMEM_FP8, whole + split_tiles * splits, &p)?;
    }
    Ok(())
}

/// Contiguous-grouped MoE GEMM with FP4 expert weights: rows `offsets[e]..offsets[e+1]` of `a` are
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
    const OP: &str = "mxfp4_grouped_contiguous";
    let (&[t, k], &[e, n, ..]) = (a.shape(), b.shape()) else {
        return Err(rank_error(OP, a, "A [T, K] and B [E, N, K/2]"));
    };
    check_k(OP, "b", b, k, 32)?;
    let kernel = match out.dtype() {
        DType::BF16 => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_BF16,
        DType::F32 => kernels::gemm::MXFP4_GROUPED_CONTIGUOUS_F32,
        got => return Err(out_dtype_error(OP, got)),
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
    let a_map = k_major_map(OP, "a", ap, k, t)?;
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
        partials: std::ptr::null_mut(),
        tickets: std::ptr::null_mut(),
        m: t32,
        n: n32,
        k: k32,
        groups: e32,
        whole_tiles: 0,
        splits: 1,
        stages_per_piece: 0,
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

/// Launches a persistent grid of at most one CTA per SM over `tiles` work
/// units (an upper bound for the grouped kernel, whose surplus CTAs exit at
/// once).
/// An e4m3 (or one-byte) matrix of `rows` rows of K bytes as the kernels'
/// TMA operand: a 2D uint8 map (K, rows), box 128 bytes × 128 rows,
/// 128-byte swizzle (`BLOCK_M` = `BLOCK_N` = 128).
const _: () = assert!(BLOCK_M == BLOCK_N);
fn k_major_map(
    op: &'static str,
    name: &'static str,
    base: *const std::ffi::c_void,
    k: usize,
    rows: usize,
) -> Result<di_tensor_map> {
    encode_u8(
        op,
        name,
        base,
        &[k as u64, rows as u64],
        &[k as u64],
        &[128, u32_param("BLOCK_M", BLOCK_M)?],
        Swizzle::B128,
    )
}

fn run(
    dev: &CudaDevice,
    kernel: KernelRef,
    smem: u32,
    tiles: usize,
    p: &di_mx_gemm_params,
) -> Result<()> {
    dev.allow_dynamic_smem(kernel, smem)?;
    let grid = u32_param("grid", tiles.clamp(1, dev.sm_count()))?;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    launch(dev, kernel, cfg, p)
}

#[cfg(test)]
mod tests {
    use super::{MAX_SPLITS, split_plan};

    #[test]
    fn split_plan_fills_the_last_wave_without_a_second_round() {
        // Worked cases on 132 CTAs: wq_a at M = 128 (10 tiles, 40 stages),
        // wq_a at M = 4096 (320 tiles: 2 waves + 56), wo_b at M = 512 (160:
        // 1 wave + 28), shared_w1_w3 at M = 512 (72 tiles: more than half a
        // wave, not split), whole waves, and K too short to split.
        assert_eq!(split_plan(10, 40, 132), (0, 8));
        assert_eq!(split_plan(320, 40, 132), (264, 2));
        assert_eq!(split_plan(160, 64, 132), (132, 4));
        assert_eq!(split_plan(72, 40, 132), (72, 1));
        assert_eq!(split_plan(264, 40, 132), (264, 1));
        assert_eq!(split_plan(6, 3, 132), (6, 1));
        assert_eq!(split_plan(6, 11, 132), (0, 5));
        for tiles in 1..600 {
            for stages in 1..70 {
                let (whole, splits) = split_plan(tiles, stages, 132);
                assert!(whole <= tiles && (1..=MAX_SPLITS).contains(&splits));
                if splits == 1 {
                    assert_eq!(whole, tiles);
                    continue;
                }
                // Whole waves first, then every piece on its own CTA, each
                // piece at least 2 stages.
                assert_eq!(whole % 132, 0, "{tiles} x {stages}");
                assert!((tiles - whole) * splits <= 132, "{tiles} x {stages}");
                assert!(stages / splits >= 2, "{tiles} x {stages}");
            }
        }
    }
}
