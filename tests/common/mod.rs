//! Helpers shared by the integration tests: fresh random inputs (seeded from
//! the clock and printed, so a failure can be replayed with DEEPINFER_SEED),
//! and comparison metrics.
#![allow(dead_code)]

pub mod attention;
pub mod drift;
pub mod ep;
pub mod fullwidth;
pub mod invariance;
pub mod limits;
pub mod paged;
pub mod share_scales;
pub mod static_inputs;
pub mod tiny;
#[cfg(feature = "torch-ref")]
pub mod torch;
pub mod weights;

use deepinfer::{E4M3, E8M0, Fp4x2};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::RangeInclusive;

/// e4m3 ("fn") decoded from its fields: bias 7, subnormals, 0x7F/0xFF NaN
/// (the tests' own definition, never the library's decoder).
pub fn e4m3_spec(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((code >> 3) & 0xF) as i32;
    let man = (code & 7) as f64;
    if code & 0x7F == 0x7F {
        return f64::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}

/// The set-up virtualenv's Python (`$DEEPINFER_VENV`, default
/// `~/.cache/deepinfer/venv`), which runs the Python references.
pub fn python() -> std::path::PathBuf {
    std::env::var_os("DEEPINFER_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/deepinfer/venv")
        })
        .join("bin/python")
}

/// Prints a test's text report and, when DEEPINFER_DUMP_DIR is set (the GPU
/// bundle's run.sh sets it and keeps the folder under reports/), writes it
/// there as `name`, so the report survives a passing run.
pub fn keep_report(name: &str, text: &str) {
    print!("{text}");
    if let Some(dir) = std::env::var_os("DEEPINFER_DUMP_DIR") {
        std::fs::write(std::path::Path::new(&dir).join(name), text).unwrap();
    }
}

/// Whether DEEPINFER_QUICK is set: the GPU bundle's sanitizer passes set it,
/// and the CUDA tests then keep their small shapes.
pub fn quick() -> bool {
    std::env::var_os("DEEPINFER_QUICK").is_some()
}

/// A fresh RNG per test run; DEEPINFER_SEED=<n> replays one.
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("DEEPINFER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: DEEPINFER_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// BF16 values spread over many binades (magnitudes 2^-20 .. 2^12), both
/// signs, with occasional exact zeros and a few large outliers per row.
pub fn random_bf16(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let r: f32 = rng.random();
            if r < 0.01 {
                bf16::ZERO
            } else {
                let mag = 2f32.powf(rng.random_range(-20.0..12.0));
                let sign = if rng.random::<bool>() { 1.0 } else { -1.0 };
                bf16::from_f32(sign * mag * rng.random_range(1.0..2.0))
            }
        })
        .collect()
}

/// BF16 values of a typical activation: normal-ish around 0 with scale `s`.
pub fn random_activations(rng: &mut StdRng, n: usize, s: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let u: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0;
            bf16::from_f32(u * s)
        })
        .collect()
}

/// Random e4m3 codes over the whole finite range (2^-9 … 448, both signs,
/// zeros included), the NaN codes (0x7F, 0xFF) excluded.
pub fn random_e4m3(rng: &mut StdRng, n: usize) -> Vec<E4M3> {
    (0..n)
        .map(|_| {
            loop {
                let c: u8 = rng.random();
                if c & 0x7F != 0x7F {
                    break E4M3(c);
                }
            }
        })
        .collect()
}

/// Exponents of the GEMM tests' random E8M0 scales: 2^-10 ..= 2^4.
pub const GEMM_SCALES: RangeInclusive<i32> = -10..=4;

/// Wider exponents, 2^-10 ..= 2^10, so that a wrong scale is visible.
pub const WIDE_SCALES: RangeInclusive<i32> = -10..=10;

/// Random E8M0 scales 2^e with the exponent e uniform in `exponents` (which
/// must stay within -127 ..= 127).
pub fn random_e8m0(rng: &mut StdRng, n: usize, exponents: RangeInclusive<i32>) -> Vec<E8M0> {
    (0..n)
        .map(|_| E8M0((127 + rng.random_range(exponents.clone())) as u8))
        .collect()
}

/// Random packed e2m1 pairs (every code is a value), `n_bytes` of them.
pub fn random_fp4(rng: &mut StdRng, n_bytes: usize) -> Vec<Fp4x2> {
    (0..n_bytes).map(|_| Fp4x2(rng.random())).collect()
}

/// Masked-layout counts for `e` experts of `max_m` rows: expert 0 empty,
/// expert 1 full, the rest uniform in `0..=max_m`.
pub fn masked_counts(rng: &mut StdRng, e: usize, max_m: usize) -> Vec<i32> {
    (0..e)
        .map(|x| match x {
            0 => 0,
            1 => max_m as i32,
            _ => rng.random_range(0..=max_m as i32),
        })
        .collect()
}

/// Score values of the candidate-path tests: a few distinct values (ties
/// between block maxima), ±∞ and NaN of both signs; no −0 (the reference
/// leaves the sign of a ±0 block maximum open, `ops::index_candidates`).
pub fn candidate_palette() -> Vec<bf16> {
    vec![
        bf16::NEG_INFINITY,
        bf16::from_f32(-2.0),
        bf16::ZERO,
        bf16::from_f32(0.5),
        bf16::from_f32(3.0),
        bf16::INFINITY,
        bf16::from_bits(0x7FC1),
        bf16::from_bits(0xFFC3),
    ]
}

