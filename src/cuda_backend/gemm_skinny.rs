//! Launches of the skinny (decode-size) block-scaled GEMMs
//! (`kernels-cuda/gemm_skinny/`): the dense MXFP8 GEMM for M ≤ 64 and the
//! masked FP8 × FP4 MoE GEMM (per-expert token slots plus a device count).
//!
//! Both compute `out[m, n] = Σ_kb (fp32 block sum of a·b over 32 of K) ·
//! a_s · b_s` with the numerics of `cpu_backend::gemm` up to the in-block
//! summation order (compare with `calc_diff`). The dense GEMM splits K over
//! CTAs when N alone gives too few 64-row tiles: each split writes fp32
//! partials to a workspace, and the splits are added in split order from
//! +0.0 — by a second kernel ([`SkinnyVersion::V1`]) or by the last CTA of
//! each output tile ([`SkinnyVersion::V2`], same sum). The split count is a
//! function of N and K only, so a row's result does not depend on M, and
//! repeated runs are bitwise identical.
//!
//! Two versions, both verified on the H200: V1 and V2 (fused split-K
//! reduction, M = 33..64 as two 32-token halves, masked MoE on a persistent
//! grid sized to the resident CTAs). Neither wins everywhere (bench of
//! 6600bd8), so the plain functions pick per shape ([`dense_version`],
//! [`masked_version`]); the `_with` functions take a version. For M ≤ 32 the
//! two versions give the same bits, so the switch keeps rows M-independent.
//!
//! Scratch: the split-K fp32 workspace and V2's ticket counters are the
//! per-stream buffers of `cuda_backend::scratch` (shared with the large GEMM's
//! split tiles), cached instead of allocated per call.
//!
//! Callers (the ops layer) have validated dtypes, shapes and devices; the
//! shapes are checked again here (cheaply) because the launch relies on them.
//! Kernel limits, returned as typed errors before any launch: K % 16 == 0
//! (16-byte row copies; FP4 rows of K / 2 bytes in 8-byte copies), M ≤ 64 for
//! the dense GEMM, dimensions that fit the kernels' 32-bit indices.

use super::params::{di_gemm_skinny_params, di_gemm_skinny_reduce_params, di_masked_v6_params};
use super::scratch::{self, Scratch};
use super::tma::{Swizzle, encode_u8};
use super::{i32_param, u32_param};
use super::{launch, read_ptr, resident_ctas, write_ptr};
use crate::device::{CudaBuffer, CudaDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;
use std::ffi::c_void;

/// Threads per CTA: one warpgroup (the sm_90a kernels issue wgmma on it).
const THREADS: u32 = 128;
/// Output features per CTA (wgmma's M side).
const TILE_N: usize = 64;
/// K per pipeline stage and per split unit.
const CHUNK_K: usize = 128;
/// Pipeline stages (`kStages` in gemm_skinny.cu); V2's dense 16- and
/// 32-token tiles run one fewer (`Layout::stages`).
const STAGES: u32 = 5;
/// CTAs the dense split-K aims for: two per SM of the H200 (132 SMs). A
/// constant, not the device's SM count, so the split (and the result bits)
/// is the same on every device.
const TARGET_CTAS: usize = 264;
/// Largest dense M (the token side of one wgmma).
pub const MAX_M: usize = 64;

/// Which kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkinnyVersion {
    /// The kernels verified on the H200: split-K summed by a second kernel,
    /// token tiles up to 64, masked grid (tiles, groups).
    V1,
    /// Split-K summed in the GEMM kernel by the last CTA of each output tile
    /// (atomic ticket; same split-order sum, so the same bits as V1 whenever
    /// the tiles agree); M = 33..64 as two 32-token halves (three CTAs per SM
    /// instead of two); masked MoE on a persistent grid of exactly the
    /// resident CTAs (no second wave), experts ranked as in V1, at most
    /// 32-token tiles.
    V2,
    /// Masked MoE only, max_m ≤ 16 ([`v3_layout`] says which shapes): units
    /// of 16 weight rows × all of K brought in by bulk copies, `mma.sync`
    /// with the e2m1 weights decoded in registers, K split over the CTA's 16
    /// warps and summed in warp order. The dense GEMM has no V3 (typed
    /// error).
    V3,
    /// MoE only (masked, and contiguous by
    /// [`mxfp4_grouped_contiguous_v6`]), N % 64 == 0, K % 256 == 0
    /// ([`v6_layout`]), an expert's rows in windows of 8 or 16: units of 64
    /// weight rows × all of K streamed in 16-block chunks by a producer
    /// warp, the e2m1 weights decoded to e4m3 in registers as the A operand
    /// of one `wgmma` per 32-deep block (no e4m3 → f16 conversions), K split
    /// over 4 warpgroups and summed in warpgroup order.
    V6,
}

/// A V3 masked launch ([`v3_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V3Launch {
    /// Token tile: 8 or 16.
    pub nt: u32,
    /// 16-row groups per unit: 1 or 2.
    pub groups: u32,
    /// Pipeline stages (units in shared memory).
    pub stages: usize,
    /// Dynamic shared memory bytes.
    pub smem: u32,
    /// Tokens staged as f16 (the `_f16` kernels) rather than e4m3.
    pub f16_tokens: bool,
}

/// The version [`mxfp8_gemm_skinny`] runs for `m` rows: V2 up to 8 rows (its
/// fused reduction saves the second launch: wq_a M = 1 8.7 µs vs 12.0, wkv
/// 7.5 vs 12.3), V1 above (V2's 16/32-token tiles measured slower: wq_a
/// M = 32 26.0 µs vs 11.6). Measured on the H200, bench of 6600bd8.
pub fn dense_version(m: usize) -> SkinnyVersion {
    if m <= 8 {
        SkinnyVersion::V2
    } else {
        SkinnyVersion::V1
    }
}

/// The V1/V2 choice of [`mxfp4_grouped_masked`] for `max_m` slots per
/// expert where V3 does not run (see there): V2 up to 16 (w2 at 16 tokens per expert 1804 µs vs 2479), V1 above (64
/// tokens: 3832 µs vs 4796). Measured on the H200, bench of 6600bd8.
pub fn masked_version(max_m: usize) -> SkinnyVersion {
    if max_m <= 16 {
        SkinnyVersion::V2
    } else {
        SkinnyVersion::V1
    }
}

