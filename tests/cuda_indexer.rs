//! The indexer kernels against the CPU reference: index-key rows bitwise
//! (`kv_format::encode_index_key_row`), index scores bitwise
//! (`cpu_backend::indexer::index_scores`) from both score kernels (the exact
//! SIMT one keeps the reference's order; the tensor-core one is exact inside
//! its domain and falls back to the reference's order outside it), and the
//! top-k list exactly equal to `select` on the SAME scores (the GPU's), on
//! rows full of ties and −∞, with visible < k, visible = 0 and n not a
//! multiple of anything; the candidate-block path (candidate lists, masked
//! scores, reindex top-k) exactly equal to the CPU op on the same scores, at
//! contexts around multiples of 8 and of 2048·8, with visible < n. Outputs
//! are poisoned (0xFF bytes, or a sentinel where −1 / NaN are valid outputs)
//! before the kernels run, so an unwritten element fails the comparison. DEEPINFER_QUICK=1 keeps
//! to small shapes (the compute-sanitizer pass). Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU.
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::device::CudaDevice;
use deepinfer::kv_format;
use deepinfer::ops::ScoreKernel;
use deepinfer::{DType, Device, Error, Fp4x2, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

fn quick() -> bool {
    std::env::var("DEEPINFER_QUICK").is_ok_and(|v| v == "1")
}

/// Context lengths of the brief; the quick pass keeps the small ones.
fn contexts() -> Vec<usize> {
    let all = [1, 7, 511, 512, 513, 4096, 70001];
    all.into_iter().filter(|&n| !quick() || n <= 513).collect()
}

fn fp4_bytes(t: &Tensor) -> Vec<u8> {
    t.to_vec::<Fp4x2>().unwrap().iter().map(|b| b.0).collect()
}

#[test]
fn index_key_rows_are_bitwise_equal_to_the_encoder() {
    let dev = gpu();
    let mut rng = common::rng("index_key_quant_cuda");
    let mut shapes = vec![(1, 128), (7, 32), (5, 96), (3, 256), (0, 128)];
    shapes.extend(contexts().into_iter().map(|n| (n, 128)));
    for (rows, dim) in shapes {
        // Wide-range values (zeros, −0, 2^-20..2^12) and activation-like rows.
        let mut x = common::random_bf16(&mut rng, rows * dim);
        if rows > 2 {
            x[..dim].fill(bf16::NEG_ZERO);
            x[dim..2 * dim].copy_from_slice(&common::random_activations(&mut rng, dim, 1e-3));
        }
        // Non-finite values (issue 15): their 32-blocks get the NaN scale
        // 0xFF and code 7 in every element.
        if rows > 3 {
            x[2 * dim + 3] = bf16::NAN;
            x[3 * dim] = bf16::NEG_INFINITY;
            x[3 * dim + dim - 1] = -bf16::NAN;
        }
        let xt = Tensor::from_vec(x.clone(), &[rows, dim]).unwrap();
        let got = fp4_bytes(&ops::index_key_quant(&xt.to_device(&dev).unwrap()).unwrap());
        let want: Vec<u8> = x
            .chunks_exact(dim)
            .flat_map(kv_format::encode_index_key_row)
            .collect();
        assert_eq!(got.len(), want.len());
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let rb = dim / 2 + dim / 32;
            panic!(
                "rows {rows} dim {dim}: byte {i} (row {}, byte {}) {:#04x} != {:#04x}",
                i / rb,
                i % rb,
                got[i],
                want[i]
            );
        }
    }
}

/// FP4 rows (CPU-encoded) of activations with per-row scale variety.
fn fp4_rows(rng: &mut StdRng, rows: usize, dim: usize) -> Tensor {
    let x: Vec<bf16> = (0..rows)
        .flat_map(|_| {
            let s = 2f32.powi(rng.random_range(-6..4));
            common::random_activations(rng, dim, s)
        })
        .collect();
    ops::index_key_quant(&Tensor::from_vec(x, &[rows, dim]).unwrap()).unwrap()
}

fn check_bitwise(what: &str, got: &[bf16], want: &[bf16]) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: score {i}: gpu {:?} ({:#06x}) != cpu {:?}",
            got[i],
            got[i].to_bits(),
            want[i]
        );
    }
}

