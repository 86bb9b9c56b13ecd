//! Host sampling of one logits row of the V4 vocabulary (129,280 ids), the
//! step that follows every sampled decode step (the engine spreads a batch's
//! rows over the host's threads): `engine::sample_row`, which ranks the
//! candidates lazily (a selection, then a sort of only the ranks top-p and
//! the draw reach), against the rule it replaced in the same run (every
//! candidate ranked by one comparison sort, then the same f64 sums) and,
//! with `--features torch-ref`, torch on the CPU (softmax in f64, a
//! descending sort, a cumulative sum for top-p, `multinomial`).
//!
//! Rows: `flat` (uniform logits in [−10, 10): top-p reaches most of the
//! vocabulary, the worst case) and `peaked` (a language model's shape: a
//! normal body, σ = 2, and 64 logits 8 to 12 above it). Parameters:
//! temperature alone, top-p 0.9, top-k 50, and temperature 0.7 with top-p
//! 0.95. Time per row: the median of 40 draws with fresh uniforms.
//!
//! Writes `benches/results/<date>-cpu-sampling.json` (the gpu.md record
//! format, `device` = this host's CPU) when `DEEPINFER_BENCH_OUT` names the
//! file; prints a table either way.

#[path = "common/cpu_doc.rs"]
mod cpu_doc;

use deepinfer::engine::{SamplingParams, sample_row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::time::Instant;

const VOCAB: usize = 129_280;
const DRAWS: usize = 40;

/// The rule before lazy ranking: a comparison sort of every candidate, the
/// weights in rank order, the total summed in rank order, then top-k, top-p
/// and the draw. Returns the token.
fn full_sort(logits: &[f32], p: &SamplingParams, u: f64) -> usize {
    let t = f64::from(p.temperature);
    let mut cand: Vec<(usize, f32)> = logits
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = cand.first().map_or(0.0, |&(_, x)| f64::from(x) / t);
    let w: Vec<f64> = cand
        .iter()
        .map(|&(_, x)| (f64::from(x) / t - max).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut keep = if p.top_k == 0 {
        w.len()
    } else {
        p.top_k.min(w.len())
    };
    if p.top_p < 1.0 {
        let (mut acc, target) = (0.0, f64::from(p.top_p) * total);
        for (i, &x) in w.iter().take(keep).enumerate() {
            acc += x;
            if acc >= target {
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = w.iter().take(keep).sum();
    let (mut acc, target) = (0.0, u * kept);
    for (i, &x) in w.iter().take(keep).enumerate() {
        acc += x;
        if acc > target {
            return cand[i].0;
        }
    }
    cand.get(keep.saturating_sub(1)).map_or(0, |c| c.0)
}

#[cfg(feature = "torch-ref")]
fn torch_sample(row: &tch::Tensor, p: &SamplingParams) -> i64 {
    use tch::Kind;
    let probs = (row / f64::from(p.temperature)).softmax(-1, Kind::Double);
    let (mut sorted, idx) = probs.sort(-1, true);
    if p.top_k > 0 {
        let k = p.top_k as i64;
        sorted = sorted.narrow(0, 0, k);
    }
    if p.top_p < 1.0 {
        let cum = sorted.cumsum(-1, Kind::Double);
        let beyond = (cum - &sorted).gt(f64::from(p.top_p));
        sorted = sorted.masked_fill(&beyond, 0.0);
    }
    let pick = sorted.multinomial(1, false);
    idx.index_select(0, &pick).int64_value(&[0])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut rng = StdRng::seed_from_u64(11);
    let normal = |rng: &mut StdRng| {
        // Box–Muller.
        let (a, b): (f64, f64) = (rng.random(), rng.random());
        ((-2.0 * (1.0 - a).ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
    };
    let flat: Vec<f32> = (0..VOCAB).map(|_| rng.random_range(-10.0..10.0)).collect();
    let mut peaked: Vec<f32> = (0..VOCAB).map(|_| 2.0 * normal(&mut rng)).collect();
    for _ in 0..64 {
        let i = rng.random_range(0..VOCAB);
        peaked[i] = 8.0 + 4.0 * rng.random::<f32>();
    }
    let params = [
        ("t1", 1.0f32, 1.0f32, 0usize),
        ("top_p0.9", 1.0, 0.9, 0),
        ("top_k50", 1.0, 1.0, 50),
        ("t0.7_top_p0.95", 0.7, 0.95, 0),
    ];
    println!(
        "{:8} {:16} {:>10} {:>12} {:>10}",
        "row", "params", "ours µs", "full sort µs", "torch µs"
    );
    let mut records = Vec::new();
    for (row_name, row) in [("flat", &flat), ("peaked", &peaked)] {
        #[cfg(feature = "torch-ref")]
        let trow = tch::Tensor::from_slice(row.as_slice()).to_kind(tch::Kind::Double);
        for &(name, temperature, top_p, top_k) in &params {
            let p = SamplingParams {
                temperature,
                top_p,
                top_k,
                ..SamplingParams::default()
            };
            let us: Vec<f64> = (0..DRAWS).map(|_| rng.random()).collect();
            let time = |f: &mut dyn FnMut(f64) -> usize| {
                median(
                    us.iter()
                        .map(|&u| {
                            let t = Instant::now();
                            std::hint::black_box(f(u));
                            t.elapsed().as_secs_f64() * 1e6
                        })
                        .collect(),
                )
            };
            let ours = time(&mut |u| sample_row(row, &p, u).token as usize);
            let old = time(&mut |u| full_sort(row, &p, u));
            #[cfg(feature = "torch-ref")]
            let torch = Some(time(&mut |_| torch_sample(&trow, &p) as usize));
            #[cfg(not(feature = "torch-ref"))]
            let torch: Option<f64> = None;
            println!(
                "{row_name:8} {name:16} {ours:>10.0} {old:>12.0} {:>10}",
                torch.map_or("-".into(), |t| format!("{t:.0}"))
            );
            let mut peers = vec![json!({"name": "full_comparison_sort_previous_rule", "us": old})];
            if let Some(t) = torch {
                peers.push(json!({"name": "torch_cpu_softmax_sort_multinomial", "us": t}));
            }
            records.push(json!({
                "op": "sample_row",
                "shape": {"vocab": VOCAB, "row": row_name, "temperature": temperature, "top_p": top_p, "top_k": top_k},
                "ours_us": ours, "draws": DRAWS,
                "what": "engine::sample_row on one f32 row, one thread (median of the draws)",
                "peers": peers,
            }));
        }
    }
    if let Some(out) = std::env::var_os("DEEPINFER_BENCH_OUT") {
        cpu_doc::write(&out, json!({"threads": 1, "records": records}));
    }
}
