//! The TileLang mHC kernels on the GPU against the CPU reference, T {1, 3,
//! 64, 100, 257} × D {5120, 128, 512, 200} (token tiles of 64 with one or
//! two tokens a lane, chunks of 128 positions with a part-filled tail),
//! fresh random inputs, NaN-poisoned outputs (every element must be
//! written):
//! - `mhc_pre`: u (the collapse with the lagged pre) bitwise; the 24 mixes
//!   `calc_diff` < 1e-5 and every mix within 1e-3 (relative, absolute below 1) (the GPU's GEMV
//!   sums in another order than the CPU's sequential loop); pre/post/comb
//!   bitwise equal to the CPU `hc_split` applied to the GPU's own mixes.
//! - `mhc_expand`: `S'_k = BF16(post_k · F + Σ_j comb[j][k] · S_j)` bitwise,
//!   with a Sinkhorn-normalised comb and raw random ones of both signs.
//! - `mhc_pre` is batch invariant: a token's outputs are bitwise the same
//!   alone, at any place in a batch of 257 and whatever its neighbours.
//! - `mhc_expand_pre` (the fused single-pass step): every output bitwise
//!   the GPU's `mhc_expand` then `mhc_pre`; new streams and u bitwise the
//!   CPU, mixes `calc_diff` < 1e-5.
//! - D % 8 != 0 is a typed error on the GPU.
//!
//! Built only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through
//! the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::cpu_backend::mhc;
use deepinfer::device::CudaDevice;
use deepinfer::numerics::calc_diff;
use deepinfer::{Device, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

const TOKENS: &[usize] = &[1, 3, 64, 100, 257];
const DIMS: &[usize] = &[5120, 128, 512, 200];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Fresh random inputs of `mhc_pre` for `t` tokens of width `d`: streams,
/// hc_fn, hc_base, hc_scale and the lagged pre.
struct PreInputs {
    s: Vec<bf16>,
    hc_fn: Vec<f32>,
    base: Vec<f32>,
    scale: Vec<f32>,
    lag: Vec<f32>,
}

fn random_pre_inputs(rng: &mut StdRng, t: usize, d: usize) -> PreInputs {
    PreInputs {
        s: common::random_activations(rng, t * 4 * d, 1.0),
        hc_fn: (0..24 * 4 * d)
            .map(|_| rng.random_range(-0.05..0.05))
            .collect(),
        base: (0..24).map(|_| rng.random_range(-1.0..1.0)).collect(),
        scale: (0..3).map(|_| rng.random_range(0.1..2.0)).collect(),
        lag: (0..t * 4).map(|_| rng.random_range(0.0..2.0)).collect(),
    }
}

#[test]
fn mhc_pre_matches_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("mhc_pre_cuda");
    let p = ops::MhcParams::default();
    for &t in TOKENS {
        for &d in DIMS {
            let PreInputs {
                s,
                hc_fn,
                base,
                scale,
                lag,
            } = random_pre_inputs(&mut rng, t, d);
            let cpu = [
                Tensor::from_vec(s, &[t, 4, d]).unwrap(),
                Tensor::from_vec(hc_fn, &[24, 4 * d]).unwrap(),
                Tensor::from_vec(base.clone(), &[24]).unwrap(),
                Tensor::from_vec(scale.clone(), &[3]).unwrap(),
                Tensor::from_vec(lag, &[t, 4]).unwrap(),
            ];
            let g: Vec<Tensor> = cpu.iter().map(|x| x.to_device(&dev).unwrap()).collect();
            let want = ops::mhc_pre(&cpu[0], &cpu[1], &cpu[2], &cpu[3], &cpu[4], p).unwrap();
            let got = ops::mhc_pre(&g[0], &g[1], &g[2], &g[3], &g[4], p).unwrap();
            let case = format!("T {t} D {d}");
            let (u, u_ref) = (
                got.u.to_vec::<bf16>().unwrap(),
                want.u.to_vec::<bf16>().unwrap(),
            );
            if let Some(i) = u
                .iter()
                .zip(&u_ref)
                .position(|(a, b)| a.to_bits() != b.to_bits())
            {
                panic!("{case}: u[{i}] GPU {} CPU {}", u[i], u_ref[i]);
            }
            let m = got.mixes.to_vec::<f32>().unwrap();
            let m_ref = want.mixes.to_vec::<f32>().unwrap();
            let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let diff = calc_diff(&f64s(&m), &f64s(&m_ref));
            assert!(diff < 1e-5, "{case}: mixes calc_diff {diff}");
            for (i, (a, b)) in m.iter().zip(&m_ref).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                    "{case}: mix {i} GPU {a} CPU {b}"
                );
            }
            let (pre, post, comb) = (
                got.pre.to_vec::<f32>().unwrap(),
                got.post.to_vec::<f32>().unwrap(),
                got.comb.to_vec::<f32>().unwrap(),
            );
            for tok in 0..t {
                let split = mhc::hc_split(
                    m[tok * 24..][..24].try_into().unwrap(),
                    scale[..].try_into().unwrap(),
                    base[..].try_into().unwrap(),
                    p.hc_eps,
                    p.iters,
                );
                let flat: Vec<f32> = split.comb.iter().flatten().copied().collect();
                assert_eq!(
                    bits(&pre[tok * 4..][..4]),
                    bits(&split.pre),
                    "{case} token {tok}: pre"
                );
                assert_eq!(
                    bits(&post[tok * 4..][..4]),
                    bits(&split.post),
                    "{case} token {tok}: post"
                );
                assert_eq!(
                    bits(&comb[tok * 16..][..16]),
                    bits(&flat),
                    "{case} token {tok}: comb"
                );
            }
        }
    }
}

