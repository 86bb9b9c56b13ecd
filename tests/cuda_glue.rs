//! The forward's glue ops on the GPU against the CPU reference, with fresh
//! random inputs (special values included), tail shapes, and outputs
//! NaN-poisoned by the device (every element must be written):
//! - bitwise (NaN matching NaN): `scale`, `div_scalar`, `add`, `cat_cols`
//!   (packed FP4 included, at even widths),
//!   `embedding`, `argmax` (ties, NaN, ±0, all-NaN rows), `hc_init`,
//!   `hc_collapse`, `hc_stream_mean`, `engram_rows`, `engram_lookup`,
//!   `moe_permute`, `moe_permute_fp8`, `moe_combine` (random and repeated
//!   permutations),
//!   `paged_rows` and `paged_window_rows` (random block tables with missing
//!   pages and out-of-range owners and rows; also against the independent
//!   pool model of `common::paged`);
//! - `engram_gate_update` within half a BF16 ulp of each side plus
//!   |value|·2^-18 per element, and `calc_diff` < 1e-6: its three sums are
//!   block reductions, the CPU's are sequential, so the gate differs by fp32
//!   rounding (up to ~12 fp32 ulps in a simulation of the kernel's order),
//!   which near a cancellation in `S + g · v` can move a tiny result by more
//!   than one of its BF16 ulps;
//! - `grouped_bf16_linear` (cuBLAS) `calc_diff` < 1e-5 and every element
//!   within 1 % of the row's largest magnitude plus one BF16 ulp: fp32
//!   accumulation in another order, one BF16 rounding each;
//! - out-of-range ids, rows and permutation entries are typed errors naming
//!   the value, on the GPU as on the CPU;
//! - `Tensor::write_from` overwrites device tensors in place and the step
//!   arena reuses them (the bodies of `common::static_inputs`, also run on the CPU);
//! - `ops::mx_share_scales` and `ops::act_quant_fp8_shared` give the CPU's
//!   bytes (`common::share_scales`).
//!
//! Built only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through
//! the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::cpu_backend::engram::primes_after;
use deepinfer::device::CudaDevice;
use deepinfer::dtype::{DType, Fp4x2};
use deepinfer::numerics::calc_diff;
use deepinfer::{Device, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

fn up(t: &Tensor, dev: &Device) -> Tensor {
    t.to_device(dev).unwrap()
}

/// Bitwise equal, except that any NaN matches any NaN (payloads differ
/// between the CPU and the GPU's canonical NaN).
fn assert_same(case: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{case}: dtype");
    assert!(
        matches!(got.device(), Device::Cuda(_)),
        "{case}: output not on the GPU"
    );
    match want.dtype() {
        DType::F32 => {
            let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                let same = a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                assert!(same, "{case}: [{i}] GPU {a:e} CPU {b:e}");
            }
        }
        DType::BF16 => {
            let (g, w) = (
                got.to_vec::<bf16>().unwrap(),
                want.to_vec::<bf16>().unwrap(),
            );
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                let same = a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                assert!(same, "{case}: [{i}] GPU {a} CPU {b}");
            }
        }
        _ => {
            let (g, w) = (got.to_le_bytes().unwrap(), want.to_le_bytes().unwrap());
            if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
                panic!("{case}: byte {i} GPU {} CPU {}", g[i], w[i]);
            }
        }
    }
}

/// Random f32 values with the specials mixed in.
fn special_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    const SPECIAL: [f32; 9] = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -3e-39,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    (0..n)
        .map(|_| {
            if rng.random_range(0..16) == 0 {
                SPECIAL[rng.random_range(0..SPECIAL.len())]
            } else {
                rng.random_range(-4.0f32..4.0) * 2f32.powi(rng.random_range(-20..20))
            }
        })
        .collect()
}

fn is_arg_error(e: &Error, arg: &str, value: &str) -> bool {
    matches!(e, Error::Argument { arg: a, value: v, .. } if *a == arg && v == value)
}

#[test]
fn scale_div_and_add_are_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_elementwise");
    for &n in &[1usize, 7, 4097, 65_537] {
        let a = special_f32(&mut rng, n);
        let b = special_f32(&mut rng, n);
        let ta = Tensor::from_vec(a.clone(), &[n]).unwrap();
        let tb = Tensor::from_vec(b, &[n]).unwrap();
        let t16 = Tensor::from_vec(a.iter().map(|&v| bf16::from_f32(v)).collect(), &[n]).unwrap();
        for &s in &[0.015625f32, -3.7, 1e-30, 0.0] {
            for x in [&ta, &t16] {
                let case = format!("n {n} s {s} {:?}", x.dtype());
                let gx = up(x, &dev);
                assert_same(
                    &format!("scale {case}"),
                    &ops::scale(&gx, s).unwrap(),
                    &ops::scale(x, s).unwrap(),
                );
                assert_same(
                    &format!("div {case}"),
                    &ops::div_scalar(&gx, s).unwrap(),
                    &ops::div_scalar(x, s).unwrap(),
                );
            }
        }
        let got = ops::add(&up(&ta, &dev), &up(&tb, &dev)).unwrap();
        assert_same(&format!("add n {n}"), &got, &ops::add(&ta, &tb).unwrap());
    }
    let i32s = Tensor::from_vec(vec![1i32; 4], &[4]).unwrap();
    assert!(matches!(
        ops::scale(&up(&i32s, &dev), 2.0),
        Err(Error::DType { .. })
    ));
}