/// Visible counts of `batch` score rows over `n` keys: row 0 sees every
/// key, row 1 none, the others 1..=n at random.
fn score_visibles(rng: &mut StdRng, batch: usize, n: usize) -> Vec<i32> {
    (0..batch)
        .map(|b| match b {
            0 => n as i32,
            1 => 0,
            _ => rng.random_range(1..=n as i32),
        })
        .collect()
}

#[test]
fn index_scores_and_topk_match_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("index_scores_cuda");
    let (heads, dim) = (32, 128);
    let r = ops::index_key_row_nibbles(dim);
    for n in contexts() {
        for batch in [1, 3] {
            // The CPU reference costs heads·dim MACs per entry: the largest
            // context runs with one shared cache at batch 1 only.
            let per_row = n < 70001;
            if !per_row && batch > 1 {
                continue;
            }
            let q = fp4_rows(&mut rng, batch * heads, dim);
            let q = Tensor::from_vec(q.to_vec::<Fp4x2>().unwrap(), &[batch, heads, r]).unwrap();
            let keys = fp4_rows(&mut rng, if per_row { batch * n } else { n }, dim);
            let keys = if per_row {
                Tensor::from_vec(keys.to_vec::<Fp4x2>().unwrap(), &[batch, n, r]).unwrap()
            } else {
                keys
            };
            let w = Tensor::from_vec(
                common::random_activations(&mut rng, batch * heads, 0.05),
                &[batch, heads],
            )
            .unwrap();
            let visible = score_visibles(&mut rng, batch, n);
            let vis = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
            let want = ops::index_scores(&q, &w, &keys, &vis).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let got = ops::index_scores(&on(&q), &on(&w), &on(&keys), &on(&vis)).unwrap();
            let got_host = got.to_device(&Device::Cpu).unwrap();
            let what = format!("n {n} batch {batch}");
            check_bitwise(
                &what,
                got_host.as_slice::<bf16>().unwrap(),
                want.as_slice::<bf16>().unwrap(),
            );
            // Top-k of the GPU's own scores, against select on the same scores.
            for k in [1, 512, 2048].into_iter().filter(|&k| k <= n) {
                let offset = rng.random_range(0..1000);
                let want = ops::index_topk(&got_host, &vis, k, offset).unwrap();
                let got = ops::index_topk(&got, &on(&vis), k, offset).unwrap();
                assert_eq!(
                    got.to_vec::<i32>().unwrap(),
                    want.to_vec::<i32>().unwrap(),
                    "{what} k {k}"
                );
            }
        }
    }
}

/// Random index-key rows (dim 128: 64 nibble bytes, 4 E8M0 bytes). Scale
/// bytes: a base in 2^-9..2^3 plus 0..3 per block (the tensor-core kernel's
/// domain); with probability `wild`, a row leaves the domain through a
/// block spread of 4..8 or a byte in 2^-47..2^-33 or 2^33..2^48 (still far
/// from fp32 overflow, so no NaN reaches either side).
fn raw_key_rows(rng: &mut StdRng, rows: usize, wild: f64) -> Vec<Fp4x2> {
    let mut out = Vec::with_capacity(rows * 68);
    for _ in 0..rows {
        out.extend((0..64).map(|_| Fp4x2(rng.random::<u8>())));
        let base: u8 = rng.random_range(118..=130);
        let mut sc: Vec<u8> = (0..4).map(|_| base + rng.random_range(0..=3u8)).collect();
        if rng.random_bool(wild) {
            let blk = rng.random_range(0..4);
            sc[blk] = match rng.random_range(0..3) {
                0 => base + rng.random_range(4..=8u8),
                1 => rng.random_range(80..=94u8),
                _ => rng.random_range(160..=175u8),
            };
        }
        out.extend(sc.into_iter().map(Fp4x2));
    }
    out
}

