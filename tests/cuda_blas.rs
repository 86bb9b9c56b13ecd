//! cuBLAS and cuBLASLt through cudarc on the GPU, against the CPU
//! references: `ops::bf16_linear` (cuBLAS, FP32 compute) against
//! `cpu_backend::f32_gemm` / `bf16_gemm`, and the benchmark-only cuBLASLt FP8
//! per-tensor peer against fp32 GEMMs of its dequantised inputs. Outputs are
//! NaN-poisoned first and checked fully written; shapes include M, N and K
//! tails. DEEPINFER_QUICK=1 (the sanitizer passes) keeps the small shapes.
//!
//! Thresholds (`calc_diff`, `v41`'s kernels.md §8.1):
//! - F32 output < 1e-5: both sides sum exact BF16 products in fp32 and differ
//!   only in order, a relative error of order K·2^-24 per element.
//! - BF16 output ≤ 1e-4: on top of that, the two roundings to BF16 can land
//!   one ulp apart (2^-8 relative), which alone bounds calc_diff by
//!   (2^-8)²/2 ≈ 7.6e-6; 1e-4 leaves room for cancelling rows.
//! - FP8 peer < 1e-3 (the FP8 bound); the inputs are exact in fp32,
//!   so only cuBLASLt's accumulation order and the BF16 rounding differ.
#![cfg(deepinfer_cuda)]

mod common;

use common::random_e4m3;
use deepinfer::cpu_backend;
use deepinfer::cuda_backend::blas::{Fp8TensorwisePlan, cublaslt_fp8_tensorwise};
use deepinfer::device::CudaDevice;
use deepinfer::numerics::{calc_diff, e4m3_to_f32};
use deepinfer::ops;
use deepinfer::{DType, Device, E4M3, Error, Tensor};
use half::bf16;
use rand::Rng;

fn cuda() -> CudaDevice {
    CudaDevice::new(0)
        .expect("the CUDA tests need a GPU: run them from the GPU bundle")
        .with_poisoned_allocations()
}

fn f64s<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

/// (M, N, K): decode and prefill sizes of the model's BF16 linears, and
/// tails in every dimension.
const BF16_SHAPES: &[(usize, usize, usize)] = &[
    (1, 64, 64),
    (7, 33, 40),
    (1, 1, 1),
    (3, 17, 257),
    (0, 16, 32),
    (5, 4096, 1280),
    (64, 1280, 5120),
    (130, 512, 4096),
    (33, 2304, 520),
    (1024, 384, 4096),
];

#[test]
fn bf16_linear_matches_the_cpu_reference() {
    let dev = Device::Cuda(cuda());
    let mut rng = common::rng("bf16_linear_cuda");
    let shapes = if common::quick() {
        &BF16_SHAPES[..5]
    } else {
        BF16_SHAPES
    };
    for &(m, n, k) in shapes {
        let a = common::random_activations(&mut rng, m * k, 2.0);
        let w = common::random_activations(&mut rng, n * k, 0.05);
        let ad = Tensor::from_vec(a.clone(), &[m, k])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let wd = Tensor::from_vec(w.clone(), &[n, k])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let want32 = cpu_backend::f32_gemm(&a, &w, m, n, k);
        let want16 = cpu_backend::bf16_gemm(&a, &w, m, n, k);

        let got32 = ops::bf16_linear(&ad, &wd, DType::F32).unwrap();
        assert_eq!(got32.shape(), &[m, n]);
        let g32 = got32.to_vec::<f32>().unwrap();
        assert!(
            g32.iter().all(|v| v.is_finite()),
            "{m}x{n}x{k}: F32 output not fully written"
        );
        let d32 = calc_diff(&f64s(&g32), &f64s(&want32));
        assert!(d32 < 1e-5, "{m}x{n}x{k} F32: calc_diff {d32:e}");

        let got16 = ops::bf16_linear(&ad, &wd, DType::BF16).unwrap();
        let g16 = got16.to_vec::<bf16>().unwrap();
        assert!(
            g16.iter().all(|v| v.is_finite()),
            "{m}x{n}x{k}: BF16 output not fully written"
        );
        let d16 = calc_diff(
            &g16.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
            &want16.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
        );
        assert!(d16 <= 1e-4, "{m}x{n}x{k} BF16: calc_diff {d16:e}");

        // The cached handle serves a second call into the same output; the
        // same algorithm on the same inputs gives the same bits.
        let mut again = Tensor::empty(&dev, DType::F32, &[m, n]).unwrap();
        ops::bf16_linear_into(&ad, &wd, &mut again).unwrap();
        let g2 = again.to_vec::<f32>().unwrap();
        assert_eq!(
            g2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            g32.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{m}x{n}x{k}: repeated call differs"
        );
    }
}

