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
//! M ≤ 64 and the large (wgmma, TMA, warp-specialised) kernel above; the
//! threshold is checked by `benches/gemm_gpu.rs`, which times both kernels
//! at M = 64 (see [`SKINNY_MAX_M`]). [`mxfp4_grouped_contiguous`]
//! (prefill) runs the large kernel's grouped form, [`mxfp4_grouped_masked`]
//! (decode) the skinny kernel's. The BF16 linear calls cuBLAS (FP32 compute);
//! it is never hand-written.
//!
//! Batch invariance: within one kernel, each output element depends only on
//! its row of A and its row of W: no reduction across rows, and where the
//! skinny kernel splits K over CTAs the split is a function of N and K only
//! (partials added in split order). A row's result therefore does not change
//! with M or with the other rows, and repeated runs are bitwise identical.
//! The skinny and the large kernels sum in different orders, so results on
//! either side of the [`SKINNY_MAX_M`] threshold agree to `calc_diff`, not
//! bitwise; pin [`GemmImpl::Large`] (any M) where bitwise batch invariance
//! across that threshold matters. cuBLAS gives no such promise for the BF16
//! linear (its algorithm may change with M).
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

use super::{common_device, shape_error};
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0, Fp4x2};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const MXFP8_OP: &str = "mxfp8_linear";
const CONTIGUOUS_OP: &str = "mxfp4_grouped_contiguous";
const MASKED_OP: &str = "mxfp4_grouped_masked";
const BF16_OP: &str = "bf16_linear";

/// K elements per scale block (activations and weights), and output rows per
/// dense FP8 weight scale.
pub const GEMM_BLOCK: usize = 32;

/// Largest M for which [`GemmImpl::Auto`] runs the skinny kernel, and the
/// largest M [`GemmImpl::Skinny`] accepts. Measured at M = 64 on the H200
/// (bench of 6600bd8): the skinny kernel is faster on six of the eight
/// projections (wq_a 14.6 µs vs 38.5, wo_a 116 vs 253), the large one on
/// wq_b (26.5 vs 33.7) and the indexer wq_b (14.3 vs 15.1).
pub const SKINNY_MAX_M: usize = 64;

/// Which CUDA kernel runs [`mxfp8_linear_into`] (the CPU has one reference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmImpl {
    /// Skinny for M ≤ [`SKINNY_MAX_M`], large above.
    #[default]
    Auto,
    /// The wgmma kernel for any M (`kernels-cuda/gemm/`), in its default
    /// version (`cuda_backend::gemm::LargeKernel::DEFAULT`).
    Large,
    /// The skinny kernel; M ≤ [`SKINNY_MAX_M`] only.
    Skinny,
    /// The wgmma kernel, version 1 (`mx_gemm.cu`), for any M.
    LargeV1,
    /// The wgmma kernel, version 2 (`mx_gemm_v2.cu`), for any M.
    LargeV2,
}

impl GemmImpl {
    /// The kernel that runs for `m` rows: [`GemmImpl::Large`] or
    /// [`GemmImpl::Skinny`], or an error when `Skinny` is asked for more
    /// rows than it takes.
    fn resolve(self, op: &'static str, m: usize) -> Result<GemmImpl> {
        match self {
            GemmImpl::Auto if m <= SKINNY_MAX_M => Ok(GemmImpl::Skinny),
            GemmImpl::Auto => Ok(GemmImpl::Large),
            GemmImpl::Skinny if m > SKINNY_MAX_M => Err(Error::Argument {
                op,
                arg: "imp",
                value: format!("Skinny with M = {m}"),
                why: "the skinny kernel takes at most SKINNY_MAX_M = 64 rows",
            }),
            imp => Ok(imp),
        }
    }
}

