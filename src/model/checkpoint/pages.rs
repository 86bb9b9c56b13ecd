//! The page-cache side of a memory-mapped shard: dropping a converted
//! tensor's pages ([`release`]) and counting resident bytes ([`resident`]).
//!
//! Invariant: a shard is a read-only, shared (`MAP_SHARED`) mapping of a
//! file nobody modifies while it is mapped (the checkpoint's mapping
//! invariant, `loader.rs`). Dropping its pages therefore never changes a
//! byte any borrow can see: a later read faults the same bytes back in from
//! the file. Dropping is a hint to the kernel; its failure is logged, never
//! an error. A range is widened to whole pages, so a neighbour tensor
//! sharing its first or last page may be read from the file again. The
//! kernel keeps a file's cache in folios of up to megabytes and drops only
//! whole ones, so a tensor's range alone may free nothing; the loader
//! therefore also drops a whole shard once its last tensor is released.

use memmap2::{Mmap, UncheckedAdvice};
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;

/// The host's page size (4096 when the query fails).
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system; no memory is
    // passed.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Drops the pages holding `bytes` (offsets into `map`, which maps `file`
/// from offset 0) from this process's mapping (`MADV_DONTNEED`) and then
/// from the page cache (`POSIX_FADV_DONTNEED`).
pub(super) fn release(map: &Mmap, file: &File, bytes: Range<usize>) {
    let page = page_size();
    let start = bytes.start / page * page;
    let end = bytes.end.next_multiple_of(page).min(map.len());
    if end <= start {
        return;
    }
    let len = end - start;
    // SAFETY: `start .. end` lies inside the mapping (clamped to its
    // length; `start` page-aligned, as madvise needs). DONTNEED on a read-only shared file mapping only unmaps the
    // pages: their contents are the file's, which nobody modifies while it
    // is mapped (the module invariant), so every live borrow of these
    // bytes reads the same values after the kernel faults them back in.
    if let Err(e) = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, len) } {
        tracing::debug!(%e, start, len, "madvise(DONTNEED) on a shard failed");
        return;
    }
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(start), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open (owned by `file` for the call) and the
    // range lies inside the file; fadvise passes no memory.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        tracing::debug!(rc, start, len, "posix_fadvise(DONTNEED) on a shard failed");
    }
}

/// Drops the whole shard (`map` maps all of `file`).
pub(super) fn release_all(map: &Mmap, file: &File) {
    release(map, file, 0..map.len());
}

/// Bytes of `map` resident in memory (the page cache), by `mincore`.
pub(super) fn resident(map: &Mmap) -> std::io::Result<usize> {
    if map.is_empty() {
        return Ok(0);
    }
    let page = page_size();
    let mut vec = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the mapping starts page-aligned (mmap's result) and is
    // `map.len()` bytes long; `vec` holds one byte per page of it, which is
    // what mincore writes.
    let rc = unsafe { libc::mincore(map.as_ptr().cast_mut().cast(), map.len(), vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec
        .iter()
        .filter(|&&b| b & 1 == 1)
        .count()
        .saturating_mul(page))
}
