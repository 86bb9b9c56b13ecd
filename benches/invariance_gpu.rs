//! The cost of the batch-invariant mode (`DEEPINFER_BATCH_INVARIANT=1`,
//! issue 12) on the H200, op by op: the same inputs through a plain device
//! handle and through `Device::with_batch_invariant_kernels`, in one run.
//!
//! - BF16 linears (`ops::bf16_linear_into`, `ops::grouped_bf16_linear`):
//!   cuBLAS's own choice per M (peer `cublas_bf16_default`) against the
//!   pinned cuBLASLt algorithm (no split-K reduction), at V4.1's BF16
//!   shapes: the router (384 × 5120, F32 out), the compressor's wkv
//!   (512 × 5120, F32 out), the index keys' wk (128 × 512), the head
//!   (129,280 × 5120, F32 out) and `wo_a` (8 groups of 1024 × 4096).
//! - MXFP8 linears (`ops::mxfp8_linear_into`, `GemmImpl::Auto`): the skinny
//!   kernel Auto runs for M ≤ 64 (peer `mxfp8_auto_default`) against the
//!   large kernel the invariant device pins, for wq_a, wo_b and the shared
//!   expert's w1/w3.
//!
//! Records `<op>_invariant/<name>` with shape {m, n, k, groups}, TFLOP/s =
//! 2·M·N·K·groups / time, GB/s over the bytes that must move once (stated
//! per record), and `cost` = invariant time / default time. Inputs rotate
//! over ≥ 512 MiB so L2 holds none of them.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops::{self, GemmImpl};
    use deepinfer::{DType, Device, E4M3, E8M0, Tensor};
    use half::bf16;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    /// (name, N, K, groups, output dtype) of V4.1's BF16 linears.
    const BF16_LINEARS: &[(&str, usize, usize, usize, DType)] = &[
        ("gate", 384, 5120, 1, DType::F32),
        ("compressor_wkv", 512, 5120, 1, DType::F32),
        ("index_wk", 128, 512, 1, DType::BF16),
        ("head", 129_280, 5120, 1, DType::F32),
        ("wo_a", 1024, 4096, 8, DType::BF16),
    ];
    const BF16_MS: &[usize] = &[1, 8, 64, 256, 4096];
    /// (name, N, K) of FP8 projections, at the M where Auto runs the skinny kernel.
    const FP8_LINEARS: &[(&str, usize, usize)] = &[
        ("wq_a", 1280, 5120),
        ("wo_b", 5120, 8192),
        ("shared_w13", 4608, 5120),
    ];
    const FP8_MS: &[usize] = &[1, 8, 64];

    fn tensor<T: deepinfer::dtype::Element>(
        dev: &Device,
        v: Vec<T>,
        shape: &[usize],
        copies: usize,
    ) -> Vec<Tensor> {
        let t = Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap();
        (0..copies).map(|_| t.clone()).collect()
    }

    fn bf16s(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect()
    }

    /// Median µs of `f(i)`, or the first call's error.
    fn timed(
        h: &Harness,
        mut f: impl FnMut(usize) -> deepinfer::Result<()>,
    ) -> Result<f64, String> {
        f(0).map_err(|e| e.to_string())?;
        h.cuda.synchronize().map_err(|e| e.to_string())?;
        let us = h.time_us(|i| f(i).unwrap());
        h.cuda.synchronize().map_err(|e| e.to_string())?;
        Ok(us)
    }

    #[allow(clippy::too_many_arguments, reason = "one record's fields")]
    fn record(
        h: &mut Harness,
        op: String,
        shape: serde_json::Value,
        ours: Result<f64, String>,
        default_name: &str,
        default_us: Result<f64, String>,
        flops: f64,
        bytes: usize,
        formula: &str,
    ) {
        let peer = match (&ours, &default_us) {
            (Ok(o), Ok(d)) => {
                println!("{op:<40} cost {:.3}x", o / d);
                json!({ "name": default_name, "us": d, "cost": o / d })
            }
            (_, Ok(d)) => json!({ "name": default_name, "us": d }),
            (_, Err(e)) => json!({ "name": default_name, "error": e }),
        };
        h.record_gemm(&op, "", shape, ours, flops, bytes, formula, vec![peer]);
    }

    fn bf16_rows(h: &mut Harness, rng: &mut rand::rngs::StdRng) {
        let plain = h.dev.clone();
        let pinned = plain.with_batch_invariant_kernels();
        for &(name, n, k, g, out_dtype) in BF16_LINEARS {
            let wc = Harness::copies(2 * g * n * k);
            let w = tensor(&plain, bf16s(rng, g * n * k), &[g * n, k], wc);
            for &m in BF16_MS {
                let ac = Harness::copies(2 * g * m * k);
                let x = bf16s(rng, m * g * k);
                let a = tensor(&plain, x.clone(), &[m, g * k], ac);
                let ai = tensor(&pinned, x, &[m, g * k], ac);
                let mut out = Tensor::empty(&plain, out_dtype, &[m, g * n]).unwrap();
                let mut out_i = Tensor::empty(&pinned, out_dtype, &[m, g * n]).unwrap();
                let run = |a: &[Tensor], out: &mut Tensor, i: usize| {
                    if g == 1 {
                        ops::bf16_linear_into(&a[i % ac], &w[i % wc], out)
                    } else {
                        ops::grouped_bf16_linear_into(&a[i % ac], &w[i % wc], g, out)
                    }
                };
                let base = timed(h, |i| run(&a, &mut out, i));
                let ours = timed(h, |i| run(&ai, &mut out_i, i));
                let osize = out_dtype.storage_bytes(1);
                record(
                    h,
                    format!("bf16_linear_invariant/{name}"),
                    json!({ "m": m, "n": n, "k": k, "groups": g }),
                    ours,
                    "cublas_bf16_default",
                    base,
                    2.0 * (g * m * n * k) as f64,
                    2 * g * (m * k + n * k) + osize * g * m * n,
                    "2*groups*(m*k + n*k) (bf16 a, w) + out_bytes*groups*m*n",
                );
            }
        }
    }

    fn fp8_rows(h: &mut Harness, rng: &mut rand::rngs::StdRng) {
        let plain = h.dev.clone();
        let pinned = plain.with_batch_invariant_kernels();
        let fp8 = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<E4M3> {
            (0..n).map(|_| E4M3(rng.random::<u8>() & 0xBF)).collect()
        };
        let scales = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<E8M0> {
            (0..n)
                .map(|_| E8M0(120 + rng.random::<u8>() % 11))
                .collect()
        };
        for &(name, n, k) in FP8_LINEARS {
            let (kb, nb) = (k.div_ceil(32), n.div_ceil(32));
            let wc = Harness::copies(n * k);
            let w = tensor(&plain, fp8(rng, n * k), &[n, k], wc);
            let ws = tensor(&plain, scales(rng, nb * kb), &[nb, kb], wc);
            for &m in FP8_MS {
                let ac = Harness::copies(m * k);
                let (x, xs) = (fp8(rng, m * k), scales(rng, m * kb));
                let (a, a_s) = (
                    tensor(&plain, x.clone(), &[m, k], ac),
                    tensor(&plain, xs.clone(), &[m, kb], ac),
                );
                let (ai, a_si) = (
                    tensor(&pinned, x, &[m, k], ac),
                    tensor(&pinned, xs, &[m, kb], ac),
                );
                let mut out = Tensor::empty(&plain, DType::BF16, &[m, n]).unwrap();
                let mut out_i = Tensor::empty(&pinned, DType::BF16, &[m, n]).unwrap();
                let run = |a: &[Tensor], a_s: &[Tensor], out: &mut Tensor, i: usize| {
                    let (j, v) = (i % ac, i % wc);
                    ops::mxfp8_linear_into(&a[j], &a_s[j], &w[v], &ws[v], out, GemmImpl::Auto)
                };
                let base = timed(h, |i| run(&a, &a_s, &mut out, i));
                let ours = timed(h, |i| run(&ai, &a_si, &mut out_i, i));
                record(
                    h,
                    format!("mxfp8_linear_invariant/{name}"),
                    json!({ "m": m, "n": n, "k": k, "groups": 1 }),
                    ours,
                    "mxfp8_auto_default",
                    base,
                    2.0 * (m * n * k) as f64,
                    m * k + m * kb + n * k + nb * kb + 2 * m * n,
                    "m*k (a) + m*ceil(k/32) (a_s) + n*k (w) + ceil(n/32)*ceil(k/32) (w_s) + 2*m*n (bf16 out)",
                );
            }
        }
    }

    pub fn main() {
        let Some(mut h) = Harness::open("invariance_gpu") else {
            return;
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x1a7);
        bf16_rows(&mut h, &mut rng);
        fp8_rows(&mut h, &mut rng);
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("invariance_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
