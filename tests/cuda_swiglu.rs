//! The fused TileLang SwiGLU + FP8 1×32 quantiser on the GPU against the CPU
//! reference, bitwise: q and scale of BF16(SiLU(min(g, L)) · clamp(u, −L, L)
//! · weight), g and u read from the interleaved gate-up tensor, for fresh
//! random inputs (values beyond ±L, far-negative g whose
//! e^−g overflows fp32, many binades), random and unit routing weights, at
//! V4.1's intermediate width and others, and every BF16 gate value at three
//! limits (the kernel looks σ up in a table). Outputs are NaN-poisoned before the
//! kernel runs, so every element must be written. Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::device::CudaDevice;
use deepinfer::{DType, Device, E4M3, E8M0, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const LIMIT: f32 = 10.0;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

/// W1/W3-output-like BF16 values: mostly activations of scale 4, with values
/// beyond ±L, exactly ±L, zeros, far-negative values (e^−g overflows fp32
/// below −88.7) and magnitudes over many binades.
fn swiglu_input(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let acts = common::random_activations(rng, n, 4.0);
    let wide = common::random_bf16(rng, n);
    (0..n)
        .map(|i| {
            let r: f32 = rng.random();
            let sign = if rng.random::<bool>() { 1.0 } else { -1.0 };
            match r {
                r if r < 0.10 => bf16::from_f32(sign * rng.random_range(LIMIT..64.0)),
                r if r < 0.15 => bf16::from_f32(-rng.random_range(64.0..400.0)),
                r if r < 0.17 => bf16::from_f32(sign * LIMIT),
                r if r < 0.18 => bf16::ZERO,
                r if r < 0.28 => wide[i],
                _ => acts[i],
            }
        })
        .collect()
}

/// V4.1's intermediate width, then the smallest, a typical and a wide one.
const INTERS: &[usize] = &[2304, 512, 4096, 32];
const ROWS: &[usize] = &[1, 3, 64, 257];

#[test]
fn swiglu_act_quant_is_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("swiglu_act_quant_cuda");
    for &rows in ROWS {
        for &inter in INTERS {
            for ones in [false, true] {
                let gu = swiglu_input(&mut rng, rows * 2 * inter);
                let w: Vec<f32> = (0..rows)
                    .map(|_| {
                        if ones {
                            1.0
                        } else {
                            rng.random_range(0.0..2.5)
                        }
                    })
                    .collect();
                let case = format!("{rows}x{inter} unit weights {ones}");
                check(&dev, gu, w, inter, LIMIT, true, &case);
            }
        }
    }
}

