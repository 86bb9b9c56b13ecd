//! The fused cache-row writers on the CPU equal the op chains the model ran
//! before them, bitwise: `kv_rows` = `window_rows` / `compressed_rows` /
//! `index_key_quant` of `rope(rms_norm(x))`, its latent = `rms_norm(x)`;
//! `compressor_rows_into` over consecutive groups = the same chain on
//! `compress_ratio2`; a pending token pools as if it had arrived in the same
//! call; slots outside the pool and groups with a member out of range write
//! nothing; bad inputs are typed errors naming the tensor.

mod common;

use deepinfer::cpu_backend::{RopeParams, Yarn};
use deepinfer::ops::{self, KvRowFormat, RowNorm, RowRope, RowsOut};
use deepinfer::{DType, Device, Error, Tensor};
use half::bf16;
use rand::Rng;

const ROPE: RopeParams = RopeParams {
    theta: 160000.0,
    yarn: Some(Yarn {
        factor: 16.0,
        original_seq_len: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }),
};
const EPS: f32 = 1e-20;

fn inputs(rng: &mut rand::rngs::StdRng, t: usize, d: usize) -> (Tensor, Tensor, Tensor) {
    let x = Tensor::from_vec(common::random_activations(rng, t * d, 3.0), &[t, d]).unwrap();
    let w: Vec<bf16> = (0..d)
        .map(|_| bf16::from_f32(rng.random_range(0.5..2.0)))
        .collect();
    let p: Vec<i64> = (0..t).map(|_| rng.random_range(0..1 << 20)).collect();
    (
        x,
        Tensor::from_vec(w, &[d]).unwrap(),
        Tensor::from_vec(p, &[t]).unwrap(),
    )
}

fn f32_rows(rng: &mut rand::rngs::StdRng, rows: usize, d: usize, s: f32) -> Tensor {
    let v: Vec<f32> = (0..rows * d).map(|_| rng.random_range(-s..s)).collect();
    Tensor::from_vec(v, &[rows, d]).unwrap()
}

#[test]
fn kv_rows_equal_the_op_chain() {
    let mut rng = common::rng("kv_rows_cpu");
    for (format, d) in [
        (KvRowFormat::Window, 512),
        (KvRowFormat::Compressed, 512),
        (KvRowFormat::IndexKey, 128),
    ] {
        let t = 37;
        let (x, w, pos) = inputs(&mut rng, t, d);
        let normed = ops::rms_norm(&x, &w, EPS).unwrap();
        let roped = ops::rope(&normed, &pos, 1, 64, &ROPE).unwrap();
        let chain = match format {
            KvRowFormat::Window => ops::window_rows(&roped).unwrap(),
            KvRowFormat::Compressed => ops::compressed_rows(&roped).unwrap(),
            KvRowFormat::IndexKey => ops::index_key_quant(&roped).unwrap(),
        };
        let norm = Some(RowNorm {
            weight: &w,
            eps: EPS,
        });
        let rope = Some(RowRope {
            positions: &pos,
            rope_dim: 64,
            params: &ROPE,
        });
        let fused = ops::kv_rows(&x, format, norm, rope).unwrap();
        assert_eq!(
            fused.to_le_bytes().unwrap(),
            chain.to_le_bytes().unwrap(),
            "{format:?}"
        );
        // Into a pool at slots: row i at slot t - 1 - i, every other slot
        // out of range (nothing written there).
        let (dtype, width) = ops::kv_row_layout(format, d);
        let mut pool = Tensor::filled_bytes(dtype, &[t, width], 0xAB).unwrap();
        let slots: Vec<i32> = (0..t as i32)
            .map(|i| {
                if i % 2 == 0 {
                    t as i32 - 1 - i
                } else {
                    [-1, t as i32][i as usize % 4 / 2]
                }
            })
            .collect();
        let slots = Tensor::from_vec(slots, &[t]).unwrap();
        let mut latent = Tensor::zeros(&Device::Cpu, DType::BF16, &[t, d]).unwrap();
        ops::kv_rows_into(
            &x,
            format,
            norm,
            rope,
            RowsOut {
                pool: &mut pool,
                slots: &slots,
                latent: Some(&mut latent),
            },
        )
        .unwrap();
        assert_eq!(
            latent.to_vec::<bf16>().unwrap(),
            normed.to_vec::<bf16>().unwrap()
        );
        let rb = format.row_bytes(d);
        let (got, want) = (pool.to_le_bytes().unwrap(), chain.to_le_bytes().unwrap());
        for i in 0..t {
            let s = t - 1 - i;
            if i % 2 == 0 {
                assert_eq!(
                    got[s * rb..(s + 1) * rb],
                    want[i * rb..(i + 1) * rb],
                    "row {i}"
                );
            } else {
                assert!(
                    got[s * rb..(s + 1) * rb].iter().all(|&b| b == 0xAB),
                    "slot {s}"
                );
            }
        }
    }
}

