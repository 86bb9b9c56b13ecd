//! `Tensor`: a dense, row-major array with a shape, a dtype and storage on one
//! device. Storage is owned; there are no strides or views yet. A packed FP4
//! tensor's shape counts logical e2m1 elements and its last dimension is even.
//!
//! Row copies (the first dimension is the row axis): [`Tensor::narrow_rows`],
//! [`Tensor::cat_rows`] and [`Tensor::copy_rows_from`] move whole rows on
//! either device (host slices, or device-to-device copies on one CUDA
//! stream), so the model's glue never leaves the device.

use crate::device::{CudaBuffer, Device, host_alloc};
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

/// Checks a shape for `dtype`: an even last dimension for packed FP4, and
/// an element count and byte size that fit `isize` (checked arithmetic, so
/// an absurd shape is an error in release builds too, never a wrapped
/// size). Returns the element count.
fn check_shape(dtype: DType, shape: &[usize]) -> Result<usize> {
    if dtype == DType::F4E2M1x2 && shape.last().is_some_and(|d| d % 2 != 0) {
        return Err(Error::Shape {
            op: "Tensor::new",
            tensor: "packed fp4",
            got: shape.to_vec(),
            expected: "an even last dimension (two e2m1 values per byte)".into(),
        });
    }
    let too_big = || Error::Shape {
        op: "Tensor::new",
        tensor: "self",
        got: shape.to_vec(),
        expected: format!("at most {} bytes of {dtype}", isize::MAX),
    };
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(too_big)?;
    let bytes = numel
        .checked_mul(dtype.storage_bytes(1))
        .ok_or_else(too_big)?;
    if bytes > isize::MAX as usize {
        return Err(too_big());
    }
    Ok(numel)
}

/// `bytes` host bytes all equal to `byte`, as storage of `dtype`, reserved
/// through [`host_alloc`] (a typed [`Error::OutOfMemory`], never an abort).
fn host_bytes(op: &'static str, dtype: DType, bytes: usize, byte: u8) -> Result<HostStorage> {
    host_alloc(op, bytes, || HostStorage::try_filled(dtype, bytes, byte))
}

/// `numel` copies of `value`, reserved through [`host_alloc`].
fn host_full<T: Clone>(op: &'static str, numel: usize, value: T) -> Result<Vec<T>> {
    host_alloc(op, numel.saturating_mul(size_of::<T>()), || {
        let mut v = Vec::new();
        v.try_reserve_exact(numel).ok()?;
        v.resize(numel, value);
        Some(v)
    })
}

/// Host storage of `dtype` decoded from little-endian `bytes`, reserved
/// through [`host_alloc`].
fn host_decode(op: &'static str, dtype: DType, bytes: &[u8]) -> Result<HostStorage> {
    host_alloc(op, bytes.len(), || {
        HostStorage::try_from_le_bytes(dtype, bytes)
    })
}

impl Tensor {
    /// A host tensor from typed data. `data.len() * T::PER_UNIT` must equal the
    /// product of `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let numel = check_shape(T::DTYPE, shape)?;
        if data.len().checked_mul(T::PER_UNIT) != Some(numel) {
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

    /// A tensor of `dtype` and `shape` on `device` from its little-endian
    /// bytes (`dtype`'s storage bytes of the shape, exactly): decoded into
    /// host storage on the CPU, uploaded as they are on a GPU (no host tensor
    /// in between, so a memory-mapped checkpoint goes straight to the device).
    pub fn from_le_bytes(
        device: &Device,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<Tensor> {
        let numel = check_shape(dtype, shape)?;
        let expected = dtype.storage_bytes(numel);
        if bytes.len() != expected {
            return Err(Error::Argument {
                op: "Tensor::from_le_bytes",
                arg: "bytes",
                value: format!("{} bytes for {dtype} {shape:?}", bytes.len()),
                why: if bytes.len() < expected {
                    "fewer bytes than the shape holds"
                } else {
                    "more bytes than the shape holds"
                },
            });
        }
        let storage = match device {
            Device::Cpu => Storage::Host(host_decode("Tensor::from_le_bytes", dtype, bytes)?),
            Device::Cuda(d) => Storage::Cuda(d.upload(bytes)?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage,
        })
    }

    /// A host tensor of `dtype` whose every byte is `byte` (0xFF poisons f32,
    /// bf16 and e4m3 with NaN).
    pub fn filled_bytes(dtype: DType, shape: &[usize], byte: u8) -> Result<Tensor> {
        let numel = check_shape(dtype, shape)?;
        let storage = host_bytes(
            "Tensor::filled_bytes",
            dtype,
            dtype.storage_bytes(numel),
            byte,
        )?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::Host(storage),
        })
    }

