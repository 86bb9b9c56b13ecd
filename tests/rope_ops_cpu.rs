//! The RoPE ops (`ops::rope`, `ops::inverse_rope` and their `_into`
//! variants) on the CPU: they are the CPU reference (`cpu_backend::rope` /
//! `inverse_rope`) for both accepted layouts, leave the first hd − rope_dim
//! dims of every head untouched, and reject bad dtypes, shapes and arguments
//! with typed errors naming the culprit.

mod common;

use deepinfer::cpu_backend::{self, RopeParams, Yarn};
use deepinfer::{DType, Device, Error, Tensor, ops};
use half::bf16;
use rand::Rng;

const PLAIN: RopeParams = RopeParams {
    theta: 10000.0,
    yarn: None,
};
const YARN: RopeParams = RopeParams {
    theta: 160000.0,
    yarn: Some(Yarn {
        factor: 16.0,
        original_seq_len: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }),
};

fn bits(t: &Tensor) -> Vec<u16> {
    t.to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn bits_of(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|b| b.to_bits()).collect()
}

#[test]
fn ops_are_the_cpu_reference_in_both_layouts() {
    let mut rng = common::rng("rope_ops_cpu");
    for &(tokens, heads, head_dim, rope_dim) in &[
        (3usize, 64usize, 512usize, 64usize),
        (5, 4, 128, 64),
        (1, 1, 64, 64),
        (7, 3, 10, 2),
        (2, 2, 6, 4),
    ] {
        for params in [&PLAIN, &YARN] {
            let x = common::random_bf16(&mut rng, tokens * heads * head_dim);
            let mut pos: Vec<i64> = (0..tokens)
                .map(|_| rng.random_range(0..1_048_576))
                .collect();
            pos[0] = 70_000;
            let ph = Tensor::from_vec(pos.clone(), &[tokens]).unwrap();
            for inverse in [false, true] {
                let want = if inverse {
                    cpu_backend::inverse_rope(&x, &pos, heads, head_dim, rope_dim, params)
                } else {
                    cpu_backend::rope(&x, &pos, heads, head_dim, rope_dim, params)
                };
                let op = if inverse {
                    ops::inverse_rope
                } else {
                    ops::rope
                };
                for shape in [
                    vec![tokens, heads, head_dim],
                    vec![tokens, heads * head_dim],
                ] {
                    let case = format!("{shape:?} rope_dim {rope_dim} inverse {inverse}");
                    let xt = Tensor::from_vec(x.clone(), &shape).unwrap();
                    let y = op(&xt, &ph, heads, rope_dim, params).unwrap();
                    assert_eq!(y.shape(), &shape[..], "{case}");
                    assert_eq!(y.dtype(), DType::BF16, "{case}");
                    assert_eq!(bits(&y), bits_of(&want), "{case}");
                    let mut out = Tensor::empty(&Device::Cpu, DType::BF16, &shape).unwrap();
                    if inverse {
                        ops::inverse_rope_into(&xt, &ph, heads, rope_dim, params, &mut out)
                            .unwrap();
                    } else {
                        ops::rope_into(&xt, &ph, heads, rope_dim, params, &mut out).unwrap();
                    }
                    assert_eq!(bits(&out), bits_of(&want), "{case} (_into)");
                    // The first head_dim - rope_dim dims of every head are the input's.
                    let got = bits(&y);
                    let xb = bits_of(&x);
                    for (g, xh) in got.chunks(head_dim).zip(xb.chunks(head_dim)) {
                        assert_eq!(
                            g[..head_dim - rope_dim],
                            xh[..head_dim - rope_dim],
                            "{case}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn inverse_undoes_rope_up_to_bf16_rounding() {
    let mut rng = common::rng("rope_ops_cpu_roundtrip");
    let (tokens, heads, head_dim) = (4, 2, 128);
    let x = common::random_activations(&mut rng, tokens * heads * head_dim, 2.0);
    let xt = Tensor::from_vec(x.clone(), &[tokens, heads, head_dim]).unwrap();
    let p = Tensor::from_vec(vec![0i64, 1, 65_536, 1_048_575], &[tokens]).unwrap();
    let back = ops::inverse_rope(
        &ops::rope(&xt, &p, heads, 64, &YARN).unwrap(),
        &p,
        heads,
        64,
        &YARN,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    // Position 0 (cos 1, sin 0) is exact both ways.
    assert_eq!(
        bits_of(&back[..heads * head_dim]),
        bits_of(&x[..heads * head_dim])
    );
    // Two BF16 roundings (2^-8 relative each) of rotations of the pair:
    // within 2^-6 of its size.
    for (i, (b, a)) in back.chunks(2).zip(x.chunks(2)).enumerate() {
        let size = a[0].to_f32().abs() + a[1].to_f32().abs();
        for k in 0..2 {
            let err = (b[k].to_f32() - a[k].to_f32()).abs();
            assert!(err <= size / 64.0, "pair {i}: {b:?} vs {a:?}");
        }
    }
}

#[test]
fn no_tokens_give_an_empty_output() {
    let x = Tensor::from_vec(Vec::<bf16>::new(), &[0, 64, 512]).unwrap();
    let p = Tensor::from_vec(Vec::<i64>::new(), &[0]).unwrap();
    let y = ops::inverse_rope(&x, &p, 64, 64, &YARN).unwrap();
    assert_eq!(y.shape(), &[0, 64, 512]);
    let x = Tensor::from_vec(Vec::<bf16>::new(), &[0, 4 * 128]).unwrap();
    let y = ops::rope(&x, &p, 4, 64, &PLAIN).unwrap();
    assert_eq!(y.shape(), &[0, 512]);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let x = Tensor::from_vec(vec![bf16::ONE; 2 * 4 * 128], &[2, 4, 128]).unwrap();
    let p = Tensor::from_vec(vec![0i64, 5], &[2]).unwrap();
    assert!(ops::rope(&x, &p, 4, 64, &PLAIN).is_ok());

    // dtypes
    let xf = Tensor::from_vec(vec![1f32; 2 * 4 * 128], &[2, 4, 128]).unwrap();
    let e = ops::rope(&xf, &p, 4, 64, &PLAIN).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "x", .. }), "{e}");
    let p32 = Tensor::from_vec(vec![0i32, 5], &[2]).unwrap();
    let e = ops::inverse_rope(&x, &p32, 4, 64, &PLAIN).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "positions",
                expected: DType::I64,
                ..
            }
        ),
        "{e}"
    );

    // positions: one per token
    for shape in [vec![3usize], vec![2, 1], vec![]] {
        let n = shape.iter().product();
        let pb = Tensor::from_vec(vec![0i64; n], &shape).unwrap();
        let e = ops::rope(&x, &pb, 4, 64, &PLAIN).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Shape {
                    tensor: "positions",
                    ..
                }
            ),
            "{shape:?}: {e}"
        );
    }

    // x: [T, heads, hd] or [T, heads * hd]
    let e = ops::rope(&x, &p, 3, 64, &PLAIN).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "x", .. }), "{e}");
    let flat = Tensor::from_vec(vec![bf16::ONE; 2 * 500], &[2, 500]).unwrap();
    let e = ops::rope(&flat, &p, 3, 64, &PLAIN).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "x", .. }), "{e}");
    for shape in [
        vec![1024usize],
        vec![2, 4, 128, 1],
        vec![2, 4, 0],
        vec![2, 0],
    ] {
        let n = shape.iter().product();
        let xb = Tensor::from_vec(vec![bf16::ONE; n], &shape).unwrap();
        let e = ops::rope(&xb, &p, 4, 64, &PLAIN).unwrap_err();
        assert!(
            matches!(e, Error::Shape { tensor: "x", .. }),
            "{shape:?}: {e}"
        );
    }

    // arguments
    let e = ops::rope(&x, &p, 0, 64, &PLAIN).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "heads", .. }), "{e}");
    for rope_dim in [0usize, 63, 130] {
        let e = ops::rope(&x, &p, 4, rope_dim, &PLAIN).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    arg: "rope_dim",
                    ..
                }
            ),
            "{rope_dim}: {e}"
        );
    }
    for theta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = RopeParams { theta, yarn: None };
        let e = ops::rope(&x, &p, 4, 64, &bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    arg: "params.theta",
                    ..
                }
            ),
            "{theta}: {e}"
        );
    }
    let mut bad_yarn = YARN;
    bad_yarn.yarn.as_mut().unwrap().factor = 0.0;
    let e = ops::inverse_rope(&x, &p, 4, 64, &bad_yarn).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Argument {
                arg: "params.yarn",
                ..
            }
        ),
        "{e}"
    );
    // YaRN with original_seq_len 0 is inactive: its other fields do not matter.
    let mut off = bad_yarn;
    off.yarn.as_mut().unwrap().original_seq_len = 0;
    let no_yarn = RopeParams {
        theta: YARN.theta,
        yarn: None,
    };
    let want = ops::rope(&x, &p, 4, 64, &no_yarn).unwrap();
    assert_eq!(bits(&ops::rope(&x, &p, 4, 64, &off).unwrap()), bits(&want));

    // outputs of the _into variants
    let mut wrong_shape = Tensor::empty(&Device::Cpu, DType::BF16, &[2, 512]).unwrap();
    let e = ops::rope_into(&x, &p, 4, 64, &PLAIN, &mut wrong_shape).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "out", .. }), "{e}");
    let mut wrong_dtype = Tensor::empty(&Device::Cpu, DType::F32, &[2, 4, 128]).unwrap();
    let e = ops::inverse_rope_into(&x, &p, 4, 64, &PLAIN, &mut wrong_dtype).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "out", .. }), "{e}");
}
