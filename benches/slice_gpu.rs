//! GPU benchmark of the first slice (RMSNorm, FP8 1×32 quantiser: CUDA and
//! TileLang, and the fused TileLang RMSNorm + quantiser) with the
//! copy-bandwidth ceiling measured in the same run. Writes
//! the JSON of shared/gpu.md to $DEEPINFER_BENCH_JSON (default: stdout only),
//! merging torch peer timings from $DEEPINFER_PEERS_JSON when given
//! (benches/peers/slice_torch.py writes them). Times are medians over batches
//! of launches, with the inputs rotated over ≥ 512 MiB so L2 holds none of them.

#[cfg(deepinfer_cuda)]
mod gpu {
    use deepinfer::device::{CudaBuffer, CudaDevice};
    use deepinfer::ops::{self, ActQuantImpl};
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;
    use serde_json::{Value, json};

    const ROTATE_BYTES: usize = 512 << 20;
    const BATCH: usize = 20;
    const REPEATS: usize = 15;

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    }

    /// Median µs per call of `f(i)` over batches of BATCH calls.
    fn time_us(dev: &CudaDevice, mut f: impl FnMut(usize)) -> f64 {
        for i in 0..BATCH {
            f(i);
        }
        let stream = dev.stream();
        let mut samples = Vec::new();
        let mut i = 0;
        for _ in 0..REPEATS {
            let (a, b) = (dev.event().unwrap(), dev.event().unwrap());
            a.record(&stream).unwrap();
            for _ in 0..BATCH {
                f(i);
                i += 1;
            }
            b.record(&stream).unwrap();
            samples.push(a.elapsed_ms(&b).unwrap() as f64 * 1e3 / BATCH as f64);
        }
        median(samples)
    }

    fn copy_gbps(dev: &CudaDevice) -> f64 {
        let bytes = 1usize << 31;
        let src = dev.alloc(bytes).unwrap();
        let mut dst: CudaBuffer = dev.alloc(bytes).unwrap();
        let us = time_us(dev, |_| dst.copy_from(&src).unwrap());
        2.0 * bytes as f64 / (us * 1e-6) / 1e9
    }

    fn inputs(dev: &Device, rows: usize, dim: usize) -> Vec<Tensor> {
        let bytes = rows * dim * 2;
        let copies = ROTATE_BYTES.div_ceil(bytes).clamp(2, 256);
        (0..copies)
            .map(|c| {
                let v: Vec<bf16> = (0..rows * dim)
                    .map(|i| bf16::from_f32(((i * 7919 + c * 104729) % 2001) as f32 / 500.0 - 2.0))
                    .collect();
                Tensor::from_vec(v, &[rows, dim])
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
            })
            .collect()
    }

    fn peer(peers: &Value, op: &str, rows: usize, dim: usize) -> Vec<Value> {
        peers["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["op"] == op && r["rows"] == rows && r["dim"] == dim)
            .map(|r| json!({ "name": r["name"], "us": r["us"] }))
            .collect()
    }

    pub fn main() {
        let cuda = match CudaDevice::new(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("slice_gpu: {e}; nothing to measure");
                return;
            }
        };
        let dev = Device::Cuda(cuda.clone());
        let peers: Value = std::env::var("DEEPINFER_PEERS_JSON")
            .ok()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let copy = copy_gbps(&cuda);
        let mut records = Vec::new();
        let dim = 5120;
        let w = Tensor::from_vec(vec![bf16::ONE; dim], &[dim])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        println!(
            "{:<32} {:>6} {:>6} {:>10} {:>9} {:>8}  peers (us)",
            "op", "rows", "dim", "ours_us", "GB/s", "%copy"
        );
        for rows in [1usize, 64, 256, 4096, 16384] {
            let xs = inputs(&dev, rows, dim);
            let mut y = Tensor::empty(&dev, DType::BF16, &[rows, dim]).unwrap();
            let us = time_us(&cuda, |i| {
                ops::rms_norm_into(&xs[i % xs.len()], &w, 1e-20, &mut y).unwrap()
            });
            let bytes = 4 * rows * dim + 2 * dim;
            records.push(record(
                "rms_norm_bf16",
                rows,
                dim,
                us,
                bytes,
                "4*rows*dim + 2*dim (x read, y written, weight)",
                peer(&peers, "rms_norm", rows, dim),
                copy,
            ));
            for (name, imp) in [
                ("act_quant_fp8", ActQuantImpl::Cuda),
                ("act_quant_fp8_tilelang", ActQuantImpl::TileLang),
            ] {
                let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, dim]).unwrap();
                let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, dim / 32]).unwrap();
                let us = time_us(&cuda, |i| {
                    ops::act_quant_fp8_into(&xs[i % xs.len()], &mut q, &mut s, imp).unwrap()
                });
                let bytes = 3 * rows * dim + rows * dim / 32;
                records.push(record(
                    name,
                    rows,
                    dim,
                    us,
                    bytes,
                    "2*rows*k (x) + rows*k (q) + rows*k/32 (scales)",
                    peer(&peers, "act_quant_fp8", rows, dim),
                    copy,
                ));
            }
            let mut y = Tensor::empty(&dev, DType::BF16, &[rows, dim]).unwrap();
            let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, dim]).unwrap();
            let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, dim / 32]).unwrap();
            let us = time_us(&cuda, |i| {
                ops::rms_norm_act_quant_fp8_into(
                    &xs[i % xs.len()],
                    &w,
                    1e-20,
                    &mut y,
                    &mut q,
                    &mut s,
                )
                .unwrap()
            });
            let bytes = 2 * rows * dim + 2 * rows * dim + rows * dim + rows * dim / 32 + 2 * dim;
            records.push(record(
                "rms_norm_act_quant_fp8_tilelang",
                rows,
                dim,
                us,
                bytes,
                "2*rows*dim (x) + 2*rows*dim (y) + rows*dim (q) + rows*dim/32 (scales) + 2*dim (weight)",
                peer(&peers, "rms_norm_act_quant_fp8", rows, dim),
                copy,
            ));
        }
        let out = json!({
            "device": cuda.name().unwrap_or_default(),
            "driver": peers["driver"].clone(),
            "date": std::env::var("DEEPINFER_BENCH_DATE").unwrap_or_default(),
            "commit": std::env::var("DEEPINFER_COMMIT").unwrap_or_default(),
            "ceilings": { "copy_gbps": copy, "bf16_tflops": peers["ceilings"]["bf16_tflops"].clone(), "fp8_tflops": Value::Null },
            "records": records,
        });
        if let Ok(path) = std::env::var("DEEPINFER_BENCH_JSON") {
            std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
            println!("wrote {path}");
        }
        println!("copy ceiling: {copy:.0} GB/s (2 GiB device-to-device, read + write)");
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        op: &str,
        rows: usize,
        dim: usize,
        us: f64,
        bytes: usize,
        formula: &str,
        peers: Vec<Value>,
        copy: f64,
    ) -> Value {
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        let peer_us: Vec<String> = peers
            .iter()
            .map(|p| {
                format!(
                    "{}={:.2}",
                    p["name"].as_str().unwrap_or("?"),
                    p["us"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!(
            "{op:<32} {rows:>6} {dim:>6} {us:>10.2} {gbps:>9.0} {:>7.1}%  {}",
            100.0 * gbps / copy,
            peer_us.join(" ")
        );
        json!({
            "op": op, "shape": { "rows": rows, "dim": dim },
            "ours_us": us, "tflops": Value::Null, "gbps": gbps,
            "flop_formula": "memory-bound; not reported", "bytes_formula": formula,
            "pct_of_copy": 100.0 * gbps / copy, "peers": peers,
        })
    }
}

fn main() {
    // `cargo bench` passes --bench; a plain run may pass nothing.
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("slice_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
