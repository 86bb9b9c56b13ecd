//! The counter-based random numbers of deterministic sampling
//! (`serving.md` §4): Philox4x32-10 (Salmon et al., SC'11, the generator of
//! cuRAND and Random123) keyed by the sequence's seed, with the counter
//! (absolute position, draft slot, domain). A draw depends on nothing else:
//! no stream is shared across a batch, so the same request samples the same
//! tokens whatever runs beside it.
//!
//! Invariant: every (seed, position, slot, domain) names one fixed 128-bit
//! block; the domains keep target sampling, draft proposals and rejection
//! coins apart.

use crate::numerics::low_u32;

/// What a draw is for; each has its own counter space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    /// Sampling the target model's next token.
    Target = 0,
    /// The drafter's proposals.
    Draft = 1,
    /// Speculative decoding's acceptance coins.
    Reject = 2,
}

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds of `counter` under `key`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            low_u32(p1),
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            low_u32(p0),
        ];
    }
    c
}

/// The uniform draw in [0, 1) (53 bits) of one (seed, position, slot,
/// domain).
pub fn uniform(seed: u64, position: u64, slot: u32, domain: Domain) -> f64 {
    let x = philox4x32_10(
        [
            low_u32(position),
            (position >> 32) as u32,
            slot,
            domain as u32,
        ],
        [low_u32(seed), (seed >> 32) as u32],
    );
    let bits = (u64::from(x[0]) | u64::from(x[1]) << 32) >> 11;
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}
