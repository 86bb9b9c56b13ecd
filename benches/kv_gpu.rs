//! GPU benchmark of the cache-row writers (`kernels-cuda/kv/`) at V4.1's
//! shapes, each against a device-to-device copy of the same bytes measured
//! in the same run (`Harness::record_vs_copy`):
//! - `window_ring_write`: `ops::kv_rows_into`, the `wkv` output (BF16
//!   `[T, 512]`) → kv_norm → RoPE (last 64, θ 160000 + YaRN) → the 528-byte
//!   FP8 row stored at a shuffled slot of the window pool;
//! - `compressor`: `ops::compressor_rows_into`, ratio 2: F32 kv and score
//!   `[T, 512]` → T/2 pooled entries → norm (latent out) → RoPE → the
//!   288-byte FP4 row at a shuffled slot;
//! - `compressor_ratio1`: `ops::kv_rows_into` with the compressed format and
//!   the latent (the `wkv` output of layer 20, BF16 `[T, 512]`);
//! - `index_key_write`: `ops::kv_rows_into`, the `wk` output (BF16
//!   `[n, 128]`) → k_norm → RoPE → the 68-byte FP4 key.
//!
//! T ∈ {1 (2 for ratio 2), 64, 4096, 32768} tokens. A call includes what the
//! op does on the host (the layer's frequency table, passed by value);
//! inputs and pool regions rotate over ≥ 512 MiB so L2 holds none of them.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::cpu_backend::{RopeParams, Yarn};
    use deepinfer::ops::{self, KvRowFormat, RowNorm, RowRope, RowsOut};
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;
    use serde_json::json;

    const D: usize = 512;
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
    const EPS: f32 = 1e-20;

    fn bf16_rows(dev: &Device, rows: usize, d: usize, seed: usize) -> Tensor {
        let v: Vec<bf16> = (0..rows * d)
            .map(|i| bf16::from_f32(((i * 7919 + seed * 104_729) % 2001) as f32 / 500.0 - 2.0))
            .collect();
        Tensor::from_vec(v, &[rows, d])
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    fn f32_rows(dev: &Device, rows: usize, d: usize, seed: usize) -> Tensor {
        let v: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 250.0 - 4.0)
            .collect();
        Tensor::from_vec(v, &[rows, d])
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    fn i64s(dev: &Device, v: Vec<i64>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, &[n]).unwrap().to_device(dev).unwrap()
    }

    fn i32s(dev: &Device, v: Vec<i32>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
    }

    /// Slots of copy `c` of `n` rows: a fixed shuffle of region c of the pool.
    fn slots(dev: &Device, n: usize, c: usize) -> Tensor {
        let v: Vec<i32> = (0..n)
            .map(|i| (c * n + (i * 7919) % n.max(1)) as i32)
            .collect();
        i32s(dev, v, &[n])
    }

    fn weight(dev: &Device, d: usize) -> Tensor {
        let w: Vec<bf16> = (0..d)
            .map(|i| bf16::from_f32(0.5 + (i % 7) as f32 / 8.0))
            .collect();
        Tensor::from_vec(w, &[d]).unwrap().to_device(dev).unwrap()
    }

    fn positions(dev: &Device, n: usize, stride: i64) -> Tensor {
        i64s(
            dev,
            (0..n as i64)
                .map(|t| (t * stride * 1009 + 65_000) % 1_048_576)
                .collect(),
        )
    }

    /// A BF16-input row writer (`kv_rows_into`) of `n` rows of `d` values.
    fn bf16_writer(
        h: &mut Harness,
        op: &str,
        format: KvRowFormat,
        n: usize,
        d: usize,
        latent: bool,
    ) {
        let dev = h.dev.clone();
        let rb = format.row_bytes(d);
        let bytes = n * (2 * d + 8 + 4 + rb + if latent { 2 * d } else { 0 }) + 2 * d;
        let copies = Harness::copies(bytes);
        let xs: Vec<Tensor> = (0..copies).map(|c| bf16_rows(&dev, n, d, c)).collect();
        let ps: Vec<Tensor> = (0..copies).map(|_| positions(&dev, n, 1)).collect();
        let ss: Vec<Tensor> = (0..copies).map(|c| slots(&dev, n, c)).collect();
        let w = weight(&dev, d);
        let (dtype, width) = ops::kv_row_layout(format, d);
        let mut pool = Tensor::empty(&dev, dtype, &[n * copies, width]).unwrap();
        let mut lats: Vec<Tensor> = (0..if latent { copies } else { 0 })
            .map(|_| Tensor::empty(&dev, DType::BF16, &[n, d]).unwrap())
            .collect();
        let us = h.time_us(|i| {
            let c = i % copies;
            ops::kv_rows_into(
                &xs[c],
                format,
                Some(RowNorm {
                    weight: &w,
                    eps: EPS,
                }),
                Some(RowRope {
                    positions: &ps[c],
                    rope_dim: ROPE_DIM,
                    params: &PARAMS,
                }),
                RowsOut {
                    pool: &mut pool,
                    slots: &ss[c],
                    latent: lats.get_mut(c),
                },
            )
            .unwrap()
        });
        let copy_us = h.copy_us(bytes / 2);
        let formula = if latent {
            "T*(2*D (x) + 8 (position) + 4 (slot) + row bytes + 2*D (latent)) + 2*D (norm weight)"
        } else {
            "T*(2*D (x) + 8 (position) + 4 (slot) + row bytes) + 2*D (norm weight)"
        };
        h.record_vs_copy(
            op,
            json!({ "tokens": n, "dim": d, "row_bytes": rb }),
            us,
            bytes,
            formula,
            copy_us,
        );
    }

    /// The ratio-2 compressor over `tokens` new tokens (tokens / 2 entries).
    fn compressor(h: &mut Harness, tokens: usize) {
        let dev = h.dev.clone();
        let n = tokens / 2;
        let rb = KvRowFormat::Compressed.row_bytes(D);
        let bytes = 2 * n * 2 * 4 * D + n * (8 + 8 + 4 + 2 * D + rb) + 2 * D;
        let copies = Harness::copies(bytes);
        let kvs: Vec<Tensor> = (0..copies).map(|c| f32_rows(&dev, 2 * n, D, c)).collect();
        let scs: Vec<Tensor> = (0..copies)
            .map(|c| f32_rows(&dev, 2 * n, D, c + 1000))
            .collect();
        let groups = i32s(&dev, (0..2 * n as i32).collect(), &[n, 2]);
        let ps: Vec<Tensor> = (0..copies).map(|_| positions(&dev, n, 2)).collect();
        let ss: Vec<Tensor> = (0..copies).map(|c| slots(&dev, n, c)).collect();
        let w = weight(&dev, D);
        let mut pool = Tensor::empty(&dev, DType::U8, &[n * copies, rb]).unwrap();
        let mut lats: Vec<Tensor> = (0..copies)
            .map(|_| Tensor::empty(&dev, DType::BF16, &[n, D]).unwrap())
            .collect();
        let us = h.time_us(|i| {
            let c = i % copies;
            ops::compressor_rows_into(
                &kvs[c],
                &scs[c],
                None,
                &groups,
                RowNorm {
                    weight: &w,
                    eps: EPS,
                },
                RowRope {
                    positions: &ps[c],
                    rope_dim: ROPE_DIM,
                    params: &PARAMS,
                },
                RowsOut {
                    pool: &mut pool,
                    slots: &ss[c],
                    latent: Some(&mut lats[c]),
                },
            )
            .unwrap()
        });
        let copy_us = h.copy_us(bytes / 2);
        h.record_vs_copy(
            "compressor",
            json!({ "tokens": tokens, "entries": n, "dim": D, "ratio": 2 }),
            us,
            bytes,
            "2n*2*4*D (kv, score f32) + n*(8 (group) + 8 (position) + 4 (slot) + 2*D (latent) + 288 (row)) + 2*D (norm weight), n = T/2 entries",
            copy_us,
        );
    }

    pub fn main() {
        let Some(mut h) = Harness::open("kv_gpu") else {
            return;
        };
        for t in [1usize, 64, 4096, 32768] {
            bf16_writer(
                &mut h,
                "window_ring_write",
                KvRowFormat::Window,
                t,
                D,
                false,
            );
        }
        for t in [2usize, 64, 4096, 32768] {
            compressor(&mut h, t);
        }
        for t in [1usize, 64, 4096, 32768] {
            bf16_writer(
                &mut h,
                "compressor_ratio1",
                KvRowFormat::Compressed,
                t,
                D,
                true,
            );
        }
        for t in [1usize, 64, 4096, 32768] {
            bf16_writer(
                &mut h,
                "index_key_write",
                KvRowFormat::IndexKey,
                t,
                128,
                false,
            );
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("kv_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
