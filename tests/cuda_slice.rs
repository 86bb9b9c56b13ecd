//! The first vertical slice on the GPU, against the CPU reference: the FP8
//! quantiser (hand-written and TileLang) bitwise, RMSNorm within one BF16 ulp
//! per element and `calc_diff` < 1e-6, and the fused TileLang RMSNorm + FP8
//! quantiser (y as RMSNorm, q and scale bitwise the quantiser of its own y).
//! Outputs are NaN-poisoned before the kernels run. Built only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU
//! (run it through the GPU bundle). With DEEPINFER_DUMP_DIR set, inputs and
//! outputs are written there for `tests/torch/check_slice.py`.
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::device::CudaDevice;
use deepinfer::kernels::{self, KernelRef};
use deepinfer::numerics::calc_diff;
use deepinfer::ops::{self, ActQuantImpl};
use deepinfer::{Device, E4M3, E8M0, Error, Tensor};
use half::bf16;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

fn dump(name: &str, t: &Tensor) {
    if let Ok(dir) = std::env::var("DEEPINFER_DUMP_DIR") {
        let host = t.to_device(&Device::Cpu).unwrap();
        let bytes = match host.dtype() {
            deepinfer::DType::BF16 => host
                .as_slice::<bf16>()
                .unwrap()
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect(),
            deepinfer::DType::F8E4M3 => host
                .as_slice::<E4M3>()
                .unwrap()
                .iter()
                .map(|v| v.0)
                .collect(),
            deepinfer::DType::E8M0 => host
                .as_slice::<E8M0>()
                .unwrap()
                .iter()
                .map(|v| v.0)
                .collect::<Vec<u8>>(),
            d => panic!("no dump format for {d}"),
        };
        let shape: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
        let file = format!("{dir}/{name}__{}__{}.bin", t.dtype(), shape.join("x"));
        std::fs::write(file, bytes).unwrap();
    }
}

const QUANT_SHAPES: &[(usize, usize)] = &[
    (1, 5120),
    (3, 5120),
    (64, 1280),
    (257, 4096),
    (5, 32),
    (2, 64),
    (7, 33),
    (3, 7),
    (1, 1),
    (129, 2304),
    (16, 8192),
    (0, 64),
];

#[test]
fn act_quant_is_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("act_quant_cuda");
    for &(rows, k) in QUANT_SHAPES {
        let x = Tensor::from_vec(common::random_bf16(&mut rng, rows * k), &[rows, k]).unwrap();
        let (q_ref, s_ref) = ops::act_quant_fp8(&x).unwrap();
        let xd = x.to_device(&dev).unwrap();
        for imp in [ActQuantImpl::Cuda, ActQuantImpl::TileLang] {
            if imp == ActQuantImpl::TileLang && k % 32 != 0 {
                let e = ops::act_quant_fp8_with(&xd, imp).unwrap_err();
                assert!(matches!(e, Error::Shape { tensor: "x", .. }), "{e}");
                continue;
            }
            let (q, s) = ops::act_quant_fp8_with(&xd, imp).unwrap();
            assert_eq!(
                q.to_vec::<E4M3>().unwrap(),
                q_ref.to_vec::<E4M3>().unwrap(),
                "{imp:?} q {rows}x{k}"
            );
            assert_eq!(
                s.to_vec::<E8M0>().unwrap(),
                s_ref.to_vec::<E8M0>().unwrap(),
                "{imp:?} scale {rows}x{k}"
            );
            if imp == ActQuantImpl::Cuda && rows > 0 {
                dump(&format!("act_quant_{rows}x{k}_x"), &x);
                dump(&format!("act_quant_{rows}x{k}_q"), &q);
                dump(&format!("act_quant_{rows}x{k}_s"), &s);
            }
        }
    }
}