#[test]
fn cat_cols_is_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_cat_cols");
    for &t in &[1usize, 3, 129] {
        let widths = [1usize, 3, 0, 64, 5];
        let bf: Vec<Tensor> = widths
            .iter()
            .map(|&w| Tensor::from_vec(common::random_bf16(&mut rng, t * w), &[t, w]).unwrap())
            .collect();
        let f: Vec<Tensor> = widths
            .iter()
            .map(|&w| Tensor::from_vec(special_f32(&mut rng, t * w), &[t, w]).unwrap())
            .collect();
        let u: Vec<Tensor> = widths
            .iter()
            .map(|&w| {
                Tensor::from_vec((0..t * w).map(|_| rng.random::<u8>()).collect(), &[t, w]).unwrap()
            })
            .collect();
        for parts in [&bf, &f, &u] {
            let cpu: Vec<&Tensor> = parts.iter().collect();
            let g: Vec<Tensor> = parts.iter().map(|p| up(p, &dev)).collect();
            let gr: Vec<&Tensor> = g.iter().collect();
            let case = format!("T {t} {:?}", parts[0].dtype());
            assert_same(
                &case,
                &ops::cat_cols(&gr).unwrap(),
                &ops::cat_cols(&cpu).unwrap(),
            );
        }
    }
    // Packed FP4 (two values a byte; its widths are even by construction)
    // joins on whole bytes, bitwise the CPU.
    for &t in &[1usize, 3, 129] {
        let widths = [2usize, 0, 64, 6];
        let parts: Vec<Tensor> = widths
            .iter()
            .map(|&w| {
                let bytes = (0..t * w / 2).map(|_| Fp4x2(rng.random::<u8>())).collect();
                Tensor::from_vec(bytes, &[t, w]).unwrap()
            })
            .collect();
        let cpu: Vec<&Tensor> = parts.iter().collect();
        let g: Vec<Tensor> = parts.iter().map(|p| up(p, &dev)).collect();
        let gr: Vec<&Tensor> = g.iter().collect();
        assert_same(
            &format!("T {t} fp4"),
            &ops::cat_cols(&gr).unwrap(),
            &ops::cat_cols(&cpu).unwrap(),
        );
    }
}

#[test]
fn embedding_gathers_bitwise_and_names_a_bad_id() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_embedding");
    let v = 1000;
    for &d in &[8usize, 4096, 7] {
        let table = Tensor::from_vec(common::random_bf16(&mut rng, v * d), &[v, d]).unwrap();
        let gt = up(&table, &dev);
        for &t in &[1usize, 3, 257] {
            let ids: Vec<i32> = (0..t).map(|_| rng.random_range(0..v as i32)).collect();
            let ids = Tensor::from_vec(ids, &[t]).unwrap();
            let got = ops::embedding(&gt, &up(&ids, &dev)).unwrap();
            assert_same(
                &format!("D {d} T {t}"),
                &got,
                &ops::embedding(&table, &ids).unwrap(),
            );
        }
        for bad in [-1i32, v as i32, i32::MAX] {
            let ids = Tensor::from_vec(vec![3, bad, 5, bad], &[4]).unwrap();
            let e = ops::embedding(&gt, &up(&ids, &dev)).unwrap_err();
            assert!(
                is_arg_error(&e, "ids", &bad.to_string()),
                "D {d} id {bad}: {e}"
            );
            let e = ops::embedding(&table, &ids).unwrap_err();
            assert!(
                is_arg_error(&e, "ids", &bad.to_string()),
                "CPU D {d} id {bad}: {e}"
            );
        }
    }
}

#[test]
fn argmax_follows_the_cpu_rule_on_ties_nan_and_zeros() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_argmax");
    for &v in &[1usize, 7, 512, 513, 129_280] {
        for &rows in &[1usize, 2, 33] {
            let mut x: Vec<f32> = (0..rows * v)
                // Few distinct values: many ties.
                .map(|_| f32::from(rng.random_range(-8i8..8)) * 0.5)
                .collect();
            for r in 0..rows {
                let row = &mut x[r * v..(r + 1) * v];
                match r % 5 {
                    1 => row.iter_mut().for_each(|e| *e = f32::NAN),
                    2 => {
                        for e in row.iter_mut().step_by(3) {
                            *e = f32::NAN;
                        }
                    }
                    3 => {
                        row.iter_mut()
                            .for_each(|e| *e = if rng.random() { 0.0 } else { -0.0 });
                    }
                    4 => {
                        row.iter_mut().for_each(|e| *e = f32::NEG_INFINITY);
                        let last = row.len() - 1;
                        row[last] = f32::NAN;
                    }
                    _ => {}
                }
            }
            let cpu = Tensor::from_vec(x, &[rows, v]).unwrap();
            let got = ops::argmax(&up(&cpu, &dev)).unwrap();
            assert_same(
                &format!("V {v} rows {rows}"),
                &got,
                &ops::argmax(&cpu).unwrap(),
            );
        }
    }
}

/// `first_non_finite` (the sampler's check of its logits on the device)
/// gives the CPU's lowest index of a NaN or ±Inf per row, −1 for finite
/// rows: one bad value at the first, last or a random place, several, none.
#[test]
fn first_non_finite_is_the_cpus() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_non_finite");
    for &v in &[1usize, 7, 513, 129_280] {
        for &rows in &[1usize, 3, 17] {
            let mut x: Vec<f32> = (0..rows * v).map(|_| rng.random_range(-4.0..4.0)).collect();
            for r in 0..rows {
                let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][r % 3];
                let row = &mut x[r * v..(r + 1) * v];
                match r % 4 {
                    1 => row[0] = bad,
                    2 => row[v - 1] = bad,
                    3 => {
                        for _ in 0..3 {
                            row[rng.random_range(0..v)] = bad;
                        }
                    }
                    _ => {}
                }
            }
            let cpu = Tensor::from_vec(x, &[rows, v]).unwrap();
            let want = ops::first_non_finite(&cpu).unwrap();
            assert!(want.to_vec::<i32>().unwrap().iter().any(|&i| i >= 0) || rows == 1);
            let got = ops::first_non_finite(&up(&cpu, &dev)).unwrap();
            assert_same(&format!("V {v} rows {rows}"), &got, &want);
        }
    }
}

