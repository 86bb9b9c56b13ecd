//! The MoE glue around the grouped expert GEMMs (`v41-flash.md` §7): after
//! [`super::moe_route`] and [`super::moe_layout`], [`moe_permute`] lays the
//! tokens' rows and routing weights out in expert order, and
//! [`moe_combine`] sums each token's routed outputs in ascending expert id
//! (the order of its ids), from 0.0 in fp32, adds the shared expert last
//! and rounds once to BF16.
//!
//! Invariant: bitwise [`cpu_backend::moe::moe_combine`] per token, on
//! either device (the CUDA kernels gather exactly and sum in the same
//! order); entry `j = token · top_k + slot` of the layout's permutation. An
//! entry outside `0..T·top_k` is a typed error naming it: a CUDA kernel
//! skips and records it, and [`moe_permute`] / [`moe_combine`] read it back
//! (so they wait for their kernels), while the `_deferred` forms leave it
//! to [`DeviceChecks::verdict`] (one sync for a whole step).
//!
//! [`cpu_backend::moe::moe_combine`]: crate::cpu_backend::moe::moe_combine

use super::{DeviceChecks, common_device, shape_error};
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

/// Checks that `perm` is I32 `[N]` (N = T · top_k).
fn check_perm(op: &'static str, perm: &Tensor, n: usize) -> Result<()> {
    perm.expect_dtype(op, "permutation", DType::I32)?;
    if perm.shape() != [n] {
        return Err(shape_error(
            op,
            "permutation",
            perm,
            format!("[{n}] (T · top_k)"),
        ));
    }
    Ok(())
}

fn bad_entry(op: &'static str, j: Option<i32>) -> Error {
    Error::Argument {
        op,
        arg: "permutation",
        value: j.map_or_else(|| "?".into(), |j| j.to_string()),
        why: "entry outside 0..T·top_k",
    }
}

/// The error for the entry at `at` of a device `perm` a kernel found bad.
fn bad_entry_at(op: &'static str, perm: &Tensor, at: usize) -> Result<Error> {
    Ok(bad_entry(op, perm.to_vec::<i32>()?.get(at).copied()))
}

/// The permutation `perm` I32 `[N]` (N = T · top_k) as host indices, each
/// checked to be below N.
fn entries(op: &'static str, perm: &Tensor, n: usize) -> Result<Vec<usize>> {
    check_perm(op, perm, n)?;
    perm.as_slice::<i32>()?
        .iter()
        .map(|&j| {
            usize::try_from(j)
                .ok()
                .filter(|&j| j < n)
                .ok_or_else(|| bad_entry(op, Some(j)))
        })
        .collect()
}

/// Rows of BF16 `x` `[T, D]` and F32 routing `weights` `[T, top_k]` in the
/// order of `perm`: `x_perm[i] = x[perm[i] / top_k]`,
/// `w_perm[i] = weights[perm[i]]`; returns BF16 `[N, D]` and F32 `[N]`.
pub fn moe_permute(x: &Tensor, weights: &Tensor, perm: &Tensor) -> Result<(Tensor, Tensor)> {
    DeviceChecks::at_once(
        |c| moe_permute_deferred(x, weights, perm, c),
        |f| bad_entry_at(f.op, perm, f.at),
    )
}

/// [`moe_permute`] whose CUDA range check of `perm` is read later, by
/// [`DeviceChecks::verdict`] (no sync here; an entry out of range is
/// skipped and its rows left unwritten until then). The CPU checks at once.
// Without CUDA no kernel records into `checks`.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn moe_permute_deferred(
    x: &Tensor,
    weights: &Tensor,
    perm: &Tensor,
    checks: &mut DeviceChecks,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_permute";
    x.expect_dtype(OP, "x", DType::BF16)?;
    let (device, t, d, k, n) = permute_dims(OP, ("x", x), weights, perm)?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            check_perm(OP, perm, n)?;
            let mut xo = Tensor::empty(&x.device(), DType::BF16, &[n, d])?;
            let mut wo = Tensor::empty(&x.device(), DType::F32, &[n])?;
            let dims = (n, d, k);
            let slot = checks.slot(&dev, OP, "permutation")?;
            crate::cuda_backend::moe_permute(&dev, x, weights, perm, &mut xo, &mut wo, dims, slot)?;
            return Ok((xo, wo));
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let order = entries(OP, perm, n)?;
    let w = permuted_weights(&order, weights)?;
    let rows = permuted_rows(&order, k, d, x.as_slice::<bf16>()?);
    Ok((
        Tensor::from_vec(rows, &[t * k, d])?,
        Tensor::from_vec(w, &[t * k])?,
    ))
}

