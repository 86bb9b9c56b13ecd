//! The fused SwiGLU + FP8 1×32 quantiser on the CPU backend: it is the
//! composition it stands for (`moe::swiglu` per row with that row's routing
//! weight, then the quantiser), over V4.1's intermediate width and odd
//! shapes, with inputs beyond ±L and far-negative g; a hand-computed case;
//! typed validation errors naming the offending tensor or argument; and the
//! premise of a table-driven σ (constant outside 32 binades of BF16 input).

mod common;

use deepinfer::cpu_backend::{self, moe};
use deepinfer::numerics::{e4m3_to_f32, e8m0_to_f32};
use deepinfer::{DType, Device, E4M3, E8M0, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

const LIMIT: f32 = 10.0;

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

/// g and u (`[rows, inter]` row-major) as the op's gate-up input of
/// `shape` (last dimension 2·inter): g's 32-column block b, then u's.
fn gate_up(g: &[bf16], u: &[bf16], shape: &[usize]) -> Tensor {
    let v: Vec<bf16> = g
        .chunks(32)
        .zip(u.chunks(32))
        .flat_map(|(a, b)| a.iter().chain(b).copied())
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn weights(rng: &mut StdRng, rows: usize, ones: bool) -> Vec<f32> {
    (0..rows)
        .map(|_| {
            if ones {
                1.0
            } else {
                rng.random_range(0.0..2.5)
            }
        })
        .collect()
}

#[test]
fn fused_op_is_swiglu_per_row_then_act_quant() {
    let mut rng = common::rng("swiglu_act_quant_cpu");
    for (rows, inter) in [
        (1, 2304),
        (3, 2304),
        (64, 512),
        (5, 4096),
        (7, 32),
        (2, 8192),
    ] {
        for ones in [false, true] {
            let g = swiglu_input(&mut rng, rows * inter);
            let u = swiglu_input(&mut rng, rows * inter);
            let w = weights(&mut rng, rows, ones);
            let (q, s) = ops::swiglu_act_quant_fp8(
                &gate_up(&g, &u, &[rows, 2 * inter]),
                &Tensor::from_vec(w.clone(), &[rows]).unwrap(),
                LIMIT,
            )
            .unwrap();
            assert_eq!(q.shape(), &[rows, inter]);
            assert_eq!(s.shape(), &[rows, inter / 32]);
            let h: Vec<bf16> = (0..rows)
                .flat_map(|r| {
                    let row = r * inter..(r + 1) * inter;
                    moe::swiglu(&g[row.clone()], &u[row], w[r], LIMIT)
                })
                .collect();
            let (q_ref, s_ref) =
                ops::act_quant_fp8(&Tensor::from_vec(h, &[rows, inter]).unwrap()).unwrap();
            let case = format!("{rows}x{inter} ones {ones}");
            assert_eq!(
                q.to_vec::<E4M3>().unwrap(),
                q_ref.to_vec::<E4M3>().unwrap(),
                "{case}: q"
            );
            assert_eq!(
                s.to_vec::<E8M0>().unwrap(),
                s_ref.to_vec::<E8M0>().unwrap(),
                "{case}: scale"
            );
            let (qc, sc) = cpu_backend::swiglu_act_quant_fp8(&g, &u, &w, rows, inter, LIMIT);
            assert_eq!(qc, q.to_vec::<E4M3>().unwrap(), "{case}: cpu_backend q");
            assert_eq!(sc, s.to_vec::<E8M0>().unwrap(), "{case}: cpu_backend scale");
        }
    }
}

#[test]
fn dequantised_output_tracks_an_f64_swiglu() {
    let mut rng = common::rng("swiglu_act_quant_f64");
    let (rows, inter) = (4, 2304);
    let g = swiglu_input(&mut rng, rows * inter);
    let u = swiglu_input(&mut rng, rows * inter);
    let w = weights(&mut rng, rows, false);
    let (q, s) = cpu_backend::swiglu_act_quant_fp8(&g, &u, &w, rows, inter, LIMIT);
    let l = f64::from(LIMIT);
    for (i, (qv, (gv, uv))) in q.iter().zip(g.iter().zip(&u)).enumerate() {
        let gf = gv.to_f64().min(l);
        let uf = uv.to_f64().clamp(-l, l);
        let want = gf / (1.0 + (-gf).exp()) * uf * f64::from(w[i / inter]);
        let sc = f64::from(e8m0_to_f32(s[i / 32]));
        let got = f64::from(e4m3_to_f32(*qv)) * sc;
        // BF16 rounding (≤ 2^-8 relative) then e4m3 rounding (≤ 2^-4/(1 + 2^-4)
        // relative, or half the smallest subnormal step 2^-9 · scale): together
        // ≤ 0.0630 < 2^-9 + 1.01·2^-4 = 0.0651 relative; fp32 adds ~1e-7.
        let tol = want.abs() * (2f64.powi(-9) + 1.01 * 2f64.powi(-4)) + sc * 2f64.powi(-10);
        assert!((got - want).abs() <= tol, "element {i}: {got} vs {want}");
    }
}

#[test]
fn hand_computed_rows() {
    // Row 0: g beyond L is clamped to L, u beyond ±L to ±L, weight 1:
    //   h = ±bf16(10 · σ(10) · 10) = ±bf16(99.99546) = ±100 (bf16 step 0.5 there);
    //   amax 100 -> e = ceil(log2(100/448)) = -2; h · 4 = ±400 is a tie between
    //   the e4m3 values 384 and 416 and rounds to the even code: ±384 (0x7C / 0xFC).
    // Row 1: g = -1000 (e^1000 overflows: σ = 0), weight 0.5: h = -0 or 0,
    //   amax floored at 1e-4 -> e = ceil(log2(1e-4/448)) = -22, q = ±0.
    let inter = 32;
    let mut g = vec![bf16::from_f32(1000.0); inter];
    g.extend(vec![bf16::from_f32(-1000.0); inter]);
    let mut u: Vec<bf16> = (0..inter)
        .map(|i| bf16::from_f32(if i % 2 == 0 { 50.0 } else { -50.0 }))
        .collect();
    u.extend(vec![bf16::from_f32(3.0); inter]);
    let (q, s) = ops::swiglu_act_quant_fp8(
        &gate_up(&g, &u, &[2, 2 * inter]),
        &Tensor::from_vec(vec![1.0f32, 0.5], &[2]).unwrap(),
        LIMIT,
    )
    .unwrap();
    let (q, s) = (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap());
    assert_eq!(s, vec![E8M0(127 - 2), E8M0(127 - 22)]);
    for (i, v) in q[..inter].iter().enumerate() {
        assert_eq!(
            v.0,
            if i % 2 == 0 { 0x7C } else { 0xFC },
            "row 0 element {i}"
        );
    }
    assert!(q[inter..].iter().all(|v| v.0 & 0x7F == 0), "row 1 is ±0");
}

#[test]
fn leading_dimensions_are_rows() {
    let mut rng = common::rng("swiglu_act_quant_leading");
    let (inter, rows) = (64, 6);
    let g = swiglu_input(&mut rng, rows * inter);
    let u = swiglu_input(&mut rng, rows * inter);
    let w = weights(&mut rng, rows, false);
    let wt = Tensor::from_vec(w, &[rows]).unwrap();
    let run = |shape: &[usize]| {
        let (q, s) = ops::swiglu_act_quant_fp8(&gate_up(&g, &u, shape), &wt, LIMIT).unwrap();
        (q.to_vec::<E4M3>().unwrap(), s.to_vec::<E8M0>().unwrap(), s)
    };
    let (q2, s2, _) = run(&[rows, 2 * inter]);
    let (q3, s3, st) = run(&[2, 3, 2 * inter]);
    assert_eq!((q2, s2), (q3, s3));
    assert_eq!(st.shape(), &[2, 3, 2]);
    // No rows: empty outputs, nothing to compute.
    let (q, s) = ops::swiglu_act_quant_fp8(
        &Tensor::from_vec(Vec::<bf16>::new(), &[0, 2 * inter]).unwrap(),
        &Tensor::from_vec(Vec::<f32>::new(), &[0]).unwrap(),
        LIMIT,
    )
    .unwrap();
    assert_eq!((q.shape(), s.shape()), (&[0, inter][..], &[0, 2][..]));
}

fn bf(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![bf16::ONE; shape.iter().product()], shape).unwrap()
}

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![1.0f32; shape.iter().product()], shape).unwrap()
}

