//! The indexer op API on the CPU: index-key rows equal `kv_format`'s encoder,
//! scores equal `cpu_backend::indexer::index_scores` (shared and per-row key
//! caches, clamped `visible`), the top-k equals `select` and, independently,
//! the definition (k best, ties to the lower index, ascending, −1 for picks at
//! or beyond `visible`, offset added) on score rows full of ties and −∞; and
//! every documented shape, dtype and argument limit is a typed error.

mod common;

use deepinfer::cpu_backend::{indexer, kv_format};
use deepinfer::{DType, Error, Fp4x2, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

fn fp4_bytes(t: &Tensor) -> Vec<u8> {
    t.as_slice::<Fp4x2>().unwrap().iter().map(|b| b.0).collect()
}

fn rows_tensor(rows: &[Vec<u8>], shape: &[usize]) -> Tensor {
    let bytes: Vec<Fp4x2> = rows.iter().flatten().map(|&b| Fp4x2(b)).collect();
    Tensor::from_vec(bytes, shape).unwrap()
}

#[test]
fn index_key_quant_is_the_kv_format_encoder() {
    let mut rng = common::rng("index_key_quant_cpu");
    for (rows, dim) in [(1, 32), (5, 128), (3, 96), (0, 128)] {
        let x = common::random_bf16(&mut rng, rows * dim);
        let t = ops::index_key_quant(&Tensor::from_vec(x.clone(), &[rows, dim]).unwrap()).unwrap();
        assert_eq!(t.shape(), [rows, ops::index_key_row_nibbles(dim)]);
        let want: Vec<u8> = x
            .chunks_exact(dim)
            .flat_map(kv_format::encode_index_key_row)
            .collect();
        assert_eq!(fp4_bytes(&t), want, "rows {rows} dim {dim}");
    }
}

/// Random index-key rows from activations of scale `s`.
fn key_rows(rng: &mut StdRng, n: usize, dim: usize, s: f32) -> Vec<Vec<u8>> {
    common::random_activations(rng, n * dim, s)
        .chunks_exact(dim)
        .map(kv_format::encode_index_key_row)
        .collect()
}

fn decode(rows: &[Vec<u8>], dim: usize) -> Vec<bf16> {
    rows.iter()
        .flat_map(|r| kv_format::decode_index_key_row(r, dim))
        .collect()
}

#[test]
fn index_scores_match_the_reference() {
    let mut rng = common::rng("index_scores_cpu");
    let (heads, dim, n, batch) = (4, 64, 37, 3);
    let q = key_rows(&mut rng, batch * heads, dim, 1.0);
    let keys = key_rows(&mut rng, batch * n, dim, 1.0);
    let w: Vec<bf16> = common::random_activations(&mut rng, batch * heads, 0.05);
    let visible = vec![0, 20, 99];
    let r = ops::index_key_row_nibbles(dim);
    let qt = rows_tensor(&q, &[batch, heads, r]);
    let wt = Tensor::from_vec(w.clone(), &[batch, heads]).unwrap();
    let vt = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
    // Per-row caches.
    let per_row = ops::index_scores(&qt, &wt, &rows_tensor(&keys, &[batch, n, r]), &vt).unwrap();
    // One shared cache (the first row's keys).
    let shared = ops::index_scores(&qt, &wt, &rows_tensor(&keys[..n], &[n, r]), &vt).unwrap();
    let (per_row, shared) = (
        per_row.as_slice::<bf16>().unwrap(),
        shared.as_slice::<bf16>().unwrap(),
    );
    for b in 0..batch {
        let qd = decode(&q[b * heads..(b + 1) * heads], dim);
        let vis = (visible[b] as usize).min(n);
        let wh = &w[b * heads..(b + 1) * heads];
        for (keys_b, got) in [
            (&keys[b * n..(b + 1) * n], &per_row[b * n..(b + 1) * n]),
            (&keys[..n], &shared[b * n..(b + 1) * n]),
        ] {
            let want = indexer::index_scores(&qd, &decode(keys_b, dim), wh, dim, vis);
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_f32().to_bits(), w.to_bits(), "b {b} t {t}");
            }
        }
    }
}

/// A score row with many exact ties, −∞ entries and both signs.
fn tied_scores(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let palette = [f32::NEG_INFINITY, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0];
    (0..n)
        .map(|_| bf16::from_f32(palette[rng.random_range(0..palette.len())]))
        .collect()
}

/// `select` from its definition, independent of the reference's sort.
fn select_by_definition(row: &[f32], k: usize, visible: usize, offset: usize) -> Vec<i32> {
    let mut picked = vec![false; row.len()];
    for _ in 0..k {
        let best = (0..row.len())
            .filter(|&t| !picked[t])
            .fold(None, |b: Option<usize>, t| match b {
                Some(b) if row[b].total_cmp(&row[t]).is_ge() => Some(b),
                _ => Some(t),
            })
            .unwrap();
        picked[best] = true;
    }
    let live = (0..row.len())
        .filter(|&t| picked[t] && t < visible)
        .map(|t| (t + offset) as i32);
    let dead = (0..row.len())
        .filter(|&t| picked[t] && t >= visible)
        .map(|_| -1);
    live.chain(dead).collect()
}