/// The GPU result of `gu` `[rows, 2 · inter]` and weights `w` equals the CPU
/// reference bit for bit. With `finite`, also that no output holds the NaN
/// poison (finite inputs never produce NaN codes).
fn check(
    dev: &Device,
    gu: Vec<bf16>,
    w: Vec<f32>,
    inter: usize,
    limit: f32,
    finite: bool,
    case: &str,
) {
    let rows = w.len();
    let gu = Tensor::from_vec(gu, &[rows, 2 * inter]).unwrap();
    let w = Tensor::from_vec(w, &[rows]).unwrap();
    let (q_ref, s_ref) = ops::swiglu_act_quant_fp8(&gu, &w, limit).unwrap();
    let (q, s) = ops::swiglu_act_quant_fp8(
        &gu.to_device(dev).unwrap(),
        &w.to_device(dev).unwrap(),
        limit,
    )
    .unwrap();
    assert_eq!(q.shape(), &[rows, inter], "{case}");
    assert_eq!(s.shape(), &[rows, inter / 32], "{case}");
    let (qv, sv) = (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
    // 0x7F/0xFF are e4m3's NaN codes and 0xFF E8M0's: the poison.
    // Finite inputs never produce them (NaN h needs g = −∞, a NaN u or a
    // non-finite weight: a NaN or +∞ g becomes L and an infinite u ±L).
    if let Some(i) = qv.iter().position(|v| finite && v.0 & 0x7F == 0x7F) {
        panic!("{case}: q element {i} not written ({:#04x})", qv[i].0);
    }
    if let Some(i) = sv.iter().position(|v| v.0 == 0xFF) {
        panic!("{case}: scale element {i} not written");
    }
    let (qr, sr) = (
        q_ref.to_vec::<E4M3>().unwrap(),
        s_ref.to_vec::<E8M0>().unwrap(),
    );
    if let Some(i) = (0..qv.len()).find(|&i| qv[i] != qr[i]) {
        let (r, c) = (i / inter, i % inter);
        let at = r * 2 * inter + (c / 32) * 64 + c % 32;
        let v = gu.as_slice::<bf16>().unwrap();
        panic!(
            "{case}: q element {i} (row {r}, col {c}): gpu {:#04x}, cpu {:#04x}; g {}, u {}",
            qv[i].0,
            qr[i].0,
            v[at],
            v[at + 32],
        );
    }
    assert_eq!(sv, sr, "{case}: scale");
}

/// Every one of the 65,536 BF16 patterns as g (NaN, ±∞, subnormals and ±0
/// included), shuffled over 32 rows × 2048, u from the model-like mix: at
/// V4.1's limit, at a limit that is no BF16 value (g' = L is then no table
/// entry: the kernel's σ(L) path), and at a limit above 2^7 (where σ
/// saturates to 1). g = −∞ gives NaN h (−∞ · 0), q 0x7F on both sides; a
/// NaN or +∞ g takes the limit.
#[test]
fn every_bf16_gate_value_matches_the_reference() {
    let dev = gpu();
    let mut rng = common::rng("swiglu_every_gate");
    let (rows, inter) = (32, 2048);
    for limit in [LIMIT, 7.3, 300.0] {
        let mut g: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        g.shuffle(&mut rng);
        let u = swiglu_input(&mut rng, rows * inter);
        let gu: Vec<bf16> = g
            .chunks(32)
            .zip(u.chunks(32))
            .flat_map(|(g, u)| g.iter().chain(u).copied())
            .collect();
        let w: Vec<f32> = (0..rows).map(|_| rng.random_range(0.0..2.5)).collect();
        check(
            &dev,
            gu,
            w,
            inter,
            limit,
            false,
            &format!("every g, limit {limit}"),
        );
    }
}

/// Special values in g and u alike (NaN of both signs and other payloads,
/// ±∞, ±0, BF16 subnormals, ±L and its neighbours, ±3·10^38) among
/// model-like ones, with weights that are negative, ±0, subnormal, NaN and
/// 10^30 (h overflows to ±∞: the scale saturates at 2^127 and q at ±448 by
/// the conversion alone), over 67 rows (a partial last tile) at two widths.
#[test]
fn special_values_match_the_reference() {
    let dev = gpu();
    let mut rng = common::rng("swiglu_special_values");
    let specials: Vec<bf16> = [
        0x7FC0u16, 0xFFC0, 0x7F81, 0xFFFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x0040,
    ]
    .into_iter()
    .map(bf16::from_bits)
    .chain(
        [LIMIT, -LIMIT, 10.0625, -10.0625, 9.9375, 3e38, -3e38, 1e-30]
            .into_iter()
            .map(bf16::from_f32),
    )
    .collect();
    let weights = [-1.5f32, 0.0, -0.0, 1e-40, f32::NAN, 1e30, -1e30, 1.0];
    for inter in [2304usize, 32] {
        let rows = 67;
        let mut gu = swiglu_input(&mut rng, rows * 2 * inter);
        for v in gu.iter_mut() {
            if rng.random::<f32>() < 0.2 {
                *v = specials[rng.random_range(0..specials.len())];
            }
        }
        let w: Vec<f32> = (0..rows)
            .map(|r| {
                if r % 3 == 0 {
                    weights[rng.random_range(0..weights.len())]
                } else {
                    rng.random_range(0.0..2.5)
                }
            })
            .collect();
        check(
            &dev,
            gu,
            w,
            inter,
            LIMIT,
            false,
            &format!("special values, {rows}x{inter}"),
        );
    }
}

/// More tiles than the device holds CTAs at once (2500 × 2304: 180,000
/// groups, 2,813 tiles of 64, the last one partial): each persistent CTA
/// walks several tiles (on the H200, 7 or 8: both parities of a CTA's
/// tile pairs).
#[test]
fn large_batches_walk_several_tiles_a_cta() {
    let dev = gpu();
    let mut rng = common::rng("swiglu_persistent");
    for (rows, inter) in [(2500, 2304), (1531, 4096)] {
        let gu = swiglu_input(&mut rng, rows * 2 * inter);
        let w: Vec<f32> = (0..rows).map(|_| rng.random_range(0.0..2.5)).collect();
        check(&dev, gu, w, inter, LIMIT, true, &format!("{rows}x{inter}"));
    }
}

#[test]
fn rows_do_not_depend_on_the_batch() {
    let dev = gpu();
    let mut rng = common::rng("swiglu_act_quant_batch_invariance");
    let (rows, inter) = (64, 2304);
    let gu = swiglu_input(&mut rng, rows * 2 * inter);
    let w: Vec<f32> = (0..rows).map(|_| rng.random_range(0.0..2.5)).collect();
    let run = |r0: usize, n: usize| {
        let width = 2 * inter;
        let gut = Tensor::from_vec(gu[r0 * width..(r0 + n) * width].to_vec(), &[n, width])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let wt = Tensor::from_vec(w[r0..r0 + n].to_vec(), &[n])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let (q, s) = ops::swiglu_act_quant_fp8(&gut, &wt, LIMIT).unwrap();
        (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap())
    };
    let (q, s) = run(0, rows);
    let sb = inter / 32;
    for r in [0usize, 17, 63] {
        let (q1, s1) = run(r, 1);
        assert_eq!(q1, q[r * inter..(r + 1) * inter], "q row {r}");
        assert_eq!(s1, s[r * sb..(r + 1) * sb], "scale row {r}");
    }
}

#[test]
fn into_checks_its_outputs_and_inputs() {
    let dev = gpu();
    let on = |t: Tensor| t.to_device(&dev).unwrap();
    let g = on(Tensor::from_vec(vec![bf16::ONE; 256], &[2, 128]).unwrap());
    let w = on(Tensor::from_vec(vec![1.0f32; 2], &[2]).unwrap());
    let mut q = Tensor::empty(&dev, DType::F8E4M3, &[2, 64]).unwrap();
    let mut s = Tensor::empty(&dev, DType::E8M0, &[2, 2]).unwrap();
    let mut host_q = Tensor::empty(&Device::Cpu, DType::F8E4M3, &[2, 64]).unwrap();
    let e = ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut host_q, &mut s).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { tensor: "q", .. }),
        "{e}"
    );
    let host_w = Tensor::from_vec(vec![1.0f32; 2], &[2]).unwrap();
    let e = ops::swiglu_act_quant_fp8(&g, &host_w, LIMIT).unwrap_err();
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
    let mut bad_s = Tensor::empty(&dev, DType::E8M0, &[2, 64]).unwrap();
    let e = ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut q, &mut bad_s).unwrap_err();
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
    ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut q, &mut s).unwrap();
    let (q_ref, s_ref) = ops::swiglu_act_quant_fp8(
        &g.to_device(&Device::Cpu).unwrap(),
        &w.to_device(&Device::Cpu).unwrap(),
        LIMIT,
    )
    .unwrap();
    assert_eq!(q.to_vec::<E4M3>().unwrap(), q_ref.to_vec::<E4M3>().unwrap());
    assert_eq!(s.to_vec::<E8M0>().unwrap(), s_ref.to_vec::<E8M0>().unwrap());
    // No rows: nothing to launch, empty outputs.
    let empty = |dt, shape: &[usize]| Tensor::empty(&dev, dt, shape).unwrap();
    let (q0, s0) = ops::swiglu_act_quant_fp8(
        &empty(DType::BF16, &[0, 2 * 2304]),
        &empty(DType::F32, &[0]),
        LIMIT,
    )
    .unwrap();
    assert_eq!((q0.shape(), s0.shape()), (&[0, 2304][..], &[0, 72][..]));
}
