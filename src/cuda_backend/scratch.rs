//! Per-stream split-K scratch shared by the GEMM launchers (`gemm` and
//! `gemm_skinny`): an fp32 partials workspace and the ticket counters of the
//! kernels whose last CTA of an output tile adds the splits.
//!
//! Invariant: a stream runs its launches in order, so one buffer per stream
//! is never used by two launches at once (a launch's partials are consumed
//! by that launch, or by the reduce kernel queued right after it); launches
//! on different streams use different buffers. The tickets are zeroed when
//! allocated and every launch that takes one leaves it zero. The workspace
//! is fully written by a launch before it is read, so a poisoned allocation
//! stays harmless. A cached buffer keeps its stream alive (the key cannot
//! be reused by another stream) until the process ends. Buffers only grow.

use crate::device::{CudaBuffer, CudaDevice};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// One stream's scratch.
#[derive(Default)]
pub(super) struct Scratch {
    workspace: Option<CudaBuffer>,
    tickets: Option<CudaBuffer>,
}

/// Buffers replaced so far, any stream: a CUDA graph that captured a
/// launch reading the scratch holds its old address, so a graph is replayed
/// only while this is unchanged since its capture (`model::graph`).
static REPLACED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many scratch buffers have been replaced (freed for a larger one) so
/// far: a graph captured before a replacement may hold a freed address.
pub fn generation() -> u64 {
    REPLACED.load(std::sync::atomic::Ordering::Acquire)
}

/// Scratch by stream (the address of the stream object, kept alive by the
/// buffers' device handles).
static SCRATCH: LazyLock<Mutex<HashMap<usize, Scratch>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The scratch table, locked: hold it until the launches that use a buffer
/// are queued.
pub(super) fn lock() -> MutexGuard<'static, HashMap<usize, Scratch>> {
    SCRATCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Scratch {
    /// `dev`'s stream's scratch in the locked table.
    pub(super) fn of<'t>(
        table: &'t mut HashMap<usize, Scratch>,
        dev: &CudaDevice,
    ) -> &'t mut Scratch {
        table
            .entry(Arc::as_ptr(dev.raw_stream()) as usize)
            .or_default()
    }

    /// The fp32 workspace, at least `bytes` (contents unspecified).
    pub(super) fn workspace(&mut self, dev: &CudaDevice, bytes: usize) -> Result<&mut CudaBuffer> {
        ensure(&mut self.workspace, dev, bytes, false)
    }

    /// The workspace and at least `bytes` of tickets (all zero).
    pub(super) fn workspace_and_tickets(
        &mut self,
        dev: &CudaDevice,
        ws_bytes: usize,
        ticket_bytes: usize,
    ) -> Result<(&mut CudaBuffer, &mut CudaBuffer)> {
        ensure(&mut self.workspace, dev, ws_bytes, false)?;
        ensure(&mut self.tickets, dev, ticket_bytes, true)?;
        match (self.workspace.as_mut(), self.tickets.as_mut()) {
            (Some(w), Some(t)) => Ok((w, t)),
            _ => Err(missing(ws_bytes)),
        }
    }
}

/// A cached buffer of at least `bytes`: reused, or replaced by a larger one
/// (the old one is freed in stream order, after the launches that use it).
/// `zeroed`: a new buffer is zeroed by a memset on the stream (tickets; no
/// host buffer, so it may happen inside a graph capture); otherwise it comes
/// from `dev.alloc` (the launch overwrites it before reading).
fn ensure<'s>(
    slot: &'s mut Option<CudaBuffer>,
    dev: &CudaDevice,
    bytes: usize,
    zeroed: bool,
) -> Result<&'s mut CudaBuffer> {
    if slot.as_ref().is_none_or(|b| b.len() < bytes) {
        // A buffer made inside a capture would be the graph's, and the one
        // it replaces freed there: a graph is captured after a step of its
        // shapes ran eagerly (`model::graph`), which grew the scratch.
        dev.refuse_in_capture("growing the split-K scratch")?;
        if slot.is_some() {
            REPLACED.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        *slot = None;
        *slot = Some(if zeroed {
            dev.zeroed(bytes)?
        } else {
            dev.alloc(bytes)?
        });
    }
    slot.as_mut().ok_or_else(|| missing(bytes))
}

fn missing(bytes: usize) -> Error {
    Error::Argument {
        op: "gemm split-K",
        arg: "workspace",
        value: bytes.to_string(),
        why: "the split-K workspace was not allocated",
    }
}
