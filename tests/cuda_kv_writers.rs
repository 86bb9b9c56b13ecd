//! The cache-row writers on the GPU (`kernels-cuda/kv/`) against the CPU ops,
//! bitwise: `ops::kv_rows` / `kv_rows_into` in the three row formats (window
//! FP8, compressed FP4, index-key FP4) with and without the RMSNorm and the
//! RoPE (θ 10000 and θ 160000 with YaRN, positions up to 2^20), the latent
//! output, rows stored into NaN-poisoned pools at shuffled slots (−1, the pool
//! size, i32::MIN / i32::MAX are not written); `ops::compressor_rows_into`
//! with groups mixing pending tokens and new rows (members out of range write
//! nothing); `compress_ratio2`, `window_rows`, `compressed_rows` on CUDA;
//! odd and even chunks of one sequence across several calls with the pending
//! token carried as the model carries it, equal to the whole sequence in one
//! call; T ∈ {1, 2, 3, 127, 128, 129, 4097}; bad shapes and the CUDA limits
//! as typed errors. Fresh random inputs every run (DEEPINFER_SEED replays);
//! DEEPINFER_QUICK=1 keeps to small T (the compute-sanitizer pass). Built
//! only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU.
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::cpu_backend::{RopeParams, Yarn};
use deepinfer::device::CudaDevice;
use deepinfer::ops::{self, KvRowFormat, RowNorm, RowRope, RowsOut};
use deepinfer::{DType, Device, Error, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const YARN: RopeParams = RopeParams {
    theta: 160000.0,
    yarn: Some(Yarn {
        factor: 16.0,
        original_seq_len: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }),
};
const PLAIN: RopeParams = RopeParams {
    theta: 10000.0,
    yarn: None,
};
const EPS: f32 = 1e-20;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

fn quick() -> bool {
    std::env::var("DEEPINFER_QUICK").is_ok_and(|v| v == "1")
}

fn row_counts() -> Vec<usize> {
    if quick() {
        vec![1, 2, 3, 17]
    } else {
        vec![1, 2, 3, 127, 128, 129, 4097]
    }
}

/// BF16 rows: wide-range values for half of them, activations for the rest.
fn rows_bf16(rng: &mut StdRng, t: usize, d: usize) -> Tensor {
    let mut v = common::random_bf16(rng, t * d / 2);
    v.extend(common::random_activations(rng, t * d - v.len(), 2.0));
    Tensor::from_vec(v, &[t, d]).unwrap()
}

fn norm_weight(rng: &mut StdRng, d: usize) -> Tensor {
    let w: Vec<bf16> = (0..d)
        .map(|_| bf16::from_f32(rng.random_range(0.25..2.0)))
        .collect();
    Tensor::from_vec(w, &[d]).unwrap()
}

fn positions(rng: &mut StdRng, t: usize) -> Tensor {
    let p: Vec<i64> = (0..t).map(|_| rng.random_range(0..1 << 20)).collect();
    Tensor::from_vec(p, &[t]).unwrap()
}

/// `t` slots into a pool of `n ≥ t` rows: distinct rows in shuffled order,
/// about one in ten replaced by a value no row has.
fn slots(rng: &mut StdRng, t: usize, n: usize) -> Tensor {
    let mut rows: Vec<i32> = (0..n as i32).collect();
    rows.shuffle(rng);
    rows.truncate(t);
    for s in rows.iter_mut() {
        if rng.random::<f32>() < 0.1 {
            *s = [-1, n as i32, i32::MIN, i32::MAX][rng.random_range(0..4)];
        }
    }
    Tensor::from_vec(rows, &[t]).unwrap()
}

/// A pool of `n` rows of `format` filled with 0xFF (what a poisoned device
/// allocation holds), on `dev`.
fn pool(dev: &Device, format: KvRowFormat, d: usize, n: usize) -> Tensor {
    let (dtype, width) = ops::kv_row_layout(format, d);
    Tensor::filled_bytes(dtype, &[n, width], 0xFF)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn assert_bitwise(label: &str, got: &Tensor, want: &Tensor) {
    let (g, w) = (got.to_le_bytes().unwrap(), want.to_le_bytes().unwrap());
    assert_eq!(g.len(), w.len(), "{label}: sizes");
    if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
        let n = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        panic!(
            "{label}: {n} bytes differ, first at {i}: {:#04x} vs {:#04x}",
            g[i], w[i]
        );
    }
}

/// (format, D, rope_dim): the V4.1 window row, compressed entry, index key,
/// and a narrow compressed row (D 48, groups of 16, 3 scales).
const FORMATS: [(KvRowFormat, usize, usize); 4] = [
    (KvRowFormat::Window, 512, 64),
    (KvRowFormat::Compressed, 512, 64),
    (KvRowFormat::IndexKey, 128, 64),
    (KvRowFormat::Compressed, 48, 16),
];

#[test]
fn kv_rows_match_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("kv_rows_cuda");
    for (format, d, rd) in FORMATS {
        for t in row_counts() {
            for (with_norm, with_rope, params) in [
                (true, true, &YARN),
                (true, true, &PLAIN),
                (false, true, &YARN),
                (true, false, &YARN),
                (false, false, &YARN),
            ] {
                let label = format!(
                    "{format:?} D {d} T {t} norm {with_norm} rope {with_rope} θ {}",
                    params.theta
                );
                let x = rows_bf16(&mut rng, t, d);
                let w = norm_weight(&mut rng, d);
                let pos = positions(&mut rng, t);
                let n = t + t / 3 + 5;
                let sl = slots(&mut rng, t, n);
                let (xg, wg, pg, sg) = (
                    x.to_device(&dev).unwrap(),
                    w.to_device(&dev).unwrap(),
                    pos.to_device(&dev).unwrap(),
                    sl.to_device(&dev).unwrap(),
                );
                let norm = |w| {
                    with_norm.then_some(RowNorm {
                        weight: w,
                        eps: EPS,
                    })
                };
                let rope = |p| {
                    with_rope.then_some(RowRope {
                        positions: p,
                        rope_dim: rd,
                        params,
                    })
                };
                // Dense: a new (poisoned) output.
                let want = ops::kv_rows(&x, format, norm(&w), rope(&pos)).unwrap();
                let got = ops::kv_rows(&xg, format, norm(&wg), rope(&pg)).unwrap();
                assert_bitwise(&format!("{label} dense"), &got, &want);
                // Into a pool at slots, with the latent.
                let mut want_pool = pool(&Device::Cpu, format, d, n);
                let mut want_lat = Tensor::zeros(&Device::Cpu, DType::BF16, &[t, d]).unwrap();
                ops::kv_rows_into(
                    &x,
                    format,
                    norm(&w),
                    rope(&pos),
                    RowsOut {
                        pool: &mut want_pool,
                        slots: &sl,
                        latent: Some(&mut want_lat),
                    },
                )
                .unwrap();
                let mut got_pool = pool(&dev, format, d, n);
                let mut got_lat = Tensor::empty(&dev, DType::BF16, &[t, d]).unwrap();
                ops::kv_rows_into(
                    &xg,
                    format,
                    norm(&wg),
                    rope(&pg),
                    RowsOut {
                        pool: &mut got_pool,
                        slots: &sg,
                        latent: Some(&mut got_lat),
                    },
                )
                .unwrap();
                assert_bitwise(&format!("{label} pool"), &got_pool, &want_pool);
                assert_bitwise(&format!("{label} latent"), &got_lat, &want_lat);
            }
        }
    }
}