#[test]
fn compressor_rows_equal_the_op_chain() {
    let mut rng = common::rng("compressor_rows_cpu");
    let (n, d) = (21, 512);
    let kv = f32_rows(&mut rng, 2 * n, d, 4.0);
    let score = f32_rows(&mut rng, 2 * n, d, 6.0);
    let (_, w, pos) = inputs(&mut rng, n, d);
    let pooled = ops::compress_ratio2(&kv, &score).unwrap();
    let normed = ops::rms_norm(&pooled, &w, EPS).unwrap();
    let chain = ops::compressed_rows(&ops::rope(&normed, &pos, 1, 64, &ROPE).unwrap()).unwrap();
    // The first token of the sequence arrived in an earlier call: it is
    // pending row 1 of the pending tensors; the others are rows of this
    // call's projections.
    let mut pk = f32_rows(&mut rng, 3, d, 1.0);
    let mut ps = f32_rows(&mut rng, 3, d, 1.0);
    pk.copy_rows_from(1, &kv, 0, 1).unwrap();
    ps.copy_rows_from(1, &score, 0, 1).unwrap();
    let (kv_now, score_now) = (
        kv.narrow_rows(1, 2 * n - 1).unwrap(),
        score.narrow_rows(1, 2 * n - 1).unwrap(),
    );
    let mut members = vec![-2i32];
    members.extend(0..(2 * n - 1) as i32);
    // One more group with a member out of range: writes nothing.
    members.extend([0, 2 * n as i32]);
    let groups = Tensor::from_vec(members, &[n + 1, 2]).unwrap();
    let mut slots: Vec<i32> = (0..n as i32).collect();
    slots.push(n as i32 + 1);
    let slots = Tensor::from_vec(slots, &[n + 1]).unwrap();
    let mut p = pos.to_vec::<i64>().unwrap();
    p.push(0);
    let pos1 = Tensor::from_vec(p, &[n + 1]).unwrap();
    let mut pool = Tensor::filled_bytes(DType::U8, &[n + 2, 288], 0xCD).unwrap();
    let mut latent = Tensor::filled_bytes(DType::BF16, &[n + 1, d], 0xCD).unwrap();
    ops::compressor_rows_into(
        &kv_now,
        &score_now,
        Some((&pk, &ps)),
        &groups,
        RowNorm {
            weight: &w,
            eps: EPS,
        },
        RowRope {
            positions: &pos1,
            rope_dim: 64,
            params: &ROPE,
        },
        RowsOut {
            pool: &mut pool,
            slots: &slots,
            latent: Some(&mut latent),
        },
    )
    .unwrap();
    let got = pool.to_vec::<u8>().unwrap();
    assert_eq!(got[..n * 288], chain.to_vec::<u8>().unwrap()[..]);
    assert!(got[n * 288..].iter().all(|&b| b == 0xCD));
    let lat = latent.to_vec::<bf16>().unwrap();
    assert_eq!(lat[..n * d], normed.to_vec::<bf16>().unwrap()[..]);
    assert!(lat[n * d..].iter().all(|v| v.to_bits() == 0xCDCD));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let mut rng = common::rng("kv_writers_errors_cpu");
    let (x, w, pos) = inputs(&mut rng, 4, 512);
    let named = |e: Error| match e {
        Error::Shape { tensor, .. } => tensor,
        Error::Argument { arg, .. } => arg,
        Error::DType { tensor, .. } => tensor,
        e => panic!("unexpected error {e:?}"),
    };
    let odd = Tensor::zeros(&Device::Cpu, DType::BF16, &[4, 48]).unwrap();
    assert_eq!(
        named(ops::kv_rows(&odd, KvRowFormat::Window, None, None).unwrap_err()),
        "x"
    );
    let rope = |rope_dim| {
        Some(RowRope {
            positions: &pos,
            rope_dim,
            params: &ROPE,
        })
    };
    assert_eq!(
        named(ops::kv_rows(&x, KvRowFormat::Window, None, rope(7)).unwrap_err()),
        "rope_dim"
    );
    let short_w = Tensor::zeros(&Device::Cpu, DType::BF16, &[128]).unwrap();
    let e = ops::kv_rows(
        &x,
        KvRowFormat::Window,
        Some(RowNorm {
            weight: &short_w,
            eps: EPS,
        }),
        None,
    )
    .unwrap_err();
    assert_eq!(named(e), "weight");
    let e = ops::kv_rows(
        &x,
        KvRowFormat::Window,
        Some(RowNorm {
            weight: &w,
            eps: f32::NAN,
        }),
        None,
    )
    .unwrap_err();
    assert_eq!(named(e), "eps");
    let mut pool = Tensor::zeros(&Device::Cpu, DType::U8, &[8, 288]).unwrap();
    let slots = Tensor::from_vec(vec![0i32, 1, 2, 3], &[4]).unwrap();
    let e = ops::kv_rows_into(
        &x,
        KvRowFormat::Window,
        None,
        None,
        RowsOut {
            pool: &mut pool,
            slots: &slots,
            latent: None,
        },
    )
    .unwrap_err();
    assert_eq!(named(e), "pool");
    let kv = f32_rows(&mut rng, 4, 512, 1.0);
    let groups = Tensor::from_vec(vec![0i64, 1, 2, 3], &[2, 2]).unwrap();
    let e = ops::compressor_rows_into(
        &kv,
        &kv,
        None,
        &groups,
        RowNorm {
            weight: &w,
            eps: EPS,
        },
        RowRope {
            positions: &pos,
            rope_dim: 64,
            params: &ROPE,
        },
        RowsOut {
            pool: &mut pool,
            slots: &slots,
            latent: None,
        },
    )
    .unwrap_err();
    assert_eq!(named(e), "groups");
}

