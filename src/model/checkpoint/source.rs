//! [`TensorSource`]: where the weight loader (`model/load.rs`) reads stored
//! tensors from — a memory-mapped [`Checkpoint`], or seeded random weights
//! generated on demand ([`RandomWeights`](super::RandomWeights)) — so one
//! loader turns either into a model on any device.
//!
//! Invariant: a source hands out, for every tensor of its manifest, a
//! [`TensorView`] with the manifest's dtype and shape and exactly its bytes;
//! `release` only drops caches and never changes what a later read returns.

use super::loader::Checkpoint;
use super::view::TensorView;
use crate::device::Device;
use crate::model::Result;
use crate::tensor::Tensor;

/// A store of checkpoint tensors, read one at a time.
pub trait TensorSource: Sync {
    /// Calls `f` with the view of stored tensor `name` (an error naming it
    /// when the source has no such tensor).
    fn read<R>(&self, name: &str, f: impl FnOnce(TensorView<'_>) -> Result<R>) -> Result<R>;

    /// The loader holds its own copy of `name` (or will not load it): the
    /// source may drop what it keeps of it.
    fn release(&self, name: &str);

    /// The load is over: the source may drop every cache.
    fn release_all(&self);

    /// Stored tensor `name` made on `device` by the source itself, as the
    /// manifest stores it but laid out `[rows, cols]` (the loader reshapes),
    /// when the source can make it there without host bytes; `None` when it
    /// cannot, and the loader reads it through [`TensorSource::read`]. The
    /// bytes are those `read` hands out.
    fn on_device(&self, name: &str, device: &Device) -> Result<Option<Tensor>> {
        let _ = (name, device);
        Ok(None)
    }
}

impl TensorSource for Checkpoint {
    fn read<R>(&self, name: &str, f: impl FnOnce(TensorView<'_>) -> Result<R>) -> Result<R> {
        f(self.get(name)?)
    }

    /// Drops the tensor's pages from the page cache ([`Checkpoint::release`]).
    fn release(&self, name: &str) {
        Checkpoint::release(self, name);
    }

    fn release_all(&self) {
        Checkpoint::release_all(self);
    }
}
