//! The engine's limits and serving switches as one typed [`EngineConfig`],
//! read from DeepInfer's environment variables ([`EngineConfig::from_env`])
//! and then overridden field by field by command-line flags (a flag beats
//! the variable).
//!
//! | variable | field | values |
//! | --- | --- | --- |
//! | `DEEPINFER_BATCH_INVARIANT` | `batch_invariant` | 0 / 1 |
//! | `DEEPINFER_DETERMINISTIC_SAMPLING` | `deterministic_sampling` | 0 / 1 |
//! | `DEEPINFER_ENABLE_MTP_VARLEN` | `mtp_varlen` | 0 / 1 |
//! | `DEEPINFER_USE_NEXTN_DECODE` | `nextn` | draft tokens per step, 0 = off |
//! | `DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE` | `yoco_mode` | `exact` / `compact` |
//! | `DEEPINFER_YOCO_PREFILL_KEEP_TOKENS` | `yoco_keep_tokens` | tokens |
//!
//! Invariant: [`EngineConfig::validate`] accepts a config only when its
//! switches are consistent with each other and the model, and every switch
//! it accepts is honoured: a feature that has not landed is an
//! `Unsupported` error, never silently ignored. An unknown `DEEPINFER_*`
//! variable gets one warning.

use crate::error::Error as OpError;
use crate::model::Result;
use crate::model::config::ModelConfig;
use crate::model::layers::engram::EngramPlacement;

/// The largest `max_context`: positions index cache rows with i32.
pub const MAX_CONTEXT: usize = i32::MAX as usize;

/// How prefill treats the layers after the last KV source
/// (`DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YocoMode {
    /// Every layer on every prompt token: the oracle.
    Exact,
    /// Late layers only on each request's last `yoco_keep_tokens` tokens
    /// (decoder bounded replay), and a prefix-cache hit rebuilds the window
    /// rings by replaying the last `yoco_keep_tokens` tokens before it
    /// (encoder bounded replay, `v41-flash.md` §5; `engine::prefill`).
    Compact,
}

/// Limits and switches of one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Requests running at once at most: `generate` takes any number, and a
    /// finished request's place goes to the next waiting one, under plain
    /// and speculative decoding alike. `prefill_logits`, one batch, takes
    /// at most this many.
    pub max_seqs: usize,
    /// Prompt plus generated tokens per request at most.
    pub max_context: usize,
    /// Rows per pool page.
    pub page_rows: usize,
    /// Bytes the state pool of one batch may take (`None`: what the device
    /// has available, which `StatePool::new` checks). A batch whose pool
    /// needs more fails with [`crate::Error::OutOfMemory`] before anything
    /// is allocated.
    pub pool_memory: Option<usize>,
    /// No kernel choice depends on the batch (`ARCHITECTURE.md`, "Batch
    /// invariance").
    pub batch_invariant: bool,
    /// Sampled outputs are a function of (prompt, parameters, seed) alone.
    pub deterministic_sampling: bool,
    /// Confidence-scheduled variable-length verification of DSpark drafts.
    pub mtp_varlen: bool,
    /// Draft tokens proposed per decode step (0: no speculative decoding).
    pub nextn: usize,
    pub yoco_mode: YocoMode,
    /// The tail that compact prefill replays through the late layers.
    pub yoco_keep_tokens: usize,
    /// Plain decode steps on a CUDA device replay a CUDA graph of their
    /// device half (`Model::decode_graphed`: the same logits, bit for bit,
    /// as the eager step). Ignored on the CPU and under speculative
    /// decoding (its steps verify several tokens a sequence).
    pub cuda_graphs: bool,
    /// Where the Engram tables live ([`EngramPlacement`]): on the device
    /// (default), or in host memory with each step's rows gathered by the
    /// host and uploaded with its inputs (the same logits, bit for bit).
    /// `Engine::from_dir_on` loads the model so; `Engine::new` refuses a
    /// model whose tables are placed otherwise.
    pub engram_tables: EngramPlacement,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_seqs: 16,
            max_context: 4096,
            page_rows: 64,
            pool_memory: None,
            batch_invariant: false,
            deterministic_sampling: false,
            mtp_varlen: false,
            nextn: 0,
            yoco_mode: YocoMode::Exact,
            yoco_keep_tokens: 140,
            cuda_graphs: true,
            engram_tables: EngramPlacement::Device,
        }
    }
}

