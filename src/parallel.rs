//! Host data parallelism for the few host loops that need it: the
//! sparse-MQA CPU reference, the Engram host-table gather, the random-weight
//! generator and the engine's sampled rows.
//!
//! Invariant: a result never depends on the number of threads or on which
//! thread ran which piece (each piece writes only what it owns), and a
//! thread that cannot start leaves its pieces to the others (the calling
//! thread always works), so a host short of threads is slower, never wrong.
//! A helper thread that panics is an error (built by the caller), not a
//! panic of the caller.

use std::sync::{Mutex, PoisonError};

/// The host's hardware threads (1 when unknown).
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `f` on every piece of `work` on the calling thread and up to
/// `threads - 1` helpers, each taking the next piece when it is free.
/// The first error stops the pieces not yet taken and is returned; a
/// helper that panicked returns `panicked()`.
pub fn try_for_each<T: Send, E: Send>(
    work: Vec<T>,
    threads: usize,
    f: impl Fn(T) -> Result<(), E> + Sync,
    panicked: impl Fn() -> E,
) -> Result<(), E> {
    let threads = threads.min(work.len());
    if threads <= 1 {
        return work.into_iter().try_for_each(f);
    }
    let queue = Mutex::new(work);
    let failed: Mutex<Option<E>> = Mutex::new(None);
    let drain = || loop {
        // The lock is held for the pop only (the guard ends with the
        // statement); a poisoned queue still holds the pieces left.
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let Some(piece) = next else { break };
        if let Err(e) = f(piece) {
            queue.lock().unwrap_or_else(PoisonError::into_inner).clear();
            failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(e);
            break;
        }
    };
    let helper_panicked = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads)
            // A helper that cannot start is not a failure: see the invariant.
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(scope, drain).ok())
            .collect();
        drain();
        // Every helper is joined (an unjoined one that panicked would make
        // the scope panic).
        let mut panicked = false;
        for h in helpers {
            panicked |= h.join().is_err();
        }
        panicked
    });
    match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None if helper_panicked => Err(panicked()),
        None => Ok(()),
    }
}

/// `f` of every item, in item order, computed on up to `threads` threads
/// (contiguous blocks of items, several a thread so that uneven items
/// balance). Each item's result is its own: one item's error does not
/// stop the others. The outer error is only `panicked()`.
pub fn map<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R, E> + Sync,
    panicked: impl Fn() -> E,
) -> Result<Vec<Result<R, E>>, E> {
    let threads = threads.min(items.len());
    if threads <= 1 {
        return Ok(items.iter().map(f).collect());
    }
    let mut out: Vec<Option<Result<R, E>>> = items.iter().map(|_| None).collect();
    let per = items.len().div_ceil(threads * 4).max(1);
    let blocks: Vec<_> = out.chunks_mut(per).zip(items.chunks(per)).collect();
    try_for_each(
        blocks,
        threads,
        |(slots, items)| {
            for (slot, item) in slots.iter_mut().zip(items) {
                *slot = Some(f(item));
            }
            Ok(())
        },
        &panicked,
    )?;
    // Every slot was written unless a helper panicked (returned above).
    out.into_iter()
        .map(|r| r.ok_or_else(&panicked))
        .collect::<Result<Vec<_>, E>>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn boom() -> Error {
        Error::Argument {
            op: "parallel test",
            arg: "threads",
            value: "helper".into(),
            why: "panicked",
        }
    }

    /// Every piece runs exactly once, whatever the thread count (1 to
    /// more threads than pieces).
    #[test]
    fn every_piece_runs_once() {
        for threads in [1, 2, 3, 7, 64] {
            let mut seen = vec![0u32; 1000];
            let work: Vec<_> = seen.chunks_mut(13).enumerate().collect();
            try_for_each(
                work,
                threads,
                |(i, c)| {
                    for (j, s) in c.iter_mut().enumerate() {
                        *s += (i * 13 + j) as u32 + 1;
                    }
                    Ok(())
                },
                boom,
            )
            .unwrap();
            let want: Vec<u32> = (1..=1000).collect();
            assert_eq!(seen, want, "threads {threads}");
        }
    }

    /// The map keeps item order and each item's own error.
    #[test]
    fn map_keeps_order_and_errors() {
        let items: Vec<u64> = (0..517).collect();
        for threads in [1, 2, 5, 16] {
            let got = map(
                &items,
                threads,
                |&x| {
                    if x % 100 == 7 { Err(boom()) } else { Ok(x * x) }
                },
                boom,
            )
            .unwrap();
            assert_eq!(got.len(), items.len());
            for (x, r) in items.iter().zip(&got) {
                match r {
                    Ok(v) => assert_eq!(*v, x * x),
                    Err(_) => assert_eq!(x % 100, 7, "item {x} failed"),
                }
            }
            assert_eq!(got.iter().filter(|r| r.is_err()).count(), 6);
        }
    }

    /// An error stops the work and comes back; a helper's panic is the
    /// caller's error, not a panic.
    #[test]
    fn errors_and_panics_are_returned() {
        let work: Vec<usize> = (0..100).collect();
        let e = try_for_each(
            work.clone(),
            4,
            |i| if i == 50 { Err(boom()) } else { Ok(()) },
            || unreachable!(),
        );
        assert!(matches!(e, Err(Error::Argument { value, .. }) if value == "helper"));
        // Only the caller or helpers may hit the panicking piece; make every
        // piece panic past the first so a helper surely does.
        let caller = std::thread::current().id();
        let r = try_for_each(
            work,
            4,
            |_| {
                if std::thread::current().id() != caller {
                    panic!("helper piece");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok(())
            },
            || Error::Argument {
                op: "parallel test",
                arg: "threads",
                value: "caught".into(),
                why: "panicked",
            },
        );
        assert!(matches!(r, Err(Error::Argument { value, .. }) if value == "caught"));
    }
}
