//! GPU benchmark of the TileLang RoPE kernel (`ops::rope_into` and
//! `ops::inverse_rope_into`) at V4.1's attention shape (64 heads × 512, the
//! last 64 dims rotating, θ = 160000 with YaRN), with the copy-bandwidth
//! ceiling measured in the same run. Writes the JSON of shared/gpu.md to
//! $DEEPINFER_BENCH_JSON (default: stdout only), merging torch peer timings
//! from $DEEPINFER_PEERS_JSON when given (benches/peers/rope_torch.py writes
//! them). Times are medians over batches of calls, with the inputs rotated
//! over ≥ 512 MiB so L2 holds none of them. A call includes what the op does
//! on the host: computing the layer's frequency table and uploading its
//! 32 fp32 values, and allocating nothing else (outputs are preallocated).

#[cfg(deepinfer_cuda)]
mod gpu {
    use deepinfer::cpu_backend::{RopeParams, Yarn};
    use deepinfer::device::{CudaBuffer, CudaDevice};
    use deepinfer::ops;
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;
    use serde_json::{Value, json};

    const ROTATE_BYTES: usize = 512 << 20;
    const BATCH: usize = 20;
    const REPEATS: usize = 15;
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

    /// Copies of one [tokens, 64, 512] input (≥ 512 MiB in all, at least 2)
    /// and of one positions vector, on the device.
    fn inputs(dev: &Device, tokens: usize) -> (Vec<Tensor>, Vec<Tensor>) {
        let n = tokens * HEADS * HEAD_DIM;
        let copies = ROTATE_BYTES.div_ceil(2 * n).clamp(2, 256);
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
                eprintln!("rope_gpu: {e}; nothing to measure");
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
        let dim = HEADS * HEAD_DIM;
        println!(
            "{:<24} {:>6} {:>6} {:>10} {:>9} {:>8}  peers (us)",
            "op", "rows", "dim", "ours_us", "GB/s", "%copy"
        );
        for tokens in [1usize, 64, 256, 4096, 16384] {
            let (xs, ps) = inputs(&dev, tokens);
            let mut out = Tensor::empty(&dev, DType::BF16, &[tokens, HEADS, HEAD_DIM]).unwrap();
            for (name, peer_op, inverse) in [
                ("inverse_rope_tilelang", "inverse_rope", true),
                ("rope_tilelang", "rope", false),
            ] {
                let us = time_us(&cuda, |i| {
                    let (x, p) = (&xs[i % xs.len()], &ps[i % ps.len()]);
                    if inverse {
                        ops::inverse_rope_into(x, p, HEADS, ROPE_DIM, &PARAMS, &mut out).unwrap()
                    } else {
                        ops::rope_into(x, p, HEADS, ROPE_DIM, &PARAMS, &mut out).unwrap()
                    }
                });
                let bytes = 2 * 2 * tokens * dim + 8 * tokens;
                records.push(record(
                    name,
                    tokens,
                    us,
                    bytes,
                    peer(&peers, peer_op, tokens, dim),
                    copy,
                ));
            }
        }
        let out = json!({
            "device": cuda.name().unwrap_or_default(),
            "driver": peers["driver"].clone(),
            "date": std::env::var("DEEPINFER_BENCH_DATE").unwrap_or_default(),
            "commit": std::env::var("DEEPINFER_COMMIT").unwrap_or_default(),
            "ceilings": { "copy_gbps": copy, "bf16_tflops": Value::Null, "fp8_tflops": Value::Null },
            "records": records,
        });
        if let Ok(path) = std::env::var("DEEPINFER_BENCH_JSON") {
            std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
            println!("wrote {path}");
        }
        println!("copy ceiling: {copy:.0} GB/s (2 GiB device-to-device, read + write)");
    }

    fn record(
        op: &str,
        tokens: usize,
        us: f64,
        bytes: usize,
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
            "{op:<24} {tokens:>6} {:>6} {us:>10.2} {gbps:>9.0} {:>7.1}%  {}",
            HEADS * HEAD_DIM,
            100.0 * gbps / copy,
            peer_us.join(" ")
        );
        json!({
            "op": op,
            "shape": { "rows": tokens, "heads": HEADS, "head_dim": HEAD_DIM, "rope_dim": ROPE_DIM },
            "ours_us": us, "tflops": Value::Null, "gbps": gbps,
            "flop_formula": "memory-bound; not reported",
            "bytes_formula": "2*2*T*H*hd (x read, out written) + 8*T (positions)",
            "pct_of_copy": 100.0 * gbps / copy, "peers": peers,
        })
    }
}

fn main() {
    // `cargo bench` passes --bench; a plain run may pass nothing.
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("rope_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
