//! The indexer op API on the CPU: index-key rows equal `kv_format`'s encoder,
//! scores equal `cpu_backend::indexer::index_scores` (shared and per-row key
//! caches, clamped `visible`), the top-k equals `select` and, independently,
//! the definition (k best, ties to the lower index, ascending, −1 for picks at
//! or beyond `visible`, offset added) on score rows full of ties and −∞; the
//! candidate list is `candidate_mask`'s kept blocks and, independently, the
//! definition by rank (block maxima, pinned newest block, ties to the lower
//! block, −∞ blocks dropped); the masked scores are `mask_scores` on the BF16
//! bits (garbage lists: the union of their in-range blocks); reindex is
//! `select(mask_scores(..))`; and every documented shape, dtype and argument
//! limit is a typed error.

mod common;

use deepinfer::cpu_backend::indexer;
use deepinfer::kv_format;
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

/// `index_scores_paged` by its definition: row b's key t is pool row
/// `pages[b][t / page_rows] · page_rows + t % page_rows`, scored by the
/// reference against that row's decoded keys; a page outside the pool
/// (negative, or at or past its whole pages: the pool's partial last page
/// does not count) and keys at or past `visible` score −∞.
#[test]
fn paged_index_scores_follow_the_page_table() {
    let mut rng = common::rng("index_scores_paged_cpu");
    let (heads, dim, page_rows, batch, width) = (4, 64, 8, 3, 5);
    let pool_pages = 6;
    // A partial seventh page: 3 rows past the whole pages.
    let pool = key_rows(&mut rng, pool_pages * page_rows + 3, dim, 1.0);
    let q = key_rows(&mut rng, batch * heads, dim, 1.0);
    let w: Vec<bf16> = common::random_activations(&mut rng, batch * heads, 0.05);
    let mut pages: Vec<i32> = (0..batch * width)
        .map(|_| rng.random_range(0..pool_pages as i32))
        .collect();
    pages[3] = -1;
    pages[width + 1] = pool_pages as i32; // the partial page
    pages[2 * width + 4] = 1 << 30;
    let n = width * page_rows;
    let visible = vec![n as i32, 17, 0];
    let r = ops::index_key_row_nibbles(dim);
    let got = ops::index_scores_paged(
        &rows_tensor(&q, &[batch, heads, r]),
        &Tensor::from_vec(w.clone(), &[batch, heads]).unwrap(),
        &rows_tensor(&pool, &[pool.len(), r]),
        &Tensor::from_vec(pages.clone(), &[batch, width]).unwrap(),
        page_rows,
        &Tensor::from_vec(visible.clone(), &[batch]).unwrap(),
    )
    .unwrap();
    assert_eq!(got.shape(), [batch, n]);
    let got = got.as_slice::<bf16>().unwrap();
    for b in 0..batch {
        let qd = decode(&q[b * heads..(b + 1) * heads], dim);
        let wh = &w[b * heads..(b + 1) * heads];
        for t in 0..n {
            let page = pages[b * width + t / page_rows];
            let want = match usize::try_from(page) {
                Ok(p) if p < pool_pages && t < visible[b] as usize => {
                    let key = &pool[p * page_rows + t % page_rows];
                    indexer::index_scores(&qd, &decode(std::slice::from_ref(key), dim), wh, dim, 1)
                        [0]
                }
                _ => f32::NEG_INFINITY,
            };
            assert_eq!(
                got[b * n + t].to_f32().to_bits(),
                want.to_bits(),
                "b {b} t {t} page {page}"
            );
        }
    }
    // Typed errors: a page list of another batch, page_rows 0, F32 pages.
    let qt = rows_tensor(&q, &[batch, heads, r]);
    let wt = Tensor::from_vec(w.clone(), &[batch, heads]).unwrap();
    let pt = rows_tensor(&pool, &[pool.len(), r]);
    let vt = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
    let short = Tensor::from_vec(vec![0i32; 2 * width], &[2, width]).unwrap();
    let e = ops::index_scores_paged(&qt, &wt, &pt, &short, page_rows, &vt).unwrap_err();
    assert!(e.to_string().contains("pages"), "{e}");
    let ok = Tensor::from_vec(pages.clone(), &[batch, width]).unwrap();
    let e = ops::index_scores_paged(&qt, &wt, &pt, &ok, 0, &vt).unwrap_err();
    assert!(e.to_string().contains("page_rows"), "{e}");
    let f = Tensor::from_vec(vec![0f32; batch * width], &[batch, width]).unwrap();
    assert!(matches!(
        ops::index_scores_paged(&qt, &wt, &pt, &f, page_rows, &vt),
        Err(Error::DType { .. })
    ));
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

/// A candidate-source row: [`common::candidate_palette`], sparse rows −∞
/// with probability 0.8.
fn candidate_row(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    common::candidate_row(rng, n, &common::candidate_palette(), 0.8)
}

/// The candidate list by definition: block j is kept iff its score is not
/// −∞ and fewer than `width` blocks rank above it (higher score, or equal
/// score and lower index).
fn candidates_by_definition(row: &[bf16], visible: usize, block: usize, keep: usize) -> Vec<i32> {
    let n = row.len();
    let blocks = n.div_ceil(block);
    let width = keep.min(blocks);
    let mut bs: Vec<f32> = (0..blocks)
        .map(|j| {
            let mut best = f32::NEG_INFINITY;
            for v in row
                .iter()
                .take(visible.min((j + 1) * block))
                .skip(j * block)
            {
                let v = v.to_f32();
                if !v.is_nan() && v > best {
                    best = v;
                }
            }
            best
        })
        .collect();
    if visible > 0 {
        bs[(visible - 1) / block] = f32::INFINITY;
    }
    let mut list: Vec<i32> = (0..blocks)
        .filter(|&j| {
            let rank = (0..blocks)
                .filter(|&i| bs[i] > bs[j] || (bs[i] == bs[j] && i < j))
                .count();
            bs[j] > f32::NEG_INFINITY && rank < width
        })
        .map(|j| j as i32)
        .collect();
    list.resize(width, -1);
    list
}

/// The CUDA path's composition, step by step on the CPU: block maxima by
/// order keys (NaN skipped, pinned block +∞), the exact top-k of the block
/// scores as `select` with the ENTRY count `visible` passed as the top-k's
/// visible (clamped to the block count there, as the kernel does) and
/// offset 0, then the compaction dropping −1 picks and −∞ blocks.
fn candidates_as_the_gpu_composes_them(
    row: &[bf16],
    visible: i32,
    block: usize,
    keep: usize,
) -> Vec<i32> {
    let n = row.len();
    let blocks = n.div_ceil(block);
    let width = keep.min(blocks);
    let vis = visible.clamp(0, n as i32) as usize;
    let key = |b: u16| -> u32 {
        if b & 0x8000 != 0 {
            !(b as u32) & 0xFFFF
        } else {
            b as u32 | 0x8000
        }
    };
    let unkey = |k: u32| -> u16 {
        if k & 0x8000 != 0 {
            (k & 0x7FFF) as u16
        } else {
            (!k & 0xFFFF) as u16
        }
    };
    let bs: Vec<f32> = (0..blocks)
        .map(|j| {
            if vis > 0 && j == (vis - 1) / block {
                return f32::INFINITY;
            }
            let mut best = 0x007F;
            for v in row.iter().take(vis.min((j + 1) * block)).skip(j * block) {
                let k = key(v.to_bits());
                if (0x007F..=0xFF80).contains(&k) && k > best {
                    best = k;
                }
            }
            bf16::from_bits(unkey(best)).to_f32()
        })
        .collect();
    let topk_visible = visible.clamp(0, blocks as i32) as usize;
    let mut list: Vec<i32> = indexer::select(&bs, width, topk_visible, 0)
        .into_iter()
        .filter(|&j| j >= 0 && bs[j as usize] > f32::NEG_INFINITY)
        .collect();
    list.resize(width, -1);
    list
}

fn mask_of_list(list: &[i32], n: usize, block: usize) -> Vec<bool> {
    let mut mask = vec![false; n];
    for &c in list.iter().filter(|&&c| c >= 0) {
        let lo = c as usize * block;
        mask[lo..(lo + block).min(n)].fill(true);
    }
    mask
}

#[test]
fn index_candidates_are_the_candidate_mask_and_the_definition() {
    let mut rng = common::rng("index_candidates_cpu");
    for n in [1, 7, 8, 9, 63, 64, 65, 200, 1031] {
        for (block, keep) in [
            (8, 2048),
            (8, 3),
            (8, 1),
            (1, 5),
            (3, 4),
            (8, 0),
            (5, 1 << 40),
        ] {
            let visible = common::candidate_visibles(&mut rng, n, block);
            let batch = visible.len();
            let rows: Vec<Vec<bf16>> = (0..batch).map(|_| candidate_row(&mut rng, n)).collect();
            let st = Tensor::from_vec(rows.concat(), &[batch, n]).unwrap();
            let vt = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
            let got = ops::index_candidates(&st, &vt, block, keep).unwrap();
            let width = ops::index_candidate_width(n, block, keep);
            assert_eq!(got.shape(), [batch, width]);
            let got = got.to_vec::<i32>().unwrap();
            for b in 0..batch {
                let list = &got[b * width..(b + 1) * width];
                let vis = visible[b].clamp(0, n as i32) as usize;
                let what = format!("n {n} block {block} keep {keep} visible {}", visible[b]);
                let row: Vec<f32> = rows[b].iter().map(|v| v.to_f32()).collect();
                assert_eq!(
                    mask_of_list(list, n, block),
                    indexer::candidate_mask(&row, vis, block, keep),
                    "{what}"
                );
                assert_eq!(
                    list,
                    candidates_by_definition(&rows[b], vis, block, keep).as_slice(),
                    "{what}"
                );
                assert_eq!(
                    list,
                    candidates_as_the_gpu_composes_them(&rows[b], visible[b], block, keep)
                        .as_slice(),
                    "{what}: GPU composition"
                );
                // Another +∞ block with a lower index can outrank the pinned one.
                let inf = rows[b][..vis].contains(&bf16::INFINITY);
                if vis > 0 && width > 0 && !inf {
                    assert!(
                        list.contains(&(((vis - 1) / block) as i32)),
                        "{what}: pinned"
                    );
                }
            }
        }
    }
}

#[test]
fn index_mask_scores_and_reindex_follow_the_reference() {
    let mut rng = common::rng("index_reindex_cpu");
    for n in [1, 9, 64, 517, 2049] {
        let block = 8;
        let visible = common::candidate_visibles(&mut rng, n, block);
        let batch = visible.len();
        let src: Vec<Vec<bf16>> = (0..batch).map(|_| candidate_row(&mut rng, n)).collect();
        let own: Vec<Vec<bf16>> = (0..batch).map(|_| tied_row_cpu(&mut rng, n)).collect();
        let st = Tensor::from_vec(src.concat(), &[batch, n]).unwrap();
        let ot = Tensor::from_vec(own.concat(), &[batch, n]).unwrap();
        let vt = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
        let keep = 7;
        let cand = ops::index_candidates(&st, &vt, block, keep).unwrap();
        let masked = ops::index_mask_scores(&ot, &cand, block)
            .unwrap()
            .to_vec::<bf16>()
            .unwrap();
        let width = cand.shape()[1];
        let lists = cand.to_vec::<i32>().unwrap();
        for k in [1, 7, 64, n].into_iter().filter(|&k| k <= n) {
            let got = ops::index_reindex_topk(&ot, &cand, block, &vt, k, 128)
                .unwrap()
                .to_vec::<i32>()
                .unwrap();
            for b in 0..batch {
                let vis = visible[b].clamp(0, n as i32) as usize;
                let srow: Vec<f32> = src[b].iter().map(|v| v.to_f32()).collect();
                let orow: Vec<f32> = own[b].iter().map(|v| v.to_f32()).collect();
                let mask = indexer::candidate_mask(&srow, vis, block, keep);
                let want = indexer::mask_scores(&orow, &mask);
                let m = &masked[b * n..(b + 1) * n];
                for t in 0..n {
                    // Bits where kept (NaN payloads included), −∞ elsewhere.
                    let w = if mask[t] {
                        own[b][t]
                    } else {
                        bf16::NEG_INFINITY
                    };
                    assert_eq!(m[t].to_bits(), w.to_bits(), "n {n} b {b} t {t}");
                    // The reference works on the exact f32 values of the row.
                    assert_eq!(
                        m[t].to_f32().to_bits(),
                        want[t].to_bits(),
                        "n {n} b {b} t {t}"
                    );
                }
                assert_eq!(
                    &got[b * k..(b + 1) * k],
                    indexer::select(&want, k, vis, 128).as_slice(),
                    "n {n} k {k} b {b}"
                );
                assert_eq!(
                    mask_of_list(&lists[b * width..(b + 1) * width], n, block),
                    mask
                );
            }
        }
    }
    // Lists that are not index_candidates' output: any order, duplicates and
    // out-of-range entries (ignored); the mask is the union of listed blocks.
    let n = 45;
    let row: Vec<bf16> = (0..n).map(|t| bf16::from_f32(t as f32)).collect();
    let st = Tensor::from_vec(row.clone(), &[1, n]).unwrap();
    let list = vec![5, -1, 2, 2, 6, 99, i32::MIN, 0];
    let ct = Tensor::from_vec(list.clone(), &[1, list.len()]).unwrap();
    let got = ops::index_mask_scores(&st, &ct, 8)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    for t in 0..n {
        let listed = [5, 2, 0].contains(&(t / 8));
        let w = if listed { row[t] } else { bf16::NEG_INFINITY };
        assert_eq!(got[t].to_bits(), w.to_bits(), "t {t}");
    }
}

/// Own-layer score rows for reindex: ties, −0 and +0, NaN and ±∞.
fn tied_row_cpu(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let palette = [
        bf16::NEG_INFINITY,
        bf16::from_f32(-1.0),
        bf16::NEG_ZERO,
        bf16::ZERO,
        bf16::from_f32(0.25),
        bf16::from_f32(2.0),
        bf16::INFINITY,
        bf16::from_bits(0x7FC0),
    ];
    (0..n)
        .map(|_| palette[rng.random_range(0..palette.len())])
        .collect()
}

#[test]
fn candidate_ops_reject_bad_inputs_with_typed_errors() {
    let cpu = deepinfer::Device::Cpu;
    let bf = |shape: &[usize]| Tensor::empty(&cpu, DType::BF16, shape).unwrap();
    let i32s = |shape: &[usize]| Tensor::empty(&cpu, DType::I32, shape).unwrap();
    let shape_of = |e: Error| match e {
        Error::Shape { tensor, .. } => tensor,
        e => panic!("expected a shape error, got {e}"),
    };
    let arg_of = |e: Error| match e {
        Error::Argument { arg, .. } => arg,
        e => panic!("expected an argument error, got {e}"),
    };
    let (s, vis) = (
        bf(&[2, 20]),
        Tensor::from_vec(vec![20i32, 3], &[2]).unwrap(),
    );
    let s = Tensor::from_vec(vec![bf16::ONE; 40], s.shape()).unwrap();
    assert_eq!(
        ops::index_candidates(&s, &vis, 8, 2048).unwrap().shape(),
        [2, 3]
    );
    assert_eq!(
        ops::index_candidates(&s, &vis, 8, 2).unwrap().shape(),
        [2, 2]
    );
    assert_eq!(
        arg_of(ops::index_candidates(&s, &vis, 0, 4).unwrap_err()),
        "block"
    );
    assert_eq!(
        arg_of(ops::index_candidates(&s, &vis, 4097, 4).unwrap_err()),
        "block"
    );
    assert_eq!(
        shape_of(ops::index_candidates(&bf(&[40]), &vis, 8, 4).unwrap_err()),
        "scores"
    );
    assert_eq!(
        shape_of(ops::index_candidates(&s, &i32s(&[3]), 8, 4).unwrap_err()),
        "visible"
    );
    assert!(matches!(
        ops::index_candidates(&i32s(&[2, 20]), &vis, 8, 4).unwrap_err(),
        Error::DType {
            tensor: "scores",
            ..
        }
    ));
    let mut out = i32s(&[2, 4]);
    assert_eq!(
        shape_of(ops::index_candidates_into(&s, &vis, 8, 2048, &mut out).unwrap_err()),
        "out"
    );
    let cand = Tensor::from_vec(vec![0i32, -1, 2, 1, 0, -1], &[2, 3]).unwrap();
    assert_eq!(
        ops::index_mask_scores(&s, &cand, 8).unwrap().shape(),
        [2, 20]
    );
    assert_eq!(
        shape_of(ops::index_mask_scores(&s, &i32s(&[3, 3]), 8).unwrap_err()),
        "candidates"
    );
    assert_eq!(
        shape_of(ops::index_mask_scores(&s, &i32s(&[6]), 8).unwrap_err()),
        "candidates"
    );
    assert!(matches!(
        ops::index_mask_scores(&s, &bf(&[2, 3]), 8).unwrap_err(),
        Error::DType {
            tensor: "candidates",
            ..
        }
    ));
    assert_eq!(
        arg_of(ops::index_mask_scores(&s, &cand, 0).unwrap_err()),
        "block"
    );
    let mut out = bf(&[2, 19]);
    assert_eq!(
        shape_of(ops::index_mask_scores_into(&s, &cand, 8, &mut out).unwrap_err()),
        "out"
    );
    assert_eq!(
        ops::index_reindex_topk(&s, &cand, 8, &vis, 20, 0)
            .unwrap()
            .shape(),
        [2, 20]
    );
    assert_eq!(
        arg_of(ops::index_reindex_topk(&s, &cand, 8, &vis, 21, 0).unwrap_err()),
        "k"
    );
    assert_eq!(
        arg_of(ops::index_reindex_topk(&s, &cand, 8, &vis, 3, i32::MAX as usize).unwrap_err()),
        "offset"
    );
    assert_eq!(
        shape_of(ops::index_reindex_topk(&s, &cand, 8, &i32s(&[1]), 3, 0).unwrap_err()),
        "visible"
    );
    let mut out = i32s(&[2, 4]);
    assert_eq!(
        shape_of(ops::index_reindex_topk_into(&s, &cand, 8, &vis, 3, 0, &mut out).unwrap_err()),
        "out"
    );
}