/// [`moe_permute`] of an FP8 1×32 quantisation: the e4m3 rows of `q`
/// `[T, D]` and their E8M0 scale rows `s` `[T, ⌈D/32⌉]` in the order of
/// `perm`, with the routing weights. Returns e4m3 `[N, D]`, E8M0
/// `[N, ⌈D/32⌉]` and F32 `[N]`: bitwise [`super::act_quant_fp8`] of
/// [`moe_permute`]'s rows when `(q, s)` is the quantisation of `x` (the
/// quantiser is per row), with one pass over half the bytes.
pub fn moe_permute_fp8(
    q: &Tensor,
    s: &Tensor,
    weights: &Tensor,
    perm: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    DeviceChecks::at_once(
        |c| moe_permute_fp8_deferred(q, s, weights, perm, c),
        |f| bad_entry_at(f.op, perm, f.at),
    )
}

/// [`moe_permute_fp8`] whose CUDA range check of `perm` is read later, as
/// [`moe_permute_deferred`]'s.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn moe_permute_fp8_deferred(
    q: &Tensor,
    s: &Tensor,
    weights: &Tensor,
    perm: &Tensor,
    checks: &mut DeviceChecks,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "moe_permute_fp8";
    q.expect_dtype(OP, "q", DType::F8E4M3)?;
    s.expect_dtype(OP, "s", DType::E8M0)?;
    let (device, t, d, k, n) = permute_dims(OP, ("q", q), weights, perm)?;
    let sd = d.div_ceil(crate::contract::MX_BLOCK);
    if s.shape() != [t, sd] {
        return Err(shape_error(
            OP,
            "s",
            s,
            format!("[{t}, {sd}] (one E8M0 scale per 32 of a row of q)"),
        ));
    }
    common_device(OP, &[("q", q), ("s", s)])?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            check_perm(OP, perm, n)?;
            let mut qo = Tensor::empty(&q.device(), DType::F8E4M3, &[n, d])?;
            let mut so = Tensor::empty(&q.device(), DType::E8M0, &[n, sd])?;
            let mut wo = Tensor::empty(&q.device(), DType::F32, &[n])?;
            let slot = checks.slot(&dev, OP, "permutation")?;
            crate::cuda_backend::moe_permute_fp8(
                &dev,
                (q, s),
                weights,
                perm,
                (&mut qo, &mut so),
                &mut wo,
                (n, d, sd, k),
                slot,
            )?;
            return Ok((qo, so, wo));
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let order = entries(OP, perm, n)?;
    let w = permuted_weights(&order, weights)?;
    let rows = permuted_rows(&order, k, d, q.as_slice::<E4M3>()?);
    let scales = permuted_rows(&order, k, sd, s.as_slice::<E8M0>()?);
    Ok((
        Tensor::from_vec(rows, &[n, d])?,
        Tensor::from_vec(scales, &[n, sd])?,
        Tensor::from_vec(w, &[n])?,
    ))
}

/// The checks both permutes share: `rows` (named `name`) `[T, D]`, F32
/// `weights` `[T, top_k]` with top_k ≥ 1, one device for the three; returns
/// (device, T, D, top_k, N = T · top_k).
fn permute_dims(
    op: &'static str,
    (name, rows): (&'static str, &Tensor),
    weights: &Tensor,
    perm: &Tensor,
) -> Result<(Device, usize, usize, usize, usize)> {
    weights.expect_dtype(op, "weights", DType::F32)?;
    let &[t, d] = rows.shape() else {
        return Err(shape_error(op, name, rows, "[T, D]".into()));
    };
    let &[wt, k] = weights.shape() else {
        return Err(shape_error(op, "weights", weights, "[T, top_k]".into()));
    };
    if wt != t || k == 0 {
        return Err(shape_error(
            op,
            "weights",
            weights,
            format!("[{t}, top_k >= 1]"),
        ));
    }
    let device = common_device(
        op,
        &[(name, rows), ("weights", weights), ("permutation", perm)],
    )?;
    let n = t.checked_mul(k).ok_or_else(|| {
        shape_error(
            op,
            "weights",
            weights,
            "[T, top_k] with T · top_k in usize".into(),
        )
    })?;
    Ok((device, t, d, k, n))
}

/// Row `order[i] / k` of the `[T, width]` rows `xs`, for every i.
fn permuted_rows<T: Copy>(order: &[usize], k: usize, width: usize, xs: &[T]) -> Vec<T> {
    order
        .iter()
        .flat_map(|&j| xs[j / k * width..(j / k + 1) * width].iter().copied())
        .collect()
}

/// `weights[order[i]]` for every i (F32 `weights`).
fn permuted_weights(order: &[usize], weights: &Tensor) -> Result<Vec<f32>> {
    let ws = weights.as_slice::<f32>()?;
    Ok(order.iter().map(|&j| ws[j]).collect())
}

/// The error of an expert id outside `0..n_experts`, for `op`.
pub(crate) fn bad_expert_id(op: &'static str, id: Option<i32>) -> Error {
    Error::Argument {
        op,
        arg: "ids",
        value: id.map_or_else(|| "?".into(), |id| id.to_string()),
        why: "an expert id outside 0..n_experts",
    }
}

/// Checks, for `op`, that every routed expert id of I32 `ids` (any shape)
/// lies in `0..n_experts`: on the CPU at once ([`bad_expert_id`]), on CUDA
/// by a kernel whose finding [`DeviceChecks::verdict`] reads later (the
/// ids never leave the device; a [`super::Failure`]'s `at` is the flat
/// position of the first bad id).
// Without CUDA no kernel records into `checks`.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn check_ids_deferred(
    op: &'static str,
    ids: &Tensor,
    n_experts: usize,
    checks: &mut DeviceChecks,
) -> Result<()> {
    ids.expect_dtype(op, "ids", DType::I32)?;
    match ids.device() {
        Device::Cpu => match ids
            .as_slice::<i32>()?
            .iter()
            .find(|&&v| usize::try_from(v).map_or(true, |v| v >= n_experts))
        {
            Some(&v) => Err(bad_expert_id(op, Some(v))),
            None => Ok(()),
        },
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let slot = checks.slot(&dev, op, "ids")?;
            crate::cuda_backend::check_ids(&dev, ids, ids.numel(), n_experts, slot)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(op, &d)),
    }
}

