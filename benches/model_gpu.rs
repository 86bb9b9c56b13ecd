//! GPU benchmark of the whole V4.1-Flash forward as one GPU's share of an
//! expert-parallel deployment (issue 11): the model of one EP rank
//! (`ModelConfig::ep_rank`: every official dimension and the 43-layer
//! schedule, 384 / EP routed experts per layer, routing over those) with the
//! generator's random weights generated on cuda:0 (`load::random_weights_with`,
//! `ops::random_param`: no checkpoint file, no host bytes but the few
//! converted tensors, no drafter), for EP ∈
//! {64, 16, 8} (smallest first, so a short budget still measures some).
//!
//! - `v41_decode_step` (shape `{ep, batch, context}`): one decode token for
//!   each of `batch` ∈ {1, 8, 64, 256} sequences at `context` ∈ {8K, 32K,
//!   128K}. Contexts are seeded, not prefilled: each sequence's pages are
//!   claimed as a prefill would leave them (`StatePool::seed_context`) and
//!   every cache row holds random rows of the right format, encoded by
//!   `kv_format::encode_row` (`StatePool::fill_rows`). Mode `eager` (every
//!   op launched from the host) or `graph` (DEEPINFER_BENCH_GRAPH=1: the
//!   device half replayed from a CUDA graph, `Model::decode_graphed`):
//!   `ours_us` is the median wall time of a step including its host work
//!   (3 untimed steps first, then up to 20 timed; `wall_min_us` and
//!   `wall_max_us` give the spread), `gpu_us` the CUDA-event time of the
//!   same steps.
//! - `v41_prefill` (shape `{ep, tokens}`): one prompt of 4K or 32K tokens,
//!   fed in steps of at most 8K tokens; `ours_us` is the wall time of the
//!   whole prompt.
//!
//! Each record has `roofline_us` = max(bytes / copy ceiling, FP8 FLOPs /
//! FP8 ceiling), both ceilings measured in this run (a 2 GiB device copy
//! and cuBLASLt FP8 at 8192³), `roofline_frac` = roofline_us / ours_us, the
//! per-GPU tokens/s, and the op-family breakdown of one step from CUDA
//! events (`Capture::timing`: embed, engram, mhc, attention, moe, head);
//! decode records also hold `parts_us`, the attention and MoE parts
//! (`StepOutput::parts`) as [device µs, host µs]: a part whose host time
//! is near its device time kept the GPU waiting for the host.
//! Bytes that must move: the dense weights the step reads (every backbone
//! weight but the routed experts, the embedding and the Engram tables, with
//! `wo_a` as the BF16 it is loaded as), the routed experts the step's
//! routing touched (counted from its captured routing), and per token the
//! KV rows read (window rows, selected compressed rows, and the index keys
//! its indexers score), its embedding row and Engram rows. FLOPs: 2 × the
//! linear parameters a token uses (dense, head, its k experts) plus the
//! attention (QK and PV over the rows read) and the indexer scores, all
//! counted at the FP8 ceiling (the BF16 `wo_a` and fp32 head are faster to
//! reach there than they run). Records `bytes` and `flops` beside them.
//!
//! A point whose state pool does not fit `min(free − headroom)` is
//! recorded as skipped with the bytes it needs (`model::pool::PoolMemory`);
//! a point the wall-time budget (DEEPINFER_BENCH_BUDGET_S, default 400 s)
//! has no room for is recorded as skipped for the budget. The JSON is
//! rewritten after every point. DEEPINFER_BENCH_QUICK=1: EP 64, batch 1
//! and 8, context 8K, prefill 4K. DEEPINFER_BENCH_ONLY=<prefix> keeps the
//! points whose op starts with it (`v41_decode_step` for a profile of the
//! decode steps alone). DEEPINFER_BATCH_INVARIANT=1 builds the model on a
//! batch-invariant handle (mode `eager-invariant`): the mode's cost is its
//! time over a plain run's at the same point. DEEPINFER_MOE_LAYOUT =
//! `masked` | `contiguous` | `auto` picks the routed experts' layout
//! (`Model::moe_layout`; decode records name the one that ran as
//! `moe_layout`). DEEPINFER_BENCH_ENGRAM=host keeps the Engram tables in
//! host memory (records carry `engram_tables`); DEEPINFER_MHC_FUSION=1 runs
//! each mHC expand fused with the next front half (`mhc_fusion`).
//! DEEPINFER_PDL=0 launches every kernel plainly (no programmatic dependent
//! launch; records carry `pdl`, and graph records the captured graph's
//! kernel nodes and programmatic edges). DEEPINFER_BENCH_PROFILE=1
//! runs each decode point's first step after the warm-up as the CUDA
//! profiler's range (`CudaDevice::profiled`) and times nothing: under `ncu
//! --profile-from-start off` it gives every kernel of one step
//! (`benches/tools/kernel_times.py` sums them by kernel: the step's device
//! busy time, free of host launch gaps).
//!
//! Run on the H200 at the QUICK points since 2026-12-02
//! (`benches/results/2026-12-0*-h200-model*.json`), and the full sweep in
//! mode `graph` on 2026-12-04 (`…-model-sweep-graph.json`, tabled in
//! `docs/wide-ep.md`).

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::contract::KvRowFormat;
    use deepinfer::cuda_backend::blas::Fp8TensorwisePlan;
    use deepinfer::kv_format::encode_row;
    use deepinfer::model::checkpoint::{Manifest, Role};
    use deepinfer::model::config::{ModelConfig, V41_FLASH_CONFIG};
    use deepinfer::model::forward::{Capture, Model, MoeLayout, SeqInput, StepOutput};
    use deepinfer::model::layers::engram::EngramPlacement;
    use deepinfer::model::load::{WeightOptions, random_weights_with};
    use deepinfer::model::pool::{PoolConfig, PoolMemory, StatePool, step_headroom};
    use deepinfer::{DType, Device, Tensor};
    use half::bf16;
    use serde_json::{Value, json};
    use std::time::{Duration, Instant};

    const SEED: u64 = 0x0041_f1a5;
    /// Pool page rows: larger than the engine's 64, so that gathering a
    /// sequence's index keys (one copy per page) does not dominate.
    const PAGE_ROWS: usize = 256;
    const PREFILL_CHUNK: usize = 8192;
    /// Distinct random rows of each cache format, repeated over the pools.
    const PATTERN_ROWS: usize = 8192;
    /// `eager`, `graph`, or `eager-invariant` with DEEPINFER_BATCH_INVARIANT=1: the
    /// weights on a batch-invariant handle, so every op picks only
    /// batch-invariant kernels (the cost of the mode, beside a plain run).
    fn mode() -> &'static str {
        match (invariant(), graphed()) {
            (true, _) => "eager-invariant",
            (false, true) => "graph",
            (false, false) => "eager",
        }
    }

    /// DEEPINFER_BENCH_GRAPH=1: the decode steps replay a CUDA graph of the
    /// device half (`Model::decode_graphed`; mode `graph`), captured again
    /// whenever the step's upload signature changes. The one timing step
    /// (op families, routing) stays eager.
    fn graphed() -> bool {
        std::env::var("DEEPINFER_BENCH_GRAPH").is_ok_and(|v| v == "1")
    }

    /// DEEPINFER_MOE_LAYOUT = `masked` | `contiguous` | `auto` (the
    /// default): the routed experts' layout, recorded as `moe_layout`.
    fn moe_layout() -> MoeLayout {
        match std::env::var("DEEPINFER_MOE_LAYOUT").as_deref() {
            Ok("masked") => MoeLayout::Masked,
            Ok("contiguous") => MoeLayout::Contiguous,
            _ => MoeLayout::Auto,
        }
    }

    fn invariant() -> bool {
        std::env::var("DEEPINFER_BATCH_INVARIANT").is_ok_and(|v| v == "1")
    }

    /// DEEPINFER_BENCH_ENGRAM=host: the Engram tables stay in host memory
    /// (`EngramPlacement::Host`: each step's host half gathers and uploads
    /// its rows), recorded as `engram_tables`.
    fn engram_tables() -> EngramPlacement {
        match std::env::var("DEEPINFER_BENCH_ENGRAM").as_deref() {
            Ok("host") => EngramPlacement::Host,
            Ok("device") | Err(_) => EngramPlacement::Device,
            Ok(other) => panic!("DEEPINFER_BENCH_ENGRAM={other}: device or host"),
        }
    }

    /// DEEPINFER_MHC_FUSION=1: each mHC expand runs fused with the next
    /// front half (`Model::mhc_fusion` on; the same bits), recorded as
    /// `mhc_fusion`: the fused step's gain or loss at model level.
    fn mhc_fusion() -> bool {
        std::env::var("DEEPINFER_MHC_FUSION").is_ok_and(|v| v == "1")
    }
    /// DEEPINFER_PDL=0: kernels launch without programmatic dependent
    /// launch (`CudaDevice::with_pdl`), recorded as `pdl`: its gain.
    fn pdl() -> bool {
        std::env::var("DEEPINFER_PDL").map_or(true, |v| v != "0")
    }

    /// Time the timed decode steps of a point aim at (at least one, at most
    /// `MAX_STEPS`).
    const STEP_TIME_S: f64 = 2.0;
    /// Untimed decode steps before the timed ones.
    const WARM_STEPS: usize = 3;
    /// At most this many timed decode steps (the median is reported, with
    /// the fastest and slowest).
    const MAX_STEPS: usize = 20;

    struct Sweep {
        eps: &'static [usize],
        batches: &'static [usize],
        contexts: &'static [usize],
        prefill: &'static [usize],
    }

    fn sweep() -> Sweep {
        if std::env::var("DEEPINFER_BENCH_QUICK").is_ok_and(|v| v == "1") {
            Sweep {
                eps: &[64],
                batches: &[1, 8],
                contexts: &[8192],
                prefill: &[4096],
            }
        } else {
            Sweep {
                eps: &[64, 16, 8],
                batches: &[1, 8, 64, 256],
                contexts: &[8192, 32768, 131072],
                prefill: &[4096, 32768],
            }
        }
    }

    /// The wall-time budget of the whole run.
    struct Budget {
        start: Instant,
        limit: Duration,
    }

    impl Budget {
        fn from_env() -> Budget {
            let s = std::env::var("DEEPINFER_BENCH_BUDGET_S")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(400.0);
            Budget {
                start: Instant::now(),
                limit: Duration::from_secs_f64(s),
            }
        }

        fn left_s(&self) -> f64 {
            self.limit.as_secs_f64() - self.start.elapsed().as_secs_f64()
        }
    }

    /// What a token and a step of one EP rank's model cost, from its
    /// manifest and config (module doc).
    struct Costs {
        /// Dense weight bytes a step reads once.
        dense_bytes: f64,
        /// Linear parameters a token uses besides its routed experts.
        dense_params: f64,
        /// Bytes and parameters of one routed expert (w1, w2, w3).
        expert_bytes: f64,
        expert_params: f64,
        /// Embedding row and Engram rows a token reads.
        token_bytes: f64,
        weight_bytes: f64,
    }

    impl Costs {
        fn of(cfg: &ModelConfig) -> Costs {
            let m = Manifest::new(cfg).unwrap();
            let (mut dense_bytes, mut dense_params, mut weight_bytes) = (0.0, 0.0, 0.0);
            let mut expert_bytes = 0.0;
            for p in m.params() {
                if p.name.starts_with("mtp.") {
                    continue;
                }
                let numel = p.shape.iter().product::<usize>() as f64;
                let mut bytes: f64 = p.tensors().iter().map(|t| t.bytes() as f64).sum();
                if p.name.ends_with("attn.wo_a.weight") {
                    bytes = 2.0 * numel; // loaded as BF16, no scale
                }
                weight_bytes += bytes;
                if p.name.contains(".ffn.experts.") {
                    if p.name.starts_with("layers.0.ffn.experts.0.") {
                        expert_bytes += bytes;
                    }
                    continue;
                }
                if matches!(p.role, Role::Linear { .. } | Role::HcFn { .. }) {
                    dense_params += numel;
                }
                if p.name == "embed.weight" || p.name.contains("engram.embed") {
                    continue;
                }
                dense_bytes += bytes;
            }
            let (d, e) = (cfg.hidden_size, &cfg.engram);
            let table_row = (e.head_dim + e.head_dim / 32) as f64;
            let lookups = (e.layer_ids.len() * e.columns()) as f64;
            Costs {
                dense_bytes,
                dense_params,
                expert_bytes,
                expert_params: (3 * cfg.moe.inter_dim * d) as f64,
                token_bytes: (2 * d) as f64 + lookups * table_row,
                weight_bytes,
            }
        }
    }

    /// KV bytes read and attention + indexer FLOPs of one token at
    /// position `p` (its own row included), over the backbone layers.
    fn attention_cost(model: &Model, p: usize) -> (f64, f64) {
        let cfg = &model.cfg;
        let (a, ic) = (cfg.attention, cfg.indexer);
        let window_row = deepinfer::kv_format::window_row_bytes(a.head_dim) as f64;
        let comp_row = deepinfer::kv_format::compressed_row_bytes(a.head_dim) as f64;
        let key_row = deepinfer::kv_format::index_key_row_bytes(ic.head_dim) as f64;
        let per_row_flops = (4 * a.n_heads * a.head_dim) as f64;
        let pool = cfg
            .candidate
            .map_or(usize::MAX, |c| c.topk_blocks * c.block_size);
        let (mut bytes, mut flops) = (0.0, 0.0);
        for plan in model.plans.iter().take(cfg.n_layers) {
            let w = a.window.min(p + 1) as f64;
            bytes += w * window_row;
            flops += w * per_row_flops;
            if plan.ratio == 0 {
                continue;
            }
            let visible = (p + 1) / plan.ratio;
            let k = ic.topk.min(visible) as f64;
            bytes += k * comp_row;
            flops += k * per_row_flops;
            if plan.is_index_source() {
                let keys = if plan.candidates_from().is_some() {
                    visible.min(pool)
                } else {
                    visible
                } as f64;
                bytes += keys * key_row;
                flops += keys * (2 * ic.n_heads * ic.head_dim) as f64;
            }
        }
        (bytes, flops)
    }

    /// Routed experts the step's captured routing touched, summed over
    /// the layers.
    fn touched_experts(out: &StepOutput) -> usize {
        out.layers
            .iter()
            .filter_map(|l| l.routing.as_ref())
            .map(|r| {
                let mut ids = r.to_vec::<i32>().unwrap();
                ids.sort_unstable();
                ids.dedup();
                ids.len()
            })
            .sum()
    }

    struct Ceilings {
        copy_gbps: f64,
        fp8_tflops: f64,
    }

    /// The roofline fields of a record: bytes, FLOPs, the time each needs
    /// at its ceiling, and the larger.
    fn roofline(c: &Ceilings, bytes: f64, flops: f64) -> (f64, Value) {
        let bytes_us = bytes / (c.copy_gbps * 1e3);
        let flops_us = flops / (c.fp8_tflops * 1e6);
        let us = bytes_us.max(flops_us);
        (
            us,
            json!({ "bytes": bytes, "flops": flops, "bytes_us": bytes_us, "flops_us": flops_us }),
        )
    }

    /// Random rows of each cache format (window, compressed, index key).
    fn patterns(h: &Harness, cfg: &ModelConfig) -> (Tensor, Tensor, Tensor) {
        let mut s = SEED | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Roughly unit values: sums of two bytes, centred.
            let v = ((s & 0xff) as f32 + ((s >> 8) & 0xff) as f32 - 255.0) / 128.0;
            bf16::from_f32(v)
        };
        let mut rows = |format, dim: usize| {
            let mut bytes = Vec::new();
            for _ in 0..PATTERN_ROWS {
                let row: Vec<bf16> = (0..dim).map(|_| next()).collect();
                bytes.extend(encode_row(format, &row));
            }
            bytes
        };
        let (hd, ihd) = (cfg.attention.head_dim, cfg.indexer.head_dim);
        let w = rows(KvRowFormat::Window, hd);
        let c = rows(KvRowFormat::Compressed, hd);
        let k = rows(KvRowFormat::IndexKey, ihd);
        let t = |dtype, width: usize, bytes: &[u8]| {
            Tensor::from_le_bytes(&h.dev, dtype, &[PATTERN_ROWS, width], bytes).unwrap()
        };
        (
            t(DType::U8, w.len() / PATTERN_ROWS, &w),
            t(DType::U8, c.len() / PATTERN_ROWS, &c),
            t(DType::F4E2M1x2, 2 * k.len() / PATTERN_ROWS, &k),
        )
    }

    /// A skipped point's record: why, and the pool bytes needed when the
    /// pool does not fit.
    fn skipped(op: &str, shape: Value, why: String, need: Option<(usize, usize)>) -> Value {
        println!("{op:<16} {shape} skipped: {why}");
        json!({
            "op": op, "shape": shape, "mode": mode(), "ours_us": Value::Null, "skipped": why,
            "bytes_needed": need.map(|n| n.0), "bytes_available": need.map(|n| n.1),
        })
    }

    /// A state pool for `seqs` sequences of `context` tokens in steps of
    /// `chunk`, or the skip record's reason and sizes.
    fn pool_for(
        h: &Harness,
        model: &Model,
        seqs: usize,
        context: usize,
        chunk: usize,
    ) -> Result<StatePool, (String, Option<(usize, usize)>)> {
        let cfg = &model.cfg;
        let headroom = step_headroom(&h.dev, cfg, seqs * chunk);
        let memory =
            PoolMemory::query(&h.dev, 0, headroom, None).map_err(|e| (e.to_string(), None))?;
        let pc =
            PoolConfig::within(cfg, &memory, seqs, context, chunk, PAGE_ROWS).map_err(|e| {
                let need = match e.op() {
                    Some(deepinfer::Error::OutOfMemory {
                        bytes, available, ..
                    }) => Some((*bytes, *available)),
                    _ => None,
                };
                (format!("the state pool does not fit: {e}"), need)
            })?;
        StatePool::new(cfg, &h.dev, pc).map_err(|e| (e.to_string(), None))
    }

    fn families(out: &StepOutput) -> Value {
        Value::Object(
            out.families
                .iter()
                .map(|(f, ms)| (f.to_string(), json!(ms * 1e3)))
                .collect(),
        )
    }

    /// Each part's [device µs, host µs] (`StepOutput::parts`).
    fn parts(out: &StepOutput) -> Value {
        Value::Object(
            out.parts
                .iter()
                .map(|(p, t)| (p.to_string(), json!([t.device_ms * 1e3, t.host_ms * 1e3])))
                .collect(),
        )
    }

    /// One decode point (module doc): its record, or a skip record.
    #[allow(clippy::too_many_arguments)]
    fn decode_point(
        h: &Harness,
        model: &Model,
        costs: &Costs,
        ceilings: &Ceilings,
        patterns: &(Tensor, Tensor, Tensor),
        ep: usize,
        batch: usize,
        context: usize,
    ) -> Value {
        let op = "v41_decode_step";
        let shape = json!({ "ep": ep, "batch": batch, "context": context });
        // Positions for the warm-up, timed, timing and the two pipelining
        // runs' steps ([`pipelining`]).
        let extra = WARM_STEPS + 3 * MAX_STEPS + 8;
        let mut pool = match pool_for(h, model, batch, context + extra, 1) {
            Ok(p) => p,
            Err((why, need)) => return skipped(op, shape, why, need),
        };
        let vocab = model.cfg.vocab_size as u32;
        let map = &model.weights.engram_token_map;
        let history: Vec<Option<i64>> = (0..3u32)
            .map(|t| map.get(t as usize + 3).copied())
            .collect();
        let mut seqs = Vec::with_capacity(batch);
        for _ in 0..batch {
            let seq = pool.add_sequence().unwrap();
            if let Err(e) = pool.seed_context(seq, context, &history) {
                return skipped(op, shape, format!("seeding the context: {e}"), None);
            }
            seqs.push(seq);
        }
        let (w, c, k) = patterns;
        pool.fill_rows(w, c, k).unwrap();
        let mut step_no = 0u32;
        let mut graph = deepinfer::model::graph::DecodeGraph::new();
        let mut step = |pool: &mut StatePool, capture: Capture| {
            step_no += 1;
            let tokens: Vec<[u32; 1]> = (0..batch as u32)
                .map(|i| [(i * 7919 + step_no * 104_729) % vocab])
                .collect();
            let inputs: Vec<SeqInput> = seqs
                .iter()
                .zip(&tokens)
                .map(|(&seq, t)| SeqInput { seq, tokens: t })
                .collect();
            let out = if graphed() && !capture.timing {
                model.decode_graphed(pool, &inputs, &mut graph)
            } else {
                model.step(pool, &inputs, capture)
            };
            h.cuda.synchronize().unwrap();
            out
        };
        // The first steps allocate (pool pages, scratch): WARM_STEPS untimed.
        let mut warm_s = 0.0;
        for _ in 0..WARM_STEPS {
            let t0 = Instant::now();
            if let Err(e) = step(&mut pool, Capture::default()) {
                return skipped(op, shape, format!("a warm-up step failed: {e}"), None);
            }
            warm_s = t0.elapsed().as_secs_f64();
        }
        if std::env::var("DEEPINFER_BENCH_PROFILE").is_ok_and(|v| v == "1") {
            // One step as the profiled range (for `ncu --profile-from-start
            // off`), then no timed steps: ncu's serialised kernels would
            // distort them.
            let why = match h.cuda.profiled(|| step(&mut pool, Capture::default())) {
                Ok(Ok(_)) => "profiled: one step under the profiler".to_string(),
                Ok(Err(e)) => format!("the profiled step failed: {e}"),
                Err(e) => format!("the profiler range failed: {e}"),
            };
            return skipped(op, shape, why, None);
        }
        let n = ((STEP_TIME_S / warm_s.max(1e-6)) as usize).clamp(1, MAX_STEPS);
        let stream = h.cuda.stream();
        let (mut wall, mut gpu) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (a, b) = (h.cuda.event().unwrap(), h.cuda.event().unwrap());
            let t = Instant::now();
            a.record(&stream).unwrap();
            if let Err(e) = step(&mut pool, Capture::default()) {
                return skipped(op, shape, format!("a timed step failed: {e}"), None);
            }
            b.record(&stream).unwrap();
            wall.push(t.elapsed().as_secs_f64() * 1e6);
            gpu.push(f64::from(a.elapsed_ms(&b).unwrap()) * 1e3);
        }
        let capture = Capture {
            timing: true,
            routing: true,
            ..Capture::default()
        };
        let timed = match step(&mut pool, capture) {
            Ok(out) => out,
            Err(e) => return skipped(op, shape, format!("the timing step failed: {e}"), None),
        };
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ours_us, gpu_us) = (median(&mut wall), median(&mut gpu));
        // Sorted by `median`: the spread of the host-bound eager step.
        let (wall_min, wall_max) = (wall[0], wall[wall.len() - 1]);
        let pipe = if graphed() {
            match pipelining(h, model, &mut pool, &mut graph, &seqs, n) {
                Ok(v) => v,
                Err(e) => json!({ "error": e.to_string() }),
            }
        } else {
            Value::Null
        };
        let touched = touched_experts(&timed);
        let (kv, attn_flops) = attention_cost(model, context);
        let b = batch as f64;
        let bytes =
            costs.dense_bytes + touched as f64 * costs.expert_bytes + b * (kv + costs.token_bytes);
        let k = model.cfg.moe.n_activated_experts as f64;
        let flops = b * (2.0 * costs.dense_params + 2.0 * k * costs.expert_params + attn_flops);
        let (roof_us, detail) = roofline(ceilings, bytes, flops);
        let tps = b / (ours_us * 1e-6);
        println!(
            "{op:<16} ep={ep:<3} batch={batch:<4} context={context:<7} {ours_us:>11.0} us (gpu {gpu_us:.0}, {n} steps {wall_min:.0}..{wall_max:.0}, {:?}) roofline {roof_us:>9.0} us ({:>5.1}%) {tps:>9.0} tok/s/GPU  {:?}",
            graph.stats,
            100.0 * roof_us / ours_us,
            timed.families
        );
        println!("  parts [device us, host us]: {}", parts(&timed));
        json!({
            "op": op, "shape": shape, "mode": mode(), "engram_tables": format!("{:?}", engram_tables()), "mhc_fusion": mhc_fusion(), "pdl": model.device().pdl(), "graph_kernels": graph.stats.graph.kernels, "graph_memsets": graph.stats.graph.memsets, "graph_copies": graph.stats.graph.copies, "graph_allocs": graph.stats.graph.allocs, "graph_frees": graph.stats.graph.frees, "graph_other_nodes": graph.stats.graph.other, "graph_arena_bytes": graph.stats.arena_bytes, "graph_arena_spills": graph.stats.arena_spills, "graph_kernel_edges": graph.stats.graph.kernel_edges, "graph_programmatic_edges": graph.stats.graph.programmatic_edges, "moe_layout": format!("{:?}", moe_layout().resolve(batch, model.cfg.moe.n_routed_experts, model.cfg.moe.n_activated_experts, &model.device())),
            "ours_us": ours_us, "gpu_us": gpu_us,
            "wall_min_us": wall_min, "wall_max_us": wall_max,
            "steps_timed": n, "steps_warm": WARM_STEPS, "graph_steps": format!("{:?}", graph.stats),
            "host_half_us": graph.stats.host.as_secs_f64() * 1e6 / (graph.stats.eager + graph.stats.refused + graph.stats.captured + graph.stats.replayed).max(1) as f64,
            "replay_device_us": graph.stats.replay_device.as_secs_f64() * 1e6 / graph.stats.replayed.max(1) as f64, "roofline_us": roof_us, "roofline_frac": roof_us / ours_us,
            "roofline": detail, "tokens_per_s_per_gpu": tps, "touched_experts": touched,
            "pipelining": pipe,
            "families_us": families(&timed), "parts_us": parts(&timed), "page_rows": PAGE_ROWS,
            "bytes_formula": "dense weights (wo_a as BF16) + touched experts x expert bytes + batch x (window/compressed/index-key rows read + embedding row + Engram rows)",
            "flop_formula": "batch x (2 x (dense linear params + k x expert params) + 4 H hd x attended rows + 2 ih ihd x scored keys)",
        })
    }

    /// `n` graphed decode steps of `seqs` run twice after the timed ones:
    /// serially (`Model::decode_graphed`: the host half of a step starts
    /// once the previous step's device half is done) and pipelined (the
    /// host half of step N+1, `Model::decode_prepare`, while step N runs:
    /// launch, advance, prepare the next, wait), each as its wall time per
    /// step and the device's idle time between steps (CUDA events, the
    /// graph's statistics) as a share of the device's time. The tokens are
    /// fixed in advance (a bench: no sampling between the steps).
    fn pipelining(
        h: &Harness,
        model: &Model,
        pool: &mut StatePool,
        graph: &mut deepinfer::model::graph::DecodeGraph,
        seqs: &[deepinfer::model::pool::SeqId],
        n: usize,
    ) -> deepinfer::model::error::Result<Value> {
        let vocab = model.cfg.vocab_size as u32;
        let tokens = |k: usize| -> Vec<[u32; 1]> {
            (0..seqs.len() as u32)
                .map(|i| [(i * 7919 + k as u32 * 15_485_863) % vocab])
                .collect()
        };
        fn inputs<'a>(
            seqs: &[deepinfer::model::pool::SeqId],
            t: &'a [[u32; 1]],
        ) -> Vec<SeqInput<'a>> {
            seqs.iter()
                .zip(t)
                .map(|(&seq, t)| SeqInput { seq, tokens: t })
                .collect()
        }
        let share = |s: &deepinfer::model::graph::GraphStats| {
            let (idle, busy) = (s.idle.as_secs_f64(), s.device.as_secs_f64());
            idle / (idle + busy).max(1e-12)
        };
        h.cuda.synchronize().unwrap();
        graph.restart_stats();
        let t = Instant::now();
        for k in 0..n {
            let tk = tokens(k);
            model.decode_graphed(pool, &inputs(seqs, &tk), graph)?;
        }
        let serial_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let serial = graph.stats;
        graph.restart_stats();
        let t = Instant::now();
        let mut launched = None;
        for k in 0..n {
            let tk = tokens(n + k);
            let prep = model.decode_prepare(pool, &inputs(seqs, &tk), graph)?;
            if let Some(l) = launched.take() {
                model.decode_wait(pool, l, graph)?;
            }
            let mut l = model.decode_launch(pool, prep, graph)?;
            model.decode_advance(pool, &mut l, graph)?;
            launched = Some(l);
        }
        if let Some(l) = launched {
            model.decode_wait(pool, l, graph)?;
        }
        let pipelined_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let piped = graph.stats;
        println!(
            "  pipelining: serial {serial_us:.0} us/step, device idle {:.1} %; pipelined {pipelined_us:.0} us/step, idle {:.1} % ({serial:?} / {piped:?})",
            100.0 * share(&serial),
            100.0 * share(&piped)
        );
        Ok(json!({
            "steps": n,
            "serial_us": serial_us, "serial_idle_frac": share(&serial),
            "serial_idle_us": serial.idle.as_secs_f64() * 1e6 / serial.gaps.max(1) as f64,
            "pipelined_us": pipelined_us, "pipelined_idle_frac": share(&piped),
            "pipelined_idle_us": piped.idle.as_secs_f64() * 1e6 / piped.gaps.max(1) as f64,
            "replayed": [serial.replayed, piped.replayed],
            "idle_formula": "sum of (start event of step N+1 - end event of step N) / (that + sum of step device times)",
        }))
    }

    /// One prefill point: a prompt of `tokens` tokens in steps of at most
    /// [`PREFILL_CHUNK`].
    fn prefill_point(
        h: &Harness,
        model: &Model,
        costs: &Costs,
        ceilings: &Ceilings,
        ep: usize,
        tokens: usize,
    ) -> Value {
        let op = "v41_prefill";
        let shape = json!({ "ep": ep, "tokens": tokens });
        let chunk = tokens.min(PREFILL_CHUNK);
        let mut pool = match pool_for(h, model, 1, tokens + 1, chunk) {
            Ok(p) => p,
            Err((why, need)) => return skipped(op, shape, why, need),
        };
        let vocab = model.cfg.vocab_size as u32;
        let prompt: Vec<u32> = (0..tokens as u32)
            .map(|i| (i * 7919 + 17) % vocab)
            .collect();
        // Warm-up: a short prompt in a sequence of its own.
        let warm = pool.add_sequence().unwrap();
        if let Err(e) = model.forward(&mut pool, warm, &prompt[..256.min(tokens)]) {
            return skipped(op, shape, format!("the warm-up prefill failed: {e}"), None);
        }
        pool.free_sequence(warm).unwrap();
        h.cuda.synchronize().unwrap();
        let seq = pool.add_sequence().unwrap();
        let t = Instant::now();
        let mut touched = 0;
        let mut breakdown = Vec::new();
        let mut parts_first = Value::Null;
        for (i, part) in prompt.chunks(chunk).enumerate() {
            let capture = Capture {
                timing: i == 0,
                routing: true,
                ..Capture::default()
            };
            let out = match model.step(&mut pool, &[SeqInput { seq, tokens: part }], capture) {
                Ok(o) => o,
                Err(e) => return skipped(op, shape, format!("prefill step {i} failed: {e}"), None),
            };
            touched = touched.max(touched_experts(&out));
            if i == 0 {
                parts_first = parts(&out);
                breakdown = out.families;
            }
        }
        h.cuda.synchronize().unwrap();
        let ours_us = t.elapsed().as_secs_f64() * 1e6;
        let (mut kv, mut attn_flops) = (0.0, 0.0);
        for p in 0..tokens {
            let (b, f) = attention_cost(model, p);
            kv += b;
            attn_flops += f;
        }
        let n = tokens as f64;
        let k = model.cfg.moe.n_activated_experts as f64;
        let bytes =
            costs.dense_bytes + touched as f64 * costs.expert_bytes + kv + n * costs.token_bytes;
        let flops = n * (2.0 * costs.dense_params + 2.0 * k * costs.expert_params) + attn_flops;
        let (roof_us, detail) = roofline(ceilings, bytes, flops);
        let tps = n / (ours_us * 1e-6);
        println!(
            "{op:<16} ep={ep:<3} tokens={tokens:<6} {ours_us:>11.0} us roofline {roof_us:>9.0} us ({:>5.1}%) {tps:>9.0} tok/s  first step {breakdown:?}",
            100.0 * roof_us / ours_us
        );
        let first: Value = Value::Object(
            breakdown
                .iter()
                .map(|(f, ms)| (f.to_string(), json!(ms * 1e3)))
                .collect(),
        );
        json!({
            "op": op, "shape": shape, "mode": mode(), "engram_tables": format!("{:?}", engram_tables()), "mhc_fusion": mhc_fusion(), "ours_us": ours_us, "chunk": chunk,
            "roofline_us": roof_us, "roofline_frac": roof_us / ours_us, "roofline": detail,
            "tokens_per_s": tps, "touched_experts_max_step": touched,
            "families_us_first_step": first, "parts_us_first_step": parts_first, "page_rows": PAGE_ROWS,
            "bytes_formula": "dense weights + touched experts (most of any step) + KV rows read per token + embedding and Engram rows",
            "flop_formula": "tokens x 2 x (dense linear params + k x expert params) + attention and indexer FLOPs per token",
        })
    }

    /// cuBLASLt FP8 per-tensor at 8192³: the FP8 ceiling of this run.
    fn fp8_ceiling(h: &mut Harness) -> f64 {
        let s = 8192;
        let mut x = 0x9e37_79b9u32;
        let bytes: Vec<u8> = (0..s * s)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x & 0x3f) as u8 | ((x >> 8) as u8 & 0x80)
            })
            .collect();
        let a = Tensor::from_le_bytes(&h.dev, DType::F8E4M3, &[s, s], &bytes).unwrap();
        let one = Tensor::from_vec(vec![1.0f32], &[1])
            .unwrap()
            .to_device(&h.dev)
            .unwrap();
        let mut out = Tensor::empty(&h.dev, DType::BF16, &[s, s]).unwrap();
        let mut plan = Fp8TensorwisePlan::new(&h.cuda, s, s, s, DType::BF16).unwrap();
        let us = h.time_us(|_| plan.run(&a, &one, &a, &one, &mut out).unwrap());
        let tflops = 2.0 * (s * s * s) as f64 / (us * 1e-6) / 1e12;
        println!("fp8 ceiling (cuBLASLt per-tensor, 8192^3): {tflops:.0} TFLOP/s");
        h.set_fp8_ceiling(tflops);
        tflops
    }

    pub fn main() {
        let Some(mut h) = Harness::open("model_gpu") else {
            return;
        };
        let budget = Budget::from_env();
        let ceilings = Ceilings {
            copy_gbps: h.copy_gbps(),
            fp8_tflops: fp8_ceiling(&mut h),
        };
        let official = ModelConfig::from_hf_json(V41_FLASH_CONFIG).unwrap();
        let sweep = sweep();
        let only = std::env::var("DEEPINFER_BENCH_ONLY").ok();
        // Bytes per second the last rank was built at; a first guess of
        // 2 GB/s before any.
        let mut build_rate = 2e9;
        for &ep in sweep.eps {
            let cfg = official.ep_rank(ep).unwrap();
            let costs = Costs::of(&cfg);
            let points = || {
                let decode = sweep.contexts.iter().flat_map(|&c| {
                    sweep.batches.iter().map(move |&b| {
                        (
                            "v41_decode_step",
                            json!({ "ep": ep, "batch": b, "context": c }),
                        )
                    })
                });
                let prefill = sweep
                    .prefill
                    .iter()
                    .map(move |&t| ("v41_prefill", json!({ "ep": ep, "tokens": t })));
                decode
                    .chain(prefill)
                    .filter(|(op, _)| only.as_deref().is_none_or(|o| op.starts_with(o)))
                    .collect::<Vec<_>>()
            };
            let need_s = costs.weight_bytes / build_rate + 30.0;
            if budget.left_s() < need_s {
                for (op, shape) in points() {
                    let why = format!(
                        "wall-time budget: {:.0} s left, building EP {ep} takes about {need_s:.0} s",
                        budget.left_s()
                    );
                    h.push(skipped(op, shape, why, None));
                }
                h.write_partial();
                continue;
            }
            println!(
                "building the EP {ep} rank: {:.1} GB of random weights on cuda:0",
                costs.weight_bytes / 1e9
            );
            let t = Instant::now();
            let dev = if invariant() {
                h.dev.with_batch_invariant_kernels()
            } else {
                h.dev.clone()
            }
            .with_pdl(pdl());
            // The generation kernels run asynchronously: the build ends when
            // the device has finished them, not when the host has issued them.
            let options = WeightOptions {
                drafter: false,
                engram: engram_tables(),
            };
            let built = random_weights_with(&cfg, SEED, &dev, options)
                .and_then(|(w, _)| Model::new(cfg.clone(), w))
                .and_then(|m| {
                    if let Device::Cuda(d) = &dev {
                        d.synchronize()?;
                    }
                    Ok(m)
                });
            let model = match built {
                Ok(mut m) => {
                    m.moe_layout = moe_layout();
                    m.mhc_fusion = mhc_fusion();
                    m
                }
                Err(e) => {
                    for (op, shape) in points() {
                        h.push(skipped(op, shape, format!("building EP {ep}: {e}"), None));
                    }
                    h.write_partial();
                    continue;
                }
            };
            let build_s = t.elapsed().as_secs_f64();
            build_rate = costs.weight_bytes / build_s.max(1e-3);
            println!(
                "built in {build_s:.1} s ({:.2} GB/s, generated on the GPU)",
                build_rate / 1e9
            );
            h.push(json!({
                "op": "v41_ep_rank_build", "shape": { "ep": ep }, "ours_us": build_s * 1e6,
                "weight_bytes": costs.weight_bytes, "routed_experts_per_layer": cfg.moe.n_routed_experts,
                "generated_on": "gpu (ops::random_param; wo_a dequantised and Engram rows joined on the GPU)",
            }));
            let patterns = patterns(&h, &cfg);
            for (op, shape) in points() {
                // A point takes seconds; keep room for the prefill points.
                let reserve = if op == "v41_prefill" { 20.0 } else { 10.0 };
                let record = if budget.left_s() < reserve {
                    let why = format!("wall-time budget: {:.0} s left", budget.left_s());
                    skipped(op, shape, why, None)
                } else if op == "v41_prefill" {
                    let tokens = shape["tokens"].as_u64().unwrap() as usize;
                    prefill_point(&h, &model, &costs, &ceilings, ep, tokens)
                } else {
                    let batch = shape["batch"].as_u64().unwrap() as usize;
                    let context = shape["context"].as_u64().unwrap() as usize;
                    decode_point(&h, &model, &costs, &ceilings, &patterns, ep, batch, context)
                };
                h.push(record);
                h.write_partial();
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    println!("model_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
