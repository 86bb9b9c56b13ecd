//! The ops the model runner needed beyond the kernel families, on the CPU:
//! each against its reference (the `cpu_backend`/`kv_format` function it
//! lays out, or an independent f64 evaluation where the op adds arithmetic),
//! on fresh random inputs, plus the typed errors of bad shapes, dtypes and
//! ids; and the Tensor row copies the model's glue uses.

mod common;

use common::{bf16_close, random_activations, random_bf16};
use deepinfer::contract::{HC_STREAMS, ngram_ids};
use deepinfer::cpu_backend::{compressor, engram, mhc, moe};
use deepinfer::{DType, Error, Tensor, kv_format, ops};
use half::bf16;
use rand::Rng;

fn t_bf16(v: Vec<bf16>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

#[test]
fn embedding_gathers_rows_and_rejects_ids_outside_the_table() {
    let mut rng = common::rng("ops_embedding");
    let (v, d) = (37, 24);
    let table = random_bf16(&mut rng, v * d);
    let ids: Vec<i32> = (0..19).map(|_| rng.random_range(0..v as i32)).collect();
    let out = ops::embedding(
        &t_bf16(table.clone(), &[v, d]),
        &Tensor::from_vec(ids.clone(), &[19]).unwrap(),
    )
    .unwrap();
    let want: Vec<bf16> = ids
        .iter()
        .flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec())
        .collect();
    assert_eq!(out.to_vec::<bf16>().unwrap(), want);
    for bad in [v as i32, -1] {
        let e = ops::embedding(
            &t_bf16(table.clone(), &[v, d]),
            &Tensor::from_vec(vec![0, bad], &[2]).unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains(&bad.to_string()), "{e}");
    }
}

#[test]
fn argmax_takes_the_lowest_id_among_ties_and_never_a_nan() {
    let rows = vec![
        1.0f32,
        3.0,
        3.0,
        -1.0, //
        f32::NAN,
        2.0,
        f32::NAN,
        2.0, //
        -5.0,
        -5.0,
        -5.0,
        -5.0,
    ];
    let out = ops::argmax(&Tensor::from_vec(rows, &[3, 4]).unwrap()).unwrap();
    assert_eq!(out.to_vec::<i32>().unwrap(), vec![1, 1, 0]);
    let mut rng = common::rng("ops_argmax");
    let x: Vec<f32> = (0..5 * 101).map(|_| rng.random_range(-4.0..4.0)).collect();
    let got = ops::argmax(&Tensor::from_vec(x.clone(), &[5, 101]).unwrap()).unwrap();
    for (r, &g) in got.to_vec::<i32>().unwrap().iter().enumerate() {
        let row = &x[r * 101..(r + 1) * 101];
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        assert_eq!(g as usize, row.iter().position(|&v| v == max).unwrap());
    }
}

#[test]
fn cache_row_writers_are_the_kv_format_encoders() {
    let mut rng = common::rng("ops_cache_rows");
    for d in [32usize, 64, 512] {
        let x = random_activations(&mut rng, 7 * d, 3.0);
        let xt = t_bf16(x.clone(), &[7, d]);
        let w = ops::window_rows(&xt).unwrap();
        let c = ops::compressed_rows(&xt).unwrap();
        assert_eq!(w.dtype(), DType::U8);
        assert_eq!(w.shape(), [7, kv_format::window_row_bytes(d)]);
        assert_eq!(c.shape(), [7, kv_format::compressed_row_bytes(d)]);
        let ww: Vec<u8> = x.chunks(d).flat_map(kv_format::encode_window_row).collect();
        let cc: Vec<u8> = x
            .chunks(d)
            .flat_map(kv_format::encode_compressed_row)
            .collect();
        assert_eq!(w.to_vec::<u8>().unwrap(), ww);
        assert_eq!(c.to_vec::<u8>().unwrap(), cc);
    }
    let e = ops::window_rows(&t_bf16(vec![bf16::ONE; 3 * 48], &[3, 48])).unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "x", .. }), "{e}");
}

