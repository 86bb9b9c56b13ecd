//! mHC and MoE references against independent f64 evaluations of the spec's
//! formulas (v41-flash.md §6, §7), plus the structural facts the spec states:
//! Sinkhorn ends column-normalised, a one-hot pre collapses to stream 0,
//! routing weights sum to the route scale, selection uses the biased scores.

// Column walks over 4 × 4 matrices read best with explicit indices.
#![allow(clippy::needless_range_loop)]

mod common;

use deepinfer::cpu_backend::mhc::{self, HC_MIXES, HC_STREAMS, ONE_HOT_PRE};
use deepinfer::cpu_backend::moe;
use half::bf16;
use rand::Rng;

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn sinkhorn_f64(c: [[f32; 4]; 4], eps: f64, iters: usize) -> [[f64; 4]; 4] {
    let mut m = [[0.0f64; 4]; 4];
    for j in 0..4 {
        let max = c[j].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let e: Vec<f64> = c[j].iter().map(|&v| (v as f64 - max).exp()).collect();
        let s: f64 = e.iter().sum();
        for (mk, ek) in m[j].iter_mut().zip(&e) {
            *mk = ek / s + eps;
        }
    }
    let cols = |m: &mut [[f64; 4]; 4]| {
        for k in 0..4 {
            let s: f64 = (0..4).map(|j| m[j][k]).sum::<f64>() + eps;
            (0..4).for_each(|j| m[j][k] /= s);
        }
    };
    cols(&mut m);
    for _ in 1..iters {
        for row in m.iter_mut() {
            let s: f64 = row.iter().sum::<f64>() + eps;
            row.iter_mut().for_each(|v| *v /= s);
        }
        cols(&mut m);
    }
    m
}

#[test]
fn sinkhorn_follows_the_spec_order_and_ends_column_normalised() {
    let mut rng = common::rng("sinkhorn");
    for _ in 0..200 {
        let mut c = [[0.0f32; 4]; 4];
        c.iter_mut()
            .flatten()
            .for_each(|v| *v = rng.random_range(-4.0..4.0));
        let got = mhc::sinkhorn(c, 1e-6, 20);
        let want = sinkhorn_f64(c, 1e-6, 20);
        for (j, (g_row, w_row)) in got.iter().zip(&want).enumerate() {
            for (k, (g, w)) in g_row.iter().zip(w_row).enumerate() {
                // ~60 dependent fp32 operations per element: a few 1e-6 relative at most.
                assert!((*g as f64 - w).abs() <= 1e-5 * w.abs() + 1e-7, "[{j}][{k}]");
            }
        }
        for k in 0..4 {
            let col: f64 = (0..4).map(|j| got[j][k] as f64).sum();
            assert!((col - 1.0).abs() < 1e-5, "column {k} sums to {col}");
        }
    }
}

#[test]
fn mixes_split_collapse_and_expand_match_f64() {
    let mut rng = common::rng("mhc");
    let d = 96;
    let streams = common::random_activations(&mut rng, HC_STREAMS * d, 2.0);
    let hc_fn: Vec<f32> = (0..HC_MIXES * HC_STREAMS * d)
        .map(|_| rng.random_range(-0.05..0.05))
        .collect();
    let scale = [
        rng.random_range(0.5..2.0f32),
        rng.random_range(0.5..2.0),
        rng.random_range(0.5..2.0),
    ];
    let base: [f32; HC_MIXES] = std::array::from_fn(|_| rng.random_range(-1.0..1.0));

    let m = mhc::hc_mixes(&streams, &hc_fn, 1e-20);
    let s64: Vec<f64> = streams.iter().map(|v| v.to_f64()).collect();
    let inv = 1.0 / (s64.iter().map(|v| v * v).sum::<f64>() / s64.len() as f64 + 1e-20).sqrt();
    for (i, row) in hc_fn.chunks(s64.len()).enumerate() {
        let want = row
            .iter()
            .zip(&s64)
            .map(|(w, x)| *w as f64 * x)
            .sum::<f64>()
            * inv;
        // A sequential fp32 dot product of n terms is within n·2^-24·Σ|terms|;
        // the fp32 inverse RMS adds at most about n/2 + 2 ulps of the result,
        // and |result| ≤ Σ|terms|.
        let mag: f64 = row
            .iter()
            .zip(&s64)
            .map(|(w, x)| (*w as f64 * x).abs())
            .sum::<f64>()
            * inv;
        let bound = (2.0 * row.len() as f64 + 8.0) * 2f64.powi(-24) * mag;
        assert!(
            (m[i] as f64 - want).abs() <= bound,
            "mix {i}: {} vs {want} (bound {bound})",
            m[i]
        );
    }

    let split = mhc::hc_split(&m, &scale, &base, 1e-6, 20);
    for i in 0..4 {
        let pre = sig(m[i] as f64 * scale[0] as f64 + base[i] as f64) + 1e-6;
        let post = 2.0 * sig(m[4 + i] as f64 * scale[1] as f64 + base[4 + i] as f64);
        assert!(
            (split.pre[i] as f64 - pre).abs() < 1e-6 && (split.post[i] as f64 - post).abs() < 2e-6
        );
    }

    assert_eq!(
        mhc::hc_collapse(&streams, &ONE_HOT_PRE),
        streams[..d].to_vec(),
        "one-hot pre selects stream 0"
    );
    let u = mhc::hc_collapse(&streams, &split.pre);
    for x in 0..d {
        let want: f64 = (0..4).map(|i| split.pre[i] as f64 * s64[i * d + x]).sum();
        let terms: f64 = (0..4)
            .map(|i| (split.pre[i] as f64 * s64[i * d + x]).abs())
            .sum();
        assert!(common::bf16_close(u[x], want, terms, 4), "collapse {x}");
    }

    let f = common::random_activations(&mut rng, d, 1.0);
    let out = mhc::hc_expand(&streams, &f, &split);
    for k in 0..4 {
        for x in 0..d {
            let want = split.post[k] as f64 * f[x].to_f64()
                + (0..4)
                    .map(|j| split.comb[j][k] as f64 * s64[j * d + x])
                    .sum::<f64>();
            let terms = (split.post[k] as f64 * f[x].to_f64()).abs()
                + (0..4)
                    .map(|j| (split.comb[j][k] as f64 * s64[j * d + x]).abs())
                    .sum::<f64>();
            assert!(
                common::bf16_close(out[k * d + x], want, terms, 5),
                "expand [{k}][{x}]"
            );
        }
    }
}