/// `x` with a NaN, a −NaN, +Inf and −Inf in its first rows (issue 15: a FP4
/// group holding one is stored with the NaN scale and code 7 everywhere; the
/// FP8 rows keep NaN per value).
fn with_non_finite(x: &Tensor) -> Tensor {
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let mut v = x.to_vec::<bf16>().unwrap();
    let bad = [bf16::NAN, -bf16::NAN, bf16::INFINITY, bf16::NEG_INFINITY];
    for (i, b) in bad.into_iter().enumerate() {
        if let Some(e) = v.get_mut(i * (d + 7) % (t * d).max(1)) {
            *e = b;
        }
    }
    Tensor::from_vec(v, &[t, d]).unwrap()
}

#[test]
fn window_and_compressed_rows_match_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("window_compressed_rows_cuda");
    for t in row_counts() {
        for d in [512, 32, 96] {
            let clean = rows_bf16(&mut rng, t, d);
            let poisoned = with_non_finite(&clean);
            for (what, x) in [("", clean), (" non-finite", poisoned)] {
                let xg = x.to_device(&dev).unwrap();
                assert_bitwise(
                    &format!("window_rows{what} T {t} D {d}"),
                    &ops::window_rows(&xg).unwrap(),
                    &ops::window_rows(&x).unwrap(),
                );
                assert_bitwise(
                    &format!("compressed_rows{what} T {t} D {d}"),
                    &ops::compressed_rows(&xg).unwrap(),
                    &ops::compressed_rows(&x).unwrap(),
                );
            }
        }
    }
}