#[test]
fn ratio2_pooling_is_the_reference_per_pair() {
    let mut rng = common::rng("ops_compress");
    let (n, hd) = (5, 64);
    let kv: Vec<f32> = (0..2 * n * hd)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    let sc: Vec<f32> = (0..2 * n * hd)
        .map(|_| rng.random_range(-8.0..8.0))
        .collect();
    let out = ops::compress_ratio2(
        &Tensor::from_vec(kv.clone(), &[2 * n, hd]).unwrap(),
        &Tensor::from_vec(sc.clone(), &[2 * n, hd]).unwrap(),
    )
    .unwrap();
    let r = |v: &[f32], i: usize| v[i * hd..(i + 1) * hd].to_vec();
    let want: Vec<bf16> = (0..n)
        .flat_map(|j| {
            compressor::pool_ratio2(
                [&r(&kv, 2 * j), &r(&kv, 2 * j + 1)],
                [&r(&sc, 2 * j), &r(&sc, 2 * j + 1)],
            )
        })
        .collect();
    assert_eq!(out.to_vec::<bf16>().unwrap(), want);
    let e = ops::compress_ratio2(
        &Tensor::from_vec(vec![0.0f32; 3 * hd], &[3, hd]).unwrap(),
        &Tensor::from_vec(vec![0.0f32; 3 * hd], &[3, hd]).unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("even"), "{e}");
}

