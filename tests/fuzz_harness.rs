//! The bounded, stable-toolchain run of the fuzzed entry points (the
//! cargo-fuzz targets of `fuzz/` call the same `fuzz_entry` functions): the
//! config reader in both forms, the safetensors header and shard loader, the
//! checkpoint index, the CLI's prompt and JSONL request syntax, and the op
//! API's validation. Inputs are proptest-generated from fixed seeds (so a
//! run is reproducible), mostly as mutations of the tiny model's own files.
//!
//! Every case must return (any `Ok` or typed `Err`), within [`CASE_TIME`]
//! (and a watchdog aborts the binary past [`HANG_TIME`]), and allocate at
//! most [`CASE_BYTES`] above what was live before it (`common::limits`'
//! counting allocator, which refuses a request past it).
//! `DEEPINFER_FUZZ_SCALE=<f>` multiplies the case counts.

mod common;
mod fuzz_entry;

use common::limits::Counting;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes a case may allocate above the live bytes at its start (peak); a
/// request past it is refused (the binary aborts with the allocator's
/// message, or a fallible allocation returns its error).
const CASE_BYTES: u64 = 256 << 20;
/// Wall time one case may take.
const CASE_TIME: Duration = Duration::from_secs(3);
/// The watchdog's limit: a case still running after this is a hang.
const HANG_TIME: Duration = Duration::from_secs(60);

/// Every case runs under [`common::limits::bounded`]'s byte and time limits.
#[global_allocator]
static ALLOC: Counting = Counting;

/// Milliseconds since the process epoch when the running case started (0:
/// none), and its label, for the watchdog.
static CASE_START_MS: AtomicU64 = AtomicU64::new(0);
static CASE_LABEL: Mutex<String> = Mutex::new(String::new());
/// The harness runs one case at a time (the counters are global).
static SERIAL: Mutex<()> = Mutex::new(());

fn epoch() -> Instant {
    static E: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn start_watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        epoch();
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let start = CASE_START_MS.load(Ordering::Relaxed);
                let now = epoch().elapsed().as_millis() as u64;
                if start != 0 && now.saturating_sub(start) > HANG_TIME.as_millis() as u64 {
                    let label = CASE_LABEL.lock().map(|l| l.clone()).unwrap_or_default();
                    eprintln!("fuzz_harness: case hung for over {HANG_TIME:?}: {label}");
                    std::process::abort();
                }
            }
        });
    });
}

/// Runs one case under the time and memory limits (a failed limit panics,
/// which proptest reports as the case's failure).
fn bounded(label: impl FnOnce() -> String, case: impl FnOnce()) -> Result<(), TestCaseError> {
    let label = label();
    if let Ok(mut l) = CASE_LABEL.lock() {
        l.clone_from(&label);
    }
    CASE_START_MS.store(
        epoch().elapsed().as_millis().max(1) as u64,
        Ordering::Relaxed,
    );
    common::limits::bounded(&label, CASE_BYTES, CASE_TIME, case);
    CASE_START_MS.store(0, Ordering::Relaxed);
    Ok(())
}

