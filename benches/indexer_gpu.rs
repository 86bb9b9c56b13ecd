//! GPU benchmark of the indexer (issue 5 item 4): index scores of one query
//! (32 heads × 128, FP4) per batch row against its own FP4 key cache, with
//! the integer tensor-core kernel (`index_scores`) and the exact SIMT kernel
//! (`index_scores_exact`, at 8K and 128K only: it is ~30× slower), and the
//! exact top-512 of those scores, at context {8K, 128K, 1M} × batch {1, 64}
//! (DEEPINFER_BENCH_QUICK=1: 8K and 128K at batch 1), plus the model's decode
//! point, batch 256 × 32K keys, where the paged form the model calls
//! (`index_scores_paged`, pages of 256 keys scattered over the pool) is timed
//! too (at every batch ≥ 64); at 128K and 1M also the
//! candidate-block path on the same scores (candidate lists: blocks of 8,
//! keep 2048; the reindex mask; reindex = mask + top-512). GB/s over the FP4
//! key bytes (scores) and over the BF16 score bytes read once (top-k,
//! candidates, reindex) or read and written (mask); peers from
//! benches/peers/indexer_torch.py (torch score, torch.topk, torch.sort,
//! amax + topk over blocks, where + topk, on the same shapes) through the
//! shared harness.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::{Harness, ROTATE_BYTES};
    use deepinfer::ops;
    use deepinfer::ops::ScoreKernel;
    use deepinfer::{DType, Device, Fp4x2, Tensor};
    use half::bf16;

    const HEADS: usize = 32;
    const DIM: usize = 128;
    const ROW_BYTES: usize = DIM / 2 + DIM / 32;
    const TOPK: usize = 512;

    fn copies(bytes: usize) -> usize {
        if bytes >= ROTATE_BYTES {
            1
        } else {
            Harness::copies(bytes)
        }
    }

    /// Random index-key rows: any byte is a valid pair of e2m1 nibbles; the
    /// scale bytes sit near 2^0 with the four blocks of a row within 2^3 of
    /// each other, like RMS-normed keys (and inside the tensor-core kernel's
    /// domain: no key takes its exact fallback). Xorshift, cheap at gigabytes.
    fn key_rows(dev: &Device, lead: &[usize], seed: u64) -> Tensor {
        let rows: usize = lead.iter().product();
        let mut s = seed | 1;
        let mut bytes = Vec::with_capacity(rows * ROW_BYTES);
        for _ in 0..rows {
            for _ in 0..(DIM / 2) / 8 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                bytes.extend(s.to_le_bytes().map(Fp4x2));
            }
            let base = 120 + (s >> 40) % 8;
            bytes.extend((0..DIM / 32).map(|i| Fp4x2((base + (s >> (8 * i)) % 4) as u8)));
        }
        let mut shape = lead.to_vec();
        shape.push(2 * ROW_BYTES);
        Tensor::from_vec(bytes, &shape)
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    /// The candidate-block path on the score copies: candidate lists (block
    /// maxima, top-2048 of the blocks, compaction), the reindex mask, and
    /// reindex (mask + top-512) with those lists.
    fn candidate_rows(
        h: &mut Harness,
        score_copies: &[Tensor],
        vis: &Tensor,
        out: &mut Tensor,
        batch: usize,
        n: usize,
    ) {
        let (block, keep) = (ops::INDEX_CANDIDATE_BLOCK, ops::INDEX_CANDIDATE_KEEP);
        let width = ops::index_candidate_width(n, block, keep);
        let mut cand = Tensor::empty(&h.dev, DType::I32, &[batch, width]).unwrap();
        let us = h.time_us(|i| {
            let s = &score_copies[i % score_copies.len()];
            ops::index_candidates_into(s, vis, block, keep, &mut cand).unwrap()
        });
        h.record(
            "index_candidates",
            "index_candidates",
            batch,
            n,
            us,
            batch * n * 2,
            "batch*n*2 (BF16 scores read once; the n/8 block scores go through the 3-pass top-k)",
        );
        let mut masked = Tensor::empty(&h.dev, DType::BF16, &[batch, n]).unwrap();
        let us = h.time_us(|i| {
            let s = &score_copies[i % score_copies.len()];
            ops::index_mask_scores_into(s, &cand, block, &mut masked).unwrap()
        });
        h.record(
            "index_mask_scores",
            "index_mask_scores",
            batch,
            n,
            us,
            batch * n * 4,
            "batch*n*4 (BF16 scores read, masked BF16 scores written)",
        );
        let us = h.time_us(|i| {
            let s = &score_copies[i % score_copies.len()];
            ops::index_reindex_topk_into(s, &cand, block, vis, TOPK, 128, out).unwrap()
        });
        h.record(
            "index_reindex_topk",
            "index_reindex_topk",
            batch,
            n,
            us,
            batch * n * 2,
            "batch*n*2 (BF16 scores read once; the masked copy is written and read 3 times)",
        );
    }

    /// The paged form the model's decode step calls (`index_scores_paged`):
    /// the same keys as one pool of pages of [`PAGE_ROWS`] keys, each row's
    /// pages scattered over the pool by a random permutation.
    fn paged_scores(
        h: &mut Harness,
        (q, w, vis): (&Tensor, &Tensor, &Tensor),
        keys: Vec<Tensor>,
        batch: usize,
        n: usize,
    ) {
        const PAGE_ROWS: usize = 256;
        let width = n / PAGE_ROWS;
        let pools: Vec<Tensor> = keys
            .into_iter()
            .map(|k| k.reshape(&[batch * n, 2 * ROW_BYTES]).unwrap())
            .collect();
        let mut perm: Vec<i32> = (0..(batch * width) as i32).collect();
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for i in (1..perm.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            perm.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let pages = Tensor::from_vec(perm, &[batch, width])
            .unwrap()
            .to_device(&h.dev)
            .unwrap();
        let us = h.time_us(|i| {
            ops::index_scores_paged(q, w, &pools[i % pools.len()], &pages, PAGE_ROWS, vis).unwrap();
        });
        h.record(
            "index_scores_paged",
            "index_scores",
            batch,
            n,
            us,
            batch * n * ROW_BYTES,
            "batch*n*68 (FP4 key rows read through pages of 256 keys; scores, query and page table not counted)",
        );
    }

    pub fn main() {
        let Some(mut h) = Harness::open("indexer_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let quick = std::env::var("DEEPINFER_BENCH_QUICK").is_ok_and(|v| v == "1");
        let contexts: &[usize] = if quick {
            &[8192, 131072]
        } else {
            &[8192, 131072, 1 << 20]
        };
        let batches: &[usize] = if quick { &[1] } else { &[1, 64] };
        let mut points: Vec<(usize, usize)> = contexts
            .iter()
            .flat_map(|&n| batches.iter().map(move |&b| (n, b)))
            .collect();
        if !quick {
            // The model's decode point: batch 256 at 128K tokens (32K keys a row).
            points.push((32768, 256));
        }
        // DEEPINFER_BENCH_POINTS="1048576x64,32768x256" keeps those points
        // (context x batch) only: a profiler run of one shape.
        if let Ok(keep) = std::env::var("DEEPINFER_BENCH_POINTS") {
            let keep: Vec<&str> = keep.split(',').map(str::trim).collect();
            points.retain(|(n, b)| keep.contains(&format!("{n}x{b}").as_str()));
        }
        for (n, batch) in points {
            let kbytes = batch * n * ROW_BYTES;
            let keys: Vec<Tensor> = (0..copies(kbytes))
                .map(|c| key_rows(&dev, &[batch, n], 0x9E37_79B9 + c as u64))
                .collect();
            let q = key_rows(&dev, &[batch, HEADS], 7);
            let w: Vec<bf16> = (0..batch * HEADS)
                .map(|i| bf16::from_f32(((i * 37) % 17) as f32 / 256.0 - 0.03))
                .collect();
            let w = Tensor::from_vec(w, &[batch, HEADS])
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let vis = Tensor::from_vec(vec![n as i32; batch], &[batch])
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let mut scores = Tensor::empty(&dev, DType::BF16, &[batch, n]).unwrap();
            let kernels: &[(&str, ScoreKernel)] = if n <= 131072 {
                &[
                    ("index_scores", ScoreKernel::Tensor),
                    ("index_scores_exact", ScoreKernel::Exact),
                ]
            } else {
                &[("index_scores", ScoreKernel::Tensor)]
            };
            for &(name, kernel) in kernels {
                let us = h.time_us(|i| {
                    ops::index_scores_into_with(
                        &q,
                        &w,
                        &keys[i % keys.len()],
                        &vis,
                        &mut scores,
                        kernel,
                    )
                    .unwrap()
                });
                h.record(
                    name,
                    name,
                    batch,
                    n,
                    us,
                    kbytes,
                    "batch*n*68 (FP4 key rows read; scores and query not counted)",
                );
            }
            if batch >= 64 {
                paged_scores(&mut h, (&q, &w, &vis), keys, batch, n);
            } else {
                drop(keys);
            }
            let mut out = Tensor::empty(&dev, DType::I32, &[batch, TOPK]).unwrap();
            let score_copies: Vec<Tensor> = (0..copies(batch * n * 2))
                .map(|_| {
                    scores
                        .to_device(&Device::Cpu)
                        .unwrap()
                        .to_device(&dev)
                        .unwrap()
                })
                .collect();
            let us = h.time_us(|i| {
                let s = &score_copies[i % score_copies.len()];
                ops::index_topk_into(s, &vis, TOPK, 128, &mut out).unwrap()
            });
            h.record(
                "index_topk",
                "index_topk",
                batch,
                n,
                us,
                batch * n * 2,
                "batch*n*2 (BF16 scores read once; the kernel reads them 3 times)",
            );
            if n >= 131072 {
                candidate_rows(&mut h, &score_copies, &vis, &mut out, batch, n);
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("indexer_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
