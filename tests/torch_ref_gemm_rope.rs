//! The GEMM and RoPE references against torch (libtorch through tch), behind
//! the `torch-ref` feature. The torch side is written from `v41-flash.md`
//! with torch ops, independently of our code: the operands are decoded by
//! torch (e4m3 through its `float8_e4m3fn` cast, E8M0 from the exponent bits,
//! e2m1 through a value table), each 32-deep K block is an fp32 matmul of
//! the exact decoded values, scaled by a_s · b_s and summed in K order
//! (§10.4); RoPE builds the frequency table, the fp32 angles and the complex
//! rotation the way the reference model does (§3.2). With the pinned torch
//! the frequency tables are asserted bitwise equal; the GEMM and RoPE outputs
//! also came out bitwise equal when this was written, but the assertions
//! only demand what the spec guarantees (the messages print the counts).
#![cfg(feature = "torch-ref")]

mod common;

use common::torch::{bf16_to_torch, from_torch_bf16, from_torch_f32};
use common::{WIDE_SCALES, random_e4m3, random_e8m0, random_fp4};
use deepinfer::cpu_backend::{
    RopeParams, Yarn, fp4_gemm, fp4_gemm_f32, fp8_gemm, fp8_gemm_f32, inverse_rope,
    mxfp8_dequantize, rope, rope_freqs,
};
use deepinfer::numerics::calc_diff;
use deepinfer::{E4M3, E8M0, Fp4x2};
use half::bf16;
use rand::Rng;
use tch::{Device, Kind, Tensor as TT};

fn bytes_to_torch(v: &[u8], rows: usize, cols: usize) -> TT {
    TT::from_slice(v).reshape([rows as i64, cols as i64])
}

/// E8M0 bytes (1 … 254) → fp32 2^(b − 127), by placing b in the exponent.
fn e8m0_torch(s: &[E8M0], rows: usize, cols: usize) -> TT {
    let b: Vec<u8> = s.iter().map(|v| v.0).collect();
    bytes_to_torch(&b, rows, cols)
        .to_kind(Kind::Int)
        .bitwise_left_shift_tensor_scalar(23)
        .view_dtype(Kind::Float)
}

fn e4m3_torch(q: &[E4M3], rows: usize, cols: usize) -> TT {
    let b: Vec<u8> = q.iter().map(|v| v.0).collect();
    bytes_to_torch(&b, rows, cols)
        .view_dtype(Kind::Float8e4m3fn)
        .to_kind(Kind::Float)
}

/// Packed e2m1 `[rows, ⌈cols/2⌉]` → fp32 `[rows, cols]`, low nibble first.
fn e2m1_torch(p: &[Fp4x2], rows: usize, cols: usize) -> TT {
    let table = TT::from_slice(&[
        0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ]);
    let b: Vec<u8> = p.iter().map(|v| v.0).collect();
    let bytes = bytes_to_torch(&b, rows, cols.div_ceil(2)).to_kind(Kind::Int64);
    let codes = TT::stack(
        &[
            bytes.bitwise_and(0xF),
            bytes.bitwise_right_shift_tensor_scalar(4),
        ],
        -1,
    )
    .reshape([rows as i64, -1])
    .narrow(1, 0, cols as i64);
    table
        .index_select(0, &codes.reshape([-1]))
        .reshape([rows as i64, cols as i64])
}

/// §10.4 with torch ops on decoded `a` `[m, k]`, `b` `[n, k]` and per-row
/// scales `sa` `[m, kb]`, `sb` `[n, kb]`; returns (fp32 result, Σ|terms|).
fn block_gemm_torch(a: &TT, b: &TT, sa: &TT, sb: &TT, k: usize) -> (TT, TT) {
    let (m, n) = (a.size()[0], b.size()[0]);
    let opts = (Kind::Float, Device::Cpu);
    let (mut acc, mut abs) = (TT::zeros([m, n], opts), TT::zeros([m, n], opts));
    for blk in 0..k.div_ceil(32) as i64 {
        let len = (k as i64 - 32 * blk).min(32);
        let (ab, bb) = (a.narrow(1, 32 * blk, len), b.narrow(1, 32 * blk, len));
        let scale = sa.narrow(1, blk, 1) * sb.narrow(1, blk, 1).tr();
        acc += ab.matmul(&bb.tr()) * &scale;
        abs += ab.abs().matmul(&bb.abs().tr()) * scale.abs();
    }
    (acc, abs)
}