#[test]
fn bf16_linear_rejects_operands_on_other_devices() {
    let dev = Device::Cuda(cuda());
    let a = Tensor::from_vec(vec![bf16::ONE; 4 * 8], &[4, 8]).unwrap();
    let w = Tensor::from_vec(vec![bf16::ONE; 2 * 8], &[2, 8]).unwrap();
    let ad = a.to_device(&dev).unwrap();
    let e = ops::bf16_linear(&ad, &w, DType::F32).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "w", .. }),
        "{e}"
    );
    let mut out = Tensor::empty(&Device::Cpu, DType::F32, &[4, 2]).unwrap();
    let wd = w.to_device(&dev).unwrap();
    let e = ops::bf16_linear_into(&ad, &wd, &mut out).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "out", .. }),
        "{e}"
    );
}

/// (M, N, K) for the FP8 peer: N and K multiples of 16 (cuBLASLt's FP8
/// rule), M any.
const FP8_SHAPES: &[(usize, usize, usize)] = &[
    (1, 64, 128),
    (7, 48, 96),
    (33, 256, 1024),
    (64, 1280, 5120),
    (128, 4096, 1280),
    (300, 512, 5120),
];

#[test]
fn cublaslt_fp8_peer_matches_an_fp32_gemm_of_its_dequantised_inputs() {
    let cuda = cuda();
    let dev = Device::Cuda(cuda.clone());
    let mut rng = common::rng("cublaslt_fp8_cuda");
    let shapes = if common::quick() {
        &FP8_SHAPES[..3]
    } else {
        FP8_SHAPES
    };
    for &(m, n, k) in shapes {
        let (a, w) = (random_e4m3(&mut rng, m * k), random_e4m3(&mut rng, n * k));
        let (sa, sw) = (
            rng.random_range(0.01f32..2.0),
            rng.random_range(0.001f32..0.1),
        );
        // The fp32 reference of the peer's definition: scales applied to the
        // fp32 dot product of the decoded operands.
        let dot = cpu_backend::f32_gemm(
            &a.iter().map(|&c| e4m3_to_f32(c)).collect::<Vec<_>>(),
            &w.iter().map(|&c| e4m3_to_f32(c)).collect::<Vec<_>>(),
            m,
            n,
            k,
        );
        let want: Vec<f64> = dot
            .iter()
            .map(|&d| d as f64 * sa as f64 * sw as f64)
            .collect();
        let up = |v: Vec<E4M3>, r: usize| {
            Tensor::from_vec(v, &[r, k])
                .unwrap()
                .to_device(&dev)
                .unwrap()
        };
        let (ad, wd) = (up(a, m), up(w, n));
        let scale = |s: f32| {
            Tensor::from_vec(vec![s], &[1])
                .unwrap()
                .to_device(&dev)
                .unwrap()
        };
        let (sad, swd) = (scale(sa), scale(sw));
        for dtype in [DType::BF16, DType::F32] {
            let mut out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
            cublaslt_fp8_tensorwise(&cuda, &ad, &sad, &wd, &swd, &mut out).unwrap();
            let got: Vec<f64> = match dtype {
                DType::BF16 => out
                    .to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_f64())
                    .collect(),
                _ => f64s(&out.to_vec::<f32>().unwrap()),
            };
            assert!(
                got.iter().all(|v| v.is_finite()),
                "{m}x{n}x{k} {dtype}: not fully written"
            );
            let d = calc_diff(&got, &want);
            assert!(d < 1e-3, "{m}x{n}x{k} {dtype}: calc_diff {d:e}");
        }
        // A plan runs repeatedly, bitwise the same.
        let mut plan = Fp8TensorwisePlan::new(&cuda, m, n, k, DType::F32).unwrap();
        let mut o1 = Tensor::empty(&dev, DType::F32, &[m, n]).unwrap();
        let mut o2 = Tensor::empty(&dev, DType::F32, &[m, n]).unwrap();
        plan.run(&ad, &sad, &wd, &swd, &mut o1).unwrap();
        plan.run(&ad, &sad, &wd, &swd, &mut o2).unwrap();
        let bits = |t: &Tensor| {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&o1), bits(&o2), "{m}x{n}x{k}: plan reruns differ");
        // A plan checks the tensors it is given.
        let mut wrong = Tensor::empty(&dev, DType::BF16, &[m, n]).unwrap();
        let e = plan.run(&ad, &sad, &wd, &swd, &mut wrong).unwrap_err();
        assert!(matches!(e, Error::DType { tensor: "out", .. }), "{e}");
    }
}

#[test]
fn cublaslt_fp8_peer_rejects_shapes_it_cannot_take() {
    let cuda = cuda();
    let e = Fp8TensorwisePlan::new(&cuda, 4, 40, 64, DType::BF16)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Argument { arg: "n", .. }), "{e}");
    let e = Fp8TensorwisePlan::new(&cuda, 4, 32, 40, DType::BF16)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Argument { arg: "k", .. }), "{e}");
    let e = Fp8TensorwisePlan::new(&cuda, 0, 32, 64, DType::BF16)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Argument { arg: "m", .. }), "{e}");
    let e = Fp8TensorwisePlan::new(&cuda, 4, 32, 64, DType::I32)
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            Error::Argument {
                arg: "out_dtype",
                ..
            }
        ),
        "{e}"
    );
}
