//! The mHC, MoE-routing, sparse-attention and indexer references against
//! torch ops written from `v41-flash.md` (§6, §7.1, §3.10, §3.5), behind the
//! `torch-ref` feature. Tolerances: torch's exp/softmax/sqrt kernels may
//! differ from Rust's libm in the last fp32 ulp, so fp32 results are compared
//! to a few ulps, routing decisions and index selections exactly, BF16
//! outputs within one ulp.
#![cfg(feature = "torch-ref")]

mod common;

use common::torch::{bf16_to_torch, f32_to_torch, from_torch_bf16, from_torch_f32};
use deepinfer::cpu_backend::{indexer, mhc, moe, sparse_attention};
use deepinfer::numerics::calc_diff;
use half::bf16;
use rand::Rng;
use tch::{Kind, Tensor as TT};

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-30
}

#[test]
fn sinkhorn_and_mixes_match_torch() {
    let mut rng = common::rng("torch_mhc");
    let d = 128;
    let streams = common::random_activations(&mut rng, 4 * d, 2.0);
    let hc_fn: Vec<f32> = (0..24 * 4 * d)
        .map(|_| rng.random_range(-0.05..0.05))
        .collect();
    let m = mhc::hc_mixes(&streams, &hc_fn, 1e-20);
    let s = bf16_to_torch(&streams, &[4 * d as i64]).to_kind(Kind::Float);
    let w = f32_to_torch(&hc_fn, &[24, 4 * d as i64]);
    let rs = (s.square().mean(Kind::Float) + 1e-20).rsqrt();
    let tm = w.matmul(&s) * &rs;
    // torch's matmul sums in its own order; a dot product with cancellation
    // is only accurate relative to Σ|w·s|, so the bound scales with that.
    let mag = from_torch_f32(&(w.abs().matmul(&s.abs()) * &rs));
    for ((a, b), scale) in m.iter().zip(from_torch_f32(&tm)).zip(mag) {
        assert!(
            (a - b).abs() <= 1e-5 * scale,
            "mix {a} vs {b} (Σ|w·s| = {scale})"
        );
    }

    let mut c = [[0.0f32; 4]; 4];
    c.iter_mut()
        .flatten()
        .for_each(|v| *v = rng.random_range(-4.0..4.0));
    let ours = mhc::sinkhorn(c, 1e-6, 20);
    let flat: Vec<f32> = c.iter().flatten().copied().collect();
    let mut t = f32_to_torch(&flat, &[4, 4]).softmax(-1, Kind::Float) + 1e-6;
    t = &t / (t.sum_dim_intlist([0i64].as_slice(), true, Kind::Float) + 1e-6);
    for _ in 1..20 {
        t = &t / (t.sum_dim_intlist([1i64].as_slice(), true, Kind::Float) + 1e-6);
        t = &t / (t.sum_dim_intlist([0i64].as_slice(), true, Kind::Float) + 1e-6);
    }
    for (a, b) in ours.iter().flatten().zip(from_torch_f32(&t)) {
        assert!(close(*a, b, 1e-5), "sinkhorn {a} vs {b}");
    }
}

