//! The TileLang MoE routing kernel on the GPU against the CPU reference,
//! bitwise: ids and weights of every token for fresh random logits over
//! −8…24 with exact ties (copied logits, logits of exactly 20, biases on a
//! 1/64 grid), at V4.1's 384 experts top-6, DSpark's 128 top-3 and 8 top-2, an
//! EP-64 rank's 6 top-6, partial slots (257, 513 experts),
//! the limits (1024 experts, top-16) and degenerate rows; then the
//! grouped-GEMM layout (counts, offsets, permutation) of the routed ids. Outputs are NaN-poisoned before the
//! kernel runs, so every element must be written. Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::device::CudaDevice;
use deepinfer::{DType, Device, Error, Tensor, ops};
use rand::Rng;
use rand::rngs::StdRng;

const ROUTE_SCALE: f32 = 1.5;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

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

fn check(dev: &Device, z: &[f32], b: &[f32], tokens: usize, experts: usize, k: usize) {
    let case = format!("{tokens} tokens x {experts} experts top-{k}");
    let zt = Tensor::from_vec(z.to_vec(), &[tokens, experts]).unwrap();
    let bt = Tensor::from_vec(b.to_vec(), &[experts]).unwrap();
    let (ids_ref, w_ref) = ops::moe_route(&zt, &bt, k, ROUTE_SCALE).unwrap();
    let (ids, w) = ops::moe_route(
        &zt.to_device(dev).unwrap(),
        &bt.to_device(dev).unwrap(),
        k,
        ROUTE_SCALE,
    )
    .unwrap();
    assert_eq!(ids.shape(), &[tokens, k], "{case}");
    assert_eq!(w.shape(), &[tokens, k], "{case}");
    let (iv, wv) = (ids.to_vec::<i32>().unwrap(), w.to_vec::<f32>().unwrap());
    let (ir, wr) = (
        ids_ref.to_vec::<i32>().unwrap(),
        w_ref.to_vec::<f32>().unwrap(),
    );
    if let Some(i) = wv.iter().position(|v| v.is_nan()) {
        panic!("{case}: weight {i} not written (NaN)");
    }
    for t in 0..tokens {
        let row = t * k..(t + 1) * k;
        assert_eq!(iv[row.clone()], ir[row.clone()], "{case}: ids of token {t}");
        let got: Vec<u32> = wv[row.clone()].iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = wr[row].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{case}: weights of token {t}");
    }
}

#[test]
fn routing_is_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("moe_route_cuda");
    // 6 top-6 is an EP-64 rank routing over its local experts; 257 and 513
    // end in a partial slot of the 256-thread CTA.
    for &(experts, k) in &[
        (384usize, 6usize),
        (128, 3),
        (8, 2),
        (6, 6),
        (257, 8),
        (513, 6),
    ] {
        for &tokens in &[1usize, 3, 64, 257, 4096] {
            let z = logits(&mut rng, tokens, experts);
            let b = bias(&mut rng, experts);
            check(&dev, &z, &b, tokens, experts, k);
        }
    }
}

#[test]
fn limits_and_degenerate_rows() {
    let dev = gpu();
    let mut rng = common::rng("moe_route_cuda_limits");
    for &(experts, k) in &[(1024usize, 16usize), (1000, 7), (33, 16), (1, 1), (16, 16)] {
        let z = logits(&mut rng, 67, experts);
        let b = bias(&mut rng, experts);
        check(&dev, &z, &b, 67, experts, k);
    }
    // Whole rows of equal keys (the lowest ids win), far-negative logits
    // (s = 0, all tied) and a mix of −inf, huge and ordinary logits. (NaN
    // logits are left out: the GPU makes every NaN the canonical positive
    // one, the CPU keeps its sign, and total_cmp orders the two apart.)
    let experts = 384;
    let mut z = vec![0.5f32; 4 * experts];
    z[experts..2 * experts].fill(-200.0);
    for (i, v) in z[2 * experts..3 * experts].iter_mut().enumerate() {
        *v = match i % 4 {
            0 => f32::NEG_INFINITY,
            1 => 1e30,
            2 => -1e30,
            _ => rng.random_range(-8.0f32..24.0),
        };
    }
    z[3 * experts..].fill(-f32::MAX);
    check(&dev, &z, &vec![0.0f32; experts], 4, experts, 6);
}

/// Every expert selected (16 of 16), so each weight depends on every score:
/// 2^20 logits swept over [−110, 21] (where ln(1 + e^z) goes from
/// underflowing fp32 to the z > 20 branch), so a softplus that differs from
/// the CPU's correctly rounded f64 one in the last fp32 bit shows up.
#[test]
fn softplus_sweep_matches_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("moe_route_cuda_softplus");
    let (experts, k) = (16usize, 16usize);
    let tokens = (1 << 20) / experts;
    let z: Vec<f32> = (0..tokens * experts)
        .map(|_| rng.random_range(-110.0f32..21.0))
        .collect();
    check(&dev, &z, &vec![0.0f32; experts], tokens, experts, k);
}

