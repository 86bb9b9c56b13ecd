//! MoE routing on the CPU backend: the op is `moe::route` per token (over
//! V4.1's 384 experts top-6, DSpark's 128 top-3 and a small 8 top-2, with
//! logits over −8…24 including exact ties and the softplus threshold), a
//! hand-computed case, the tie rule, typed validation errors, and the
//! grouped-GEMM layout (counts, offsets, permutation) against its definition
//! and a hand-computed case.

mod common;

use deepinfer::cpu_backend::moe;
use deepinfer::cpu_backend::moe_layout::moe_layout;
use deepinfer::{DType, Device, Error, Tensor, ops};
use rand::Rng;
use rand::rngs::StdRng;

const ROUTE_SCALE: f32 = 1.5;

/// Gate logits over −8…24 with exact ties: some values copied from other
/// experts of the same token, some exactly 20 (softplus' threshold), some
/// quantised to a coarse grid.
fn logits(rng: &mut StdRng, tokens: usize, experts: usize) -> Vec<f32> {
    let mut z: Vec<f32> = (0..tokens * experts)
        .map(|_| match rng.random::<f32>() {
            r if r < 0.02 => 20.0,
            r if r < 0.10 => (rng.random_range(-8.0f32..24.0) * 4.0).round() / 4.0,
            _ => rng.random_range(-8.0f32..24.0),
        })
        .collect();
    for t in 0..tokens {
        for _ in 0..experts / 8 {
            let (a, b) = (rng.random_range(0..experts), rng.random_range(0..experts));
            z[t * experts + a] = z[t * experts + b];
        }
    }
    z
}

/// Selection biases on a 1/64 grid (many exact ties between experts).
fn bias(rng: &mut StdRng, experts: usize) -> Vec<f32> {
    (0..experts)
        .map(|_| rng.random_range(-32i32..32) as f32 / 64.0)
        .collect()
}

const CASES: &[(usize, usize)] = &[(384, 6), (128, 3), (8, 2)];
const TOKENS: &[usize] = &[1, 3, 64, 257];

#[test]
fn op_is_route_per_token() {
    let mut rng = common::rng("moe_route_cpu");
    for &(experts, k) in CASES {
        for &tokens in TOKENS {
            let z = logits(&mut rng, tokens, experts);
            let b = bias(&mut rng, experts);
            let (ids, w) = ops::moe_route(
                &Tensor::from_vec(z.clone(), &[tokens, experts]).unwrap(),
                &Tensor::from_vec(b.clone(), &[experts]).unwrap(),
                k,
                ROUTE_SCALE,
            )
            .unwrap();
            assert_eq!(ids.shape(), &[tokens, k]);
            assert_eq!(w.shape(), &[tokens, k]);
            let (ids, w) = (ids.to_vec::<i32>().unwrap(), w.to_vec::<f32>().unwrap());
            for t in 0..tokens {
                let r = moe::route(&z[t * experts..(t + 1) * experts], &b, k, ROUTE_SCALE);
                let want: Vec<i32> = r.experts.iter().map(|&e| e as i32).collect();
                assert_eq!(ids[t * k..(t + 1) * k], want[..], "{experts}/{k} token {t}");
                let got: Vec<u32> = w[t * k..(t + 1) * k].iter().map(|v| v.to_bits()).collect();
                let want: Vec<u32> = r.weights.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{experts}/{k} token {t} weights");
            }
        }
    }
}

#[test]
fn leading_shape_is_kept() {
    let mut rng = common::rng("moe_route_cpu_shape");
    let z = logits(&mut rng, 6, 128);
    let b = bias(&mut rng, 128);
    let flat = ops::moe_route(
        &Tensor::from_vec(z.clone(), &[6, 128]).unwrap(),
        &Tensor::from_vec(b.clone(), &[128]).unwrap(),
        3,
        ROUTE_SCALE,
    )
    .unwrap();
    let nested = ops::moe_route(
        &Tensor::from_vec(z, &[2, 3, 128]).unwrap(),
        &Tensor::from_vec(b, &[128]).unwrap(),
        3,
        ROUTE_SCALE,
    )
    .unwrap();
    assert_eq!(nested.0.shape(), &[2, 3, 3]);
    assert_eq!(
        nested.0.to_vec::<i32>().unwrap(),
        flat.0.to_vec::<i32>().unwrap()
    );
    assert_eq!(
        nested.1.to_vec::<f32>().unwrap(),
        flat.1.to_vec::<f32>().unwrap()
    );
}