#[test]
fn hc_streams_ops_are_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_hc");
    for &t in &[1usize, 3, 257] {
        for &d in &[7usize, 128, 4096] {
            let case = format!("T {t} D {d}");
            let x = Tensor::from_vec(common::random_activations(&mut rng, t * d, 1.0), &[t, d])
                .unwrap();
            let s = Tensor::from_vec(
                common::random_activations(&mut rng, t * 4 * d, 2.0),
                &[t, 4, d],
            )
            .unwrap();
            let pre: Vec<f32> = (0..t * 4).map(|_| rng.random_range(-2.0..2.0)).collect();
            let pre = Tensor::from_vec(pre, &[t, 4]).unwrap();
            let (gx, gs, gp) = (up(&x, &dev), up(&s, &dev), up(&pre, &dev));
            assert_same(
                &format!("init {case}"),
                &ops::hc_init(&gx).unwrap(),
                &ops::hc_init(&x).unwrap(),
            );
            assert_same(
                &format!("collapse {case}"),
                &ops::hc_collapse(&gs, &gp).unwrap(),
                &ops::hc_collapse(&s, &pre).unwrap(),
            );
            assert_same(
                &format!("mean {case}"),
                &ops::hc_stream_mean(&gs).unwrap(),
                &ops::hc_stream_mean(&s).unwrap(),
            );
        }
    }
}

fn ngram_ids(rng: &mut StdRng, t: usize) -> Tensor {
    // Compressed ids, the pad (-1) and huge values (wrapping products).
    let ids: Vec<i64> = (0..t * 4)
        .map(|_| match rng.random_range(0..8) {
            0 => -1,
            1 => rng.random::<i64>(),
            _ => rng.random_range(0..200_000),
        })
        .collect();
    Tensor::from_vec(ids, &[t, 4]).unwrap()
}

#[test]
fn engram_rows_and_lookup_are_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_engram");
    let mult: [i64; 4] = std::array::from_fn(|_| rng.random_range(1..1i64 << 40) | 1);
    for &heads in &[1usize, 8] {
        let primes = primes_after(rng.random_range(1000..5000), 3 * heads);
        let table_rows: u64 = primes.iter().sum();
        for &t in &[1usize, 3, 257] {
            let ids = ngram_ids(&mut rng, t);
            let want = ops::engram_rows(&ids, &mult, &primes).unwrap();
            let got = ops::engram_rows(&up(&ids, &dev), &mult, &primes).unwrap();
            assert_same(&format!("rows heads {heads} T {t}"), &got, &want);
            // 33- and 132-byte rows (single values), 264 (V4.1's: 8-byte words).
            for &hd in &[32usize, 128, 256] {
                let rb = hd + hd / 32;
                let bytes: Vec<u8> = (0..table_rows as usize * rb)
                    .map(|_| rng.random())
                    .collect();
                let table = Tensor::from_vec(bytes, &[table_rows as usize, rb]).unwrap();
                let gt = up(&table, &dev);
                let got = ops::engram_lookup(&gt, &up(&want, &dev), hd).unwrap();
                let case = format!("lookup heads {heads} T {t} hd {hd}");
                assert_same(&case, &got, &ops::engram_lookup(&table, &want, hd).unwrap());
                let mut rows = want.to_vec::<i64>().unwrap();
                let bad = if t % 2 == 0 { -1 } else { table_rows as i64 };
                let at = rows.len() / 2;
                rows[at] = bad;
                let rows = Tensor::from_vec(rows, want.shape()).unwrap();
                let e = ops::engram_lookup(&gt, &up(&rows, &dev), hd).unwrap_err();
                assert!(is_arg_error(&e, "rows", &bad.to_string()), "{case}: {e}");
            }
        }
    }
    let many = primes_after(10, 66);
    let ids = up(&ngram_ids(&mut rng, 2), &dev);
    assert!(matches!(
        ops::engram_rows(&ids, &mult, &many),
        Err(Error::Unsupported { .. })
    ));
}

/// A bound on |gate_GPU − gate_CPU| for one stream, from the forward error
/// of the two summation orders (the CPU's sequential sum has depth D − 1, the
/// GPU's `gpu_depth`; a sum of depth h is off by at most h·u·Σ|terms|) carried through
/// x = dot·rsqrt(ss/D+ε)·rsqrt(kk/D+ε)·D^−½, g_in = sign(x)·√max(|x|, 1e-6)
/// (|√a − √b| ≤ √|a − b|, and a sign flip needs |x| ≤ δx) and σ (slope ≤ ¼).
/// Everything in f64 from the BF16 inputs; u = 2^−24.
fn gate_error_bound(stream: &[f64], key: &[f64], qk: &[f64], eps: f64, gpu_depth: usize) -> f64 {
    let u = 2f64.powi(-24);
    let n = stream.len() as f64;
    let depth = n + gpu_depth as f64 + 4.0;
    let (mut dot, mut abs, mut ss, mut kk) = (0.0, 0.0, 0.0, 0.0);
    for ((s, k), w) in stream.iter().zip(key).zip(qk) {
        dot += s * w * k;
        abs += (s * w * k).abs();
        ss += s * s;
        kk += k * k;
    }
    let scale = (ss / n + eps).sqrt().recip() * (kk / n + eps).sqrt().recip() / n.sqrt();
    let x = dot * scale;
    let dx = depth * u * abs * scale + x.abs() * (depth * u + 12.0 * u);
    let dg_in = if x.abs() <= dx {
        2.0 * (x.abs() + dx).max(1e-6).sqrt()
    } else {
        let low = (x.abs() - dx).max(1e-6).sqrt();
        dx.sqrt().min(dx / (2.0 * low))
    };
    dg_in / 4.0 + 8.0 * u
}