#[test]
fn routing_matches_torch_topk() {
    let mut rng = common::rng("torch_routing");
    let (n, k) = (384usize, 6i64);
    for _ in 0..50 {
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-6.0..24.0)).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-0.3..0.3)).collect();
        let r = moe::route(&logits, &bias, k as usize, 1.5);
        // torch's fp32 softplus and sqrt are not correctly rounded (ours are),
        // so a selection whose k-th and (k+1)-th biased scores lie within a
        // few ulps may legitimately differ: those draws are skipped.
        let mut biased: Vec<f64> = logits
            .iter()
            .zip(&bias)
            .map(|(&z, &b)| (z as f64).exp().ln_1p().sqrt() + b as f64)
            .collect();
        biased.sort_by(|a, b| b.total_cmp(a));
        if biased[k as usize - 1] - biased[k as usize] < 1e-5 * biased[k as usize - 1].abs() {
            continue;
        }
        let s = f32_to_torch(&logits, &[n as i64]).softplus().sqrt();
        let (_, idx) = (&s + f32_to_torch(&bias, &[n as i64])).topk(k, -1, true, true);
        let w = s.gather(0, &idx, false);
        let w = &w / (w.sum(Kind::Float) + 1e-20) * 1.5;
        let mut pairs: Vec<(i64, f32)> = Vec::<i64>::try_from(&idx)
            .unwrap()
            .into_iter()
            .zip(from_torch_f32(&w))
            .collect();
        pairs.sort_by_key(|p| p.0);
        let want: Vec<usize> = pairs.iter().map(|p| p.0 as usize).collect();
        assert_eq!(r.experts, want, "selected experts");
        for ((_, tw), ow) in pairs.iter().zip(&r.weights) {
            assert!(close(*ow, *tw, 1e-6), "weight {ow} vs {tw}");
        }
    }
}

/// §3.10 written with torch ops: 64-entry blocks, running max, BF16 p.
fn sparse_mqa_torch(q: &TT, rows: &TT, idx: &[i32], sink: &TT, dim: i64) -> TT {
    let heads = q.size()[0];
    let scale = (dim as f64).powf(-0.5) as f32 as f64;
    let mut m = TT::full([heads, 1], -1e30, (Kind::Float, tch::Device::Cpu));
    let mut l = TT::zeros([heads, 1], (Kind::Float, tch::Device::Cpu));
    let mut acc = TT::zeros([heads, dim], (Kind::Float, tch::Device::Cpu));
    let qf = q.to_kind(Kind::Float);
    for block in idx.chunks(64) {
        let valid: Vec<i64> = block.iter().map(|&i| i.max(0) as i64).collect();
        let mask: Vec<bool> = block.iter().map(|&i| i < 0).collect();
        let k = rows
            .index_select(0, &TT::from_slice(&valid))
            .to_kind(Kind::Float);
        let dead = TT::from_slice(&mask).unsqueeze(0);
        let s = (qf.matmul(&k.tr()) * scale).masked_fill(&dead, f64::NEG_INFINITY);
        let m_new = m.maximum(&s.amax([1i64].as_slice(), true));
        let alpha = (&m - &m_new).exp();
        let p = (&s - &m_new).exp();
        l = &l * &alpha + p.sum_dim_intlist([1i64].as_slice(), true, Kind::Float);
        let pb = p.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        acc = &acc * &alpha + pb.matmul(&k.masked_fill(&dead.tr(), 0.0));
        m = m_new;
    }
    l += (sink.unsqueeze(1) - &m).exp();
    (acc / l).to_kind(Kind::BFloat16)
}

