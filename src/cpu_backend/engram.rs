//! Engram reference (`v41-flash.md` §8.2–8.4): the n-gram hashes of the last
//! four compressed ids with the pad and dead-token rules, the table row
//! indices (8 primes per order, orders 2–4, offsets within the layer), the
//! dequantised 24-row lookup, and the per-stream gate and update.
//!
//! Invariants: multipliers are odd and below ⌊i64::MAX / compressed_vocab⌋,
//! so no product overflows; rows are `row_dim` e4m3 values followed by
//! `row_dim / 32` E8M0 scales.

use crate::contract::MX_BLOCK;
use crate::dtype::{E4M3, E8M0};
use crate::numerics::{e4m3_to_f32, e8m0_to_f32, sigmoid};
use half::bf16;

/// N-gram orders looked up (the unigram hash is never used).
pub const ORDERS: [usize; 3] = [2, 3, 4];

/// Successive primes strictly greater than `after`, `count` of them.
pub fn primes_after(after: u64, count: usize) -> Vec<u64> {
    let is_prime = |n: u64| {
        n >= 2
            && (2..)
                .take_while(|d| d * d <= n)
                .all(|d| !n.is_multiple_of(d))
    };
    (after + 1..).filter(|&n| is_prime(n)).take(count).collect()
}

/// Rolling XOR hashes h_1..h_4: h_1 = id_p · m_0, h_n = h_{n−1} ⊕ id_{p−n+1} · m_{n−1}.
pub fn ngram_hashes(ids: &[i64; 4], multipliers: &[i64; 4]) -> [i64; 4] {
    let mut h = [0i64; 4];
    h[0] = ids[0].wrapping_mul(multipliers[0]);
    for n in 1..4 {
        h[n] = h[n - 1] ^ ids[n].wrapping_mul(multipliers[n]);
    }
    h
}

/// The 24 (orders × heads) table rows of one position. Column
/// (n − 2)·heads + head holds (h_n mod its prime) plus the sum of the
/// layer's preceding primes; `primes` lists the layer's primes in column order.
pub fn table_rows(hashes: &[i64; 4], primes: &[u64]) -> Vec<u64> {
    let heads = primes.len() / ORDERS.len();
    let mut offset = 0u64;
    let mut rows = Vec::with_capacity(primes.len());
    for (col, &prime) in primes.iter().enumerate() {
        let n = ORDERS[col / heads];
        rows.push(hashes[n - 1].rem_euclid(prime as i64) as u64 + offset);
        offset += prime;
    }
    rows
}

/// Dequantises and concatenates the looked-up rows: each value is
/// BF16(e4m3 × its block's E8M0 scale).
pub fn gather_rows(table: &[u8], rows: &[u64], row_dim: usize) -> Vec<bf16> {
    let row_bytes = row_dim + row_dim / MX_BLOCK;
    rows.iter()
        .flat_map(|&r| {
            let bytes = &table[r as usize * row_bytes..(r as usize + 1) * row_bytes];
            let (values, scales) = bytes.split_at(row_dim);
            values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    bf16::from_f32(e4m3_to_f32(E4M3(v)) * e8m0_to_f32(E8M0(scales[i / 32])))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Gate of one stream: σ(sign(dot) · √max(|dot|, 1e-6)) with
/// `dot = Σ_d S[d]·qk[d]·key[d] · rsqrt(mean(S²)+eps) · rsqrt(mean(key²)+eps) · D^−½`,
/// where qk = q_weight ⊙ k_weight in fp32. All fp32, sums in index order.
pub fn gate(stream: &[bf16], key: &[bf16], q_weight: &[bf16], k_weight: &[bf16], eps: f32) -> f32 {
    let d = stream.len() as f32;
    let (mut dot, mut ss, mut kk) = (0.0f32, 0.0f32, 0.0f32);
    for i in 0..stream.len() {
        let (s, k) = (stream[i].to_f32(), key[i].to_f32());
        let qk = q_weight[i].to_f32() * k_weight[i].to_f32();
        dot += s * qk * k;
        ss += s * s;
        kk += k * k;
    }
    let dot = dot
        * (1.0 / (ss / d + eps).sqrt())
        * (1.0 / (kk / d + eps).sqrt())
        * crate::numerics::round_f32((d as f64).powf(-0.5));
    let x = dot.signum() * dot.abs().max(1e-6).sqrt();
    sigmoid(x)
}

/// S ← BF16(S + gate · value), in fp32.
pub fn update(stream: &[bf16], gate: f32, value: &[bf16]) -> Vec<bf16> {
    stream
        .iter()
        .zip(value)
        .map(|(s, v)| bf16::from_f32(s.to_f32() + gate * v.to_f32()))
        .collect()
}
