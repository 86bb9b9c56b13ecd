//! GPU benchmark of the sparse MQA kernel (`ops::sparse_mqa`, issue 19):
//! decode (`sparse_mqa_decode`, B ∈ {1, 16, 64, 128, 256} sequences × s_q ∈
//! {1, 2, 4} queries, each attending to its sequence's 128 window rows and
//! 512 compressed rows) and prefill (`sparse_mqa_prefill`, 4096 and 32768
//! tokens, 128 window + 512 compressed rows per token), V4.1's shape (64
//! heads × 512, FP8 window rows of 528 bytes, FP4 compressed rows of 288).
//! Decode: each of 256 sequence slots owns a private context of 16,384
//! compressed rows (32K tokens at ratio 2, as the FlashMLA peer's 32K-token
//! requests), in pages of 64 rows scattered over the pool by a random
//! permutation, and each query picks 512 distinct rows of its own context;
//! its 128 window rows are one ring block of a 512K-row pool (pools of
//! 1.4 GB, far larger than L2). The index lists rotate over enough copies
//! that one sweep touches ≥ 512 MiB of rows; prefill pools are the
//! prompt's own rows (tokens window rows, tokens / 2 compressed rows), as in
//! a real prefill. TFLOP/s = 2·64·T·640·(512 + 512) / t (K = V); GB/s over
//! the rows read (with repeats), q, out and lse. Peers (from
//! benches/peers/attention_torch.py, same shapes): torch gather + bmm +
//! softmax over a BF16 copy of the pools, and FlashMLA SM90 (`flashmla_sm90`,
//! its own 584-byte layout, from its bench in the same device run).
//! The versions in contention are timed: the default (`Auto` kernel and
//! split: few queries split over the SMs) as the record name, the others as
//! `<name>_v3`, `_v5_h32`, `_v5_h16`, `_v8`, `_v9`, `_v11` unsplit and
//! `_v3_split128` (the fixed span a batch-invariant caller can take)
//! (prefill: v3, v8, v9, v11 and the default). DEEPINFER_BENCH_QUICK=1: B ∈ {1, 64}, s_q ∈ {1, 2}, prefill 4096;
//! DEEPINFER_BENCH_ATTN="decode:B:SQ,prefill:T": only those points.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops::{SparseMqaKernel, SparseMqaSplit};
    use deepinfer::{DType, Device, Tensor, ops};
    use half::bf16;
    use serde_json::json;

    const H: usize = 64;
    const D: usize = 512;
    const KW: usize = 128;
    const KC: usize = 512;
    const WROW: usize = 528;
    const CROW: usize = 288;

    /// Sequence slots of the decode pool, compressed rows in each slot's
    /// context, rows per page.
    const SLOTS: usize = 256;
    const CTX_C: usize = 16 << 10;
    const PAGE: usize = 64;

    /// A random permutation of `n` pages (Fisher-Yates).
    fn page_permutation(n: usize, rng: &mut Rng) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, rng.below(i + 1));
        }
        p
    }

    /// KC distinct rows of slot `slot`'s context (its pages
    /// `pages[slot * CTX_C / PAGE ..]`), as physical pool rows.
    fn private_rows(slot: usize, pages: &[usize], rng: &mut Rng) -> Vec<i32> {
        let mut seen = vec![false; CTX_C];
        let mut rows = Vec::with_capacity(KC);
        while rows.len() < KC {
            let r = rng.below(CTX_C);
            if !std::mem::replace(&mut seen[r], true) {
                let page = pages[slot * (CTX_C / PAGE) + r / PAGE];
                rows.push((page * PAGE + r % PAGE) as i32);
            }
        }
        rows
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// `n` window rows: e4m3 codes below 2.0 in magnitude (bit 6 clear, so
    /// never NaN), E8M0 scales 2^-2 .. 2^1.
    fn window_rows(dev: &Device, n: usize, rng: &mut Rng) -> Tensor {
        let mut v = Vec::with_capacity(n * WROW);
        for _ in 0..n {
            for _ in 0..D / 8 {
                v.extend(rng.next().to_le_bytes().map(|b| b & 0xBF));
            }
            v.extend((0..D / 32).map(|_| 125 + (rng.next() % 4) as u8));
        }
        Tensor::from_vec(v, &[n, WROW])
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    /// `n` compressed rows: any e2m1 nibbles, e4m3 scales 2^-3 .. 2^-1.
    fn compressed_rows(dev: &Device, n: usize, rng: &mut Rng) -> Tensor {
        let mut v = Vec::with_capacity(n * CROW);
        for _ in 0..n {
            for _ in 0..D / 16 {
                v.extend(rng.next().to_le_bytes());
            }
            v.extend((0..D / 16).map(|_| 0x20 + (rng.next() % 16) as u8));
        }
        Tensor::from_vec(v, &[n, CROW])
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    fn i32s(dev: &Device, v: Vec<i32>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
    }

    /// One timed shape: `sets` rotating (q, window list, compressed list).
    #[allow(clippy::too_many_arguments)]
    fn measure(
        h: &mut Harness,
        op: &str,
        shape: serde_json::Value,
        t: usize,
        window: &Tensor,
        compressed: &Tensor,
        sets: &[(Tensor, Tensor, Tensor)],
        sink: &Tensor,
        kernels: &[(SparseMqaKernel, SparseMqaSplit)],
    ) {
        let mut out = Tensor::empty(&h.dev, DType::BF16, &[t, H, D]).unwrap();
        let mut lse = Tensor::empty(&h.dev, DType::F32, &[t, H]).unwrap();
        let flops = 2.0 * (H * t * (KW + KC) * (D + D)) as f64;
        let bytes = t * (KW * WROW + KC * CROW + 2 * H * D * 2 + H * 4);
        for &(kernel, split) in kernels {
            let us = h.time_us(|i| {
                let (q, wi, ci) = &sets[i % sets.len()];
                let comp = Some((compressed, ci));
                ops::sparse_mqa_into_split(
                    q, window, wi, comp, sink, &mut out, &mut lse, kernel, split,
                )
                .unwrap()
            });
            // The default (kernel and split) carries the record name; the
            // others a suffix.
            let name = match (kernel == SparseMqaKernel::default(), split) {
                (true, SparseMqaSplit::Auto) => op.to_string(),
                (_, SparseMqaSplit::Entries(n)) => {
                    format!("{op}_{}_split{n}", version_name(kernel))
                }
                _ => format!("{op}_{}", version_name(kernel)),
            };
            h.record_gemm(
                &name,
                op,
                shape.clone(),
                Ok(us),
                flops,
                bytes,
                "T*(128*528 + 512*288) rows read (repeats counted) + T*64*512*2*2 (q, out) + T*64*4 (lse)",
                Vec::new(),
            );
        }
    }

    /// Record suffix of a non-default version.
    fn version_name(k: SparseMqaKernel) -> &'static str {
        match k {
            SparseMqaKernel::V3 => "v3",
            SparseMqaKernel::V5Heads32 => "v5_h32",
            SparseMqaKernel::V5Heads16 => "v5_h16",
            SparseMqaKernel::V8 => "v8",
            SparseMqaKernel::V9 => "v9",
            SparseMqaKernel::V11 => "v11",
            SparseMqaKernel::V12 => "v12",
            SparseMqaKernel::V14 => "v14",
            SparseMqaKernel::Generic => "generic",
            SparseMqaKernel::Auto => "auto",
        }
    }

    /// Decode times every version but the generic one (version 3 at 64
    /// heads, version 5 at 32 and 16, versions 8 and 9) and the default;
    /// prefill the 64-head ones. Versions 1, 2 and 4 lost to version 3 in the
    /// bench of 29ea42a (`benches/results/2026-12-01-h200-attention.json`),
    /// versions 6 and 7 to versions 3 and 8 in the runs of 2026-12-02,
    /// version 10 to version 9 in the runs of 2026-12-03, and left the build.
    const DECODE_KERNELS: [(SparseMqaKernel, SparseMqaSplit); 10] = [
        (SparseMqaKernel::V3, SparseMqaSplit::None),
        (SparseMqaKernel::V5Heads32, SparseMqaSplit::None),
        (SparseMqaKernel::V5Heads16, SparseMqaSplit::None),
        (SparseMqaKernel::V8, SparseMqaSplit::None),
        (SparseMqaKernel::V9, SparseMqaSplit::None),
        (SparseMqaKernel::V11, SparseMqaSplit::None),
        (SparseMqaKernel::V12, SparseMqaSplit::None),
        (SparseMqaKernel::V14, SparseMqaSplit::None),
        (SparseMqaKernel::V3, SparseMqaSplit::Entries(128)),
        (SparseMqaKernel::Auto, SparseMqaSplit::Auto),
    ];
    const PREFILL_KERNELS: [(SparseMqaKernel, SparseMqaSplit); 7] = [
        (SparseMqaKernel::V3, SparseMqaSplit::None),
        (SparseMqaKernel::V8, SparseMqaSplit::None),
        (SparseMqaKernel::V9, SparseMqaSplit::None),
        (SparseMqaKernel::V11, SparseMqaSplit::None),
        (SparseMqaKernel::V12, SparseMqaSplit::None),
        (SparseMqaKernel::V14, SparseMqaSplit::None),
        (SparseMqaKernel::Auto, SparseMqaSplit::Auto),
    ];

    fn queries(dev: &Device, t: usize, rng: &mut Rng) -> Tensor {
        let q: Vec<bf16> = (0..t * H * D)
            .map(|_| bf16::from_f32((rng.next() % 2001) as f32 / 1000.0 - 1.0))
            .collect();
        Tensor::from_vec(q, &[t, H, D])
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("attention_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let quick = std::env::var("DEEPINFER_BENCH_QUICK").is_ok_and(|v| v == "1");
        // DEEPINFER_BENCH_ATTN="decode:B:SQ,prefill:T,...": only those points
        // (one shape under ncu, say).
        let only: Option<Vec<String>> = std::env::var("DEEPINFER_BENCH_ATTN")
            .ok()
            .map(|v| v.split(',').map(|p| p.trim().to_string()).collect());
        let wanted = |point: String| only.as_ref().is_none_or(|o| o.contains(&point));
        // QUICK's short lists, unless points are named.
        let short = quick && only.is_none();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let sink: Vec<f32> = (0..H).map(|i| (i % 7) as f32 * 0.5 - 1.5).collect();
        let sink = Tensor::from_vec(sink, &[H])
            .unwrap()
            .to_device(&dev)
            .unwrap();

        // Decode: pools far larger than L2; each sequence slot's private
        // context in pages scattered over the compressed pool.
        let nw = 512 << 10;
        let nc = SLOTS * CTX_C;
        let window = window_rows(&dev, nw, &mut rng);
        let compressed = compressed_rows(&dev, nc, &mut rng);
        let pages = page_permutation(nc / PAGE, &mut rng);
        let mut next_slot = 0usize;
        let batches: &[usize] = if short {
            &[1, 64]
        } else {
            &[1, 16, 64, 128, 256]
        };
        let sqs: &[usize] = if short { &[1, 2] } else { &[1, 2, 4] };
        for &b in batches {
            for &sq in sqs {
                if !wanted(format!("decode:{b}:{sq}")) {
                    continue;
                }
                let t = b * sq;
                let per_call = t * (KW * WROW + KC * CROW);
                let copies = Harness::copies(per_call);
                let sets: Vec<(Tensor, Tensor, Tensor)> = (0..copies)
                    .map(|_| {
                        // Each sequence: one 128-row ring block; its s_q
                        // queries share it and pick their own 512 rows.
                        let mut wi = Vec::with_capacity(t * KW);
                        let mut ci = Vec::with_capacity(t * KC);
                        for _ in 0..b {
                            let base = rng.below(nw / KW) * KW;
                            let slot = next_slot % SLOTS;
                            next_slot += 1;
                            for _ in 0..sq {
                                wi.extend((0..KW).map(|k| (base + k) as i32));
                                ci.extend(private_rows(slot, &pages, &mut rng));
                            }
                        }
                        (
                            queries(&dev, t, &mut rng),
                            i32s(&dev, wi, &[t, KW]),
                            i32s(&dev, ci, &[t, KC]),
                        )
                    })
                    .collect();
                let shape = json!({ "batch": b, "s_q": sq, "rows": KW + KC });
                measure(
                    &mut h,
                    "sparse_mqa_decode",
                    shape,
                    t,
                    &window,
                    &compressed,
                    &sets,
                    &sink,
                    &DECODE_KERNELS,
                );
            }
        }
        drop((window, compressed));

        // Prefill: the prompt's own rows; every list fully valid (as the
        // FlashMLA prefill peer's), 128 window rows ending at the token.
        let prompts: &[usize] = if short { &[4096] } else { &[4096, 32768] };
        for &tokens in prompts {
            if !wanted(format!("prefill:{tokens}")) {
                continue;
            }
            let window = window_rows(&dev, tokens, &mut rng);
            let compressed = compressed_rows(&dev, tokens / 2, &mut rng);
            let wi: Vec<i32> = (0..tokens)
                .flat_map(|p| (0..KW).map(move |k| ((p + tokens + k + 1 - KW) % tokens) as i32))
                .collect();
            let ci: Vec<i32> = (0..tokens * KC)
                .map(|_| rng.below(tokens / 2) as i32)
                .collect();
            let sets = vec![(
                queries(&dev, tokens, &mut rng),
                i32s(&dev, wi, &[tokens, KW]),
                i32s(&dev, ci, &[tokens, KC]),
            )];
            let shape = json!({ "tokens": tokens, "rows": KW + KC });
            measure(
                &mut h,
                "sparse_mqa_prefill",
                shape,
                tokens,
                &window,
                &compressed,
                &sets,
                &sink,
                &PREFILL_KERNELS,
            );
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("attention_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