/// F32 projections `[rows, d]`: kv wide-ranged, scores spread so that the
/// two-way softmax takes every shape (ties, one side saturated).
fn projections(rng: &mut StdRng, rows: usize, d: usize) -> (Tensor, Tensor) {
    let kv: Vec<f32> = (0..rows * d)
        .map(|_| {
            let mag = 2f32.powf(rng.random_range(-12.0..8.0));
            if rng.random::<bool>() { mag } else { -mag }
        })
        .collect();
    let score: Vec<f32> = (0..rows * d)
        .map(|_| match rng.random_range(0..10) {
            0 => 0.0,
            1 => rng.random_range(-200.0..200.0),
            _ => rng.random_range(-8.0..8.0),
        })
        .collect();
    (
        Tensor::from_vec(kv, &[rows, d]).unwrap(),
        Tensor::from_vec(score, &[rows, d]).unwrap(),
    )
}

#[test]
fn compress_ratio2_matches_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("compress_ratio2_cuda");
    for n in row_counts() {
        // hd a multiple of the compressed row's 16-value FP4 group; 144 is not
        // a multiple of 32 (the tail of a 32-wide vector loop).
        for d in [512, 16, 144] {
            let (kv, score) = projections(&mut rng, 2 * n, d);
            let got = ops::compress_ratio2(
                &kv.to_device(&dev).unwrap(),
                &score.to_device(&dev).unwrap(),
            )
            .unwrap();
            let want = ops::compress_ratio2(&kv, &score).unwrap();
            assert_bitwise(&format!("compress_ratio2 n {n} hd {d}"), &got, &want);
        }
    }
}

/// One `compressor_rows_into` call on `dev` into `pool` and a fresh latent.
#[allow(clippy::too_many_arguments)]
fn compressor_call(
    dev: &Device,
    kv: &Tensor,
    score: &Tensor,
    pending: (&Tensor, &Tensor),
    groups: &Tensor,
    w: &Tensor,
    pos: &Tensor,
    pool: &mut Tensor,
    sl: &Tensor,
) -> Tensor {
    let on = |t: &Tensor| t.to_device(dev).unwrap();
    let (kv, score, pk, ps, groups, w, pos, sl) = (
        on(kv),
        on(score),
        on(pending.0),
        on(pending.1),
        on(groups),
        on(w),
        on(pos),
        on(sl),
    );
    let n = groups.shape()[0];
    let mut latent = Tensor::filled_bytes(DType::BF16, &[n, kv.shape()[1]], 0xFF)
        .unwrap()
        .to_device(dev)
        .unwrap();
    ops::compressor_rows_into(
        &kv,
        &score,
        Some((&pk, &ps)),
        &groups,
        RowNorm {
            weight: &w,
            eps: EPS,
        },
        RowRope {
            positions: &pos,
            rope_dim: 64,
            params: &YARN,
        },
        RowsOut {
            pool,
            slots: &sl,
            latent: Some(&mut latent),
        },
    )
    .unwrap();
    latent
}

