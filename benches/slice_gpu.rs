//! GPU benchmark of the first slice — RMSNorm, the FP8 1×32 quantiser (CUDA
//! and TileLang) and the fused TileLang RMSNorm + quantiser — at V4.1's
//! hidden width, through the shared harness (`benches/common/gpu_harness.rs`:
//! medians of CUDA-event timings, inputs rotated out of L2, copy ceiling and
//! torch peers from benches/peers/slice_torch.py in the same run).

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops::{self, ActQuantImpl};
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;

    const DIM: usize = 5120;

    fn inputs(dev: &Device, rows: usize) -> Vec<Tensor> {
        (0..Harness::copies(rows * DIM * 2))
            .map(|c| {
                let v: Vec<bf16> = (0..rows * DIM)
                    .map(|i| bf16::from_f32(((i * 7919 + c * 104729) % 2001) as f32 / 500.0 - 2.0))
                    .collect();
                Tensor::from_vec(v, &[rows, DIM])
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
            })
            .collect()
    }

    pub fn main() {
        let Some(mut h) = Harness::open("slice_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let w = Tensor::from_vec(vec![bf16::ONE; DIM], &[DIM])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        for rows in [1usize, 64, 256, 4096, 16384] {
            let xs = inputs(&dev, rows);
            let mut y = Tensor::empty(&dev, DType::BF16, &[rows, DIM]).unwrap();
            let mut call =
                |i: usize| ops::rms_norm_into(&xs[i % xs.len()], &w, 1e-20, &mut y).unwrap();
            let us = h.time_us(&mut call);
            let bytes = 4 * rows * DIM + 2 * DIM;
            h.record(
                "rms_norm_bf16",
                "rms_norm",
                rows,
                DIM,
                us,
                bytes,
                "4*rows*dim + 2*dim (x read, y written, weight)",
            );
            if rows <= 256 {
                h.record_graph_twin(&mut call);
            }
            for (name, imp) in [
                ("act_quant_fp8", ActQuantImpl::Cuda),
                ("act_quant_fp8_tilelang", ActQuantImpl::TileLang),
            ] {
                let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, DIM]).unwrap();
                let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, DIM / 32]).unwrap();
                let mut call = |i: usize| {
                    ops::act_quant_fp8_into(&xs[i % xs.len()], &mut q, &mut s, imp).unwrap()
                };
                let us = h.time_us(&mut call);
                let bytes = 3 * rows * DIM + rows * DIM / 32;
                h.record(
                    name,
                    "act_quant_fp8",
                    rows,
                    DIM,
                    us,
                    bytes,
                    "2*rows*k (x) + rows*k (q) + rows*k/32 (scales)",
                );
                if rows <= 256 {
                    h.record_graph_twin(&mut call);
                }
            }
            let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, DIM]).unwrap();
            let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, DIM / 32]).unwrap();
            let mut call = |i: usize| {
                ops::rms_norm_act_quant_fp8_into(
                    &xs[i % xs.len()],
                    &w,
                    1e-20,
                    &mut y,
                    &mut q,
                    &mut s,
                )
                .unwrap()
            };
            let us = h.time_us(&mut call);
            let bytes = 2 * rows * DIM + 2 * rows * DIM + rows * DIM + rows * DIM / 32 + 2 * DIM;
            h.record(
                "rms_norm_act_quant_fp8_tilelang",
                "rms_norm_act_quant_fp8",
                rows,
                DIM,
                us,
                bytes,
                "2*rows*dim (x) + 2*rows*dim (y) + rows*dim (q) + rows*dim/32 (scales) + 2*dim (weight)",
            );
            if rows <= 256 {
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
    eprintln!("slice_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
