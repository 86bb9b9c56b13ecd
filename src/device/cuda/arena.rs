//! Capture arenas: the temporaries of a captured step carved from one block
//! of device memory, so that its CUDA graph holds no allocation or free
//! node between two kernels (such a node stops a programmatic edge).
//!
//! Invariant: two live buffers carved from one block never share a byte,
//! and a freed range is handed out again only to an allocation issued after
//! the free, on the same stream. Stream order then orders every use of the
//! bytes, as for the stream-ordered pool: the last kernel reading a freed
//! buffer completes before a later kernel on the stream passes its entry
//! (a plain launch starts after it; a programmatic dependent waits in
//! `DI_PDL_ENTRY()` for its predecessor, which waited for its own). A
//! replay repeats the captured sequence, so the same reuse holds there.

use super::{CudaDevice, CudaSlice, DevicePtr, Error, Result};
use cudarc::driver::sys;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Alignment of every carved buffer: the driver's allocation granularity,
/// which the launchers' alignment checks assume.
pub const ARENA_ALIGN: usize = 256;

/// `bytes` rounded up to [`ARENA_ALIGN`] (saturating).
pub(super) fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(ARENA_ALIGN).saturating_mul(ARENA_ALIGN)
}

/// One block of device memory that a captured step's allocations are
/// carved from ([`CudaDevice::with_arena`]). The block goes back to the
/// pool when the graph and every buffer carved from it are gone (each
/// holds it).
/// A block serves one [`CudaDevice::with_arena`] only: once its ranges
/// are forgotten, a second use could hand out bytes that buffers or a graph
/// of the first still use.
#[derive(Clone)]
pub struct CaptureArena(pub(super) Arc<CudaSlice<u8>>, Arc<AtomicBool>);

impl CaptureArena {
    pub fn bytes(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for CaptureArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaptureArena({} bytes)", self.0.len())
    }
}

/// Where a carved buffer's bytes are: its block, offset and rounded length
/// (given back on drop).
pub(super) struct Carved {
    pub(super) block: CaptureArena,
    at: usize,
    len: usize,
}

/// Byte ranges of a block: the smallest freed range that fits (its start),
/// else the top of the bump region. Freed ranges are merged with their
/// neighbours; one that reaches the top lowers it.
#[derive(Debug, Default)]
pub(super) struct ArenaRanges {
    capacity: usize,
    /// Bytes below `top` are carved or free.
    top: usize,
    /// Free ranges below `top`: offset → length, disjoint, never adjacent.
    free: std::collections::BTreeMap<usize, usize>,
    /// The highest `top` reached: the block size the sequence needed.
    high: usize,
}

impl ArenaRanges {
    pub(super) fn new(capacity: usize) -> ArenaRanges {
        ArenaRanges {
            capacity,
            ..ArenaRanges::default()
        }
    }

    /// The offset of `len` bytes (a multiple of the alignment, > 0), or
    /// `None` when nothing fits.
    pub(super) fn take(&mut self, len: usize) -> Option<usize> {
        let best = self
            .free
            .iter()
            .filter(|&(_, &have)| have >= len)
            .min_by_key(|&(_, &have)| have)
            .map(|(&at, &have)| (at, have));
        if let Some((at, have)) = best {
            self.free.remove(&at);
            if have > len {
                self.free.insert(at + len, have - len);
            }
            return Some(at);
        }
        let end = self.top.checked_add(len).filter(|&e| e <= self.capacity)?;
        let at = self.top;
        self.top = end;
        self.high = self.high.max(end);
        Some(at)
    }

    /// Returns `len` bytes at `at` (a range `take` gave and not yet given
    /// back).
    pub(super) fn give(&mut self, at: usize, len: usize) {
        let (mut start, mut end) = (at, at + len);
        if let Some((&p_at, &p_len)) = self.free.range(..at).next_back()
            && p_at + p_len == start
        {
            self.free.remove(&p_at);
            start = p_at;
        }
        if let Some(n_len) = self.free.remove(&end) {
            end += n_len;
        }
        if end == self.top {
            self.top = start;
        } else {
            self.free.insert(start, end - start);
        }
    }

    pub(super) fn high(&self) -> usize {
        self.high
    }
}

/// An arena in use: its block, the stream whose allocations it serves and
/// its ranges.
pub(super) struct ActiveArena {
    block: CaptureArena,
    stream: sys::CUstream,
    ranges: ArenaRanges,
    /// The allocations that found no room, and their rounded bytes.
    spills: usize,
    spilled_bytes: usize,
}

/// What a [`CudaDevice::with_arena`] left behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaReport {
    /// Every carved buffer was dropped inside (a buffer that outlives a
    /// capture would share bytes with the ones freed before it, which every
    /// replay rewrites).
    pub clean: bool,
    /// Allocations that found no room in the block and came from the pool
    /// (each an allocation and a free node in a captured graph), and their
    /// bytes rounded to [`ARENA_ALIGN`].
    pub spills: usize,
    pub spilled_bytes: usize,
}

