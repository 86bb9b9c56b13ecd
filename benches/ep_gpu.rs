//! GPU benchmark of the expert-parallel dispatch and combine on one H200
//! (one rank, the local transport) at V4.1's MoE shape (hidden 5120, 384
//! experts, top-6, FP8 dispatch, BF16 combine), through the shared harness
//! (`benches/common/gpu_harness.rs`), with torch peers from
//! benches/peers/ep_torch.py (`index_select` for dispatch, `index_add_`
//! for combine). Records `ep_dispatch` and `ep_combine`, shape
//! `{mode, tokens, ranks}`: prefill (normal mode) at 4K–32K tokens, decode
//! (low-latency mode) at 1–256 tokens per rank. The low-latency rows time
//! `ep::LowLatencyBuffer` (buffers allocated once, no host round trip:
//! two launches for dispatch, one for combine); the normal rows
//! `ep::dispatch` / `ep::combine`.
//!
//! GB/s count the bytes a fused kernel must move: dispatch reads the BF16
//! tokens once and writes the expert-major FP8 rows and scales; combine
//! reads every entry's BF16 row and the shared output and writes the tokens.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ep::{self, EpConfig, Local, LowLatencyBuffer, Mode, Payload, Placement};
    use deepinfer::{Device, Tensor, ops};
    use half::bf16;
    use serde_json::json;

    const D: usize = 5120;
    const EXPERTS: usize = 384;
    const TOP_K: usize = 6;

    fn bf16s(dev: &Device, n: usize, salt: usize, shape: &[usize]) -> Tensor {
        let v: Vec<bf16> = (0..n)
            .map(|i| bf16::from_f32(((i * 7919 + salt * 104729) % 2001) as f32 / 500.0 - 2.0))
            .collect();
        Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
    }

    /// Routing of `tokens` tokens by the routing op over spread logits.
    fn routing(dev: &Device, tokens: usize) -> (Tensor, Tensor) {
        let logits: Vec<f32> = (0..tokens * EXPERTS)
            .map(|i| ((i * 2654435761usize) % 4099) as f32 / 256.0 - 8.0)
            .collect();
        let logits = Tensor::from_vec(logits, &[tokens, EXPERTS])
            .unwrap()
            .to_device(dev)
            .unwrap();
        let bias = Tensor::from_vec(vec![0.0f32; EXPERTS], &[EXPERTS])
            .unwrap()
            .to_device(dev)
            .unwrap();
        ops::moe_route(&logits, &bias, TOP_K, 1.5).unwrap()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("ep_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let shapes = [4096usize, 8192, 16384, 32768]
            .map(|t| ("normal", t, Mode::Normal))
            .into_iter()
            .chain([1usize, 16, 64, 128, 256].map(|t| ("low_latency", t, Mode::low_latency(t, 1))));
        for (mode_name, tokens, mode) in shapes {
            let cfg = EpConfig::new(
                Placement::uniform(EXPERTS, 1).unwrap(),
                TOP_K,
                D,
                Payload::Fp8,
                mode,
            )
            .unwrap();
            let copies = Harness::copies(2 * tokens * D).min(8);
            let xs: Vec<Tensor> = (0..copies)
                .map(|c| bf16s(&dev, tokens * D, c, &[tokens, D]))
                .collect();
            let (ids, w) = routing(&dev, tokens);
            let shape = json!({ "mode": mode_name, "tokens": tokens, "ranks": 1 });
            let n = tokens * TOP_K;
            // The low-latency mode runs in buffers allocated once, as a
            // decode step (captured in a CUDA graph) runs it.
            let mut ll = match mode {
                Mode::LowLatency { .. } => Some(LowLatencyBuffer::new(&cfg, &dev).unwrap()),
                Mode::Normal => None,
            };
            let us = h.time_us(|i| match &mut ll {
                Some(buf) => buf.dispatch(&xs[i % copies], &ids, &w).unwrap(),
                None => {
                    ep::dispatch(&Local, &cfg, &xs[i % copies], &ids, &w).unwrap();
                }
            });
            let bytes = tokens * D * 2 + n * (D + D / 32);
            h.record_shaped(
                "ep_dispatch",
                "ep_dispatch",
                shape.clone(),
                us,
                bytes,
                "2*T*D (bf16 tokens) + T*k*(D + D/32) (expert-major fp8 rows and scales)",
            );
            let got = ep::dispatch(&Local, &cfg, &xs[0], &ids, &w).unwrap();
            let out_rows = got.handle.out_rows();
            let lead: Vec<usize> = match mode {
                Mode::Normal => vec![out_rows],
                Mode::LowLatency { capacity, .. } => vec![out_rows / capacity, capacity],
            };
            let out_shape: Vec<usize> = lead.into_iter().chain([D]).collect();
            let outs: Vec<Tensor> = (0..copies)
                .map(|c| bf16s(&dev, out_rows * D, c + 7, &out_shape))
                .collect();
            let shared = bf16s(&dev, tokens * D, 3, &[tokens, D]);
            let mut y = Tensor::empty(&dev, deepinfer::DType::BF16, &[tokens, D]).unwrap();
            let us = h.time_us(|i| match &ll {
                Some(buf) => buf
                    .combine_into(&outs[i % copies], &shared, &mut y)
                    .unwrap(),
                None => {
                    ep::combine(&Local, &got.handle, &outs[i % copies], &shared).unwrap();
                }
            });
            let bytes = n * D * 2 + 2 * tokens * D * 2;
            h.record_shaped(
                "ep_combine",
                "ep_combine",
                shape,
                us,
                bytes,
                "2*T*k*D (bf16 entry rows) + 2*T*D (shared) + 2*T*D (bf16 out)",
            );
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("ep_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
