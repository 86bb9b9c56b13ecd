//! Token embedding and greedy sampling: [`embedding`] gathers one row of a
//! BF16 table per token id; [`argmax`] picks each row's largest logit with
//! ties to the lowest id (the deterministic greedy rule of the runner);
//! [`first_non_finite`] finds each row's first NaN or ±Inf (the sampler's
//! check of its logits without copying them to the host).
//!
//! Invariant: an id outside the table is a typed error naming the id (the
//! CPU reads the ids before allocating; the CUDA kernel skips the token and
//! records its position, which [`embedding`] reads back after the launch,
//! so it waits for its kernel, and [`embedding_deferred`] leaves to
//! [`DeviceChecks::verdict`]). The gather is exact and the
//! argmax follows one order on both devices: bitwise the same results.

use super::{DeviceChecks, shape_error};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const EMBED: &str = "embedding";
const ARGMAX: &str = "argmax";

fn bad_id(id: Option<i32>) -> Error {
    Error::Argument {
        op: EMBED,
        arg: "ids",
        value: id.map_or_else(|| "?".into(), |id| id.to_string()),
        why: "token id is outside the embedding table",
    }
}

/// Rows `table[ids[t]]` of a BF16 `table` `[V, D]` for I32 `ids` `[T]`:
/// a new BF16 `[T, D]` tensor on the table's device.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    DeviceChecks::at_once(
        |c| embedding_deferred(table, ids, c),
        |f| Ok(bad_id(ids.to_vec::<i32>()?.get(f.at).copied())),
    )
}

/// [`embedding`] whose CUDA check of the ids is read later, by
/// [`DeviceChecks::verdict`] (no sync here; a token whose id is outside
/// the table keeps an unwritten row until then). The CPU checks at once.
// Without CUDA no kernel records into `checks`.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn embedding_deferred(
    table: &Tensor,
    ids: &Tensor,
    checks: &mut DeviceChecks,
) -> Result<Tensor> {
    let ids_t = ids;
    table.expect_dtype(EMBED, "table", DType::BF16)?;
    ids.expect_dtype(EMBED, "ids", DType::I32)?;
    let &[v, d] = table.shape() else {
        return Err(shape_error(EMBED, "table", table, "[V, D]".into()));
    };
    let &[t] = ids.shape() else {
        return Err(shape_error(EMBED, "ids", ids, "[T]".into()));
    };
    let device = super::common_device(EMBED, &[("table", table), ("ids", ids)])?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            t.checked_mul(d).ok_or_else(|| {
                shape_error(EMBED, "ids", ids_t, format!("[T] with T × {d} in usize"))
            })?;
            // Launched for D = 0 too: the ids are checked even when no row
            // is copied.
            let mut out = Tensor::empty(&table.device(), DType::BF16, &[t, d])?;
            let slot = checks.slot(&dev, EMBED, "ids")?;
            crate::cuda_backend::embedding(&dev, table, ids, &mut out, (v, d), slot)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(EMBED, &d)),
    }
    let (tab, ids) = (table.as_slice::<bf16>()?, ids.as_slice::<i32>()?);
    // Every id is checked before the output is allocated: an empty table
    // of huge rows ([0, 2^33]) asks for nothing.
    let rows = ids
        .iter()
        .map(|&id| {
            usize::try_from(id)
                .ok()
                .filter(|&r| r < v)
                .ok_or_else(|| bad_id(Some(id)))
        })
        .collect::<Result<Vec<usize>>>()?;
    let numel = t
        .checked_mul(d)
        .ok_or_else(|| shape_error(EMBED, "ids", ids_t, format!("[T] with T × {d} in usize")))?;
    let mut out = Vec::with_capacity(numel);
    for row in rows {
        // row < V: the table holds rows row·D .. (row + 1)·D.
        out.extend_from_slice(&tab[row * d..(row + 1) * d]);
    }
    Tensor::from_vec(out, &[t, d])
}

/// Index of the largest value of every row of F32 `logits` `[T, V]` (ties
/// and NaN-free rows: the lowest index wins; a NaN never wins): I32 `[T]`.
pub fn argmax(logits: &Tensor) -> Result<Tensor> {
    logits.expect_dtype(ARGMAX, "logits", DType::F32)?;
    let &[t, v] = logits.shape() else {
        return Err(shape_error(ARGMAX, "logits", logits, "[T, V]".into()));
    };
    if v == 0 || i32::try_from(v).is_err() {
        return Err(shape_error(
            ARGMAX,
            "logits",
            logits,
            "[T, V] with 1 <= V < 2^31".into(),
        ));
    }
    match logits.device() {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&logits.device(), DType::I32, &[t])?;
            crate::cuda_backend::argmax(&dev, logits, &mut out, t, v)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(ARGMAX, &d)),
    }
    let x = logits.as_slice::<f32>()?;
    let ids: Vec<i32> = (0..t)
        .map(|r| super::i32_sat(crate::numerics::argmax(&x[r * v..(r + 1) * v])))
        .collect();
    Tensor::from_vec(ids, &[t])
}

/// Each row's lowest index of a NaN or ±Inf in F32 `x` `[T, V]` (−1 for a
/// finite row): I32 `[T]` on x's device, so a sampler checks its logits
/// without copying them to the host.
pub fn first_non_finite(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "first_non_finite";
    x.expect_dtype(OP, "x", DType::F32)?;
    let &[t, v] = x.shape() else {
        return Err(shape_error(OP, "x", x, "[T, V]".into()));
    };
    if i32::try_from(v).is_err() {
        return Err(shape_error(OP, "x", x, "[T, V] with V < 2^31".into()));
    }
    match x.device() {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&x.device(), DType::I32, &[t])?;
            crate::cuda_backend::first_non_finite(&dev, x, &mut out, t, v)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let xs = x.as_slice::<f32>()?;
    let first: Vec<i32> = (0..t)
        .map(|r| {
            xs[r * v..(r + 1) * v]
                .iter()
                .position(|y| !y.is_finite())
                .map_or(-1, super::i32_sat)
        })
        .collect();
    Tensor::from_vec(first, &[t])
}
