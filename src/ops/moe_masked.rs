//! The masked (fixed-capacity) MoE layout of the expert-parallel
//! low-latency mode, computed on the device with no host round trip, so the
//! mode can be captured in a CUDA graph:
//!
//! - [`moe_masked_layout_into`] ranks each routed entry within its expert
//!   (the number of earlier entries routed there) and gives it row
//!   `e · C + rank` of the `[E, C, ·]` buffers, or −1 past the capacity;
//! - [`moe_masked_scatter_into`] writes each placed entry's token row there
//!   (BF16, or FP8 e4m3 with 1 × 32 E8M0 scales, bitwise [`super::act_quant_fp8`]
//!   of the row);
//! - [`moe_masked_combine_into`] sums each token's expert rows in slot order
//!   and adds the shared expert, bitwise [`super::moe_combine`] with zero rows
//!   for the dropped entries.
//!
//! The row list `pos` is I32 `[M, top_k]` with `M ≥ T` (a buffer sized for
//! the most tokens a call may bring; only its first T rows are written and
//! read). A `pos` entry outside `0..E · C` is a dropped entry: the scatter
//! writes nothing for it and the combine adds 0.0, on both devices, so no
//! index from a tensor is used unchecked and nothing is read back. Dropped
//! entries are counted on the device, per expert and for ids outside
//! `0..E` (`dropped`); reading that count is the caller's choice.
//! Reference: [`crate::cpu_backend::moe_masked`].

use super::{common_device, shape_error};
use crate::contract::MX_BLOCK;
use crate::cpu_backend::moe_masked as reference;
use crate::device::Device;
use crate::dtype::{DType, E4M3, E8M0};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const LAYOUT_OP: &str = "moe_masked_layout";
const SCATTER_OP: &str = "moe_masked_scatter";
const COMBINE_OP: &str = "moe_masked_combine";

/// Checks that `pos` is I32 `[M, top_k]` with M ≥ `tokens`.
fn check_pos(op: &'static str, pos: &Tensor, tokens: usize, top_k: usize) -> Result<()> {
    pos.expect_dtype(op, "pos", DType::I32)?;
    match pos.shape() {
        &[m, k] if m >= tokens && k == top_k => Ok(()),
        _ => Err(shape_error(
            op,
            "pos",
            pos,
            format!("[M >= {tokens}, {top_k}]"),
        )),
    }
}

/// Rows of an `[E, C, ·]` buffer (E · C), which must fit int32.
fn buffer_rows(op: &'static str, name: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match t.shape() {
        &[e, c, ..] if e >= 1 && c >= 1 && i32::try_from(e.saturating_mul(c)).is_ok() => Ok((e, c)),
        _ => Err(shape_error(
            op,
            name,
            t,
            "[E >= 1, C >= 1, ...] with E · C < 2^31".into(),
        )),
    }
}

