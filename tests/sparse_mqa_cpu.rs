//! The sparse MQA op on the CPU: bitwise equal to
//! `cpu_backend::sparse_attention::sparse_mqa` over the decoded rows
//! `[window ‖ compressed]` (compressed entries offset by the window row
//! count, out-of-range entries −1) on fresh random pools and lists with −1,
//! duplicates and out-of-range numbers, window-only layers (Kc = 0), lists
//! that are not a multiple of 64, D 64 and the V4.1 shape; all-empty lists
//! give zeros and lse = +∞; every bad dtype, shape and device is a typed
//! error naming the tensor.

mod common;

use common::attention::{compressed_pool, index_lists, reference, window_pool};
use deepinfer::kv_format;
use deepinfer::{DType, Error, Tensor, ops};
use half::bf16;
use rand::Rng;

#[derive(Clone, Copy)]
struct Case {
    t: usize,
    h: usize,
    d: usize,
    nw: usize,
    kw: usize,
    nc: usize,
    kc: usize,
    holes: f64,
}

fn check(rng: &mut rand::rngs::StdRng, c: &Case, with_compressed: bool) {
    let q = common::random_activations(rng, c.t * c.h * c.d, 1.0);
    let window = window_pool(rng, c.nw, c.d, 1.0);
    let compressed = compressed_pool(rng, c.nc, c.d, 1.0);
    let widx = index_lists(rng, c.t, c.kw, c.nw, c.holes);
    let cidx = index_lists(rng, c.t, c.kc, c.nc, c.holes);
    let sink: Vec<f32> = (0..c.h).map(|_| rng.random_range(-3.0..3.0)).collect();
    let qt = Tensor::from_vec(q.clone(), &[c.t, c.h, c.d]).unwrap();
    let wt = Tensor::from_vec(window.clone(), &[c.nw, kv_format::window_row_bytes(c.d)]).unwrap();
    let wit = Tensor::from_vec(widx.clone(), &[c.t, c.kw]).unwrap();
    let ct = Tensor::from_vec(
        compressed.clone(),
        &[c.nc, kv_format::compressed_row_bytes(c.d)],
    )
    .unwrap();
    let cit = Tensor::from_vec(cidx.clone(), &[c.t, c.kc]).unwrap();
    let st = Tensor::from_vec(sink.clone(), &[c.h]).unwrap();
    let comp = with_compressed.then_some((&ct, &cit));
    let (out, lse) = ops::sparse_mqa(&qt, &wt, &wit, comp, &st).unwrap();
    let cidx_used: &[i32] = if with_compressed { &cidx } else { &[] };
    let (want_out, want_lse) =
        reference(&q, &window, &widx, &compressed, cidx_used, &sink, c.t, c.d);
    let got_out = out.as_slice::<bf16>().unwrap();
    let got_lse = lse.as_slice::<f32>().unwrap();
    let label = format!(
        "T {} H {} D {} Nw {} Kw {} Nc {} Kc {} compressed {with_compressed}",
        c.t, c.h, c.d, c.nw, c.kw, c.nc, c.kc
    );
    assert_eq!(out.shape(), [c.t, c.h, c.d], "{label}");
    assert_eq!(lse.shape(), [c.t, c.h], "{label}");
    for (i, (g, w)) in got_out.iter().zip(&want_out).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{label}: out[{i}]");
    }
    for (i, (g, w)) in got_lse.iter().zip(&want_lse).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{label}: lse[{i}]");
    }
}

#[test]
fn sparse_mqa_is_the_reference_over_the_decoded_rows() {
    let mut rng = common::rng("sparse_mqa_cpu");
    let cases = [
        Case {
            t: 3,
            h: 4,
            d: 64,
            nw: 40,
            kw: 37,
            nc: 50,
            kc: 100,
            holes: 0.3,
        },
        Case {
            t: 1,
            h: 2,
            d: 64,
            nw: 10,
            kw: 0,
            nc: 20,
            kc: 65,
            holes: 0.2,
        },
        Case {
            t: 5,
            h: 3,
            d: 128,
            nw: 7,
            kw: 128,
            nc: 0,
            kc: 3,
            holes: 0.4,
        },
        Case {
            t: 2,
            h: 2,
            d: 64,
            nw: 300,
            kw: 129,
            nc: 1,
            kc: 1,
            holes: 0.1,
        },
        Case {
            t: 2,
            h: 64,
            d: 512,
            nw: 256,
            kw: 128,
            nc: 1024,
            kc: 512,
            holes: 0.1,
        },
    ];
    for c in &cases {
        check(&mut rng, c, true);
        if c.kw > 0 {
            check(&mut rng, &Case { kc: 0, ..*c }, false);
        }
    }
}