/// Block-scaled FP8 linear: `a` `[M, K]` e4m3 with `a_s` `[M, ⌈K/32⌉]`,
/// `w` `[N, K]` e4m3 with `w_s` `[⌈N/32⌉, ⌈K/32⌉]`, all E8M0-scaled; returns
/// a new `[M, N]` tensor of `out_dtype` (BF16 or F32) on the inputs' device,
/// computed by the kernel [`GemmImpl::Auto`] picks.
pub fn mxfp8_linear(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    out_dtype: DType,
) -> Result<Tensor> {
    check_out_dtype(MXFP8_OP, "out_dtype", out_dtype)?;
    let (device, m, n, _) = validate_mxfp8(a, a_s, w, w_s)?;
    let mut out = Tensor::empty(&device, out_dtype, &[m, n])?;
    mxfp8_linear_into(a, a_s, w, w_s, &mut out, GemmImpl::Auto)?;
    Ok(out)
}

/// [`mxfp8_linear`] into a preallocated `out` (`[M, N]`, BF16 or F32, on
/// the inputs' device), with a chosen CUDA kernel (ignored on the CPU, but
/// [`GemmImpl::Skinny`] with M > [`SKINNY_MAX_M`] is an error everywhere).
pub fn mxfp8_linear_into(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    out: &mut Tensor,
    imp: GemmImpl,
) -> Result<()> {
    let (_, m, n, k) = validate_mxfp8(a, a_s, w, w_s)?;
    check_out(MXFP8_OP, out, &[m, n])?;
    let imp = imp.resolve(MXFP8_OP, m)?;
    let device = common_device(
        MXFP8_OP,
        &[("a", a), ("a_s", a_s), ("w", w), ("w_s", w_s), ("out", out)],
    )?;
    if m == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {
            let y = cpu_backend::fp8_gemm_f32(
                a.as_slice::<E4M3>()?,
                a_s.as_slice::<E8M0>()?,
                w.as_slice::<E4M3>()?,
                w_s.as_slice::<E8M0>()?,
                m,
                n,
                k,
            );
            store_rows(out, &y, &[(0, m * n)])
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => match imp {
            GemmImpl::Skinny => {
                crate::cuda_backend::gemm_skinny::mxfp8_gemm_skinny(&dev, a, a_s, w, w_s, out)
            }
            GemmImpl::LargeV1 | GemmImpl::LargeV2 => {
                let version = if imp == GemmImpl::LargeV1 {
                    crate::cuda_backend::gemm::LargeKernel::V1
                } else {
                    crate::cuda_backend::gemm::LargeKernel::V2
                };
                crate::cuda_backend::gemm::mxfp8_gemm_with(&dev, a, a_s, w, w_s, out, version)
            }
            _ => crate::cuda_backend::gemm::mxfp8_gemm(&dev, a, a_s, w, w_s, out),
        },
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = imp;
            Err(super::kernels_not_built(MXFP8_OP, &d))
        }
    }
}

/// FP4-expert grouped linear in the contiguous layout (MoE prefill): `a`
/// `[T, K]` e4m3 (rows grouped by expert) with `a_s` `[T, ⌈K/32⌉]`, `w`
/// `[E, N, K]` packed e2m1 with `w_s` `[E, N, ⌈K/32⌉]`, `offsets` I32
/// `[E + 1]` (0 = offsets[0] ≤ … ≤ offsets[E] = T; checked on the CPU,
/// clamped on CUDA, see the module doc). Returns a new `[T, N]` tensor of
/// `out_dtype` (BF16 or F32); row r of expert e is `a[r] · w[e]ᵀ`.
pub fn mxfp4_grouped_contiguous(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    offsets: &Tensor,
    out_dtype: DType,
) -> Result<Tensor> {
    check_out_dtype(CONTIGUOUS_OP, "out_dtype", out_dtype)?;
    let g = validate_contiguous(a, a_s, w, w_s, offsets)?;
    let mut out = Tensor::empty(&g.device, out_dtype, &[g.rows, g.n])?;
    mxfp4_grouped_contiguous_into(a, a_s, w, w_s, offsets, &mut out)?;
    Ok(out)
}

