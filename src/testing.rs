//! Helpers of the library's own unit tests, compiled only under `cfg(test)`.
//! Invariant: nothing here is reachable from the public API.

/// The xorshift64 (13, 7, 17) stream from `seed` (non-zero): fixed
/// pseudo-random words, so a failing unit test replays the same case.
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
