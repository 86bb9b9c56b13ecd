//! A deterministic random-weight checkpoint for any [`ModelConfig`], in the
//! official format: every [`Manifest`] tensor with its dtype and shape,
//! written through the safetensors crate into `model-0000i-of-0000n` shards,
//! plus `model.safetensors.index.json` (the Hugging Face weight map; the
//! loader does not need it).
//!
//! Determinism: each parameter draws from its own splitmix64 stream, seeded
//! from the run seed and an FNV-1a hash of its name, so its bytes depend on
//! nothing else (not on shard boundaries or the order of writing). Normal
//! variates are Irwin–Hall sums of four uniforms rescaled to unit variance,
//! and standard deviations use `sqrt`; only IEEE-exact operations (+, ×, ÷,
//! √) are involved, never `ln`/`sin`, so the bytes are the same on every
//! platform.
//!
//! Scaling, chosen so activations stay in a realistic range (no NaN, logits
//! that are not flat) with g a unit normal variate:
//!
//! | role | value |
//! | --- | --- |
//! | RMSNorm weights, Engram `q_weight`/`k_weight` | 1 + 0.05 g |
//! | linear weights with fan-in n (dense, experts, gate, head, heads) | g / √n |
//! | embeddings, Markov embedding, Engram table rows | g |
//! | `attn_sink` | 0.1 g |
//! | `hc_*_fn` over m·D stream values | 0.5 g / √(m·D): mixes of std ≈ 0.5 |
//! | `hc_*_base` | 0.1 g, so pre ≈ σ(0), post ≈ 2σ(0) = 1, comb ≈ uniform |
//! | `hc_*_scale` | 1 + 0.05 g |
//! | `gate.bias`, `gate.bias_vl` | 0.01 g |
//!
//! g / √n keeps a linear's output at the RMS of its (normed) input, so the
//! residual grows only like a random walk over the layers and the head's
//! logits have a standard deviation near 1. Quantised formats then go
//! through the real quantisers (`crate::weight_rng`): FP8 with E8M0 block scales,
//! FP4 with per-32 E8M0 scales. Each parameter is generated in memory, one
//! shard at a time.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::error::CheckpointError;
use super::manifest::Manifest;
use super::param::{Param, TensorSpec};
use crate::model::config::ModelConfig;
use crate::weight_rng;

/// Config files copied next to the shards by [`generate_from_dir`].
const CONFIG_FILES: [&str; 2] = ["config.json", "inference-config.json"];

/// Options of [`generate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateOptions {
    pub seed: u64,
    /// A shard is closed before it would exceed this many bytes; a parameter
    /// larger than that gets a shard of its own, and a weight always shares
    /// its shard with its scale.
    pub shard_bytes: u64,
    /// Bytes free on the output's file system; `None` (the default) asks
    /// the file system (`statvfs`). Tests set it so that the refusal does not
    /// depend on the machine's disk.
    pub free_bytes: Option<u64>,
    /// Host memory the generator may take; `None` (the default) reads the
    /// host's `MemAvailable`.
    pub available_memory: Option<u64>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            seed: 0,
            shard_bytes: 4 << 30,
            free_bytes: None,
            available_memory: None,
        }
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub shards: Vec<PathBuf>,
    pub tensors: usize,
    /// Tensor bytes, without the safetensors headers.
    pub bytes: u64,
}

/// Writes the checkpoint of `config` into `out` (created if needed; it must
/// not already hold `*.safetensors` files, its file system must have room
/// for all of it, and the host the memory of its largest shard: both checked
/// before the first byte is written).
pub fn generate(
    config: &ModelConfig,
    out: &Path,
    options: &GenerateOptions,
) -> Result<Generated, CheckpointError> {
    let manifest = Manifest::new(config)?;
    std::fs::create_dir_all(out).map_err(CheckpointError::io(out))?;
    for entry in std::fs::read_dir(out).map_err(CheckpointError::io(out))? {
        if entry.map_err(CheckpointError::io(out))?.path().extension()
            == Some("safetensors".as_ref())
        {
            return Err(CheckpointError::OutputNotEmpty {
                dir: out.to_path_buf(),
            });
        }
    }
    let need = manifest.total_bytes();
    if let Some(free) = options.free_bytes.or_else(|| free_bytes(out))
        && free < need
    {
        return Err(CheckpointError::NoSpace {
            dir: out.to_path_buf(),
            need,
            free,
        });
    }
    let plan = plan_shards(manifest.params(), options.shard_bytes);
    let host = host_bytes_needed(&plan);
    let available = match options.available_memory {
        Some(a) => Some(a),
        None => crate::Device::Cpu
            .available_memory()
            .ok()
            .flatten()
            .map(|a| a as u64),
    };
    if let Some(available) = available
        && available < host
    {
        return Err(CheckpointError::NoMemory {
            need: host,
            available,
        });
    }
    let mut shards = Vec::with_capacity(plan.len());
    let mut weight_map = Map::new();
    for (i, params) in plan.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, plan.len());
        let path = out.join(&file);
        let tensors = write_shard(&path, params, options.seed)?;
        weight_map.extend(tensors.into_iter().map(|t| (t, Value::from(file.clone()))));
        shards.push(path);
    }
    let index = json!({
        "metadata": { "total_size": manifest.total_bytes() },
        "weight_map": weight_map,
    });
    let index_path = out.join(super::INDEX_FILE);
    std::fs::write(&index_path, format!("{index:#}\n"))
        .map_err(CheckpointError::io(&index_path))?;
    // safetensors writes through a private (0600) temporary file; give the
    // shards the permissions of an ordinarily created file, the index's.
    let permissions = std::fs::metadata(&index_path)
        .map_err(CheckpointError::io(&index_path))?
        .permissions();
    for shard in &shards {
        std::fs::set_permissions(shard, permissions.clone()).map_err(CheckpointError::io(shard))?;
    }
    Ok(Generated {
        shards,
        tensors: manifest.len(),
        bytes: manifest.total_bytes(),
    })
}

