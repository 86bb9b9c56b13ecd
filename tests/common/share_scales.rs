//! One test body for every device: `ops::mx_share_scales` gives the bytes
//! of `numerics::share_mx_scales` (run on the host copy), bitwise, on
//! activations (1 × 32 scales) and weights (32 × 32) with odd row counts, K
//! tails, NaN codes and NaN scales, at runs of 64, 128 and 256; bad
//! arguments are typed errors that leave the tensors as they were. Also the
//! operand generator that `mx_share_scales.rs` uses.

use super::e4m3_spec;
use deepinfer::numerics::{act_quant_block, share_mx_scales};
use deepinfer::{DType, Device, E4M3, E8M0, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// An operand: codes `[rows, k]` and one scale per `rps` rows and 32 of K.
#[derive(Clone)]
pub struct Op {
    pub codes: Vec<E4M3>,
    pub scales: Vec<E8M0>,
    pub rows: usize,
    pub k: usize,
    pub rps: usize,
}

impl Op {
    /// Element values code · 2^(scale − 127) in f64 (exact), as bit patterns.
    pub fn values(&self) -> Vec<u64> {
        let kb = self.k.div_ceil(32);
        (0..self.rows * self.k)
            .map(|i| {
                let (r, c) = (i / self.k, i % self.k);
                let s = self.scales[(r / self.rps) * kb + c / 32].0;
                let v = if s == 0xFF {
                    f64::NAN
                } else {
                    e4m3_spec(self.codes[i].0) * 2f64.powi(i32::from(s) - 127)
                };
                if v.is_nan() { u64::MAX } else { v.to_bits() }
            })
            .collect()
    }

    /// Runs of `group / 32` blocks whose scales are all equal and not NaN.
    pub fn uniform_runs(&self, group: usize) -> usize {
        let kb = self.k.div_ceil(32);
        let per = group / 32;
        self.scales
            .chunks(kb)
            .map(|row| {
                row.chunks(per)
                    .filter(|run| run[0].0 != 0xFF && run.iter().all(|s| s.0 == run[0].0))
                    .count()
            })
            .sum()
    }
}

/// A value drawn from one of three shapes: Gaussian, Student-t (3), or
/// Gaussian times a per-channel scale with rare outlier channels.
fn draw(rng: &mut StdRng, shape: usize, channel: f32) -> f32 {
    let g = |rng: &mut StdRng| {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        let v: f64 = rng.random();
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    };
    match shape {
        0 => g(rng),
        1 => {
            let chi2: f32 = (0..3).map(|_| g(rng).powi(2)).sum();
            g(rng) / (chi2 / 3.0).sqrt()
        }
        _ => g(rng) * channel,
    }
}

/// `[rows, k]` values of `draw`'s `shape`, with per-channel scales
/// (log-normal, 1 % of the channels 20× larger) for the outlier shape.
fn values(rng: &mut StdRng, rows: usize, k: usize, shape: usize) -> Vec<f32> {
    let channels: Vec<f32> = (0..k)
        .map(|_| {
            let s = draw(rng, 0, 1.0).exp();
            if rng.random_range(0.0..1.0) < 0.01 {
                20.0 * s
            } else {
                s
            }
        })
        .collect();
    (0..rows * k)
        .map(|i| draw(rng, shape, channels[i % k]))
        .collect()
}

/// Activations (1 × 32 blocks, `rps` = 1) or weights (32 × 32, `rps` = 32),
/// quantised by the library's quantiser; a few NaN codes and NaN scales.
pub fn operand(rng: &mut StdRng, rows: usize, k: usize, rps: usize, shape: usize) -> Op {
    let x = values(rng, rows, k, shape);
    let kb = k.div_ceil(32);
    let mut codes = vec![E4M3(0); rows * k];
    let mut scales = vec![E8M0(0); rows.div_ceil(rps) * kb];
    for sr in 0..rows.div_ceil(rps) {
        for b in 0..kb {
            let (r0, r1) = (sr * rps, ((sr + 1) * rps).min(rows));
            let (c0, c1) = (b * 32, ((b + 1) * 32).min(k));
            let block: Vec<bf16> = (r0..r1)
                .flat_map(|r| x[r * k + c0..r * k + c1].iter().map(|&v| bf16::from_f32(v)))
                .collect();
            let mut q = vec![E4M3(0); block.len()];
            scales[sr * kb + b] = act_quant_block(&block, &mut q);
            for (i, r) in (r0..r1).enumerate() {
                codes[r * k + c0..r * k + c1]
                    .copy_from_slice(&q[i * (c1 - c0)..(i + 1) * (c1 - c0)]);
            }
        }
    }
    for _ in 0..3 {
        let i = rng.random_range(0..codes.len());
        codes[i] = E4M3(if rng.random() { 0x7F } else { 0xFF });
    }
    let i = rng.random_range(0..scales.len());
    scales[i] = E8M0(0xFF);
    Op {
        codes,
        scales,
        rows,
        k,
        rps,
    }
}

/// `ops::mx_share_scales` on `dev` against `numerics::share_mx_scales` on
/// the host, bitwise, and its typed errors.
pub fn op_matches_numerics(dev: &Device, rng: &mut StdRng) {
    // Hand-made runs first: two blocks of one row at scales 2^0 and 2^1
    // (then 2^0 and 2^12: a shift past 9), with one code in the lower block
    // that is exact when halved (0.5), inexact (2^-9, the smallest step),
    // a negative zero, or (all codes zero) a block that any shift keeps.
    for (low, top, zero_block) in [
        (0x30u8, 128u8, false),
        (0x01, 128, false),
        (0x80, 128, false),
        (0x30, 139, false),
        (0x00, 139, true),
    ] {
        let mut codes = vec![E4M3(0x38); 64];
        codes[5] = E4M3(low);
        if zero_block {
            codes[..32].fill(E4M3(0x80));
        }
        let scales = vec![E8M0(127), E8M0(top)];
        let (mut want_c, mut want_s) = (codes.clone(), scales.clone());
        share_mx_scales(&mut want_c, &mut want_s, 1, 64, 1, 64).unwrap();
        let mut c = Tensor::from_vec(codes, &[1, 64])
            .unwrap()
            .to_device(dev)
            .unwrap();
        let mut s = Tensor::from_vec(scales, &[1, 2])
            .unwrap()
            .to_device(dev)
            .unwrap();
        ops::mx_share_scales(&mut c, &mut s, 1, 64).unwrap();
        let what = format!("{dev} low {low:#x} top {top} zero block {zero_block}");
        assert_eq!(c.to_vec::<E4M3>().unwrap(), want_c, "codes: {what}");
        assert_eq!(s.to_vec::<E8M0>().unwrap(), want_s, "scales: {what}");
    }
    let mut rewritten = 0usize;
    // Activations (rps 1) with K a multiple of 16 take the CUDA kernel's
    // stripes of 512 codes: whole stripes (4096), a last partial stripe and
    // run (1312: 41 blocks), a stripe shorter than one run (48); the others
    // its unit layout.
    for (rows, k, rps) in [
        (1, 32, 1),
        (37, 1000, 1),
        (64, 4096, 1),
        (29, 1312, 1),
        (3, 48, 1),
        (70, 1312, 32),
        (256, 2080, 32),
    ] {
        for shape in 0..3 {
            for group in [64, 128, 256] {
                let want = {
                    let mut op = operand(rng, rows, k, rps, shape);
                    let before = (op.codes.clone(), op.scales.clone());
                    share_mx_scales(&mut op.codes, &mut op.scales, rows, k, rps, group).unwrap();
                    (before, op)
                };
                let ((codes, scales), want) = want;
                rewritten += scales
                    .iter()
                    .zip(&want.scales)
                    .filter(|(a, b)| a != b)
                    .count();
                let sr = rows.div_ceil(rps);
                let mut c = Tensor::from_vec(codes, &[rows, k])
                    .unwrap()
                    .to_device(dev)
                    .unwrap();
                let mut s = Tensor::from_vec(scales, &[sr, k.div_ceil(32)])
                    .unwrap()
                    .to_device(dev)
                    .unwrap();
                ops::mx_share_scales(&mut c, &mut s, rps, group).unwrap();
                let what = format!("{dev} rows {rows} k {k} rps {rps} shape {shape} group {group}");
                assert_eq!(c.to_vec::<E4M3>().unwrap(), want.codes, "codes: {what}");
                assert_eq!(s.to_vec::<E8M0>().unwrap(), want.scales, "scales: {what}");
            }
        }
    }
    assert!(
        rewritten > 1000,
        "only {rewritten} scales rewritten: a no-op would pass"
    );
    // Typed errors, nothing written.
    let op = operand(rng, 40, 96, 1, 0);
    let mut c = Tensor::from_vec(op.codes.clone(), &[40, 96])
        .unwrap()
        .to_device(dev)
        .unwrap();
    let mut s = Tensor::from_vec(op.scales.clone(), &[40, 3])
        .unwrap()
        .to_device(dev)
        .unwrap();
    for group in [0, 48, 288] {
        let e = ops::mx_share_scales(&mut c, &mut s, 1, group).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    op: "mx_share_scales",
                    arg: "group",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = ops::mx_share_scales(&mut c, &mut s, 0, 64).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Argument {
                arg: "rows_per_scale",
                ..
            }
        ),
        "{e}"
    );
    let e = ops::mx_share_scales(&mut c, &mut s, 32, 64).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "scales",
                ..
            }
        ),
        "{e}"
    );
    let mut wrong = Tensor::zeros(dev, DType::F32, &[40, 3]).unwrap();
    let e = ops::mx_share_scales(&mut c, &mut wrong, 1, 64).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "scales",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        c.to_vec::<E4M3>().unwrap(),
        op.codes,
        "refused calls wrote codes"
    );
    assert_eq!(
        s.to_vec::<E8M0>().unwrap(),
        op.scales,
        "refused calls wrote scales"
    );
}