/// The variables [`EngineConfig::from_env`] reads.
pub const SWITCHES: [&str; 6] = [
    "DEEPINFER_BATCH_INVARIANT",
    "DEEPINFER_DETERMINISTIC_SAMPLING",
    "DEEPINFER_ENABLE_MTP_VARLEN",
    "DEEPINFER_USE_NEXTN_DECODE",
    "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE",
    "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS",
];

/// Other `DEEPINFER_*` variables the project reads (build, kernel choice,
/// cache, model, bench and test settings): not engine switches, not unknown.
const OTHER_KNOWN: [&str; 40] = [
    "DEEPINFER_ACCELERATOR",
    "DEEPINFER_ACT_QUANT_FP8_KERNEL",
    "DEEPINFER_ASCEND_ARCH",
    "DEEPINFER_ASCEND_FP8_NATIVE",
    "DEEPINFER_BENCH_BUDGET_S",
    "DEEPINFER_BENCH_COMMIT",
    "DEEPINFER_BENCH_DATE",
    "DEEPINFER_BENCH_JSON",
    "DEEPINFER_BENCH_OUT",
    "DEEPINFER_BENCH_QUICK",
    "DEEPINFER_BENCH_TIMEOUT",
    "DEEPINFER_CACHE",
    "DEEPINFER_COMMIT",
    "DEEPINFER_CUDA_ARCHS",
    "DEEPINFER_CUDA_ROOT",
    "DEEPINFER_DUMP_DIR",
    "DEEPINFER_HF_MODEL_DIR",
    "DEEPINFER_MHC_EXPAND_KERNEL",
    "DEEPINFER_MHC_PRE_KERNEL",
    "DEEPINFER_MHC_SPLIT_KERNEL",
    "DEEPINFER_MOE_LAYOUT_KERNEL",
    "DEEPINFER_MOE_ROUTE_KERNEL",
    "DEEPINFER_ONLY",
    "DEEPINFER_PEERS_JSON",
    "DEEPINFER_PYTHON",
    "DEEPINFER_QUICK",
    "DEEPINFER_REQUIRE_TILELANG",
    "DEEPINFER_RMS_NORM_ACT_QUANT_FP8_KERNEL",
    "DEEPINFER_ROPE_KERNEL",
    "DEEPINFER_SANITIZER_TIMEOUT",
    "DEEPINFER_SEED",
    "DEEPINFER_SETUP_TILELANG",
    "DEEPINFER_SKIP",
    "DEEPINFER_SWIGLU_ACT_QUANT_FP8_KERNEL",
    "DEEPINFER_TEST_TIMEOUT",
    "DEEPINFER_TILELANG",
    "DEEPINFER_TILELANG_PYTHON",
    "DEEPINFER_V4_TOKENIZER",
    "DEEPINFER_VENV",
    "DEEPINFER_WGMMA_E4M3_CUH",
];

fn bad(arg: &'static str, value: String, why: &'static str) -> OpError {
    OpError::Argument {
        op: "EngineConfig",
        arg,
        value,
        why,
    }
}

/// A 0/1 switch.
pub fn parse_flag(name: &'static str, value: &str) -> Result<bool> {
    match value.trim() {
        "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        v => Err(bad(name, v.to_string(), "expected 0 or 1").into()),
    }
}

/// A count.
pub fn parse_count(name: &'static str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse()
        .map_err(|_| bad(name, value.to_string(), "expected a non-negative integer").into())
}

/// `exact` or `compact`.
pub fn parse_yoco_mode(name: &'static str, value: &str) -> Result<YocoMode> {
    match value.trim() {
        "exact" => Ok(YocoMode::Exact),
        "compact" => Ok(YocoMode::Compact),
        v => Err(bad(name, v.to_string(), "expected exact or compact").into()),
    }
}

