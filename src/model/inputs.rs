//! Static per-step inputs (issue 11, `docs/graph-decode.md`): every host
//! vector a step uploads (token ids, positions and owners, ring slots, the
//! rings' block tables, every table's bounds and sequence slots, compressor
//! members, visible counts, Engram n-gram ids and the rows of host Engram
//! tables with their index) goes through one arena, in
//! the order the step makes them. The sources' block tables stay on the
//! device (`pool::tables`) and enter the step's signature by
//! [`StepInputs::note`].
//! Upload i of a step reuses slot i's tensor when its dtype, shape and
//! device match: the values are written into the storage it already has
//! (`Tensor::write_from`; on a GPU the same device address, which a decode
//! step captured as a graph reads at its replay). Otherwise the slot gets a
//! new tensor. A byte upload filled in place ([`StepInputs::upload_bytes_with`],
//! the host Engram rows: tens of MB a prefill step) keeps its host staging
//! in the slot too, so a step neither allocates nor first-touches it again.
//!
//! Invariant: a slot's tensor is either in the arena or lent to exactly one
//! [`Input`], which gives it back when dropped; a step holds its inputs only
//! while it runs, so the next step finds them all back. A write is stream
//! ordered after the previous step's launches on the same stream (one
//! stream a device handle), so it never races the kernels still reading the
//! old values. A slot still lent when its upload comes again (an input kept
//! past its step) is not shared: that upload gets a fresh tensor.

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

/// The uploads of the current step and how many reused their slot's
/// storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputStats {
    pub uploads: usize,
    pub reused: usize,
}

/// What a step's device half reads from its host half, as a graph sees it:
/// an upload (the tensor's dtype, shape and device address, `None` on the
/// host), or a host value its launches take as a parameter
/// ([`StepInputs::fix`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UploadKey {
    Upload {
        dtype: crate::dtype::DType,
        shape: Vec<usize>,
        address: Option<u64>,
    },
    Value(usize),
}

/// A slot's tensor and, for byte uploads to a device, the host bytes it
/// was filled from (empty otherwise), kept for the next step's fill.
struct Slot {
    tensor: Tensor,
    staging: Vec<u8>,
}

#[derive(Default)]
struct Arena {
    slots: Vec<Option<Slot>>,
    next: usize,
    stats: InputStats,
    /// The current step's uploads so far, in order.
    keys: Vec<UploadKey>,
}

/// The arena of one state pool (one sequence of steps). A clone is another
/// handle on the same arena (so a layer can upload while it holds the pool
/// mutably).
#[derive(Clone, Default)]
pub struct StepInputs {
    arena: Arc<Mutex<Arena>>,
}

impl std::fmt::Debug for StepInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.lock();
        f.debug_struct("StepInputs")
            .field("slots", &a.slots.len())
            .field("stats", &a.stats)
            .finish()
    }
}

impl StepInputs {
    pub fn new() -> StepInputs {
        StepInputs::default()
    }

    /// A poisoned lock only means another thread panicked mid-upload; the
    /// slots are still whole tensors, so the arena goes on.
    fn lock(&self) -> MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a step: uploads are numbered from slot 0 again and the
    /// statistics restart.
    pub fn begin(&self) {
        let mut a = self.lock();
        a.next = 0;
        a.stats = InputStats::default();
        a.keys.clear();
    }

    /// The current step's uploads and fixed values so far, in order: two
    /// steps with equal signatures uploaded into the same tensors (the same
    /// device addresses) of the same shapes and launch with the same host
    /// values, which is what lets a CUDA graph captured in one replay in
    /// the other.
    pub fn signature(&self) -> Vec<UploadKey> {
        self.lock().keys.clone()
    }

    /// Records a host value that a launch of the step's device half takes
    /// as a parameter and no upload's shape implies (a top-k width): part
    /// of the step's signature, so a graph captured with another value is
    /// not replayed.
    pub fn fix(&self, value: usize) {
        self.lock().keys.push(UploadKey::Value(value));
    }

    /// Records a device tensor that the step's device half reads in place
    /// and the host half keeps up to date without an upload (the pool's
    /// block tables): its dtype, shape and address are part of the step's
    /// signature like an upload's, so a graph is replayed only while the
    /// tensor it captured is still the one in use.
    pub fn note(&self, t: &Tensor) {
        self.lock().keys.push(UploadKey::Upload {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            address: t.address(),
        });
    }