#[test]
fn tokens_do_not_depend_on_the_batch() {
    let dev = gpu();
    let mut rng = common::rng("moe_route_cuda_batch");
    let (tokens, experts, k) = (257, 384, 6);
    let z = logits(&mut rng, tokens, experts);
    let bt = Tensor::from_vec(bias(&mut rng, experts), &[experts])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let run = |t0: usize, n: usize| {
        let zt = Tensor::from_vec(z[t0 * experts..(t0 + n) * experts].to_vec(), &[n, experts])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let (i, w) = ops::moe_route(&zt, &bt, k, ROUTE_SCALE).unwrap();
        (i.to_vec::<i32>().unwrap(), w.to_vec::<f32>().unwrap())
    };
    let (ids, w) = run(0, tokens);
    for t in [0usize, 5, 256] {
        let (i1, w1) = run(t, 1);
        assert_eq!(i1, ids[t * k..(t + 1) * k], "ids of token {t}");
        assert_eq!(w1, w[t * k..(t + 1) * k], "weights of token {t}");
    }
}

#[test]
fn into_checks_its_outputs_and_inputs() {
    let dev = gpu();
    let on = |t: Tensor| t.to_device(&dev).unwrap();
    let z = on(Tensor::from_vec(vec![1.0f32; 2 * 8], &[2, 8]).unwrap());
    let b = on(Tensor::from_vec(vec![0.0f32; 8], &[8]).unwrap());
    let mut ids = Tensor::empty(&dev, DType::I32, &[2, 2]).unwrap();
    let mut w = Tensor::empty(&dev, DType::F32, &[2, 2]).unwrap();
    let mut host_ids = Tensor::empty(&Device::Cpu, DType::I32, &[2, 2]).unwrap();
    let e = ops::moe_route_into(&z, &b, 2, ROUTE_SCALE, &mut host_ids, &mut w).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "ids", .. }),
        "{e}"
    );
    let host_b = Tensor::from_vec(vec![0.0f32; 8], &[8]).unwrap();
    let e = ops::moe_route(&z, &host_b, 2, ROUTE_SCALE).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "bias", .. }),
        "{e}"
    );
    let mut bad_w = Tensor::empty(&dev, DType::F32, &[2, 3]).unwrap();
    let e = ops::moe_route_into(&z, &b, 2, ROUTE_SCALE, &mut ids, &mut bad_w).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "weights",
                ..
            }
        ),
        "{e}"
    );
    ops::moe_route_into(&z, &b, 2, ROUTE_SCALE, &mut ids, &mut w).unwrap();
    assert_eq!(ids.to_vec::<i32>().unwrap(), vec![0, 1, 0, 1]);
    // No tokens: nothing to launch, empty outputs.
    let (i0, w0) = ops::moe_route(
        &Tensor::empty(&dev, DType::F32, &[0, 384]).unwrap(),
        &on(Tensor::from_vec(vec![0.0f32; 384], &[384]).unwrap()),
        6,
        ROUTE_SCALE,
    )
    .unwrap();
    assert_eq!((i0.shape(), w0.shape()), (&[0, 6][..], &[0, 6][..]));
}

#[test]
fn layout_is_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("moe_layout_cuda");
    for &(experts, k) in &[(384usize, 6usize), (128, 3), (8, 2), (1024, 16)] {
        for &tokens in &[1usize, 3, 64, 257, 4096] {
            let z = logits(&mut rng, tokens, experts);
            let b = bias(&mut rng, experts);
            let zt = Tensor::from_vec(z, &[tokens, experts]).unwrap();
            let bt = Tensor::from_vec(b, &[experts]).unwrap();
            // Routed on the GPU, laid out on both.
            let (ids, _) = ops::moe_route(
                &zt.to_device(&dev).unwrap(),
                &bt.to_device(&dev).unwrap(),
                k,
                ROUTE_SCALE,
            )
            .unwrap();
            let (c, o, p) = ops::moe_layout(&ids, experts).unwrap();
            let (cr, or, pr) =
                ops::moe_layout(&ids.to_device(&Device::Cpu).unwrap(), experts).unwrap();
            let case = format!("{tokens} tokens x {experts} experts top-{k}");
            assert_eq!(
                c.to_vec::<i32>().unwrap(),
                cr.to_vec::<i32>().unwrap(),
                "{case}: counts"
            );
            assert_eq!(
                o.to_vec::<i32>().unwrap(),
                or.to_vec::<i32>().unwrap(),
                "{case}: offsets"
            );
            assert_eq!(
                p.to_vec::<i32>().unwrap(),
                pr.to_vec::<i32>().unwrap(),
                "{case}: permutation"
            );
        }
    }
    // Every entry on one expert, and a batch skewed onto a few experts.
    for ids in [
        vec![5i32; 3000],
        (0..6000i32).map(|j| j % 7 % 3 * 2).collect(),
    ] {
        let n = ids.len();
        let t = Tensor::from_vec(ids, &[n]).unwrap();
        let (c, o, p) = ops::moe_layout(&t.to_device(&dev).unwrap(), 8).unwrap();
        let (cr, or, pr) = ops::moe_layout(&t, 8).unwrap();
        assert_eq!(c.to_vec::<i32>().unwrap(), cr.to_vec::<i32>().unwrap());
        assert_eq!(o.to_vec::<i32>().unwrap(), or.to_vec::<i32>().unwrap());
        assert_eq!(p.to_vec::<i32>().unwrap(), pr.to_vec::<i32>().unwrap());
    }
    // No entries: zero counts and offsets, an empty permutation.
    let empty = Tensor::empty(&dev, DType::I32, &[0, 6]).unwrap();
    let (c, o, p) = ops::moe_layout(&empty, 384).unwrap();
    assert_eq!(c.to_vec::<i32>().unwrap(), vec![0; 384]);
    assert_eq!(o.to_vec::<i32>().unwrap(), vec![0; 385]);
    assert_eq!(p.shape(), &[0]);
}