/// The mixes' reduction order is fixed by D alone: a token computed alone,
/// or at another place in another batch, gives the same bits everywhere.
#[test]
fn mhc_pre_is_batch_invariant() {
    let dev = gpu();
    let mut rng = common::rng("mhc_pre_invariance");
    let p = ops::MhcParams::default();
    let (t, d) = (257, 5120);
    let PreInputs {
        s,
        hc_fn,
        base,
        scale,
        lag,
    } = random_pre_inputs(&mut rng, t, d);
    let up =
        |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape).unwrap().to_device(&dev).unwrap();
    let (hc_fn, base, scale) = (up(hc_fn, &[24, 4 * d]), up(base, &[24]), up(scale, &[3]));
    let run = |rows: &[usize]| {
        let s: Vec<bf16> = rows
            .iter()
            .flat_map(|&r| s[r * 4 * d..][..4 * d].iter().copied())
            .collect();
        let l: Vec<f32> = rows
            .iter()
            .flat_map(|&r| lag[r * 4..][..4].to_vec())
            .collect();
        let n = rows.len();
        let s = Tensor::from_vec(s, &[n, 4, d])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let o = ops::mhc_pre(&s, &hc_fn, &base, &scale, &up(l, &[n, 4]), p).unwrap();
        let f = |x: &Tensor| bits(&x.to_vec::<f32>().unwrap());
        let u: Vec<u32> =
            o.u.to_vec::<bf16>()
                .unwrap()
                .iter()
                .map(|x| u32::from(x.to_bits()))
                .collect();
        [u, f(&o.mixes), f(&o.pre), f(&o.post), f(&o.comb)]
    };
    // Row widths of u, mixes, pre, post, comb.
    let widths = [d, 24, 4, 4, 16];
    let pick = |o: &[Vec<u32>; 5], r: usize| -> Vec<Vec<u32>> {
        o.iter()
            .zip(widths)
            .map(|(v, w)| v[r * w..][..w].to_vec())
            .collect()
    };
    let all: Vec<usize> = (0..t).collect();
    let full = run(&all);
    // Reversed: every token lands in another tile, lane and lane half.
    let rev: Vec<usize> = (0..t).rev().collect();
    let back = run(&rev);
    for (i, &tok) in [0usize, 31, 32, 63, 64, 200, 256].iter().enumerate() {
        let alone = run(&[tok]);
        assert_eq!(
            pick(&alone, 0),
            pick(&full, tok),
            "token {tok} alone vs in the batch ({i})"
        );
        assert_eq!(
            pick(&back, t - 1 - tok),
            pick(&full, tok),
            "token {tok} reversed batch"
        );
    }
}