/// ±Inf and NaN activations (issue 15): an Inf saturates to ±448 with
/// the block's scale at 2^127 (its 2^-127 multiplier a subnormal, not 0:
/// Inf · 0 would be NaN), a NaN codes as 0x7F and is left out of the
/// block's amax, on both CUDA quantisers, bitwise the CPU's. Blocks: Inf
/// alone, −Inf among finite values, NaN among finite values, NaN and Inf
/// together, a block of only NaN.
#[test]
fn act_quant_saturates_inf_and_codes_nan_like_the_cpu() {
    let dev = gpu();
    let mut rng = common::rng("act_quant_special_cuda");
    let (rows, k) = (3, 5 * 32);
    let mut v = common::random_bf16(&mut rng, rows * k);
    for r in 0..rows {
        let row = &mut v[r * k..(r + 1) * k];
        row[0] = bf16::INFINITY;
        row[32 + 7] = bf16::NEG_INFINITY;
        row[64 + 31] = bf16::NAN;
        row[96] = bf16::NAN;
        row[96 + 1] = bf16::INFINITY;
        for x in &mut row[128..160] {
            *x = bf16::NAN;
        }
    }
    let x = Tensor::from_vec(v, &[rows, k]).unwrap();
    let (q_ref, s_ref) = ops::act_quant_fp8(&x).unwrap();
    let q_ref = q_ref.to_vec::<E4M3>().unwrap();
    // The CPU reference itself: Inf → ±448 (0x7E / 0xFE) at scale 2^127.
    assert_eq!(q_ref[0].0, 0x7E);
    assert_eq!(q_ref[32 + 7].0, 0xFE);
    assert_eq!(s_ref.to_vec::<E8M0>().unwrap()[0].0, 254);
    let xd = x.to_device(&dev).unwrap();
    for imp in [ActQuantImpl::Cuda, ActQuantImpl::TileLang] {
        let (q, s) = ops::act_quant_fp8_with(&xd, imp).unwrap();
        assert_eq!(q.to_vec::<E4M3>().unwrap(), q_ref, "{imp:?} q");
        assert_eq!(
            s.to_vec::<E8M0>().unwrap(),
            s_ref.to_vec::<E8M0>().unwrap(),
            "{imp:?} scale"
        );
    }
}

#[test]
fn rms_norm_matches_the_cpu_reference_within_one_ulp() {
    let dev = gpu();
    let mut rng = common::rng("rms_norm_cuda");
    for &(rows, dim) in &[
        (1, 5120),
        (7, 5120),
        (64, 512),
        (129, 1280),
        (3, 33),
        (2, 4104),
        (1, 1),
        (300, 4096),
        (0, 64),
    ] {
        for eps in [1e-20f32, 1e-6] {
            let x = Tensor::from_vec(
                common::random_activations(&mut rng, rows * dim, 3.0),
                &[rows, dim],
            )
            .unwrap();
            let w =
                Tensor::from_vec(common::random_activations(&mut rng, dim, 1.0), &[dim]).unwrap();
            let want = ops::rms_norm(&x, &w, eps)
                .unwrap()
                .to_vec::<bf16>()
                .unwrap();
            let y = ops::rms_norm(
                &x.to_device(&dev).unwrap(),
                &w.to_device(&dev).unwrap(),
                eps,
            )
            .unwrap();
            let got = y.to_vec::<bf16>().unwrap();
            // Only the fp32 summation order differs: at most one BF16 ulp.
            for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                assert!(!g.is_nan(), "{rows}x{dim}: element {i} not written");
                assert!(
                    common::bf16_ulps(*g, *r) <= 1,
                    "{rows}x{dim} eps {eps}: element {i}: {g} vs {r}"
                );
            }
            if rows > 0 {
                assert!(calc_diff(&common::to_f64(&got), &common::to_f64(&want)) < 1e-6);
                if eps == 1e-20 {
                    dump(&format!("rms_norm_{rows}x{dim}_x"), &x);
                    dump(&format!("rms_norm_{rows}x{dim}_w"), &w);
                    dump(&format!("rms_norm_{rows}x{dim}_y"), &y);
                }
            }
        }
    }
}