#[test]
fn index_topk_matches_select_and_its_definition() {
    let mut rng = common::rng("index_topk_cpu");
    for (n, k, batch) in [
        (1, 1, 1),
        (7, 3, 3),
        (100, 17, 2),
        (300, 300, 1),
        (513, 64, 2),
    ] {
        let s = tied_scores(&mut rng, batch * n);
        let visible: Vec<i32> = (0..batch)
            .map(|_| rng.random_range(-2..n as i32 + 3))
            .collect();
        let offset = rng.random_range(0..200);
        let got = ops::index_topk(
            &Tensor::from_vec(s.clone(), &[batch, n]).unwrap(),
            &Tensor::from_vec(visible.clone(), &[batch]).unwrap(),
            k,
            offset,
        )
        .unwrap();
        assert_eq!(got.shape(), [batch, k]);
        let got = got.as_slice::<i32>().unwrap();
        for b in 0..batch {
            let row: Vec<f32> = s[b * n..(b + 1) * n].iter().map(|v| v.to_f32()).collect();
            let vis = visible[b].clamp(0, n as i32) as usize;
            let want = indexer::select(&row, k, vis, offset);
            assert_eq!(
                &got[b * k..(b + 1) * k],
                want.as_slice(),
                "n {n} k {k} b {b}"
            );
            assert_eq!(
                want,
                select_by_definition(&row, k, vis, offset),
                "n {n} k {k} b {b}"
            );
        }
    }
}

#[test]
fn indexer_ops_reject_bad_inputs_with_typed_errors() {
    let bf = |shape: &[usize]| Tensor::empty(&deepinfer::Device::Cpu, DType::BF16, shape).unwrap();
    let fp4 =
        |shape: &[usize]| Tensor::empty(&deepinfer::Device::Cpu, DType::F4E2M1x2, shape).unwrap();
    let i32s = |shape: &[usize]| Tensor::empty(&deepinfer::Device::Cpu, DType::I32, shape).unwrap();
    let shape_of = |e: Error| match e {
        Error::Shape { tensor, .. } => tensor,
        e => panic!("expected a shape error, got {e}"),
    };
    // Row writer: dim must be a positive multiple of 32, x BF16.
    assert_eq!(
        shape_of(ops::index_key_quant(&bf(&[2, 48])).unwrap_err()),
        "x"
    );
    assert!(matches!(
        ops::index_key_quant(&fp4(&[2, 32])).unwrap_err(),
        Error::DType { tensor: "x", .. }
    ));
    let mut wrong = fp4(&[2, 34]);
    assert_eq!(
        shape_of(ops::index_key_quant_into(&bf(&[2, 64]), &mut wrong).unwrap_err()),
        "out"
    );
    // Scores.
    let (q, w, keys, vis) = (fp4(&[2, 4, 136]), bf(&[2, 4]), fp4(&[9, 136]), i32s(&[2]));
    assert_eq!(
        ops::index_scores(&q, &w, &keys, &vis).unwrap().shape(),
        [2, 9]
    );
    assert_eq!(
        shape_of(ops::index_scores(&fp4(&[2, 4, 70]), &w, &keys, &vis).unwrap_err()),
        "q"
    );
    assert_eq!(
        shape_of(ops::index_scores(&fp4(&[8, 136]), &w, &keys, &vis).unwrap_err()),
        "q"
    );
    assert_eq!(
        shape_of(ops::index_scores(&q, &w, &fp4(&[9, 68]), &vis).unwrap_err()),
        "keys"
    );
    assert_eq!(
        shape_of(ops::index_scores(&q, &w, &fp4(&[3, 9, 136]), &vis).unwrap_err()),
        "keys"
    );
    assert_eq!(
        shape_of(ops::index_scores(&q, &bf(&[2, 5]), &keys, &vis).unwrap_err()),
        "w"
    );
    assert_eq!(
        shape_of(ops::index_scores(&q, &w, &keys, &i32s(&[3])).unwrap_err()),
        "visible"
    );
    assert!(matches!(
        ops::index_scores(&q, &w, &keys, &bf(&[2])).unwrap_err(),
        Error::DType {
            tensor: "visible",
            ..
        }
    ));
    let big = fp4(&[1, 96, 136]);
    assert_eq!(
        shape_of(ops::index_scores(&big, &bf(&[1, 96]), &keys, &i32s(&[1])).unwrap_err()),
        "q"
    );
    let mut out = bf(&[2, 8]);
    assert_eq!(
        shape_of(ops::index_scores_into(&q, &w, &keys, &vis, &mut out).unwrap_err()),
        "out"
    );
    // Top-k.
    let s = bf(&[2, 10]);
    assert_eq!(ops::index_topk(&s, &vis, 10, 0).unwrap().shape(), [2, 10]);
    assert!(matches!(
        ops::index_topk(&s, &vis, 11, 0).unwrap_err(),
        Error::Argument { arg: "k", .. }
    ));
    assert!(matches!(
        ops::index_topk(&s, &vis, 3, i32::MAX as usize).unwrap_err(),
        Error::Argument { arg: "offset", .. }
    ));
    assert_eq!(
        shape_of(ops::index_topk(&bf(&[10]), &vis, 3, 0).unwrap_err()),
        "scores"
    );
    assert_eq!(
        shape_of(ops::index_topk(&s, &i32s(&[1]), 3, 0).unwrap_err()),
        "visible"
    );
    let mut out = i32s(&[2, 4]);
    assert_eq!(
        shape_of(ops::index_topk_into(&s, &vis, 3, 0, &mut out).unwrap_err()),
        "out"
    );
}
