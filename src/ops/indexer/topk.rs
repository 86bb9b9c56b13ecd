//! The exact top-k selection of the published index lists (`index_topk`).

use super::*;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;

pub(super) const TOPK: &str = "index_topk";

/// The published index lists `[batch, k]` (I32) of BF16 `scores`
/// `[batch, n]`: per row exactly `cpu_backend::indexer::select(row, k,
/// visible[b], offset)` — the k best entries (ties to the lower index),
/// ascending, picks ≥ visible replaced by −1 at the end, the others + offset.
/// Needs k ≤ n and n − 1 + offset < 2^31.
pub fn index_topk(scores: &Tensor, visible: &Tensor, k: usize, offset: usize) -> Result<Tensor> {
    let (device, batch, _) = validate_topk(scores, visible, k, offset)?;
    let mut out = Tensor::empty(&device, DType::I32, &[batch, k])?;
    index_topk_into(scores, visible, k, offset, &mut out)?;
    Ok(out)
}

/// [`index_topk`] into a preallocated I32 `out` `[batch, k]`.
pub fn index_topk_into(
    scores: &Tensor,
    visible: &Tensor,
    k: usize,
    offset: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (_, batch, n) = validate_topk(scores, visible, k, offset)?;
    out.expect_output(TOPK, "out", DType::I32, &[batch, k])?;
    match common_device(TOPK, &[("scores", scores), ("out", out)])? {
        Device::Cpu => {
            let rows = widened_rows(scores, visible, n)?;
            let o = out.as_mut_slice::<i32>()?;
            for (b, (row, visible)) in rows.enumerate() {
                let list = cpu_backend::indexer::select(&row, k, visible, offset);
                o[b * k..(b + 1) * k].copy_from_slice(&list);
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::indexer::index_topk(
            &dev, scores, visible, out, batch, n, k, offset,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(TOPK, &d)),
    }
}

pub(super) fn validate_topk(
    scores: &Tensor,
    visible: &Tensor,
    k: usize,
    offset: usize,
) -> Result<(Device, usize, usize)> {
    scores.expect_dtype(TOPK, "scores", DType::BF16)?;
    visible.expect_dtype(TOPK, "visible", DType::I32)?;
    let device = common_device(TOPK, &[("scores", scores), ("visible", visible)])?;
    let (batch, n) = match *scores.shape() {
        [b, n] => (b, n),
        _ => return Err(shape_error(TOPK, "scores", scores, "[batch, n]".into())),
    };
    check_visible(TOPK, visible, batch, "scores'")?;
    if k > n {
        return Err(Error::Argument {
            op: TOPK,
            arg: "k",
            value: k.to_string(),
            why: "must not exceed the number of scored entries n",
        });
    }
    if n.saturating_sub(1).saturating_add(offset) > i32::MAX as usize {
        return Err(Error::Argument {
            op: TOPK,
            arg: "offset",
            value: offset.to_string(),
            why: "n - 1 + offset must fit an i32 index",
        });
    }
    Ok((device, batch, n))
}