/// The tensor-core score kernel and the exact kernel, each bitwise against
/// the CPU reference on fresh random rows: 32 and 20 heads (padded heads),
/// per-row caches whose rows start at any 4-byte offset (n odd: the tile
/// copies take the unaligned-word path) and one shared cache, visible counts
/// that cut tiles anywhere (0, n, random), 3 % of keys outside the kernel's
/// domain (scored by its warp-wide exact path), one query row whose head
/// scales spread by 2^5 and one with a subnormal head weight (the whole row
/// on the exact path), zero head weights. Outputs are NaN-poisoned.
#[test]
fn tensor_core_scores_are_bitwise_equal_to_the_cpu_reference() {
    let dev = gpu();
    let mut rng = common::rng("index_scores_tensor_cuda");
    let r = ops::index_key_row_nibbles(128);
    for heads in [32, 20] {
        for n in contexts() {
            for batch in [1, 4] {
                let per_row = n < 70001;
                if !per_row && batch > 1 {
                    continue;
                }
                let mut q = raw_key_rows(&mut rng, batch * heads, 0.0);
                if batch > 2 {
                    // Row 2, head 1: block scales 2^5 apart (outside the domain).
                    let at = (2 * heads + 1) * 68 + 64;
                    q[at].0 = q[at + 1].0.saturating_add(5);
                }
                let q = Tensor::from_vec(q, &[batch, heads, r]).unwrap();
                let kn = if per_row { batch * n } else { n };
                let keys = raw_key_rows(&mut rng, kn, 0.03);
                let keys = if per_row {
                    Tensor::from_vec(keys, &[batch, n, r]).unwrap()
                } else {
                    Tensor::from_vec(keys, &[n, r]).unwrap()
                };
                let mut w = common::random_activations(&mut rng, batch * heads, 0.05);
                w[heads / 2] = bf16::ZERO;
                if batch > 3 {
                    w[3 * heads + 4] = bf16::from_bits(0x0003); // subnormal: row 3 leaves the domain
                }
                let w = Tensor::from_vec(w, &[batch, heads]).unwrap();
                let visible = score_visibles(&mut rng, batch, n);
                let vis = Tensor::from_vec(visible, &[batch]).unwrap();
                let want = ops::index_scores(&q, &w, &keys, &vis).unwrap();
                let on = |t: &Tensor| t.to_device(&dev).unwrap();
                let (qd, wd, kd, vd) = (on(&q), on(&w), on(&keys), on(&vis));
                for kernel in [ScoreKernel::Tensor, ScoreKernel::Exact] {
                    let mut got = Tensor::empty(&dev, DType::BF16, &[batch, n]).unwrap();
                    ops::index_scores_into_with(&qd, &wd, &kd, &vd, &mut got, kernel).unwrap();
                    let got = got.to_device(&Device::Cpu).unwrap();
                    check_bitwise(
                        &format!("{kernel:?} heads {heads} n {n} batch {batch}"),
                        got.as_slice::<bf16>().unwrap(),
                        want.as_slice::<bf16>().unwrap(),
                    );
                }
            }
        }
    }
}

/// `index_scores_paged` on the GPU, bitwise the CPU op, with both kernels:
/// keys read in place from a pool through random page tables (a page may
/// repeat; some lie outside the pool: −1, the pool's partial last page, far
/// past it), pages of 32 and 128 keys (the tensor-core kernel's whole
/// tiles) and of 16 (the exact kernel only: the tensor-core kernel refuses
/// them with a typed error), 3 % of keys outside the tensor-core domain,
/// visible counts cut anywhere, 20 and 32 heads. Outputs are poisoned.
#[test]
fn paged_scores_are_bitwise_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("index_scores_paged_cuda");
    let r = ops::index_key_row_nibbles(128);
    // Pages of 128 and 32 keys (4 and 1 tensor-core tiles: a shift), 96 (3
    // tiles: a division) and 16 (the exact kernel only).
    for (heads, page_rows, width, batch) in [
        (32, 128, 9, 4),
        (20, 32, 40, 3),
        (32, 96, 11, 3),
        (32, 16, 33, 5),
    ] {
        let pool_pages = 23;
        let pool = raw_key_rows(&mut rng, pool_pages * page_rows + 7, 0.03);
        let pool = Tensor::from_vec(pool, &[pool_pages * page_rows + 7, r]).unwrap();
        let q = Tensor::from_vec(
            raw_key_rows(&mut rng, batch * heads, 0.0),
            &[batch, heads, r],
        )
        .unwrap();
        let w = common::random_activations(&mut rng, batch * heads, 0.05);
        let w = Tensor::from_vec(w, &[batch, heads]).unwrap();
        let mut pages: Vec<i32> = (0..batch * width)
            .map(|_| rng.random_range(0..pool_pages as i32))
            .collect();
        pages[1] = -1;
        pages[width + 2] = pool_pages as i32;
        pages[batch * width - 1] = i32::MAX;
        let pages = Tensor::from_vec(pages, &[batch, width]).unwrap();
        let n = width * page_rows;
        let vis = Tensor::from_vec(score_visibles(&mut rng, batch, n), &[batch]).unwrap();
        let want = ops::index_scores_paged(&q, &w, &pool, &pages, page_rows, &vis).unwrap();
        let on = |t: &Tensor| t.to_device(&dev).unwrap();
        let (qd, wd, pd, gd, vd) = (on(&q), on(&w), on(&pool), on(&pages), on(&vis));
        for kernel in [ScoreKernel::Auto, ScoreKernel::Tensor, ScoreKernel::Exact] {
            let got = ops::index_scores_paged_with(&qd, &wd, &pd, &gd, page_rows, &vd, kernel);
            if kernel == ScoreKernel::Tensor && page_rows % 32 != 0 {
                assert!(
                    matches!(got, Err(Error::Argument { arg: "kernel", .. })),
                    "pages of {page_rows} keys: {got:?}"
                );
                continue;
            }
            let got = got.unwrap().to_device(&Device::Cpu).unwrap();
            check_bitwise(
                &format!("{kernel:?} heads {heads} pages of {page_rows} x {width} batch {batch}"),
                got.as_slice::<bf16>().unwrap(),
                want.as_slice::<bf16>().unwrap(),
            );
        }
    }
}

