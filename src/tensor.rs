//! `Tensor`: a dense, row-major array with a shape, a dtype and storage on one
//! device. Storage is owned; there are no strides or views yet. A packed FP4
//! tensor's shape counts logical e2m1 elements and its last dimension is even.

use crate::device::{CudaBuffer, Device};
use crate::dtype::{DType, Element, HostStorage};
use crate::error::{Error, Result};

#[derive(Clone, Debug)]
enum Storage {
    Host(HostStorage),
    Cuda(CudaBuffer),
}

/// A dense row-major tensor on one device.
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
}

fn check_fp4_shape(dtype: DType, shape: &[usize]) -> Result<()> {
    if dtype == DType::F4E2M1x2 && shape.last().is_some_and(|d| d % 2 != 0) {
        return Err(Error::Shape {
            op: "Tensor::new",
            tensor: "packed fp4",
            got: shape.to_vec(),
            expected: "an even last dimension (two e2m1 values per byte)".into(),
        });
    }
    Ok(())
}

impl Tensor {
    /// A host tensor from typed data. `data.len() * T::PER_UNIT` must equal the
    /// product of `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        check_fp4_shape(T::DTYPE, shape)?;
        let numel: usize = shape.iter().product();
        if data.len() * T::PER_UNIT != numel {
            return Err(Error::DataLength {
                dtype: T::DTYPE,
                shape: shape.to_vec(),
                expected: numel / T::PER_UNIT,
                got: data.len(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: T::DTYPE,
            storage: Storage::Host(T::wrap(data)),
        })
    }

    /// A host tensor of `dtype` whose every byte is `byte` (0xFF poisons f32,
    /// bf16 and e4m3 with NaN).
    pub fn filled_bytes(dtype: DType, shape: &[usize], byte: u8) -> Result<Tensor> {
        check_fp4_shape(dtype, shape)?;
        let numel: usize = shape.iter().product();
        let bytes = vec![byte; dtype.storage_bytes(numel)];
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::Host(HostStorage::from_le_bytes(dtype, &bytes)),
        })
    }

    /// A tensor on `device` whose contents are unspecified (zeros on the CPU;
    /// uninitialised, or 0xFF when the CUDA handle poisons, on a GPU). Used for
    /// outputs that an op's `_into` variant overwrites completely.
    pub fn empty(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        check_fp4_shape(dtype, shape)?;
        let bytes = dtype.storage_bytes(shape.iter().product());
        let storage = match device {
            Device::Cpu => Storage::Host(HostStorage::from_le_bytes(dtype, &vec![0; bytes])),
            Device::Cuda(d) => Storage::Cuda(d.alloc(bytes)?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage,
        })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Logical element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of storage.
    pub fn storage_bytes(&self) -> usize {
        self.dtype.storage_bytes(self.numel())
    }

    /// The device holding the storage.
    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Host(_) => Device::Cpu,
            Storage::Cuda(b) => Device::Cuda(b.device().clone()),
        }
    }

    /// Typed view of a host tensor.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if self.dtype != T::DTYPE {
            return Err(Error::DType {
                op: "Tensor::as_slice",
                tensor: "self",
                got: self.dtype,
                expected: T::DTYPE,
            });
        }
        match &self.storage {
            Storage::Host(h) => Ok(T::view(h).expect("host storage variant matches dtype")),
            Storage::Cuda(b) => Err(Error::DeviceMismatch {
                op: "Tensor::as_slice",
                tensor: "self",
                got: b.device().to_string(),
                expected: "cpu (copy it with to_device(&Device::Cpu))".into(),
            }),
        }
    }

    /// Mutable typed view of a host tensor.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        if self.dtype != T::DTYPE {
            return Err(Error::DType {
                op: "Tensor::as_mut_slice",
                tensor: "self",
                got: self.dtype,
                expected: T::DTYPE,
            });
        }
        match &mut self.storage {
            Storage::Host(h) => Ok(T::view_mut(h).expect("host storage variant matches dtype")),
            Storage::Cuda(b) => Err(Error::DeviceMismatch {
                op: "Tensor::as_mut_slice",
                tensor: "self",
                got: b.device().to_string(),
                expected: "cpu".into(),
            }),
        }
    }

    /// Typed copy of the data, from any device.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.to_device(&Device::Cpu)?.as_slice::<T>()?.to_vec())
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn cuda(&self) -> Option<&CudaBuffer> {
        match &self.storage {
            Storage::Cuda(b) => Some(b),
            Storage::Host(_) => None,
        }
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn cuda_mut(&mut self) -> Option<&mut CudaBuffer> {
        match &mut self.storage {
            Storage::Cuda(b) => Some(b),
            Storage::Host(_) => None,
        }
    }

    /// Checks that `self` is an output of `dtype` and `shape` for op `op`.
    pub fn expect_output(
        &self,
        op: &'static str,
        name: &'static str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<()> {
        self.expect_dtype(op, name, dtype)?;
        if self.shape != shape {
            return Err(Error::Shape {
                op,
                tensor: name,
                got: self.shape.clone(),
                expected: format!("{shape:?}"),
            });
        }
        Ok(())
    }

    /// Copies the tensor to `device` (a clone when it is already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let storage = match (&self.storage, device) {
            (Storage::Host(h), Device::Cpu) => Storage::Host(h.clone()),
            (Storage::Host(h), Device::Cuda(d)) => Storage::Cuda(d.upload(&h.to_le_bytes())?),
            (Storage::Cuda(b), Device::Cpu) => {
                Storage::Host(HostStorage::from_le_bytes(self.dtype, &b.download()?))
            }
            (Storage::Cuda(b), Device::Cuda(d)) => Storage::Cuda(d.upload(&b.download()?)?),
        };
        Ok(Tensor {
            shape: self.shape.clone(),
            dtype: self.dtype,
            storage,
        })
    }

    /// Checks the dtype on behalf of op `op`, naming the tensor `name`.
    pub fn expect_dtype(&self, op: &'static str, name: &'static str, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(Error::DType {
                op,
                tensor: name,
                got: self.dtype,
                expected: dtype,
            });
        }
        Ok(())
    }
}