#[test]
fn mhc_expand_is_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("mhc_expand_cuda");
    for &t in TOKENS {
        for &d in DIMS {
            for sinkhorn in [true, false] {
                let s = common::random_activations(&mut rng, t * 4 * d, 1.0);
                let f = common::random_activations(&mut rng, t * d, 2.0);
                let (post, comb) = if sinkhorn {
                    // post and comb as mhc_pre produces them.
                    let hc_fn: Vec<f32> = (0..24 * 4 * d)
                        .map(|_| rng.random_range(-0.05..0.05))
                        .collect();
                    let base: Vec<f32> = (0..24).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let scale: Vec<f32> = (0..3).map(|_| rng.random_range(0.1..2.0)).collect();
                    let out = ops::mhc_pre(
                        &Tensor::from_vec(s.clone(), &[t, 4, d]).unwrap(),
                        &Tensor::from_vec(hc_fn, &[24, 4 * d]).unwrap(),
                        &Tensor::from_vec(base, &[24]).unwrap(),
                        &Tensor::from_vec(scale, &[3]).unwrap(),
                        &Tensor::from_vec(vec![0.25f32; t * 4], &[t, 4]).unwrap(),
                        ops::MhcParams::default(),
                    )
                    .unwrap();
                    (out.post, out.comb)
                } else {
                    let post: Vec<f32> = (0..t * 4).map(|_| rng.random_range(0.0..2.0)).collect();
                    let comb: Vec<f32> = (0..t * 16).map(|_| rng.random_range(-1.5..1.5)).collect();
                    (
                        Tensor::from_vec(post, &[t, 4]).unwrap(),
                        Tensor::from_vec(comb, &[t, 16]).unwrap(),
                    )
                };
                let s = Tensor::from_vec(s, &[t, 4, d]).unwrap();
                let f = Tensor::from_vec(f, &[t, d]).unwrap();
                let want = ops::mhc_expand(&s, &f, &post, &comb)
                    .unwrap()
                    .to_vec::<bf16>()
                    .unwrap();
                let got = ops::mhc_expand(
                    &s.to_device(&dev).unwrap(),
                    &f.to_device(&dev).unwrap(),
                    &post.to_device(&dev).unwrap(),
                    &comb.to_device(&dev).unwrap(),
                )
                .unwrap()
                .to_vec::<bf16>()
                .unwrap();
                let case = format!("T {t} D {d} sinkhorn comb {sinkhorn}");
                let bad = want
                    .iter()
                    .zip(&got)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                if let Some(i) = bad {
                    panic!(
                        "{case}: element {i} (token {}, stream {}, x {}): GPU {} CPU {}",
                        i / (4 * d),
                        i / d % 4,
                        i % d,
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn mhc_gpu_limits_are_typed_errors() {
    let dev = gpu();
    let (t, d) = (2, 12);
    let s = Tensor::from_vec(vec![bf16::ONE; t * 4 * d], &[t, 4, d])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let f = Tensor::from_vec(vec![bf16::ONE; t * d], &[t, d])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let post = Tensor::from_vec(vec![1.0f32; t * 4], &[t, 4])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let comb = Tensor::from_vec(vec![0.25f32; t * 16], &[t, 16])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    assert!(matches!(
        ops::mhc_expand(&s, &f, &post, &comb).unwrap_err(),
        Error::Shape {
            tensor: "streams",
            ..
        }
    ));
    let hc_fn = Tensor::from_vec(vec![0.0f32; 24 * 4 * d], &[24, 4 * d])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let base = Tensor::from_vec(vec![0.0f32; 24], &[24])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let scale = Tensor::from_vec(vec![1.0f32; 3], &[3])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    assert!(matches!(
        ops::mhc_pre(&s, &hc_fn, &base, &scale, &post, ops::MhcParams::default()).unwrap_err(),
        Error::Shape {
            tensor: "streams",
            ..
        }
    ));
    let w = ops::MhcWeights {
        func: &hc_fn,
        base: &base,
        scale: &scale,
    };
    assert!(matches!(
        ops::mhc_expand_pre(&s, &f, &post, &comb, w, &post, ops::MhcParams::default()).unwrap_err(),
        Error::Shape {
            tensor: "streams",
            ..
        }
    ));
}

/// The single-pass step on the GPU, into NaN-poisoned outputs: every output
/// bitwise the GPU's expand then front half (the fused kernel sums the
/// mixes with pass 1's code), the new streams and u bitwise the CPU, the
/// mixes within the front half's bound of the CPU. Post and comb of both
/// signs (not only Sinkhorn's), so the expand's rounding is exercised.
#[test]
fn mhc_expand_pre_is_the_expand_then_the_front_half_bit_for_bit() {
    let dev = gpu();
    let mut rng = common::rng("mhc_expand_pre_cuda");
    let p = ops::MhcParams::default();
    for &t in TOKENS {
        for &d in DIMS {
            let PreInputs {
                s,
                hc_fn,
                base,
                scale,
                lag,
            } = random_pre_inputs(&mut rng, t, d);
            let f = common::random_activations(&mut rng, t * d, 2.0);
            let post: Vec<f32> = (0..t * 4).map(|_| rng.random_range(0.0..2.0)).collect();
            let comb: Vec<f32> = (0..t * 16).map(|_| rng.random_range(-1.5..1.5)).collect();
            let cpu = [
                Tensor::from_vec(s, &[t, 4, d]).unwrap(),
                Tensor::from_vec(f, &[t, d]).unwrap(),
                Tensor::from_vec(post, &[t, 4]).unwrap(),
                Tensor::from_vec(comb, &[t, 16]).unwrap(),
                Tensor::from_vec(hc_fn, &[24, 4 * d]).unwrap(),
                Tensor::from_vec(base, &[24]).unwrap(),
                Tensor::from_vec(scale, &[3]).unwrap(),
                Tensor::from_vec(lag, &[t, 4]).unwrap(),
            ];
            let g: Vec<Tensor> = cpu.iter().map(|x| x.to_device(&dev).unwrap()).collect();
            let fused = |x: &[Tensor]| {
                let w = ops::MhcWeights {
                    func: &x[4],
                    base: &x[5],
                    scale: &x[6],
                };
                ops::mhc_expand_pre(&x[0], &x[1], &x[2], &x[3], w, &x[7], p).unwrap()
            };
            let (got_s, got) = fused(&g);
            let two_s = ops::mhc_expand(&g[0], &g[1], &g[2], &g[3]).unwrap();
            let two = ops::mhc_pre(&two_s, &g[4], &g[5], &g[6], &g[7], p).unwrap();
            let (cpu_s, cpu_m) = fused(&cpu);
            let case = format!("T {t} D {d}");
            let b16 = |x: &Tensor| -> Vec<u16> {
                x.to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            let f32s = |x: &Tensor| bits(&x.to_vec::<f32>().unwrap());
            let new_streams = b16(&got_s);
            assert_eq!(
                new_streams,
                b16(&two_s),
                "{case}: new streams vs the expand"
            );
            if let Some(i) = new_streams
                .iter()
                .zip(b16(&cpu_s))
                .position(|(a, b)| *a != b)
            {
                panic!("{case}: new streams element {i} differ from the CPU's");
            }
            let u = b16(&got.u);
            assert_eq!(u, b16(&two.u), "{case}: u vs the front half");
            assert_eq!(u, b16(&cpu_m.u), "{case}: u vs the CPU");
            for (name, a, b) in [
                ("mixes", &got.mixes, &two.mixes),
                ("pre", &got.pre, &two.pre),
                ("post", &got.post, &two.post),
                ("comb", &got.comb, &two.comb),
            ] {
                assert_eq!(f32s(a), f32s(b), "{case}: {name} vs the front half");
            }
            let m = got.mixes.to_vec::<f32>().unwrap();
            let m_ref = cpu_m.mixes.to_vec::<f32>().unwrap();
            let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let diff = calc_diff(&f64s(&m), &f64s(&m_ref));
            assert!(
                diff < 1e-5,
                "{case}: mixes calc_diff {diff} against the CPU"
            );
        }
    }
}