/// BF16 activations `[rows, k]` of one of `draw`'s shapes, with a NaN and
/// (when `inf`) an Inf at random places.
fn activations(rng: &mut StdRng, rows: usize, k: usize, shape: usize, inf: bool) -> Vec<bf16> {
    let mut x: Vec<bf16> = values(rng, rows, k, shape)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let i = rng.random_range(0..x.len());
    x[i] = bf16::NAN;
    if inf {
        let i = rng.random_range(0..x.len());
        x[i] = bf16::INFINITY;
    }
    x
}

/// code · 2^(scale − 127), NaN for a NaN code or scale.
fn value(code: E4M3, scale: E8M0) -> f64 {
    if scale.0 == 0xFF {
        return f64::NAN;
    }
    e4m3_spec(code.0) * 2f64.powi(i32::from(scale.0) - 127)
}

/// `ops::act_quant_fp8_shared` on `dev` against the CPU's `act_quant_fp8`
/// then `numerics::share_mx_scales` (one row per scale), bitwise, over
/// shapes the CUDA kernel fuses (K a multiple of the run) and ones it does
/// not (K 96 at runs of 128 and 256, K 100, a 3-D input); every value
/// code · scale equals the plain quantiser's; some runs are rewritten and
/// some are left (so neither a no-op nor a blind rewrite passes).
pub fn quant_shared_matches_the_composition(dev: &Device, rng: &mut StdRng) {
    let (mut rewritten, mut kept) = (0usize, 0usize);
    for (shape_of, k) in [
        (vec![1], 128),
        (vec![37], 1280),
        (vec![64], 4096),
        (vec![5], 96),
        (vec![3], 100),
        (vec![2, 3], 256),
    ] {
        let rows: usize = shape_of.iter().product();
        let mut full = shape_of.clone();
        full.push(k);
        for dist in 0..3 {
            let x = activations(rng, rows, k, dist, dist == 1);
            let (plain_q, plain_s) = deepinfer::cpu_backend::act_quant_fp8(&x, rows, k);
            let xd = Tensor::from_vec(x, &full).unwrap().to_device(dev).unwrap();
            for group in [64, 128, 256] {
                let (mut want_q, mut want_s) = (plain_q.clone(), plain_s.clone());
                share_mx_scales(&mut want_q, &mut want_s, rows, k, 1, group).unwrap();
                let (q, s) = ops::act_quant_fp8_shared(&xd, group).unwrap();
                let what = format!("{dev} {full:?} dist {dist} group {group}");
                assert_eq!(q.shape(), &full[..], "q shape: {what}");
                let mut s_shape = shape_of.clone();
                s_shape.push(k.div_ceil(32));
                assert_eq!(s.shape(), &s_shape[..], "scale shape: {what}");
                let (q, s) = (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
                assert_eq!(q, want_q, "codes: {what}");
                assert_eq!(s, want_s, "scales: {what}");
                let kb = k.div_ceil(32);
                for (i, (&c, &p)) in q.iter().zip(&plain_q).enumerate() {
                    let (r, b) = (i / k, (i % k) / 32);
                    let (got, old) = (value(c, s[r * kb + b]), value(p, plain_s[r * kb + b]));
                    assert!(
                        got.to_bits() == old.to_bits() || (got.is_nan() && old.is_nan()),
                        "value {i} changed ({old} -> {got}): {what}"
                    );
                }
                let changed = s.iter().zip(&plain_s).filter(|(a, b)| a != b).count();
                rewritten += changed;
                // Runs that differ in their scales after the rewrite.
                kept += s
                    .chunks(kb)
                    .flat_map(|row| row.chunks(group / 32))
                    .filter(|run| run.iter().any(|v| v != &run[0]))
                    .count();
            }
        }
    }
    assert!(rewritten > 1000, "only {rewritten} scales rewritten");
    assert!(kept > 10, "only {kept} runs left unshared");
    let x = Tensor::zeros(dev, DType::BF16, &[4, 128]).unwrap();
    for group in [0, 48, 288] {
        let e = ops::act_quant_fp8_shared(&x, group).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    op: "act_quant_fp8_shared",
                    arg: "group",
                    ..
                }
            ),
            "{e}"
        );
    }
    let f = Tensor::zeros(dev, DType::F32, &[4, 128]).unwrap();
    let e = ops::act_quant_fp8_shared(&f, 128).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "x", .. }), "{e}");
}