#[test]
fn rms_norm_rows_do_not_depend_on_the_batch() {
    let dev = gpu();
    let mut rng = common::rng("rms_norm_batch_invariance");
    let dim = 5120;
    let x = common::random_activations(&mut rng, 64 * dim, 3.0);
    let w = Tensor::from_vec(common::random_activations(&mut rng, dim, 1.0), &[dim])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let all = ops::rms_norm(
        &Tensor::from_vec(x.clone(), &[64, dim])
            .unwrap()
            .to_device(&dev)
            .unwrap(),
        &w,
        1e-20,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    for r in [0usize, 17, 63] {
        let one = Tensor::from_vec(x[r * dim..(r + 1) * dim].to_vec(), &[1, dim])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let got = ops::rms_norm(&one, &w, 1e-20)
            .unwrap()
            .to_vec::<bf16>()
            .unwrap();
        assert_eq!(got, all[r * dim..(r + 1) * dim], "row {r}");
    }
}

/// V4.1's norm widths, then the smallest and an odd multiple of 32.
const FUSED_DIMS: &[usize] = &[5120, 1280, 512, 4096, 8192, 32, 96];
/// 4000 rows: 7–8 a CTA on the H200 (528 resident CTAs), so the persistent
/// kernel reuses every one of its three stages and takes each barrier back
/// to parity 0.
const FUSED_ROWS: &[usize] = &[1, 3, 64, 257, 4000];

/// Random activations with, from 3 rows on, an all-zero row 1 (y = 0, the
/// amax floor) and a row 2 so small that eps dominates the mean square.
fn fused_input(rng: &mut rand::rngs::StdRng, rows: usize, dim: usize) -> Tensor {
    let mut x = common::random_activations(rng, rows * dim, 3.0);
    if rows >= 3 {
        x[dim..2 * dim].fill(bf16::ZERO);
        for v in &mut x[2 * dim..3 * dim] {
            *v = bf16::from_f32(v.to_f32() * 2f32.powi(-60));
        }
    }
    Tensor::from_vec(x, &[rows, dim]).unwrap()
}

#[test]
fn rms_norm_act_quant_matches_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("rms_norm_act_quant_cuda");
    for &rows in FUSED_ROWS {
        for &dim in FUSED_DIMS {
            for eps in [1e-20f32, 1e-6] {
                let x = fused_input(&mut rng, rows, dim);
                let w = Tensor::from_vec(common::random_activations(&mut rng, dim, 1.0), &[dim])
                    .unwrap();
                let (y_ref, _, _) = ops::rms_norm_act_quant_fp8(&x, &w, eps).unwrap();
                let want = y_ref.to_vec::<bf16>().unwrap();
                let (y, q, s) = ops::rms_norm_act_quant_fp8(
                    &x.to_device(&dev).unwrap(),
                    &w.to_device(&dev).unwrap(),
                    eps,
                )
                .unwrap();
                let case = format!("{rows}x{dim} eps {eps}");
                assert_eq!(y.shape(), &[rows, dim], "{case}");
                assert_eq!(s.shape(), &[rows, dim / 32], "{case}");
                let got = y.to_vec::<bf16>().unwrap();
                // Only the fp32 summation order differs: at most one BF16 ulp.
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    assert!(!g.is_nan(), "{case}: y element {i} not written");
                    assert!(
                        common::bf16_ulps(*g, *r) <= 1,
                        "{case}: y element {i}: {g} vs {r}"
                    );
                }
                assert!(
                    calc_diff(&common::to_f64(&got), &common::to_f64(&want)) < 1e-6,
                    "{case}"
                );
                // q and scale: bitwise the CPU quantiser of the GPU's own y,
                // so a one-ulp difference in y cannot fail them.
                let (q_ref, s_ref) =
                    ops::act_quant_fp8(&Tensor::from_vec(got, &[rows, dim]).unwrap()).unwrap();
                let (qv, sv) = (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
                // 0x7F/0xFF are e4m3's NaN codes and 0xFF E8M0's: the poison.
                if let Some(i) = qv.iter().position(|v| v.0 & 0x7F == 0x7F) {
                    panic!("{case}: q element {i} not written ({:#04x})", qv[i].0);
                }
                if let Some(i) = sv.iter().position(|v| v.0 == 0xFF) {
                    panic!("{case}: scale element {i} not written");
                }
                assert_eq!(qv, q_ref.to_vec::<E4M3>().unwrap(), "{case}: q");
                assert_eq!(sv, s_ref.to_vec::<E8M0>().unwrap(), "{case}: scale");
                if eps == 1e-20 && rows <= 64 {
                    let name = format!("rms_norm_act_quant_{rows}x{dim}");
                    dump(&format!("{name}_x"), &x);
                    dump(&format!("{name}_w"), &w);
                    dump(&format!("{name}_y"), &y);
                    dump(&format!("{name}_q"), &q);
                    dump(&format!("{name}_s"), &s);
                }
            }
        }
    }
}