impl EngineConfig {
    /// The defaults overridden by the switches set in the environment.
    pub fn from_env() -> Result<EngineConfig> {
        EngineConfig::from_vars(std::env::vars())
    }

    /// [`EngineConfig::from_env`] over given `(name, value)` pairs (the
    /// testable form). Unknown `DEEPINFER_*` names are warned about.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<EngineConfig> {
        let mut c = EngineConfig::default();
        for (name, value) in vars {
            match name.as_str() {
                "DEEPINFER_BATCH_INVARIANT" => c.batch_invariant = parse_flag(SWITCHES[0], &value)?,
                "DEEPINFER_DETERMINISTIC_SAMPLING" => {
                    c.deterministic_sampling = parse_flag(SWITCHES[1], &value)?
                }
                "DEEPINFER_ENABLE_MTP_VARLEN" => c.mtp_varlen = parse_flag(SWITCHES[2], &value)?,
                "DEEPINFER_USE_NEXTN_DECODE" => c.nextn = parse_count(SWITCHES[3], &value)?,
                "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE" => {
                    c.yoco_mode = parse_yoco_mode(SWITCHES[4], &value)?
                }
                "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS" => {
                    c.yoco_keep_tokens = parse_count(SWITCHES[5], &value)?
                }
                n if n.starts_with("DEEPINFER_") && !OTHER_KNOWN.contains(&n) => {
                    tracing::warn!(
                        variable = n,
                        "unknown DEEPINFER_* variable, ignored (engine switches: {})",
                        SWITCHES.join(", ")
                    );
                }
                _ => {}
            }
        }
        Ok(c)
    }

    /// The fewest tokens compact prefill may keep: the window plus the
    /// look-back a rollback may re-read (one DSpark draft block).
    pub fn min_keep_tokens(cfg: &ModelConfig) -> usize {
        cfg.attention.window + cfg.dspark.block_size
    }

    /// Checks the limits, the switches' rules and which switches the engine
    /// implements, for the model `cfg`.
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        let c = self;
        if c.max_seqs == 0 || c.max_context < 2 || c.max_context > MAX_CONTEXT || c.page_rows == 0 {
            return Err(bad(
                "limits",
                format!(
                    "max_seqs {}, max_context {}, page_rows {}",
                    c.max_seqs, c.max_context, c.page_rows
                ),
                "max_seqs and page_rows >= 1, 2 <= max_context <= 2^31 - 1",
            )
            .into());
        }
        if c.deterministic_sampling && (!c.batch_invariant || c.mtp_varlen) {
            return Err(bad(
                "DEEPINFER_DETERMINISTIC_SAMPLING",
                format!(
                    "1 with BATCH_INVARIANT={} and ENABLE_MTP_VARLEN={}",
                    c.batch_invariant as u8, c.mtp_varlen as u8
                ),
                "deterministic sampling needs DEEPINFER_BATCH_INVARIANT=1 and \
                 DEEPINFER_ENABLE_MTP_VARLEN=0 (variable-length verification makes a \
                 request's steps depend on its batch)",
            )
            .into());
        }
        if c.mtp_varlen && c.nextn == 0 {
            return Err(bad(
                "DEEPINFER_ENABLE_MTP_VARLEN",
                "1 with DEEPINFER_USE_NEXTN_DECODE=0".into(),
                "variable-length verification needs draft tokens (USE_NEXTN_DECODE >= 1)",
            )
            .into());
        }
        if c.nextn > cfg.dspark.block_size {
            return Err(bad(
                "DEEPINFER_USE_NEXTN_DECODE",
                c.nextn.to_string(),
                "more draft tokens than the drafter's block (dspark_block_size)",
            )
            .into());
        }
        let min_keep = EngineConfig::min_keep_tokens(cfg);
        if c.yoco_keep_tokens < min_keep {
            return Err(bad(
                "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS",
                format!("{} (minimum {min_keep})", c.yoco_keep_tokens),
                "fewer than the window plus the look-back (one DSpark block)",
            )
            .into());
        }
        Ok(())
    }
}
