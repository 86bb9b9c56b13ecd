//! Time and memory limits a test sets on a case: [`Counting`], a global
//! allocator that counts each thread's live bytes and, while a [`bounded`]
//! case runs on that thread, refuses any allocation that would take the
//! thread past the case's byte limit (the binary then aborts with the
//! allocator's message instead of taking the machine); [`bounded`] runs the
//! case and fails when it took longer than its time limit; [`capped`] runs
//! a case whose refused request is meant to be handled (a fallible
//! reservation) and reports whether one was.
//!
//! Invariant: counting is per thread (so the other tests of a binary, which
//! run beside it, do not count against a case) and covers the case's own
//! thread, where validation and sizing run; a test binary installs the
//! allocator with `#[global_allocator] static ALLOC: Counting = Counting;`,
//! and [`bounded`] fails when it is not installed, so no limit passes
//! vacuously.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The counting allocator (see the module doc).
pub struct Counting;

static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Bytes allocated minus bytes freed by this thread (may go negative
    /// when it frees another thread's allocations).
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// The most LIVE may reach while a bounded case runs (i64::MAX: none).
    static CAP: Cell<i64> = const { Cell::new(i64::MAX) };
    /// The highest LIVE since the case began.
    static PEAK: Cell<i64> = const { Cell::new(0) };
    /// Whether a request was refused for the cap since the case began.
    static REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// Whether `bytes` more fit under this thread's cap; counts them if so.
fn take(bytes: usize) -> bool {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    let live = LIVE.try_with(Cell::get).unwrap_or(0);
    let cap = CAP.try_with(Cell::get).unwrap_or(i64::MAX);
    let after = live.saturating_add(bytes);
    if after > cap {
        let _ = REFUSED.try_with(|r| r.set(true));
        return false;
    }
    let _ = LIVE.try_with(|l| l.set(after));
    let _ = PEAK.try_with(|p| p.set(p.get().max(after)));
    true
}

fn give(bytes: usize) {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(bytes)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// wrapper only counts bytes in const-initialised thread locals (no
// allocation, no destructor) and may return null for a request over the
// cap, which GlobalAlloc allows (the caller then reports the failure).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        if !take(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed through.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            give(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from alloc/realloc above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        give(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grow = new_size.saturating_sub(layout.size());
        if !take(grow) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed through.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            give(grow);
        } else {
            give(layout.size().saturating_sub(new_size));
        }
        p
    }
}

/// What a bounded case used: its wall time and the peak of its thread's
/// live bytes above their level at its start.
#[derive(Clone, Copy, Debug)]
pub struct Used {
    pub time: Duration,
    pub bytes: u64,
}

/// Restores the thread's cap, peak and refusal flag when a case ends,
/// also by a panic (proptest catches those and runs further cases).
struct Restore {
    cap: i64,
    peak: i64,
    refused: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        CAP.with(|c| c.set(self.cap));
        PEAK.with(|p| p.set(p.get().max(self.peak)));
        REFUSED.with(|r| r.set(self.refused));
    }
}

/// Runs `case` with at most `bytes` allocated (peak, above the live bytes
/// at its start, on this thread) and fails the test when it took longer than
/// `time` or had a request refused. Returns the case's result and what it
/// used.
pub fn bounded<R>(label: &str, bytes: u64, time: Duration, case: impl FnOnce() -> R) -> (R, Used) {
    let (r, used, refused) = capped_run(label, bytes, case);
    assert!(
        used.time <= time,
        "{label}: took {:?} (limit {time:?})",
        used.time
    );
    assert!(
        !refused,
        "{label}: asked for more than its {bytes} bytes (the request was refused)"
    );
    (r, used)
}

/// Runs `case` under [`bounded`]'s byte cap, for a case whose allocation is
/// meant to be refused and handled (a fallible reservation): returns its
/// result and whether a request was refused, and fails nothing itself.
pub fn capped<R>(label: &str, bytes: u64, case: impl FnOnce() -> R) -> (R, bool) {
    let (r, _, refused) = capped_run(label, bytes, case);
    (r, refused)
}

fn capped_run<R>(label: &str, bytes: u64, case: impl FnOnce() -> R) -> (R, Used, bool) {
    // One small allocation to prove the counting allocator is installed.
    drop(std::hint::black_box(Box::new(0u8)));
    assert!(
        INSTALLED.load(Ordering::Relaxed),
        "{label}: the test binary must install common::limits::Counting"
    );
    let base = LIVE.with(Cell::get);
    let restore = Restore {
        cap: CAP.with(Cell::get),
        peak: PEAK.with(|p| p.replace(base)),
        refused: REFUSED.with(|r| r.replace(false)),
    };
    CAP.with(|c| c.set(base.saturating_add(i64::try_from(bytes).unwrap_or(i64::MAX))));
    let t0 = Instant::now();
    let r = case();
    let took = t0.elapsed();
    let (peak, refused) = (PEAK.with(Cell::get), REFUSED.with(Cell::get));
    drop(restore);
    let used = Used {
        time: took,
        bytes: u64::try_from(peak.saturating_sub(base)).unwrap_or(0),
    };
    (r, used, refused)
}
