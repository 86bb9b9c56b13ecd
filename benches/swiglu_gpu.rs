//! GPU benchmark of the fused TileLang SwiGLU + FP8 1×32 quantiser (the W2
//! input of every expert) at V4.1's intermediate width, reading the
//! interleaved gate-up output `[rows, 2·inter]`, through the shared
//! harness (`benches/common/gpu_harness.rs`), with torch peers from
//! benches/peers/swiglu_torch.py.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops;
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;

    /// V4.1's expert intermediate width and SwiGLU limit.
    const INTER: usize = 2304;
    const LIMIT: f32 = 10.0;

    /// Rotating copies of (gu, weight): g and u over [−12.5, 12.5] (so both
    /// clamps fire), weights in [0.25, 1.75].
    fn inputs(dev: &Device, rows: usize, inter: usize) -> Vec<(Tensor, Tensor)> {
        let copies = Harness::copies(4 * rows * inter + 4 * rows);
        let act = |c: usize| {
            let v: Vec<bf16> = (0..2 * rows * inter)
                .map(|i| bf16::from_f32(((i * 7919 + c * 104729) % 2001) as f32 / 80.0 - 12.5))
                .collect();
            Tensor::from_vec(v, &[rows, 2 * inter])
                .unwrap()
                .to_device(dev)
                .unwrap()
        };
        (0..copies)
            .map(|c| {
                let w: Vec<f32> = (0..rows)
                    .map(|r| 0.25 + ((r + c) % 7) as f32 / 4.0)
                    .collect();
                let w = Tensor::from_vec(w, &[rows])
                    .unwrap()
                    .to_device(dev)
                    .unwrap();
                (act(c), w)
            })
            .collect()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("swiglu_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        // DEEPINFER_BENCH_POINTS="16384" keeps those row counts (profiler runs).
        let keep: Option<Vec<usize>> = std::env::var("DEEPINFER_BENCH_POINTS")
            .ok()
            .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect());
        for rows in [1usize, 64, 256, 4096, 16384] {
            if keep.as_ref().is_some_and(|k| !k.contains(&rows)) {
                continue;
            }
            let xs = inputs(&dev, rows, INTER);
            let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, INTER]).unwrap();
            let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, INTER / 32]).unwrap();
            let us = h.time_us(|i| {
                let (gu, w) = &xs[i % xs.len()];
                ops::swiglu_act_quant_fp8_into(gu, w, LIMIT, &mut q, &mut s).unwrap()
            });
            let bytes = 2 * 2 * rows * INTER + rows * INTER + rows * INTER / 32 + 4 * rows;
            h.record(
                "swiglu_act_quant_fp8_tilelang",
                "swiglu_act_quant_fp8",
                rows,
                INTER,
                us,
                bytes,
                "2*2*rows*dim (gu) + rows*dim (q) + rows*dim/32 (scales) + 4*rows (weights)",
            );
            if rows <= 256 {
                // Decode batches: the same calls replayed from a CUDA graph.
                h.record_graph_twin(|i| {
                    let (gu, w) = &xs[i % xs.len()];
                    ops::swiglu_act_quant_fp8_into(gu, w, LIMIT, &mut q, &mut s).unwrap()
                });
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("swiglu_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