/// Threads of a V3 masked CTA (16 warps) and its stage bound
/// (`skinny_v3::kThreads`, `kMaxStages` in gemm_skinny_v3.cu).
const V3_THREADS: u32 = 512;
const V3_MAX_STAGES: usize = 8;
/// The dynamic shared memory V3 may take: the sm_90 opt-in limit (232448)
/// less the 1 KiB of static shared memory ptxas reports for the V3 kernels.
const SMEM_LIMIT: usize = 230_400;

/// The V3 masked launch for `experts` × `max_m` tokens, N, K, or `None`
/// where V3 does not apply (max_m > 16, N % 16 != 0, K % 32 != 0, or fewer
/// than 2 stages fit). Units are 32 weight rows (two groups) when K ≤ 2560
/// and N % 32 == 0 (short rows: bigger units amortise the per-unit barrier
/// and reduction), else 16. The tokens are staged as f16 wherever that
/// leaves at least 2 stages (measured 1.4–2.4 % faster, 2026-12-01), else
/// as e4m3. The host twin of `skinny_v3::Layout`: barriers (8 × 8 B), the
/// E8M0 table (1 KiB), the expert list (4 B each, rounded to 16), the
/// tokens (nt × (K + 32) e4m3 or nt × (2K + 64) f16), their fp32 scales
/// (K/32 × nt × 4, rounded to 16), two partial buffers (2 × 16 warps × unit
/// rows × nt × 4), then the stages of unit rows × (K/2 + 16) + unit rows ×
/// K/32 (rounded to 16) bytes each.
pub fn v3_layout(experts: usize, max_m: usize, n: usize, k: usize) -> Option<V3Launch> {
    v3_layout_for(experts, max_m, n, k, true).or_else(|| v3_layout_for(experts, max_m, n, k, false))
}

fn v3_layout_for(experts: usize, max_m: usize, n: usize, k: usize, f16: bool) -> Option<V3Launch> {
    if max_m == 0 || max_m > 16 || !n.is_multiple_of(16) || !k.is_multiple_of(32) {
        return None;
    }
    let nt = if max_m <= 8 { 8 } else { 16 };
    let g = if k <= 2560 && n.is_multiple_of(32) {
        2
    } else {
        1
    };
    let rows = 16 * g;
    let kb = k / 32;
    let a16 = |v: usize| v.next_multiple_of(16);
    let fixed = 8 * V3_MAX_STAGES
        + 1024
        + a16(experts.checked_mul(4)?)
        + nt * if f16 { 2 * k + 64 } else { k + 32 }
        + a16(kb * nt * 4)
        + 2 * 16 * rows * nt * 4;
    let stage = rows * (k / 2 + 16) + a16(rows * kb);
    let stages = SMEM_LIMIT.checked_sub(fixed)? / stage;
    if stages < 2 {
        return None;
    }
    let stages = stages.min(V3_MAX_STAGES);
    Some(V3Launch {
        nt: u32::try_from(nt).ok()?,
        groups: u32::try_from(g).ok()?,
        stages,
        smem: u32::try_from(fixed + stages * stage).ok()?,
        f16_tokens: f16,
    })
}

/// Threads of a V6 masked CTA (16 consumer warps and a producer warp) and
/// its stage bound (`skinny_v6::kThreads`, `kMaxStages` in
/// gemm_skinny_v6.cu).
const V6_THREADS: u32 = 544;
const V6_MAX_STAGES: usize = 8;

/// A V6 masked launch ([`v6_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V6Launch {
    /// Token tile: 8 or 16.
    pub nt: u32,
    /// Pipeline stages (16-block chunks of a 64-row unit).
    pub stages: usize,
    /// Dynamic shared memory bytes.
    pub smem: u32,
}

/// The V6 launch for `experts` × `max_m` tokens (the masked layout; the
/// contiguous one asks at max_m 16 with T rows), N, K, or `None` where V6
/// does not apply (N % 64 != 0, K % 256 != 0, experts · N or experts ·
/// max_m ≥ 2^31 rows, or fewer than 2 stages fit). The token tile nt is 8
/// for max_m ≤ 8, else 16, and an expert's rows go in windows of nt, each a
/// work item. The host twin of `skinny_v6::Layout`, plus 1024 bytes of
/// slack for the kernel's 1024-byte alignment of its base: barriers (2 × 8
/// × 8 B), the E8M0 table (1 KiB), the per-expert table (3 × 4 B an expert,
/// rounded to 16), the tokens (nt × K e4m3, 1024-aligned), their fp32
/// scales (K/32 × nt × 4, rounded to 16), two partial buffers (2 × 4 × 64 ×
/// nt × 4), then (1024-aligned) the stages of two 64 × 128-byte TMA boxes +
/// 64 × 16 scale bytes.
pub fn v6_layout(experts: usize, max_m: usize, n: usize, k: usize) -> Option<V6Launch> {
    if max_m == 0 || !n.is_multiple_of(64) || !k.is_multiple_of(256) {
        return None;
    }
    // The TMA box's row coordinate is an i32: every row of b must have one;
    // the kernel numbers the masked rows of a and out (e · max_m + r) in
    // i32 too.
    if i32::try_from(experts.checked_mul(n)?).is_err()
        || i32::try_from(experts.checked_mul(max_m)?).is_err()
    {
        return None;
    }
    let nt = if max_m <= 8 { 8 } else { 16 };
    let a16 = |v: usize| v.next_multiple_of(16);
    let table = 16 * V6_MAX_STAGES + 1024;
    let act = (table + a16(experts.checked_mul(12)?)).next_multiple_of(1024);
    let fixed = (act + nt * k + a16(k / 32 * nt * 4) + 2 * 4 * 64 * nt * 4).next_multiple_of(1024);
    let stage = 2 * 64 * 128 + 64 * 16;
    let stages = SMEM_LIMIT.checked_sub(fixed + 1024)? / stage;
    if stages < 2 {
        return None;
    }
    let stages = stages.min(V6_MAX_STAGES);
    Some(V6Launch {
        nt: u32::try_from(nt).ok()?,
        stages,
        smem: u32::try_from(fixed + stages * stage + 1024).ok()?,
    })
}