    /// A tensor on `device` whose contents are unspecified (zeros on the CPU;
    /// uninitialised, or 0xFF when the CUDA handle poisons, on a GPU). Used for
    /// outputs that an op's `_into` variant overwrites completely.
    pub fn empty(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = dtype.storage_bytes(check_shape(dtype, shape)?);
        let storage = match device {
            Device::Cpu => Storage::Host(host_bytes("Tensor::empty", dtype, bytes, 0)?),
            Device::Cuda(d) => Storage::Cuda(d.alloc(bytes)?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage,
        })
    }

    /// A tensor of zeros (on CUDA a device memset, with no host copy).
    pub fn zeros(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        match device {
            Device::Cpu => Tensor::filled_bytes(dtype, shape, 0),
            Device::Cuda(d) => Ok(Tensor {
                shape: shape.to_vec(),
                dtype,
                storage: Storage::Cuda(d.zeroed(dtype.storage_bytes(check_shape(dtype, shape)?))?),
            }),
        }
    }

    /// An F32 tensor whose every element is `value` (on CUDA a device
    /// memset of its bit pattern, with no host copy).
    pub fn full_f32(device: &Device, shape: &[usize], value: f32) -> Result<Tensor> {
        let numel = check_shape(DType::F32, shape)?;
        let storage = match device {
            Device::Cpu => Storage::Host(HostStorage::F32(host_full(
                "Tensor::full_f32",
                numel,
                value,
            )?)),
            Device::Cuda(d) => Storage::Cuda(d.filled_u32(numel, value.to_bits())?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage,
        })
    }

