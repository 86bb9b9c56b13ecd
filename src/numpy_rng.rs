//! A bit-exact port of the part of numpy's random stack that Engram's hash
//! multipliers come from (`v41-flash.md` §8.2): `SeedSequence` entropy mixing
//! and state generation, the PCG64 (XSL-RR 128/64) generator seeded from it,
//! and `Generator.integers` for a 64-bit range above 2^32 (Lemire's bounded
//! multiply with rejection). Written from the published algorithms; the test
//! reproduces the multipliers listed in the spec.
//!
//! Indices run over the fixed-size state arrays of those algorithms (loop
//! bounds are the arrays' own constants), so the crate's `indexing_slicing`
//! lint is lifted here.
#![allow(clippy::indexing_slicing)]

use crate::numerics::{low_u32, low_u64};

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;
const PCG_MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// `SeedSequence(seed).generate_state(n, uint64)` for a non-negative integer seed.
fn seed_sequence_state(seed: u64, n_u64: usize) -> Vec<u64> {
    let entropy: Vec<u32> = if seed >> 32 == 0 {
        vec![low_u32(seed)]
    } else {
        vec![low_u32(seed), (seed >> 32) as u32]
    };
    let mut pool = [0u32; POOL];
    let mut hc = INIT_A;
    for (i, p) in pool.iter_mut().enumerate() {
        *p = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                let h = hashmix(pool[src], &mut hc);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &e in entropy.iter().skip(POOL) {
        for p in pool.iter_mut() {
            let h = hashmix(e, &mut hc);
            *p = mix(*p, h);
        }
    }
    let mut hc = INIT_B;
    let words: Vec<u32> = (0..2 * n_u64)
        .map(|i| {
            let mut v = pool[i % POOL] ^ hc;
            hc = hc.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hc);
            v ^ (v >> XSHIFT)
        })
        .collect();
    words
        .chunks(2)
        .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
        .collect()
}

/// numpy's PCG64 bit generator.
pub struct Pcg64 {
    state: u128,
    inc: u128,
}

impl Pcg64 {
    /// `np.random.default_rng(seed)`'s bit generator.
    pub fn from_seed(seed: u64) -> Pcg64 {
        let v = seed_sequence_state(seed, 4);
        let init_state = (u128::from(v[0]) << 64) | u128::from(v[1]);
        let init_seq = (u128::from(v[2]) << 64) | u128::from(v[3]);
        let mut rng = Pcg64 {
            state: 0,
            inc: (init_seq << 1) | 1,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(init_state);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// Next 64 random bits (advance, then XSL-RR output).
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let x = ((self.state >> 64) as u64) ^ low_u64(self.state);
        x.rotate_right((self.state >> 122) as u32)
    }

    /// `Generator.integers(0, high)` for 2^32 < high − 1 < 2^64 − 1.
    pub fn integers_below(&mut self, high: u64) -> u64 {
        let rng = high - 1;
        debug_assert!(rng > u64::from(u32::MAX) && rng < u64::MAX);
        let excl = high;
        let mut m = u128::from(self.next_u64()) * u128::from(excl);
        if low_u64(m) < excl {
            let threshold = (u64::MAX - rng) % excl;
            while low_u64(m) < threshold {
                m = u128::from(self.next_u64()) * u128::from(excl);
            }
        }
        (m >> 64) as u64
    }
}

/// The four odd hash multipliers of Engram layer `layer_id` for a compressed
/// vocabulary of `vocab` ids: 2·x + 1 with x drawn from
/// `default_rng(10007 · layer_id).integers(0, ⌊⌊i64::MAX / vocab⌋ / 2⌋)`.
pub fn engram_multipliers(layer_id: u64, vocab: u64) -> [i64; 4] {
    let bound = (i64::MAX as u64 / vocab) / 2;
    let mut rng = Pcg64::from_seed(10007 * layer_id);
    std::array::from_fn(|_| (2 * rng.integers_below(bound) + 1) as i64)
}
