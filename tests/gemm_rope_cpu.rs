//! The GEMM and RoPE references against independent f64 formulations written
//! here from `v41-flash.md` §3.2, §10.4 and §10.6: every operand is decoded
//! from its bit fields in f64, the block-scaled sums are formed in f64, and
//! the rotation is evaluated in f64. Shapes cover K, M and N tails and real
//! model linears at small M.

mod common;

use common::{WIDE_SCALES, bf16_ulps, random_e4m3, random_e8m0, random_fp4};
use deepinfer::cpu_backend::{
    RopeParams, Yarn, bf16_gemm, f32_gemm, fp4_gemm, fp4_gemm_f32, fp8_gemm, fp8_gemm_f32,
    inverse_rope, rope, rope_freqs, yarn_band,
};
use deepinfer::numerics::calc_diff;
use deepinfer::{E4M3, E8M0, Fp4x2, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

const U32: f64 = 1.0 / (1u64 << 24) as f64; // fp32 unit roundoff, 2^-24

// ---------------------------------------------------------------- formats

/// e4m3 ("fn") from its fields: sign, 4-bit exponent (bias 7), 3-bit mantissa.
fn e4m3_f64(q: E4M3) -> f64 {
    let sign = if q.0 & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((q.0 >> 3) & 0xF) as i32;
    let man = (q.0 & 7) as f64;
    if exp == 0 {
        sign * man / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}

/// e2m1 from its fields: sign bit 3, 2-bit exponent (bias 1), 1-bit mantissa.
fn e2m1_f64(nibble: u8) -> f64 {
    let sign = if nibble & 8 != 0 { -1.0 } else { 1.0 };
    let exp = ((nibble >> 1) & 3) as i32;
    let man = (nibble & 1) as f64;
    if exp == 0 {
        sign * man / 2.0
    } else {
        sign * (1.0 + man / 2.0) * 2f64.powi(exp - 1)
    }
}

fn e8m0_f64(s: E8M0) -> f64 {
    2f64.powi(s.0 as i32 - 127)
}

// ---------------------------------------------------------------- GEMM reference

/// A scale lookup: (row, K block) → scale.
type ScaleFn<'a> = dyn Fn(usize, usize) -> f64 + 'a;

/// Per output: Σ_k a·b·sa·sb and Σ_k |a·b·sa·sb| in f64. Every term is
/// exact in f64; the f64 sum is off by at most k · 2^-53 of the second,
/// negligible against the fp32 bounds below.
struct Expected {
    value: Vec<f64>,
    abs: Vec<f64>,
}

/// `a` is `[m, k]`, `b` `[n, k]` (decoded, unscaled); `sa(row, kblock)` and
/// `sb(n, kblock)` give the scales.
fn expected(
    a: &[f64],
    b: &[f64],
    (m, n, k): (usize, usize, usize),
    sa: &ScaleFn,
    sb: &ScaleFn,
) -> Expected {
    let mut value = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let t = a[i * k + kk] * b[j * k + kk] * sa(i, kk / 32) * sb(j, kk / 32);
                value[i * n + j] += t;
                abs[i * n + j] += t.abs();
            }
        }
    }
    Expected { value, abs }
}

/// Error bound of the §10.4 fp32 result: at most 31 roundings inside a
/// 32-block and one per block addition, each ≤ 2^-24 of the running |sum|.
fn fp32_bound(k: usize, abs: f64) -> f64 {
    (32 + k.div_ceil(32)) as f64 * U32 * abs
}

/// The index of the first output outside the bound, if any.
fn first_violation(got: &[f32], want: &Expected, k: usize) -> Option<usize> {
    got.iter()
        .zip(want.value.iter().zip(&want.abs))
        .position(|(g, (v, a))| (*g as f64 - v).abs() > fp32_bound(k, *a))
}

