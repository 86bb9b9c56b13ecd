//! The FP4 index-key row writer (`index_key_quant`), for the key cache and
//! the index queries (see the family doc in `mod.rs`).

use super::*;
use crate::contract::MX_BLOCK;
use crate::device::Device;
use crate::dtype::{DType, Fp4x2};
use crate::error::Result;
use crate::kv_format;
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;
use half::bf16;

pub(super) const QUANT: &str = "index_key_quant";

/// BF16 `x` `[.., dim]` (dim a positive multiple of 32) → index-key rows
/// `[.., dim + dim/16]` (`F4E2M1x2`), bitwise `kv_format::encode_index_key_row`
/// per row. Used for the key cache and for the FP4 index queries.
pub fn index_key_quant(x: &Tensor) -> Result<Tensor> {
    let (device, dim) = validate_quant(x)?;
    let shape = crate::ops::with_last(x.shape(), index_key_row_nibbles(dim));
    let mut out = Tensor::empty(&device, DType::F4E2M1x2, &shape)?;
    index_key_quant_into(x, &mut out)?;
    Ok(out)
}

/// [`index_key_quant`] into a preallocated `out` of the matching shape.
pub fn index_key_quant_into(x: &Tensor, out: &mut Tensor) -> Result<()> {
    let (_, dim) = validate_quant(x)?;
    let shape = crate::ops::with_last(x.shape(), index_key_row_nibbles(dim));
    out.expect_output(QUANT, "out", DType::F4E2M1x2, &shape)?;
    match common_device(QUANT, &[("x", x), ("out", out)])? {
        Device::Cpu => {
            let rows_out: Vec<Fp4x2> = x
                .as_slice::<bf16>()?
                .chunks_exact(dim)
                .flat_map(kv_format::encode_index_key_row)
                .map(Fp4x2)
                .collect();
            out.as_mut_slice::<Fp4x2>()?.copy_from_slice(&rows_out);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::indexer::index_key_quant(&dev, x, out, x.numel() / dim, dim)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(crate::ops::kernels_not_built(QUANT, &d)),
    }
}

pub(super) fn validate_quant(x: &Tensor) -> Result<(Device, usize)> {
    x.expect_dtype(QUANT, "x", DType::BF16)?;
    let dim = match x.shape().last() {
        Some(&d) if d > 0 && d.is_multiple_of(MX_BLOCK) && d <= i32::MAX as usize => d,
        _ => {
            return Err(shape_error(
                QUANT,
                "x",
                x,
                "rank >= 1 with a last dimension that is a positive multiple of 32".into(),
            ));
        }
    };
    Ok((x.device(), dim))
}