/// Compares both precisions with torch. fp32: both sides are §10.4 sums that
/// differ only in the in-block order (ours sequential, torch's matmul its
/// own), each within (32 + ⌈k/32⌉) · 2^-24 · Σ|terms| of the exact value, so
/// they differ by at most twice that. BF16: calc_diff < 1e-5. Two orders
/// rarely round an fp32 value to different BF16 neighbours (1 ulp, 2^-8
/// relative); even if every element did, calc_diff would stay below
/// 2^-16 / 2 ≈ 7.6e-6, whereas any real error (a wrong scale or block) costs
/// well over 1e-3.
fn compare(what: &str, ours32: &[f32], ours16: &[bf16], acc: &TT, abs: &TT, k: usize) {
    let theirs32 = from_torch_f32(acc);
    let abs = from_torch_f32(abs);
    let bound = 2.0 * (32 + k.div_ceil(32)) as f64 * 2f64.powi(-24);
    for (i, ((o, t), a)) in ours32.iter().zip(&theirs32).zip(&abs).enumerate() {
        assert!(
            (*o as f64 - *t as f64).abs() <= bound * *a as f64,
            "{what} out {i}: {o} vs torch {t}"
        );
    }
    let theirs16 = from_torch_bf16(&acc.to_kind(Kind::BFloat16));
    let d = calc_diff(&common::to_f64(ours16), &common::to_f64(&theirs16));
    let ulps = ours16.iter().zip(&theirs16).filter(|(a, b)| a != b).count();
    eprintln!(
        "{what}: calc_diff {d:.3e}, {ulps} of {} BF16 outputs differ",
        ours16.len()
    );
    assert!(d < 1e-5, "{what}: calc_diff {d}");
}

#[test]
fn fp8_gemm_matches_torch() {
    let mut rng = common::rng("fp8_gemm_torch");
    for (m, n, k) in [
        (3usize, 33usize, 71usize),
        (1, 31, 33),
        (4, 1280, 5120),
        (2, 512, 5120),
    ] {
        let kb = k.div_ceil(32);
        let a = random_e4m3(&mut rng, m * k);
        let a_s = random_e8m0(&mut rng, m * kb, WIDE_SCALES);
        let b = random_e4m3(&mut rng, n * k);
        let b_s = random_e8m0(&mut rng, n.div_ceil(32) * kb, WIDE_SCALES);
        let sb_rows = e8m0_torch(&b_s, n.div_ceil(32), kb)
            .repeat_interleave_self_int(32, 0, None)
            .narrow(0, 0, n as i64);
        let (acc, abs) = block_gemm_torch(
            &e4m3_torch(&a, m, k),
            &e4m3_torch(&b, n, k),
            &e8m0_torch(&a_s, m, kb),
            &sb_rows,
            k,
        );
        compare(
            &format!("fp8 {m}x{n}x{k}"),
            &fp8_gemm_f32(&a, &a_s, &b, &b_s, m, n, k),
            &fp8_gemm(&a, &a_s, &b, &b_s, m, n, k),
            &acc,
            &abs,
            k,
        );
    }
}

#[test]
fn fp4_gemm_matches_torch() {
    let mut rng = common::rng("fp4_gemm_torch");
    for (m, n, k) in [
        (3usize, 33usize, 70usize),
        (1, 31, 33),
        (2, 2304, 5120),
        (2, 5120, 2304),
    ] {
        let kb = k.div_ceil(32);
        let a = random_e4m3(&mut rng, m * k);
        let a_s = random_e8m0(&mut rng, m * kb, WIDE_SCALES);
        let b = random_fp4(&mut rng, n * k.div_ceil(2));
        let b_s = random_e8m0(&mut rng, n * kb, WIDE_SCALES);
        let (acc, abs) = block_gemm_torch(
            &e4m3_torch(&a, m, k),
            &e2m1_torch(&b, n, k),
            &e8m0_torch(&a_s, m, kb),
            &e8m0_torch(&b_s, n, kb),
            k,
        );
        compare(
            &format!("fp4 {m}x{n}x{k}"),
            &fp4_gemm_f32(&a, &a_s, &b, &b_s, m, n, k),
            &fp4_gemm(&a, &a_s, &b, &b_s, m, n, k),
            &acc,
            &abs,
            k,
        );
    }
}

/// The reference's frequency table with torch ops (fp32 `pow`, reciprocal,
/// ramp and blend), for `d` rotary dims.
/// `mxfp8_dequantize` (wo_a's load-time conversion) against torch: the
/// e4m3 values decoded by torch, times their 32 × 32 block scales expanded
/// by `repeat_interleave`, rounded to BF16 by torch; bitwise, over shapes
/// with 32-tails and scales from 2^-126 to 2^127 (products that under- and
/// overflow BF16 included).
#[test]
fn mxfp8_dequantize_matches_torch() {
    let mut rng = common::rng("mxfp8_dequantize_torch");
    for &(n, k) in &[(64usize, 96usize), (33, 70), (200, 513)] {
        let (nb, kb) = (n.div_ceil(32), k.div_ceil(32));
        let w = random_e4m3(&mut rng, n * k);
        let s = random_e8m0(&mut rng, nb * kb, -126..=127);
        let ours = mxfp8_dequantize(&w, &s, n, k);
        let scale = e8m0_torch(&s, nb, kb)
            .repeat_interleave_self_int(32, 0, None)
            .repeat_interleave_self_int(32, 1, None)
            .narrow(0, 0, n as i64)
            .narrow(1, 0, k as i64);
        let torch = from_torch_bf16(&(e4m3_torch(&w, n, k) * scale).to_kind(Kind::BFloat16));
        let bad = ours
            .iter()
            .zip(&torch)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            bad,
            0,
            "{n}x{k}: {bad} of {} values differ from torch",
            n * k
        );
        assert_eq!(torch.len(), n * k);
    }
}