#[test]
fn empty_lists_give_zeros_and_infinite_lse() {
    let (t, h, d) = (2, 3, 64);
    let q = Tensor::from_vec(vec![bf16::ONE; t * h * d], &[t, h, d]).unwrap();
    let wt = Tensor::from_vec(
        vec![0u8; 4 * kv_format::window_row_bytes(d)],
        &[4, kv_format::window_row_bytes(d)],
    )
    .unwrap();
    // −1, out of range (4 = Nw) and negative numbers only.
    let wit = Tensor::from_vec(vec![-1, 4, i32::MIN, 7, -1, 4, 100, i32::MAX], &[t, 4]).unwrap();
    let st = Tensor::from_vec(vec![0.5f32, -2.0, 10.0], &[h]).unwrap();
    let (out, lse) = ops::sparse_mqa(&q, &wt, &wit, None, &st).unwrap();
    assert!(
        out.as_slice::<bf16>()
            .unwrap()
            .iter()
            .all(|v| v.to_bits() == 0)
    );
    assert!(
        lse.as_slice::<f32>()
            .unwrap()
            .iter()
            .all(|&v| v == f32::INFINITY)
    );
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_tensor() {
    let (t, h, d) = (2, 4, 64);
    let (wb, cb) = (
        kv_format::window_row_bytes(d),
        kv_format::compressed_row_bytes(d),
    );
    let q = Tensor::from_vec(vec![bf16::ONE; t * h * d], &[t, h, d]).unwrap();
    let w = Tensor::from_vec(vec![0u8; 3 * wb], &[3, wb]).unwrap();
    let wi = Tensor::from_vec(vec![0i32; t * 2], &[t, 2]).unwrap();
    let c = Tensor::from_vec(vec![0u8; 3 * cb], &[3, cb]).unwrap();
    let ci = Tensor::from_vec(vec![0i32; t * 5], &[t, 5]).unwrap();
    let s = Tensor::from_vec(vec![0f32; h], &[h]).unwrap();
    assert!(ops::sparse_mqa(&q, &w, &wi, Some((&c, &ci)), &s).is_ok());

    let shape = |r: Result<(Tensor, Tensor), Error>, name: &str| match r {
        Err(Error::Shape {
            op: "sparse_mqa",
            tensor,
            ..
        }) if tensor == name => {}
        other => panic!(
            "expected a shape error on `{name}`, got {:?}",
            other.map(|_| ())
        ),
    };
    let dtype = |r: Result<(Tensor, Tensor), Error>, name: &str| match r {
        Err(Error::DType {
            op: "sparse_mqa",
            tensor,
            ..
        }) if tensor == name => {}
        other => panic!(
            "expected a dtype error on `{name}`, got {:?}",
            other.map(|_| ())
        ),
    };
    let f32s =
        |shape: &[usize]| Tensor::from_vec(vec![0f32; shape.iter().product()], shape).unwrap();
    let u8s = |shape: &[usize]| Tensor::from_vec(vec![0u8; shape.iter().product()], shape).unwrap();
    let i32s =
        |shape: &[usize]| Tensor::from_vec(vec![0i32; shape.iter().product()], shape).unwrap();
    let bf16s =
        |shape: &[usize]| Tensor::from_vec(vec![bf16::ONE; shape.iter().product()], shape).unwrap();

    // Dtypes.
    dtype(ops::sparse_mqa(&f32s(&[t, h, d]), &w, &wi, None, &s), "q");
    dtype(
        ops::sparse_mqa(&q, &i32s(&[3, wb / 4]), &wi, None, &s),
        "window",
    );
    dtype(
        ops::sparse_mqa(&q, &w, &u8s(&[t, 2]), None, &s),
        "window_idx",
    );
    dtype(
        ops::sparse_mqa(&q, &w, &wi, Some((&bf16s(&[3, cb / 2]), &ci)), &s),
        "compressed",
    );
    dtype(
        ops::sparse_mqa(&q, &w, &wi, Some((&c, &f32s(&[t, 5]))), &s),
        "compressed_idx",
    );
    dtype(ops::sparse_mqa(&q, &w, &wi, None, &bf16s(&[h])), "sink");
    // Shapes.
    shape(ops::sparse_mqa(&bf16s(&[t, h, 96]), &w, &wi, None, &s), "q");
    shape(ops::sparse_mqa(&bf16s(&[t, 0, d]), &w, &wi, None, &s), "q");
    shape(ops::sparse_mqa(&bf16s(&[t * h, d]), &w, &wi, None, &s), "q");
    shape(
        ops::sparse_mqa(&q, &u8s(&[3, wb + 1]), &wi, None, &s),
        "window",
    );
    shape(
        ops::sparse_mqa(&q, &u8s(&[3 * wb]), &wi, None, &s),
        "window",
    );
    shape(
        ops::sparse_mqa(&q, &w, &i32s(&[t + 1, 2]), None, &s),
        "window_idx",
    );
    shape(
        ops::sparse_mqa(&q, &w, &i32s(&[t * 2]), None, &s),
        "window_idx",
    );
    shape(
        ops::sparse_mqa(&q, &w, &wi, Some((&u8s(&[3, wb]), &ci)), &s),
        "compressed",
    );
    shape(
        ops::sparse_mqa(&q, &w, &wi, Some((&c, &i32s(&[1, 5]))), &s),
        "compressed_idx",
    );
    shape(ops::sparse_mqa(&q, &w, &wi, None, &f32s(&[h + 1])), "sink");
    // Kw + Kc = 0, with and without a compressed part.
    shape(
        ops::sparse_mqa(&q, &w, &i32s(&[t, 0]), None, &s),
        "window_idx",
    );
    shape(
        ops::sparse_mqa(&q, &w, &i32s(&[t, 0]), Some((&c, &i32s(&[t, 0]))), &s),
        "window_idx",
    );
    // Outputs.
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::BF16, &[t, h, d]).unwrap();
    let mut lse = Tensor::empty(&deepinfer::Device::Cpu, DType::F32, &[t, h]).unwrap();
    assert!(ops::sparse_mqa_into(&q, &w, &wi, None, &s, &mut out, &mut lse).is_ok());
    let mut bad_out = bf16s(&[t, h, d + 64]);
    let e = ops::sparse_mqa_into(&q, &w, &wi, None, &s, &mut bad_out, &mut lse).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "out", .. }), "{e}");
    let mut bad_out = f32s(&[t, h, d]);
    let e = ops::sparse_mqa_into(&q, &w, &wi, None, &s, &mut bad_out, &mut lse).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "out", .. }), "{e}");
    let mut bad_lse = f32s(&[t]);
    let e = ops::sparse_mqa_into(&q, &w, &wi, None, &s, &mut out, &mut bad_lse).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "lse", .. }), "{e}");
    let mut bad_lse = bf16s(&[t, h]);
    let e = ops::sparse_mqa_into(&q, &w, &wi, None, &s, &mut out, &mut bad_lse).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "lse", .. }), "{e}");
}