/// The masked layout of routed `ids` (I32 `[T, top_k]`, any values) with
/// their routing `weights` (F32 `[T, top_k]`): writes the first T rows of
/// `pos` (I32 `[M ≥ T, top_k]`, the row of each entry or −1), `counts` (I32
/// `[E]`, rows filled per expert), `w_out` (F32 `[E, C]`, each row's routing
/// weight, 0.0 past a count) and `dropped` (I32 `[E + 1]`: entries past each
/// expert's capacity, then entries with an id outside `0..E`). Within an
/// expert, entries keep ascending entry order (token, then slot), so the
/// layout depends on the ids alone.
pub fn moe_masked_layout_into(
    ids: &Tensor,
    weights: &Tensor,
    pos: &mut Tensor,
    counts: &mut Tensor,
    w_out: &mut Tensor,
    dropped: &mut Tensor,
) -> Result<()> {
    const OP: &str = LAYOUT_OP;
    ids.expect_dtype(OP, "ids", DType::I32)?;
    weights.expect_dtype(OP, "weights", DType::F32)?;
    let &[t, k] = ids.shape() else {
        return Err(shape_error(OP, "ids", ids, "[T, top_k]".into()));
    };
    if weights.shape() != [t, k] {
        return Err(shape_error(OP, "weights", weights, format!("[{t}, {k}]")));
    }
    check_pos(OP, pos, t, k)?;
    let (e, c) = buffer_rows(OP, "w_out", w_out)?;
    w_out.expect_output(OP, "w_out", DType::F32, &[e, c])?;
    counts.expect_output(OP, "counts", DType::I32, &[e])?;
    dropped.expect_output(OP, "dropped", DType::I32, &[e + 1])?;
    let n = t.checked_mul(k).filter(|&n| i32::try_from(n).is_ok());
    let Some(n) = n else {
        return Err(shape_error(
            OP,
            "ids",
            ids,
            "[T, top_k] with T · top_k < 2^31".into(),
        ));
    };
    let device = common_device(
        OP,
        &[
            ("ids", ids),
            ("weights", weights),
            ("pos", pos),
            ("counts", counts),
            ("w_out", w_out),
            ("dropped", dropped),
        ],
    )?;
    match device {
        Device::Cpu => {
            let l =
                reference::masked_layout(ids.as_slice::<i32>()?, weights.as_slice::<f32>()?, e, c);
            pos.as_mut_slice::<i32>()?[..n].copy_from_slice(&l.pos);
            counts.as_mut_slice::<i32>()?.copy_from_slice(&l.counts);
            w_out.as_mut_slice::<f32>()?.copy_from_slice(&l.w_out);
            dropped.as_mut_slice::<i32>()?.copy_from_slice(&l.dropped);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::moe_masked_layout(
            &dev,
            (ids, weights),
            pos,
            counts,
            w_out,
            dropped,
            crate::cuda_backend::MaskedDims {
                tokens: t,
                top_k: k,
                d: 0,
                experts: e,
                capacity: c,
            },
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// Writes row `x[t]` (BF16 `[T, D]`) to row `pos[t, slot]` of `out` for
/// every entry of the first T rows of `pos` (I32 `[M ≥ T, top_k]`) that lies
/// in `0..E · C`: `out` BF16 `[E, C, D]` with `scales` `None`, or e4m3
/// `[E, C, D]` with `scales` E8M0 `[E, C, D/32]` (D a multiple of 32), the
/// row quantised as [`super::act_quant_fp8`] quantises it. Other rows of
/// `out` are left as they are (the masked GEMMs read none of them).
pub fn moe_masked_scatter_into(
    x: &Tensor,
    pos: &Tensor,
    out: &mut Tensor,
    scales: Option<&mut Tensor>,
) -> Result<()> {
    const OP: &str = SCATTER_OP;
    x.expect_dtype(OP, "x", DType::BF16)?;
    let &[t, d] = x.shape() else {
        return Err(shape_error(OP, "x", x, "[T, D]".into()));
    };
    let k = pos.shape().get(1).copied().unwrap_or(0);
    check_pos(OP, pos, t, k)?;
    let (e, c) = buffer_rows(OP, "out", out)?;
    let fp8 = scales.is_some();
    out.expect_output(
        OP,
        "out",
        if fp8 { DType::F8E4M3 } else { DType::BF16 },
        &[e, c, d],
    )?;
    if let Some(s) = &scales {
        if !d.is_multiple_of(MX_BLOCK) {
            return Err(shape_error(
                OP,
                "x",
                x,
                "[T, D] with D a multiple of 32 for the FP8 payload".into(),
            ));
        }
        s.expect_output(OP, "scales", DType::E8M0, &[e, c, d / MX_BLOCK])?;
    }
    let mut named = vec![("x", x), ("pos", pos)];
    named.push(("out", &*out));
    if let Some(s) = &scales {
        named.push(("scales", &**s));
    }
    let device = common_device(OP, &named)?;
    match device {
        Device::Cpu => {
            let xs = x.as_slice::<bf16>()?;
            let ps = &pos.as_slice::<i32>()?[..t * k];
            match scales {
                Some(s) => reference::masked_scatter_fp8(
                    xs,
                    ps,
                    k,
                    d,
                    out.as_mut_slice::<E4M3>()?,
                    s.as_mut_slice::<E8M0>()?,
                ),
                None => reference::masked_scatter_bf16(xs, ps, k, d, out.as_mut_slice::<bf16>()?),
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::moe_masked_scatter(
            &dev,
            x,
            pos,
            out,
            scales,
            crate::cuda_backend::MaskedDims {
                tokens: t,
                top_k: k,
                d,
                experts: e,
                capacity: c,
            },
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}

/// `out[t] = BF16(Σ_slot rows[pos[t, slot]] + shared[t])` for the T rows of
/// `shared` (BF16 `[T, D]`) into `out` (BF16 `[T, D]`): `rows` BF16
/// `[E, C, D]` (the expert outputs in the masked layout), `pos` I32
/// `[M ≥ T, top_k]`; the slots summed from 0.0 in fp32 in slot order, an
/// entry outside `0..E · C` (dropped) adding 0.0, the shared row last, one
/// rounding to BF16.
pub fn moe_masked_combine_into(
    rows: &Tensor,
    pos: &Tensor,
    shared: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    const OP: &str = COMBINE_OP;
    rows.expect_dtype(OP, "rows", DType::BF16)?;
    shared.expect_dtype(OP, "shared", DType::BF16)?;
    let &[t, d] = shared.shape() else {
        return Err(shape_error(OP, "shared", shared, "[T, D]".into()));
    };
    let (e, c) = buffer_rows(OP, "rows", rows)?;
    if rows.shape() != [e, c, d] {
        return Err(shape_error(OP, "rows", rows, format!("[E, C, {d}]")));
    }
    let k = pos.shape().get(1).copied().unwrap_or(0);
    check_pos(OP, pos, t, k)?;
    if k == 0 {
        return Err(Error::Argument {
            op: OP,
            arg: "pos",
            value: "top_k 0".into(),
            why: "a token has at least one routed entry",
        });
    }
    out.expect_output(OP, "out", DType::BF16, &[t, d])?;
    let device = common_device(
        OP,
        &[
            ("rows", rows),
            ("pos", pos),
            ("shared", shared),
            ("out", out),
        ],
    )?;
    match device {
        Device::Cpu => {
            let v = reference::masked_combine(
                rows.as_slice::<bf16>()?,
                &pos.as_slice::<i32>()?[..t * k],
                shared.as_slice::<bf16>()?,
                k,
                d,
            );
            out.as_mut_slice::<bf16>()?.copy_from_slice(&v);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::moe_masked_combine(
            &dev,
            rows,
            pos,
            shared,
            out,
            crate::cuda_backend::MaskedDims {
                tokens: t,
                top_k: k,
                d,
                experts: e,
                capacity: c,
            },
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP, &d)),
    }
}