/// Every e4m3 code shifted by every d in 1..=154 (up to the top scale byte,
/// 254) through `ops::mx_share_scales` on `dev`: one row per (code, d), a
/// run of two blocks (the code alone in a block at 2^(100 − 127), a zero
/// block at 2^(100 + d − 127)), against a
/// brute-force search of all 256 codes for the same value in f64: the run
/// is rewritten exactly when some code holds v · 2^−d, and then with that
/// code (a zero keeps its sign). This pins the exactness rule the CUDA
/// kernels implement in integer arithmetic (`e4m3_shift_exact`).
pub fn every_code_and_shift(dev: &Device) {
    // K 64: the CUDA kernel's stripes; K 66 (a third, 2-wide block in a run
    // of its own): its unit layout.
    for k in [64, 66] {
        every_code_and_shift_at(dev, k);
    }
}

fn every_code_and_shift_at(dev: &Device, k: usize) {
    const D: usize = 154;
    let kb = k.div_ceil(32);
    let rows = 256 * D;
    let mut codes = vec![E4M3(0); rows * k];
    let mut scales: Vec<E8M0> = Vec::with_capacity(rows * kb);
    for v in 0..=255u8 {
        for d in 1..=D {
            codes[(usize::from(v) * D + d - 1) * k] = E4M3(v);
            scales.extend([E8M0(100), E8M0(100 + d as u8), E8M0(127)].iter().take(kb));
        }
    }
    let mut c = Tensor::from_vec(codes, &[rows, k])
        .unwrap()
        .to_device(dev)
        .unwrap();
    let mut s = Tensor::from_vec(scales, &[rows, kb])
        .unwrap()
        .to_device(dev)
        .unwrap();
    ops::mx_share_scales(&mut c, &mut s, 1, 64).unwrap();
    let (codes, scales) = (c.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
    let mut rewritten = 0;
    for v in 0..=255u8 {
        let x = e4m3_spec(v);
        for d in 1..=D {
            let r = usize::from(v) * D + d - 1;
            let (row, sc) = (&codes[r * k..(r + 1) * k], &scales[r * kb..r * kb + 2]);
            let want = if x.is_nan() {
                None
            } else if x == 0.0 {
                Some(v)
            } else {
                let y = x * 2f64.powi(-(d as i32));
                (0..=255u8).find(|&c| e4m3_spec(c) == y)
            };
            let what = format!("{dev} k {k} code {v:#04x} d {d}");
            let top = E8M0(100 + d as u8);
            match want {
                Some(c) => {
                    rewritten += 1;
                    assert_eq!(sc, [top, top], "{what}");
                    assert_eq!(row[0], E4M3(c), "{what}");
                }
                None => {
                    assert_eq!(sc, [E8M0(100), top], "{what}");
                    assert_eq!(row[0], E4M3(v), "{what}");
                }
            }
            assert!(row[1..].iter().all(|c| c.0 == 0), "{what}");
            assert!(
                scales[r * kb + 2..(r + 1) * kb].iter().all(|s| s.0 == 127),
                "{what}: {:?}",
                &scales[r * kb..(r + 1) * kb]
            );
        }
    }
    // Neither a rule that never shifts nor one that always does (39,424
    // cases, 2,178 exact: past d = 17 only the two zeros).
    assert!((1500..3000).contains(&rewritten), "{rewritten} rewritten");
}