#[test]
fn routing_selects_by_biased_score_and_weights_by_unbiased_score() {
    let mut rng = common::rng("routing");
    let (n, k) = (64, 6);
    for _ in 0..500 {
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..25.0)).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5..0.5)).collect();
        let r = moe::route(&logits, &bias, k, 1.5);
        let s: Vec<f64> = logits
            .iter()
            .map(|&z| {
                if z > 20.0 {
                    z as f64
                } else {
                    (z as f64).exp().ln_1p()
                }
                .sqrt()
            })
            .collect();
        let mut by_biased: Vec<usize> = (0..n).collect();
        by_biased.sort_by(|&a, &b| (s[b] + bias[b] as f64).total_cmp(&(s[a] + bias[a] as f64)));
        // Our scores are fp32: skip draws whose k-th and (k+1)-th biased scores
        // are closer than fp32 rounding can resolve.
        let key = |e: usize| s[e] + bias[e] as f64;
        if key(by_biased[k - 1]) - key(by_biased[k]) < 1e-5 {
            continue;
        }
        let mut want: Vec<usize> = by_biased[..k].to_vec();
        want.sort_unstable();
        assert_eq!(r.experts, want);
        let denom: f64 = want.iter().map(|&e| s[e]).sum();
        for (e, w) in r.experts.iter().zip(&r.weights) {
            assert!((*w as f64 - s[*e] / denom * 1.5).abs() < 1e-5, "expert {e}");
        }
        assert!((r.weights.iter().map(|&w| w as f64).sum::<f64>() - 1.5).abs() < 1e-5);
    }
}

#[test]
fn routing_ties_go_to_the_lower_expert_id() {
    let r = moe::route(&[1.0; 8], &[0.0; 8], 3, 1.5);
    assert_eq!(r.experts, vec![0, 1, 2]);
    assert!(r.weights.iter().all(|&w| (w - 0.5).abs() < 1e-6));
    // The bias decides selection but not the weights.
    let r = moe::route(&[1.0, 1.0, 3.0, 1.0], &[0.0, 5.0, 0.0, 0.0], 2, 1.0);
    assert_eq!(r.experts, vec![1, 2]);
    assert!(
        r.weights[1] > r.weights[0],
        "unbiased score of expert 2 is larger"
    );
}

#[test]
fn swiglu_clamps_u_both_ways_and_g_from_above_only() {
    let b = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let limit = 10.0;
    let h = moe::swiglu(
        &b(&[50.0, -50.0, 2.0, 3.0]),
        &b(&[1.0, 1.0, 40.0, -40.0]),
        0.5,
        limit,
    );
    let silu = |g: f64| g * sig(g);
    let want = [
        silu(10.0) * 0.5,
        silu(-50.0) * 0.5,
        silu(2.0) * 10.0 * 0.5,
        silu(3.0) * -10.0 * 0.5,
    ];
    for (g, w) in h.iter().zip(want) {
        assert!(common::bf16_ulps(*g, bf16::from_f64(w)) <= 1, "{g} vs {w}");
    }
    assert!(
        h[1].to_f32() < 0.0 && h[1].to_f32() > -1e-18,
        "g = -50 is not clamped from below"
    );
}

#[test]
fn combine_sums_in_fp32_and_rounds_once() {
    let mut rng = common::rng("combine");
    let d = 257;
    let routed: Vec<Vec<bf16>> = (0..6)
        .map(|_| common::random_activations(&mut rng, d, 1.0))
        .collect();
    let shared = common::random_activations(&mut rng, d, 1.0);
    let refs: Vec<&[bf16]> = routed.iter().map(|v| v.as_slice()).collect();
    let out = moe::moe_combine(&refs, &shared);
    for x in 0..d {
        let want: f64 = routed.iter().map(|r| r[x].to_f64()).sum::<f64>() + shared[x].to_f64();
        let terms: f64 =
            routed.iter().map(|r| r[x].to_f64().abs()).sum::<f64>() + shared[x].to_f64().abs();
        assert!(common::bf16_close(out[x], want, terms, 7), "elem {x}");
    }
}
