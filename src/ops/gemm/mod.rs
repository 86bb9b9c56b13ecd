//! The GEMMs of every linear layer (`v41-flash.md` §10.4, §10.6): the
//! block-scaled FP8 × FP8 dense linear, the FP4-expert × FP8 grouped MoE
//! linears (contiguous and masked layouts), and the BF16 linear. Each
//! computes `out[m, n] = Σ_k a[m, k] · w[n, k]` (A · Wᵀ, W stored `[out, in]`
//! like the checkpoint) into a BF16 or F32 output.
//!
//! Formats (row-major, all on one device):
//! - activations `a` `[M, K]` e4m3 with E8M0 scales `a_s` `[M, ⌈K/32⌉]`
//!   (1 × 32 blocks along K);
//! - dense FP8 weights `w` `[N, K]` e4m3 with E8M0 scales `w_s`
//!   `[⌈N/32⌉, ⌈K/32⌉]` (32 × 32 blocks);
//! - FP4 expert weights `w` `[E, N, K]` packed e2m1 (two per byte, the even
//!   element in the low nibble, so K is even) with E8M0 scales `w_s`
//!   `[E, N, ⌈K/32⌉]` (one per output row per 32 along K).
//!
//! Numerics (the contract of [`crate::cpu_backend::fp8_gemm`]): K is cut
//! into blocks of 32 from k = 0 (the last may be shorter); each block's
//! products are summed in fp32, multiplied by `a_s · w_s` and added to an
//! fp32 accumulator in increasing K order; an F32 output is that
//! accumulator, a BF16 output its one rounding to nearest even. The CPU sums
//! inside a block in increasing k; the tensor cores use their own in-block
//! order, so a GPU result equals the CPU result on the same quantised inputs
//! only to `calc_diff` (< 1e-3), not bitwise.
//!
//! Which CUDA kernel runs: [`mxfp8_linear`] takes [`GemmImpl::Auto`], which
//! picks the skinny (memory-bound, M ≤ [`SKINNY_MAX_M`]) kernel for
//! M ≤ 64 and the large (wgmma, TMA, warp-specialised) kernel above, with
//! the tiles of a part-filled last wave split over K ([`GemmImpl::LargeSplit`]);
//! the threshold is checked by `benches/gemm_gpu.rs`, which times both kernels
//! at M = 64 (see [`SKINNY_MAX_M`]). [`mxfp4_grouped_contiguous`]
//! (prefill) runs the large kernel's grouped form, [`mxfp4_grouped_masked`]
//! (decode) the skinny kernel's. The BF16 linear calls cuBLAS (FP32 compute);
//! it is never hand-written.
//!
//! Batch invariance: within the skinny kernel and [`GemmImpl::Large`], each
//! output element depends only on its row of A and its row of W: no
//! reduction across rows, and where the skinny kernel splits K over CTAs the
//! split is a function of N and K only (partials added in split order). A
//! row's result therefore does not change with M or with the other rows, and
//! repeated runs are bitwise identical. [`GemmImpl::LargeSplit`] chooses its
//! K split from the tile count, i.e. from M: repeated runs of one shape are
//! bitwise identical, but a row's last bits may change with M. The kernels
//! sum in different orders, so results across the [`SKINNY_MAX_M`] threshold
//! or the split agree to `calc_diff`, not bitwise. Unsplit, the two kernels
//! sum alike (each 32-block through the tensor core into a fresh tile,
//! folded by one fused multiply-add in K order), so the skinny kernel over
//! whole K ([`GemmImpl::SkinnyWholeK`]) gives [`GemmImpl::Large`]'s bits,
//! and the large kernel cut into the skinny kernel's split
//! ([`GemmImpl::LargeSkinnySplit`]) gives [`GemmImpl::Skinny`]'s: a
//! batch-invariant device ([`crate::Device::batch_invariant`]) resolves
//! `Auto` to the skinny kernel for M ≤ [`SKINNY_MAX_M`] (split as on any
//! device) and to the second pair's large kernel above.
//! The grouped FP4 GEMMs: on a batch-invariant CUDA device the contiguous
//! layout runs V6's 16-row windows (`gemm_skinny::mxfp4_grouped_contiguous_v6`,
//! the masked V6's bits) wherever V6 takes the expert shape on sm_90, by
//! shape alone. cuBLAS gives no such promise for the BF16 linear (its algorithm may
//! change with M).
//!
//! The CUDA launchers add their kernels' own limits, returned as typed
//! errors before any launch (`cuda_backend::gemm`, `cuda_backend::gemm_skinny`):
//! K a multiple of 16 for FP8 operands and of 32 for FP4 expert weights in
//! the contiguous kernel, 32-bit index ranges. The CPU takes any K (even
//! for FP4).
//!
//! Grouped layouts: `offsets` (contiguous, I32 `[E + 1]`, exclusive prefix
//! sums: expert e owns rows `offsets[e]..offsets[e + 1]`) and `counts`
//! (masked, I32 `[E]`, valid rows per expert) live on the inputs' device. On
//! the CPU they are read and validated (typed errors naming the bad value).
//! On CUDA they stay on the device and are not read by the host (no
//! synchronisation): the kernels clamp them (offsets to `[0, T]` and
//! non-decreasing, counts to `[0, max_m]`), so malformed values cannot
//! cause out-of-bounds accesses but give unspecified results. Experts with
//! no rows cost nothing. Output rows that belong to no group (contiguous) or
//! lie at or beyond `counts[e]` (masked) are not written: their contents are
//! unspecified (the CPU leaves them untouched too).
//!
//! An empty output (M = 0, T = 0 or max_m = 0) launches nothing.