/// Checks the fp32 result against the bound, the BF16 result as its
/// rounding, and the BF16 calc_diff against the exact values.
fn check(what: &str, got32: &[f32], got16: &[bf16], want: &Expected, k: usize) {
    assert_eq!(got32.len(), want.value.len(), "{what}: output length");
    if let Some(i) = first_violation(got32, want, k) {
        panic!(
            "{what}: output {i}: fp32 {} vs exact {} (bound {})",
            got32[i],
            want.value[i],
            fp32_bound(k, want.abs[i])
        );
    }
    for (i, (h, f)) in got16.iter().zip(got32).enumerate() {
        assert_eq!(
            *h,
            bf16::from_f32(*f),
            "{what}: output {i} is not BF16(fp32)"
        );
    }
    if !got16.is_empty() {
        // One BF16 rounding alone gives calc_diff ≈ 1e-6 on random data (up
        // to 2^-17 for a single value); 1e-5 leaves room for that and nothing
        // more: a wrong scale or block costs orders of magnitude.
        let got = common::to_f64(got16);
        let d = calc_diff(&got, &want.value);
        let err: Vec<f64> = want.abs.iter().map(|a| fp32_bound(k, *a)).collect();
        let limit = common::calc_diff_limit(&got, &want.value, &err, 1e-5);
        assert!(d < limit, "{what}: calc_diff {d} (limit {limit})");
    }
}

struct Fp8Case {
    a: Vec<E4M3>,
    a_s: Vec<E8M0>,
    b: Vec<E4M3>,
    b_s: Vec<E8M0>,
}

impl Fp8Case {
    fn random(rng: &mut StdRng, m: usize, n: usize, k: usize) -> Self {
        let kb = k.div_ceil(32);
        Fp8Case {
            a: random_e4m3(rng, m * k),
            a_s: random_e8m0(rng, m * kb, WIDE_SCALES),
            b: random_e4m3(rng, n * k),
            b_s: random_e8m0(rng, n.div_ceil(32) * kb, WIDE_SCALES),
        }
    }

    /// The exact result with the §10.2 scale layout, or with `sb` replaced.
    fn expected(&self, (m, n, k): (usize, usize, usize), sb: Option<&ScaleFn>) -> Expected {
        let kb = k.div_ceil(32);
        let a: Vec<f64> = self.a.iter().map(|&q| e4m3_f64(q)).collect();
        let b: Vec<f64> = self.b.iter().map(|&q| e4m3_f64(q)).collect();
        let sa = |i: usize, blk: usize| e8m0_f64(self.a_s[i * kb + blk]);
        let grid = |j: usize, blk: usize| e8m0_f64(self.b_s[(j / 32) * kb + blk]);
        expected(&a, &b, (m, n, k), &sa, sb.unwrap_or(&grid))
    }

    fn run(&self, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<bf16>) {
        (
            fp8_gemm_f32(&self.a, &self.a_s, &self.b, &self.b_s, m, n, k),
            fp8_gemm(&self.a, &self.a_s, &self.b, &self.b_s, m, n, k),
        )
    }
}

struct Fp4Case {
    a: Vec<E4M3>,
    a_s: Vec<E8M0>,
    b: Vec<Fp4x2>,
    b_s: Vec<E8M0>,
}

impl Fp4Case {
    fn random(rng: &mut StdRng, m: usize, n: usize, k: usize) -> Self {
        let kb = k.div_ceil(32);
        Fp4Case {
            a: random_e4m3(rng, m * k),
            a_s: random_e8m0(rng, m * kb, WIDE_SCALES),
            b: random_fp4(rng, n * k.div_ceil(2)),
            b_s: random_e8m0(rng, n * kb, WIDE_SCALES),
        }
    }

    /// Element kk of row j: byte kk/2 of the row, low nibble when kk is even.
    fn b_f64(&self, n: usize, k: usize) -> Vec<f64> {
        let row_bytes = k.div_ceil(2);
        (0..n * k)
            .map(|idx| {
                let (j, kk) = (idx / k, idx % k);
                let byte = self.b[j * row_bytes + kk / 2].0;
                e2m1_f64((byte >> (4 * (kk % 2))) & 0xF)
            })
            .collect()
    }