#[test]
fn rms_norm_act_quant_rows_do_not_depend_on_the_batch() {
    let dev = gpu();
    let mut rng = common::rng("rms_norm_act_quant_batch_invariance");
    let (rows, dim) = (64, 5120);
    let x = common::random_activations(&mut rng, rows * dim, 3.0);
    let w = Tensor::from_vec(common::random_activations(&mut rng, dim, 1.0), &[dim])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let to_dev = |v: &[bf16], r: usize| {
        Tensor::from_vec(v.to_vec(), &[r, dim])
            .unwrap()
            .to_device(&dev)
            .unwrap()
    };
    let (y, q, s) = ops::rms_norm_act_quant_fp8(&to_dev(&x, rows), &w, 1e-20).unwrap();
    let (y, q, s) = (
        y.to_vec::<bf16>().unwrap(),
        q.to_vec::<E4M3>().unwrap(),
        s.to_vec::<E8M0>().unwrap(),
    );
    for r in [0usize, 17, 63] {
        let (y1, q1, s1) =
            ops::rms_norm_act_quant_fp8(&to_dev(&x[r * dim..(r + 1) * dim], 1), &w, 1e-20).unwrap();
        assert_eq!(
            y1.to_vec::<bf16>().unwrap(),
            y[r * dim..(r + 1) * dim],
            "y row {r}"
        );
        assert_eq!(
            q1.to_vec::<E4M3>().unwrap(),
            q[r * dim..(r + 1) * dim],
            "q row {r}"
        );
        let sb = dim / 32;
        assert_eq!(
            s1.to_vec::<E8M0>().unwrap(),
            s[r * sb..(r + 1) * sb],
            "scale row {r}"
        );
    }
}

#[test]
fn rms_norm_act_quant_into_checks_its_outputs() {
    let dev = gpu();
    let x = Tensor::from_vec(vec![bf16::ONE; 128], &[2, 64])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let w = Tensor::from_vec(vec![bf16::ONE; 64], &[64])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let mut y = Tensor::empty(&dev, deepinfer::DType::BF16, &[2, 64]).unwrap();
    let mut q = Tensor::empty(&dev, deepinfer::DType::F8E4M3, &[2, 64]).unwrap();
    let mut s = Tensor::empty(&dev, deepinfer::DType::E8M0, &[2, 2]).unwrap();
    let mut host_q = Tensor::empty(&Device::Cpu, deepinfer::DType::F8E4M3, &[2, 64]).unwrap();
    let e =
        ops::rms_norm_act_quant_fp8_into(&x, &w, 1e-20, &mut y, &mut host_q, &mut s).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "q", .. }),
        "{e}"
    );
    let mut bad_s = Tensor::empty(&dev, deepinfer::DType::E8M0, &[2, 64]).unwrap();
    let e =
        ops::rms_norm_act_quant_fp8_into(&x, &w, 1e-20, &mut y, &mut q, &mut bad_s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "scale",
                ..
            }
        ),
        "{e}"
    );
    let host_w = Tensor::from_vec(vec![bf16::ONE; 64], &[64]).unwrap();
    let e = ops::rms_norm_act_quant_fp8(&x, &host_w, 1e-20).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );
    ops::rms_norm_act_quant_fp8_into(&x, &w, 1e-20, &mut y, &mut q, &mut s).unwrap();
    // x = w = 1: y = 1, amax 1 -> e = ceil(log2(1/448)) = -8, q = 256 (0x78).
    assert!(y.to_vec::<bf16>().unwrap().iter().all(|v| *v == bf16::ONE));
    assert!(q.to_vec::<E4M3>().unwrap().iter().all(|v| v.0 == 0x78));
    assert!(s.to_vec::<E8M0>().unwrap().iter().all(|v| v.0 == 127 - 8));
}

#[test]
fn into_variants_check_their_outputs() {
    let dev = gpu();
    let x = Tensor::from_vec(vec![bf16::ONE; 64], &[2, 32])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let mut bad_q = Tensor::empty(&dev, deepinfer::DType::F8E4M3, &[2, 31]).unwrap();
    let mut s = Tensor::empty(&dev, deepinfer::DType::E8M0, &[2, 1]).unwrap();
    let e = ops::act_quant_fp8_into(&x, &mut bad_q, &mut s, ActQuantImpl::Cuda).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "q", .. }), "{e}");
    let mut host_q = Tensor::empty(&Device::Cpu, deepinfer::DType::F8E4M3, &[2, 32]).unwrap();
    let e = ops::act_quant_fp8_into(&x, &mut host_q, &mut s, ActQuantImpl::Cuda).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "q", .. }),
        "{e}"
    );
    let w = Tensor::from_vec(vec![bf16::ONE; 32], &[32]).unwrap();
    let e = ops::rms_norm(&x, &w, 1e-20).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_missing_kernel_name_is_a_typed_error() {
    let Device::Cuda(dev) = gpu() else {
        unreachable!()
    };
    let bogus = KernelRef {
        family: &kernels::NORM,
        name: "no_such_kernel",
        pdl: false,
    };
    let e = dev.function(bogus).unwrap_err();
    assert!(
        matches!(&e, Error::KernelNotFound { family, kernel } if family == "norm" && kernel == "no_such_kernel"),
        "{e}"
    );
    assert!(dev.function(kernels::norm::RMS_NORM_BF16_VEC8).is_ok());
}