    /// Whether `other` is a handle on this same arena.
    pub fn same_as(&self, other: &StepInputs) -> bool {
        Arc::ptr_eq(&self.arena, &other.arena)
    }

    /// The current step's uploads so far.
    pub fn stats(&self) -> InputStats {
        self.lock().stats
    }

    /// `values` as a tensor of `shape` on `device`, in the step's next slot.
    /// A wrong element count is a shape error naming `values` (and takes
    /// no slot).
    pub fn upload<T: Element>(
        &self,
        values: Vec<T>,
        shape: &[usize],
        device: &Device,
    ) -> Result<Input> {
        let want = shape
            .iter()
            .try_fold(T::PER_UNIT.max(1), |n, &d| n.checked_mul(d));
        if want.map(|n| n / T::PER_UNIT.max(1)) != Some(values.len()) {
            return Err(Error::Shape {
                op: "StepInputs::upload",
                tensor: "values",
                got: vec![values.len()],
                expected: format!("the element count of shape {shape:?}"),
            });
        }
        let mut a = self.lock();
        let slot = a.next_slot();
        let kept = take_matching(&mut a, slot, T::DTYPE, shape, device);
        let (tensor, staging) = match kept {
            Some(mut s) => {
                s.tensor.write_from(&values)?;
                a.stats.reused += 1;
                (s.tensor, s.staging)
            }
            None => (
                Tensor::from_vec(values, shape)?.to_device(device)?,
                Vec::new(),
            ),
        };
        Ok(a.lend(&self.arena, slot, tensor, staging))
    }

    /// A U8 tensor of `shape` on `device` in the step's next slot, its
    /// bytes written by `fill` (given every byte, row-major; what it does
    /// not write is unspecified) where they are kept between steps: on the
    /// host the slot's tensor itself, on a GPU the slot's host staging,
    /// then copied in one write. Neither is allocated again while the
    /// slot's shape stays. On an error of `fill` the slot keeps its tensor
    /// for the next step. `fill` runs under the arena's lock: it must not
    /// upload through this arena.
    pub fn upload_bytes_with(
        &self,
        shape: &[usize],
        device: &Device,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Input> {
        let mut a = self.lock();
        let slot = a.next_slot();
        let (mut s, reused) = match take_matching(&mut a, slot, DType::U8, shape, device) {
            Some(s) => (s, true),
            None => {
                let tensor = Tensor::empty(device, DType::U8, shape)?;
                let staging = Vec::new();
                (Slot { tensor, staging }, false)
            }
        };
        if let Err(e) = fill_bytes(&mut s.tensor, &mut s.staging, fill) {
            if let Some(free) = a.slots.get_mut(slot) {
                *free = Some(s);
            }
            return Err(e);
        }
        if reused {
            a.stats.reused += 1;
        }
        Ok(a.lend(&self.arena, slot, s.tensor, s.staging))
    }
}

/// Slot `slot`'s tensor, taken out of the arena when its dtype, shape and
/// device match an upload's; otherwise the slot is emptied (its tensor
/// freed).
fn take_matching(
    a: &mut Arena,
    slot: usize,
    dtype: DType,
    shape: &[usize],
    device: &Device,
) -> Option<Slot> {
    a.slots.get_mut(slot).and_then(Option::take).filter(|s| {
        let t = &s.tensor;
        t.dtype() == dtype && t.shape() == shape && t.device().same_as(device)
    })
}

/// Writes `fill`'s bytes into U8 `tensor`: in place on the host; through
/// `staging` (resized to the tensor's bytes, allocated once) on a device.
fn fill_bytes(
    tensor: &mut Tensor,
    staging: &mut Vec<u8>,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<()> {
    if matches!(tensor.device(), Device::Cpu) {
        return fill(tensor.as_mut_slice::<u8>()?);
    }
    let n = tensor.numel();
    if staging.len() != n {
        staging.clear();
        staging.try_reserve_exact(n).map_err(|_| Error::Argument {
            op: "StepInputs::upload_bytes_with",
            arg: "shape",
            value: format!("{:?}", tensor.shape()),
            why: "the host could not hold the upload's staging bytes",
        })?;
        staging.resize(n, 0);
    }
    fill(staging)?;
    tensor.write_from(staging)
}

impl Arena {
    /// Takes the step's next slot number (the slot exists, maybe empty)
    /// and counts the upload.
    fn next_slot(&mut self) -> usize {
        let slot = self.next;
        self.next += 1;
        self.stats.uploads += 1;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        slot
    }

    /// Lends slot `slot`'s new tensor to an [`Input`] and records it in the
    /// step's signature.
    fn lend(
        &mut self,
        arena: &Arc<Mutex<Arena>>,
        slot: usize,
        tensor: Tensor,
        staging: Vec<u8>,
    ) -> Input {
        self.keys.push(UploadKey::Upload {
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            address: tensor.address(),
        });
        Input {
            tensor,
            staging,
            arena: Arc::clone(arena),
            slot,
        }
    }
}

/// Two handles are equal when they are handles on one arena
/// ([`StepInputs::same_as`]): a graph's signature holds its arena.
impl PartialEq for StepInputs {
    fn eq(&self, other: &StepInputs) -> bool {
        self.same_as(other)
    }
}

/// A step input: derefs to its tensor, which goes back to its slot when the
/// input is dropped.
pub struct Input {
    tensor: Tensor,
    /// A byte upload's host staging ([`StepInputs::upload_bytes_with`]).
    staging: Vec<u8>,
    arena: Arc<Mutex<Arena>>,
    slot: usize,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("slot", &self.slot)
            .field("tensor", &self.tensor)
            .finish()
    }
}

impl Input {
    /// Overwrites the input's values in place (its tensor keeps its storage
    /// and, on a GPU, its address: the step's signature does not change).
    pub(crate) fn rewrite<T: Element>(&mut self, values: &[T]) -> Result<()> {
        self.tensor.write_from(values)
    }