/// Per output element, a bound on |ours − torch| before the final BF16
/// rounding, from an exact f64 replay of the blocked softmax. Each side's
/// logit s_j is within Δ = (dim + 2)·2^-24·Σ|q·k|·scale of the exact one, so
/// its fp32 p_j = exp(s_j − m) is within η_j = 2Δ + 2^-24·|s_j − m| + 2^-23
/// (exp within 1 ulp) relative of the exact p_j; the two BF16 roundings of p_j
/// can differ only if that interval straddles a rounding boundary, by at most
/// the gap w_j between the roundings of its ends. The rest (sums, rescaling,
/// division) is ≤ R = 2·(3n + 4·blocks + 8)·2^-24 + 2·blocks·2Δ + 2·max η
/// relative of Σ_j p_j·|v_j| / l.
fn attention_slack(q: &[bf16], rows: &[bf16], idx: &[i32], sink: &[f32], dim: usize) -> Vec<f64> {
    const U: f64 = 1.0 / (1u64 << 24) as f64;
    let scale = (dim as f64).powf(-0.5) as f32 as f64;
    let live: Vec<(usize, usize)> = idx
        .iter()
        .enumerate()
        .filter(|(_, i)| **i >= 0)
        .map(|(pos, &i)| (pos, i as usize))
        .collect();
    let blocks = idx.len().div_ceil(64) as f64;
    let mut out = Vec::with_capacity(q.len());
    for (h, qh) in q.chunks(dim).enumerate() {
        let row = |i: usize| &rows[i * dim..(i + 1) * dim];
        let s: Vec<f64> = live
            .iter()
            .map(|&(_, i)| {
                qh.iter()
                    .zip(row(i))
                    .map(|(a, b)| a.to_f64() * b.to_f64())
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let delta = live
            .iter()
            .map(|&(_, i)| {
                qh.iter()
                    .zip(row(i))
                    .map(|(a, b)| (a.to_f64() * b.to_f64()).abs())
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
            * scale
            * (dim + 2) as f64
            * U;
        // The running max after each entry's block, and the final one.
        let mut block_max = vec![-1e30f64; live.len()];
        let mut m = -1e30f64;
        for b in 0..idx.len().div_ceil(64) {
            let in_block = |pos: usize| pos / 64 == b;
            for (j, &(pos, _)) in live.iter().enumerate() {
                if in_block(pos) {
                    m = m.max(s[j]);
                }
            }
            for (j, &(pos, _)) in live.iter().enumerate() {
                if in_block(pos) {
                    block_max[j] = m;
                }
            }
        }
        let (mut flips, mut terms, mut max_eta) = (vec![0.0; dim], vec![0.0; dim], 0.0f64);
        let mut l = (sink[h] as f64 - m).exp();
        for (j, &(_, i)) in live.iter().enumerate() {
            let p = (s[j] - block_max[j]).exp();
            let eta = 1.01 * (2.0 * delta + U * (s[j] - block_max[j]).abs()) + 2.0 * U;
            max_eta = max_eta.max(eta);
            let w =
                bf16::from_f64(p * (1.0 + eta)).to_f64() - bf16::from_f64(p * (1.0 - eta)).to_f64();
            // Rescaled to the final max, as the accumulator is.
            let r = (block_max[j] - m).exp();
            l += p * r;
            for (d, v) in row(i).iter().enumerate() {
                flips[d] += w * r * v.to_f64().abs();
                terms[d] += p * r * v.to_f64().abs();
            }
        }
        let rel = 2.0 * (3.0 * live.len() as f64 + 4.0 * blocks + 8.0) * U
            + 2.0 * blocks * 2.0 * delta
            + 2.0 * max_eta;
        out.extend((0..dim).map(|d| (flips[d] + rel * 1.01 * terms[d]) / l));
    }
    out
}

#[test]
fn sparse_attention_matches_torch() {
    let mut rng = common::rng("torch_attention");
    let (heads, dim, n_rows) = (16usize, 128usize, 500usize);
    for n_idx in [1usize, 64, 130, 300] {
        let q = common::random_activations(&mut rng, heads * dim, 1.0);
        let rows = common::random_activations(&mut rng, n_rows * dim, 1.0);
        let sink: Vec<f32> = (0..heads).map(|_| rng.random_range(-2.0..2.0)).collect();
        let idx: Vec<i32> = (0..n_idx)
            .map(|_| {
                if rng.random::<f32>() < 0.1 {
                    -1
                } else {
                    rng.random_range(0..n_rows as i32)
                }
            })
            .collect();
        let ours = sparse_attention::sparse_mqa(&q, &rows, &idx, &sink, dim);
        let theirs = from_torch_bf16(&sparse_mqa_torch(
            &bf16_to_torch(&q, &[heads as i64, dim as i64]),
            &bf16_to_torch(&rows, &[n_rows as i64, dim as i64]),
            &idx,
            &f32_to_torch(&sink, &[heads as i64]),
            dim as i64,
        ));
        // Dot products and sums are ordered differently in torch's matmul and
        // torch's exp is not correctly rounded, which can flip a BF16 rounding
        // of some p_j; where the output cancels, one flip is many ulps of it.
        let slack = attention_slack(&q, &rows, &idx, &sink, dim);
        for (i, (a, b)) in ours.out.iter().zip(&theirs).enumerate() {
            let bound = slack[i] + common::bf16_half_ulp(*a) + common::bf16_half_ulp(*b);
            assert!(
                common::bf16_ulps(*a, *b) <= 2 || (a.to_f64() - b.to_f64()).abs() <= bound,
                "n_idx {n_idx} out {i}: {a} vs torch {b} (bound {bound})"
            );
        }
        assert!(calc_diff(&common::to_f64(&ours.out), &common::to_f64(&theirs)) < 1e-6);
    }
}

#[test]
fn index_scores_match_torch() {
    let mut rng = common::rng("torch_index_scores");
    let (heads, dim, n) = (32usize, 128usize, 300usize);
    let q = common::random_activations(&mut rng, heads * dim, 1.0);
    let keys = common::random_activations(&mut rng, n * dim, 1.0);
    let w = common::random_activations(&mut rng, heads, 0.05);
    let ours = indexer::index_scores(&q, &keys, &w, dim, 280);
    let tq = bf16_to_torch(&q, &[heads as i64, dim as i64]).to_kind(Kind::Float);
    let tk = bf16_to_torch(&keys, &[n as i64, dim as i64]).to_kind(Kind::Float);
    let dots = tk.matmul(&tq.tr()).to_kind(Kind::BFloat16).relu();
    let prod = dots * bf16_to_torch(&w, &[1, heads as i64]);
    let s = prod
        .sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
        .to_kind(Kind::BFloat16);
    let theirs = from_torch_bf16(&s);
    let mut differ = 0;
    for t in 0..280 {
        let a = bf16::from_f32(ours[t]);
        let u = common::bf16_ulps(a, theirs[t]);
        // Both sides round the same fp32 dot products (each within
        // (dim + 1)·2^-24·Σ|q·k| of the exact one) to BF16; a dot whose error
        // interval straddles a rounding boundary may round differently, which
        // moves w·relu(dot) by up to |w|·gap plus its own product rounding
        // (2^-7 of it, both sides), and where the head sum cancels that is
        // many ulps of the score. The fp32 head sums add 2·heads·2^-24·Σ|w·relu|.
        let (mut flips, mut mag) = (0.0f64, 0.0f64);
        for h in 0..heads {
            let (qh, kt) = (&q[h * dim..][..dim], &keys[t * dim..][..dim]);
            let dot: f64 = qh
                .iter()
                .zip(kt)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum();
            let abs: f64 = qh
                .iter()
                .zip(kt)
                .map(|(a, b)| (a.to_f64() * b.to_f64()).abs())
                .sum();
            let err = 1.01 * (dim + 1) as f64 * 2f64.powi(-24) * abs;
            let (lo, hi) = (
                bf16::from_f64(dot - err).to_f64().max(0.0),
                bf16::from_f64(dot + err).to_f64().max(0.0),
            );
            let wh = w[h].to_f64().abs();
            if lo != hi {
                flips += wh * (hi - lo) + 2f64.powi(-7) * wh * hi;
            }
            mag += wh * hi;
        }
        let bound = flips
            + 2.0 * heads as f64 * 2f64.powi(-24) * mag * 1.01
            + common::bf16_half_ulp(a)
            + common::bf16_half_ulp(theirs[t]);
        assert!(
            u <= 1 || (a.to_f64() - theirs[t].to_f64()).abs() <= bound,
            "entry {t}: {} vs {} (bound {bound})",
            ours[t],
            theirs[t]
        );
        differ += usize::from(u > 0);
    }
    assert!(differ * 20 < 280, "{differ} of 280 scores differ by an ulp");
    assert!(ours[280..].iter().all(|&s| s == f32::NEG_INFINITY));
}