#[test]
fn engram_gate_update_matches_the_cpu_up_to_the_gate_rounding() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_engram_gate");
    for &t in &[1usize, 3, 129] {
        // 8-wide vectors (32; 264: 33 vectors, most threads none; 4096:
        // two a thread) and the scalar kernel (100).
        for &d in &[32usize, 100, 264, 4096] {
            let c = 4;
            let s = Tensor::from_vec(
                common::random_activations(&mut rng, t * c * d, 1.0),
                &[t, c, d],
            )
            .unwrap();
            let kv = Tensor::from_vec(
                common::random_activations(&mut rng, t * (c + 1) * d, 1.0),
                &[t, c + 1, d],
            )
            .unwrap();
            let qw = Tensor::from_vec(common::random_activations(&mut rng, c * d, 1.0), &[c, d])
                .unwrap();
            let kw = Tensor::from_vec(common::random_activations(&mut rng, c * d, 1.0), &[c, d])
                .unwrap();
            let want = ops::engram_gate_update(&s, &kv, &qw, &kw, 1e-6).unwrap();
            let got = ops::engram_gate_update(
                &up(&s, &dev),
                &up(&kv, &dev),
                &up(&qw, &dev),
                &up(&kw, &dev),
                1e-6,
            )
            .unwrap();
            let (g, w) = (
                got.to_vec::<bf16>().unwrap(),
                want.to_vec::<bf16>().unwrap(),
            );
            let (sv, kvv) = (s.to_vec::<bf16>().unwrap(), kv.to_vec::<bf16>().unwrap());
            let (qv, kwv) = (qw.to_vec::<bf16>().unwrap(), kw.to_vec::<bf16>().unwrap());
            let case = format!("T {t} D {d}");
            // A CTA of 256 per (token, stream): a thread adds its elements
            // in order (8-wide vectors when D % 8 == 0: whole vectors i,
            // i + 256, ...), then 5 butterfly levels, then the 8 warps' sums
            // in order.
            let lane_terms = if d % 8 == 0 {
                d.div_ceil(8).div_ceil(256) * 8
            } else {
                d.div_ceil(256)
            };
            let gpu_depth = lane_terms + 5 + 7;
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                let (tok, ci, x) = (i / (c * d), (i / d) % c, i % d);
                let row = |v: &[bf16], at: usize| -> Vec<f64> {
                    v[at * d..(at + 1) * d]
                        .iter()
                        .map(|e| f64::from(e.to_f32()))
                        .collect()
                };
                let key = row(&kvv, tok * (c + 1) + ci);
                let value = f64::from(kvv[(tok * (c + 1) + c) * d + x].to_f32());
                let stream = row(&sv, tok * c + ci);
                let qk: Vec<f64> = row(&qv, ci)
                    .iter()
                    .zip(row(&kwv, ci))
                    .map(|(q, k)| q * k)
                    .collect();
                let dg = gate_error_bound(&stream, &key, &qk, 1e-6, gpu_depth);
                let s_val = f64::from(sv[i].to_f32()).abs();
                let tol = common::bf16_half_ulp(*a)
                    + common::bf16_half_ulp(*b)
                    + value.abs() * dg
                    + (s_val + value.abs()) * 2f64.powi(-23);
                let err = (f64::from(a.to_f32()) - f64::from(b.to_f32())).abs();
                assert!(
                    err <= tol,
                    "{case}: [{i}] GPU {a} CPU {b} tolerance {tol:e}"
                );
            }
            let diff = calc_diff(&common::to_f64(&g), &common::to_f64(&w));
            assert!(diff < 1e-6, "{case}: calc_diff {diff}");
        }
    }
}

#[test]
fn moe_permute_and_combine_are_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_moe");
    for &t in &[1usize, 5, 300] {
        for &k in &[1usize, 6] {
            for &d in &[7usize, 8, 4096] {
                let n = t * k;
                let case = format!("T {t} k {k} D {d}");
                let x = Tensor::from_vec(common::random_activations(&mut rng, t * d, 1.0), &[t, d])
                    .unwrap();
                let w: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
                let w = Tensor::from_vec(w, &[t, k]).unwrap();
                let mut perm: Vec<i32> = (0..n as i32).collect();
                perm.shuffle(&mut rng);
                // A repeated entry: both devices keep the last writer.
                let mut repeated = perm.clone();
                if n > 1 {
                    repeated[0] = repeated[n - 1];
                }
                for (which, p) in [("perm", &perm), ("repeated", &repeated)] {
                    let p = Tensor::from_vec(p.clone(), &[n]).unwrap();
                    let gp = up(&p, &dev);
                    let (xw, ww) = ops::moe_permute(&x, &w, &p).unwrap();
                    let (xg, wg) = ops::moe_permute(&up(&x, &dev), &up(&w, &dev), &gp).unwrap();
                    assert_same(&format!("permute rows {which} {case}"), &xg, &xw);
                    assert_same(&format!("permute weights {which} {case}"), &wg, &ww);
                    // The FP8 form: the quantisation's rows and scale rows
                    // (D = 7 and 8: byte copies; 4096: 16-byte copies).
                    let (q, s) = ops::act_quant_fp8(&x).unwrap();
                    let (qw, sw, ww8) = ops::moe_permute_fp8(&q, &s, &w, &p).unwrap();
                    let (qg, sg, wg8) =
                        ops::moe_permute_fp8(&up(&q, &dev), &up(&s, &dev), &up(&w, &dev), &gp)
                            .unwrap();
                    assert_same(&format!("permute fp8 rows {which} {case}"), &qg, &qw);
                    assert_same(&format!("permute fp8 scales {which} {case}"), &sg, &sw);
                    assert_same(&format!("permute fp8 weights {which} {case}"), &wg8, &ww8);
                    let routed =
                        Tensor::from_vec(common::random_activations(&mut rng, n * d, 1.0), &[n, d])
                            .unwrap();
                    let shared =
                        Tensor::from_vec(common::random_activations(&mut rng, t * d, 1.0), &[t, d])
                            .unwrap();
                    let want = ops::moe_combine(&routed, &p, &shared).unwrap();
                    let got =
                        ops::moe_combine(&up(&routed, &dev), &gp, &up(&shared, &dev)).unwrap();
                    assert_same(&format!("combine {which} {case}"), &got, &want);
                }
                let mut bad = perm.clone();
                bad[n / 2] = n as i32;
                let gb = up(&Tensor::from_vec(bad, &[n]).unwrap(), &dev);
                let e = ops::moe_permute(&up(&x, &dev), &up(&w, &dev), &gb).unwrap_err();
                assert!(
                    is_arg_error(&e, "permutation", &n.to_string()),
                    "{case}: {e}"
                );
                let (q, s) = ops::act_quant_fp8(&x).unwrap();
                let e = ops::moe_permute_fp8(&up(&q, &dev), &up(&s, &dev), &up(&w, &dev), &gb)
                    .unwrap_err();
                assert!(
                    is_arg_error(&e, "permutation", &n.to_string()),
                    "{case} fp8: {e}"
                );
                let routed = up(
                    &Tensor::zeros(&Device::Cpu, DType::BF16, &[n, d]).unwrap(),
                    &dev,
                );
                let e = ops::moe_combine(&routed, &gb, &up(&x, &dev)).unwrap_err();
                assert!(
                    is_arg_error(&e, "permutation", &n.to_string()),
                    "{case}: {e}"
                );
            }
        }
    }
}