/// Dense `out = A · Bᵀ` for M ≤ 64 with 1×32 activation and 32×32 weight
/// E8M0 scales: `a` `[M, K]` e4m3, `a_s` `[M, ⌈K/32⌉]` E8M0, `b` `[N, K]`
/// e4m3, `b_s` `[⌈N/32⌉, ⌈K/32⌉]` E8M0, `out` `[M, N]` BF16 or F32 (rounded
/// once from the fp32 accumulator), by the [`dense_version`] kernels.
/// Errors: K % 16 != 0 or M > 64 (tensor `a`).
pub fn mxfp8_gemm_skinny(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let version = dense_version(a.shape().first().copied().unwrap_or(0));
    mxfp8_gemm_skinny_with(dev, a, a_s, b, b_s, out, version)
}

/// [`mxfp8_gemm_skinny`] with K never split: one CTA sums an output tile's
/// whole K, its 32-blocks in K order, each through the tensor core into a
/// fresh fp32 tile folded by one fused multiply-add, as the large kernel
/// (`gemm::mxfp8_gemm`, whole tiles) does: the large kernel's bits at
/// M ≤ 64 (`GemmImpl::SkinnyWholeK`). Slower than the split launch where N
/// has few 64-row tiles (the batch-invariant mode pairs the split launch
/// with the large kernel cut alike instead).
pub fn mxfp8_gemm_skinny_whole_k(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let version = dense_version(a.shape().first().copied().unwrap_or(0));
    dense_launch(dev, a, a_s, b, b_s, out, version, true)
}

/// [`mxfp8_gemm_skinny`] by the kernels of `version`. Both versions split K
/// the same way ([`split_k`]) and add the splits in the same order.
pub fn mxfp8_gemm_skinny_with(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
    version: SkinnyVersion,
) -> Result<()> {
    dense_launch(dev, a, a_s, b, b_s, out, version, false)
}

