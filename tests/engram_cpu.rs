//! Engram hashing against the facts the spec states (§8.2): the first primes
//! after 15,999,999, the per-layer table sizes as prime sums, the official
//! multipliers' bound, the pad/dead rules and the column order; and the gate
//! against an f64 evaluation of §8.4.

mod common;

use deepinfer::contract::ngram_ids;
use deepinfer::cpu_backend::engram::*;
use half::bf16;

/// Layer 1 then layer 14, shifts 0..3 (spec §8.2).
const OFFICIAL_MULTIPLIERS: [i64; 8] = [
    76632096046245,
    4839876093313,
    35959672319349,
    73987337458391,
    67716810739261,
    51510806800915,
    30921347202721,
    82619226485591,
];

#[test]
fn primes_and_table_sizes_match_the_spec() {
    let p = primes_after(15_999_999, 48);
    assert_eq!(&p[..3], &[16000057, 16000079, 16000081]);
    assert_eq!(p[47], 16000889);
    assert_eq!(
        p[..24].iter().sum::<u64>(),
        384_006_168,
        "layer 1 table rows"
    );
    assert_eq!(
        p[24..].iter().sum::<u64>(),
        384_016_682,
        "layer 14 table rows"
    );
}

#[test]
fn official_multipliers_are_odd_and_cannot_overflow() {
    let bound = i64::MAX / 99_092;
    for m in OFFICIAL_MULTIPLIERS {
        assert_eq!(m % 2, 1);
        assert!(m < bound, "{m}");
        assert!(99_091i64.checked_mul(m).is_some());
    }
}

#[test]
fn lookback_uses_pad_before_the_start_and_across_dead_tokens() {
    let pad = 7;
    assert_eq!(ngram_ids(&[Some(5)], pad), [5, 7, 7, 7]);
    assert_eq!(
        ngram_ids(&[Some(1), Some(2), Some(3), Some(4), Some(5)], pad),
        [5, 4, 3, 2]
    );
    // A dead token blocks it and every longer look-back.
    assert_eq!(
        ngram_ids(&[Some(1), None, Some(3), Some(4)], pad),
        [4, 3, 7, 7]
    );
    assert_eq!(
        ngram_ids(&[Some(1), Some(2), None], pad),
        [7, 7, 7, 7],
        "a dead current token is all pad"
    );
}

#[test]
fn hashes_roll_by_xor_and_rows_follow_the_column_order() {
    let m: [i64; 4] = OFFICIAL_MULTIPLIERS[..4].try_into().unwrap();
    let ids = [11, 22, 33, 44];
    let h = ngram_hashes(&ids, &m);
    assert_eq!(h[0], 11 * m[0]);
    assert_eq!(h[1], (11 * m[0]) ^ (22 * m[1]));
    assert_eq!(h[3], (11 * m[0]) ^ (22 * m[1]) ^ (33 * m[2]) ^ (44 * m[3]));
    assert!(
        h.iter().all(|&x| x >= 0),
        "non-negative with the official bound"
    );
    let primes = primes_after(15_999_999, 24);
    let rows = table_rows(&h, &primes);
    assert_eq!(rows.len(), 24);
    // Column 0: bigram, head 0, offset 0; column 8: trigram head 0, offset = first 8 primes.
    assert_eq!(rows[0], (h[1] as u64) % primes[0]);
    assert_eq!(
        rows[8],
        (h[2] as u64) % primes[8] + primes[..8].iter().sum::<u64>()
    );
    assert_eq!(
        rows[23],
        (h[3] as u64) % primes[23] + primes[..23].iter().sum::<u64>()
    );
    assert!(rows[23] < 384_006_168);
}

#[test]
fn gate_matches_f64_and_update_adds_gated_value() {
    let mut rng = common::rng("engram_gate");
    let d = 256;
    let s = common::random_activations(&mut rng, d, 2.0);
    let k = common::random_activations(&mut rng, d, 2.0);
    let qw = common::random_activations(&mut rng, d, 1.0);
    let kw = common::random_activations(&mut rng, d, 1.0);
    let g = gate(&s, &k, &qw, &kw, 1e-20);
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let (s64, k64, q64, kw64) = (f(&s), f(&k), f(&qw), f(&kw));
    let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / d as f64 + 1e-20).sqrt();
    let norm = rms(&s64) * rms(&k64) * (d as f64).sqrt();
    let dot = (0..d)
        .map(|i| s64[i] * q64[i] * kw64[i] * k64[i])
        .sum::<f64>()
        / norm;
    let mag = (0..d)
        .map(|i| (s64[i] * q64[i] * kw64[i] * k64[i]).abs())
        .sum::<f64>()
        / norm;
    // fp32 error of dot: d + 1 roundings of the sum (s·qk is exact), the two
    // sums of squares d each (halved by the sqrt) plus 3 roundings per rsqrt,
    // 3 products: ≤ (2d + 12)·2^-24·Σ|terms|; 2d + 16 covers second order.
    let err = (2 * d + 16) as f64 * 2f64.powi(-24) * mag;
    // σ(sign·√max(|x|, 1e-6)) is non-decreasing in x, so the exact gate of any
    // dot within err lies between its values at the ends; sqrt, exp, add and
    // divide add a few fp32 ulps of a result ≤ 1: 1e-6.
    let h = |x: f64| 1.0 / (1.0 + (-(x.signum() * x.abs().max(1e-6).sqrt())).exp());
    let (lo, hi) = (h(dot - err) - 1e-6, h(dot + err) + 1e-6);
    assert!(
        (lo..=hi).contains(&(g as f64)),
        "{g} vs [{lo}, {hi}] (dot {dot} ± {err})"
    );
    let v = common::random_activations(&mut rng, d, 1.0);
    let out = update(&s, g, &v);
    for i in 0..d {
        let gv = g as f64 * v[i].to_f64();
        assert!(
            common::bf16_close(out[i], s64[i] + gv, s64[i].abs() + gv.abs(), 2),
            "elem {i}"
        );
    }
}

#[test]
fn multipliers_reproduce_the_official_values() {
    use deepinfer::numpy_rng::engram_multipliers;
    assert_eq!(engram_multipliers(1, 99_092), OFFICIAL_MULTIPLIERS[..4]);
    assert_eq!(engram_multipliers(14, 99_092), OFFICIAL_MULTIPLIERS[4..]);
}