#[test]
fn compressor_rows_match_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("compressor_rows_cuda");
    let d = 512;
    for n in row_counts() {
        let rows = 2 * n + 3;
        let (kv, score) = projections(&mut rng, rows, d);
        let (pk, ps) = projections(&mut rng, 7, d);
        // Members: mostly new rows, some pending tokens, a few out of range
        // (kv row `rows`, pending row 7, i32::MIN) whose groups write nothing.
        let members: Vec<i32> = (0..2 * n)
            .map(|_| match rng.random_range(0..40) {
                0 => -1 - rng.random_range(0..7),
                1 => [rows as i32, -8, i32::MIN, i32::MAX][rng.random_range(0..4)],
                _ => rng.random_range(0..rows as i32),
            })
            .collect();
        let groups = Tensor::from_vec(members, &[n, 2]).unwrap();
        let w = norm_weight(&mut rng, d);
        let pos = positions(&mut rng, n);
        let np = n + 9;
        let sl = slots(&mut rng, n, np);
        let mut want_pool = pool(&Device::Cpu, KvRowFormat::Compressed, d, np);
        let want_lat = compressor_call(
            &Device::Cpu,
            &kv,
            &score,
            (&pk, &ps),
            &groups,
            &w,
            &pos,
            &mut want_pool,
            &sl,
        );
        let mut got_pool = pool(&dev, KvRowFormat::Compressed, d, np);
        let got_lat = compressor_call(
            &dev,
            &kv,
            &score,
            (&pk, &ps),
            &groups,
            &w,
            &pos,
            &mut got_pool,
            &sl,
        );
        assert_bitwise(&format!("compressor n {n} pool"), &got_pool, &want_pool);
        assert_bitwise(&format!("compressor n {n} latent"), &got_lat, &want_lat);
    }
}