    /// Overwrites a U8 input's bytes in place with `fill`'s, as
    /// [`StepInputs::upload_bytes_with`] wrote them (through the same
    /// staging on a device). A failing `fill`'s error is returned: on a
    /// device the tensor keeps its values (only the staging was written),
    /// on the host it holds whatever `fill` wrote before failing.
    pub(crate) fn rewrite_bytes_with(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.tensor
            .expect_dtype("Input::rewrite_bytes_with", "self", DType::U8)?;
        fill_bytes(&mut self.tensor, &mut self.staging, fill)
    }
}

impl Deref for Input {
    type Target = Tensor;

    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        let tensor = std::mem::replace(&mut self.tensor, Tensor::placeholder());
        let staging = std::mem::take(&mut self.staging);
        let mut a = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = a.slots.get_mut(self.slot) {
            *s = Some(Slot { tensor, staging });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Input::rewrite_bytes_with` overwrites a byte input in place, keeps
    /// its values when the fill fails, and refuses a typed input.
    #[test]
    fn rewrite_bytes_with_overwrites_in_place() {
        let inputs = StepInputs::new();
        let cpu = Device::Cpu;
        inputs.begin();
        let mut t = inputs
            .upload_bytes_with(&[3, 5], &cpu, |out| {
                out.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
                Ok(())
            })
            .unwrap();
        let at = t.as_slice::<u8>().unwrap().as_ptr();
        t.rewrite_bytes_with(|out| {
            out.iter_mut().for_each(|b| *b = 0xC3);
            Ok(())
        })
        .unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), vec![0xC3; 15]);
        assert_eq!(t.as_slice::<u8>().unwrap().as_ptr(), at, "in place");
        let e = t
            .rewrite_bytes_with(|_| {
                Err(Error::Argument {
                    op: "test",
                    arg: "fill",
                    value: "1".into(),
                    why: "a failing fill",
                })
            })
            .unwrap_err();
        assert!(matches!(e, Error::Argument { op: "test", .. }), "{e}");
        let mut typed = inputs.upload(vec![1i32, 2], &[2], &cpu).unwrap();
        let e = typed.rewrite_bytes_with(|_| Ok(())).unwrap_err();
        assert!(matches!(e, Error::DType { .. }), "{e}");
        assert_eq!(typed.to_vec::<i32>().unwrap(), [1, 2]);
    }
}