// SAFETY: `stream` is only compared with other stream handles, never used
// to issue work, so moving it between threads cannot race.
unsafe impl Send for ActiveArena {}

/// Bytes of the device's own (pool) buffers alive now, and the most alive
/// at once since the last [`CudaDevice::track_peak`] began: what a step
/// needs at its peak, which sizes the arena of its capture.
#[derive(Debug, Default)]
pub(super) struct Usage {
    live: AtomicU64,
    peak: AtomicU64,
    /// The fewest bytes alive since the window began: buffers older than
    /// the window freed inside it lower it, so the window's need is
    /// `peak − low`, not `peak − start` (an over-estimate by at most what
    /// the window freed after its peak).
    low: AtomicU64,
}

impl Usage {
    pub(super) fn add(&self, bytes: usize) {
        let b = u64::try_from(bytes).unwrap_or(u64::MAX);
        let now = self.live.fetch_add(b, Ordering::Relaxed).saturating_add(b);
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, bytes: usize) {
        let b = u64::try_from(bytes).unwrap_or(u64::MAX);
        // Saturating: a count can only be low, never wrap.
        let before = self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                Some(l.saturating_sub(b))
            })
            .unwrap_or(0);
        self.low
            .fetch_min(before.saturating_sub(b), Ordering::Relaxed);
    }
}

impl CudaDevice {
    /// `bytes` (`len` once rounded) carved from this stream's active arena,
    /// if it has one with room: the slice and where it lies.
    pub(super) fn carve(&self, bytes: usize, len: usize) -> Option<(CudaSlice<u8>, Carved)> {
        if bytes == 0 {
            return None;
        }
        let mut active = self
            .arena
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let a = active
            .as_mut()
            .filter(|a| a.stream == self.stream.cu_stream())?;
        let Some(at) = a.ranges.take(len) else {
            a.spills += 1;
            a.spilled_bytes = a.spilled_bytes.saturating_add(len);
            return None;
        };
        let (base, _guard) = a.block.0.device_ptr(&self.stream);
        // SAFETY: `at .. at + len` lies inside the block and is carved
        // from it for this buffer alone until it is given back (the
        // module's invariant); the buffer holds the block, and its drop
        // leaks this slice instead of freeing it (`CudaBuffer::drop`).
        let slice = unsafe {
            self.stream
                .upgrade_device_ptr::<u8>(base + at as u64, bytes)
        };
        let carved = Carved {
            block: a.block.clone(),
            at,
            len,
        };
        Some((slice, carved))
    }

    /// Gives a dropped buffer's carved bytes back to the arena they came
    /// from, if it is still active (after the capture, the block is the
    /// graph's and nothing more is carved from it).
    pub(super) fn give_back(&self, c: &Carved) {
        let mut active = self
            .arena
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(a) = active
            .as_mut()
            .filter(|a| Arc::ptr_eq(&a.block.0, &c.block.0))
        {
            a.ranges.give(c.at, c.len);
        }
    }

    /// Bytes of the arena active on this handle's stream that its
    /// allocations have needed at most so far (`None` outside
    /// [`CudaDevice::with_arena`]).
    pub fn arena_used(&self) -> Option<usize> {
        let active = self
            .arena
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        active
            .as_ref()
            .filter(|a| a.stream == self.stream.cu_stream())
            .map(|a| a.ranges.high())
    }

    /// A block of `bytes` for [`CudaDevice::with_arena`] (from the pool, in
    /// stream order; not inside a capture).
    pub fn capture_arena(&self, bytes: usize) -> Result<CaptureArena> {
        self.refuse_in_capture("allocating a capture arena")?;
        Ok(CaptureArena(
            Arc::new(self.alloc_slice(bytes.max(1))?),
            Arc::default(),
        ))
    }

