//! GPU benchmark of the TileLang MoE routing kernel (√softplus scores, biased
//! top-6 of V4.1's 384 experts, renormalised weights × 1.5) through the
//! shared harness (`benches/common/gpu_harness.rs`), with torch peers from
//! benches/peers/moe_route_torch.py; then the grouped-GEMM layout of the
//! routed ids (counts, offsets, permutation; no torch peer). First the
//! routing of one EP-64 rank (its 6 local experts, top-6) at decode sizes.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops;
    use deepinfer::{DType, Device, Tensor};

    /// V4.1's routed experts, top-k and route scale.
    const EXPERTS: usize = 384;
    const TOP_K: usize = 6;
    const ROUTE_SCALE: f32 = 1.5;

    /// An EP-64 rank's local experts (`ModelConfig::ep_rank`: 384 / 64),
    /// all of them taken: the routing of `benches/model_gpu.rs`'s rank.
    const RANK_EXPERTS: usize = 6;

    /// Rotating copies of the logits over [−8, 24).
    fn inputs(dev: &Device, tokens: usize, experts: usize) -> Vec<Tensor> {
        let copies = Harness::copies(4 * tokens * experts);
        (0..copies)
            .map(|c| {
                let v: Vec<f32> = (0..tokens * experts)
                    .map(|i| ((i * 7919 + c * 104729) % 4099) as f32 / 128.0 - 8.0)
                    .collect();
                Tensor::from_vec(v, &[tokens, experts])
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
            })
            .collect()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("moe_route_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let bias: Vec<f32> = (0..EXPERTS)
            .map(|e| ((e * 37) % 64) as f32 / 64.0 - 0.5)
            .collect();
        let bias = Tensor::from_vec(bias, &[EXPERTS])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let rank_bias = Tensor::full_f32(&dev, &[RANK_EXPERTS], 0.25).unwrap();
        for tokens in [1usize, 8, 64] {
            let xs = inputs(&dev, tokens, RANK_EXPERTS);
            let mut ids = Tensor::empty(&dev, DType::I32, &[tokens, TOP_K]).unwrap();
            let mut w = Tensor::empty(&dev, DType::F32, &[tokens, TOP_K]).unwrap();
            let mut call = |i: usize| {
                let x = &xs[i % xs.len()];
                ops::moe_route_into(x, &rank_bias, TOP_K, ROUTE_SCALE, &mut ids, &mut w).unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 4 * tokens * RANK_EXPERTS + 4 * RANK_EXPERTS + 8 * tokens * TOP_K;
            h.record(
                "moe_route_tilelang_rank",
                "moe_route",
                tokens,
                RANK_EXPERTS,
                us,
                bytes,
                "4*rows*dim (logits) + 4*dim (bias) + 8*rows*top_k (ids, weights); an EP-64 rank: dim = top_k = 6",
            );
            h.record_graph_twin(&mut call);
        }
        for tokens in [1usize, 64, 256, 4096, 16384] {
            let xs = inputs(&dev, tokens, EXPERTS);
            let mut ids = Tensor::empty(&dev, DType::I32, &[tokens, TOP_K]).unwrap();
            let mut w = Tensor::empty(&dev, DType::F32, &[tokens, TOP_K]).unwrap();
            let mut call = |i: usize| {
                ops::moe_route_into(
                    &xs[i % xs.len()],
                    &bias,
                    TOP_K,
                    ROUTE_SCALE,
                    &mut ids,
                    &mut w,
                )
                .unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 4 * tokens * EXPERTS + 4 * EXPERTS + 8 * tokens * TOP_K;
            h.record(
                "moe_route_tilelang",
                "moe_route",
                tokens,
                EXPERTS,
                us,
                bytes,
                "4*rows*dim (logits) + 4*dim (bias) + 8*rows*top_k (ids, weights); top_k = 6",
            );
            if tokens <= 256 {
                h.record_graph_twin(&mut call);
            }
            let mut counts = Tensor::empty(&dev, DType::I32, &[EXPERTS]).unwrap();
            let mut offsets = Tensor::empty(&dev, DType::I32, &[EXPERTS + 1]).unwrap();
            let mut perm = Tensor::empty(&dev, DType::I32, &[tokens * TOP_K]).unwrap();
            let mut call = |_: usize| {
                ops::moe_layout_into(&ids, EXPERTS, &mut counts, &mut offsets, &mut perm).unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 8 * tokens * TOP_K + 4 * EXPERTS + 4 * (EXPERTS + 1);
            h.record(
                "moe_layout_tilelang",
                "moe_layout",
                tokens,
                EXPERTS,
                us,
                bytes,
                "4*rows*top_k (ids) + 4*rows*top_k (permutation) + 4*dim + 4*(dim+1) (counts, offsets); \
                 every CTA re-reads the ids from L2, not counted",
            );
            if tokens <= 256 {
                h.record_graph_twin(&mut call);
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("moe_route_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