#[test]
fn hand_computed_case_and_ties() {
    // z = 0 gives s = √ln 2; z = 30 gives s = √30 (above the threshold).
    let z = vec![0.0f32, 30.0, 0.0, -100.0];
    let b = vec![0.0f32, -10.0, 0.5, 0.0];
    // Keys: √ln2, √30 − 10 < 0, √ln2 + 0.5, 0 → picks 2 then 0; ids ascending.
    let (ids, w) = ops::moe_route(
        &Tensor::from_vec(z, &[1, 4]).unwrap(),
        &Tensor::from_vec(b, &[4]).unwrap(),
        2,
        ROUTE_SCALE,
    )
    .unwrap();
    assert_eq!(ids.to_vec::<i32>().unwrap(), vec![0, 2]);
    let s = ((0.0f64).exp().ln_1p() as f32).sqrt();
    let den = s + s + 1e-20;
    let want = s / den * ROUTE_SCALE;
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![want, want]);
    // All keys equal: the lowest ids win.
    let (ids, _) = ops::moe_route(
        &Tensor::from_vec(vec![1.0f32; 16], &[1, 16]).unwrap(),
        &Tensor::from_vec(vec![0.25f32; 16], &[16]).unwrap(),
        5,
        ROUTE_SCALE,
    )
    .unwrap();
    assert_eq!(ids.to_vec::<i32>().unwrap(), vec![0, 1, 2, 3, 4]);
}

#[test]
fn validation_errors_are_typed() {
    let z = Tensor::from_vec(vec![0.0f32; 2 * 8], &[2, 8]).unwrap();
    let b = Tensor::from_vec(vec![0.0f32; 8], &[8]).unwrap();
    let e = ops::moe_route(&z, &b, 0, 1.5).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "top_k", .. }), "{e}");
    let e = ops::moe_route(&z, &b, 9, 1.5).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "top_k", .. }), "{e}");
    let wide = Tensor::from_vec(vec![0.0f32; 40], &[2, 20]).unwrap();
    let b20 = Tensor::from_vec(vec![0.0f32; 20], &[20]).unwrap();
    let e = ops::moe_route(&wide, &b20, 17, 1.5).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "top_k", .. }), "{e}");
    let e = ops::moe_route(&z, &b, 2, f32::NAN).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Argument {
                arg: "route_scale",
                ..
            }
        ),
        "{e}"
    );
    let b7 = Tensor::from_vec(vec![0.0f32; 7], &[7]).unwrap();
    let e = ops::moe_route(&z, &b7, 2, 1.5).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "bias", .. }), "{e}");
    let huge = Tensor::from_vec(vec![0.0f32; 1025], &[1, 1025]).unwrap();
    let bh = Tensor::from_vec(vec![0.0f32; 1025], &[1025]).unwrap();
    let e = ops::moe_route(&huge, &bh, 2, 1.5).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "logits",
                ..
            }
        ),
        "{e}"
    );
    let zb = Tensor::from_vec(vec![half::bf16::ZERO; 16], &[2, 8]).unwrap();
    let e = ops::moe_route(&zb, &b, 2, 1.5).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "logits",
                ..
            }
        ),
        "{e}"
    );
    let mut ids = Tensor::empty(&Device::Cpu, DType::I32, &[2, 3]).unwrap();
    let mut w = Tensor::empty(&Device::Cpu, DType::F32, &[2, 2]).unwrap();
    let e = ops::moe_route_into(&z, &b, 2, 1.5, &mut ids, &mut w).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "ids", .. }), "{e}");
    let mut ids = Tensor::empty(&Device::Cpu, DType::F32, &[2, 2]).unwrap();
    let e = ops::moe_route_into(&z, &b, 2, 1.5, &mut ids, &mut w).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "ids", .. }), "{e}");
    // No tokens: empty outputs.
    let (ids, w) = ops::moe_route(
        &Tensor::from_vec(Vec::<f32>::new(), &[0, 8]).unwrap(),
        &b,
        2,
        1.5,
    )
    .unwrap();
    assert_eq!((ids.shape(), w.shape()), (&[0, 2][..], &[0, 2][..]));
}