/// The tensor-core kernel refuses shapes it cannot take with a typed error
/// (dim 64; 40 heads), before launching anything.
#[test]
fn tensor_core_scores_reject_other_shapes() {
    let dev = gpu();
    for (heads, dim) in [(8, 64), (40, 128)] {
        let r = ops::index_key_row_nibbles(dim);
        let q = Tensor::empty(&dev, DType::F4E2M1x2, &[1, heads, r]).unwrap();
        let keys = Tensor::empty(&dev, DType::F4E2M1x2, &[16, r]).unwrap();
        let w = Tensor::empty(&dev, DType::BF16, &[1, heads]).unwrap();
        let vis = Tensor::from_vec(vec![16i32], &[1])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let mut out = Tensor::empty(&dev, DType::BF16, &[1, 16]).unwrap();
        let err = ops::index_scores_into_with(&q, &w, &keys, &vis, &mut out, ScoreKernel::Tensor)
            .unwrap_err();
        assert!(
            matches!(err, Error::Argument { arg: "kernel", .. }),
            "heads {heads} dim {dim}: {err}"
        );
    }
}

/// Score rows built to stress the tie rule: few distinct values (many exact
/// ties at the k-th place), −∞ runs, all-equal rows, −0 and +0.
fn tied_row(rng: &mut StdRng, n: usize, kind: usize) -> Vec<bf16> {
    let palette = [
        f32::NEG_INFINITY,
        -3.0,
        -0.0,
        0.0,
        0.25,
        1.0,
        1.0078125,
        7.0,
        f32::INFINITY,
    ];
    (0..n)
        .map(|t| match kind {
            0 => bf16::from_f32(palette[rng.random_range(0..palette.len())]),
            1 => bf16::ZERO,
            2 => bf16::NEG_INFINITY,
            3 if t % 5 == 0 => bf16::from_f32(rng.random_range(-4.0..4.0)),
            3 => bf16::NEG_INFINITY,
            _ => bf16::from_bits(rng.random::<u16>() & 0x7F7F | 0x0080),
        })
        .collect()
}

#[test]
fn index_topk_is_exact_under_the_tie_rule() {
    let dev = gpu();
    let mut rng = common::rng("index_topk_cuda");
    let mut ns = contexts();
    if !quick() {
        // 65536: 16-byte aligned rows in several segments (the vector loads);
        // 300007: unaligned rows in several segments.
        ns.extend([65_536, 300_007]);
    }
    for n in ns {
        for kind in 0..5 {
            let batch = 3;
            let s: Vec<bf16> = (0..batch)
                .flat_map(|_| tied_row(&mut rng, n, kind))
                .collect();
            let visible: Vec<i32> = vec![n as i32, rng.random_range(0..=n as i32), (n / 3) as i32];
            let st = Tensor::from_vec(s, &[batch, n]).unwrap();
            let vis = Tensor::from_vec(visible, &[batch]).unwrap();
            for k in [1, 7, 512, 2048, n].into_iter().filter(|&k| k <= n) {
                let offset = 128;
                let want = ops::index_topk(&st, &vis, k, offset).unwrap();
                let got = ops::index_topk(
                    &st.to_device(&dev).unwrap(),
                    &vis.to_device(&dev).unwrap(),
                    k,
                    offset,
                )
                .unwrap();
                assert_eq!(
                    got.to_vec::<i32>().unwrap(),
                    want.to_vec::<i32>().unwrap(),
                    "n {n} kind {kind} k {k}"
                );
            }
        }
    }
}

