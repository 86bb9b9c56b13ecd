//! GPU benchmark of the TileLang mHC kernels at V4.1's hidden size (D =
//! 5120), through the shared harness (`benches/common/gpu_harness.rs`), with
//! torch peers from benches/peers/mhc_torch.py: `mhc_pre` (collapse with the
//! lagged pre, the 24 mixes, split and 20-iteration Sinkhorn) and
//! `mhc_expand` (the new streams from post/comb and the sublayer output), and
//! the single-pass step between sublayers, `mhc_expand_pre` (the expand fused
//! with the next front half) against the same two ops in a row.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops::{self, MhcParams, MhcPre};
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;

    /// V4.1's hidden size.
    const D: usize = 5120;

    fn upload<T: deepinfer::dtype::Element>(dev: &Device, v: Vec<T>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
    }

    /// Rotating copies of (streams, pre_in, f_out): streams and f in [−2, 2],
    /// pre in [0.25, 1.75].
    fn inputs(dev: &Device, t: usize) -> Vec<(Tensor, Tensor, Tensor)> {
        let copies = Harness::copies(2 * 5 * t * D + 16 * t);
        (0..copies)
            .map(|c| {
                let act = |n: usize, salt: usize| -> Vec<bf16> {
                    (0..n)
                        .map(|i| {
                            bf16::from_f32(
                                ((i * 7919 + c * 104729 + salt) % 2001) as f32 / 500.0 - 2.0,
                            )
                        })
                        .collect()
                };
                let lag: Vec<f32> = (0..4 * t)
                    .map(|i| 0.25 + ((i + c) % 7) as f32 / 4.0)
                    .collect();
                (
                    upload(dev, act(t * 4 * D, 0), &[t, 4, D]),
                    upload(dev, lag, &[t, 4]),
                    upload(dev, act(t * D, 1013), &[t, D]),
                )
            })
            .collect()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("mhc_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let hc_fn: Vec<f32> = (0..24 * 4 * D)
            .map(|i| ((i * 31) % 1001) as f32 / 10000.0 - 0.05)
            .collect();
        let hc_fn = upload(&dev, hc_fn, &[24, 4 * D]);
        let base = upload(
            &dev,
            (0..24).map(|i| (i % 5) as f32 / 5.0 - 0.4).collect(),
            &[24],
        );
        let scale = upload(&dev, vec![0.5f32, 0.75, 1.0], &[3]);
        let p = MhcParams::default();
        for t in [1usize, 64, 256, 4096, 16384] {
            let xs = inputs(&dev, t);
            let mut out = MhcPre {
                u: Tensor::empty(&dev, DType::BF16, &[t, D]).unwrap(),
                mixes: Tensor::empty(&dev, DType::F32, &[t, 24]).unwrap(),
                pre: Tensor::empty(&dev, DType::F32, &[t, 4]).unwrap(),
                post: Tensor::empty(&dev, DType::F32, &[t, 4]).unwrap(),
                comb: Tensor::empty(&dev, DType::F32, &[t, 16]).unwrap(),
            };
            let mut call = |i: usize| {
                let (s, lag, _) = &xs[i % xs.len()];
                ops::mhc_pre_into(s, &hc_fn, &base, &scale, lag, p, &mut out).unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 2 * 4 * t * D + 4 * 24 * 4 * D + 2 * t * D + 4 * t * (4 + 24 + 4 + 4 + 16);
            h.record(
                "mhc_pre_tilelang",
                "mhc_pre",
                t,
                D,
                us,
                bytes,
                "2*4*rows*dim (streams) + 4*24*4*dim (hc_fn) + 2*rows*dim (u) + 4*rows*52 (pre_in, mixes, pre, post, comb)",
            );
            if t <= 256 {
                h.record_graph_twin(&mut call);
            }
            let mut s_out = Tensor::empty(&dev, DType::BF16, &[t, 4, D]).unwrap();
            let mut call = |i: usize| {
                let (s, _, f) = &xs[i % xs.len()];
                ops::mhc_expand_into(s, f, &out.post, &out.comb, &mut s_out).unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 2 * 4 * t * D + 2 * t * D + 2 * 4 * t * D + 4 * 20 * t;
            h.record(
                "mhc_expand_tilelang",
                "mhc_expand",
                t,
                D,
                us,
                bytes,
                "2*4*rows*dim (streams) + 2*rows*dim (f) + 2*4*rows*dim (new streams) + 4*20*rows (post, comb)",
            );
            if t <= 256 {
                h.record_graph_twin(&mut call);
            }
            // The single-pass step between two sublayers: the expand fused
            // with the next front half, against the two ops in a row (same
            // run, same inputs; post and comb are the front's above). Both
            // records count the bytes the step must move.
            let w = ops::MhcWeights {
                func: &hc_fn,
                base: &base,
                scale: &scale,
            };
            let mut next = MhcPre {
                u: Tensor::empty(&dev, DType::BF16, &[t, D]).unwrap(),
                mixes: Tensor::empty(&dev, DType::F32, &[t, 24]).unwrap(),
                pre: Tensor::empty(&dev, DType::F32, &[t, 4]).unwrap(),
                post: Tensor::empty(&dev, DType::F32, &[t, 4]).unwrap(),
                comb: Tensor::empty(&dev, DType::F32, &[t, 16]).unwrap(),
            };
            let bytes = 2 * 4 * t * D
                + 2 * t * D
                + 2 * 4 * t * D
                + 2 * t * D
                + 4 * 24 * 4 * D
                + 4 * t * (4 + 20 + 24 + 4 + 20);
            let formula = "2*4*rows*dim (streams) + 2*rows*dim (f) + 2*4*rows*dim (new streams) + 2*rows*dim (u) + 4*24*4*dim (hc_fn) + 4*rows*72 (pre_in, post, comb in; mixes, pre, post, comb out)";
            let mut call = |i: usize| {
                let (s, lag, f) = &xs[i % xs.len()];
                ops::mhc_expand_pre_into(
                    s, f, &out.post, &out.comb, w, lag, p, &mut s_out, &mut next,
                )
                .unwrap()
            };
            let us = h.time_us(&mut call);
            h.record(
                "mhc_expand_pre_tilelang",
                "mhc_expand_pre",
                t,
                D,
                us,
                bytes,
                formula,
            );
            if t <= 256 {
                h.record_graph_twin(&mut call);
            }
            let mut call = |i: usize| {
                let (s, lag, f) = &xs[i % xs.len()];
                ops::mhc_expand_into(s, f, &out.post, &out.comb, &mut s_out).unwrap();
                ops::mhc_pre_into(&s_out, &hc_fn, &base, &scale, lag, p, &mut next).unwrap()
            };
            let us = h.time_us(&mut call);
            h.record(
                "mhc_expand_then_pre_tilelang",
                "mhc_expand_pre",
                t,
                D,
                us,
                bytes,
                formula,
            );
            if t <= 256 {
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
    eprintln!("mhc_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