    /// Runs `f` with every allocation this handle's stream makes carved from
    /// `arena` (one that does not fit comes from the pool as usual), then
    /// returns to the pool, even when `f` panics. Meant around a capture:
    /// the graph then holds no allocation or free node for them. Returns
    /// `f`'s result and the [`ArenaReport`]: whether every carved buffer
    /// was dropped inside, and what spilled to the pool. Refused for a
    /// block used before, one of another stream, or while an arena is
    /// active.
    pub fn with_arena<T>(
        &self,
        arena: &CaptureArena,
        f: impl FnOnce() -> T,
    ) -> Result<(T, ArenaReport)> {
        let refuse = |why| Error::Argument {
            op: "CudaDevice::with_arena",
            arg: "arena",
            value: format!("{arena:?}"),
            why,
        };
        if !Arc::ptr_eq(arena.0.stream(), &self.stream) {
            return Err(refuse("a block of another stream"));
        }
        {
            let mut slot = self
                .arena
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.is_some() {
                return Err(refuse("another arena is active on this device"));
            }
            if arena.1.swap(true, Ordering::Relaxed) {
                return Err(refuse("the block served a capture before"));
            }
            *slot = Some(ActiveArena {
                block: arena.clone(),
                stream: self.stream.cu_stream(),
                ranges: ArenaRanges::new(arena.bytes()),
                spills: 0,
                spilled_bytes: 0,
            });
        }
        /// Takes the arena down when dropped (also on a panic in `f`) and
        /// reports whether its ranges all came back and what spilled.
        struct Active<'a>(&'a CudaDevice);
        impl Active<'_> {
            fn finish(self) -> ArenaReport {
                let a = self
                    .0
                    .arena
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                a.map_or(ArenaReport::default(), |a| ArenaReport {
                    clean: a.ranges.top == 0,
                    spills: a.spills,
                    spilled_bytes: a.spilled_bytes,
                })
            }
        }
        impl Drop for Active<'_> {
            fn drop(&mut self) {
                *self
                    .0
                    .arena
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            }
        }
        let active = Active(self);
        let out = f();
        Ok((out, active.finish()))
    }

    /// Runs `f` and returns, beside its result, the most bytes of this
    /// device's own buffers alive at once while it ran, above the fewest
    /// alive in that time (each rounded to [`ARENA_ALIGN`]; all handles of
    /// the device count, so another thread's work can inflate it): an eager
    /// step's peak, the arena its capture needs.
    pub fn track_peak<T>(&self, f: impl FnOnce() -> T) -> (T, u64) {
        let base = self.usage.live.load(Ordering::Relaxed);
        self.usage.peak.store(base, Ordering::Relaxed);
        self.usage.low.store(base, Ordering::Relaxed);
        let out = f();
        let peak = self.usage.peak.load(Ordering::Relaxed);
        let low = self.usage.low.load(Ordering::Relaxed);
        (out, peak.saturating_sub(low))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random sequence of takes and gives (stack-like and out of order,
    /// as a step's temporaries are): live ranges never overlap, stay inside
    /// the capacity and on the alignment; everything given back leaves an
    /// empty block; the high-water mark bounds every live set's end.
    #[test]
    fn carved_ranges_never_overlap_and_return_whole() {
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        for round in 0..50 {
            let capacity = 64 * ARENA_ALIGN * (1 + round % 7);
            let mut r = ArenaRanges::new(capacity);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for _ in 0..400 {
                if live.is_empty() || !next().is_multiple_of(3) {
                    let len = rounded(1 + (next() % (6 * ARENA_ALIGN as u64)) as usize);
                    if let Some(at) = r.take(len) {
                        assert_eq!(at % ARENA_ALIGN, 0);
                        assert!(at + len <= capacity);
                        for &(o, l) in &live {
                            assert!(at + len <= o || o + l <= at, "{at}+{len} overlaps {o}+{l}");
                        }
                        live.push((at, len));
                    } else {
                        // Nothing fits: the live bytes plus the request
                        // exceed the block, or the free space is split.
                        assert!(live.iter().map(|l| l.1).sum::<usize>() > 0);
                    }
                } else {
                    let i = (next() % live.len() as u64) as usize;
                    let (at, len) = live.swap_remove(i);
                    r.give(at, len);
                }
                let end = live.iter().map(|&(o, l)| o + l).max().unwrap_or(0);
                assert!(end <= r.high() && r.high() <= capacity);
                assert!(r.top >= end, "top {} below a live range's end {end}", r.top);
            }
            while let Some((at, len)) = live.pop() {
                r.give(at, len);
            }
            assert_eq!((r.top, r.free.len()), (0, 0), "round {round}");
        }
    }

    /// Freed space is reused before the block grows: a step's
    /// allocate-use-free pattern stays at its peak.
    #[test]
    fn freed_ranges_are_reused_best_fit() {
        let a = ARENA_ALIGN;
        let mut r = ArenaRanges::new(100 * a);
        let x = r.take(4 * a).unwrap();
        let y = r.take(2 * a).unwrap();
        let z = r.take(8 * a).unwrap();
        assert_eq!((x, y, z), (0, 4 * a, 6 * a));
        r.give(x, 4 * a);
        r.give(y, 2 * a);
        // x and y merged into 6a at 0; z still live up to 14a.
        assert_eq!(r.take(5 * a), Some(0));
        assert_eq!(r.take(a), Some(5 * a));
        assert_eq!(r.take(a), Some(14 * a));
        assert_eq!(r.high(), 15 * a);
        // A 200a request never fits.
        assert_eq!(r.take(200 * a), None);
    }
}
