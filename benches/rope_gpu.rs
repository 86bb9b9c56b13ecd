//! GPU benchmark of the TileLang RoPE kernel (`ops::rope_into` and
//! `ops::inverse_rope_into`) at V4.1's attention shape (64 heads × 512, the
//! last 64 dims rotating, θ = 160000 with YaRN), through the shared harness
//! (`benches/common/gpu_harness.rs`), with torch peers from
//! benches/peers/rope_torch.py. A call includes what the op does on the
//! host: computing the layer's frequency table and uploading its 32 fp32
//! values (outputs are preallocated).

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::cpu_backend::{RopeParams, Yarn};
    use deepinfer::ops;
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;

    const HEADS: usize = 64;
    const HEAD_DIM: usize = 512;
    const ROPE_DIM: usize = 64;
    const PARAMS: RopeParams = RopeParams {
        theta: 160000.0,
        yarn: Some(Yarn {
            factor: 16.0,
            original_seq_len: 65536,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
    };

    /// Rotating copies of one [tokens, 64, 512] input and of its positions.
    fn inputs(dev: &Device, tokens: usize) -> (Vec<Tensor>, Vec<Tensor>) {
        let n = tokens * HEADS * HEAD_DIM;
        let copies = Harness::copies(2 * n);
        let x: Vec<bf16> = (0..n)
            .map(|i| bf16::from_f32((i * 7919 % 2001) as f32 / 500.0 - 2.0))
            .collect();
        let x = Tensor::from_vec(x, &[tokens, HEADS, HEAD_DIM]).unwrap();
        let pos: Vec<i64> = (0..tokens as i64)
            .map(|t| (t * 104_729 + 65_000) % 1_048_576)
            .collect();
        let pos = Tensor::from_vec(pos, &[tokens]).unwrap();
        (
            (0..copies).map(|_| x.to_device(dev).unwrap()).collect(),
            (0..copies).map(|_| pos.to_device(dev).unwrap()).collect(),
        )
    }

    pub fn main() {
        let Some(mut h) = Harness::open("rope_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let dim = HEADS * HEAD_DIM;
        for tokens in [1usize, 64, 256, 4096, 16384] {
            let (xs, ps) = inputs(&dev, tokens);
            let mut out = Tensor::empty(&dev, DType::BF16, &[tokens, HEADS, HEAD_DIM]).unwrap();
            for (name, peer_op, inverse) in [
                ("inverse_rope_tilelang", "inverse_rope", true),
                ("rope_tilelang", "rope", false),
            ] {
                let mut call = |i: usize| {
                    let (x, p) = (&xs[i % xs.len()], &ps[i % ps.len()]);
                    if inverse {
                        ops::inverse_rope_into(x, p, HEADS, ROPE_DIM, &PARAMS, &mut out).unwrap()
                    } else {
                        ops::rope_into(x, p, HEADS, ROPE_DIM, &PARAMS, &mut out).unwrap()
                    }
                };
                let us = h.time_us(&mut call);
                let bytes = 2 * 2 * tokens * dim + 8 * tokens;
                h.record(
                    name,
                    peer_op,
                    tokens,
                    dim,
                    us,
                    bytes,
                    "2*2*T*H*hd (x read, out written) + 8*T (positions)",
                );
                if tokens <= 256 {
                    h.record_graph_twin(&mut call);
                }
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("rope_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