/// [`check_ids_deferred`] read at once (one sync on CUDA; the id is read
/// back only when one is bad).
pub fn check_ids(op: &'static str, ids: &Tensor, n_experts: usize) -> Result<()> {
    DeviceChecks::at_once(
        |c| check_ids_deferred(op, ids, n_experts, c),
        |f| Ok(bad_expert_id(op, ids.to_vec::<i32>()?.get(f.at).copied())),
    )
}

/// out[t] = BF16(Σ_slot routed[pos(t·top_k + slot)] + shared[t]) where
/// pos inverts `perm`: BF16 `routed` `[N, D]` in expert order, `shared`
/// `[T, D]`; returns BF16 `[T, D]`.
pub fn moe_combine(routed: &Tensor, perm: &Tensor, shared: &Tensor) -> Result<Tensor> {
    DeviceChecks::at_once(
        |c| moe_combine_deferred(routed, perm, shared, c),
        |f| bad_entry_at(f.op, perm, f.at),
    )
}

/// [`moe_combine`] whose CUDA range check of `perm` is read later, by
/// [`DeviceChecks::verdict`] (no sync here; an entry out of range is
/// skipped, leaving its token without that slot until then). The CPU
/// checks at once.
// Without CUDA no kernel records into `checks`.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn moe_combine_deferred(
    routed: &Tensor,
    perm: &Tensor,
    shared: &Tensor,
    checks: &mut DeviceChecks,
) -> Result<Tensor> {
    const OP: &str = "moe_combine";
    routed.expect_dtype(OP, "routed", DType::BF16)?;
    shared.expect_dtype(OP, "shared", DType::BF16)?;
    let &[t, d] = shared.shape() else {
        return Err(shape_error(OP, "shared", shared, "[T, D]".into()));
    };
    let &[n, rd] = routed.shape() else {
        return Err(shape_error(OP, "routed", routed, "[T · top_k, D]".into()));
    };
    if rd != d || t == 0 && n != 0 || t > 0 && (n == 0 || !n.is_multiple_of(t)) {
        return Err(shape_error(
            OP,
            "routed",
            routed,
            format!("[T · top_k, {d}] with T = {t}"),
        ));
    }
    let device = common_device(
        OP,
        &[
            ("routed", routed),
            ("permutation", perm),
            ("shared", shared),
        ],
    )?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            check_perm(OP, perm, n)?;
            let k = n.checked_div(t).unwrap_or(0);
            let mut out = Tensor::empty(&shared.device(), DType::BF16, &[t, d])?;
            let slot = checks.slot(&dev, OP, "permutation")?;
            crate::cuda_backend::moe_combine(
                &dev,
                routed,
                perm,
                shared,
                &mut out,
                (t, d, k),
                slot,
            )?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let order = entries(OP, perm, n)?;
    let mut pos = vec![0usize; n];
    for (i, &j) in order.iter().enumerate() {
        pos[j] = i;
    }
    let k = n.checked_div(t).unwrap_or(0);
    let (r, s) = (routed.as_slice::<bf16>()?, shared.as_slice::<bf16>()?);
    let mut out = Vec::with_capacity(t * d);
    for tok in 0..t {
        for x in 0..d {
            let acc = (0..k).fold(0.0f32, |acc, slot| {
                acc + r[pos[tok * k + slot] * d + x].to_f32()
            });
            out.push(bf16::from_f32(acc + s[tok * d + x].to_f32()));
        }
    }
    Tensor::from_vec(out, &[t, d])
}