/// `Tensor::zeros`, `Tensor::full_f32` and `full_i64` on CUDA are device memsets (no
/// host buffer): every byte is zero, every element the value, also on a
/// handle that poisons its other allocations and at sizes that are no
/// multiple of a word.
#[test]
fn cuda_zeros_are_zero_without_a_host_copy() {
    let dev = gpu();
    for (shape, value) in [
        (vec![0usize], 1.0f32),
        (vec![3, 7], -0.0),
        (vec![1 << 20], 1.5),
    ] {
        let t = Tensor::full_f32(&dev, &shape, value).unwrap();
        let want = Tensor::full_f32(&Device::Cpu, &shape, value).unwrap();
        assert_eq!(t.shape(), want.shape());
        assert!(
            t.to_le_bytes().unwrap() == want.to_le_bytes().unwrap(),
            "{shape:?} {value}"
        );
        assert!(
            want.to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|x| x.to_bits() == value.to_bits())
        );
    }
    for (dtype, shape) in [
        (DType::U8, vec![0usize]),
        (DType::U8, vec![7]),
        (DType::BF16, vec![3, 1001]),
        (DType::I32, vec![257]),
        (DType::F32, vec![1 << 20]),
    ] {
        let z = Tensor::zeros(&dev, dtype, &shape).unwrap();
        assert_eq!(z.shape(), &shape[..]);
        let host = z.to_le_bytes().unwrap();
        assert_eq!(host.len(), z.storage_bytes());
        assert!(host.iter().all(|&b| b == 0), "{dtype:?} {shape:?}");
    }
    for (n, value) in [
        (0usize, i64::MAX),
        (1, i64::MAX),
        (1001, -0x1234_5678_9abc_def0),
    ] {
        let t = Tensor::full_i64(&dev, &[n], value).unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![value; n], "{n} {value}");
    }
    // No host copy: zeros can be made (and freed) inside a graph capture,
    // where the host upload they replaced is refused.
    let cuda = CudaDevice::new(0).unwrap();
    let d = Device::Cuda(cuda.clone());
    // SAFETY: this handle has one stream, and each capture touches only the
    // tensor it makes and drops.
    let made = unsafe { cuda.capture(|| Tensor::zeros(&d, DType::F32, &[1000]).map(|_| ())) };
    assert!(made.is_ok(), "zeros inside a capture: {:?}", made.err());
    // SAFETY: as above.
    let made = unsafe { cuda.capture(|| Tensor::full_f32(&d, &[1000], 1.0).map(|_| ())) };
    assert!(made.is_ok(), "full_f32 inside a capture: {:?}", made.err());
    // SAFETY: as above.
    let made = unsafe { cuda.capture(|| Tensor::full_i64(&d, &[64], i64::MAX).map(|_| ())) };
    assert!(made.is_ok(), "full_i64 inside a capture: {:?}", made.err());
    // SAFETY: as above.
    let uploaded = unsafe {
        cuda.capture(|| {
            Tensor::filled_bytes(DType::F32, &[1000], 0)?
                .to_device(&d)
                .map(|_| ())
        })
    };
    assert!(
        uploaded.is_err(),
        "a host upload inside a capture must be refused"
    );
}

/// Tensors of two handles of one GPU (two streams, not ordered against each
/// other: cudarc's event tracking is off) never meet in an op or a row
/// copy: a typed mismatch naming the other handle. Clones share the stream.
/// Freed memory stays in the pool for reuse, and `memory_info` counts it
/// as free again.
#[test]
fn handles_of_one_gpu_keep_to_their_streams_and_the_pool_is_trimmed() {
    let a = CudaDevice::new(0).unwrap();
    let b = CudaDevice::new(0).unwrap();
    assert!(a.same_stream(&a.with_poisoned_allocations()));
    assert!(a.same_stream(&a.with_batch_invariant_kernels()));
    assert!(!a.same_stream(&b));
    assert!(!a.same_stream(&a.with_new_stream().unwrap()));
    let (da, db) = (Device::Cuda(a.clone()), Device::Cuda(b));
    let x = Tensor::from_vec(vec![1.5f32; 64], &[8, 8]).unwrap();
    let (xa, xb) = (up(&x, &da), up(&x, &db));
    let e = ops::add(&xa, &xb).unwrap_err();
    assert!(
        matches!(&e, Error::DeviceMismatch { got, .. } if got.contains("another handle")),
        "{e:?}"
    );
    let mut ya = up(&x, &da);
    let e = ya.copy_rows_from(0, &xb, 0, 1).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    // Moved with to_device, the tensor meets the other handle's.
    let moved = xb.to_device(&da).unwrap();
    let sum = ops::add(&xa, &moved).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![3.0f32; 64]);

    // 8 GiB allocated and dropped: the pool keeps them reserved (freed
    // memory is retained for the next step), and memory_info counts them as
    // free again. Skipped under the sanitizers (DEEPINFER_QUICK), whose
    // shadow memory changes the device's accounting.
    if common::quick() {
        return;
    }
    let (free0, total) = a.memory_info().unwrap();
    let (big, slack) = (8usize << 30, 1usize << 30);
    assert!(
        free0 > 2 * big,
        "the test needs 16 GiB free, {free0} of {total}"
    );
    let t = Tensor::empty(&da, DType::U8, &[big]).unwrap();
    let (held, _) = a.memory_info().unwrap();
    assert!(
        held + big <= free0 + slack,
        "{held} free while 8 GiB are held of {free0}"
    );
    drop(t);
    a.synchronize().unwrap();
    let (reserved, used) = a
        .memory_pool_bytes()
        .unwrap()
        .expect("the H200 has memory pools");
    assert!(
        reserved >= used + big,
        "the pool released the freed 8 GiB: {reserved} reserved, {used} used"
    );
    let (free1, _) = a.memory_info().unwrap();
    assert!(
        free1 + slack >= free0,
        "{free1} free after the drop, {free0} before"
    );
}