#[test]
fn layout_groups_entries_by_expert_then_token() {
    let mut rng = common::rng("moe_layout_cpu");
    for &(experts, k) in CASES {
        for &tokens in &[0usize, 1, 3, 64, 257] {
            let z = logits(&mut rng, tokens, experts);
            let b = bias(&mut rng, experts);
            let (ids, _) = ops::moe_route(
                &Tensor::from_vec(z, &[tokens, experts]).unwrap(),
                &Tensor::from_vec(b, &[experts]).unwrap(),
                k,
                ROUTE_SCALE,
            )
            .unwrap();
            let (counts, offsets, perm) = ops::moe_layout(&ids, experts).unwrap();
            let ids = ids.to_vec::<i32>().unwrap();
            let l = moe_layout(&ids, experts);
            assert_eq!(counts.to_vec::<i32>().unwrap(), l.counts);
            assert_eq!(offsets.to_vec::<i32>().unwrap(), l.offsets);
            assert_eq!(perm.to_vec::<i32>().unwrap(), l.permutation);
            // The definition: entries sorted by (expert, entry index).
            let mut want: Vec<(i32, i32)> = ids
                .iter()
                .enumerate()
                .map(|(j, &e)| (e, j as i32))
                .collect();
            want.sort();
            let perm: Vec<i32> = want.iter().map(|&(_, j)| j).collect();
            assert_eq!(l.permutation, perm, "{experts}/{k} x {tokens}");
            assert_eq!(l.offsets.len(), experts + 1);
            assert_eq!(l.offsets[0], 0);
            assert_eq!(l.offsets[experts] as usize, tokens * k);
            for e in 0..experts {
                let n = ids.iter().filter(|&&x| x == e as i32).count() as i32;
                assert_eq!(l.counts[e], n, "count of expert {e}");
                assert_eq!(l.offsets[e + 1] - l.offsets[e], n, "offsets of expert {e}");
                for &j in &l.permutation[l.offsets[e] as usize..l.offsets[e + 1] as usize] {
                    assert_eq!(ids[j as usize], e as i32);
                }
            }
        }
    }
}

#[test]
fn layout_validation_errors_are_typed() {
    let ids = Tensor::from_vec(vec![0i32, 3, 1, 2], &[2, 2]).unwrap();
    let e = ops::moe_layout(&ids, 3).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "ids", .. }), "{e}");
    let neg = Tensor::from_vec(vec![0i32, -1], &[1, 2]).unwrap();
    let e = ops::moe_layout(&neg, 3).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "ids", .. }), "{e}");
    let e = ops::moe_layout(&ids, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Argument {
                arg: "n_experts",
                ..
            }
        ),
        "{e}"
    );
    let f = Tensor::from_vec(vec![0.0f32; 4], &[2, 2]).unwrap();
    let e = ops::moe_layout(&f, 4).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "ids", .. }), "{e}");
    let mut c = Tensor::empty(&Device::Cpu, DType::I32, &[4]).unwrap();
    let mut o = Tensor::empty(&Device::Cpu, DType::I32, &[4]).unwrap();
    let mut p = Tensor::empty(&Device::Cpu, DType::I32, &[4]).unwrap();
    let e = ops::moe_layout_into(&ids, 4, &mut c, &mut o, &mut p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "offsets",
                ..
            }
        ),
        "{e}"
    );
    // A hand-computed layout: tokens (0: 1, 3), (1: 0, 3), (2: 1, 2).
    let ids = Tensor::from_vec(vec![1i32, 3, 0, 3, 1, 2], &[3, 2]).unwrap();
    let (c, o, p) = ops::moe_layout(&ids, 5).unwrap();
    assert_eq!(c.to_vec::<i32>().unwrap(), vec![1, 2, 1, 2, 0]);
    assert_eq!(o.to_vec::<i32>().unwrap(), vec![0, 1, 3, 4, 6, 6]);
    assert_eq!(p.to_vec::<i32>().unwrap(), vec![2, 0, 4, 5, 1, 3]);
}
