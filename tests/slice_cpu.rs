//! The first vertical slice on the CPU backend, against independent f64
//! formulations written here: RMSNorm (eps from the config, 1e-20 included)
//! and the FP8 1×32 quantiser, over real and odd shapes; the fused RMSNorm +
//! quantiser is the composition of the two ops.

mod common;

use deepinfer::numerics::{calc_diff, e4m3_to_f32, e8m0_to_f32};
use deepinfer::{DType, Device, E4M3, E8M0, Tensor, ops};
use half::bf16;

fn rms_norm_f64(x: &[bf16], w: &[bf16], dim: usize, eps: f64) -> Vec<f64> {
    x.chunks(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(v, w)| w.to_f64() * v.to_f64() * inv)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_matches_f64_within_one_bf16_rounding() {
    let mut rng = common::rng("rms_norm_cpu");
    // V4.1 hidden width, the indexer/latent widths, and odd tails.
    for (rows, dim, eps) in [
        (3, 5120, 1e-20f32),
        (5, 512, 1e-20),
        (2, 1280, 1e-6),
        (7, 33, 1e-20),
        (1, 1, 1e-20),
        (0, 64, 1e-20),
    ] {
        let x = common::random_activations(&mut rng, rows * dim, 2.0);
        let w = common::random_activations(&mut rng, dim, 1.0);
        let xt = Tensor::from_vec(x.clone(), &[rows, dim]).unwrap();
        let wt = Tensor::from_vec(w.clone(), &[dim]).unwrap();
        let y = ops::rms_norm(&xt, &wt, eps).unwrap();
        assert_eq!(y.shape(), &[rows, dim]);
        let y = y.to_vec::<bf16>().unwrap();
        let want = rms_norm_f64(&x, &w, dim, eps as f64);
        for (i, (g, r)) in y.iter().zip(&want).enumerate() {
            // One bf16 rounding of an fp32 result whose own error is a few
            // fp32 ulps: within 1 bf16 ulp of the exact value, relative 2^-8.
            let tol = r.abs() * 2f64.powi(-8) + 1e-30;
            assert!(
                (g.to_f64() - *r).abs() <= tol,
                "rows {rows} dim {dim} elem {i}: {g} vs {r}"
            );
        }
        if rows > 0 {
            assert!(calc_diff(&common::to_f64(&y), &want) < 1e-5);
        }
    }
}

#[test]
fn rms_norm_with_eps_1e20_keeps_tiny_rows_finite() {
    // mean(x^2) ~ 1e-16: an eps of 1e-6 would dominate it, 1e-20 must not.
    let dim = 64;
    let x: Vec<bf16> = (0..dim)
        .map(|i| bf16::from_f32(1e-8 * (1.0 + i as f32 / 64.0)))
        .collect();
    let w = vec![bf16::ONE; dim];
    let y = ops::rms_norm(
        &Tensor::from_vec(x.clone(), &[1, dim]).unwrap(),
        &Tensor::from_vec(w.clone(), &[dim]).unwrap(),
        1e-20,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    let want = rms_norm_f64(&x, &w, dim, 1e-20);
    assert!(
        want.iter().all(|v| v.abs() > 0.5),
        "normalised values are O(1)"
    );
    assert!(calc_diff(&common::to_f64(&y), &want) < 1e-5);
}

#[test]
fn act_quant_dequantises_within_e4m3_precision_on_odd_shapes() {
    let mut rng = common::rng("act_quant_cpu");
    for (shape, k) in [
        (vec![4, 5120], 5120usize),
        (vec![2, 3, 64], 64),
        (vec![3, 33], 33),
        (vec![5, 7], 7),
        (vec![1, 1], 1),
        (vec![0, 32], 32),
    ] {
        let n: usize = shape.iter().product();
        let x = common::random_bf16(&mut rng, n);
        let (q, s) = ops::act_quant_fp8(&Tensor::from_vec(x.clone(), &shape).unwrap()).unwrap();
        assert_eq!(q.shape(), &shape[..]);
        assert_eq!(q.dtype(), DType::F8E4M3);
        let mut sshape = shape.clone();
        *sshape.last_mut().unwrap() = k.div_ceil(32);
        assert_eq!(s.shape(), &sshape[..]);
        assert_eq!(s.dtype(), DType::E8M0);
        let (q, s) = (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
        for (i, x) in x.iter().enumerate() {
            let (row, col) = (i / k, i % k);
            let scale = e8m0_to_f32(s[row * k.div_ceil(32) + col / 32]) as f64;
            let deq = e4m3_to_f32(q[i]) as f64 * scale;
            // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals,
            // absolute <= 2^-10 * scale in the subnormal range.
            let tol = x.to_f64().abs() * 2f64.powi(-4) + scale * 2f64.powi(-10);
            assert!(
                (deq - x.to_f64()).abs() <= tol,
                "{shape:?} elem {i}: {x} -> {deq}"
            );
        }
    }
}

#[test]
fn rms_norm_act_quant_is_rms_norm_then_act_quant() {
    let mut rng = common::rng("rms_norm_act_quant_cpu");
    for (shape, eps) in [
        (vec![3, 5120], 1e-20f32),
        (vec![2, 4, 512], 1e-6),
        (vec![5, 1280], 1e-20),
        (vec![1, 8192], 1e-20),
        (vec![7, 32], 1e-6),
        (vec![0, 96], 1e-20),
    ] {
        let n: usize = shape.iter().product();
        let dim = *shape.last().unwrap();
        let x = Tensor::from_vec(common::random_activations(&mut rng, n, 3.0), &shape).unwrap();
        let w = Tensor::from_vec(common::random_activations(&mut rng, dim, 1.0), &[dim]).unwrap();
        let y_two = ops::rms_norm(&x, &w, eps).unwrap();
        let (q_two, s_two) = ops::act_quant_fp8(&y_two).unwrap();
        let (y, q, s) = ops::rms_norm_act_quant_fp8(&x, &w, eps).unwrap();
        assert_eq!(y.shape(), &shape[..]);
        assert_eq!(q.shape(), &shape[..]);
        assert_eq!(s.shape(), s_two.shape());
        assert_eq!(y.to_vec::<bf16>().unwrap(), y_two.to_vec::<bf16>().unwrap());
        assert_eq!(q.to_vec::<E4M3>().unwrap(), q_two.to_vec::<E4M3>().unwrap());
        assert_eq!(s.to_vec::<E8M0>().unwrap(), s_two.to_vec::<E8M0>().unwrap());
        // The _into variant overwrites whatever its outputs held.
        let mut yi = Tensor::filled_bytes(DType::BF16, &shape, 0xFF).unwrap();
        let mut qi = Tensor::filled_bytes(DType::F8E4M3, &shape, 0xFF).unwrap();
        let mut si = Tensor::filled_bytes(DType::E8M0, s.shape(), 0xFF).unwrap();
        ops::rms_norm_act_quant_fp8_into(&x, &w, eps, &mut yi, &mut qi, &mut si).unwrap();
        assert_eq!(yi.to_vec::<bf16>().unwrap(), y.to_vec::<bf16>().unwrap());
        assert_eq!(qi.to_vec::<E4M3>().unwrap(), q.to_vec::<E4M3>().unwrap());
        assert_eq!(si.to_vec::<E8M0>().unwrap(), s.to_vec::<E8M0>().unwrap());
    }
}

#[test]
fn cpu_tensors_report_the_cpu_device() {
    let t = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    assert!(t.device().same_as(&Device::Cpu));
    assert_eq!(t.storage_bytes(), 24);
}