/// The deferred forms: no sync per op, the same bits as the checked ops,
/// and every recorded failure surfaces in the verdict (naming the op), also
/// when the slots run out and the checks read themselves early.
#[test]
fn deferred_moe_checks_report_at_the_verdict() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_deferred");
    let (t, k, d) = (5usize, 6usize, 64usize);
    let n = t * k;
    let x = up(
        &Tensor::from_vec(common::random_activations(&mut rng, t * d, 1.0), &[t, d]).unwrap(),
        &dev,
    );
    let w: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
    let w = up(&Tensor::from_vec(w, &[t, k]).unwrap(), &dev);
    let routed = up(
        &Tensor::from_vec(common::random_activations(&mut rng, n * d, 1.0), &[n, d]).unwrap(),
        &dev,
    );
    let mut perm: Vec<i32> = (0..n as i32).collect();
    perm.shuffle(&mut rng);
    let good = up(&Tensor::from_vec(perm.clone(), &[n]).unwrap(), &dev);
    let mut b = perm.clone();
    b[7] = -3;
    let bad = up(&Tensor::from_vec(b, &[n]).unwrap(), &dev);

    // Good: bitwise the checked ops, two pending checks, a clean verdict.
    let mut checks = ops::DeviceChecks::new();
    let (xg, wg) = ops::moe_permute_deferred(&x, &w, &good, &mut checks).unwrap();
    let got = ops::moe_combine_deferred(&routed, &good, &x, &mut checks).unwrap();
    assert_eq!(checks.pending(), 2);
    checks.verdict().unwrap();
    assert_eq!(checks.pending(), 0);
    let (xw, ww) = ops::moe_permute(&x, &w, &good).unwrap();
    assert_same("deferred permute rows", &xg, &xw);
    assert_same("deferred permute weights", &wg, &ww);
    assert_same(
        "deferred combine",
        &got,
        &ops::moe_combine(&routed, &good, &x).unwrap(),
    );

    // A bad permutation: the op returns, the verdict names op, input, entry.
    for (op, first_bad) in [("moe_permute", true), ("moe_combine", false)] {
        let mut checks = ops::DeviceChecks::new();
        let p = if first_bad { &bad } else { &good };
        ops::moe_permute_deferred(&x, &w, p, &mut checks).unwrap();
        let c = if first_bad { &good } else { &bad };
        ops::moe_combine_deferred(&routed, c, &x, &mut checks).unwrap();
        let f = checks.failure().unwrap();
        assert_eq!(
            f,
            Some(ops::Failure {
                op,
                input: "permutation",
                at: 7
            }),
            "{op}"
        );
        assert_eq!(checks.failure().unwrap(), None, "{op}: read once");
    }

    // Full slots: the 257th launch reads the first 256 and reports the bad one.
    let mut checks = ops::DeviceChecks::new();
    ops::moe_permute_deferred(&x, &w, &bad, &mut checks).unwrap();
    for i in 1..256 {
        ops::moe_permute_deferred(&x, &w, &good, &mut checks)
            .unwrap_or_else(|e| panic!("launch {i}: {e}"));
    }
    let e = ops::moe_permute_deferred(&x, &w, &good, &mut checks).unwrap_err();
    assert!(is_arg_error(&e, "permutation", "entry 7"), "{e}");
    assert!(
        matches!(
            e,
            Error::Argument {
                op: "moe_permute",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(checks.pending(), 0, "the early read empties the checks");

    // The step's other checks: token ids and Engram rows, in one verdict.
    let table =
        Tensor::from_vec(common::random_activations(&mut rng, 7 * 16, 1.0), &[7, 16]).unwrap();
    let ids = Tensor::from_vec(vec![6i32, 0, 3], &[3]).unwrap();
    let fp8 = Tensor::from_vec(
        (0..10 * 33)
            .map(|i| (i * 37 % 251) as u8)
            .collect::<Vec<u8>>(),
        &[10, 33],
    )
    .unwrap();
    let rows = Tensor::from_vec(vec![0i64, 9, 3, 1, 10, 2], &[2, 3]).unwrap();
    let mut checks = ops::DeviceChecks::new();
    let got = ops::embedding_deferred(&up(&table, &dev), &up(&ids, &dev), &mut checks).unwrap();
    assert_same(
        "deferred embedding",
        &got,
        &ops::embedding(&table, &ids).unwrap(),
    );
    ops::engram_lookup_deferred(&up(&fp8, &dev), &up(&rows, &dev), 32, &mut checks).unwrap();
    assert_eq!(
        checks.failure().unwrap(),
        Some(ops::Failure {
            op: "engram_lookup",
            input: "rows",
            at: 4
        })
    );
    // The checked form names the row itself.
    let e = ops::engram_lookup(&up(&fp8, &dev), &up(&rows, &dev), 32).unwrap_err();
    assert!(is_arg_error(&e, "rows", "10"), "{e}");
}

#[test]
fn grouped_bf16_linear_matches_the_cpu_within_fp32_reordering() {
    let dev = gpu();
    let mut rng = common::rng("cuda_glue_grouped");
    for &(g, n, k) in &[(8usize, 64usize, 512usize), (16, 1024, 64), (3, 5, 7)] {
        for &t in &[1usize, 3, 129] {
            let case = format!("G {g} N {n} K {k} T {t}");
            let x = Tensor::from_vec(
                common::random_activations(&mut rng, t * g * k, 1.0),
                &[t, g * k],
            )
            .unwrap();
            let w = Tensor::from_vec(
                common::random_activations(&mut rng, g * n * k, 0.05),
                &[g * n, k],
            )
            .unwrap();
            let want = ops::grouped_bf16_linear(&x, &w, g).unwrap();
            let got = ops::grouped_bf16_linear(&up(&x, &dev), &up(&w, &dev), g).unwrap();
            assert!(matches!(got.device(), Device::Cuda(_)), "{case}");
            let (gv, wv) = (
                got.to_vec::<bf16>().unwrap(),
                want.to_vec::<bf16>().unwrap(),
            );
            let diff = calc_diff(&common::to_f64(&gv), &common::to_f64(&wv));
            assert!(diff < 1e-5, "{case}: calc_diff {diff}");
            for (r, (gr, wr)) in gv.chunks(g * n).zip(wv.chunks(g * n)).enumerate() {
                let amax = wr.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
                for (i, (a, b)) in gr.iter().zip(wr).enumerate() {
                    let tol = 0.01 * amax + common::bf16_half_ulp(*b) as f32 * 2.0;
                    assert!(
                        (a.to_f32() - b.to_f32()).abs() <= tol,
                        "{case}: [{r}, {i}] GPU {a} CPU {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn paged_rows_are_bitwise_the_cpu_and_the_pool_model() {
    let dev = gpu();
    let mut rng = common::rng("paged_rows_are_bitwise_the_cpu_and_the_pool_model");
    let cases = if common::quick() { 12 } else { 120 };
    let problems = (0..cases).map(|case| {
        let tokens = [1usize, 5, 33, 700][case % 4];
        let width = [1usize, 7, 64, 640][(case / 4) % 4];
        let p = common::paged::problem(&mut rng, tokens, 1 + case % 9, width);
        (p, format!("case {case}"))
    });
    let edges = common::paged::edges()
        .into_iter()
        .map(|(p, what)| (p, what.to_string()));
    for (p, what) in problems.collect::<Vec<_>>().into_iter().chain(edges) {
        let (rows, window) = common::paged::run_on(&p, &dev);
        assert_eq!(rows, p.expect_rows, "{what}: paged_rows");
        assert_eq!(window, p.expect_window, "{what}: paged_window_rows");
    }
}

/// A decode step's static inputs refilled in place on the GPU (the CPU
/// runs the same bodies in `paged_rows_cpu.rs`).
#[test]
fn static_inputs_are_refilled_in_place() {
    let dev = gpu();
    let mut rng = common::rng("static_inputs_cuda");
    common::static_inputs::write_from_overwrites_in_place(&dev, &mut rng);
    common::static_inputs::step_inputs_reuse_their_slots(&dev, &mut rng);
    common::static_inputs::byte_uploads_fill_in_place(&dev, &mut rng);
    common::static_inputs::write_rows_from_overwrites_only_its_rows(&dev, &mut rng);
}

/// Exact scale sharing on the GPU gives the bytes of the CPU reference (the
/// CPU runs the same body in `mx_share_scales.rs`).
#[test]
fn mx_share_scales_is_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("mx_share_scales_cuda");
    common::share_scales::op_matches_numerics(&dev, &mut rng);
    common::share_scales::every_code_and_shift(&dev);
}

/// The quantiser with sharing fused (`act_quant_fp8_vec8_shared`) and its
/// two-launch fallback give the bytes of the CPU's quantiser then
/// `numerics::share_mx_scales` (the CPU runs the same body in
/// `mx_share_scales.rs`).
#[test]
fn mx_share_scales_fused_quantiser_is_bitwise_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("act_quant_fp8_shared_cuda");
    common::share_scales::quant_shared_matches_the_composition(&dev, &mut rng);
}

/// A chain of dependent kernels launched as programmatic dependents reads
/// each producer's finished output: 40 rounds of x ← (x · 1.5 + x) / 2.5
/// over 2^24 F32 values (each kernel long enough that a dependent scheduled
/// early would overtake an unfinished producer without its entry wait),
/// on a PDL handle and a plain one, against the same chain on the CPU,
/// bit for bit.
#[test]
fn pdl_chains_read_their_producers_finished_output() {
    let Device::Cuda(cuda) = gpu() else {
        unreachable!()
    };
    let on = Device::Cuda(cuda.with_pdl(true));
    let off = Device::Cuda(cuda.with_pdl(false));
    assert!(on.pdl(), "PDL on an sm_90 device");
    let mut rng = common::rng("cuda_pdl_chain");
    let n = 1usize << 24;
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    let chain = |dev: &Device| -> Vec<u32> {
        let mut t = Tensor::from_vec(x.clone(), &[n])
            .unwrap()
            .to_device(dev)
            .unwrap();
        for _ in 0..40 {
            let y = ops::scale(&t, 1.5).unwrap();
            let z = ops::add(&y, &t).unwrap();
            t = ops::div_scalar(&z, 2.5).unwrap();
        }
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let want = chain(&Device::Cpu);
    assert_eq!(chain(&on), want, "PDL chain");
    assert_eq!(chain(&off), want, "plain chain");
}

/// Buffers carved from a capture arena (`CudaDevice::with_arena`) never
/// share bytes: 40 uploads of odd sizes and a kernel output from each,
/// made inside a 1 MiB arena, read back whole (an overlap would show as
/// another tensor's values), the ones past the arena's end served by the
/// pool; a dropped buffer's bytes serve the next allocation that fits. A
/// graph captured inside an arena holds no allocation or free node, so its
/// two dependent kernels are joined by a programmatic edge on a PDL handle
/// (the same capture from the pool holds allocation nodes), and it replays
/// the chain bit for bit.
#[test]
fn capture_arena_buffers_are_disjoint_and_graphs_replay_them() {
    let Device::Cuda(cuda) = gpu() else {
        unreachable!()
    };
    let dev = Device::Cuda(cuda.clone());
    let arena = cuda.capture_arena(1 << 20).unwrap();
    assert_eq!(arena.bytes(), 1 << 20);
    let sizes: Vec<usize> = (0..40).map(|i| 37 + i * 613).collect();
    let (((made, used, reused), report), spilled) = cuda.track_peak(|| {
        cuda.with_arena(&arena, || {
            // A buffer made and dropped first: its bytes serve again.
            let first = ops::scale(
                &up(&Tensor::from_vec(vec![1f32; 64], &[64]).unwrap(), &dev),
                1.0,
            )
            .unwrap();
            let after_first = cuda.arena_used();
            drop(first);
            let again = ops::scale(
                &up(&Tensor::from_vec(vec![2f32; 64], &[64]).unwrap(), &dev),
                1.0,
            )
            .unwrap();
            let reused = cuda.arena_used() == after_first;
            drop(again);
            let made: Vec<(Tensor, Tensor)> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let v: Vec<f32> = (0..n).map(|j| (i * 100_000 + j) as f32).collect();
                    let x = up(&Tensor::from_vec(v, &[n]).unwrap(), &dev);
                    let y = ops::scale(&x, 2.0).unwrap();
                    (x, y)
                })
                .collect();
            (made, cuda.arena_used(), reused)
        })
        .unwrap()
    });
    assert!(
        !report.clean,
        "the carved tensors outlive with_arena: not clean"
    );
    // The report counts what the pool served: every spilled buffer is
    // still alive, so the pool's peak above its low is their bytes.
    assert!(report.spills > 0, "{report:?}");
    assert_eq!(report.spilled_bytes as u64, spilled, "{report:?}");
    // A block serves once, and only its own stream.
    let again = cuda.with_arena(&arena, || ());
    assert!(again.is_err(), "a second use of a block is refused");
    let other = cuda.with_new_stream().unwrap();
    let fresh = cuda.capture_arena(1 << 12).unwrap();
    assert!(
        other.with_arena(&fresh, || ()).is_err(),
        "another stream's block is refused"
    );
    assert_eq!(
        cuda.arena_used(),
        None,
        "the arena is gone after with_arena"
    );
    assert!(reused, "a dropped buffer's bytes were not reused");
    let used = used.expect("an arena was active");
    assert!(
        used > (1 << 20) - 2 * 256 * 100 && used <= 1 << 20,
        "carved {used} bytes of 1 MiB"
    );
    let total: u64 = sizes
        .iter()
        .map(|&n| 2 * (n * 4).div_ceil(256) as u64 * 256)
        .sum();
    assert!(
        spilled > 0 && spilled + (1 << 20) >= total,
        "{spilled} bytes from the pool, {total} made"
    );
    for (i, ((x, y), &n)) in made.iter().zip(&sizes).enumerate() {
        let want: Vec<f32> = (0..n).map(|j| (i * 100_000 + j) as f32).collect();
        assert_eq!(x.to_vec::<f32>().unwrap(), want, "upload {i}");
        let twice: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
        assert_eq!(y.to_vec::<f32>().unwrap(), twice, "output {i}");
    }
    drop(made);

    // Without poisoning, whose memset of each output would sit between the
    // two kernels.
    let cuda = CudaDevice::new(0).unwrap();
    assert!(cuda.pdl());
    let dev = Device::Cuda(cuda.clone());
    let mut rng = common::rng("cuda_capture_arena");
    let n = 1 << 16;
    let xs: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    let x = Tensor::from_vec(xs.clone(), &[n])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let want: Vec<u32> = xs.iter().map(|v| ((v * 1.5) + v).to_bits()).collect();
    for carved in [true, false] {
        let mut out = Tensor::empty(&dev, deepinfer::DType::F32, &[n]).unwrap();
        let arena = cuda.capture_arena(1 << 20).unwrap();
        let mut body = || {
            // SAFETY: this thread alone uses the stream while it is
            // captured; `x` and `out` outlive the graph's launches.
            unsafe {
                cuda.capture(|| {
                    let y = ops::scale(&x, 1.5)?;
                    let z = ops::add(&y, &x)?;
                    out.copy_rows_from(0, &z, 0, n)
                })
            }
        };
        let graph = if carved {
            let (graph, report) = cuda.with_arena(&arena, &mut body).unwrap();
            assert!(
                report.clean,
                "every carved buffer was dropped inside the capture"
            );
            assert_eq!(report.spills, 0, "{report:?}");
            graph
        } else {
            body()
        }
        .unwrap();
        let nodes = graph.nodes().unwrap();
        println!("carved {carved}: {nodes:?}");
        assert_eq!(nodes.kernels, 2, "{nodes:?}");
        if carved {
            assert_eq!((nodes.allocs, nodes.frees), (0, 0), "{nodes:?}");
            assert_eq!(nodes.kernel_edges, 1, "{nodes:?}");
            assert_eq!(nodes.programmatic_edges, 1, "{nodes:?}");
        } else {
            assert!(nodes.allocs > 0, "{nodes:?}");
        }
        for _ in 0..3 {
            graph.launch().unwrap();
        }
        let got: Vec<u32> = out
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, want, "carved {carved}");
    }
}