/// The CUDA tensor-core kernels' epilogue (`store_out_half`,
/// `kernels-cuda/attention/sparse_mqa.cu`) forms acc / l as y = RN(1/l),
/// q = RN(a·y), e = fma(l, q, −a), RN(q − e·y) = fma(−e, y, q) when
/// 1 ≤ l < 2^64 and every |a| is 0 or in [2^−100, 2^64] (else it divides).
/// In that range this is the IEEE quotient the CPU reference computes, zeros
/// keeping their sign: random pairs log-uniform over the range and over
/// the denominators a softmax gives (1 ≤ l ≤ 700), significands of all ones,
/// powers of two and the range ends.
#[test]
fn the_cuda_epilogue_quotient_is_the_ieee_quotient() {
    let mut rng = common::rng("sparse_mqa_epilogue_quotient");
    let quotient = |a: f32, l: f32| {
        let y = 1.0 / l;
        let q = a * y;
        (-l.mul_add(q, -a)).mul_add(y, q)
    };
    let check = |a: f32, l: f32| {
        assert_eq!(
            quotient(a, l).to_bits(),
            (a / l).to_bits(),
            "a {a:e} ({:#x}) l {l:e} ({:#x})",
            a.to_bits(),
            l.to_bits()
        );
    };
    let log_uniform = |rng: &mut rand::rngs::StdRng, lo: f32, hi: f32| {
        let (lo, hi) = (lo.log2(), hi.log2());
        let v = 2f32.powf(rng.random_range(lo..hi));
        // A random significand too (powf rounds to few patterns at the ends).
        f32::from_bits((v.to_bits() & !0x7F_FFFF) | rng.random_range(0..0x80_0000))
    };
    let mut n = 0u64;
    for i in 0..3_000_000 {
        let l = if i % 2 == 0 {
            log_uniform(&mut rng, 1.0, 700.0)
        } else {
            log_uniform(&mut rng, 1.0, 2f32.powi(64))
        };
        let a = log_uniform(&mut rng, 2f32.powi(-100), 2f32.powi(64));
        let a = if rng.random_bool(0.5) { -a } else { a };
        if l < 2f32.powi(64) && a.abs() <= 2f32.powi(64) && a.abs() >= 2f32.powi(-100) {
            check(a, l);
            n += 1;
        }
    }
    assert!(n > 2_900_000);
    let ones = f32::from_bits(0x3FFF_FFFF); // 1.99999988
    let specials = [
        1.0,
        ones,
        2.0,
        3.0,
        640.0,
        f32::from_bits(0x3F80_0001),
        2f32.powi(63),
        f32::from_bits(0x5F7F_FFFF),
    ];
    let numerators = [
        0.0,
        -0.0,
        2f32.powi(-100),
        2f32.powi(64),
        1.0,
        ones,
        f32::from_bits(0x1A7F_FFFF),
        448.0,
        -3.5,
    ];
    for &l in &specials {
        for &a in &numerators {
            check(a, l);
            check(-a, l);
        }
    }
}