fn freqs_torch(params: &RopeParams, d: i64) -> TT {
    let opts = (Kind::Float, Device::Cpu);
    let exps = TT::arange_start_step(0, d, 2, opts) / d;
    let freqs = 1.0 / TT::pow_scalar(params.theta, &exps);
    let Some(y) = params.yarn else {
        return freqs;
    };
    let corr = |beta: f64| {
        d as f64 * (y.original_seq_len as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * params.theta.ln())
    };
    let low = corr(y.beta_fast).floor().max(0.0);
    let high = corr(y.beta_slow).ceil().min(d as f64 - 1.0);
    let ramp = ((TT::arange(d / 2, opts) - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
    let smooth = 1.0 - ramp;
    &freqs / y.factor * (1.0 - &smooth) + &freqs * &smooth
}

/// RoPE on the last 64 dims of `x` `[t, h, hd]` as the reference model does
/// it: complex multiplication by polar(1, fp32(p) · freq), conjugated for
/// the inverse.
fn rope_torch(x: &TT, positions: &[i64], freqs: &TT, inverse: bool) -> TT {
    let hd = x.size()[2];
    let angles = TT::from_slice(positions).to_kind(Kind::Float).outer(freqs);
    let cis = TT::polar(&angles.ones_like(), &angles).unsqueeze(1);
    let cis = if inverse { cis.conj() } else { cis };
    let pe = x
        .narrow(2, hd - 64, 64)
        .to_kind(Kind::Float)
        .unflatten(-1, [-1, 2])
        .contiguous()
        .view_as_complex();
    let rotated = (pe * cis)
        .view_as_real()
        .flatten(2, 3)
        .to_kind(Kind::BFloat16);
    TT::cat(&[x.narrow(2, 0, hd - 64), rotated], 2)
}

#[test]
fn rope_matches_torch() {
    let mut rng = common::rng("rope_torch");
    let yarn = Yarn {
        factor: 16.0,
        original_seq_len: 65_536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    for params in [
        RopeParams {
            theta: 10_000.0,
            yarn: None,
        },
        RopeParams {
            theta: 160_000.0,
            yarn: Some(yarn),
        },
    ] {
        // The tables must be bitwise equal: one fp32 ulp of freq_i moves the
        // angle at p = 10^6 by up to 0.06 rad, far more than a BF16 ulp.
        let freqs = freqs_torch(&params, 64);
        assert_eq!(
            rope_freqs(&params, 64),
            from_torch_f32(&freqs),
            "{params:?}"
        );
        for (heads, hd) in [(4usize, 512usize), (3, 128)] {
            let mut pos = vec![0i64, 1, 65_535, 65_536, 70_000, 1_000_000, 1_048_575];
            pos.extend((0..9).map(|_| rng.random_range(0..1_048_576i64)));
            let x = common::random_activations(&mut rng, pos.len() * heads * hd, 2.0);
            let xt = bf16_to_torch(&x, &[pos.len() as i64, heads as i64, hd as i64]);
            for inverse in [false, true] {
                let got = if inverse {
                    inverse_rope(&x, &pos, heads, hd, 64, &params)
                } else {
                    rope(&x, &pos, heads, hd, 64, &params)
                };
                let want = from_torch_bf16(&rope_torch(&xt, &pos, &freqs, inverse));
                // cos and sin may differ in the last fp32 place (§3.2): at
                // most one BF16 ulp, except where x0·cos and x1·sin cancel:
                // each side's fp32 error is then a few ulps of |x0| + |x1|
                // (sin/cos, two products, one sum; 8 covers torch's
                // non-correctly-rounded sin/cos), not of the result.
                let mut differ = 0;
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if i % hd < hd - 64 {
                        assert_eq!(g, w, "elem {i} has no RoPE");
                        continue;
                    }
                    // Pairs are interleaved: the partner of element i is i ^ 1.
                    let terms = x[i].to_f64().abs() + x[i ^ 1].to_f64().abs();
                    assert!(
                        common::bf16_pair_close(*g, *w, terms, 8),
                        "{params:?} inverse {inverse} elem {i}: {g} vs torch {w}"
                    );
                    differ += usize::from(g != w);
                }
                eprintln!(
                    "{params:?} {heads}x{hd} inverse {inverse}: {differ} of {} differ by 1 ulp",
                    got.len()
                );
            }
        }
    }
}