/// [`mxfp4_grouped_contiguous`] into a preallocated `out` (`[T, N]`, BF16
/// or F32, on the inputs' device). Rows outside every group are untouched.
pub fn mxfp4_grouped_contiguous_into(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    offsets: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let g = validate_contiguous(a, a_s, w, w_s, offsets)?;
    check_out(CONTIGUOUS_OP, out, &[g.rows, g.n])?;
    let device = grouped_device(
        CONTIGUOUS_OP,
        [a, a_s, w, w_s],
        ("offsets", offsets),
        Some(out),
    )?;
    match device {
        Device::Cpu => {
            let offsets = host_offsets(offsets, g.rows)?;
            if g.rows == 0 {
                return Ok(());
            }
            let y = cpu_backend::fp4_grouped_contiguous_f32(
                a.as_slice::<E4M3>()?,
                a_s.as_slice::<E8M0>()?,
                w.as_slice::<Fp4x2>()?,
                w_s.as_slice::<E8M0>()?,
                &offsets,
                g.n,
                g.k,
            );
            store_rows(out, &y, &[(0, g.rows * g.n)])
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) if g.rows > 0 => {
            crate::cuda_backend::gemm::mxfp4_grouped_contiguous(&dev, a, a_s, w, w_s, offsets, out)
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(_) => Ok(()),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(CONTIGUOUS_OP, &d)),
    }
}

/// FP4-expert grouped linear in the masked layout (MoE decode): `a`
/// `[E, max_m, K]` e4m3 with `a_s` `[E, max_m, ⌈K/32⌉]`, of which the first
/// `counts[e]` rows of expert e are valid; `w` `[E, N, K]` packed e2m1 with
/// `w_s` `[E, N, ⌈K/32⌉]`; `counts` I32 `[E]` (each in `0..=max_m`; checked
/// on the CPU, clamped on CUDA). Returns a new `[E, max_m, N]` tensor of
/// `out_dtype` (BF16 or F32) whose rows at or beyond `counts[e]` are
/// unspecified.
pub fn mxfp4_grouped_masked(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    counts: &Tensor,
    out_dtype: DType,
) -> Result<Tensor> {
    check_out_dtype(MASKED_OP, "out_dtype", out_dtype)?;
    let g = validate_masked(a, a_s, w, w_s, counts)?;
    let mut out = Tensor::empty(&g.device, out_dtype, &[g.experts, g.rows, g.n])?;
    mxfp4_grouped_masked_into(a, a_s, w, w_s, counts, &mut out)?;
    Ok(out)
}

/// [`mxfp4_grouped_masked`] into a preallocated `out` (`[E, max_m, N]`,
/// BF16 or F32, on the inputs' device). Rows at or beyond `counts[e]` are
/// not written.
pub fn mxfp4_grouped_masked_into(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    counts: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let g = validate_masked(a, a_s, w, w_s, counts)?;
    check_out(MASKED_OP, out, &[g.experts, g.rows, g.n])?;
    let device = grouped_device(MASKED_OP, [a, a_s, w, w_s], ("counts", counts), Some(out))?;
    match device {
        Device::Cpu => {
            let counts = host_counts(counts, g.rows)?;
            if g.rows == 0 {
                return Ok(());
            }
            let y = cpu_backend::fp4_grouped_masked_f32(
                a.as_slice::<E4M3>()?,
                a_s.as_slice::<E8M0>()?,
                w.as_slice::<Fp4x2>()?,
                w_s.as_slice::<E8M0>()?,
                &counts,
                g.rows,
                g.n,
                g.k,
            );
            let valid: Vec<(usize, usize)> = counts
                .iter()
                .enumerate()
                .map(|(e, &c)| (e * g.rows * g.n, (e * g.rows + c) * g.n))
                .collect();
            store_rows(out, &y, &valid)
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) if g.rows > 0 => crate::cuda_backend::gemm_skinny::mxfp4_grouped_masked(
            &dev, a, a_s, w, w_s, counts, out,
        ),
        #[cfg(deepinfer_cuda)]
        Device::Cuda(_) => Ok(()),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(MASKED_OP, &d)),
    }
}

