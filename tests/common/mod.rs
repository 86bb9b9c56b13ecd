//! Helpers shared by the integration tests: fresh random inputs (seeded from
//! the clock and printed, so a failure can be replayed with DEEPINFER_SEED),
//! and comparison metrics.
#![allow(dead_code)]

#[cfg(feature = "torch-ref")]
pub mod torch;

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("deepinfer-test-{}-{n}-{label}", std::process::id()));
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