mod bf16_linear;
mod dense;
mod grouped;

pub use bf16_linear::{bf16_linear, bf16_linear_into};
pub use dense::{mxfp8_linear, mxfp8_linear_into};
pub use grouped::{
    mxfp4_grouped_contiguous, mxfp4_grouped_contiguous_into, mxfp4_grouped_masked,
    mxfp4_grouped_masked_into,
};

use super::shape_error;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

/// Largest M for which [`GemmImpl::Auto`] runs the skinny kernel, and the
/// largest M [`GemmImpl::Skinny`] accepts. Measured at M = 64 on the H200
/// (bench of 6600bd8): the skinny kernel is faster on six of the eight
/// projections (wq_a 14.6 µs vs 38.5, wo_a 116 vs 253), the large one on
/// wq_b (26.5 vs 33.7) and the indexer wq_b (14.3 vs 15.1).
pub const SKINNY_MAX_M: usize = 64;

/// Which CUDA kernel runs [`mxfp8_linear_into`] (the CPU has one reference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmImpl {
    /// Skinny for M ≤ [`SKINNY_MAX_M`], [`GemmImpl::LargeSplit`] above; on
    /// a batch-invariant device ([`crate::Device::batch_invariant`])
    /// [`GemmImpl::Skinny`] for M ≤ [`SKINNY_MAX_M`] and
    /// [`GemmImpl::LargeSkinnySplit`] above, which sum every output the
    /// same way (the skinny kernel's K split, from N and K only).
    #[default]
    Auto,
    /// The wgmma kernel for any M (`kernels-cuda/gemm/`), every output tile
    /// on one CTA over all of K.
    Large,
    /// The wgmma kernel for any M with the tiles of a part-filled last wave
    /// of CTAs split over K (`cuda_backend::gemm::split_plan`); the CPU runs
    /// its one reference.
    LargeSplit,
    /// [`GemmImpl::LargeSplit`] that sums the four k32 steps of a 128-deep
    /// stage in the tensor core and promotes once wherever a consumer
    /// warpgroup's 64 rows and the tile's 32-row weight blocks carry one
    /// scale across the stage, which [`crate::ops::mx_share_scales`] makes
    /// common without changing a value (issue 13). The products are the
    /// same; their sum is the tensor core's over 128 of K instead of 32, so
    /// results agree with the other kernels to `calc_diff`, and a row's bits
    /// depend on the scales of the 63 rows that share its warpgroup: neither
    /// batch-invariant nor independent of the other rows. Not `Auto`'s
    /// choice until measured; the CPU runs its one reference.
    LargeShared,
    /// The skinny kernel; M ≤ [`SKINNY_MAX_M`] only.
    Skinny,
    /// The skinny kernel with K never split (one CTA sums a tile's whole
    /// K): each output has [`GemmImpl::Large`]'s bits at every M
    /// (`tests/cuda_gemm_ops.rs`); M ≤ [`SKINNY_MAX_M`] only.
    SkinnyWholeK,
    /// The wgmma kernel for any M with every output tile cut into the
    /// skinny kernel's K split (`gemm_skinny::split_k`, from N and K only),
    /// the pieces' fp32 partials added in order from +0.0 as the skinny
    /// kernel adds its splits: each output has [`GemmImpl::Skinny`]'s bits
    /// at every M (`tests/cuda_gemm_ops.rs`). What a batch-invariant device
    /// runs above [`SKINNY_MAX_M`]: the decode steps keep the split skinny
    /// launch, prefill pays the partials (launched in bands of rows that
    /// bound them to 256 MiB).
    LargeSkinnySplit,
}

