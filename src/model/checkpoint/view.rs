//! [`TensorView`]: one tensor of a loaded checkpoint, borrowed from its
//! shard's mapping, with typed copies into the crate's element types.
//!
//! Invariant: `bytes` holds exactly `numel × dtype size` bytes of the stored
//! dtype (the loader validated the header against the manifest), so the
//! typed conversions never see a partial element.

use crate::device::Device;
use std::path::Path;

use half::bf16;

use super::error::CheckpointError;
use super::param::CheckpointDType;
use crate::dtype::{E4M3, E8M0, Fp4x2};
use crate::tensor::Tensor;

/// One tensor of a [`Checkpoint`](super::Checkpoint): its stored dtype,
/// shape and bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub(super) name: &'a str,
    pub(super) dtype: CheckpointDType,
    pub(super) shape: &'a [usize],
    pub(super) bytes: &'a [u8],
    pub(super) file: &'a Path,
}

impl<'a> TensorView<'a> {
    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn dtype(&self) -> CheckpointDType {
        self.dtype
    }

    /// The stored shape (I8 packed FP4 counts bytes).
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The raw little-endian bytes, straight from the mapping.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The shard holding the tensor.
    pub fn file(&self) -> &'a Path {
        self.file
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn expect(&self, expected: CheckpointDType) -> Result<(), CheckpointError> {
        if self.dtype == expected {
            Ok(())
        } else {
            Err(CheckpointError::WrongDType {
                name: self.name.to_string(),
                expected,
                found: self.dtype,
            })
        }
    }

    pub fn to_bf16(&self) -> Result<Vec<bf16>, CheckpointError> {
        self.expect(CheckpointDType::BF16)?;
        let value = |&b: &[u8; 2]| bf16::from_bits(u16::from_le_bytes(b));
        Ok(self.bytes.as_chunks::<2>().0.iter().map(value).collect())
    }

    pub fn to_f32(&self) -> Result<Vec<f32>, CheckpointError> {
        self.expect(CheckpointDType::F32)?;
        let value = |&b: &[u8; 4]| f32::from_le_bytes(b);
        Ok(self.bytes.as_chunks::<4>().0.iter().map(value).collect())
    }

    pub fn to_e4m3(&self) -> Result<Vec<E4M3>, CheckpointError> {
        self.expect(CheckpointDType::F8E4M3)?;
        Ok(self.bytes.iter().map(|&b| E4M3(b)).collect())
    }

    pub fn to_e8m0(&self) -> Result<Vec<E8M0>, CheckpointError> {
        self.expect(CheckpointDType::F8E8M0)?;
        Ok(self.bytes.iter().map(|&b| E8M0(b)).collect())
    }

    /// The I8 bytes as packed e2m1 pairs (even element in the low nibble).
    pub fn to_fp4x2(&self) -> Result<Vec<Fp4x2>, CheckpointError> {
        self.expect(CheckpointDType::I8)?;
        Ok(self.bytes.iter().map(|&b| Fp4x2(b)).collect())
    }

    /// A host [`Tensor`] of [`CheckpointDType::tensor_dtype`]; an I8 tensor
    /// becomes packed FP4 with its last dim counted in e2m1 values (twice the
    /// stored width).
    pub fn to_tensor(&self) -> crate::model::Result<Tensor> {
        self.to_tensor_on(&Device::Cpu)
    }

    /// [`TensorView::to_tensor`] on `device`: on a GPU the bytes go from the
    /// mapping straight into device memory, with no host tensor between.
    pub fn to_tensor_on(&self, device: &Device) -> crate::model::Result<Tensor> {
        let mut shape = self.shape.to_vec();
        if self.dtype == CheckpointDType::I8
            && let Some(last) = shape.last_mut()
        {
            *last = last.saturating_mul(2);
        }
        Ok(Tensor::from_le_bytes(
            device,
            self.dtype.tensor_dtype(),
            &shape,
            self.bytes,
        )?)
    }
}
