//! The fuzzed entry points, shared by the cargo-fuzz targets (`fuzz/`, which
//! include this file by path) and the stable harness (`tests/fuzz_harness.rs`).
//! Each entry takes arbitrary bytes, drives one public API with them and
//! returns normally whatever the result (`Ok` or a typed `Err`); a panic,
//! hang or runaway allocation inside is the bug the fuzzers look for.
//!
//! Sizes are bounded here where a library call may legitimately allocate
//! what its input asks for (a tensor of a fuzzed shape, a manifest of a
//! fuzzed config): the bounds keep one case small, they do not hide errors.
#![allow(dead_code, unused_imports)]

mod bytes;
mod ops;

pub use bytes::Bytes;
pub use ops::{OPS, ops};

use deepinfer::engine::SamplingParams;
use deepinfer::engine::request::{parse_ids, parse_request_line};
use deepinfer::model::checkpoint::{Checkpoint, LoadOptions, Manifest, Progress};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::pool::PoolConfig;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The tiny model's two config forms: the seeds of the config corpus.
pub const TINY_HF: &str = include_str!("../../models/tiny/config.json");
pub const TINY_INFERENCE: &str = include_str!("../../models/tiny/inference-config.json");

/// Manifests above this many tensors are not built (a legal config can ask
/// for tens of millions: 16,384 experts × 512 layers).
const MANIFEST_TENSOR_BOUND: usize = 20_000;

/// The config reader, both forms and the form sniffer; a config that loads
/// is then taken through its layer plans, its manifest (when small) and a
/// state-pool sizing.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let hf = ModelConfig::from_hf_json(&text);
    let flat = ModelConfig::from_inference_json(&text);
    let any = ModelConfig::from_json(&text);
    for cfg in [hf, flat, any].into_iter().flatten() {
        cfg.validate().expect("a loaded config validates");
        let plans = cfg
            .layer_plans()
            .expect("a validated config has layer plans");
        if estimated_tensors(&cfg, plans.len()) <= MANIFEST_TENSOR_BOUND {
            if let Ok(m) = Manifest::new(&cfg) {
                let _ = m.total_bytes();
                for name in [
                    "mtp.0.embed.weight",
                    "vision.x",
                    "image_end",
                    "mtp.99.head.weight",
                ] {
                    let _ = m.is_ignored(name);
                }
            }
            let _ = PoolConfig::from_budget(&cfg, 64 << 20, 2, 64, 16, 16);
        }
        let _ = cfg.max_position();
    }
}

/// An upper bound of a config's manifest length: ~3 tensors a routed
/// expert, ~80 others a layer.
fn estimated_tensors(cfg: &ModelConfig, layers: usize) -> usize {
    let experts = cfg.moe.n_routed_experts.max(cfg.dspark.n_routed_experts);
    layers.saturating_mul(experts.saturating_mul(6).saturating_add(80))
}

/// The tiny model's manifest, built once.
pub fn tiny_manifest() -> &'static Manifest {
    static M: OnceLock<Manifest> = OnceLock::new();
    M.get_or_init(|| {
        let cfg = ModelConfig::from_hf_json(TINY_HF).expect("the tiny config loads");
        Manifest::new(&cfg).expect("the tiny manifest builds")
    })
}

/// A scratch directory per process (and thread), emptied per case.
fn scratch(tag: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!(
        "deepinfer-fuzz-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// The safetensors header and shard loader: the bytes are one shard file
/// (first byte 0..=127), or a header text given its length prefix and
/// followed by data bytes (128..=255), loaded against the tiny manifest
/// with the finite check on.
pub fn safetensors(data: &[u8]) {
    let dir = scratch("st");
    let file = match data.split_first() {
        Some((&mode, rest)) if mode >= 128 => {
            // [header length in data bytes: u16][header][data]
            let (len, rest) = match rest {
                [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
                _ => (0, rest),
            };
            let (header, body) = rest.split_at(len.min(rest.len()));
            let mut f = (header.len() as u64).to_le_bytes().to_vec();
            f.extend_from_slice(header);
            f.extend_from_slice(body);
            f
        }
        Some((_, rest)) => rest.to_vec(),
        None => Vec::new(),
    };
    std::fs::write(dir.join("model-00001-of-00001.safetensors"), &file).expect("write shard");
    load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

fn load(dir: &Path) {
    let options = LoadOptions {
        check_finite: true,
        progress: Progress::Never,
        keep_page_cache: false,
    };
    if let Ok(ck) = Checkpoint::load_with_manifest(dir, tiny_manifest().clone(), &options) {
        for spec in ck.manifest().tensors() {
            let _ = ck.tensor(&spec.name);
        }
    }
}

/// A small, well-formed shard holding `embed.weight` (the tiny manifest's
/// first tensor) and one unexpected tensor.
fn small_shard() -> Vec<u8> {
    let header = r#"{"embed.weight":{"dtype":"BF16","shape":[512,128],"data_offsets":[0,131072]},"extra.weight":{"dtype":"F32","shape":[2],"data_offsets":[131072,131080]},"__metadata__":{"format":"pt"}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.resize(f.len() + 131_080, 0);
    f
}

/// The checkpoint index (`model.safetensors.index.json`): the bytes are the
/// index text, beside two small shards, loaded against the tiny manifest.
pub fn index(data: &[u8]) {
    static SHARD: OnceLock<Vec<u8>> = OnceLock::new();
    let shard = SHARD.get_or_init(small_shard);
    let dir = scratch("ix");
    for name in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        std::fs::write(dir.join(name), shard).expect("write shard");
    }
    std::fs::write(dir.join("model.safetensors.index.json"), data).expect("write index");
    load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CLI's request syntax: the bytes as `--prompt` ids and as a JSONL
/// file (each line a request over the CLI defaults), each parsed request
/// checked as the engine would check it.
pub fn request(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = parse_ids("--prompt", &text);
    let defaults = SamplingParams {
        stop: vec![1],
        max_tokens: 32,
        ..SamplingParams::default()
    };
    for (n, line) in text.lines().enumerate() {
        if let Ok((_, p)) = parse_request_line(n + 1, line, &defaults) {
            let _ = p.validate(512, 4096);
        }
    }
}

/// A JSONL request line of the tiny model (a seed).
pub const REQUEST_SEED: &str = r#"{"prompt_ids": [0, 17, 42, 7], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7, "stop_ids": [1], "logprobs": true}
{"prompt": "Bonjour", "stop": ["\n"], "so_args": {"schema_type": "regex", "schema": "[a-z]+"}}
{"prompt": "JSON:", "so_args": {"schema_type": "json", "schema": {"type": "object"}}}"#;