/// Rows of a batch of 513 or more take one segment each, so a segment holds
/// many 4096-entry chunks: the next chunk's load in flight, the chunk maxima
/// past the first, collect rounds past the first and a partial last round.
/// Every row is the CPU's, and the same as that row alone (one row takes
/// up to 128 segments).
#[test]
fn index_topk_rows_do_not_depend_on_their_batch() {
    if quick() {
        return;
    }
    let dev = gpu();
    let mut rng = common::rng("index_topk_batch_cuda");
    for (batch, n) in [(520, 40_001), (513, 65_536)] {
        let s: Vec<bf16> = (0..batch)
            .flat_map(|b| tied_row(&mut rng, n, if b % 3 == 0 { 0 } else { 4 }))
            .collect();
        let visible: Vec<i32> = (0..batch)
            .map(|b| match b % 4 {
                0 => n as i32,
                1 => rng.random_range(0..=n as i32),
                2 => (n / 3) as i32,
                _ => n as i32 - 1,
            })
            .collect();
        let st = Tensor::from_vec(s.clone(), &[batch, n]).unwrap();
        let vis = Tensor::from_vec(visible.clone(), &[batch]).unwrap();
        for k in [512, 2048] {
            let want = ops::index_topk(&st, &vis, k, 128).unwrap();
            let (sd, vd) = (st.to_device(&dev).unwrap(), vis.to_device(&dev).unwrap());
            let got = ops::index_topk(&sd, &vd, k, 128).unwrap();
            let (got, want) = (got.to_vec::<i32>().unwrap(), want.to_vec::<i32>().unwrap());
            assert_eq!(got, want, "batch {batch} n {n} k {k}");
            for b in [0, 1, batch / 2, batch - 1] {
                let row = Tensor::from_vec(s[b * n..(b + 1) * n].to_vec(), &[1, n]).unwrap();
                let rv = Tensor::from_vec(vec![visible[b]], &[1]).unwrap();
                let alone = ops::index_topk(
                    &row.to_device(&dev).unwrap(),
                    &rv.to_device(&dev).unwrap(),
                    k,
                    128,
                )
                .unwrap();
                assert_eq!(
                    alone.to_vec::<i32>().unwrap(),
                    &got[b * k..(b + 1) * k],
                    "row {b} alone, batch {batch} n {n} k {k}"
                );
            }
        }
    }
}

/// Contexts of the candidate path: around multiples of 8 and of 2048·8 (the
/// number of entries the 2048 kept blocks of 8 cover).
fn candidate_contexts() -> Vec<usize> {
    let all = [
        1, 7, 8, 9, 63, 64, 65, 513, 16383, 16384, 16385, 16392, 32769, 300_001,
    ];
    all.into_iter()
        .filter(|&n| !quick() || n <= 16385)
        .collect()
}

/// A candidate-source row: [`common::candidate_palette`] plus 0.5078125
/// (one BF16 ulp above 0.5: near ties), sparse rows −∞ with probability 0.9.
fn candidate_row(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    let mut palette = common::candidate_palette();
    palette.insert(4, bf16::from_f32(0.5078125));
    common::candidate_row(rng, n, &palette, 0.9)
}

/// [`common::candidate_visibles`], then the 2048-block edge ± 1 where the
/// row reaches it.
fn candidate_visibles(rng: &mut StdRng, n: usize, block: usize) -> Vec<i32> {
    let mut v = common::candidate_visibles(rng, n, block);
    for e in [2048 * block - 1, 2048 * block, 2048 * block + 1] {
        if e <= n {
            v.push(e as i32);
        }
    }
    v
}

