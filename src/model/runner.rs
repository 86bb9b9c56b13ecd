//! Offline inference on the CPU reference model: greedy generation from a
//! prompt of token ids, with prefill and decode timed separately, and the
//! embedded default model (the tiny config with deterministic generated
//! weights, cached on disk on first use).
//!
//! Invariant: generation is deterministic — greedy argmax with ties to the
//! lowest token id — so the same model and prompt always give the same tokens.

use super::checkpoint::{Checkpoint, CheckpointError, GenerateOptions, LoadOptions, generate};
use super::config::ModelConfig;
use super::dspark::argmax;
use super::forward::Model;
use super::load::{load_weights, modulo_token_map};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The embedded default model's configuration (`models/tiny`).
pub const TINY_CONFIG: &str = include_str!("../../models/tiny/config.json");
/// Seed of the embedded default model's generated weights.
pub const TINY_SEED: u64 = 0;

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated tokens (not including the prompt).
    pub tokens: Vec<u32>,
    pub prefill: Duration,
    pub decode: Duration,
}

/// Greedily generates up to `max_new` tokens after `prompt`, stopping after
/// `stop` when it is produced.
pub fn generate_greedy(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    stop: Option<u32>,
) -> Result<Generation> {
    let vocab = model.cfg.vocab_size;
    let mut state = model.new_state();
    let t0 = Instant::now();
    let out = model.forward(prompt, &mut state)?;
    let prefill = t0.elapsed();
    let mut next = argmax(&out.logits[(prompt.len() - 1) * vocab..]);
    let mut tokens = Vec::with_capacity(max_new);
    let t1 = Instant::now();
    while tokens.len() < max_new {
        tokens.push(next);
        if Some(next) == stop || tokens.len() == max_new {
            break;
        }
        next = argmax(&model.forward(&[next], &mut state)?.logits);
    }
    Ok(Generation {
        tokens,
        prefill,
        decode: t1.elapsed(),
    })
}

/// Loads a model directory holding a config and its safetensors shards.
/// Engram uses the modulo token map (no tokenizer-derived map ships yet).
pub fn load_model(dir: &Path) -> Result<Model> {
    let cfg = ModelConfig::from_dir(dir)?;
    let ck = Checkpoint::load(dir, &cfg, &LoadOptions::default())?;
    let (weights, _) = load_weights(&ck, &cfg, modulo_token_map(&cfg))?;
    Model::new(cfg, weights)
}

/// The cache directory of the embedded default model.
pub fn default_model_dir() -> PathBuf {
    let base = std::env::var_os("DEEPINFER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
                .join(".cache/deepinfer")
        });
    base.join(format!("models/tiny-seed{TINY_SEED}"))
}

/// The embedded default model, generating its weights into
/// [`default_model_dir`] on first use.
pub fn default_model() -> Result<Model> {
    let dir = default_model_dir();
    if !dir.join("model.safetensors.index.json").is_file() {
        let cfg = ModelConfig::from_hf_json(TINY_CONFIG)?;
        let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::from(CheckpointError::Io { path, source })
        };
        let _ = std::fs::remove_dir_all(&tmp);
        generate(
            &cfg,
            &tmp,
            &GenerateOptions {
                seed: TINY_SEED,
                ..GenerateOptions::default()
            },
        )?;
        std::fs::write(tmp.join("config.json"), TINY_CONFIG).map_err(io(&tmp))?;
        if let Err(e) = std::fs::rename(&tmp, &dir) {
            // Another process may have finished first; its copy is identical.
            let _ = std::fs::remove_dir_all(&tmp);
            if !dir.join("model.safetensors.index.json").is_file() {
                return Err(io(&dir)(e));
            }
        }
    }
    load_model(&dir)
}