    fn expected(&self, (m, n, k): (usize, usize, usize), sb: Option<&ScaleFn>) -> Expected {
        let kb = k.div_ceil(32);
        let a: Vec<f64> = self.a.iter().map(|&q| e4m3_f64(q)).collect();
        let sa = |i: usize, blk: usize| e8m0_f64(self.a_s[i * kb + blk]);
        let per_row = |j: usize, blk: usize| e8m0_f64(self.b_s[j * kb + blk]);
        expected(
            &a,
            &self.b_f64(n, k),
            (m, n, k),
            &sa,
            sb.unwrap_or(&per_row),
        )
    }

    fn run(&self, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<bf16>) {
        (
            fp4_gemm_f32(&self.a, &self.a_s, &self.b, &self.b_s, m, n, k),
            fp4_gemm(&self.a, &self.a_s, &self.b, &self.b_s, m, n, k),
        )
    }
}

const TAIL_K: [usize; 4] = [32, 33, 64 + 7, 1];
const TAIL_M: [usize; 2] = [1, 3];
const TAIL_N: [usize; 3] = [1, 31, 33];

// ---------------------------------------------------------------- GEMM tests

#[test]
fn fp8_gemm_matches_f64_on_tail_shapes() {
    let mut rng = common::rng("fp8_gemm_tails");
    for k in TAIL_K {
        for m in TAIL_M {
            for n in TAIL_N {
                let c = Fp8Case::random(&mut rng, m, n, k);
                let (f, h) = c.run(m, n, k);
                check(
                    &format!("fp8 {m}x{n}x{k}"),
                    &f,
                    &h,
                    &c.expected((m, n, k), None),
                    k,
                );
            }
        }
    }
}

#[test]
fn fp4_gemm_matches_f64_on_tail_shapes() {
    let mut rng = common::rng("fp4_gemm_tails");
    for k in TAIL_K.into_iter().chain([34]) {
        for m in TAIL_M {
            for n in TAIL_N {
                let c = Fp4Case::random(&mut rng, m, n, k);
                let (f, h) = c.run(m, n, k);
                check(
                    &format!("fp4 {m}x{n}x{k}"),
                    &f,
                    &h,
                    &c.expected((m, n, k), None),
                    k,
                );
            }
        }
    }
}

#[test]
fn gemm_scale_indexing_is_checked() {
    // Scales vary per activation row and block, per weight row block (FP8) or
    // row (FP4) and block. The same check fails for each plausible indexing
    // mistake, so a wrong index in the code under test cannot pass.
    let mut rng = common::rng("gemm_scales");
    let (m, n, k): (usize, usize, usize) = (3, 3 * 32 + 1, 4 * 32 + 5);
    let kb = k.div_ceil(32);
    let c = Fp8Case::random(&mut rng, m, n, k);
    let (f, h) = c.run(m, n, k);
    check("fp8 scales", &f, &h, &c.expected((m, n, k), None), k);
    let nb = n.div_ceil(32);
    let wrong: [(&str, Box<ScaleFn>); 4] = [
        (
            "next row block",
            Box::new(|j, b| e8m0_f64(c.b_s[((j / 32 + 1) % nb) * kb + b])),
        ),
        (
            "next K block",
            Box::new(|j, b| e8m0_f64(c.b_s[(j / 32) * kb + (b + 1) % kb])),
        ),
        (
            "row index instead of row block",
            Box::new(|j, b| e8m0_f64(c.b_s[(j % nb) * kb + b])),
        ),
        ("one scale", Box::new(|_, _| e8m0_f64(c.b_s[0]))),
    ];
    for (name, sb) in &wrong {
        let w = c.expected((m, n, k), Some(sb.as_ref()));
        assert!(
            first_violation(&f, &w, k).is_some(),
            "a wrong weight scale index ({name}) would pass"
        );
    }
    // Activation scales of the wrong row or block.
    let a: Vec<f64> = c.a.iter().map(|&q| e4m3_f64(q)).collect();
    let b: Vec<f64> = c.b.iter().map(|&q| e4m3_f64(q)).collect();
    let sb = |j: usize, blk: usize| e8m0_f64(c.b_s[(j / 32) * kb + blk]);
    let wrong_row = |i: usize, blk: usize| e8m0_f64(c.a_s[((i + 1) % m) * kb + blk]);
    let wrong_blk = |i: usize, blk: usize| e8m0_f64(c.a_s[i * kb + (blk + 1) % kb]);
    for sa in [&wrong_row as &ScaleFn, &wrong_blk] {
        let w = expected(&a, &b, (m, n, k), sa, &sb);
        assert!(
            first_violation(&f, &w, k).is_some(),
            "a wrong activation scale index would pass"
        );
    }

    let c = Fp4Case::random(&mut rng, m, n, k);
    let (f, h) = c.run(m, n, k);
    check("fp4 scales", &f, &h, &c.expected((m, n, k), None), k);
    let fp8_grid = |j: usize, b: usize| e8m0_f64(c.b_s[(j / 32) * kb + b]);
    let w = c.expected((m, n, k), Some(&fp8_grid));
    assert!(
        first_violation(&f, &w, k).is_some(),
        "a 32-row weight scale grid would pass for FP4"
    );
}