/// BF16 linear: `a` `[M, K]` BF16 times `w` `[N, K]` BF16 transposed, fp32
/// accumulation, into a new `[M, N]` tensor of `out_dtype` (BF16, rounded
/// once, or F32). CPU: [`crate::cpu_backend::bf16_gemm`] /
/// [`crate::cpu_backend::f32_gemm`] (products summed in increasing k);
/// CUDA: cuBLAS `cublasGemmEx` with FP32 compute (its own summation order,
/// so the two agree to rounding, `calc_diff` < 1e-5, not bitwise).
pub fn bf16_linear(a: &Tensor, w: &Tensor, out_dtype: DType) -> Result<Tensor> {
    check_out_dtype(BF16_OP, "out_dtype", out_dtype)?;
    let (device, m, n, _) = validate_bf16(a, w)?;
    let mut out = Tensor::empty(&device, out_dtype, &[m, n])?;
    bf16_linear_into(a, w, &mut out)?;
    Ok(out)
}

/// [`bf16_linear`] into a preallocated `out` (`[M, N]`, BF16 or F32, on the
/// inputs' device).
pub fn bf16_linear_into(a: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
    let (_, m, n, k) = validate_bf16(a, w)?;
    check_out(BF16_OP, out, &[m, n])?;
    let device = common_device(BF16_OP, &[("a", a), ("w", w), ("out", out)])?;
    if m == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {
            let y = cpu_backend::f32_gemm(a.as_slice::<bf16>()?, w.as_slice::<bf16>()?, m, n, k);
            store_rows(out, &y, &[(0, m * n)])
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::blas::bf16_linear(&dev, a, w, out, m, n, k),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(BF16_OP, &d)),
    }
}

