//! The FP4-expert × FP8 grouped MoE linears in the contiguous (prefill) and
//! masked (decode) layouts: validation of the expert weights and the
//! offsets / counts, and dispatch (see the family doc in `mod.rs`).

use super::*;
use crate::contract::MX_BLOCK;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0, Fp4x2};
use crate::error::{Error, Result};
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;

pub(super) const CONTIGUOUS_OP: &str = "mxfp4_grouped_contiguous";

pub(super) const MASKED_OP: &str = "mxfp4_grouped_masked";

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
        // A batch-invariant device runs V6's windows of 16 rows where they
        // take the shape (a choice by shape only: the two kernels sum in
        // other orders, and each row's bits in either depend on that row
        // alone). V6's work follows the rows, where the contiguous
        // kernel's pads each expert to 128-row tiles: the decode steps the
        // mode is for run at the masked layout's speed, prefill slower
        // (V6 reads an expert's weights again for every 16 rows).
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev)
            if g.rows > 0
                && dev.batch_invariant()
                && crate::cuda_backend::gemm_skinny::contiguous_v6_applies(
                    &dev, g.experts, g.n, g.k,
                )? =>
        {
            crate::cuda_backend::gemm_skinny::mxfp4_grouped_contiguous_v6(
                &dev, a, a_s, w, w_s, offsets, out,
            )
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) if g.rows > 0 => {
            crate::cuda_backend::gemm::mxfp4_grouped_contiguous(&dev, a, a_s, w, w_s, offsets, out)
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(_) => Ok(()),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(CONTIGUOUS_OP, &d)),
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
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(MASKED_OP, &d)),
    }
}

/// A validated grouped FP4 GEMM: device, rows of `a` (T, or max_m for the
/// masked layout), experts, N, K.
pub(super) struct Grouped {
    device: Device,
    rows: usize,
    experts: usize,
    n: usize,
    k: usize,
}

/// Checks the expert weights `w` `[E, N, K]` and `w_s` `[E, N, ⌈K/32⌉]` of
/// a grouped FP4 GEMM whose activations have `k` columns; returns (E, N).
pub(super) fn validate_experts(
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
        &[e, n, k.div_ceil(MX_BLOCK)],
        "(one E8M0 scale per output row of each expert per 32 along K)",
    )?;
    Ok((e, n))
}

/// The one device of a grouped FP4 GEMM's `[a, a_s, w, w_s]`, its `layout`
/// tensor (offsets or counts) and, when given, `out`, checked in that order.
pub(super) fn grouped_device(
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
pub(super) fn check_fp4_k(op: &'static str, a: &Tensor, k: usize) -> Result<()> {
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

pub(super) fn validate_contiguous(
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
    expect_act_scales(OP, a_s, &[t, k.div_ceil(MX_BLOCK)])?;
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

pub(super) fn validate_masked(
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
    expect_act_scales(OP, a_s, &[e, max_m, k.div_ceil(MX_BLOCK)])?;
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

/// Reads and checks contiguous-layout offsets on the host: offsets[0] = 0,
/// non-decreasing, offsets[E] = `rows`.
pub(super) fn host_offsets(offsets: &Tensor, rows: usize) -> Result<Vec<usize>> {
    let v = offsets.as_slice::<i32>()?;
    let bad = |value: String, why: &'static str| Error::Argument {
        op: CONTIGUOUS_OP,
        arg: "offsets",
        value,
        why,
    };
    let (Some(&first), Some(&last)) = (v.first(), v.last()) else {
        return Err(bad("[]".into(), "offsets hold E + 1 ≥ 1 values"));
    };
    if first != 0 {
        return Err(bad(
            format!("offsets[0] = {first}"),
            "the first offset must be 0",
        ));
    }
    for (i, (&a, &b)) in v.iter().zip(v.iter().skip(1)).enumerate() {
        if b < a {
            return Err(bad(
                format!("offsets[{}] = {b} after offsets[{i}] = {a}", i + 1),
                "offsets must be non-decreasing",
            ));
        }
    }
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
pub(super) fn host_counts(counts: &Tensor, max_m: usize) -> Result<Vec<usize>> {
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