#[test]
fn fp8_and_fp4_gemm_on_model_shapes() {
    let mut rng = common::rng("gemm_model_shapes");
    // wq_a [1280, 5120] and wkv [512, 5120] at M = 2, wo_b's K = 8192 at
    // M = 1 on 64 rows, with activations quantised by the FP8 1×32 quantiser.
    for (m, n, k) in [(2, 1280, 5120), (2, 512, 5120), (1, 64, 8192)] {
        let x = common::random_activations(&mut rng, m * k, 3.0);
        let (a, a_s) = ops::act_quant_fp8(&Tensor::from_vec(x, &[m, k]).unwrap()).unwrap();
        let mut c = Fp8Case::random(&mut rng, 0, n, k);
        c.a = a.to_vec::<E4M3>().unwrap();
        c.a_s = a_s.to_vec::<E8M0>().unwrap();
        let (f, h) = c.run(m, n, k);
        check(
            &format!("fp8 {m}x{n}x{k}"),
            &f,
            &h,
            &c.expected((m, n, k), None),
            k,
        );
    }
    // Routed-expert w1/w3 [2304, 5120] and w2 [5120, 2304] (packed FP4).
    for (m, n, k) in [(2, 2304, 5120), (1, 5120, 2304)] {
        let x = common::random_activations(&mut rng, m * k, 3.0);
        let (a, a_s) = ops::act_quant_fp8(&Tensor::from_vec(x, &[m, k]).unwrap()).unwrap();
        let mut c = Fp4Case::random(&mut rng, 0, n, k);
        c.a = a.to_vec::<E4M3>().unwrap();
        c.a_s = a_s.to_vec::<E8M0>().unwrap();
        let (f, h) = c.run(m, n, k);
        check(
            &format!("fp4 {m}x{n}x{k}"),
            &f,
            &h,
            &c.expected((m, n, k), None),
            k,
        );
    }
}

#[test]
fn gemms_accept_empty_dimensions() {
    let one = [E4M3(0x38)]; // 1.0
    let s = [E8M0(127)];
    assert!(fp8_gemm(&[], &[], &one, &s, 0, 1, 1).is_empty());
    assert!(fp8_gemm(&one, &s, &[], &[], 1, 0, 1).is_empty());
    assert_eq!(fp8_gemm_f32(&[], &[], &[], &[], 2, 3, 0), vec![0.0; 6]);
    assert_eq!(fp4_gemm_f32(&[], &[], &[], &[], 2, 3, 0), vec![0.0; 6]);
    assert_eq!(bf16_gemm(&[], &[], 2, 1, 0), vec![bf16::ZERO; 2]);
    assert!(f32_gemm::<f32, bf16>(&[], &[bf16::ONE; 15], 0, 5, 3).is_empty());
}