#[test]
fn grouped_linear_matches_an_f64_block_diagonal_product() {
    let mut rng = common::rng("ops_grouped_linear");
    let (t, g, k, n) = (6, 4, 96, 40);
    let x = random_activations(&mut rng, t * g * k, 2.0);
    let w = random_bf16(&mut rng, g * n * k);
    let out = ops::grouped_bf16_linear(
        &t_bf16(x.clone(), &[t, g * k]),
        &t_bf16(w.clone(), &[g * n, k]),
        g,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    for r in 0..t {
        for gi in 0..g {
            for c in 0..n {
                let (mut exact, mut abs) = (0.0f64, 0.0f64);
                for i in 0..k {
                    let p = x[r * g * k + gi * k + i].to_f64() * w[(gi * n + c) * k + i].to_f64();
                    exact += p;
                    abs += p.abs();
                }
                let got = out[r * g * n + gi * n + c];
                assert!(
                    bf16_close(got, exact, abs, k),
                    "[{r}, {gi}, {c}]: {got} vs {exact}"
                );
            }
        }
    }
    let e =
        ops::grouped_bf16_linear(&t_bf16(x, &[t, g * k]), &t_bf16(w, &[g * n, k]), 3).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
}

#[test]
fn engram_ops_are_the_reference_per_token_and_stream() {
    let mut rng = common::rng("ops_engram");
    let (t, d, hd) = (5, 64, 32);
    let primes: Vec<u64> = vec![11, 13, 17, 19, 23, 29];
    let mult = [3i64, 5, 7, 11];
    let history: Vec<Option<i64>> = (0..t).map(|_| Some(rng.random_range(0..1000))).collect();
    let ids: Vec<i64> = (0..t).flat_map(|p| ngram_ids(&history[..=p], 2)).collect();
    let rows = ops::engram_rows(
        &Tensor::from_vec(ids.clone(), &[t, 4]).unwrap(),
        &mult,
        &primes,
    )
    .unwrap();
    let want: Vec<i64> = ids
        .chunks(4)
        .flat_map(|c| {
            engram::table_rows(
                &engram::ngram_hashes(&c.try_into().unwrap(), &mult),
                &primes,
            )
        })
        .map(|r| r as i64)
        .collect();
    assert_eq!(rows.to_vec::<i64>().unwrap(), want);

    let n_rows: usize = primes.iter().sum::<u64>() as usize;
    let rb = hd + hd / 32;
    let table: Vec<u8> = (0..n_rows * rb)
        .map(|i| {
            if i % rb >= hd {
                rng.random_range(120..130)
            } else {
                rng.random_range(0..0x7e)
            }
        })
        .collect();
    let table_t = Tensor::from_vec(table.clone(), &[n_rows, rb]).unwrap();
    let looked = ops::engram_lookup(&table_t, &rows, hd).unwrap();
    let want_rows: Vec<u64> = want.iter().map(|&r| r as u64).collect();
    assert_eq!(
        looked.to_vec::<bf16>().unwrap(),
        engram::gather_rows(&table, &want_rows, hd)
    );
    let bad = Tensor::from_vec(vec![n_rows as i64; 6], &[1, 6]).unwrap();
    let e = ops::engram_lookup(&table_t, &bad, hd).unwrap_err();
    assert!(e.to_string().contains(&n_rows.to_string()), "{e}");

    let c = HC_STREAMS;
    let s = random_activations(&mut rng, t * c * d, 1.0);
    let kv = random_activations(&mut rng, t * (c + 1) * d, 1.0);
    let (qw, kw) = (random_bf16(&mut rng, c * d), random_bf16(&mut rng, c * d));
    let out = ops::engram_gate_update(
        &t_bf16(s.clone(), &[t, c, d]),
        &t_bf16(kv.clone(), &[t, c + 1, d]),
        &t_bf16(qw.clone(), &[c, d]),
        &t_bf16(kw.clone(), &[c, d]),
        1e-20,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    for tok in 0..t {
        let kvt = &kv[tok * (c + 1) * d..(tok + 1) * (c + 1) * d];
        for ci in 0..c {
            let sc = &s[(tok * c + ci) * d..(tok * c + ci + 1) * d];
            let g = engram::gate(
                sc,
                &kvt[ci * d..(ci + 1) * d],
                &qw[ci * d..(ci + 1) * d],
                &kw[ci * d..(ci + 1) * d],
                1e-20,
            );
            let want = engram::update(sc, g, &kvt[c * d..]);
            assert_eq!(
                &out[(tok * c + ci) * d..(tok * c + ci + 1) * d],
                want.as_slice()
            );
        }
    }
}

#[test]
fn stream_ops_are_the_mhc_reference_and_an_exact_mean() {
    let mut rng = common::rng("ops_streams");
    let (t, d) = (4, 48);
    let x = random_activations(&mut rng, t * d, 2.0);
    let init = ops::hc_init(&t_bf16(x.clone(), &[t, d])).unwrap();
    assert_eq!(init.shape(), [t, HC_STREAMS, d]);
    let iv = init.to_vec::<bf16>().unwrap();
    for tok in 0..t {
        for c in 0..HC_STREAMS {
            assert_eq!(
                &iv[(tok * HC_STREAMS + c) * d..][..d],
                &x[tok * d..(tok + 1) * d]
            );
        }
    }
    let s = random_activations(&mut rng, t * HC_STREAMS * d, 2.0);
    let pre: Vec<f32> = (0..t * HC_STREAMS)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let st = t_bf16(s.clone(), &[t, HC_STREAMS, d]);
    let u = ops::hc_collapse(
        &st,
        &Tensor::from_vec(pre.clone(), &[t, HC_STREAMS]).unwrap(),
    )
    .unwrap();
    let want: Vec<bf16> = (0..t)
        .flat_map(|i| {
            mhc::hc_collapse(
                &s[i * HC_STREAMS * d..(i + 1) * HC_STREAMS * d],
                &pre[i * 4..i * 4 + 4].try_into().unwrap(),
            )
        })
        .collect();
    assert_eq!(u.to_vec::<bf16>().unwrap(), want);
    let mean = ops::hc_stream_mean(&st).unwrap().to_vec::<bf16>().unwrap();
    for tok in 0..t {
        for x in 0..d {
            let terms: Vec<f64> = (0..HC_STREAMS)
                .map(|c| s[(tok * HC_STREAMS + c) * d + x].to_f64())
                .collect();
            let exact = terms.iter().sum::<f64>() / 4.0;
            let abs = terms.iter().map(|v| v.abs()).sum::<f64>() / 4.0;
            assert!(bf16_close(mean[tok * d + x], exact, abs, 4), "{tok},{x}");
        }
    }
}

#[test]
fn moe_permute_and_combine_follow_the_layout_and_expert_order() {
    let mut rng = common::rng("ops_moe");
    let (t, d, k, e) = (7, 32, 3, 9);
    let x = random_activations(&mut rng, t * d, 1.0);
    let mut ids = Vec::new();
    for _ in 0..t {
        let mut picks: Vec<i32> = (0..e as i32).collect();
        for i in 0..k {
            let j = rng.random_range(i..e);
            picks.swap(i, j);
        }
        let mut p = picks[..k].to_vec();
        p.sort_unstable();
        ids.extend(p);
    }
    let weights: Vec<f32> = (0..t * k).map(|_| rng.random_range(0.0..1.0)).collect();
    let ids_t = Tensor::from_vec(ids.clone(), &[t, k]).unwrap();
    let (_, _, perm) = ops::moe_layout(&ids_t, e).unwrap();
    let (xg, wg) = ops::moe_permute(
        &t_bf16(x.clone(), &[t, d]),
        &Tensor::from_vec(weights.clone(), &[t, k]).unwrap(),
        &perm,
    )
    .unwrap();
    let pv = perm.to_vec::<i32>().unwrap();
    let xgv = xg.to_vec::<bf16>().unwrap();
    for (i, &j) in pv.iter().enumerate() {
        assert_eq!(
            &xgv[i * d..(i + 1) * d],
            &x[j as usize / k * d..(j as usize / k + 1) * d]
        );
        assert_eq!(wg.to_vec::<f32>().unwrap()[i], weights[j as usize]);
    }
    // Routed rows in layout order, a shared row per token.
    let routed = random_activations(&mut rng, t * k * d, 1.0);
    let shared = random_activations(&mut rng, t * d, 1.0);
    let out = ops::moe_combine(
        &t_bf16(routed.clone(), &[t * k, d]),
        &perm,
        &t_bf16(shared.clone(), &[t, d]),
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    let mut pos = vec![0usize; t * k];
    for (i, &j) in pv.iter().enumerate() {
        pos[j as usize] = i;
    }
    for tok in 0..t {
        let rows: Vec<&[bf16]> = (0..k)
            .map(|s| &routed[pos[tok * k + s] * d..(pos[tok * k + s] + 1) * d])
            .collect();
        assert_eq!(
            &out[tok * d..(tok + 1) * d],
            moe::moe_combine(&rows, &shared[tok * d..(tok + 1) * d]).as_slice()
        );
    }
    let bad = Tensor::from_vec(
        vec![0i32; t * k - 1]
            .into_iter()
            .chain([(t * k) as i32])
            .collect::<Vec<_>>(),
        &[t * k],
    )
    .unwrap();
    let e =
        ops::moe_combine(&t_bf16(routed, &[t * k, d]), &bad, &t_bf16(shared, &[t, d])).unwrap_err();
    assert!(e.to_string().contains("permutation"), "{e}");
}

/// On the CPU the deferred MoE ops check at once and record nothing.
#[test]
fn deferred_moe_ops_check_at_once_on_the_cpu() {
    let (t, k, d) = (2usize, 2usize, 3usize);
    let x = t_bf16(vec![bf16::from_f32(0.5); t * d], &[t, d]);
    let w = Tensor::from_vec(vec![0.25f32; t * k], &[t, k]).unwrap();
    let bad = Tensor::from_vec(vec![0i32, 1, 2, 9], &[t * k]).unwrap();
    let mut checks = ops::DeviceChecks::new();
    let e = ops::moe_permute_deferred(&x, &w, &bad, &mut checks).unwrap_err();
    assert!(e.to_string().contains("permutation"), "{e}");
    let routed = t_bf16(vec![bf16::from_f32(1.0); t * k * d], &[t * k, d]);
    let e = ops::moe_combine_deferred(&routed, &bad, &x, &mut checks).unwrap_err();
    assert!(e.to_string().contains("permutation"), "{e}");
    assert_eq!(checks.pending(), 0);
    checks.verdict().unwrap();
}

#[test]
fn moe_permute_fp8_is_the_quantisation_of_the_permuted_rows() {
    let mut rng = common::rng("ops_moe_fp8");
    // D = 4096 (the model's), 80 (a short last scale block), 16.
    for &(t, d, k) in &[(5usize, 4096usize, 6usize), (7, 80, 3), (3, 16, 1)] {
        let x = t_bf16(random_activations(&mut rng, t * d, 1.0), &[t, d]);
        let w = Tensor::from_vec(
            (0..t * k).map(|_| rng.random_range(0.0f32..1.0)).collect(),
            &[t, k],
        )
        .unwrap();
        let mut order: Vec<i32> = (0..(t * k) as i32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let perm = Tensor::from_vec(order, &[t * k]).unwrap();
        let (xg, wg) = ops::moe_permute(&x, &w, &perm).unwrap();
        let (want_q, want_s) = ops::act_quant_fp8(&xg).unwrap();
        let (q, s) = ops::act_quant_fp8(&x).unwrap();
        let (got_q, got_s, got_w) = ops::moe_permute_fp8(&q, &s, &w, &perm).unwrap();
        let case = format!("T {t} D {d} k {k}");
        assert_eq!(got_q.shape(), want_q.shape(), "{case}");
        assert_eq!(got_s.shape(), want_s.shape(), "{case}");
        assert_eq!(
            got_q.to_le_bytes().unwrap(),
            want_q.to_le_bytes().unwrap(),
            "{case}: rows"
        );
        assert_eq!(
            got_s.to_le_bytes().unwrap(),
            want_s.to_le_bytes().unwrap(),
            "{case}: scales"
        );
        assert_eq!(
            got_w.to_vec::<f32>().unwrap(),
            wg.to_vec::<f32>().unwrap(),
            "{case}"
        );
    }
    // Typed errors: scales of another width, BF16 rows, an entry out of range.
    let (t, d, k) = (2usize, 64usize, 2usize);
    let x = t_bf16(random_activations(&mut rng, t * d, 1.0), &[t, d]);
    let (q, s) = ops::act_quant_fp8(&x).unwrap();
    let w = Tensor::from_vec(vec![0.5f32; t * k], &[t, k]).unwrap();
    let perm = Tensor::from_vec(vec![3i32, 2, 1, 0], &[t * k]).unwrap();
    let narrow = s.narrow_rows(0, 1).unwrap();
    let e = ops::moe_permute_fp8(&q, &narrow, &w, &perm).unwrap_err();
    assert!(
        e.to_string().contains("moe_permute_fp8") && e.to_string().contains('s'),
        "{e}"
    );
    let e = ops::moe_permute_fp8(&x, &s, &w, &perm).unwrap_err();
    assert!(e.to_string().contains("q"), "{e}");
    let bad = Tensor::from_vec(vec![3i32, 2, 9, 0], &[t * k]).unwrap();
    let e = ops::moe_permute_fp8(&q, &s, &w, &bad).unwrap_err();
    assert!(
        e.to_string().contains("permutation") && e.to_string().contains('9'),
        "{e}"
    );
}

#[test]
fn scalar_and_concat_ops_round_once_and_check_shapes() {
    let x = t_bf16(vec![bf16::from_f32(3.0), bf16::from_f32(-1.5)], &[2]);
    assert_eq!(
        ops::scale(&x, 0.25).unwrap().to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(0.75), bf16::from_f32(-0.375)]
    );
    let y = Tensor::from_vec(vec![1.0f32, 10.0], &[2]).unwrap();
    assert_eq!(
        ops::div_scalar(&y, 3.0).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0 / 3.0, 10.0 / 3.0]
    );
    assert_eq!(
        ops::add(&y, &y).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 20.0]
    );
    let e = ops::scale(&Tensor::from_vec(vec![1i32], &[1]).unwrap(), 2.0).unwrap_err();
    assert!(matches!(e, Error::DType { .. }), "{e}");
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = Tensor::from_vec(vec![5.0f32, 6.0], &[2, 1]).unwrap();
    let c = ops::cat_cols(&[&a, &b]).unwrap();
    assert_eq!(c.shape(), [2, 3]);
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]
    );
    let e = ops::cat_cols(&[&a, &Tensor::from_vec(vec![1.0f32; 3], &[3, 1]).unwrap()]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Packed FP4 (two values a byte, low nibble first) joins whole bytes:
    // [2, 4] and [2, 2] give each row its 2 + 1 bytes in order.
    let fa = Tensor::from_vec(
        [0x10u8, 0x32, 0x54, 0x76]
            .map(deepinfer::dtype::Fp4x2)
            .to_vec(),
        &[2, 4],
    )
    .unwrap();
    let fb = Tensor::from_vec(
        [0x98u8, 0xBA].map(deepinfer::dtype::Fp4x2).to_vec(),
        &[2, 2],
    )
    .unwrap();
    let fc = ops::cat_cols(&[&fa, &fb]).unwrap();
    assert_eq!(fc.shape(), [2, 6]);
    assert_eq!(
        fc.to_le_bytes().unwrap(),
        vec![0x10, 0x32, 0x98, 0x54, 0x76, 0xBA]
    );
    // An odd width would split a byte: such a part cannot be built.
    let e = Tensor::from_vec(vec![deepinfer::dtype::Fp4x2(0x21); 2], &[1, 3]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
}

#[test]
fn row_copies_move_whole_rows_and_check_ranges() {
    let a = Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), &[4, 3]).unwrap();
    let mid = a.narrow_rows(1, 2).unwrap();
    assert_eq!(
        mid.to_vec::<f32>().unwrap(),
        vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    let cat = Tensor::cat_rows(&[&mid, &a.narrow_rows(0, 1).unwrap()]).unwrap();
    assert_eq!(
        cat.to_vec::<f32>().unwrap(),
        vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 0.0, 1.0, 2.0]
    );
    let mut z = Tensor::zeros(&deepinfer::Device::Cpu, DType::F32, &[3, 3]).unwrap();
    z.copy_rows_from(2, &a, 3, 1).unwrap();
    assert_eq!(&z.to_vec::<f32>().unwrap()[6..], &[9.0, 10.0, 11.0]);
    assert!(a.narrow_rows(3, 2).is_err());
    assert!(
        z.copy_rows_from(
            0,
            &Tensor::from_vec(vec![0.0f32; 4], &[1, 4]).unwrap(),
            0,
            1
        )
        .is_err()
    );
    assert!(
        z.copy_rows_from(0, &Tensor::from_vec(vec![0i32; 3], &[1, 3]).unwrap(), 0, 1)
            .is_err()
    );
    let fp4 = Tensor::from_vec(vec![deepinfer::Fp4x2(0x21); 6], &[3, 4]).unwrap();
    assert_eq!(
        fp4.narrow_rows(1, 1)
            .unwrap()
            .to_vec::<deepinfer::Fp4x2>()
            .unwrap()
            .len(),
        2
    );
    assert!(a.clone().reshape(&[5, 2]).is_err());
    assert_eq!(a.reshape(&[2, 6]).unwrap().shape(), [2, 6]);
}
