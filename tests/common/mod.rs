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
    let slack = n_ops as f64 * 2f64.powi(-24) * abs_terms + want.abs() * 2f64.powi(-8);
    bf16_ulps(got, bf16::from_f64(want)) <= 1 || (got.to_f64() - want).abs() <= slack
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