/// Σ a·w and Σ|a·w| per output in f64; a `[m, k]`, w `[n, k]`.
fn plain_expected(a: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Expected {
    expected(a, w, (m, n, k), &|_, _| 1.0, &|_, _| 1.0)
}

/// fp32 sequential sum of k exact-or-rounded products: ≤ (k + 1) roundings.
fn plain_bound(k: usize, abs: f64) -> f64 {
    (k + 1) as f64 * U32 * abs
}

#[test]
fn bf16_and_f32_gemms_match_f64() {
    let mut rng = common::rng("bf16_f32_gemm");
    let shapes = [
        (1, 1, 1),
        (3, 33, 71),
        (2, 512, 5120), // ratio-1 compressor wkv
        (3, 128, 512),  // indexer wk
        (2, 32, 5120),  // indexer weights_proj
        (2, 24, 20480), // mHC hc_fn (fp32 weight, fp32 input)
    ];
    for (m, n, k) in shapes {
        let a = common::random_activations(&mut rng, m * k, 2.0);
        let w = common::random_activations(&mut rng, n * k, 0.05);
        let want = plain_expected(&common::to_f64(&a), &common::to_f64(&w), m, n, k);
        let f = f32_gemm(&a, &w, m, n, k);
        let h = bf16_gemm(&a, &w, m, n, k);
        for (i, ((g, v), ab)) in f.iter().zip(&want.value).zip(&want.abs).enumerate() {
            assert!(
                (*g as f64 - v).abs() <= plain_bound(k, *ab),
                "bf16 {m}x{n}x{k} out {i}: {g} vs {v}"
            );
        }
        for (x, y) in h.iter().zip(&f) {
            assert_eq!(*x, bf16::from_f32(*y), "bf16_gemm is BF16(f32_gemm)");
        }
        let d = calc_diff(&common::to_f64(&h), &want.value);
        assert!(d < 1e-5, "bf16 {m}x{n}x{k}: calc_diff {d}");

        // fp32 input with an fp32 weight, and with a BF16 weight.
        let a32: Vec<f32> = (0..m * k).map(|_| rng.random_range(-4.0..4.0)).collect();
        let w32: Vec<f32> = w.iter().map(|v| v.to_f32() * 1.25).collect();
        let a64: Vec<f64> = a32.iter().map(|&v| v as f64).collect();
        for (name, got, w64) in [
            (
                "f32 x f32",
                f32_gemm(&a32, &w32, m, n, k),
                w32.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            ),
            (
                "f32 x bf16",
                f32_gemm(&a32, &w, m, n, k),
                common::to_f64(&w),
            ),
        ] {
            // Products of two fp32 values round once more each: k + 1
            // roundings of the products plus k of the sum.
            let want = plain_expected(&a64, &w64, m, n, k);
            for (i, ((g, v), ab)) in got.iter().zip(&want.value).zip(&want.abs).enumerate() {
                assert!(
                    (*g as f64 - v).abs() <= plain_bound(2 * k, *ab),
                    "{name} {m}x{n}x{k} out {i}: {g} vs {v}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- RoPE

const V41_YARN: Yarn = Yarn {
    factor: 16.0,
    original_seq_len: 65_536,
    beta_fast: 32.0,
    beta_slow: 1.0,
};
const RATIO0: RopeParams = RopeParams {
    theta: 10_000.0,
    yarn: None,
};
const COMPRESSED: RopeParams = RopeParams {
    theta: 160_000.0,
    yarn: Some(V41_YARN),
};

/// The distance between an f32 and an f64 in units of the f32 ulp at the f64.
fn f32_ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64;
    (got as f64 - want).abs() / ulp
}

/// The §3.2 frequency table in f64: θ^(−2i/d), the YaRN band from the
/// correction-range formula, the linear ramp and the blend.
fn freqs_f64(theta: f64, d: usize, yarn: Option<Yarn>) -> Vec<f64> {
    let base = (0..d / 2).map(|i| theta.powf(-2.0 * i as f64 / d as f64));
    let Some(y) = yarn else {
        return base.collect();
    };
    let corr = |beta: f64| {
        d as f64 * (y.original_seq_len as f64 / (2.0 * std::f64::consts::PI * beta)).ln()
            / (2.0 * theta.ln())
    };
    let low = corr(y.beta_fast).floor().max(0.0);
    let high = corr(y.beta_slow).ceil().min(d as f64 - 1.0);
    base.enumerate()
        .map(|(i, f)| {
            let ramp = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
            f / y.factor * ramp + f * (1.0 - ramp)
        })
        .collect()
}

#[test]
fn yarn_band_of_compressed_layers_is_15_to_25() {
    assert_eq!(yarn_band(160_000.0, 64, &V41_YARN), (15, 25));
}

#[test]
fn ratio0_frequencies_are_plain_powers() {
    for theta in [10_000.0, 160_000.0] {
        let got = rope_freqs(&RopeParams { theta, yarn: None }, 64);
        let want = freqs_f64(theta, 64, None);
        assert_eq!(got.len(), 32);
        assert_eq!(got[0], 1.0);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Two fp32 roundings (the power, then the reciprocal): at most
            // 1/2 ulp each, the first one measured at the power's magnitude.
            assert!(f32_ulps(*g, *w) <= 1.5, "θ {theta} pair {i}: {g} vs {w}");
        }
        // YaRN with original length 0 is inactive.
        let off = Yarn {
            original_seq_len: 0,
            ..V41_YARN
        };
        assert_eq!(
            rope_freqs(
                &RopeParams {
                    theta,
                    yarn: Some(off)
                },
                64
            ),
            got
        );
    }
}

#[test]
fn yarn_frequencies_follow_the_band() {
    let got = rope_freqs(&COMPRESSED, 64);
    let want = freqs_f64(160_000.0, 64, Some(V41_YARN));
    let plain = rope_freqs(
        &RopeParams {
            theta: 160_000.0,
            yarn: None,
        },
        64,
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // Outside the band the blend is exact (weights 0 and 1), so the
        // plain table's 1.5 ulps hold; inside it the ramp, 1 − smooth, the two
        // products and the sum add five fp32 roundings of terms no larger
        // than the result: 3 ulps.
        let tol = if (16..25).contains(&i) { 3.0 } else { 1.5 };
        assert!(f32_ulps(*g, *w) <= tol, "pair {i}: {g} vs {w}");
        // Pairs up to low keep their frequency, pairs from high on are
        // divided by the factor exactly.
        if i <= 15 {
            assert_eq!(*g, plain[i], "pair {i} keeps its frequency");
        } else if i >= 25 {
            assert_eq!(*g, plain[i] / 16.0, "pair {i} is interpolated");
        } else {
            assert!(*g < plain[i] && *g > plain[i] / 16.0, "pair {i} is blended");
        }
    }
}

/// The §3.2 rotation in f64 from the angle fp32(p) · freq_i (one fp32
/// multiply, as the spec requires), or from the f64 angle p · freq_i.
fn rope_f64(
    x: &[bf16],
    positions: &[i64],
    (heads, head_dim, rope_dim): (usize, usize, usize),
    freqs: &[f32],
    f64_angle: bool,
    inverse: bool,
) -> Vec<f64> {
    let mut out = common::to_f64(x);
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (t * heads + h) * head_dim + head_dim - rope_dim;
            for (i, &f) in freqs.iter().enumerate() {
                let angle = if f64_angle {
                    p as f64 * f as f64
                } else {
                    (p as f32 * f) as f64
                };
                let (sin, cos) = angle.sin_cos();
                let sin = if inverse { -sin } else { sin };
                let (x0, x1) = (out[base + 2 * i], out[base + 2 * i + 1]);
                out[base + 2 * i] = x0 * cos - x1 * sin;
                out[base + 2 * i + 1] = x0 * sin + x1 * cos;
            }
        }
    }
    out
}

fn positions(rng: &mut StdRng) -> Vec<i64> {
    let mut p = vec![0, 1, 127, 65_535, 65_536, 70_000, 1_000_000, 1_048_575];
    p.extend((0..8).map(|_| rng.random_range(0..1_048_576)));
    p
}

#[test]
fn rope_matches_f64_within_one_bf16_ulp() {
    let mut rng = common::rng("rope_cpu");
    // Attention q / KV (512 = 448 + 64) and the indexer (128 = 64 + 64).
    for (heads, head_dim) in [(4usize, 512usize), (1, 512), (3, 128)] {
        for params in [RATIO0, COMPRESSED] {
            let pos = positions(&mut rng);
            let x = common::random_activations(&mut rng, pos.len() * heads * head_dim, 2.0);
            let freqs = rope_freqs(&params, 64);
            for inverse in [false, true] {
                let got = if inverse {
                    inverse_rope(&x, &pos, heads, head_dim, 64, &params)
                } else {
                    rope(&x, &pos, heads, head_dim, 64, &params)
                };
                let dims = (heads, head_dim, 64);
                let want = rope_f64(&x, &pos, dims, &freqs, false, inverse);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let d = i % head_dim;
                    if d < head_dim - 64 {
                        assert_eq!(*g, x[i], "dim {d} has no RoPE");
                    } else {
                        // The kernel rotates in fp32 (sin/cos rounded, two
                        // products, one sum): where x0·cos and x1·sin cancel
                        // the error is a few fp32 ulps of |x0| + |x1| (pairs
                        // are interleaved: the partner of element i is i ^ 1).
                        let terms = x[i].to_f64().abs() + x[i ^ 1].to_f64().abs();
                        assert!(
                            common::bf16_close(*g, *w, terms, 8),
                            "{params:?} inverse {inverse} token {} dim {d}: {g} vs {w}",
                            i / (heads * head_dim)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn rope_angle_is_one_fp32_multiply() {
    // Beyond 65,536 the fp32 rounding of p · freq moves the result by many
    // BF16 ulps; an f64 angle would fail the previous test there.
    let mut rng = common::rng("rope_fp32_angle");
    let pos = vec![70_000i64, 1_000_000];
    let x = common::random_activations(&mut rng, 2 * 8 * 512, 1.0);
    for params in [RATIO0, COMPRESSED] {
        let freqs = rope_freqs(&params, 64);
        let got = rope(&x, &pos, 8, 512, 64, &params);
        let f64_angle = rope_f64(&x, &pos, (8, 512, 64), &freqs, true, false);
        let far = got
            .iter()
            .zip(&f64_angle)
            .filter(|(g, w)| bf16_ulps(**g, bf16::from_f64(**w)) > 2)
            .count();
        assert!(far > 0, "{params:?}: an f64 angle is indistinguishable");
    }
}

#[test]
fn inverse_rope_undoes_rope() {
    let mut rng = common::rng("rope_roundtrip");
    for params in [RATIO0, COMPRESSED] {
        let pos = positions(&mut rng);
        let (heads, head_dim) = (4, 512);
        let x = common::random_activations(&mut rng, pos.len() * heads * head_dim, 2.0);
        let back = inverse_rope(
            &rope(&x, &pos, heads, head_dim, 64, &params),
            &pos,
            heads,
            head_dim,
            64,
            &params,
        );
        let (mut exact, mut rotated) = (0, 0);
        for (i, (pair_x, pair_b)) in x.chunks(2).zip(back.chunks(2)).enumerate() {
            if (2 * i) % head_dim < head_dim - 64 {
                assert_eq!(pair_x, pair_b, "pair {i} has no RoPE");
                continue;
            }
            // Two BF16 roundings of a rotation: each element is within 2 BF16
            // ulps of the pair's magnitude r (ulp(r) = 2^(⌊log2 r⌋ − 7)).
            let r = pair_x[0].to_f64().hypot(pair_x[1].to_f64());
            let ulp = if r > 0.0 {
                2f64.powi(r.log2().floor() as i32 - 7)
            } else {
                0.0
            };
            for (a, b) in pair_x.iter().zip(pair_b) {
                assert!(
                    (a.to_f64() - b.to_f64()).abs() <= 2.0 * ulp,
                    "{params:?} pair {i}: {a} -> {b}"
                );
                exact += usize::from(a == b);
                rotated += 1;
            }
        }
        eprintln!("{params:?}: {exact} of {rotated} rotated elements come back exactly");
    }
}

#[test]
fn rope_accepts_empty_inputs() {
    assert!(rope(&[], &[], 4, 512, 64, &COMPRESSED).is_empty());
    let x = vec![bf16::ONE; 3];
    assert_eq!(rope(&x, &[5], 0, 512, 64, &RATIO0), Vec::<bf16>::new());
    assert_eq!(inverse_rope(&x, &[5], 3, 1, 0, &RATIO0), x);
}