/// The dense launch of `version`, K split by [`split_k`] or (`whole_k`)
/// never.
#[allow(clippy::too_many_arguments)]
fn dense_launch(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    out: &mut Tensor,
    version: SkinnyVersion,
    whole_k: bool,
) -> Result<()> {
    const OP: &str = "mxfp8_gemm_skinny";
    let (m, k) = dims2(OP, "a", a)?;
    let n = b.shape().first().copied().unwrap_or(0);
    let kb = k.div_ceil(32);
    expect(OP, "a", a, DType::F8E4M3, &[m, k])?;
    expect(OP, "a_s", a_s, DType::E8M0, &[m, kb])?;
    expect(OP, "b", b, DType::F8E4M3, &[n, k])?;
    expect(OP, "b_s", b_s, DType::E8M0, &[n.div_ceil(32), kb])?;
    let out_f32 = out_kind(OP, out)?;
    expect(OP, "out", out, out.dtype(), &[m, n])?;
    check_k(OP, a, k)?;
    if m > MAX_M {
        return Err(Error::Shape {
            op: OP,
            tensor: "a",
            got: a.shape().to_vec(),
            expected: format!("at most {MAX_M} rows (larger M is mxfp8_gemm's)"),
        });
    }
    fit_i32(OP, "b", b, n)?;
    fit_i32(OP, "a", a, k)?;
    fit_i32(OP, "out", out, m * n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    use kernels::gemm_skinny as ks;
    // V2 runs M = 33..64 as two 32-token halves.
    let (nt, halves) = match version {
        SkinnyVersion::V2 if m > 32 => (32, 2),
        _ => (token_tile(m), 1),
    };
    let kernel = match (version, nt) {
        (SkinnyVersion::V1, 8) => ks::MXFP8_GEMM_SKINNY_N8,
        (SkinnyVersion::V1, 16) => ks::MXFP8_GEMM_SKINNY_N16,
        (SkinnyVersion::V1, 32) => ks::MXFP8_GEMM_SKINNY_N32,
        (SkinnyVersion::V1, _) => ks::MXFP8_GEMM_SKINNY_N64,
        (SkinnyVersion::V2, 8) => ks::MXFP8_GEMM_SKINNY_V2_N8,
        (SkinnyVersion::V2, 16) => ks::MXFP8_GEMM_SKINNY_V2_N16,
        (SkinnyVersion::V2, _) => ks::MXFP8_GEMM_SKINNY_V2_N32,
        (SkinnyVersion::V3 | SkinnyVersion::V6, _) => {
            return Err(Error::Argument {
                op: OP,
                arg: "version",
                value: format!("{version:?}"),
                why: "V3 and V6 are masked-MoE kernels only; the dense GEMM runs V1 or V2",
            });
        }
    };
    let smem = smem_bytes(false, nt, version);
    let (splits, chunks_per_split) = if whole_k {
        (1, k.div_ceil(CHUNK_K))
    } else {
        split_k(n, k)
    };
    let tiles = n.div_ceil(TILE_N) * halves;

    let (ap, _ga) = read_ptr(buf(OP, "a", a)?, dev);
    let (asp, _gas) = read_ptr(buf(OP, "a_s", a_s)?, dev);
    let (bp, _gb) = read_ptr(buf(OP, "b", b)?, dev);
    let (bsp, _gbs) = read_ptr(buf(OP, "b_s", b_s)?, dev);
    let mut params = di_gemm_skinny_params {
        a: ap,
        a_scale: asp,
        b: bp,
        b_scale: bsp,
        counts: std::ptr::null(),
        out: std::ptr::null_mut(),
        m: i32_param("m", m)?,
        n: i32_param("n", n)?,
        k: i32_param("k", k)?,
        experts: 1,
        chunks_per_split: i32_param("chunks_per_split", chunks_per_split)?,
        out_f32: out_f32 as i32,
        workspace: std::ptr::null_mut(),
        tickets: std::ptr::null_mut(),
        token_halves: i32_param("halves", halves)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (u32_param("tiles", tiles)?, u32_param("splits", splits)?, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    dev.allow_dynamic_smem(kernel, smem)?;
    let out_buf = buf_mut(OP, "out", out)?;
    if splits == 1 {
        let (op, _go) = write_ptr(out_buf, dev);
        params.out = op;
        return launch(dev, kernel, cfg, &params);
    }
    // Split K: fp32 partials [splits, M, N] in the stream's cached workspace
    // (held locked until the launches are queued), summed in split order:
    // by V2's last CTA of each tile (a ticket a tile), or by V1's reduce
    // kernel.
    let count = m * n;
    let mut table = scratch::lock();
    let scratch = Scratch::of(&mut table, dev);
    if version == SkinnyVersion::V2 {
        let (ws, tickets) = scratch.workspace_and_tickets(dev, splits * count * 4, tiles * 4)?;
        let (wp, _gw) = write_ptr(ws, dev);
        let (tp, _gt) = write_ptr(tickets, dev);
        let (op, _go) = write_ptr(out_buf, dev);
        params.out = op;
        params.workspace = wp as *mut f32;
        params.tickets = tp as *mut u32;
        return launch(dev, kernel, cfg, &params);
    }
    let ws = scratch.workspace(dev, splits * count * 4)?;
    {
        let (wp, _gw) = write_ptr(ws, dev);
        params.out = wp;
        params.out_f32 = 1;
        launch(dev, kernel, cfg, &params)?;
    }
    let (wp, _gw) = read_ptr(ws, dev);
    let (op, _go) = write_ptr(out_buf, dev);
    let reduce = di_gemm_skinny_reduce_params {
        partials: wp as *const f32,
        out: op,
        count: count as i64,
        splits: i32_param("splits", splits)?,
        out_f32: out_f32 as i32,
    };
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("grid", count.div_ceil(256).clamp(1, 132 * 8))?,
            1,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, ks::MXFP8_GEMM_SKINNY_REDUCE, cfg, &reduce)
}

/// Masked MoE GEMM for decode, FP8 activations × FP4 expert weights: for
/// every expert e and row r < clamp(counts[e], 0, max_m),
/// `out[e, r, :] = A[e, r, :] · B[e]ᵀ`. Runs V6 where [`v6_layout`] takes
/// the shape (any max_m: windows of 16 tokens past 16), else V3 where [`v3_layout`] does and max_m ≤ 8 (or ≤ 16 for
/// K > 2560), else the [`masked_version`] kernels. V3 and V6 sum their K
/// blocks in other orders than V1/V2 and each other (calc_diff-equal, not
/// bitwise), so at the max_m where the choice changes a token's result may
/// change in its last bits; below and above that point it does not depend
/// on the batch.
///
/// `a` `[E, max_m, K]` e4m3, `a_s` `[E, max_m, ⌈K/32⌉]` E8M0, `b` `[E, N, K]`
/// packed e2m1, `b_s` `[E, N, ⌈K/32⌉]` E8M0 (one per output row per 32 of
/// K), `counts` `[E]` I32 on the device, `out` `[E, max_m, N]` BF16 or F32.
/// Rows at or beyond an expert's count are not written (their contents are
/// unspecified); experts with count 0 cost one count read per CTA. Errors:
/// K % 16 != 0 (tensor `a`).
pub fn mxfp4_grouped_masked(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    counts: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let dim = |t: &Tensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
    let (e, max_m, k, n) = (dim(a, 0), dim(a, 1), dim(a, 2), dim(b, 1));
    // V6 where it applies (N % 64, K % 256; past 16 tokens an expert in
    // windows of 16, each streaming the expert's weights again): at one EP-64 rank
    // (6 experts, bench of 2026-12-03, 5577deb) w13 34.1 / 36.3 µs at 1 / 8
    // tokens vs V3 44.3 / 46.0, w2 18.5 / 19.9 vs 30.7 / 33.8. Else V3 up
    // to 8 tokens per expert and, for K > 2560 (its 16-row units), up to
    // 16; else the V1/V2 rule. Bench of 2026-12-01 (d3f26b9): w1 1109 /
    // 1749 µs (V3, 1 / 16 tokens) vs V2 1865 / 1873; w2 1439 µs (V3, 1
    // token) vs V2 1721, but 2562 vs 1794 at 16.
    let version = if v6_layout(e, max_m, n, k).is_some() {
        SkinnyVersion::V6
    } else if v3_layout(e, max_m, n, k).is_some() && (max_m <= 8 || k > 2560) {
        SkinnyVersion::V3
    } else {
        masked_version(max_m)
    };
    mxfp4_grouped_masked_with(dev, a, a_s, b, b_s, counts, out, version)
}

/// [`mxfp4_grouped_masked`] by the kernels of `version`. The grid follows the
/// resident CTAs of the kernel on `dev` (occupancy × SMs): V1 as (tiles,
/// groups) with tiles × groups at most that (one wave where the tiles allow),
/// V2 as exactly that many persistent CTAs. Results do not depend on the
/// grid (no split-K here).
#[allow(clippy::too_many_arguments)]
pub fn mxfp4_grouped_masked_with(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    counts: &Tensor,
    out: &mut Tensor,
    version: SkinnyVersion,
) -> Result<()> {
    const OP: &str = "mxfp4_grouped_masked";
    let (e, max_m, k) = match *a.shape() {
        [e, m, k] => (e, m, k),
        _ => {
            return Err(Error::Shape {
                op: OP,
                tensor: "a",
                got: a.shape().to_vec(),
                expected: "[E, max_m, K]".into(),
            });
        }
    };
    let n = b.shape().get(1).copied().unwrap_or(0);
    let kb = k.div_ceil(32);
    expect(OP, "a", a, DType::F8E4M3, &[e, max_m, k])?;
    expect(OP, "a_s", a_s, DType::E8M0, &[e, max_m, kb])?;
    expect(OP, "b", b, DType::F4E2M1x2, &[e, n, k])?;
    expect(OP, "b_s", b_s, DType::E8M0, &[e, n, kb])?;
    expect(OP, "counts", counts, DType::I32, &[e])?;
    let out_f32 = out_kind(OP, out)?;
    expect(OP, "out", out, out.dtype(), &[e, max_m, n])?;
    check_k(OP, a, k)?;
    fit_i32(OP, "a", a, e)?;
    fit_i32(OP, "a", a, max_m)?;
    fit_i32(OP, "b", b, n)?;
    fit_i32(OP, "a", a, k)?;
    if e == 0 || max_m == 0 || n == 0 {
        return Ok(());
    }
    use kernels::gemm_skinny as ks;
    if version == SkinnyVersion::V6 {
        return launch_v6(
            dev,
            [a, a_s, b, b_s, counts],
            out,
            [e, max_m, n, k],
            out_f32,
            false,
        );
    }
    if version == SkinnyVersion::V3 {
        let Some(V3Launch {
            nt,
            groups: g,
            smem,
            f16_tokens,
            ..
        }) = v3_layout(e, max_m, n, k)
        else {
            return Err(Error::Shape {
                op: OP,
                tensor: "b",
                got: b.shape().to_vec(),
                expected: "for V3: max_m <= 16, N a multiple of 16, K a multiple of 32 and \
                           the tokens plus two 16-row stages within shared memory"
                    .into(),
            });
        };
        let kernel = match (f16_tokens, nt, g) {
            (false, 8, 1) => ks::MXFP4_GROUPED_MASKED_V3_N8,
            (false, _, 1) => ks::MXFP4_GROUPED_MASKED_V3_N16,
            (false, 8, _) => ks::MXFP4_GROUPED_MASKED_V3_N8_G2,
            (false, _, _) => ks::MXFP4_GROUPED_MASKED_V3_N16_G2,
            (true, 8, 1) => ks::MXFP4_GROUPED_MASKED_V3_N8_F16,
            (true, _, 1) => ks::MXFP4_GROUPED_MASKED_V3_N16_F16,
            (true, 8, _) => ks::MXFP4_GROUPED_MASKED_V3_N8_G2_F16,
            (true, _, _) => ks::MXFP4_GROUPED_MASKED_V3_N16_G2_F16,
        };
        dev.allow_dynamic_smem(kernel, smem)?;
        let ([ap, asp, bp, bsp, cp], op, _guards) =
            masked_ptrs((OP, "counts"), dev, [a, a_s, b, b_s, counts], out)?;
        let why = "V3 needs 16-byte aligned device buffers";
        check_aligned16(OP, why, &[("a", ap), ("b", bp), ("b_s", bsp)])?;
        let params = masked_params([ap, asp, bp, bsp], cp, op, [e, max_m, n, k], out_f32)?;
        // One CTA per SM; units (16 g rows of an active expert) split evenly.
        let units = e * (n / (16 * g as usize));
        let cfg = LaunchConfig {
            grid_dim: (u32_param("grid", dev.sm_count().min(units).max(1))?, 1, 1),
            block_dim: (V3_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        return launch(dev, kernel, cfg, &params);
    }
    let (cap, kernels) = match version {
        SkinnyVersion::V1 => (
            MAX_M,
            [
                ks::MXFP4_GROUPED_MASKED_N8,
                ks::MXFP4_GROUPED_MASKED_N16,
                ks::MXFP4_GROUPED_MASKED_N32,
                ks::MXFP4_GROUPED_MASKED_N64,
            ],
        ),
        SkinnyVersion::V2 | SkinnyVersion::V3 | SkinnyVersion::V6 => (
            32,
            [
                ks::MXFP4_GROUPED_MASKED_V2_N8,
                ks::MXFP4_GROUPED_MASKED_V2_N16,
                ks::MXFP4_GROUPED_MASKED_V2_N32,
                ks::MXFP4_GROUPED_MASKED_V2_N32,
            ],
        ),
    };
    let nt = token_tile(max_m.min(cap));
    // nt is a power of two in 8..=32 (token_tile).
    let kernel = kernels
        .get((nt.trailing_zeros() as usize).saturating_sub(3))
        .copied()
        .ok_or(Error::Argument {
            op: "gemm_skinny",
            arg: "token tile",
            value: nt.to_string(),
            why: "no kernel for this token tile",
        })?;
    let smem = smem_bytes(true, nt, version);
    let tiles = n.div_ceil(TILE_N);
    dev.allow_dynamic_smem(kernel, smem)?;
    let slots = resident_ctas(dev, kernel, THREADS, smem)?;
    let grid_dim = match version {
        SkinnyVersion::V1 => (
            u32_param("tiles", tiles)?,
            u32_param("grid", (slots / tiles).clamp(1, e))?,
            1,
        ),
        // Units: (expert, tile, block of nt rows); more CTAs would idle.
        SkinnyVersion::V2 | SkinnyVersion::V3 | SkinnyVersion::V6 => (
            u32_param("grid", slots.min(tiles * e * max_m.div_ceil(nt as usize)))?,
            1,
            1,
        ),
    };

    let ([ap, asp, bp, bsp, cp], op, _guards) =
        masked_ptrs((OP, "counts"), dev, [a, a_s, b, b_s, counts], out)?;
    let params = masked_params([ap, asp, bp, bsp], cp, op, [e, max_m, n, k], out_f32)?;
    let cfg = LaunchConfig {
        grid_dim,
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    launch(dev, kernel, cfg, &params)
}

/// The device addresses of a masked launch's `[a, a_s, b, b_s, counts]` and
/// `out`, with the guards that keep them valid: hold the guards across the
/// launch.
fn masked_ptrs<'a>(
    (op_name, last): (&'static str, &'static str),
    dev: &'a CudaDevice,
    ins: [&'a Tensor; 5],
    out: &'a mut Tensor,
) -> Result<([*const c_void; 5], *mut c_void, impl Sized + 'a)> {
    let names = ["a", "a_s", "b", "b_s", last];
    let mut ptrs = [std::ptr::null(); 5];
    let mut guards = Vec::with_capacity(5);
    for ((ptr, name), t) in ptrs.iter_mut().zip(names).zip(ins) {
        let (p, guard) = read_ptr(buf(op_name, name, t)?, dev);
        *ptr = p;
        guards.push(guard);
    }
    let (op, out_guard) = write_ptr(buf_mut(op_name, "out", out)?, dev);
    Ok((ptrs, op, (guards, out_guard)))
}

/// The 16-byte alignment that the V3 and V6 bulk copies, TMA boxes and
/// 16-byte token loads need of the named bases (`why` names the version in
/// the error).
fn check_aligned16(
    op: &'static str,
    why: &'static str,
    bases: &[(&'static str, *const c_void)],
) -> Result<()> {
    match bases
        .iter()
        .find(|(_, p)| !(*p as usize).is_multiple_of(16))
    {
        Some(&(arg, p)) => Err(Error::Argument {
            op,
            arg,
            value: format!("{p:p}"),
            why,
        }),
        None => Ok(()),
    }
}

/// The parameters of a masked launch (every version) from its buffers'
/// device addresses and `[E, max_m, N, K]`.
fn masked_params(
    [a, a_scale, b, b_scale]: [*const c_void; 4],
    counts: *const c_void,
    out: *mut c_void,
    [e, max_m, n, k]: [usize; 4],
    out_f32: bool,
) -> Result<di_gemm_skinny_params> {
    Ok(di_gemm_skinny_params {
        a,
        a_scale,
        b,
        b_scale,
        counts: counts as *const i32,
        out,
        m: i32_param("max_m", max_m)?,
        n: i32_param("n", n)?,
        k: i32_param("k", k)?,
        experts: i32_param("experts", e)?,
        chunks_per_split: 0,
        out_f32: out_f32 as i32,
        workspace: std::ptr::null_mut(),
        tickets: std::ptr::null_mut(),
        token_halves: 1,
    })
}

/// The V6 launch of [`mxfp4_grouped_masked_with`] (`contiguous` false:
/// `[a, a_s, b, b_s, counts]`, `[E, max_m, N, K]`) or of
/// [`mxfp4_grouped_contiguous_v6`] (true: offsets for counts, `[E, T, N,
/// K]`), shapes already checked against each other.
fn launch_v6(
    dev: &CudaDevice,
    ins: [&Tensor; 5],
    out: &mut Tensor,
    [e, m, n, k]: [usize; 4],
    out_f32: bool,
    contiguous: bool,
) -> Result<()> {
    use kernels::gemm_skinny as ks;
    let op_name = if contiguous {
        "mxfp4_grouped_contiguous_v6"
    } else {
        "mxfp4_grouped_masked"
    };
    let Some(V6Launch { nt, smem, .. }) = v6_layout(e, if contiguous { 16 } else { m }, n, k)
    else {
        return Err(Error::Shape {
            op: op_name,
            tensor: "b",
            got: ins[2].shape().to_vec(),
            expected: "for V6: N a multiple of 64, K a multiple of 256 and the per-expert \
                       table, tokens and two stages within shared memory"
                .into(),
        });
    };
    let kernel = match (contiguous, nt) {
        (true, _) => ks::MXFP4_GROUPED_CONTIGUOUS_V6,
        (false, 8) => ks::MXFP4_GROUPED_MASKED_V6_N8,
        (false, _) => ks::MXFP4_GROUPED_MASKED_V6_N16,
    };
    dev.allow_dynamic_smem(kernel, smem)?;
    let last = if contiguous { "offsets" } else { "counts" };
    let ([ap, asp, bp, bsp, cp], op, _guards) = masked_ptrs((op_name, last), dev, ins, out)?;
    let why = "V6 needs 16-byte aligned device buffers";
    check_aligned16(op_name, why, &[("a", ap), ("b", bp), ("b_s", bsp)])?;
    let p = masked_params([ap, asp, bp, bsp], cp, op, [e, m, n, k], out_f32)?;
    // b as [E · N rows, K/2 bytes]: one box is a chunk's 64 rows × 128 bytes.
    let b_map = encode_u8(
        op_name,
        "b",
        bp,
        &[(k / 2) as u64, (e * n) as u64],
        &[(k / 2) as u64],
        &[128, 64],
        Swizzle::B128,
    )?;
    let params = di_masked_v6_params { b_map, p };
    // One CTA per SM; units (64 rows of an expert's window) split evenly.
    // Windows: at most E · ⌈max_m / nt⌉ masked, ⌈T / 16⌉ + E contiguous.
    let windows = if contiguous {
        m.div_ceil(16) + e
    } else {
        e * m.div_ceil(nt as usize)
    };
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("grid", dev.sm_count().min(windows * (n / 64)).max(1))?,
            1,
            1,
        ),
        block_dim: (V6_THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    launch(dev, kernel, cfg, &params)
}

/// Whether [`mxfp4_grouped_contiguous_v6`] takes E experts of N × K on
/// `dev`: V6's shapes ([`v6_layout`] at 16 tokens) on an sm_90 device.
pub fn contiguous_v6_applies(dev: &CudaDevice, experts: usize, n: usize, k: usize) -> Result<bool> {
    Ok(dev.compute_capability()? == (9, 0) && v6_layout(experts, 16, n, k).is_some())
}

/// The FP4 grouped MoE GEMM in the contiguous layout by V6's windows of 16
/// rows: rows `offsets[e]..offsets[e+1]` of `a` times expert e's weights,
/// each output its own dot product in K order, so a row's bits depend on
/// its own values only, not on the other rows, the batch or the layout (the
/// masked V6 gives the same bits on the same rows). The batch-invariant
/// mode's routed experts run it (`ops::mxfp4_grouped_contiguous_into` on a
/// batch-invariant device where [`contiguous_v6_applies`]).
///
/// `a` `[T, K]` e4m3, `a_s` `[T, ⌈K/32⌉]` E8M0, `b` `[E, N, K]` packed
/// e2m1, `b_s` `[E, N, ⌈K/32⌉]` E8M0 (one per output row per 32 of K),
/// `offsets` `[E + 1]` I32 on the device (clamped to `[0, T]` and made
/// monotone on the device, as the contiguous kernel does, so garbage stays
/// in bounds), `out` `[T, N]` BF16 or F32; rows outside every group are not
/// written. Errors: a shape V6 does not take (tensor `b`), a device other
/// than sm_90 (unsupported).
pub fn mxfp4_grouped_contiguous_v6(
    dev: &CudaDevice,
    a: &Tensor,
    a_s: &Tensor,
    b: &Tensor,
    b_s: &Tensor,
    offsets: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    const OP: &str = "mxfp4_grouped_contiguous_v6";
    let (t, k) = match *a.shape() {
        [t, k] => (t, k),
        _ => {
            return Err(Error::Shape {
                op: OP,
                tensor: "a",
                got: a.shape().to_vec(),
                expected: "[T, K]".into(),
            });
        }
    };
    let (e, n) = match *b.shape() {
        [e, n, _] => (e, n),
        _ => {
            return Err(Error::Shape {
                op: OP,
                tensor: "b",
                got: b.shape().to_vec(),
                expected: "[E, N, K]".into(),
            });
        }
    };
    let kb = k.div_ceil(32);
    expect(OP, "a", a, DType::F8E4M3, &[t, k])?;
    expect(OP, "a_s", a_s, DType::E8M0, &[t, kb])?;
    expect(OP, "b", b, DType::F4E2M1x2, &[e, n, k])?;
    expect(OP, "b_s", b_s, DType::E8M0, &[e, n, kb])?;
    expect(OP, "offsets", offsets, DType::I32, &[e + 1])?;
    let out_f32 = out_kind(OP, out)?;
    expect(OP, "out", out, out.dtype(), &[t, n])?;
    check_k(OP, a, k)?;
    fit_i32(OP, "a", a, t)?;
    fit_i32(OP, "b", b, e + 1)?;
    fit_i32(OP, "b", b, n)?;
    fit_i32(OP, "a", a, k)?;
    if dev.compute_capability()? != (9, 0) {
        return Err(Error::Unsupported {
            op: OP,
            device: dev.to_string(),
            why: "V6 over the contiguous layout is written for sm_90a only",
        });
    }
    if t == 0 || e == 0 || n == 0 {
        return Ok(());
    }
    launch_v6(
        dev,
        [a, a_s, b, b_s, offsets],
        out,
        [e, t, n, k],
        out_f32,
        true,
    )
}

/// The K split of the dense GEMM: `(splits, chunks_per_split)` in 128-deep
/// chunks, from N and K only. Enough splits for about [`TARGET_CTAS`] CTAs,
/// at most one per chunk, and no empty split.
pub fn split_k(n: usize, k: usize) -> (usize, usize) {
    let chunks = k.div_ceil(CHUNK_K);
    if chunks == 0 {
        return (1, 1);
    }
    let want = TARGET_CTAS
        .div_ceil(n.div_ceil(TILE_N).max(1))
        .clamp(1, chunks);
    let per = chunks.div_ceil(want);
    (chunks.div_ceil(per), per)
}

/// The token tile (wgmma N) holding `rows` rows: 8, 16, 32 or 64.
fn token_tile(rows: usize) -> u32 {
    match rows {
        0..=8 => 8,
        9..=16 => 16,
        17..=32 => 32,
        _ => 64,
    }
}

/// Dynamic shared memory of a launch; the host twin of `Layout` in
/// gemm_skinny.cu: per stage the weight tile (e4m3 64 × 128 B, or raw FP4
/// 64 × 64 B), the token tile (nt × 128 B) and the fp32 scales (4 × 64 and
/// 4 × nt); V1 rounds each stage to 1024 bytes, V2 keeps the scales of all
/// stages in one ring after the stages (rounded once) and gives the dense
/// 16- and 32-token tiles 4 stages; FP4 adds one decoded 64 × 128 B tile;
/// plus 1024 bytes to align the base. gemm_skinny.cu `static_assert`s the
/// resulting sizes (dense V1 n8..n64 57344, 62464, 72704, 93184; FP4 V1
/// 45056, 50176, 60416, 80896; dense V2 n8..n32 53248, 47104, 56320; FP4 V2
/// 40960, 47104, 58368), and [`tests::smem_matches_the_kernel_layout`] the
/// same numbers here.
#[allow(
    clippy::cast_possible_truncation,
    reason = "TILE_N is the constant 128"
)]
fn smem_bytes(fp4: bool, nt: u32, version: SkinnyVersion) -> u32 {
    let x_off = if fp4 { 4096 } else { 8192 };
    let data = x_off + nt * 128;
    let scales = 4 * TILE_N as u32 * 4 + 16 * nt;
    let decoded = if fp4 { 8192 } else { 0 };
    match version {
        SkinnyVersion::V1 => 1024 + STAGES * (data + scales).next_multiple_of(1024) + decoded,
        SkinnyVersion::V2 | SkinnyVersion::V3 | SkinnyVersion::V6 => {
            let stages = if !fp4 && nt >= 16 { STAGES - 1 } else { STAGES };
            1024 + (stages * (data + scales)).next_multiple_of(1024) + decoded
        }
    }
}

fn dims2(op: &'static str, name: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((r, c)),
        _ => Err(Error::Shape {
            op,
            tensor: name,
            got: t.shape().to_vec(),
            expected: "[M, K]".into(),
        }),
    }
}

fn expect(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    dtype: DType,
    shape: &[usize],
) -> Result<()> {
    t.expect_dtype(op, name, dtype)?;
    if t.shape() != shape {
        return Err(Error::Shape {
            op,
            tensor: name,
            got: t.shape().to_vec(),
            expected: format!("{shape:?}"),
        });
    }
    Ok(())
}

fn check_k(op: &'static str, a: &Tensor, k: usize) -> Result<()> {
    if !k.is_multiple_of(16) {
        return Err(Error::Shape {
            op,
            tensor: "a",
            got: a.shape().to_vec(),
            expected: "K (the last dimension) a multiple of 16".into(),
        });
    }
    Ok(())
}

fn fit_i32(op: &'static str, name: &'static str, t: &Tensor, v: usize) -> Result<()> {
    if v > i32::MAX as usize {
        return Err(Error::Shape {
            op,
            tensor: name,
            got: t.shape().to_vec(),
            expected: format!("dimensions whose products stay below 2^31 (got {v})"),
        });
    }
    Ok(())
}

/// Whether `out` is F32 (else BF16).
fn out_kind(op: &'static str, out: &Tensor) -> Result<bool> {
    match out.dtype() {
        DType::F32 => Ok(true),
        DType::BF16 => Ok(false),
        got => Err(Error::DType {
            op,
            tensor: "out",
            got,
            expected: DType::BF16,
        }),
    }
}

fn buf<'t>(op: &'static str, name: &'static str, t: &'t Tensor) -> Result<&'t CudaBuffer> {
    t.cuda().map_err(|_| not_on_gpu(op, name, t))
}

fn buf_mut<'t>(
    op: &'static str,
    name: &'static str,
    t: &'t mut Tensor,
) -> Result<&'t mut CudaBuffer> {
    if t.cuda().is_err() {
        return Err(not_on_gpu(op, name, t));
    }
    t.cuda_mut().map_err(|_| Error::DeviceMismatch {
        op,
        tensor: name,
        got: "host memory".into(),
        expected: "a CUDA device".into(),
    })
}