#[test]
fn validation_errors_name_the_tensor_or_argument() {
    let op = ops::swiglu_act_quant_fp8;
    let (g, w) = (bf(&[2, 128]), f32s(&[2]));

    let e = op(&f32s(&[2, 128]), &w, LIMIT).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "gu", .. }), "{e}");
    let e = op(&g, &bf(&[2]), LIMIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );

    // The width must be 2 x inter with inter a multiple of 32 (whole pairs
    // of 32-blocks); gu needs rank >= 1.
    for width in [48, 64 + 32, 32] {
        let e = op(&bf(&[2, width]), &w, LIMIT).unwrap_err();
        assert!(
            matches!(e, Error::Shape { tensor: "gu", .. }),
            "width {width}: {e}"
        );
    }
    let e = op(&bf(&[]), &f32s(&[1]), LIMIT).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "gu", .. }), "{e}");
    // One weight per row: length M, rank 1.
    for bad in [f32s(&[3]), f32s(&[1]), f32s(&[2, 1]), f32s(&[])] {
        let e = op(&g, &bad, LIMIT).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Shape {
                    tensor: "weight",
                    ..
                }
            ),
            "{e}"
        );
    }
    for limit in [0.0, -10.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = op(&g, &w, limit).unwrap_err();
        assert!(matches!(e, Error::Argument { arg: "limit", .. }), "{e}");
    }

    // The _into variant checks its outputs.
    let cpu = Device::Cpu;
    let mut q = Tensor::empty(&cpu, DType::F8E4M3, &[2, 64]).unwrap();
    let mut s = Tensor::empty(&cpu, DType::E8M0, &[2, 2]).unwrap();
    let mut bad_q = Tensor::empty(&cpu, DType::F8E4M3, &[2, 32]).unwrap();
    let e = ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut bad_q, &mut s).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "q", .. }), "{e}");
    let mut bad_q = Tensor::empty(&cpu, DType::BF16, &[2, 64]).unwrap();
    let e = ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut bad_q, &mut s).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "q", .. }), "{e}");
    let mut bad_s = Tensor::empty(&cpu, DType::E8M0, &[2, 64]).unwrap();
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
    let mut bad_s = Tensor::empty(&cpu, DType::F8E4M3, &[2, 2]).unwrap();
    let e = ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut q, &mut bad_s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "scale",
                ..
            }
        ),
        "{e}"
    );
    ops::swiglu_act_quant_fp8_into(&g, &w, LIMIT, &mut q, &mut s).unwrap();
    // g = u = w = 1 in every row: h = bf16(SiLU(1)), the quantiser of that.
    let (q_ref, s_ref) = ops::act_quant_fp8(
        &Tensor::from_vec(
            moe::swiglu(&[bf16::ONE; 128], &[bf16::ONE; 128], 1.0, LIMIT),
            &[2, 64],
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(q.to_vec::<E4M3>().unwrap(), q_ref.to_vec::<E4M3>().unwrap());
    assert_eq!(s.to_vec::<E8M0>().unwrap(), s_ref.to_vec::<E8M0>().unwrap());
}

/// The premise of a table-driven σ for the GPU kernels (issue 14): the
/// SwiGLU's σ(g') = 1 / (1 + e^−g') with the correctly rounded exp
/// (`numerics::sigmoid`) takes its input from BF16 g (g' = min(g, L) is g
/// or L), and outside |g| ∈ [2^−25, 2^7) it is a constant of the sign:
/// ½ below 2^−25 (e^−g rounds to 1), 1 at and above 2^7 and at +∞ (e^−g
/// rounds to 0), 0 at and below −2^7 and at −∞ (e^−g overflows). So the
/// 2 × 32 binades × 128 mantissas between (8192 fp32 values, 32 KiB) hold
/// every other value. Checked on all 65,536 BF16 patterns.
#[test]
fn sigmoid_of_a_bf16_input_is_constant_outside_32_binades() {
    let mut inside = 0usize;
    for bits in 0..=u16::MAX {
        let g = bf16::from_bits(bits).to_f32();
        if g.is_nan() {
            continue;
        }
        let s = deepinfer::numerics::sigmoid(g);
        let mag = g.abs();
        if mag < 2f32.powi(-25) {
            assert_eq!(s.to_bits(), 0.5f32.to_bits(), "g {g:e}");
        } else if mag >= 128.0 {
            let want = if g > 0.0 { 1.0f32 } else { 0.0 };
            assert_eq!(s.to_bits(), want.to_bits(), "g {g:e}");
        } else {
            inside += 1;
        }
    }
    assert_eq!(inside, 2 * 32 * 128);
}

/// The GPU SwiGLU's σ table (`numerics::sigmoid_bf16_table`, indexed by
/// `numerics::sigmoid_bf16_index` of g's BF16 bits, the formula the kernel
/// computes) holds `numerics::sigmoid` of every non-NaN BF16 input, bit for
/// bit: the lookup is the reference by construction, with no exp on the GPU.
#[test]
fn sigmoid_table_lookup_is_the_reference_on_every_bf16_input() {
    let table = deepinfer::numerics::sigmoid_bf16_table();
    assert_eq!(table.len(), 2 * deepinfer::numerics::SIGMOID_TABLE_HALF);
    assert_eq!(table.len(), 8196, "the kernel's shared table (TABLE_BYTES)");
    let mut used = vec![false; table.len()];
    for bits in 0..=u16::MAX {
        let g = bf16::from_bits(bits).to_f32();
        if g.is_nan() {
            continue;
        }
        let i = deepinfer::numerics::sigmoid_bf16_index(bits);
        used[i] = true;
        let want = deepinfer::numerics::sigmoid(g);
        assert_eq!(
            table[i].to_bits(),
            want.to_bits(),
            "g {g:e} (bits {bits:#06x}) slot {i}"
        );
    }
    // Every slot is reached by some input (no dead entries hide a bad index).
    assert!(used.iter().all(|&u| u));
}