/// The (M, N, K) of a dense linear's `a` `[M, K]` and `w` `[N, K]`: K and N
/// at least 1, K the same in both.
fn linear_dims(op: &'static str, a: &Tensor, w: &Tensor) -> Result<(usize, usize, usize)> {
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

/// Checks the dtypes and shapes of a dense FP8 linear; returns the device
/// and (M, N, K).
fn validate_mxfp8(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
) -> Result<(Device, usize, usize, usize)> {
    const OP: &str = MXFP8_OP;
    a.expect_dtype(OP, "a", DType::F8E4M3)?;
    a_s.expect_dtype(OP, "a_s", DType::E8M0)?;
    w.expect_dtype(OP, "w", DType::F8E4M3)?;
    w_s.expect_dtype(OP, "w_s", DType::E8M0)?;
    let (m, n, k) = linear_dims(OP, a, w)?;
    let kb = k.div_ceil(GEMM_BLOCK);
    expect_act_scales(OP, a_s, &[m, kb])?;
    expect_shape(
        OP,
        "w_s",
        w_s,
        &[n.div_ceil(GEMM_BLOCK), kb],
        "(one E8M0 scale per 32 × 32 block of w)",
    )?;
    let device = common_device(OP, &[("a", a), ("a_s", a_s), ("w", w), ("w_s", w_s)])?;
    Ok((device, m, n, k))
}

/// A validated grouped FP4 GEMM: device, rows of `a` (T, or max_m for the
/// masked layout), experts, N, K.
struct Grouped {
    device: Device,
    rows: usize,
    experts: usize,
    n: usize,
    k: usize,
}

/// Checks the expert weights `w` `[E, N, K]` and `w_s` `[E, N, ⌈K/32⌉]` of
/// a grouped FP4 GEMM whose activations have `k` columns; returns (E, N).
fn validate_experts(
    op: &'static str,
    w: &Tensor,
    w_s: &Tensor,
    k: usize,
) -> Result<(usize, usize)> {
    w.expect_dtype(op, "w", DType::F4E2M1x2)?;
    w_s.expect_dtype(op, "w_s", DType::E8M0)?;
    let [e, n, wk] = dims(op, "w", w, "[E, N, K]")?;
    if wk != k || e == 0 || n == 0 {
        return Err(shape_error(
            op,
            "w",
            w,
            format!("[E, N, {k}] with E >= 1 and N >= 1 (K must match a's)"),
        ));
    }
    expect_shape(
        op,
        "w_s",
        w_s,
        &[e, n, k.div_ceil(GEMM_BLOCK)],
        "(one E8M0 scale per output row of each expert per 32 along K)",
    )?;
    Ok((e, n))
}

/// The one device of a grouped FP4 GEMM's `[a, a_s, w, w_s]`, its `layout`
/// tensor (offsets or counts) and, when given, `out`, checked in that order.
fn grouped_device(
    op: &'static str,
    [a, a_s, w, w_s]: [&Tensor; 4],
    layout: (&'static str, &Tensor),
    out: Option<&Tensor>,
) -> Result<Device> {
    let tensors = [
        ("a", a),
        ("a_s", a_s),
        ("w", w),
        ("w_s", w_s),
        layout,
        ("out", out.unwrap_or(a)),
    ];
    // Without `out`, the last entry (a stand-in) is cut off.
    common_device(op, &tensors[..5 + usize::from(out.is_some())])
}

/// FP4 weights pack two K elements per byte: K must be even (and nonzero).
fn check_fp4_k(op: &'static str, a: &Tensor, k: usize) -> Result<()> {
    if k == 0 || !k.is_multiple_of(2) {
        return Err(shape_error(
            op,
            "a",
            a,
            format!("an even K >= 2 (got K = {k}): the FP4 weights pack two K elements per byte"),
        ));
    }
    Ok(())
}

fn validate_contiguous(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    offsets: &Tensor,
) -> Result<Grouped> {
    const OP: &str = CONTIGUOUS_OP;
    a.expect_dtype(OP, "a", DType::F8E4M3)?;
    a_s.expect_dtype(OP, "a_s", DType::E8M0)?;
    offsets.expect_dtype(OP, "offsets", DType::I32)?;
    let [t, k] = dims(OP, "a", a, "[T, K]")?;
    check_fp4_k(OP, a, k)?;
    let (e, n) = validate_experts(OP, w, w_s, k)?;
    expect_act_scales(OP, a_s, &[t, k.div_ceil(GEMM_BLOCK)])?;
    expect_shape(
        OP,
        "offsets",
        offsets,
        &[e + 1],
        "(exclusive prefix sums of the rows per expert, E + 1 entries)",
    )?;
    if i32::try_from(t).is_err() {
        return Err(shape_error(
            OP,
            "a",
            a,
            "fewer than 2^31 rows (offsets are I32)".into(),
        ));
    }
    let device = grouped_device(OP, [a, a_s, w, w_s], ("offsets", offsets), None)?;
    Ok(Grouped {
        device,
        rows: t,
        experts: e,
        n,
        k,
    })
}

fn validate_masked(
    a: &Tensor,
    a_s: &Tensor,
    w: &Tensor,
    w_s: &Tensor,
    counts: &Tensor,
) -> Result<Grouped> {
    const OP: &str = MASKED_OP;
    a.expect_dtype(OP, "a", DType::F8E4M3)?;
    a_s.expect_dtype(OP, "a_s", DType::E8M0)?;
    counts.expect_dtype(OP, "counts", DType::I32)?;
    let [ae, max_m, k] = dims(OP, "a", a, "[E, max_m, K]")?;
    check_fp4_k(OP, a, k)?;
    let (e, n) = validate_experts(OP, w, w_s, k)?;
    if ae != e {
        return Err(shape_error(
            OP,
            "a",
            a,
            format!("[{e}, max_m, {k}] (one slab of rows per expert of w)"),
        ));
    }
    expect_act_scales(OP, a_s, &[e, max_m, k.div_ceil(GEMM_BLOCK)])?;
    expect_shape(OP, "counts", counts, &[e], "(valid rows per expert)")?;
    let device = grouped_device(OP, [a, a_s, w, w_s], ("counts", counts), None)?;
    Ok(Grouped {
        device,
        rows: max_m,
        experts: e,
        n,
        k,
    })
}

fn validate_bf16(a: &Tensor, w: &Tensor) -> Result<(Device, usize, usize, usize)> {
    const OP: &str = BF16_OP;
    a.expect_dtype(OP, "a", DType::BF16)?;
    w.expect_dtype(OP, "w", DType::BF16)?;
    let (m, n, k) = linear_dims(OP, a, w)?;
    let device = common_device(OP, &[("a", a), ("w", w)])?;
    Ok((device, m, n, k))
}

/// The dimensions of a tensor of rank `R`, each below 2^31 (kernels and
/// cuBLAS index with 32-bit ints).
fn dims<const R: usize>(
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
fn expect_act_scales(op: &'static str, a_s: &Tensor, shape: &[usize]) -> Result<()> {
    expect_shape(
        op,
        "a_s",
        a_s,
        shape,
        "(one E8M0 scale per row of a per 32 along K)",
    )
}

fn expect_shape(
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

fn check_out_dtype(op: &'static str, arg: &'static str, dtype: DType) -> Result<()> {
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
fn check_out(op: &'static str, out: &Tensor, shape: &[usize]) -> Result<()> {
    check_out_dtype(op, "out", out.dtype())?;
    out.expect_output(op, "out", out.dtype(), shape)
}

/// Reads and checks contiguous-layout offsets on the host: offsets[0] = 0,
/// non-decreasing, offsets[E] = `rows`.
fn host_offsets(offsets: &Tensor, rows: usize) -> Result<Vec<usize>> {
    let v = offsets.as_slice::<i32>()?;
    let bad = |value: String, why: &'static str| Error::Argument {
        op: CONTIGUOUS_OP,
        arg: "offsets",
        value,
        why,
    };
    if v[0] != 0 {
        return Err(bad(
            format!("offsets[0] = {}", v[0]),
            "the first offset must be 0",
        ));
    }
    for (i, p) in v.windows(2).enumerate() {
        if p[1] < p[0] {
            return Err(bad(
                format!(
                    "offsets[{}] = {} after offsets[{i}] = {}",
                    i + 1,
                    p[1],
                    p[0]
                ),
                "offsets must be non-decreasing",
            ));
        }
    }
    let last = v[v.len() - 1];
    if usize::try_from(last).ok() != Some(rows) {
        return Err(bad(
            format!(
                "offsets[{}] = {last} with T = {rows} rows of a",
                v.len() - 1
            ),
            "the last offset must equal the number of rows of a",
        ));
    }
    Ok(v.iter().map(|&o| o as usize).collect())
}

/// Reads and checks masked-layout counts on the host: each in `0..=max_m`.
fn host_counts(counts: &Tensor, max_m: usize) -> Result<Vec<usize>> {
    counts
        .as_slice::<i32>()?
        .iter()
        .enumerate()
        .map(|(e, &c)| match usize::try_from(c) {
            Ok(c) if c <= max_m => Ok(c),
            _ => Err(Error::Argument {
                op: MASKED_OP,
                arg: "counts",
                value: format!("counts[{e}] = {c} with max_m = {max_m}"),
                why: "every count must be in 0..=max_m",
            }),
        })
        .collect()
}

/// Writes the element ranges `ranges` (start, end) of the fp32 result `y`
/// into the same ranges of the host tensor `out` (F32 as is, BF16 rounded
/// once to nearest even); the rest of `out` is untouched.
fn store_rows(out: &mut Tensor, y: &[f32], ranges: &[(usize, usize)]) -> Result<()> {
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
