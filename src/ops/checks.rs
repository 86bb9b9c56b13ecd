//! Range checks that CUDA kernels make on their index inputs, read back
//! later: an op given a [`DeviceChecks`] launches without waiting, its
//! kernel skips (and records) an out-of-range entry, and
//! [`DeviceChecks::verdict`] reads every recorded check in one sync and
//! turns the first failure into a typed error naming the op, its input and
//! the entry.
//! A step that already syncs once (for its logits) checks its whole batch
//! of launches at no extra sync; without it each op's check is a sync that
//! drains the stream.
//!
//! Invariant: every launch that took a slot is checked by the next
//! [`DeviceChecks::verdict`] (also taken when the slots run out), and a
//! check that is dropped unread never hides a memory fault: the kernels
//! skip the entries they record. On the CPU the ops check at once.

use crate::error::{Error, Result};

/// Slots allocated at once (one int64 each on the device).
#[cfg(deepinfer_cuda)]
const SLOTS: usize = 256;

/// Deferred range checks of one device (see the module doc).
#[derive(Default)]
pub struct DeviceChecks {
    #[cfg(deepinfer_cuda)]
    slots: Option<(crate::device::CudaDevice, crate::cuda_backend::BadSlots)>,
    /// Checks a CUDA graph replays ([`DeviceChecks::held`]): the slots' state
    /// before any launch wrote them, copied back by [`DeviceChecks::rearm`];
    /// the slots are then kept when read.
    #[cfg(deepinfer_cuda)]
    blank: Option<crate::cuda_backend::BadSlots>,
    /// The op and the input each used slot checks, in slot order.
    pending: Vec<(&'static str, &'static str)>,
}

impl DeviceChecks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks recorded and not yet read.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Checks for a CUDA graph whose launches record them: the slots are
    /// allocated now, outside the capture, and stay with the checks. The
    /// graph's work starts with [`DeviceChecks::rearm`]; after each launch
    /// [`DeviceChecks::verdict_replayed`] reads the checks the capture
    /// recorded, keeping the slots for the next launch.
    #[cfg(deepinfer_cuda)]
    pub fn held(dev: &crate::device::CudaDevice) -> Result<Self> {
        Ok(DeviceChecks {
            slots: Some((dev.clone(), crate::cuda_backend::BadSlots::new(dev, SLOTS)?)),
            blank: Some(crate::cuda_backend::BadSlots::new(dev, SLOTS)?),
            pending: Vec::new(),
        })
    }

    /// Of [`DeviceChecks::held`] checks: clears every slot on the device (a
    /// device copy, which a capture records) and forgets the pending checks.
    /// Other checks are left as they are.
    pub fn rearm(&mut self) -> Result<()> {
        #[cfg(deepinfer_cuda)]
        if let (Some((_, s)), Some(blank)) = (&mut self.slots, &self.blank) {
            s.copy_from(blank)?;
            self.pending.clear();
        }
        Ok(())
    }

    /// The checks recorded while capturing a graph (what each replay checks).
    pub fn recorded(&self) -> Vec<(&'static str, &'static str)> {
        self.pending.clone()
    }

    /// Of [`DeviceChecks::held`] checks, after a launch of the graph that
    /// recorded `recorded`: reads them (one sync) as
    /// [`DeviceChecks::verdict`] does, keeping the slots.
    pub fn verdict_replayed(&mut self, recorded: &[(&'static str, &'static str)]) -> Result<()> {
        self.pending = recorded.to_vec();
        self.verdict()
    }

    /// The next free slot on `dev` for a launch of `op` checking `input`:
    /// reads the verdict first when the slots are full or on another
    /// device or stream.
    #[cfg(deepinfer_cuda)]
    pub(crate) fn slot(
        &mut self,
        dev: &crate::device::CudaDevice,
        op: &'static str,
        input: &'static str,
    ) -> Result<(&mut crate::cuda_backend::BadSlots, usize)> {
        let fresh = match &self.slots {
            // One stream: the slots' memsets, the kernels writing them and
            // the read are ordered only within it.
            Some((d, s)) => d.same_stream(dev) && self.pending.len() < s.slots(),
            None => false,
        };
        if !fresh {
            self.verdict()?;
        }
        let (_, s) = match self.slots.take() {
            Some(held) if fresh => self.slots.insert(held),
            _ => self
                .slots
                .insert((dev.clone(), crate::cuda_backend::BadSlots::new(dev, SLOTS)?)),
        };
        let i = self.pending.len();
        self.pending.push((op, input));
        Ok((s, i))
    }

    /// The checked form of a `_deferred` op: runs `op` with checks of its
    /// own and reads them at once (one sync), `error` turning a failure into
    /// the op's typed error (naming the bad value it reads back).
    pub(crate) fn at_once<T>(
        op: impl FnOnce(&mut DeviceChecks) -> Result<T>,
        error: impl FnOnce(Failure) -> Result<Error>,
    ) -> Result<T> {
        let mut checks = DeviceChecks::new();
        let out = op(&mut checks)?;
        match checks.failure()? {
            None => Ok(out),
            Some(f) => Err(error(f)?),
        }
    }

    /// Reads every pending check (one sync when there are any) and returns
    /// the first failure as the op's typed error; the checks are then empty.
    pub fn verdict(&mut self) -> Result<()> {
        match self.failure()? {
            None => Ok(()),
            Some(f) => Err(Error::Argument {
                op: f.op,
                arg: f.input,
                value: format!("entry {}", f.at),
                why: "outside its range (found by the kernel, which skipped it)",
            }),
        }
    }

    /// [`DeviceChecks::verdict`] as data: the first failed check, if any.
    pub fn failure(&mut self) -> Result<Option<Failure>> {
        #[cfg(deepinfer_cuda)]
        if !self.pending.is_empty()
            && let Some(s) = if self.blank.is_some() {
                self.slots.as_ref().map(|(_, s)| s.read())
            } else {
                self.slots.take().map(|(_, s)| s.read())
            }
        {
            let pending = std::mem::take(&mut self.pending);
            let found = pending
                .iter()
                .zip(s?)
                .find_map(|(&(op, input), bad)| bad.map(|at| Failure { op, input, at }));
            return Ok(found);
        }
        self.pending.clear();
        Ok(None)
    }
}

/// Checks dropped unread (a step that failed for another reason before its
/// verdict) are reported, never silently lost: their kernels skipped the
/// entries they flagged, so no memory fault hides behind them.
impl Drop for DeviceChecks {
    fn drop(&mut self) {
        if let Some(&(op, input)) = self.pending.first() {
            tracing::warn!(
                pending = self.pending.len(),
                first_op = op,
                first_input = input,
                "device range checks dropped without a verdict"
            );
        }
    }
}

/// A range check a kernel failed: the op, its input and the position of
/// the first entry out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub op: &'static str,
    pub input: &'static str,
    pub at: usize,
}