#[test]
fn truncated_or_corrupt_images_are_refused_before_or_by_the_driver() {
    let Device::Cuda(dev) = gpu() else {
        unreachable!()
    };
    let image = kernels::QUANT.image;
    for (what, bytes) in [
        ("empty", &image[..0]),
        ("truncated", &image[..image.len() / 2]),
        ("header only", &image[..16]),
    ] {
        let e = dev.load_image("quant", bytes).unwrap_err();
        assert!(
            matches!(&e, Error::BadKernelImage { family, .. } if family == "quant"),
            "{what}: {e}"
        );
    }
    // Framing intact, ELF header of every cubin destroyed: refused before the driver.
    let mut corrupt = image.to_vec();
    let entries = deepinfer::device::fatbin::validate(image).unwrap();
    let mut at = 16;
    for e in &entries {
        let header = u32::from_le_bytes(corrupt[at + 4..at + 8].try_into().unwrap()) as usize;
        corrupt[at + header + 4..at + header + 64].fill(0xA5);
        at += header + e.payload_bytes as usize;
    }
    let e = dev.load_image("quant", &corrupt).unwrap_err();
    assert!(e.to_string().contains("64-bit little-endian"), "{e}");
    // Deep corruption with every header intact: the registry checksum catches it.
    let mut deep = image.to_vec();
    let mid = deep.len() / 2;
    deep[mid] ^= 0x5A;
    let family: &'static kernels::Family = Box::leak(Box::new(kernels::Family {
        name: "quant_corrupt",
        image: Box::leak(deep.into_boxed_slice()),
        kernels: kernels::QUANT.kernels,
        pdl: kernels::QUANT.pdl,
        archs: kernels::QUANT.archs,
        checksum: kernels::QUANT.checksum,
    }));
    let e = dev.module(family).unwrap_err();
    assert!(
        matches!(&e, Error::BadKernelImage { why, .. } if why.contains("checksum")),
        "{e}"
    );
}

/// `ops::mxfp8_dequantize` on the GPU against the CPU reference, bitwise:
/// every e4m3 code (NaN codes included) and every E8M0 byte (the NaN scale,
/// the subnormal 2^-127 and exponents that under- and overflow BF16), over
/// shapes with and without 32-tails. The output is allocated poisoned.
#[test]
fn mxfp8_dequantize_is_bitwise_equal_to_the_cpu_reference() {
    use rand::Rng;
    let dev = gpu();
    let mut rng = common::rng("mxfp8_dequantize_cuda");
    for &(n, k) in &[
        (64usize, 64usize),
        (33, 70),
        (1, 1),
        (1024, 4096),
        (31, 513),
        (0, 32),
    ] {
        let w: Vec<E4M3> = (0..n * k).map(|_| E4M3(rng.random())).collect();
        let s: Vec<E8M0> = (0..n.div_ceil(32) * k.div_ceil(32))
            .map(|_| E8M0(rng.random()))
            .collect();
        let w = Tensor::from_vec(w, &[n, k]).unwrap();
        let s = Tensor::from_vec(s, &[n.div_ceil(32), k.div_ceil(32)]).unwrap();
        let want = ops::mxfp8_dequantize(&w, &s).unwrap();
        let got = ops::mxfp8_dequantize(&w.to_device(&dev).unwrap(), &s.to_device(&dev).unwrap())
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
        let (a, b) = (
            got.as_slice::<bf16>().unwrap(),
            want.as_slice::<bf16>().unwrap(),
        );
        let bad = a
            .iter()
            .zip(b)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(bad, None, "{n}x{k}: first difference {bad:?}");
        assert_eq!(a.len(), n * k);
    }
}