/// A candidate-source score row of `n` entries drawn from `palette`; three
/// rows in ten are sparse: there each entry is −∞ with probability
/// `sparse_neg_inf`, else drawn from the palette.
pub fn candidate_row(
    rng: &mut StdRng,
    n: usize,
    palette: &[bf16],
    sparse_neg_inf: f64,
) -> Vec<bf16> {
    let sparse = rng.random_bool(0.3);
    (0..n)
        .map(|_| {
            if sparse && rng.random_bool(sparse_neg_inf) {
                bf16::NEG_INFINITY
            } else {
                palette[rng.random_range(0..palette.len())]
            }
        })
        .collect()
}

/// Visible counts of the candidate-path tests around the row end and a
/// block edge: the whole row, none, one, random, the edge ± 1, past the end
/// and below zero (both clamped).
pub fn candidate_visibles(rng: &mut StdRng, n: usize, block: usize) -> Vec<i32> {
    let edge = (n / block / 2) * block;
    vec![
        n as i32,
        0,
        1,
        rng.random_range(0..=n as i32),
        edge as i32,
        (edge + 1).min(n) as i32,
        edge.saturating_sub(1) as i32,
        n as i32 + 5,
        -3,
    ]
}

/// Distance in units in the last place between two finite BF16 values.
pub fn bf16_ulps(a: bf16, b: bf16) -> u32 {
    let key = |x: bf16| {
        let b = x.to_bits() as i32;
        if b & 0x8000 != 0 { -(b & 0x7FFF) } else { b }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// Whether `got`, an fp32 evaluation of a sum of `n_ops` terms rounded once
/// to BF16, agrees with the exact value `want`: within one BF16 ulp, or, where
/// the terms cancel, within the fp32 error bound `n_ops·2^-24·Σ|terms|` plus
/// one BF16 rounding (`|want|·2^-8`). `abs_terms` is `Σ|terms|`.
pub fn bf16_close(got: bf16, want: f64, abs_terms: f64, n_ops: usize) -> bool {
    // The rounding moves the fp32 value by at most half an ulp of got's
    // binade, which can exceed |want|·2^-8 when the fp32 error is large.
    let rounding = bf16_half_ulp(got).max(want.abs() * 2f64.powi(-8));
    let slack = n_ops as f64 * 2f64.powi(-24) * abs_terms + rounding;
    bf16_ulps(got, bf16::from_f64(want)) <= 1 || (got.to_f64() - want).abs() <= slack
}

/// Half the spacing of BF16 values in the binade of `x` (0 for zero): the
/// most that rounding any real number to `x` can have moved it.
pub fn bf16_half_ulp(x: bf16) -> f64 {
    let e = ((x.to_bits() >> 7) & 0xFF) as i32;
    match (e, x.to_bits() & 0x7FFF) {
        (_, 0) => 0.0,
        (0, _) => 2f64.powi(-134),
        _ => 2f64.powi(e - 127 - 8),
    }
}

/// Whether two BF16 values that are each an fp32 evaluation (sum of `n_ops`
/// roundings of terms with `Σ|terms|` = `abs_terms`) of the same exact value,
/// rounded once, agree: within one ulp, or, where the terms cancel, within
/// both fp32 error bounds plus both roundings (`2·n_ops·2^-24·Σ|terms|` plus
/// half an ulp of each).
pub fn bf16_pair_close(a: bf16, b: bf16, abs_terms: f64, n_ops: usize) -> bool {
    let slack =
        2.0 * n_ops as f64 * 2f64.powi(-24) * abs_terms + bf16_half_ulp(a) + bf16_half_ulp(b);
    bf16_ulps(a, b) <= 1 || (a.to_f64() - b.to_f64()).abs() <= slack
}

/// The calc_diff limit for `got` against exact `want` when `base` bounds the
/// share of the BF16 roundings and `err[i]` bounds the fp32 error of element
/// i before it: √(calc_diff·D) ≤ √(base·D) + √Σerr² (Minkowski), with
/// D = Σgot² + Σwant², so the limit is (√base + √(Σerr²/D))². It equals
/// `base` when the fp32 error is negligible and grows only where the outputs
/// cancel to the size of that error (a single output near zero).
pub fn calc_diff_limit(got: &[f64], want: &[f64], err: &[f64], base: f64) -> f64 {
    let d: f64 = got.iter().chain(want).map(|v| v * v).sum();
    let e: f64 = err.iter().map(|v| v * v).sum();
    if d == 0.0 {
        return base;
    }
    (base.sqrt() + (e / d).sqrt()).powi(2)
}

pub fn to_f64(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        TempDir::new_in(&std::env::temp_dir(), label)
    }

    /// A fresh directory under `base` (e.g. `CARGO_TARGET_TMPDIR`, a disk
    /// file system where the system temp dir may be tmpfs).
    pub fn new_in(base: &std::path::Path, label: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("deepinfer-test-{}-{n}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// W1 and W3 outputs `g`, `u` (`[.., I]`, I a multiple of 32, one device)
/// as the gate-up tensor `[.., 2I]` that `ops::swiglu_act_quant_fp8` reads:
/// g's 32-column block b, then u's, for every b.
pub fn gate_up(g: &deepinfer::Tensor, u: &deepinfer::Tensor) -> deepinfer::Tensor {
    let i = *g.shape().last().expect("g has a last dimension");
    assert_eq!(
        (g.shape(), i % 32),
        (u.shape(), 0),
        "g and u: one shape, I % 32 == 0"
    );
    let blocks = g.numel() / 32;
    let view = |t: &deepinfer::Tensor| t.clone().reshape(&[blocks, 32]).unwrap();
    let mut shape = g.shape().to_vec();
    *shape.last_mut().unwrap() = 2 * i;
    deepinfer::ops::cat_cols(&[&view(g), &view(u)])
        .unwrap()
        .reshape(&shape)
        .unwrap()
}