    /// An I64 tensor whose every element is `value` (on CUDA device
    /// memsets, with no host copy).
    pub fn full_i64(device: &Device, shape: &[usize], value: i64) -> Result<Tensor> {
        let numel = check_shape(DType::I64, shape)?;
        let storage = match device {
            Device::Cpu => Storage::Host(HostStorage::I64(host_full(
                "Tensor::full_i64",
                numel,
                value,
            )?)),
            Device::Cuda(d) => {
                Storage::Cuda(d.filled_u64(numel, u64::from_ne_bytes(value.to_ne_bytes()))?)
            }
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::I64,
            storage,
        })
    }

    /// An empty host tensor (`U8 [0]`), made without allocating or failing:
    /// what a holder leaves behind when it moves its tensor out in `drop`.
    pub(crate) fn placeholder() -> Tensor {
        Tensor {
            shape: vec![0],
            dtype: DType::U8,
            storage: Storage::Host(HostStorage::U8(Vec::new())),
        }
    }

    /// The same data under another shape of the same element count.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor> {
        if check_shape(self.dtype, shape)? != self.numel() {
            return Err(Error::Shape {
                op: "Tensor::reshape",
                tensor: "self",
                got: self.shape.clone(),
                expected: format!("{} elements to match {shape:?}", self.numel()),
            });
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// The same elements of a one-byte dtype (e4m3, E8M0 or bytes) as raw
    /// bytes (`U8`, same shape): a device tensor keeps its storage, a host
    /// one is copied. Any other dtype is a typed error.
    pub fn into_bytes(self) -> Result<Tensor> {
        let storage = match self.storage {
            Storage::Cuda(b) if matches!(self.dtype, DType::F8E4M3 | DType::E8M0 | DType::U8) => {
                Storage::Cuda(b)
            }
            Storage::Host(HostStorage::F8E4M3(v)) => {
                Storage::Host(HostStorage::U8(v.into_iter().map(|x| x.0).collect()))
            }
            Storage::Host(HostStorage::E8M0(v)) => {
                Storage::Host(HostStorage::U8(v.into_iter().map(|x| x.0).collect()))
            }
            Storage::Host(HostStorage::U8(v)) => Storage::Host(HostStorage::U8(v)),
            _ => {
                return Err(Error::Argument {
                    op: "Tensor::into_bytes",
                    arg: "self",
                    value: self.dtype.to_string(),
                    why: "only e4m3, E8M0 and byte tensors are read as bytes",
                });
            }
        };
        Ok(Tensor {
            shape: self.shape,
            dtype: DType::U8,
            storage,
        })
    }

    /// Rows along the first dimension (0 for a rank-0 tensor).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    /// Storage bytes of one row (the product of the trailing dimensions).
    pub(crate) fn row_bytes(&self) -> usize {
        self.dtype
            .storage_bytes(self.shape.iter().skip(1).product())
    }

    /// Rows `start .. start + len` as a new tensor on the same device.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Result<Tensor> {
        let mut shape = self.shape.clone();
        let end = start.checked_add(len);
        match (shape.first_mut(), end) {
            (Some(rows), Some(end)) if end <= *rows => *rows = len,
            _ => {
                return Err(Error::Shape {
                    op: "Tensor::narrow_rows",
                    tensor: "self",
                    got: self.shape.clone(),
                    expected: format!("rank >= 1 and rows {start} + {len}"),
                });
            }
        }
        let mut out = Tensor::empty(&self.device(), self.dtype, &shape)?;
        out.copy_rows_from(0, self, start, len)?;
        Ok(out)
    }

    /// The tensors' rows one after another (same dtype, trailing dimensions
    /// and device; at least one part).
    pub fn cat_rows(parts: &[&Tensor]) -> Result<Tensor> {
        let Some(first) = parts.first() else {
            return Err(Error::Argument {
                op: "Tensor::cat_rows",
                arg: "parts",
                value: "[]".into(),
                why: "needs at least one tensor",
            });
        };
        let rows = parts
            .iter()
            .try_fold(0usize, |n, p| n.checked_add(p.rows()));
        let mut shape = first.shape.clone();
        match (shape.first_mut(), rows) {
            (Some(r), Some(rows)) => *r = rows,
            _ => {
                return Err(Error::Shape {
                    op: "Tensor::cat_rows",
                    tensor: "parts",
                    got: first.shape.clone(),
                    expected: "rank >= 1 and a row count that fits usize".into(),
                });
            }
        }
        // Every part fits the first before the output is allocated (an
        // empty first part of huge rows must not size it).
        for p in parts {
            p.expect_dtype("Tensor::cat_rows", "parts", first.dtype)?;
            if p.shape.get(1..) != first.shape.get(1..) {
                return Err(Error::Shape {
                    op: "Tensor::cat_rows",
                    tensor: "parts",
                    got: p.shape.clone(),
                    expected: format!("rows of {:?}", first.shape.get(1..).unwrap_or(&[])),
                });
            }
        }
        let mut out = Tensor::empty(&first.device(), first.dtype, &shape)?;
        let mut at = 0;
        for p in parts {
            out.copy_rows_from(at, p, 0, p.rows())?;
            at += p.rows();
        }
        Ok(out)
    }

    /// Copies rows `src_row .. src_row + n` of `src` over rows
    /// `dst_row .. dst_row + n` of `self`. Both tensors have the same dtype
    /// and row width and live on the same device.
    pub fn copy_rows_from(
        &mut self,
        dst_row: usize,
        src: &Tensor,
        src_row: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "Tensor::copy_rows_from";
        src.expect_dtype(OP, "src", self.dtype)?;
        let fits = |row: usize, shape: &[usize]| {
            row.checked_add(n)
                .zip(shape.first())
                .is_some_and(|(end, &rows)| end <= rows)
        };
        // A row of rank-1 packed FP4 is half a byte: no whole-byte copy.
        if self.shape.get(1..).is_none()
            || (self.dtype == DType::F4E2M1x2 && self.shape.len() == 1)
            || self.shape.get(1..) != src.shape.get(1..)
            || !fits(dst_row, &self.shape)
            || !fits(src_row, &src.shape)
        {
            return Err(Error::Shape {
                op: OP,
                tensor: "src",
                got: src.shape.clone(),
                expected: format!(
                    "rows {src_row} + {n} of the row shape of self {:?} (rows {dst_row} + {n} written)",
                    self.shape.get(1..).unwrap_or(&[]),
                ),
            });
        }
        if n == 0 {
            // Nothing to copy; a tensor of 0 rows may have trailing
            // dimensions whose product alone overflows ([0, 2^62, 4]).
            return Ok(());
        }
        // In range: n ≥ 1 rows lie inside tensors whose byte sizes fit.
        let rb = self.row_bytes();
        self.copy_bytes(OP, dst_row * rb, src, src_row * rb, n * rb)
    }

    /// Copies `n` elements of `src` from flat element `src_at` over flat
    /// element `dst_at` of `self` (same dtype, not packed FP4, one device).
    pub(crate) fn copy_elems_from(
        &mut self,
        dst_at: usize,
        src: &Tensor,
        src_at: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "Tensor::copy_elems_from";
        src.expect_dtype(OP, "src", self.dtype)?;
        let fits = |at: usize, numel: usize| at.checked_add(n).is_some_and(|end| end <= numel);
        // Packed FP4 copies whole bytes: even offsets and counts only.
        let packed = self.dtype == DType::F4E2M1x2;
        if (packed && [dst_at, src_at, n].iter().any(|v| !v.is_multiple_of(2)))
            || !fits(dst_at, self.numel())
            || !fits(src_at, src.numel())
        {
            return Err(Error::Shape {
                op: OP,
                tensor: "src",
                got: src.shape.clone(),
                expected: format!("elements {src_at} + {n} on whole bytes"),
            });
        }
        let bytes = |elems: usize| self.dtype.storage_bytes(elems);
        self.copy_bytes(OP, bytes(dst_at), src, bytes(src_at), bytes(n))
    }

    fn copy_bytes(
        &mut self,
        op: &'static str,
        d0: usize,
        src: &Tensor,
        s0: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        match (&mut self.storage, &src.storage) {
            (Storage::Host(d), Storage::Host(s)) => {
                if d.copy_bytes_from(d0, s, s0, len) {
                    Ok(())
                } else {
                    Err(Error::Argument {
                        op,
                        arg: "bytes",
                        value: format!("{len} bytes from {s0} to {d0}"),
                        why: "the range runs past a tensor's storage",
                    })
                }
            }
            (Storage::Cuda(d), Storage::Cuda(s)) if d.device().same_stream(s.device()) => {
                d.copy_range_from(d0, s, s0, len)
            }
            _ => {
                let (got, expected) = Device::mismatch_names(&src.device(), &self.device());
                Err(Error::DeviceMismatch {
                    op,
                    tensor: "src",
                    got,
                    expected,
                })
            }
        }
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
            Storage::Host(h) => T::view(h).ok_or(Error::DType {
                op: "Tensor::as_slice",
                tensor: "self (host storage)",
                got: self.dtype,
                expected: T::DTYPE,
            }),
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
        let dtype = self.dtype;
        match &mut self.storage {
            Storage::Host(h) => T::view_mut(h).ok_or(Error::DType {
                op: "Tensor::as_mut_slice",
                tensor: "self (host storage)",
                got: dtype,
                expected: T::DTYPE,
            }),
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
    pub(crate) fn cuda(&self) -> Result<&CudaBuffer> {
        match &self.storage {
            Storage::Cuda(b) => Ok(b),
            Storage::Host(_) => Err(not_on_cuda()),
        }
    }

    /// The device address of a CUDA tensor's storage (`None` on the host).
    pub fn address(&self) -> Option<u64> {
        match &self.storage {
            Storage::Cuda(b) => Some(b.address()),
            Storage::Host(_) => None,
        }
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn cuda_mut(&mut self) -> Result<&mut CudaBuffer> {
        match &mut self.storage {
            Storage::Cuda(b) => Ok(b),
            Storage::Host(_) => Err(not_on_cuda()),
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

    /// The storage as little-endian bytes (the inverse of
    /// [`Tensor::from_le_bytes`]), downloaded from a GPU.
    pub fn to_le_bytes(&self) -> Result<Vec<u8>> {
        match &self.storage {
            Storage::Host(h) => Ok(h.le_bytes().into_owned()),
            Storage::Cuda(b) => b.download(),
        }
    }

    /// Overwrites every element with `data` (row-major, `numel` values of
    /// the tensor's dtype) where the tensor lives, keeping its storage: on a
    /// GPU the same device address, so a captured CUDA graph that reads the
    /// tensor sees the new values at its next replay (the static inputs of
    /// a decode step). Not inside a capture.
    pub fn write_from<T: Element>(&mut self, data: &[T]) -> Result<()> {
        self.expect_dtype("Tensor::write_from", "self", T::DTYPE)?;
        if data.len() != self.numel() {
            return Err(Error::Shape {
                op: "Tensor::write_from",
                tensor: "data",
                got: vec![data.len()],
                expected: format!("{} values (shape {:?})", self.numel(), self.shape),
            });
        }
        match &mut self.storage {
            Storage::Host(_) => {
                self.as_mut_slice::<T>()?.copy_from_slice(data);
                Ok(())
            }
            // Encoded once (not at all for bytes), straight from `data`.
            Storage::Cuda(b) => b.write_all(&T::le_bytes(data)),
        }
    }

    /// Overwrites rows `row .. row + n` of `self` (rank ≥ 1) with `data`,
    /// `n` whole rows of the tensor's dtype, where the tensor lives, keeping
    /// its storage as [`Tensor::write_from`] does. Not inside a capture.
    pub fn write_rows_from<T: Element>(&mut self, row: usize, data: &[T]) -> Result<()> {
        const OP: &str = "Tensor::write_rows_from";
        self.expect_dtype(OP, "self", T::DTYPE)?;
        let rows = self.rows();
        let per_row = self.numel().checked_div(rows).unwrap_or(0);
        let n = data.len().checked_div(per_row).unwrap_or(0);
        let fits = self.dtype != DType::F4E2M1x2
            && !self.shape.is_empty()
            && per_row > 0
            && n * per_row == data.len()
            && row.checked_add(n).is_some_and(|end| end <= rows);
        if !fits {
            return Err(Error::Shape {
                op: OP,
                tensor: "data",
                got: vec![data.len()],
                expected: format!(
                    "whole rows of {per_row} values from row {row} of {:?} (not packed FP4)",
                    self.shape
                ),
            });
        }
        match &mut self.storage {
            Storage::Host(_) => {
                self.as_mut_slice::<T>()?
                    .get_mut(row * per_row..(row + n) * per_row)
                    .ok_or_else(|| Error::Shape {
                        op: OP,
                        tensor: "data",
                        got: vec![data.len()],
                        expected: "rows inside the tensor".into(),
                    })?
                    .copy_from_slice(data);
                Ok(())
            }
            Storage::Cuda(b) => {
                b.write_range(self.dtype.storage_bytes(row * per_row), &T::le_bytes(data))
            }
        }
    }

    /// Copies the tensor to `device` (a clone when it is already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let storage = match (&self.storage, device) {
            (Storage::Host(h), Device::Cpu) => Storage::Host(h.clone()),
            (Storage::Host(h), Device::Cuda(d)) => Storage::Cuda(d.upload(&h.le_bytes())?),
            (Storage::Cuda(b), Device::Cpu) => Storage::Host(host_decode(
                "Tensor::to_device",
                self.dtype,
                &b.download()?,
            )?),
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

/// The error of a CUDA launch handed a host tensor (the op layer checks
/// devices first, so only a broken check reaches it).
fn not_on_cuda() -> Error {
    Error::DeviceMismatch {
        op: "CUDA launch",
        tensor: "operand",
        got: "cpu".into(),
        expected: "a CUDA device".into(),
    }
}