#[test]
fn candidate_path_matches_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("index_candidates_cuda");
    let on = |t: &Tensor| t.to_device(&dev).unwrap();
    for n in candidate_contexts() {
        for (block, keep) in [(8, 2048), (8, 5), (1, 300), (3, 2048)] {
            if block != 8 && n > 20_000 {
                continue;
            }
            let visible = candidate_visibles(&mut rng, n, block);
            let batch = visible.len();
            let src: Vec<bf16> = (0..batch)
                .flat_map(|_| candidate_row(&mut rng, n))
                .collect();
            let own: Vec<bf16> = (0..batch).flat_map(|_| tied_row(&mut rng, n, 0)).collect();
            let st = Tensor::from_vec(src, &[batch, n]).unwrap();
            let ot = Tensor::from_vec(own, &[batch, n]).unwrap();
            let vt = Tensor::from_vec(visible, &[batch]).unwrap();
            let what = format!("n {n} block {block} keep {keep}");
            // Candidate lists; −1 is a valid entry, so the output starts as a sentinel.
            let width = ops::index_candidate_width(n, block, keep);
            let want = ops::index_candidates(&st, &vt, block, keep).unwrap();
            let mut got = on(&Tensor::from_vec(
                vec![0x5A5A_5A5A_i32; batch * width],
                &[batch, width],
            )
            .unwrap());
            ops::index_candidates_into(&on(&st), &on(&vt), block, keep, &mut got).unwrap();
            assert_eq!(
                got.to_vec::<i32>().unwrap(),
                want.to_vec::<i32>().unwrap(),
                "{what}: candidates"
            );
            // Masked scores: bit for bit (NaN payloads and ±0 included).
            let want_m = ops::index_mask_scores(&ot, &want, block).unwrap();
            let mut got_m = on(&Tensor::from_vec(
                vec![bf16::from_bits(0x7FAB); batch * n],
                &[batch, n],
            )
            .unwrap());
            ops::index_mask_scores_into(&on(&ot), &got, block, &mut got_m).unwrap();
            let (gm, wm) = (
                got_m.to_vec::<bf16>().unwrap(),
                want_m.to_vec::<bf16>().unwrap(),
            );
            if let Some(i) = (0..gm.len()).find(|&i| gm[i].to_bits() != wm[i].to_bits()) {
                panic!(
                    "{what}: masked score {i} (row {}, entry {}) {:#06x} != {:#06x}",
                    i / n,
                    i % n,
                    gm[i].to_bits(),
                    wm[i].to_bits()
                );
            }
            // Reindex: the exact top-k inside the candidates.
            for k in [1, 512].into_iter().filter(|&k| k <= n) {
                let want_r = ops::index_reindex_topk(&ot, &want, block, &vt, k, 128).unwrap();
                let got_r =
                    ops::index_reindex_topk(&on(&ot), &got, block, &on(&vt), k, 128).unwrap();
                assert_eq!(
                    got_r.to_vec::<i32>().unwrap(),
                    want_r.to_vec::<i32>().unwrap(),
                    "{what} k {k}: reindex"
                );
            }
        }
    }
}

#[test]
fn mask_scores_take_any_list_in_bounds() {
    // Lists that are not candidate lists: unsorted, duplicated, −1 anywhere,
    // out of range in both directions; the mask is the union of the listed
    // in-range blocks on both devices and nothing outside the row is touched.
    let dev = gpu();
    let mut rng = common::rng("index_mask_cuda");
    for (n, block, width) in [
        (1usize, 8usize, 3usize),
        (100, 8, 40),
        (5000, 8, 2048),
        (777, 5, 0),
    ] {
        let batch = 3;
        let blocks = n.div_ceil(block) as i32;
        let list: Vec<i32> = (0..batch * width)
            .map(|_| match rng.random_range(0..4) {
                0 => -1,
                1 => rng.random_range(blocks..blocks + 10),
                2 => rng.random::<i32>(),
                _ => rng.random_range(0..blocks),
            })
            .collect();
        let scores: Vec<bf16> = (0..batch).flat_map(|_| tied_row(&mut rng, n, 0)).collect();
        let st = Tensor::from_vec(scores, &[batch, n]).unwrap();
        let ct = Tensor::from_vec(list, &[batch, width]).unwrap();
        let want = ops::index_mask_scores(&st, &ct, block).unwrap();
        let got = ops::index_mask_scores(
            &st.to_device(&dev).unwrap(),
            &ct.to_device(&dev).unwrap(),
            block,
        )
        .unwrap();
        let bits = |t: &Tensor| -> Vec<u16> {
            t.to_vec::<bf16>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&got), bits(&want), "n {n} block {block} width {width}");
    }
}