/// The CUDA compressed-row quantiser divides by the e4m3 scale as
/// q0 = v · RN(1/s), rem = fma(−s, q0, v), q = rem == 0 ? q0 : fma(rem, 1/s, q0)
/// (`kernels-cuda/kv/kv_rows.cu`). For every BF16 v and every e4m3 scale the
/// quantiser can produce (s ≥ 2^-9) whose quotient is finite (a scale is at
/// least amax / 6 rounded, so no reachable quotient overflows) this gives
/// the e2m1 code of the IEEE quotient v / s, which the CPU reference uses;
/// the quotient itself is equal wherever |v / s| ≥ 1e-30.
#[test]
fn the_cuda_fp4_division_gives_the_ieee_quotients_code() {
    use deepinfer::numerics::{e4m3_to_f32, f32_to_e2m1};
    let mut pairs = 0;
    for sb in 0u8..=0x7E {
        let s = e4m3_to_f32(deepinfer::E4M3(sb));
        if s < 1.0 / 512.0 {
            continue;
        }
        let r = 1.0 / s;
        for vb in 0..=u16::MAX {
            let v = f32::from_bits(u32::from(vb) << 16);
            let want = v / s;
            if !want.is_finite() {
                continue;
            }
            let q0 = v * r;
            let rem = (-s).mul_add(q0, v);
            let q = if rem == 0.0 { q0 } else { rem.mul_add(r, q0) };
            let code = |x: f32| f32_to_e2m1(x.clamp(-6.0, 6.0));
            assert_eq!(code(q), code(want), "v {v:e} s {s}");
            if want.abs() >= 1e-30 {
                assert_eq!(q.to_bits(), want.to_bits(), "v {v:e} s {s}");
            }
            pairs += 1;
        }
    }
    assert!(pairs > 8_000_000);
}

/// The CUDA ratio-2 pooling forms e / (1 + e) (e ∈ [0, 1], the weight of
/// the token with the lower score; the other weight is the reciprocal
/// RN(1 / sum)) as q0 = e · r, rem = fma(−sum, q0, e), q = rem == 0 ? q0 :
/// fma(rem, r, q0) with r = RN(1 / sum) (`kernels-cuda/kv/kv_rows.cu`). For
/// every f32 e in [0, 1] this is the IEEE quotient e / sum the CPU reference
/// computes (all 2^30 of them; a few seconds).
#[test]
fn the_cuda_pooling_division_gives_the_ieee_quotient() {
    for bits in 0u32..=1.0f32.to_bits() {
        let e = f32::from_bits(bits);
        let sum = 1.0 + e;
        let r = 1.0 / sum;
        let q0 = e * r;
        let rem = (-sum).mul_add(q0, e);
        let q = if rem == 0.0 { q0 } else { rem.mul_add(r, q0) };
        assert_eq!(q.to_bits(), (e / sum).to_bits(), "e {e:e}");
    }
}