/// One sequence fed in chunks, the partial group carried as the model
/// carries it (the pending token's kv/score row copied into the pending
/// tensors after each call): every call bitwise the CPU's, and the pool
/// after the last call bitwise the pool of the whole sequence in one call.
#[test]
fn partial_groups_carry_across_calls() {
    let dev = gpu();
    let mut rng = common::rng("compressor_partial_groups_cuda");
    let d = 512;
    let chunk_lists: Vec<Vec<usize>> = if quick() {
        vec![vec![1, 1, 3, 2, 1]]
    } else {
        vec![vec![1, 1, 1, 4, 3, 2, 129, 1, 128, 5], vec![4097, 1, 2, 3]]
    };
    for chunks in chunk_lists {
        let total: usize = chunks.iter().sum();
        let (kv, score) = projections(&mut rng, total, d);
        let w = norm_weight(&mut rng, d);
        let n_entries = total / 2;
        let all_pos: Vec<i64> = (0..n_entries as i64).map(|j| 2 * j).collect();
        // The pool row of entry j: shuffled.
        let np = n_entries + 3;
        let mut perm: Vec<i32> = (0..np as i32).collect();
        perm.shuffle(&mut rng);
        let mut pools = [
            pool(&Device::Cpu, KvRowFormat::Compressed, d, np),
            pool(&dev, KvRowFormat::Compressed, d, np),
        ];
        // The pending tensors hold one row per sequence (here: row 0).
        let mut pending = [
            Tensor::zeros(&Device::Cpu, DType::F32, &[1, d]).unwrap(),
            Tensor::zeros(&Device::Cpu, DType::F32, &[1, d]).unwrap(),
        ];
        let mut has_pending = false;
        let (mut start, mut entry) = (0, 0);
        for &len in &chunks {
            let ck = kv.narrow_rows(start, len).unwrap();
            let cs = score.narrow_rows(start, len).unwrap();
            let mut m: Vec<i32> = Vec::new();
            if has_pending {
                m.push(-1);
            }
            m.extend(0..len as i32);
            let tail = m.len() % 2 == 1;
            m.truncate(m.len() / 2 * 2);
            let n = m.len() / 2;
            if n > 0 {
                let groups = Tensor::from_vec(m, &[n, 2]).unwrap();
                let pos = Tensor::from_vec(all_pos[entry..entry + n].to_vec(), &[n]).unwrap();
                let sl = Tensor::from_vec(perm[entry..entry + n].to_vec(), &[n]).unwrap();
                let mut lat = Vec::new();
                for (p, device) in pools.iter_mut().zip([Device::Cpu, dev.clone()]) {
                    lat.push(compressor_call(
                        &device,
                        &ck,
                        &cs,
                        (&pending[0], &pending[1]),
                        &groups,
                        &w,
                        &pos,
                        p,
                        &sl,
                    ));
                }
                let label = format!("chunks {chunks:?} at {start}");
                assert_bitwise(&format!("{label} latent"), &lat[1], &lat[0]);
                assert_bitwise(&format!("{label} pool"), &pools[1], &pools[0]);
            }
            if tail {
                pending[0].copy_rows_from(0, &ck, len - 1, 1).unwrap();
                pending[1].copy_rows_from(0, &cs, len - 1, 1).unwrap();
            }
            has_pending = tail;
            start += len;
            entry += n;
        }
        // The whole sequence in one call.
        let m: Vec<i32> = (0..2 * n_entries as i32).collect();
        let groups = Tensor::from_vec(m, &[n_entries, 2]).unwrap();
        let pos = Tensor::from_vec(all_pos, &[n_entries]).unwrap();
        let sl = Tensor::from_vec(perm[..n_entries].to_vec(), &[n_entries]).unwrap();
        let mut whole = pool(&dev, KvRowFormat::Compressed, d, np);
        compressor_call(
            &dev,
            &kv,
            &score,
            (&pending[0], &pending[1]),
            &groups,
            &w,
            &pos,
            &mut whole,
            &sl,
        );
        assert_bitwise(&format!("chunks {chunks:?} vs whole"), &pools[1], &whole);
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let dev = gpu();
    let mut rng = common::rng("kv_writers_errors_cuda");
    let x = rows_bf16(&mut rng, 4, 512).to_device(&dev).unwrap();
    let w = norm_weight(&mut rng, 512).to_device(&dev).unwrap();
    let pos = positions(&mut rng, 4).to_device(&dev).unwrap();
    let sl = slots(&mut rng, 4, 8).to_device(&dev).unwrap();
    let shape_of = |e: Error| match e {
        Error::Shape { tensor, .. } => tensor,
        Error::Argument { arg, .. } => arg,
        Error::DeviceMismatch { tensor, .. } => tensor,
        e => panic!("unexpected error {e:?}"),
    };
    let rope = |rope_dim| {
        Some(RowRope {
            positions: &pos,
            rope_dim,
            params: &YARN,
        })
    };
    let norm = Some(RowNorm {
        weight: &w,
        eps: EPS,
    });
    // x: a width that is not a multiple of the group, the wrong dtype.
    let bad_x = rows_bf16(&mut rng, 4, 40).to_device(&dev).unwrap();
    let e = ops::kv_rows(&bad_x, KvRowFormat::Window, None, None).unwrap_err();
    assert_eq!(shape_of(e), "x");
    let f32_x = Tensor::zeros(&dev, DType::F32, &[4, 512]).unwrap();
    assert!(ops::kv_rows(&f32_x, KvRowFormat::Window, None, None).is_err());
    // The norm weight's length, positions' length, rope_dim beyond D.
    let short_w = norm_weight(&mut rng, 256).to_device(&dev).unwrap();
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
    assert_eq!(shape_of(e), "weight");
    let short_pos = positions(&mut rng, 3).to_device(&dev).unwrap();
    let e = ops::kv_rows(
        &x,
        KvRowFormat::Window,
        norm,
        Some(RowRope {
            positions: &short_pos,
            rope_dim: 64,
            params: &YARN,
        }),
    )
    .unwrap_err();
    assert_eq!(shape_of(e), "positions");
    let e = ops::kv_rows(&x, KvRowFormat::Window, norm, rope(514)).unwrap_err();
    assert_eq!(shape_of(e), "rope_dim");
    // CUDA limits: rope_dim beyond 256 or not a multiple of 8, D beyond 4096.
    let e = ops::kv_rows(&x, KvRowFormat::Window, norm, rope(320)).unwrap_err();
    assert_eq!(shape_of(e), "rope_dim");
    let e = ops::kv_rows(&x, KvRowFormat::Window, norm, rope(6)).unwrap_err();
    assert_eq!(shape_of(e), "rope_dim");
    let wide = Tensor::zeros(&dev, DType::BF16, &[1, 8192]).unwrap();
    let e = ops::kv_rows(&wide, KvRowFormat::Window, None, None).unwrap_err();
    assert_eq!(shape_of(e), "dim");
    // The pool's width and dtype, the slots' length, the latent's shape.
    let mut narrow = pool(&dev, KvRowFormat::Compressed, 512, 8);
    let e = ops::kv_rows_into(
        &x,
        KvRowFormat::Window,
        norm,
        rope(64),
        RowsOut {
            pool: &mut narrow,
            slots: &sl,
            latent: None,
        },
    )
    .unwrap_err();
    assert_eq!(shape_of(e), "pool");
    let mut p = pool(&dev, KvRowFormat::Window, 512, 8);
    let short_sl = slots(&mut rng, 3, 8).to_device(&dev).unwrap();
    let e = ops::kv_rows_into(
        &x,
        KvRowFormat::Window,
        norm,
        rope(64),
        RowsOut {
            pool: &mut p,
            slots: &short_sl,
            latent: None,
        },
    )
    .unwrap_err();
    assert_eq!(shape_of(e), "slots");
    let mut lat = Tensor::empty(&dev, DType::BF16, &[4, 256]).unwrap();
    let e = ops::kv_rows_into(
        &x,
        KvRowFormat::Window,
        norm,
        rope(64),
        RowsOut {
            pool: &mut p,
            slots: &sl,
            latent: Some(&mut lat),
        },
    )
    .unwrap_err();
    assert_eq!(shape_of(e), "latent");
    // A pool on the host with inputs on the GPU.
    let mut host_pool = pool(&Device::Cpu, KvRowFormat::Window, 512, 8);
    let e = ops::kv_rows_into(
        &x,
        KvRowFormat::Window,
        norm,
        rope(64),
        RowsOut {
            pool: &mut host_pool,
            slots: &sl,
            latent: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    // The compressor: score's shape, groups' shape, pending's width, an odd
    // compress_ratio2 row count, a width that is not a multiple of 8 on CUDA.
    let (kv, score) = projections(&mut rng, 6, 512);
    let (kv, score) = (kv.to_device(&dev).unwrap(), score.to_device(&dev).unwrap());
    let groups = Tensor::from_vec(vec![0i32, 1, 2, 3, 4, 5, -1, 0], &[4, 2])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let mut cp = pool(&dev, KvRowFormat::Compressed, 512, 8);
    let run = |kv: &Tensor,
               score: &Tensor,
               pending: (&Tensor, &Tensor),
               groups: &Tensor,
               cp: &mut Tensor| {
        ops::compressor_rows_into(
            kv,
            score,
            Some(pending),
            groups,
            RowNorm {
                weight: &w,
                eps: EPS,
            },
            RowRope {
                positions: &pos,
                rope_dim: 64,
                params: &YARN,
            },
            RowsOut {
                pool: cp,
                slots: &sl,
                latent: None,
            },
        )
        .unwrap_err()
    };
    let (pk, ps) = projections(&mut rng, 2, 512);
    let (pk, ps) = (pk.to_device(&dev).unwrap(), ps.to_device(&dev).unwrap());
    let short_score = score.narrow_rows(0, 5).unwrap();
    assert_eq!(
        shape_of(run(&kv, &short_score, (&pk, &ps), &groups, &mut cp)),
        "score"
    );
    let flat_groups = Tensor::from_vec(vec![0i32; 8], &[8])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    assert_eq!(
        shape_of(run(&kv, &score, (&pk, &ps), &flat_groups, &mut cp)),
        "groups"
    );
    let (wide_pk, _) = projections(&mut rng, 2, 256);
    let wide_pk = wide_pk.to_device(&dev).unwrap();
    assert_eq!(
        shape_of(run(&kv, &score, (&wide_pk, &ps), &groups, &mut cp)),
        "pending_kv"
    );
    let odd = kv.narrow_rows(0, 5).unwrap();
    let e = ops::compress_ratio2(&odd, &odd).unwrap_err();
    assert_eq!(shape_of(e), "kv");
    let (k12, s12) = projections(&mut rng, 2, 12);
    let e = ops::compress_ratio2(&k12.to_device(&dev).unwrap(), &s12.to_device(&dev).unwrap())
        .unwrap_err();
    assert_eq!(shape_of(e), "kv");
}
