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
use crate::dtype::DType;
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
    weights.expect_dtype(OP, "weights", DType::F32)?;
    let &[t, d] = x.shape() else {
        return Err(shape_error(OP, "x", x, "[T, D]".into()));
    };
    let &[wt, k] = weights.shape() else {
        return Err(shape_error(OP, "weights", weights, "[T, top_k]".into()));
    };
    if wt != t || k == 0 {
        return Err(shape_error(
            OP,
            "weights",
            weights,
            format!("[{t}, top_k >= 1]"),
        ));
    }
    let device = common_device(OP, &[("x", x), ("weights", weights), ("permutation", perm)])?;
    let n = t.checked_mul(k).ok_or_else(|| {
        shape_error(
            OP,
            "weights",
            weights,
            "[T, top_k] with T · top_k in usize".into(),
        )
    })?;
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
    let (xs, ws) = (x.as_slice::<bf16>()?, weights.as_slice::<f32>()?);
    let rows: Vec<bf16> = order
        .iter()
        .flat_map(|&j| xs[j / k * d..(j / k + 1) * d].iter().copied())
        .collect();
    let w: Vec<f32> = order.iter().map(|&j| ws[j]).collect();
    Ok((
        Tensor::from_vec(rows, &[t * k, d])?,
        Tensor::from_vec(w, &[t * k])?,
    ))
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
