//! GPU benchmark of the fused TileLang SwiGLU + FP8 1×32 quantiser (the W2
//! input of every expert) at V4.1's intermediate width, with the
//! copy-bandwidth ceiling measured in the same run. Writes the JSON of
//! shared/gpu.md to $DEEPINFER_BENCH_JSON (default: stdout only), merging
//! torch peer timings from $DEEPINFER_PEERS_JSON when given
//! (benches/peers/swiglu_torch.py writes them). Times are medians over
//! batches of launches, with the inputs rotated over ≥ 512 MiB so L2 holds
//! none of them. Same structure as benches/slice_gpu.rs.

#[cfg(deepinfer_cuda)]
mod gpu {
    use deepinfer::device::{CudaBuffer, CudaDevice};
    use deepinfer::ops;
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;
    use serde_json::{Value, json};

    const ROTATE_BYTES: usize = 512 << 20;
    const BATCH: usize = 20;
    const REPEATS: usize = 15;
    /// V4.1's expert intermediate width and SwiGLU limit.
    const INTER: usize = 2304;
    const LIMIT: f32 = 10.0;

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

    /// Rotating copies of (g, u, weight): g and u over [−12.5, 12.5] (so both
    /// clamps fire), weights in [0.25, 1.75].
    fn inputs(dev: &Device, rows: usize, inter: usize) -> Vec<(Tensor, Tensor, Tensor)> {
        let bytes = 4 * rows * inter + 4 * rows;
        let copies = ROTATE_BYTES.div_ceil(bytes).clamp(2, 256);
        let act = |c: usize, salt: usize| {
            let v: Vec<bf16> = (0..rows * inter)
                .map(|i| {
                    bf16::from_f32(((i * 7919 + c * 104729 + salt) % 2001) as f32 / 80.0 - 12.5)
                })
                .collect();
            Tensor::from_vec(v, &[rows, inter])
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
                (act(c, 0), act(c, 1013), w)
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
                eprintln!("swiglu_gpu: {e}; nothing to measure");
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
        println!(
            "{:<32} {:>6} {:>6} {:>10} {:>9} {:>8}  peers (us)",
            "op", "rows", "dim", "ours_us", "GB/s", "%copy"
        );
        for rows in [1usize, 64, 256, 4096, 16384] {
            let xs = inputs(&dev, rows, INTER);
            let mut q = Tensor::empty(&dev, DType::F8E4M3, &[rows, INTER]).unwrap();
            let mut s = Tensor::empty(&dev, DType::E8M0, &[rows, INTER / 32]).unwrap();
            let us = time_us(&cuda, |i| {
                let (g, u, w) = &xs[i % xs.len()];
                ops::swiglu_act_quant_fp8_into(g, u, w, LIMIT, &mut q, &mut s).unwrap()
            });
            let bytes = 2 * 2 * rows * INTER + rows * INTER + rows * INTER / 32 + 4 * rows;
            records.push(record(
                "swiglu_act_quant_fp8_tilelang",
                rows,
                INTER,
                us,
                bytes,
                "2*2*rows*dim (g, u) + rows*dim (q) + rows*dim/32 (scales) + 4*rows (weights)",
                peer(&peers, "swiglu_act_quant_fp8", rows, INTER),
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
    eprintln!("swiglu_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