fn scale() -> f64 {
    std::env::var("DEEPINFER_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// Runs `cases` cases of `strategy` from a fixed seed and returns the count.
fn run<S: Strategy>(name: &str, cases: u32, strategy: S, case: impl Fn(&S::Value) + Clone) -> u32
where
    S::Value: std::fmt::Debug,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    start_watchdog();
    let cases = ((f64::from(cases) * scale()) as u32).max(1);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    };
    let mut seed = [0u8; 32];
    for (i, b) in name.bytes().enumerate() {
        seed[i % 32] ^= b;
    }
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let t0 = Instant::now();
    let result = runner.run(&strategy, |v| {
        bounded(|| format!("{name}: {v:?}"), || (case.clone())(&v))
    });
    eprintln!(
        "fuzz_harness {name}: {cases} cases in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    cases
}

/// JSON values that stress a reader: limits, signs, types.
fn hostile_value(rng: &mut StdRng, old: &Value) -> Value {
    let scaled = old.as_u64().map(|n| {
        let k = rng.random_range(1..19u32);
        json!(n.saturating_mul(10u64.saturating_pow(k)))
    });
    match rng.random_range(0..24) {
        0 => json!(0),
        1 => json!(1),
        2 => json!(-1),
        3 => json!(1u64 << 31),
        4 => json!(1u64 << 32),
        5 => json!(1u64 << 53),
        6 => json!(u64::MAX),
        7 => json!(1e300),
        8 => json!(-1e300),
        9 => json!(1e-300),
        10 => json!(0.5),
        11 => json!("x"),
        12 => Value::Null,
        13 => json!(true),
        14 => json!([]),
        15 => json!([0, 1, 2]),
        16 => json!({}),
        17 => json!(vec![rng.random_range(0..64u64); rng.random_range(0..200)]),
        18 => json!(i64::MIN),
        19 => json!(1_000_000_000_000u64),
        20 => json!(rng.random_range(0..2000u64)),
        21 => json!(f64::from(rng.random_range(-5i32..5)) * 0.25),
        _ => scaled.unwrap_or_else(|| json!(rng.random_range(0..10u64))),
    }
}

/// Every path to a value inside `v`.
fn paths(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(k.clone());
                out.push(at.clone());
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(i.to_string());
                out.push(at.clone());
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn get_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Object(m) => m.get_mut(k),
        Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

/// `text` (a JSON document) with a few random mutations: values replaced
/// by hostile ones, keys removed, arrays grown or cut; sometimes the text
/// itself cut or spliced.
fn mutate_json(text: &str, seed: u64, count: usize) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let Ok(mut v) = serde_json::from_str::<Value>(text) else {
        return text.to_string();
    };
    for _ in 0..count {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        if all.is_empty() {
            break;
        }
        let path = all[rng.random_range(0..all.len())].clone();
        let (parent, last) = path.split_at(path.len() - 1);
        match rng.random_range(0..8) {
            0 => {
                if let Some(Value::Object(m)) = get_mut(&mut v, parent) {
                    m.remove(&last[0]);
                }
            }
            1 => {
                if let Some(Value::Array(a)) = get_mut(&mut v, &path) {
                    match rng.random_range(0..3) {
                        0 => a.truncate(rng.random_range(0..=a.len())),
                        1 => {
                            let x = a.first().cloned().unwrap_or(json!(0));
                            a.extend(std::iter::repeat_n(x, rng.random_range(1..40)));
                        }
                        _ => a.reverse(),
                    }
                }
            }
            _ => {
                if let Some(x) = get_mut(&mut v, &path) {
                    *x = hostile_value(&mut rng, x);
                }
            }
        }
    }
    let mut out = v.to_string();
    if rng.random_range(0..10) == 0 {
        let cut = rng.random_range(0..=out.len());
        let cut = (0..=cut)
            .rev()
            .find(|&c| out.is_char_boundary(c))
            .unwrap_or(0);
        out.truncate(cut);
        if rng.random() {
            out.push_str(["}", "]", "\"", ",", "1e999", "\\u00"][rng.random_range(0..6)]);
        }
    }
    out
}

#[test]
fn fuzzed_entry_points_return_typed_results_within_bounds() {
    let t0 = Instant::now();
    let mut total = 0u32;

    total += run(
        "config",
        20000,
        (any::<u64>(), 1..8usize, any::<bool>()),
        |&(seed, n, hf)| {
            let seed_text = if hf {
                fuzz_entry::TINY_HF
            } else {
                fuzz_entry::TINY_INFERENCE
            };
            fuzz_entry::config(mutate_json(seed_text, seed, n).as_bytes());
        },
    );
    total += run(
        "config_bytes",
        20000,
        prop::collection::vec(any::<u8>(), 0..256),
        |b| fuzz_entry::config(b),
    );

    let names = prop::sample::select(vec![
        "embed.weight",
        "norm.weight",
        "head.weight",
        "layers.0.attn.wq_a.weight",
        "vision.x",
        "__metadata__",
        "",
    ]);
    let dtypes = prop::sample::select(vec![
        "BF16", "F32", "F8_E4M3", "F8_E8M0", "I8", "U8", "F64", "bogus",
    ]);
    let dim = prop_oneof![
        8 => 0usize..600,
        1 => Just(1usize << 31),
        1 => Just(usize::MAX),
        1 => Just(1usize << 62),
    ];
    let entry = (
        names,
        dtypes,
        prop::collection::vec(dim.clone(), 0..4),
        dim.clone(),
        dim,
    );
    total += run(
        "safetensors",
        20000,
        (
            prop::collection::vec(entry, 0..5),
            0usize..4096,
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 0..64),
        ),
        |(entries, data_len, framed, junk)| {
            let mut header = serde_json::Map::new();
            for (name, dtype, shape, start, end) in entries {
                header.insert(
                    name.to_string(),
                    json!({"dtype": dtype, "shape": shape, "data_offsets": [start, end]}),
                );
            }
            let text = Value::Object(header).to_string();
            let mut bytes = Vec::new();
            if *framed {
                bytes.push(255);
                let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(text.as_bytes());
                bytes.resize(bytes.len() + data_len, 0x3c);
            } else {
                bytes.push(0);
                bytes.extend_from_slice(junk);
            }
            fuzz_entry::safetensors(&bytes);
        },
    );

    let files = prop::sample::select(vec![
        json!("model-00001-of-00002.safetensors"),
        json!("model-00002-of-00002.safetensors"),
        json!("missing.safetensors"),
        json!("../model-00001-of-00002.safetensors"),
        json!("a\\b.safetensors"),
        json!("model.bin"),
        json!(5),
        Value::Null,
    ]);
    let tensor_names =
        prop::sample::select(vec!["embed.weight", "extra.weight", "norm.weight", "x"]);
    total += run(
        "index",
        10000,
        (prop::collection::vec((tensor_names, files), 0..6), 0u8..8),
        |(map, shape)| {
            let weight_map: serde_json::Map<String, Value> = map
                .iter()
                .map(|(n, f)| (n.to_string(), f.clone()))
                .collect();
            let doc = match shape {
                0 => json!({"weight_map": []}),
                1 => json!([weight_map]),
                2 => json!({"metadata": {"total_size": 1}}),
                _ => json!({"metadata": {"total_size": 1}, "weight_map": weight_map}),
            };
            let mut text = doc.to_string();
            if *shape == 7 {
                text.truncate(text.len() / 2);
            }
            fuzz_entry::index(text.as_bytes());
        },
    );

    total += run(
        "request",
        60000,
        (any::<u64>(), 1..6usize, 0usize..3),
        |&(seed, n, line)| {
            let seed_line = fuzz_entry::REQUEST_SEED
                .lines()
                .nth(line)
                .unwrap_or_default();
            fuzz_entry::request(mutate_json(seed_line, seed, n).as_bytes());
        },
    );
    total += run("prompt_ids", 40000, "[0-9, \\-+a\u{e9}]{0,40}", |s| {
        fuzz_entry::request(s.as_bytes())
    });

    total += run(
        "ops",
        600000,
        (
            0..fuzz_entry::OPS,
            prop::collection::vec(any::<u8>(), 0..160),
        ),
        |(op, bytes)| {
            let mut data = vec![*op];
            data.extend_from_slice(bytes);
            fuzz_entry::ops(&data);
        },
    );

    eprintln!(
        "fuzz_harness: {total} cases in {:.1} s, 0 panics, 0 hangs, every case under {} MiB",
        t0.elapsed().as_secs_f64(),
        CASE_BYTES >> 20
    );
    assert!(f64::from(total) >= 100_000.0 * scale().min(1.0));
}
