//! The flags every engine command shares: the model to load and the engine
//! switches, each overriding its `DEEPINFER_*` variable.

use clap::Args;
use deepinfer::engine::config::{parse_count, parse_flag, parse_yoco_mode};
use deepinfer::engine::{Engine, EngineConfig, MAX_CONTEXT};
use deepinfer::model::Result;
use deepinfer::model::layers::engram::EngramPlacement;
use deepinfer::model::runner::{DefaultModel, ensure_default_model, resolve_model};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultChoice {
    /// Vocabulary 512, token ids in and out.
    Tiny,
    /// V4.1's vocabulary and the real V4-series tokenizer: text in and out.
    TinyV4vocab,
}

#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Model directory (config + shards [+ tokenizer.json]) or
    /// `hf:ORG/NAME[@REV]` in the Hugging Face cache; default:
    /// `$DEEPINFER_HF_MODEL_DIR`, else the embedded default (--default).
    #[arg(long)]
    pub model: Option<String>,
    /// Which embedded default runs when no model is named (default: tiny).
    #[arg(long = "default", value_enum)]
    pub default_model: Option<DefaultChoice>,
    /// Where the model runs: cpu, cuda, cuda:N (ascend:N once its runtime
    /// binding exists).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Scan every weight for NaN/±Inf before running (always on for the
    /// embedded defaults).
    #[arg(long)]
    pub check_finite: bool,
    /// Requests per batch at most.
    #[arg(long, default_value_t = 16)]
    pub max_seqs: usize,
    /// MiB the state pool of one batch may take (default: what the device
    /// has available).
    #[arg(long, value_name = "MIB")]
    pub pool_memory_mib: Option<usize>,
    /// DEEPINFER_BATCH_INVARIANT (0/1).
    #[arg(long, value_name = "0|1")]
    pub batch_invariant: Option<String>,
    /// DEEPINFER_DETERMINISTIC_SAMPLING (0/1).
    #[arg(long, value_name = "0|1")]
    pub deterministic_sampling: Option<String>,
    /// DEEPINFER_ENABLE_MTP_VARLEN (0/1).
    #[arg(long, value_name = "0|1")]
    pub mtp_varlen: Option<String>,
    /// DEEPINFER_USE_NEXTN_DECODE (draft tokens per step).
    #[arg(long, value_name = "N")]
    pub nextn: Option<String>,
    /// DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE (exact/compact).
    #[arg(long, value_name = "exact|compact")]
    pub yoco_mode: Option<String>,
    /// DEEPINFER_YOCO_PREFILL_KEEP_TOKENS.
    #[arg(long, value_name = "N")]
    pub yoco_keep_tokens: Option<String>,
    /// Replay plain decode steps on a CUDA device from a CUDA graph (0/1,
    /// default 1; the same logits bit for bit).
    #[arg(long, value_name = "0|1")]
    pub cuda_graphs: Option<String>,
    /// Where the Engram tables live: on the device, or in host memory with
    /// each step's rows gathered by the host (default: device).
    #[arg(long, value_enum, value_name = "device|host")]
    pub engram_tables: Option<EngramTables>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngramTables {
    Device,
    Host,
}

impl EngineArgs {
    /// The environment's config with these flags applied, limited to
    /// `max_context` tokens per request.
    pub fn config(&self, max_context: usize) -> Result<EngineConfig> {
        let mut c = EngineConfig::from_env()?;
        c.max_seqs = self.max_seqs;
        c.max_context = max_context;
        if let Some(mib) = self.pool_memory_mib {
            c.pool_memory =
                Some(
                    mib.checked_mul(1 << 20)
                        .ok_or_else(|| deepinfer::Error::Argument {
                            op: "deepinfer",
                            arg: "--pool-memory-mib",
                            value: mib.to_string(),
                            why: "more bytes than the address space holds",
                        })?,
                );
        }
        if let Some(v) = &self.batch_invariant {
            c.batch_invariant = parse_flag("--batch-invariant", v)?;
        }
        if let Some(v) = &self.deterministic_sampling {
            c.deterministic_sampling = parse_flag("--deterministic-sampling", v)?;
        }
        if let Some(v) = &self.mtp_varlen {
            c.mtp_varlen = parse_flag("--mtp-varlen", v)?;
        }
        if let Some(v) = &self.nextn {
            c.nextn = parse_count("--nextn", v)?;
        }
        if let Some(v) = &self.yoco_mode {
            c.yoco_mode = parse_yoco_mode("--yoco-mode", v)?;
        }
        if let Some(v) = &self.yoco_keep_tokens {
            c.yoco_keep_tokens = parse_count("--yoco-keep-tokens", v)?;
        }
        if let Some(v) = &self.cuda_graphs {
            c.cuda_graphs = parse_flag("--cuda-graphs", v)?;
        }
        if let Some(t) = self.engram_tables {
            c.engram_tables = match t {
                EngramTables::Device => EngramPlacement::Device,
                EngramTables::Host => EngramPlacement::Host,
            };
        }
        Ok(c)
    }

    /// The model directory: named, from the environment, or the embedded
    /// default (generated on first use).
    pub fn model_dir(&self) -> Result<(PathBuf, bool)> {
        Ok(match resolve_model(self.model.as_deref())? {
            Some(dir) => {
                if self.default_model.is_some() {
                    tracing::warn!(
                        model = %dir.display(),
                        "--default is ignored: a model is named (--model or DEEPINFER_HF_MODEL_DIR)"
                    );
                }
                (dir, self.check_finite)
            }
            None => {
                let which = match self.default_model.unwrap_or(DefaultChoice::Tiny) {
                    DefaultChoice::Tiny => DefaultModel::Tiny,
                    DefaultChoice::TinyV4vocab => DefaultModel::TinyV4Vocab,
                };
                let dir = ensure_default_model(which)?;
                eprintln!(
                    "model: embedded {} default ({})",
                    which.name(),
                    dir.display()
                );
                (dir, true)
            }
        })
    }

    /// The engine over the model, with its tokenizer when it has one; a
    /// request's prompt plus output is bounded by the model's positions.
    pub fn engine(&self) -> Result<Engine> {
        let device: deepinfer::Device = self.device.parse()?;
        let (dir, check_finite) = self.model_dir()?;
        Engine::from_dir_on(&dir, &device, self.config(MAX_CONTEXT)?, check_finite)
    }
}