impl GemmImpl {
    /// The kernel that runs for `m` rows on a device that is
    /// batch-invariant or not, or an error when a skinny kernel is asked
    /// for more rows than it takes.
    fn resolve(self, op: &'static str, m: usize, invariant: bool) -> Result<GemmImpl> {
        match self {
            GemmImpl::Auto if m <= SKINNY_MAX_M => Ok(GemmImpl::Skinny),
            GemmImpl::Auto if invariant => Ok(GemmImpl::LargeSkinnySplit),
            GemmImpl::Auto => Ok(GemmImpl::LargeSplit),
            GemmImpl::Skinny | GemmImpl::SkinnyWholeK if m > SKINNY_MAX_M => Err(Error::Argument {
                op,
                arg: "imp",
                value: format!("{self:?} with M = {m}"),
                why: "the skinny kernel takes at most SKINNY_MAX_M = 64 rows",
            }),
            imp => Ok(imp),
        }
    }
}

/// The (M, N, K) of a dense linear's `a` `[M, K]` and `w` `[N, K]`: K and N
/// at least 1, K the same in both.
pub(super) fn linear_dims(
    op: &'static str,
    a: &Tensor,
    w: &Tensor,
) -> Result<(usize, usize, usize)> {
    let [m, k] = dims(op, "a", a, "[M, K] with K >= 1")?;
    let [n, wk] = dims(op, "w", w, "[N, K] with N >= 1")?;
    if k == 0 {
        return Err(shape_error(op, "a", a, "[M, K] with K >= 1".into()));
    }
    if wk != k || n == 0 {
        return Err(shape_error(
            op,
            "w",
            w,
            format!("[N, {k}] with N >= 1 (K must match a's)"),
        ));
    }
    Ok((m, n, k))
}

/// The dimensions of a tensor of rank `R`, each below 2^31 (kernels and
/// cuBLAS index with 32-bit ints).
pub(super) fn dims<const R: usize>(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    expected: &str,
) -> Result<[usize; R]> {
    let d: [usize; R] = t
        .shape()
        .try_into()
        .map_err(|_| shape_error(op, name, t, format!("rank {R}: {expected}")))?;
    if d.iter().any(|&x| i32::try_from(x).is_err()) {
        return Err(shape_error(
            op,
            name,
            t,
            format!("{expected}, every dimension below 2^31"),
        ));
    }
    Ok(d)
}

/// `a_s`: one E8M0 scale per row of `a` per 32 along K, of `shape`.
pub(super) fn expect_act_scales(op: &'static str, a_s: &Tensor, shape: &[usize]) -> Result<()> {
    expect_shape(
        op,
        "a_s",
        a_s,
        shape,
        "(one E8M0 scale per row of a per 32 along K)",
    )
}

pub(super) fn expect_shape(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    shape: &[usize],
    why: &str,
) -> Result<()> {
    if t.shape() != shape {
        return Err(shape_error(op, name, t, format!("{shape:?} {why}")));
    }
    Ok(())
}

pub(super) fn check_out_dtype(op: &'static str, arg: &'static str, dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::BF16 | DType::F32) {
        return Err(Error::Argument {
            op,
            arg,
            value: format!("dtype {dtype}"),
            why: "the output dtype must be BF16 or F32",
        });
    }
    Ok(())
}

/// Checks an output tensor: BF16 or F32, of `shape`.
pub(super) fn check_out(op: &'static str, out: &Tensor, shape: &[usize]) -> Result<()> {
    check_out_dtype(op, "out", out.dtype())?;
    out.expect_output(op, "out", out.dtype(), shape)
}

/// Writes the element ranges `ranges` (start, end) of the fp32 result `y`
/// into the same ranges of the host tensor `out` (F32 as is, BF16 rounded
/// once to nearest even); the rest of `out` is untouched.
pub(super) fn store_rows(out: &mut Tensor, y: &[f32], ranges: &[(usize, usize)]) -> Result<()> {
    match out.dtype() {
        DType::F32 => {
            let o = out.as_mut_slice::<f32>()?;
            for &(s, e) in ranges {
                o[s..e].copy_from_slice(&y[s..e]);
            }
        }
        _ => {
            let o = out.as_mut_slice::<bf16>()?;
            for &(s, e) in ranges {
                for (d, &v) in o[s..e].iter_mut().zip(&y[s..e]) {
                    *d = bf16::from_f32(v);
                }
            }
        }
    }
    Ok(())
}