fn not_on_gpu(op: &'static str, name: &'static str, t: &Tensor) -> Error {
    Error::DeviceMismatch {
        op,
        tensor: name,
        got: format!("{:?}", t.device()),
        expected: "a CUDA device".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::{SkinnyVersion, V3Launch, V6Launch, smem_bytes, v3_layout, v6_layout};

    /// V3's carve-up at the bench shapes (gemm_skinny_v3.cu's `Layout`), and
    /// the shapes it refuses.
    #[test]
    fn v3_layout_at_the_moe_shapes() {
        let l = |nt, groups, stages, smem, f16_tokens| {
            Some(V3Launch {
                nt,
                groups,
                stages,
                smem,
                f16_tokens,
            })
        };
        // w1 (2304 × 5120): 16-row units; f16 tokens (2 stages) at ≤ 8
        // tokens, e4m3 (2 stages) at 16, where f16 leaves none.
        assert_eq!(v3_layout(384, 1, 2304, 5120), l(8, 1, 2, 194_112, true));
        assert_eq!(v3_layout(384, 16, 2304, 5120), l(16, 1, 2, 215_616, false));
        // w2 (5120 × 2304): 32-row units, f16 tokens.
        assert_eq!(v3_layout(384, 4, 5120, 2304), l(8, 2, 3, 194_112, true));
        assert_eq!(v3_layout(384, 16, 5120, 2304), l(16, 2, 2, 226_880, true));
        assert_eq!(v3_layout(384, 17, 5120, 2304), None);
        assert_eq!(v3_layout(4, 8, 40, 64), None);
        assert_eq!(v3_layout(4, 8, 64, 48), None);
    }

    /// V6's carve-up at the V4.1 expert shapes (gemm_skinny_v6.cu's
    /// `Layout`, worked by hand: barriers 128 B + E8M0 table 1 KiB + the
    /// per-expert table of 12 B an expert, tokens 1024-aligned, token
    /// scales, partials, stages 1024-aligned at 17408 B, plus 1 KiB of
    /// alignment slack), and the shapes it refuses.
    #[test]
    fn v6_layout_at_the_moe_shapes() {
        let l = |nt, stages, smem| Some(V6Launch { nt, stages, smem });
        // w13 (4608 × 5120), 6 experts, 8 tokens: table 72 B (tokens at
        // 2048), 40960 B of tokens, 5120 of scales, 16384 of partials:
        // stages at 64512; (230400 − 64512 − 1024) / 17408 = 9, capped at 8.
        assert_eq!(v6_layout(6, 8, 4608, 5120), l(8, 8, 204_800));
        // 384 experts, 16 tokens: the table takes 4608 B (tokens at 6144),
        // 81920 B of tokens, 10240 of scales, 32768 of partials: stages at
        // 131072, 5 of them. The table does not grow with the tokens: 256
        // or 4096 tokens an expert take the same (windows of 16).
        assert_eq!(v6_layout(384, 16, 4608, 5120), l(16, 5, 219_136));
        assert_eq!(v6_layout(384, 256, 4608, 5120), l(16, 5, 219_136));
        assert_eq!(v6_layout(384, 4096, 4608, 5120), l(16, 5, 219_136));
        // w2 (5120 × 2304), 6 experts, 1 token: stages at 39936, 8.
        assert_eq!(v6_layout(6, 1, 5120, 2304), l(8, 8, 180_224));
        // 17 tokens: windows of 16 (tokens at 2048), 36864 B of tokens,
        // 4608 of scales, 32768 of partials: stages at 76800, 8 of them.
        assert_eq!(v6_layout(6, 17, 5120, 2304), l(16, 8, 217_088));
        assert_eq!(v6_layout(6, 8, 4608 + 32, 5120), None);
        assert_eq!(v6_layout(6, 8, 4608, 2304 + 128), None);
        assert_eq!(v6_layout(6, 0, 4608, 5120), None);
        // b's rows (experts · N) must fit the TMA box's i32 row coordinate:
        // 10000 × 214720 do (the table takes 120000 B, tokens at 121856,
        // stages at 141312: 5 fit), 10000 × 214784 do not; and the masked
        // rows (experts · max_m) the kernel's i32 row numbers.
        assert_eq!(v6_layout(10_000, 8, 214_720, 256), l(8, 5, 229_376));
        assert_eq!(v6_layout(10_000, 8, 214_784, 256), None);
        assert_eq!(v6_layout(6, 357_913_941, 4608, 5120), l(16, 5, 215_040));
        assert_eq!(v6_layout(6, 357_913_942, 4608, 5120), None);
    }

    /// The sizes gemm_skinny.cu asserts for `Layout<..>::bytes`.
    #[test]
    fn smem_matches_the_kernel_layout() {
        let v1 = SkinnyVersion::V1;
        let v2 = SkinnyVersion::V2;
        let got: Vec<u32> = [8, 16, 32, 64]
            .iter()
            .map(|&nt| smem_bytes(false, nt, v1))
            .chain([8, 16, 32, 64].iter().map(|&nt| smem_bytes(true, nt, v1)))
            .chain([8, 16, 32].iter().map(|&nt| smem_bytes(false, nt, v2)))
            .chain([8, 16, 32].iter().map(|&nt| smem_bytes(true, nt, v2)))
            .collect();
        let want = [
            57344, 62464, 72704, 93184, 45056, 50176, 60416, 80896, 53248, 47104, 56320, 40960,
            47104, 58368,
        ];
        assert_eq!(got, want);
    }
}