/// Bytes available to an unprivileged writer on the file system of `dir`
/// (`statvfs`); `None` when the call fails (the write then reports its own
/// error if space runs out).
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated C string that outlives the call, and
    // `st` points to writable memory of the size `statvfs` fills; the struct
    // is read only when the call reports success (0).
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let st = unsafe { st.assume_init() };
    // The fields are 64-bit here but 32-bit on some targets.
    #[allow(clippy::useless_conversion)]
    let (avail, frsize) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    Some(avail.saturating_mul(frsize))
}

/// Reads the config in `config_dir` ([`ModelConfig::from_dir`]), writes its
/// checkpoint into `out` and copies `config.json` and
/// `inference-config.json` (those present) beside the shards, so `out` is a
/// complete model directory.
pub fn generate_from_dir(
    config_dir: &Path,
    out: &Path,
    options: &GenerateOptions,
) -> Result<Generated, CheckpointError> {
    let config = ModelConfig::from_dir(config_dir)?;
    let generated = generate(&config, out, options)?;
    let same_dir = match (config_dir.canonicalize(), out.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    for name in CONFIG_FILES.iter().filter(|_| !same_dir) {
        let from = config_dir.join(name);
        if from.is_file() {
            std::fs::copy(&from, out.join(name)).map_err(CheckpointError::io(&from))?;
        }
    }
    Ok(generated)
}

/// The stored bytes of one parameter for `seed`: one vector per entry of
/// [`Param::tensors`], exactly what [`generate`] writes.
pub fn param_bytes(param: &Param, seed: u64) -> Vec<Vec<u8>> {
    let (rows, cols) = param.matrix();
    weight_rng::encode_rows(param.format, rows, cols, &param_values(param, seed))
}

/// Groups consecutive parameters into shards of at most `limit` bytes.
fn plan_shards(params: &[Param], limit: u64) -> Vec<Vec<&Param>> {
    let mut shards: Vec<Vec<&Param>> = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0u64;
    for param in params {
        let size: u64 = param.tensors().iter().map(|t| t.bytes() as u64).sum();
        if !current.is_empty() && bytes.saturating_add(size) > limit {
            shards.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(param);
        bytes = bytes.saturating_add(size);
    }
    if !current.is_empty() {
        shards.push(current);
    }
    shards
}

/// The most host memory generating one shard of `plan` takes at once (an
/// upper estimate, saturating): the stored bytes of the whole shard, which
/// are held until it is written, plus, for its largest parameter, the f32
/// values and a second copy of its stored bytes (an encoder's growing
/// buffer).
fn host_bytes_needed(plan: &[Vec<&Param>]) -> u64 {
    plan.iter()
        .map(|params| {
            let stored = |p: &Param| -> u64 {
                p.tensors()
                    .iter()
                    .fold(0u64, |sum, t| sum.saturating_add(t.bytes() as u64))
            };
            let held = params
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(stored(p)));
            let transient = params
                .iter()
                .map(|p| {
                    let numel = p
                        .shape
                        .iter()
                        .fold(1u64, |n, &d| n.saturating_mul(d as u64));
                    numel.saturating_mul(4).saturating_add(stored(p))
                })
                .max()
                .unwrap_or(0);
            held.saturating_add(transient)
        })
        .max()
        .unwrap_or(0)
}

/// Generates and writes one shard; returns its tensor names.
fn write_shard(path: &Path, params: &[&Param], seed: u64) -> Result<Vec<String>, CheckpointError> {
    let write_error = |source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    };
    let data: Vec<(TensorSpec, Vec<u8>)> = params
        .iter()
        .flat_map(|param| param.tensors().into_iter().zip(param_bytes(param, seed)))
        .collect();
    let views = data
        .iter()
        .map(|(spec, bytes)| {
            let dtype = spec.dtype.to_safetensors();
            safetensors::tensor::TensorView::new(dtype, spec.shape.clone(), bytes)
                .map(|view| (spec.name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(write_error)?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(write_error)?;
    Ok(data.into_iter().map(|(spec, _)| spec.name).collect())
}

/// The f32 values of `param` for `seed`, row-major over its logical shape.
fn param_values(param: &Param, seed: u64) -> Vec<f32> {
    let n: usize = param.shape.iter().product();
    param_values_range(param, seed, 0..n)
}

/// Values `range` (flat, row-major) of [`param_values`]: the stream is
/// counter-based, so a range starts by jumping ahead, and the ranges of a
/// split concatenate to the whole (what `random.rs` generates in parallel).
pub(super) fn param_values_range(param: &Param, seed: u64, range: Range<usize>) -> Vec<f32> {
    weight_rng::values(&param.random(seed), range)
}
