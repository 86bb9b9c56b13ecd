//! The CPU reference ops against torch (libtorch through tch), behind the
//! `torch-ref` feature: `scripts/test` runs them with the pinned torch 2.11.
//! The torch side is written from the spec with torch ops, independently of
//! our code: RMSNorm within one BF16 ulp (torch reduces in another order),
//! the FP8 1×32 quantiser bitwise (values clamped to ±448 before the cast,
//! since torch's e4m3 cast does not saturate).
#![cfg(feature = "torch-ref")]

mod common;

use common::torch::{bf16_to_torch, bytes, from_torch_bf16};
use deepinfer::{E4M3, E8M0, Tensor, ops};
use half::bf16;
use tch::Kind;

#[test]
fn rms_norm_matches_torch() {
    let mut rng = common::rng("rms_norm_torch");
    for (rows, dim) in [(4usize, 5120usize), (3, 512), (5, 33), (1, 1)] {
        for eps in [1e-20f64, 1e-6] {
            let x = common::random_activations(&mut rng, rows * dim, 3.0);
            let w = common::random_activations(&mut rng, dim, 1.0);
            let ours = ops::rms_norm(
                &Tensor::from_vec(x.clone(), &[rows, dim]).unwrap(),
                &Tensor::from_vec(w.clone(), &[dim]).unwrap(),
                eps as f32,
            )
            .unwrap()
            .to_vec::<bf16>()
            .unwrap();
            let xf = bf16_to_torch(&x, &[rows as i64, dim as i64]).to_kind(Kind::Float);
            let ms = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
            let y = (bf16_to_torch(&w, &[dim as i64]).to_kind(Kind::Float)
                * (xf * (ms + eps).rsqrt()))
            .to_kind(Kind::BFloat16);
            let theirs = from_torch_bf16(&y);
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    common::bf16_ulps(*a, *b) <= 1,
                    "{rows}x{dim} eps {eps} elem {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn act_quant_is_bitwise_equal_to_torch() {
    let mut rng = common::rng("act_quant_torch");
    for (rows, k) in [(4usize, 5120usize), (7, 64), (1, 32), (3, 2304)] {
        let x = common::random_bf16(&mut rng, rows * k);
        let (q, s) = ops::act_quant_fp8(&Tensor::from_vec(x.clone(), &[rows, k]).unwrap()).unwrap();
        let q: Vec<u8> = q.to_vec::<E4M3>().unwrap().iter().map(|v| v.0).collect();
        let s: Vec<u8> = s.to_vec::<E8M0>().unwrap().iter().map(|v| v.0).collect();

        let blocks = (k / 32) as i64;
        let xf = bf16_to_torch(&x, &[rows as i64, blocks, 32]).to_kind(Kind::Float);
        let amax = xf.abs().amax([-1i64].as_slice(), true).clamp_min(1e-4);
        let bits = (amax * f64::from(1.0f32 / 448.0)).view_dtype(Kind::Int);
        let e = bits.bitwise_right_shift_tensor_scalar(23).bitwise_and(0xFF) - 127
            + bits.bitwise_and(0x7F_FFFF).ne(0).to_kind(Kind::Int);
        let inv = (-e.shallow_clone() + 127)
            .bitwise_left_shift_tensor_scalar(23)
            .view_dtype(Kind::Float);
        let tq = (xf * inv).clamp(-448.0, 448.0).to_kind(Kind::Float8e4m3fn);
        let ts = (e + 127).to_kind(Kind::Uint8);
        assert_eq!(q, bytes(&tq), "values {rows}x{k}");
        assert_eq!(s, bytes(&ts), "scales {rows}x{k}");
    }
}
