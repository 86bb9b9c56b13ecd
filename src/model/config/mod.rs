//! The DeepSeek-V4.1-Flash model configuration (spec §1, §2, §3.2, §8, §9).
//!
//! [`ModelConfig`] is one typed config, read from either official form: the
//! Hugging Face `config.json` (model keys nested under `text_config`, the
//! weight formats under `quantization_config`) or the flat
//! `inference-config.json` of the reference inference code. Both forms of one
//! model give equal configs. [`ModelConfig::layer_plans`] derives the role of
//! every layer and DSpark stage from it ([`LayerPlan`]); nothing downstream
//! hard-codes layer numbers.
//!
//! Invariant callers rely on: every `ModelConfig` returned by a loader has
//! passed [`ModelConfig::validate`]. Then [`ModelConfig::layer_plans`]
//! succeeds; every layer id the config names is a backbone layer; every
//! compressed layer reads a KV source of its own ratio, and every reuse layer
//! reuses a top-k over that same cache; every token id is inside the
//! vocabulary; every width that an FP8/FP4 block divides is a multiple of
//! [`crate::contract::MX_BLOCK`]; and the Engram table sizes agree with the hash primes.
//!
//! Layout: `types` holds the structs and `keys` the key spellings of both
//! forms; `error` holds [`ConfigError`]; `load` (over `reader`) reads the
//! JSON forms; `validate` checks values; `engram` derives the Engram hash
//! primes; `layer_plan` describes a layer's role and `roles` derives it;
//! `ep_rank` derives the config of one rank of an expert-parallel
//! deployment (the per-GPU bench's model).

mod engram;
mod ep_rank;
mod error;
mod keys;
mod layer_plan;
mod load;
mod reader;
mod roles;
mod types;
mod validate;

pub use ep_rank::V41_FLASH_CONFIG;
pub use error::ConfigError;
pub use keys::{ConfigForm, Key};
pub use layer_plan::{AttentionPlan, CompressorPlan, LayerKind, LayerPlan, Selection};
pub use types::{
    AttentionConfig, CandidateConfig, DsparkConfig, EngramConfig, IndexerConfig, LayerRope,
    MhcConfig, ModelConfig, MoeConfig, QuantConfig, RopeConfig, ScoreFunc, SpecialTokens,
    WeightFormat, YarnConfig,
};
pub use validate::{ENGRAM_PRIMES_LIMIT, ENGRAM_TABLE_ROWS_LIMIT, LIMITS, Limit};
