//! The measuring harness shared by the GPU benches (`benches/*_gpu.rs`):
//! CUDA-event timing (median over batches of launches, after warm-up), the
//! copy-bandwidth ceiling measured in the same run, the rotation count that
//! keeps inputs out of L2, torch peers merged from $DEEPINFER_PEERS_JSON, and
//! the shared/gpu.md JSON written to $DEEPINFER_BENCH_JSON. Memory-bound ops
//! use [`Harness::record`]; GEMMs use [`Harness::record_gemm`] (TFLOP/s and
//! GB/s, peers measured in the bench itself plus the torch ones).

use deepinfer::Device;
use deepinfer::device::{CudaBuffer, CudaDevice};
use serde_json::{Value, json};

/// Inputs are rotated over at least this many bytes so L2 holds none of them.
pub const ROTATE_BYTES: usize = 512 << 20;
const BATCH: usize = 20;
const REPEATS: usize = 15;

/// One bench run on cuda:0.
pub struct Harness {
    pub cuda: CudaDevice,
    pub dev: Device,
    peers: Value,
    copy_gbps: f64,
    fp8_tflops: Value,
    records: Vec<Value>,
}

impl Harness {
    /// Opens cuda:0, reads the peers and measures the copy ceiling; `None`
    /// (after saying why) when there is no GPU.
    pub fn open(bench: &str) -> Option<Harness> {
        let cuda = match CudaDevice::new(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{bench}: {e}; nothing to measure");
                return None;
            }
        };
        let peers = std::env::var("DEEPINFER_PEERS_JSON")
            .ok()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let mut h = Harness {
            dev: Device::Cuda(cuda.clone()),
            cuda,
            peers,
            copy_gbps: 0.0,
            fp8_tflops: Value::Null,
            records: Vec::new(),
        };
        let bytes = 1usize << 31;
        let src = h.cuda.alloc(bytes).unwrap();
        let mut dst: CudaBuffer = h.cuda.alloc(bytes).unwrap();
        let us = h.time_us(|_| dst.copy_from(&src).unwrap());
        h.copy_gbps = 2.0 * bytes as f64 / (us * 1e-6) / 1e9;
        println!(
            "{:<34} {:<40} {:>10} {:>9} {:>8}  peers (us)",
            "op", "shape", "ours_us", "GB/s", "%copy"
        );
        Some(h)
    }

    /// Adds `key: value` to the last record (a measurement beside the
    /// time, e.g. the host's issue time of the same calls).
    #[allow(dead_code, reason = "only the GEMM bench records its host issue time")]
    pub fn annotate_last(&mut self, key: &str, value: Value) {
        if let Some(Value::Object(r)) = self.records.last_mut() {
            r.insert(key.into(), value);
        }
    }

    /// Host µs to issue one call of `f(i)`: the median over batches of the
    /// host clock around [`BATCH`] calls, with the device synchronised
    /// before each batch (so the launch queue never fills and blocks). When
    /// it is near [`Harness::time_us`], the host, not the GPU, set the time.
    #[allow(dead_code, reason = "only the GEMM bench records its host issue time")]
    pub fn host_issue_us(&self, mut f: impl FnMut(usize)) -> f64 {
        let mut samples = Vec::with_capacity(REPEATS);
        let mut i = 0;
        for _ in 0..REPEATS {
            self.cuda.synchronize().unwrap();
            let t = std::time::Instant::now();
            for _ in 0..BATCH {
                f(i);
                i += 1;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        }
        self.cuda.synchronize().unwrap();
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        samples[samples.len() / 2]
    }

    /// Median device µs per call of `f(i)` inside a CUDA graph: [`BATCH`]
    /// calls (i = 0..BATCH) captured once, then the graph replayed as
    /// [`Harness::time_us`] times a call, divided by [`BATCH`]. The figure
    /// for decode-sized calls, where a graph removes the host's launch cost
    /// and leaves the kernel's own. An op that cannot be captured (it
    /// synchronises or copies to the host) gives the capture's error.
    #[allow(dead_code, reason = "only the fused-op benches time graphs")]
    pub fn graph_us(&self, mut f: impl FnMut(usize)) -> deepinfer::Result<f64> {
        // SAFETY: the bench is single-threaded, so nothing else issues work
        // on the stream during the capture, and every tensor `f` touches is
        // borrowed by `f`, which outlives the graph (dropped at return).
        let graph = unsafe {
            self.cuda.capture(|| {
                for i in 0..BATCH {
                    f(i);
                }
                Ok(())
            })
        }?;
        Ok(self.time_us(|_| graph.launch().unwrap()) / BATCH as f64)
    }

    /// Times `f` inside a CUDA graph ([`Harness::graph_us`]) and records it
    /// as a twin of the last (memory-bound) record: op `<op>_graph`, the
    /// same shape and bytes, no torch peers (they run eagerly). Where the
    /// capture fails, the twin carries the error instead of a time.
    #[allow(dead_code, reason = "only the fused-op benches time graphs")]
    pub fn record_graph_twin(&mut self, f: impl FnMut(usize)) {
        let timed = self.graph_us(f);
        let Some(Value::Object(last)) = self.records.last() else {
            return;
        };
        let mut twin = last.clone();
        let op = format!("{}_graph", last["op"].as_str().unwrap_or("?"));
        let bytes =
            last["gbps"].as_f64().unwrap_or(0.0) * last["ours_us"].as_f64().unwrap_or(0.0) * 1e3;
        twin.insert("op".into(), json!(op));
        twin.insert("peers".into(), json!([]));
        twin.insert(
            "timing".into(),
            json!(format!("per call inside a CUDA graph of {BATCH} calls")),
        );
        match timed {
            Ok(us) => {
                let gbps = bytes / (us * 1e-6) / 1e9;
                let pct = 100.0 * gbps / self.copy_gbps;
                println!(
                    "{op:<34} {:<40} {us:>10.2} {gbps:>9.0} {pct:>7.1}%",
                    "(as above)"
                );
                twin.insert("ours_us".into(), json!(us));
                twin.insert("gbps".into(), json!(gbps));
                twin.insert("pct_of_copy".into(), json!(pct));
            }
            Err(e) => {
                println!("{op:<34} graph capture failed: {e}");
                for k in ["ours_us", "gbps", "pct_of_copy"] {
                    twin.insert(k.into(), Value::Null);
                }
                twin.insert("error".into(), json!(e.to_string()));
            }
        }
        self.records.push(Value::Object(twin));
    }

    /// How many rotating copies of an input of `bytes` to keep.
    pub fn copies(bytes: usize) -> usize {
        ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(2, 256)
    }

    /// Median µs per call of `f(i)` over batches of launches (i counts up).
    pub fn time_us(&self, mut f: impl FnMut(usize)) -> f64 {
        for i in 0..BATCH {
            f(i);
        }
        let stream = self.cuda.stream();
        let mut samples = Vec::with_capacity(REPEATS);
        let mut i = 0;
        for _ in 0..REPEATS {
            let (a, b) = (self.cuda.event().unwrap(), self.cuda.event().unwrap());
            a.record(&stream).unwrap();
            for _ in 0..BATCH {
                f(i);
                i += 1;
            }
            b.record(&stream).unwrap();
            samples.push(a.elapsed_ms(&b).unwrap() as f64 * 1e3 / BATCH as f64);
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        samples[samples.len() / 2]
    }

    /// The torch peers (name and µs) of the records `keep` selects.
    fn peers_where(&self, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.peers["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| keep(r))
            .map(|r| json!({ "name": r["name"], "us": r["us"] }))
            .collect()
    }

    /// Prints and keeps one memory-bound record: GB/s over `bytes`
    /// (described by `formula`) and its share of the copy ceiling.
    fn push_memory(
        &mut self,
        op: &str,
        shape: Value,
        peers: Vec<Value>,
        us: f64,
        (bytes, formula): (usize, &str),
    ) {
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        let pct = 100.0 * gbps / self.copy_gbps;
        let dims: Vec<String> = shape
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let shown: Vec<String> = peers
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
            "{op:<34} {:<40} {us:>10.2} {gbps:>9.0} {pct:>7.1}%  {}",
            dims.join(" "),
            shown.join(" ")
        );
        self.records.push(json!({
            "op": op, "shape": shape, "ours_us": us, "tflops": Value::Null, "gbps": gbps,
            "flop_formula": "memory-bound; not reported", "bytes_formula": formula,
            "pct_of_copy": pct, "peers": peers,
        }));
    }

    /// Records one measurement (memory-bound: GB/s over `bytes`, described by
    /// `formula`), with the peers the torch script reported for `peer_op`.
    #[allow(
        dead_code,
        clippy::too_many_arguments,
        reason = "the GEMM bench records with record_gemm only"
    )]
    pub fn record(
        &mut self,
        op: &str,
        peer_op: &str,
        rows: usize,
        dim: usize,
        us: f64,
        bytes: usize,
        formula: &str,
    ) {
        let peers =
            self.peers_where(|r| r["op"] == peer_op && r["rows"] == rows && r["dim"] == dim);
        let shape = json!({ "rows": rows, "dim": dim });
        self.push_memory(op, shape, peers, us, (bytes, formula));
    }

    /// Records one memory-bound measurement against a device-to-device copy
    /// of the same bytes measured in this run ([`Harness::copy_us`] of
    /// `bytes / 2`, which reads and writes `bytes`): GB/s over `bytes`
    /// (described by `formula`), the share of that copy's bandwidth and of
    /// the 2 GiB ceiling.
    #[allow(
        dead_code,
        clippy::too_many_arguments,
        reason = "only the cache-writer and GEMM benches compare with a same-bytes copy"
    )]
    pub fn record_vs_copy(
        &mut self,
        op: &str,
        shape: Value,
        us: f64,
        bytes: usize,
        formula: &str,
        copy_us: f64,
    ) {
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        let copy_gbps = bytes as f64 / (copy_us * 1e-6) / 1e9;
        let pct_same = 100.0 * gbps / copy_gbps;
        let pct = 100.0 * gbps / self.copy_gbps;
        let dims: Vec<String> = shape
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "{op:<22} {:<28} {us:>9.2} us {gbps:>6.0} GB/s  {pct_same:>5.1}% of the same-bytes copy ({copy_us:.2} us, {copy_gbps:.0} GB/s)  {pct:>5.1}% of the 2 GiB copy",
            dims.join(" ")
        );
        self.records.push(json!({
            "op": op, "shape": shape, "ours_us": us, "tflops": Value::Null, "gbps": gbps,
            "flop_formula": "memory-bound; not reported", "bytes_formula": formula,
            "pct_of_copy": pct, "pct_of_same_bytes_copy": pct_same,
            "peers": [ { "name": "cuda_memcpy_d2d_same_bytes", "us": copy_us, "gbps": copy_gbps } ],
        }));
    }

    /// Median µs of a device-to-device copy of `bytes` (bytes read + bytes
    /// written = 2 · `bytes`), rotating over buffers so L2 holds none.
    #[allow(
        dead_code,
        reason = "only the cache-writer and GEMM benches measure same-bytes copies"
    )]
    pub fn copy_us(&self, bytes: usize) -> f64 {
        let n = Self::copies(2 * bytes);
        let src: Vec<CudaBuffer> = (0..n).map(|_| self.cuda.alloc(bytes).unwrap()).collect();
        let mut dst: Vec<CudaBuffer> = (0..n).map(|_| self.cuda.alloc(bytes).unwrap()).collect();
        self.time_us(|i| dst[i % n].copy_from(&src[i % n]).unwrap())
    }

    /// Records one GEMM (or grouped GEMM) measurement: `us` or the error
    /// that prevented it, TFLOP/s over `flops` (2·M·N·K summed over groups),
    /// GB/s over `bytes` (described by `bytes_formula`), the peers measured
    /// by the bench itself (`{name, us}` or `{name, error}`) and the torch
    /// peers reported for `peer_op` with an equal `shape` object.
    #[allow(
        dead_code,
        clippy::too_many_arguments,
        reason = "only the GEMM bench records compute-bound shapes"
    )]
    pub fn record_gemm(
        &mut self,
        op: &str,
        peer_op: &str,
        shape: Value,
        us: Result<f64, String>,
        flops: f64,
        bytes: usize,
        bytes_formula: &str,
        mut peers: Vec<Value>,
    ) {
        peers.extend(
            self.peers["records"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["op"] == peer_op && r["shape"] == shape)
                .map(|r| json!({ "name": r["name"], "us": r["us"], "error": r["error"] })),
        );
        let shown: Vec<String> = peers
            .iter()
            .map(|p| match p["us"].as_f64() {
                Some(us) => format!("{}={us:.1}", p["name"].as_str().unwrap_or("?")),
                None => format!("{}=err", p["name"].as_str().unwrap_or("?")),
            })
            .collect();
        let dims: Vec<String> = shape
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let record = match &us {
            Ok(us) => {
                let tflops = flops / (us * 1e-6) / 1e12;
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                let pct = 100.0 * gbps / self.copy_gbps;
                println!(
                    "{op:<34} {:<34} {us:>10.2} {tflops:>8.1} {gbps:>9.0} {pct:>7.1}%  {}",
                    dims.join(" "),
                    shown.join(" ")
                );
                json!({
                    "op": op, "shape": shape, "ours_us": us, "tflops": tflops, "gbps": gbps,
                    "flop_formula": "2*m*n*k (summed over groups)", "bytes_formula": bytes_formula,
                    "pct_of_copy": pct, "peers": peers,
                })
            }
            Err(e) => {
                println!(
                    "{op:<34} {:<34} error: {e}  {}",
                    dims.join(" "),
                    shown.join(" ")
                );
                json!({
                    "op": op, "shape": shape, "ours_us": Value::Null, "error": e,
                    "tflops": Value::Null, "gbps": Value::Null,
                    "flop_formula": "2*m*n*k (summed over groups)", "bytes_formula": bytes_formula,
                    "peers": peers,
                })
            }
        };
        self.records.push(record);
    }

    /// Records one memory-bound measurement of a named `shape` (a JSON
    /// object), with the torch peers reported for `peer_op` with an equal
    /// `shape`.
    #[allow(dead_code, reason = "only the EP bench records named shapes")]
    pub fn record_shaped(
        &mut self,
        op: &str,
        peer_op: &str,
        shape: Value,
        us: f64,
        bytes: usize,
        formula: &str,
    ) {
        let peers = self.peers_where(|r| r["op"] == peer_op && r["shape"] == shape);
        self.push_memory(op, shape, peers, us, (bytes, formula));
    }

    /// Sets the FP8 tensor ceiling measured in this run (TFLOP/s).
    #[allow(dead_code, reason = "only the GEMM bench measures the FP8 ceiling")]
    pub fn set_fp8_ceiling(&mut self, tflops: f64) {
        self.fp8_tflops = json!(tflops);
    }

    /// The copy ceiling measured when the harness opened (GB/s, bytes read
    /// + written).
    #[allow(dead_code, reason = "only the model bench reads the ceilings back")]
    pub fn copy_gbps(&self) -> f64 {
        self.copy_gbps
    }

    /// Keeps a record built by the bench itself (printed by the bench).
    #[allow(dead_code, reason = "only the model bench builds its own records")]
    pub fn push(&mut self, record: Value) {
        self.records.push(record);
    }

    /// Writes the JSON of the records so far (when $DEEPINFER_BENCH_JSON
    /// names a file), so a run stopped by its time limit keeps them.
    #[allow(dead_code, reason = "only the model bench writes as it goes")]
    pub fn write_partial(&self) {
        if let Ok(path) = std::env::var("DEEPINFER_BENCH_JSON") {
            std::fs::write(&path, serde_json::to_string_pretty(&self.json()).unwrap()).unwrap();
        }
    }

    fn json(&self) -> Value {
        json!({
            "device": self.cuda.name().unwrap_or_default(),
            "driver": self.peers["driver"].clone(),
            "date": std::env::var("DEEPINFER_BENCH_DATE").unwrap_or_default(),
            "commit": std::env::var("DEEPINFER_COMMIT").unwrap_or_default(),
            // The host threads the library sizes its parallel host work by
            // (the process's CPU quota): host-side costs depend on it.
            "host_threads": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "ceilings": {
                "copy_gbps": self.copy_gbps,
                "bf16_tflops": self.peers["ceilings"]["bf16_tflops"].clone(),
                "fp8_tflops": self.fp8_tflops,
            },
            "records": self.records,
        })
    }

    /// Writes the JSON (when $DEEPINFER_BENCH_JSON names a file) and the ceiling line.
    pub fn finish(self) {
        if let Ok(path) = std::env::var("DEEPINFER_BENCH_JSON") {
            std::fs::write(&path, serde_json::to_string_pretty(&self.json()).unwrap()).unwrap();
            println!("wrote {path}");
        }
        println!(
            "copy ceiling: {:.0} GB/s (2 GiB device-to-device, read + write)",
            self.copy_gbps
        );
    }
}
