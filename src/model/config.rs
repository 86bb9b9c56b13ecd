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
//! [`BLOCK`]; and the Engram table sizes agree with the hash primes.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Width of every V4.1 quantisation block: 1 × 32 FP8 activation blocks,
/// 32 × 32 FP8 weight blocks, FP4 groups of 32 along K.
pub const BLOCK: usize = 32;

/// The model's architecture, as read from one of the official config forms.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Rows of the embedding and the head (`vocab_size`).
    pub vocab_size: usize,
    /// Residual width D (`hidden_size` / `dim`).
    pub hidden_size: usize,
    /// Backbone layers (`num_hidden_layers` / `n_layers`). The DSpark stages
    /// follow them as layers `n_layers ..`.
    pub n_layers: usize,
    /// Epsilon of every RMS in the text model and the DSpark stages
    /// (`rms_norm_eps` / `norm_eps`; 1e-20 in V4.1).
    pub norm_eps: f64,
    pub tokens: SpecialTokens,
    pub attention: AttentionConfig,
    pub rope: RopeConfig,
    /// `compress_ratios`: entry l is the ratio of the compressed cache that
    /// layer l reads (0: window only). One entry per backbone layer, then one
    /// per DSpark stage.
    pub compress_ratios: Vec<usize>,
    /// Layers that own a compressor and its cache
    /// (`kv_source_layer_ids` / `kv_source_layers`).
    pub kv_source_layers: Vec<usize>,
    /// Layers that run an indexer
    /// (`index_source_layer_ids` / `index_source_layers`).
    pub index_source_layers: Vec<usize>,
    pub indexer: IndexerConfig,
    /// The candidate pre-filter; `None` when `candidate_source_layer` is -1.
    pub candidate: Option<CandidateConfig>,
    pub mhc: MhcConfig,
    pub moe: MoeConfig,
    pub engram: EngramConfig,
    pub dspark: DsparkConfig,
    pub quant: QuantConfig,
}

/// Special token ids. Absent keys take the V4.1 tokenizer's ids (spec §13):
/// BOS 0, EOS 1, PAD 2; the flat form carries none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    /// `image_token_id`, when the config has one.
    pub image: Option<u32>,
}

/// Multi-query attention with one latent KV head (spec §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Query heads (`num_attention_heads` / `n_heads`).
    pub n_heads: usize,
    /// Width of a query head and of the shared K = V latent (`head_dim`).
    pub head_dim: usize,
    /// The trailing dims of a head that carry RoPE
    /// (`qk_rope_head_dim` / `rope_head_dim`).
    pub rope_head_dim: usize,
    pub q_lora_rank: usize,
    /// Groups of the grouped output LoRA (`o_groups`).
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// Sliding-window ring length (`sliding_window` / `window_size`).
    pub window: usize,
}

/// RoPE parameters; [`RopeConfig::for_ratio`] picks a layer's (spec §3.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// θ of ratio-0 layers and DSpark stages (`rope_theta`).
    pub theta: f64,
    /// θ of ratio > 0 layers (`compress_rope_theta`).
    pub compress_theta: f64,
    pub yarn: YarnConfig,
}

/// YaRN frequency scaling of ratio > 0 layers; active iff
/// `original_seq_len` > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnConfig {
    /// `rope_scaling.factor` / `rope_factor`.
    pub factor: f64,
    /// `rope_scaling.original_max_position_embeddings` / `original_seq_len`.
    pub original_seq_len: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// The RoPE one layer uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerRope {
    pub theta: f64,
    /// `Some` when the layer applies YaRN.
    pub yarn: Option<YarnConfig>,
}

/// The sparse indexer (spec §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerConfig {
    /// `index_n_heads`.
    pub n_heads: usize,
    /// `index_head_dim`; RoPE covers its last `rope_head_dim` dims.
    pub head_dim: usize,
    /// Entries selected per query (`index_topk`).
    pub topk: usize,
}

/// The candidate pre-filter (spec §3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CandidateConfig {
    /// `candidate_source_layer_id` / `candidate_source_layer`.
    pub source_layer: usize,
    /// Blocks kept per query (`candidate_topk_blocks`).
    pub topk_blocks: usize,
    /// Positions per block (`candidate_block_size`).
    pub block_size: usize,
}

/// Manifold-constrained hyper-connections (spec §6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MhcConfig {
    /// Residual streams (`hc_mult`).
    pub mult: usize,
    /// `hc_sinkhorn_iters`.
    pub sinkhorn_iters: usize,
    /// `hc_eps`.
    pub eps: f64,
}

/// Routed-expert scoring (`scoring_func` / `score_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreFunc {
    Softmax,
    Sigmoid,
    /// √softplus, the released model's choice.
    SqrtSoftplus,
}

/// The backbone MoE (spec §7). The DSpark stages share everything but the
/// expert counts ([`DsparkConfig`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub n_routed_experts: usize,
    /// `num_experts_per_tok` / `n_activated_experts`.
    pub n_activated_experts: usize,
    pub n_shared_experts: usize,
    /// Expert hidden width (`moe_intermediate_size` / `moe_inter_dim`).
    pub inter_dim: usize,
    pub score_func: ScoreFunc,
    /// `routed_scaling_factor` / `route_scale`.
    pub route_scale: f64,
    /// `norm_topk_prob`; the reference default is true.
    pub norm_topk_prob: bool,
    /// `gate_temp`; the reference default is 1.0.
    pub gate_temp: f64,
    /// SwiGLU clamp of routed and shared experts (`swiglu_limit`).
    pub swiglu_limit: f64,
}

/// Engram n-gram memory (spec §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngramConfig {
    /// Layers with Engram before the block (`engram_layer_ids`).
    pub layer_ids: Vec<usize>,
    /// Rows of each layer's table, in `layer_ids` order
    /// (`engram_num_embeddings`).
    pub table_rows: Vec<u64>,
    /// Longest n-gram (`engram_max_ngram_size`); orders 2 ..= it are looked up.
    pub max_ngram: usize,
    /// Hash heads per order (`engram_n_heads`).
    pub n_heads: usize,
    /// Width of one table row (`engram_head_dim`).
    pub head_dim: usize,
    /// Hash space (`engram_vocab_size`): the primes start above it.
    pub hash_space: u64,
    /// `engram_compressed_vocab_size`.
    pub compressed_vocab: usize,
    /// Token used for blocked look-backs
    /// (`engram_pad_token_id` / `engram_pad_id`).
    pub pad_id: u32,
}

/// The DSpark drafter (spec §9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsparkConfig {
    /// `num_nextn_predict_layers` / `n_mtp_layers`.
    pub n_stages: usize,
    /// Draft block length (`dspark_block_size`).
    pub block_size: usize,
    /// `dspark_noise_token_id`.
    pub noise_token_id: u32,
    /// Layers whose attention inputs feed the drafter, in concatenation order
    /// (`dspark_target_layer_ids`).
    pub target_layers: Vec<usize>,
    /// `dspark_markov_rank`.
    pub markov_rank: usize,
    pub n_routed_experts: usize,
    /// `dspark_num_experts_per_tok` / `dspark_n_activated_experts`.
    pub n_activated_experts: usize,
}

/// On-disk format of a weight family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Bf16,
    /// e4m3 with one E8M0 scale per weight block.
    Fp8,
    /// packed e2m1 with one E8M0 scale per 32 along K.
    Fp4,
}

/// Weight formats (`quantization_config` / `dtype`, `expert_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantConfig {
    /// Dense (non-expert) FP8-family weights: `quant_method` / `dtype`.
    pub weights: WeightFormat,
    /// Routed experts: `expert_dtype`, the dense format when absent.
    pub experts: WeightFormat,
    /// Rows × columns of one weight scale block (`weight_block_size`;
    /// 32 × 32 when absent, the reference's block).
    pub weight_block: [usize; 2],
}

/// The role of one layer or DSpark stage, derived from the config (spec §2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerPlan {
    /// Index into `compress_ratios`; stages are `n_layers ..`.
    pub layer: usize,
    /// Ratio of the compressed cache the layer reads; 0 means window only.
    pub ratio: usize,
    /// `Some(s)` for DSpark stage s (`mtp.s`).
    pub dspark_stage: Option<usize>,
    /// `Some` iff the layer is a KV source: it owns a compressor and the
    /// compressed cache.
    pub compressor: Option<CompressorPlan>,
    pub attention: AttentionPlan,
    /// The layer publishes the candidate mask.
    pub candidate_source: bool,
    pub rope: LayerRope,
    /// `Some(i)`: Engram runs before the block with table i of
    /// `engram.layer_ids`.
    pub engram: Option<usize>,
    /// `Some(i)`: the layer's attention input is DSpark target feature i.
    pub dspark_target: Option<usize>,
}

/// A KV source's compressor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressorPlan {
    /// Owns `compressor.wgate` (ratio > 1; the ratio-1 compressor has none).
    pub gated: bool,
}

/// What a layer attends to besides its own window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPlan {
    /// Ratio 0: the layer's own window only.
    WindowOnly,
    /// Ratio > 0: the window plus selected entries of a compressed cache.
    Sparse {
        /// The KV source whose compressed cache (and index keys) the layer
        /// reads: the most recent KV source at or before it.
        kv_source: usize,
        selection: Selection,
    },
}

/// How a sparse layer selects compressed entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// An index source: runs its own indexer (`indexer.wq_b`,
    /// `weights_proj`) against the index keys of its KV source.
    Indexer {
        /// `Some(c)`: scores outside layer c's candidate blocks are masked
        /// (the candidate source precedes this layer).
        candidates_from: Option<usize>,
    },
    /// Reuses the top-k published by the nearest preceding index source.
    Reuse { index_source: usize },
}

/// The attention modes of spec §2, plus the two window-only kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// A DSpark stage (window only).
    DsparkStage,
    /// A backbone layer with ratio 0.
    WindowOnly,
    /// A KV source running its own indexer over its own keys.
    Full,
    /// An index source that is not a KV source.
    Reindex,
    /// Reuses another layer's top-k.
    Reuse,
}

impl LayerPlan {
    pub fn is_dspark_stage(&self) -> bool {
        self.dspark_stage.is_some()
    }

    pub fn is_window_only(&self) -> bool {
        self.attention == AttentionPlan::WindowOnly
    }

    /// Owns a compressor and the compressed cache.
    pub fn is_kv_source(&self) -> bool {
        self.compressor.is_some()
    }

    /// Runs an indexer (owns `indexer.wq_b` and `weights_proj`).
    pub fn is_index_source(&self) -> bool {
        matches!(self.selection(), Some(Selection::Indexer { .. }))
    }

    /// Owns the index keys (`indexer.wk`, `k_norm`): an index source that is
    /// also a KV source.
    pub fn owns_index_keys(&self) -> bool {
        self.is_index_source() && self.is_kv_source()
    }

    /// An index source that scores another layer's keys.
    pub fn is_reindex(&self) -> bool {
        self.is_index_source() && !self.is_kv_source()
    }

    pub fn is_reuse(&self) -> bool {
        matches!(self.selection(), Some(Selection::Reuse { .. }))
    }

    /// The KV source whose compressed cache the layer reads.
    pub fn kv_source(&self) -> Option<usize> {
        match self.attention {
            AttentionPlan::WindowOnly => None,
            AttentionPlan::Sparse { kv_source, .. } => Some(kv_source),
        }
    }

    /// For index sources: the layer whose index keys the indexer scores.
    pub fn index_keys_from(&self) -> Option<usize> {
        self.kv_source().filter(|_| self.is_index_source())
    }

    /// The layer whose top-k list this layer attends with: itself for an
    /// index source, the reused index source otherwise.
    pub fn topk_from(&self) -> Option<usize> {
        match self.selection()? {
            Selection::Indexer { .. } => Some(self.layer),
            Selection::Reuse { index_source } => Some(index_source),
        }
    }

    /// The candidate source whose mask restricts this layer's indexer.
    pub fn candidates_from(&self) -> Option<usize> {
        match self.selection()? {
            Selection::Indexer { candidates_from } => candidates_from,
            Selection::Reuse { .. } => None,
        }
    }

    pub fn kind(&self) -> LayerKind {
        if self.is_dspark_stage() {
            LayerKind::DsparkStage
        } else if self.is_window_only() {
            LayerKind::WindowOnly
        } else if self.is_reuse() {
            LayerKind::Reuse
        } else if self.is_kv_source() {
            LayerKind::Full
        } else {
            LayerKind::Reindex
        }
    }

    fn selection(&self) -> Option<Selection> {
        match self.attention {
            AttentionPlan::WindowOnly => None,
            AttentionPlan::Sparse { selection, .. } => Some(selection),
        }
    }
}

impl RopeConfig {
    /// Ratio 0: `theta` without YaRN. Ratio > 0: `compress_theta`, with YaRN
    /// when `original_seq_len` > 0.
    pub fn for_ratio(&self, ratio: usize) -> LayerRope {
        if ratio == 0 {
            LayerRope {
                theta: self.theta,
                yarn: None,
            }
        } else {
            LayerRope {
                theta: self.compress_theta,
                yarn: Some(self.yarn).filter(|y| y.original_seq_len > 0),
            }
        }
    }
}

impl EngramConfig {
    /// Hash columns per layer: n-gram orders 2 ..= `max_ngram` × heads.
    pub fn columns(&self) -> usize {
        self.max_ngram.saturating_sub(1) * self.n_heads
    }

    /// The hash primes of each Engram layer in column order (order, then
    /// head): successive primes above `hash_space` − 1, never reused across
    /// layers (spec §8.2). A layer's table has as many rows as its primes sum.
    pub fn table_primes(&self) -> Result<Vec<Vec<u64>>, ConfigError> {
        let no_prime = || ConfigError::BadValue {
            key: keys::ENGRAM_HASH_SPACE,
            value: self.hash_space.to_string(),
            why: "the hash primes above it do not fit in 64 bits".into(),
        };
        let mut last = self.hash_space.checked_sub(1).ok_or_else(no_prime)?;
        let mut tables = Vec::with_capacity(self.layer_ids.len());
        for _ in &self.layer_ids {
            let mut primes = Vec::with_capacity(self.columns());
            for _ in 0..self.columns() {
                last = next_prime(last).ok_or_else(no_prime)?;
                primes.push(last);
            }
            tables.push(primes);
        }
        Ok(tables)
    }

    fn check(&self, vocab_size: usize) -> Result<(), ConfigError> {
        if self.table_rows.len() != self.layer_ids.len() {
            return Err(ConfigError::EngramTableCount {
                tables: self.table_rows.len(),
                layers: self.layer_ids.len(),
            });
        }
        if self.max_ngram < 2 {
            return Err(ConfigError::BadValue {
                key: keys::ENGRAM_MAX_NGRAM,
                value: self.max_ngram.to_string(),
                why: "must be at least 2: n-gram orders 2 and up are looked up".into(),
            });
        }
        if self.hash_space == 0 || self.hash_space > i64::MAX as u64 {
            return Err(ConfigError::BadValue {
                key: keys::ENGRAM_HASH_SPACE,
                value: self.hash_space.to_string(),
                why: "must be positive and fit the int64 hash arithmetic".into(),
            });
        }
        if self.compressed_vocab > vocab_size {
            return Err(ConfigError::Exceeds {
                key: keys::ENGRAM_COMPRESSED_VOCAB,
                value: self.compressed_vocab,
                limit_key: keys::VOCAB_SIZE,
                limit: vocab_size,
            });
        }
        self.check_table_rows()
    }

    fn check_table_rows(&self) -> Result<(), ConfigError> {
        let primes = self.table_primes()?;
        for ((&layer, &rows), primes) in self.layer_ids.iter().zip(&self.table_rows).zip(primes) {
            let expected: u128 = primes.iter().map(|&p| u128::from(p)).sum();
            if u128::from(rows) != expected {
                return Err(ConfigError::EngramTableRows {
                    layer,
                    rows,
                    expected,
                });
            }
        }
        Ok(())
    }
}

/// Which official file layout a config is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigForm {
    /// `config.json`: keys under `text_config`, formats under
    /// `quantization_config`, special ids at the root.
    HuggingFace,
    /// `inference-config.json`: one flat object.
    Inference,
}

impl fmt::Display for ConfigForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigForm::HuggingFace => "Hugging Face config",
            ConfigForm::Inference => "inference config",
        })
    }
}

/// A config key as each form spells it: a dotted path from the root of the
/// Hugging Face file, and the flat name. Shown in errors as
/// `` `hf`/`flat` `` (without the `text_config.` prefix), or once when both
/// agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    hf: &'static str,
    flat: &'static str,
}

impl Key {
    /// The key's path in `form`.
    pub fn name(&self, form: ConfigForm) -> &'static str {
        match form {
            ConfigForm::HuggingFace => self.hf,
            ConfigForm::Inference => self.flat,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hf = self.hf.strip_prefix("text_config.").unwrap_or(self.hf);
        if hf == self.flat {
            write!(f, "`{hf}`")
        } else {
            write!(f, "`{hf}`/`{}`", self.flat)
        }
    }
}

/// Every key the loader reads.
mod keys {
    use super::Key;

    const fn key(hf: &'static str, flat: &'static str) -> Key {
        Key { hf, flat }
    }

    pub const MODEL_TYPE: Key = key("model_type", "model_type");
    pub const TEXT_MODEL_TYPE: Key = key("text_config.model_type", "model_type");
    pub const VOCAB_SIZE: Key = key("text_config.vocab_size", "vocab_size");
    pub const HIDDEN_SIZE: Key = key("text_config.hidden_size", "dim");
    pub const N_LAYERS: Key = key("text_config.num_hidden_layers", "n_layers");
    pub const NORM_EPS: Key = key("text_config.rms_norm_eps", "norm_eps");
    pub const BOS: Key = key("bos_token_id", "bos_token_id");
    pub const EOS: Key = key("eos_token_id", "eos_token_id");
    pub const PAD: Key = key("pad_token_id", "pad_token_id");
    pub const IMAGE: Key = key("image_token_id", "image_token_id");
    pub const N_HEADS: Key = key("text_config.num_attention_heads", "n_heads");
    pub const N_KV_HEADS: Key = key("text_config.num_key_value_heads", "num_key_value_heads");
    pub const HEAD_DIM: Key = key("text_config.head_dim", "head_dim");
    pub const ROPE_HEAD_DIM: Key = key("text_config.qk_rope_head_dim", "rope_head_dim");
    pub const Q_LORA_RANK: Key = key("text_config.q_lora_rank", "q_lora_rank");
    pub const O_GROUPS: Key = key("text_config.o_groups", "o_groups");
    pub const O_LORA_RANK: Key = key("text_config.o_lora_rank", "o_lora_rank");
    pub const WINDOW: Key = key("text_config.sliding_window", "window_size");
    pub const ROPE_THETA: Key = key("text_config.rope_theta", "rope_theta");
    pub const COMPRESS_ROPE_THETA: Key =
        key("text_config.compress_rope_theta", "compress_rope_theta");
    pub const ROPE_TYPE: Key = key("text_config.rope_scaling.rope_type", "rope_type");
    pub const YARN_FACTOR: Key = key("text_config.rope_scaling.factor", "rope_factor");
    pub const YARN_ORIGINAL_LEN: Key = key(
        "text_config.rope_scaling.original_max_position_embeddings",
        "original_seq_len",
    );
    pub const BETA_FAST: Key = key("text_config.rope_scaling.beta_fast", "beta_fast");
    pub const BETA_SLOW: Key = key("text_config.rope_scaling.beta_slow", "beta_slow");
    pub const COMPRESS_RATIOS: Key = key("text_config.compress_ratios", "compress_ratios");
    pub const KV_SOURCES: Key = key("text_config.kv_source_layer_ids", "kv_source_layers");
    pub const INDEX_SOURCES: Key = key("text_config.index_source_layer_ids", "index_source_layers");
    pub const INDEX_N_HEADS: Key = key("text_config.index_n_heads", "index_n_heads");
    pub const INDEX_HEAD_DIM: Key = key("text_config.index_head_dim", "index_head_dim");
    pub const INDEX_TOPK: Key = key("text_config.index_topk", "index_topk");
    pub const CANDIDATE_SOURCE: Key = key(
        "text_config.candidate_source_layer_id",
        "candidate_source_layer",
    );
    pub const CANDIDATE_TOPK_BLOCKS: Key =
        key("text_config.candidate_topk_blocks", "candidate_topk_blocks");
    pub const CANDIDATE_BLOCK_SIZE: Key =
        key("text_config.candidate_block_size", "candidate_block_size");
    pub const HC_MULT: Key = key("text_config.hc_mult", "hc_mult");
    pub const HC_SINKHORN_ITERS: Key = key("text_config.hc_sinkhorn_iters", "hc_sinkhorn_iters");
    pub const HC_EPS: Key = key("text_config.hc_eps", "hc_eps");
    pub const N_ROUTED_EXPERTS: Key = key("text_config.n_routed_experts", "n_routed_experts");
    pub const N_ACTIVATED_EXPERTS: Key =
        key("text_config.num_experts_per_tok", "n_activated_experts");
    pub const N_SHARED_EXPERTS: Key = key("text_config.n_shared_experts", "n_shared_experts");
    pub const MOE_INTER_DIM: Key = key("text_config.moe_intermediate_size", "moe_inter_dim");
    pub const SCORE_FUNC: Key = key("text_config.scoring_func", "score_func");
    pub const ROUTE_SCALE: Key = key("text_config.routed_scaling_factor", "route_scale");
    pub const NORM_TOPK_PROB: Key = key("text_config.norm_topk_prob", "norm_topk_prob");
    pub const GATE_TEMP: Key = key("text_config.gate_temp", "gate_temp");
    pub const SWIGLU_LIMIT: Key = key("text_config.swiglu_limit", "swiglu_limit");
    pub const TOPK_METHOD: Key = key("text_config.topk_method", "topk_method");
    pub const NUM_HASH_LAYERS: Key = key("text_config.num_hash_layers", "num_hash_layers");
    pub const ENGRAM_LAYERS: Key = key("text_config.engram_layer_ids", "engram_layer_ids");
    pub const ENGRAM_TABLE_ROWS: Key =
        key("text_config.engram_num_embeddings", "engram_num_embeddings");
    pub const ENGRAM_MAX_NGRAM: Key =
        key("text_config.engram_max_ngram_size", "engram_max_ngram_size");
    pub const ENGRAM_HASH_SPACE: Key = key("text_config.engram_vocab_size", "engram_vocab_size");
    pub const ENGRAM_N_HEADS: Key = key("text_config.engram_n_heads", "engram_n_heads");
    pub const ENGRAM_HEAD_DIM: Key = key("text_config.engram_head_dim", "engram_head_dim");
    pub const ENGRAM_PAD_ID: Key = key("text_config.engram_pad_token_id", "engram_pad_id");
    pub const ENGRAM_COMPRESSED_VOCAB: Key = key(
        "text_config.engram_compressed_vocab_size",
        "engram_compressed_vocab_size",
    );
    pub const DSPARK_STAGES: Key = key("text_config.num_nextn_predict_layers", "n_mtp_layers");
    pub const DSPARK_BLOCK_SIZE: Key = key("text_config.dspark_block_size", "dspark_block_size");
    pub const DSPARK_NOISE_TOKEN: Key =
        key("text_config.dspark_noise_token_id", "dspark_noise_token_id");
    pub const DSPARK_TARGETS: Key = key(
        "text_config.dspark_target_layer_ids",
        "dspark_target_layer_ids",
    );
    pub const DSPARK_MARKOV_RANK: Key = key("text_config.dspark_markov_rank", "dspark_markov_rank");
    pub const DSPARK_N_ROUTED_EXPERTS: Key = key(
        "text_config.dspark_n_routed_experts",
        "dspark_n_routed_experts",
    );
    pub const DSPARK_N_ACTIVATED_EXPERTS: Key = key(
        "text_config.dspark_num_experts_per_tok",
        "dspark_n_activated_experts",
    );
    pub const WEIGHT_DTYPE: Key = key("quantization_config.quant_method", "dtype");
    pub const EXPERT_DTYPE: Key = key("quantization_config.expert_dtype", "expert_dtype");
    pub const WEIGHT_BLOCK: Key = key("quantization_config.weight_block_size", "weight_block_size");
    pub const SCALE_FMT: Key = key("quantization_config.scale_fmt", "scale_fmt");
}

/// Why a config was rejected. Every message names the key, layer or value
/// at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
    #[error("neither config.json nor inference-config.json in {}", .0.display())]
    NoConfigFile(PathBuf),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{form}: missing key `{key}`")]
    MissingKey { form: ConfigForm, key: &'static str },
    #[error("{form}: `{key}` = {value} is not {expected}")]
    WrongType {
        form: ConfigForm,
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{key} = {value} is not supported: {why}")]
    Unsupported {
        key: Key,
        value: String,
        why: &'static str,
    },
    #[error("{key} = {value} is invalid: {why}")]
    BadValue {
        key: Key,
        value: String,
        why: String,
    },
    #[error("{key} is 0; it must be positive")]
    Zero { key: Key },
    #[error("{key} = {value} is not a multiple of {of}")]
    NotMultiple { key: Key, value: usize, of: String },
    #[error("{key} = {value} exceeds {limit_key} = {limit}")]
    Exceeds {
        key: Key,
        value: usize,
        limit_key: Key,
        limit: usize,
    },
    #[error("{key} = {id} is not a token id of the {vocab}-token vocabulary")]
    TokenOutOfRange { key: Key, id: u32, vocab: usize },
    #[error(
        "{} has {len} entries, expected {} ({n_layers} layers + {n_stages} DSpark stages)",
        keys::COMPRESS_RATIOS,
        .n_layers + .n_stages
    )]
    RatiosLength {
        len: usize,
        n_layers: usize,
        n_stages: usize,
    },
    #[error(
        "{}[{layer}] = {ratio} is not supported: V4.1 layers read ratio 0, 1 or 2 \
         (ratios 4 and 128 are V4's CSA and HCA)",
        keys::COMPRESS_RATIOS
    )]
    UnsupportedRatio { layer: usize, ratio: usize },
    #[error(
        "{}[{layer}] = {ratio}, but layer {layer} is DSpark stage {stage}, \
         which attends to its window only (ratio 0)",
        keys::COMPRESS_RATIOS
    )]
    StageRatio {
        layer: usize,
        stage: usize,
        ratio: usize,
    },
    #[error("{key} lists layer {id} twice")]
    Duplicate { key: Key, id: usize },
    #[error("{key} names layer {id}, but the backbone has layers 0..{n_layers}")]
    LayerOutOfRange {
        key: Key,
        id: usize,
        n_layers: usize,
    },
    #[error(
        "KV source layer {layer} (in {}) has {}[{layer}] = 0: a KV source must compress",
        keys::KV_SOURCES,
        keys::COMPRESS_RATIOS
    )]
    KvSourceRatioZero { layer: usize },
    #[error(
        "index source layer {layer} (in {}) has {}[{layer}] = 0, so it reads no KV source",
        keys::INDEX_SOURCES,
        keys::COMPRESS_RATIOS
    )]
    IndexSourceRatioZero { layer: usize },
    #[error(
        "{role} layer {layer} (ratio {ratio}) reads no KV source: no layer of {} at or before it",
        keys::KV_SOURCES
    )]
    NoKvSource {
        layer: usize,
        ratio: usize,
        role: &'static str,
    },
    #[error(
        "layer {layer} has {}[{layer}] = {ratio} but reads the ratio-{kv_ratio} cache \
         of KV source layer {kv_source}",
        keys::COMPRESS_RATIOS
    )]
    RatioMismatch {
        layer: usize,
        ratio: usize,
        kv_source: usize,
        kv_ratio: usize,
    },
    #[error(
        "reuse layer {layer} (ratio {ratio}, not in {}) has no preceding index source \
         whose top-k it could reuse",
        keys::INDEX_SOURCES
    )]
    NoIndexSource { layer: usize, ratio: usize },
    #[error(
        "reuse layer {layer} reads KV source layer {kv_source}, but the nearest preceding \
         index source, layer {index_source}, selects entries of KV source layer \
         {index_kv_source} (is layer {kv_source} missing from {}?)",
        keys::INDEX_SOURCES
    )]
    ReuseAcrossKvSources {
        layer: usize,
        kv_source: usize,
        index_source: usize,
        index_kv_source: usize,
    },
    #[error(
        "candidate source layer {layer} ({}) is not an index source (not in {})",
        keys::CANDIDATE_SOURCE,
        keys::INDEX_SOURCES
    )]
    CandidateNotIndexSource { layer: usize },
    #[error(
        "candidate source layer {layer} ({}) is not a KV source (not in {}): \
         its blocks index its own compressed cache",
        keys::CANDIDATE_SOURCE,
        keys::KV_SOURCES
    )]
    CandidateNotKvSource { layer: usize },
    #[error(
        "index source layer {layer} is restricted to the candidate blocks of layer \
         {candidate_source} ({}) but reads KV source layer {kv_source}",
        keys::CANDIDATE_SOURCE
    )]
    CandidateKvMismatch {
        layer: usize,
        kv_source: usize,
        candidate_source: usize,
    },
    #[error(
        "{} has {tables} entries for {layers} Engram layers ({})",
        keys::ENGRAM_TABLE_ROWS,
        keys::ENGRAM_LAYERS
    )]
    EngramTableCount { tables: usize, layers: usize },
    #[error(
        "{} gives Engram layer {layer} {rows} rows, but its hash primes sum to {expected}",
        keys::ENGRAM_TABLE_ROWS
    )]
    EngramTableRows {
        layer: usize,
        rows: u64,
        expected: u128,
    },
}

impl ModelConfig {
    /// Reads the Hugging Face form (`text_config` nested) and validates it.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        Self::from_value(&serde_json::from_str(text)?, ConfigForm::HuggingFace)
    }

    /// Reads the flat form of the reference inference code and validates it.
    pub fn from_inference_json(text: &str) -> Result<Self, ConfigError> {
        Self::from_value(&serde_json::from_str(text)?, ConfigForm::Inference)
    }

    /// Reads either form, telling them apart by a top-level `text_config`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text)?;
        let form = if value.get("text_config").is_some() {
            ConfigForm::HuggingFace
        } else {
            ConfigForm::Inference
        };
        Self::from_value(&value, form)
    }

    /// Reads a model directory: `config.json` when present (in either form:
    /// the reference's own `inference/config.json` is flat under that name),
    /// otherwise `inference-config.json`. Errors name the file.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let path = ["config.json", "inference-config.json"]
            .iter()
            .map(|name| dir.join(name))
            .find(|path| path.is_file())
            .ok_or_else(|| ConfigError::NoConfigFile(dir.to_path_buf()))?;
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_json(&text).map_err(|source| ConfigError::InFile {
            path,
            source: Box::new(source),
        })
    }

    fn from_value(value: &Value, form: ConfigForm) -> Result<Self, ConfigError> {
        let root = value.as_object().ok_or_else(|| ConfigError::WrongType {
            form,
            key: "(root)",
            value: shown(value),
            expected: "a JSON object",
        })?;
        if form == ConfigForm::HuggingFace && !root.get("text_config").is_some_and(Value::is_object)
        {
            return Err(ConfigError::MissingKey {
                form,
                key: "text_config",
            });
        }
        let config = read_config(&Reader { root, form })?;
        config.validate()?;
        Ok(config)
    }

    /// Backbone layers plus DSpark stages: the length of `compress_ratios`.
    pub fn n_total_layers(&self) -> usize {
        self.n_layers + self.dspark.n_stages
    }

    /// Checks every value and the layer roles; the loaders call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_nonzero()?;
        self.check_block_multiples()?;
        self.check_dims()?;
        self.check_floats()?;
        self.check_tokens()?;
        self.check_quant()?;
        self.check_experts()?;
        self.engram.check(self.vocab_size)?;
        self.layer_plans().map(drop)
    }

    /// The role of every layer, backbone then DSpark stages, derived by the
    /// rules of spec §2:
    ///
    /// - r_l = `compress_ratios[l]`; layers ≥ `n_layers` are DSpark stages
    ///   (ratio 0, never sources).
    /// - KV source ⇔ l is a backbone layer in `kv_source_layers` (ratio > 0;
    ///   a gated compressor iff r_l > 1). Index source ⇔ l is in
    ///   `index_source_layers`; one that is also a KV source owns the keys,
    ///   one that is not is a Reindex layer.
    /// - A layer with r_l > 0 reads the most recent KV source at or before
    ///   it, whose ratio must be r_l. An index source scores that source's
    ///   keys, restricted to the candidate blocks when
    ///   0 ≤ candidate source < l. Any other ratio > 0 layer reuses the top-k
    ///   of the nearest preceding index source, which must read the same KV
    ///   source.
    /// - RoPE by [`RopeConfig::for_ratio`]; Engram and DSpark targets by
    ///   membership in their lists.
    pub fn layer_plans(&self) -> Result<Vec<LayerPlan>, ConfigError> {
        self.check_layer_lists()?;
        self.check_ratios()?;
        self.check_candidate()?;
        let mut published = Published::default();
        self.compress_ratios
            .iter()
            .enumerate()
            .map(|(layer, &ratio)| self.plan_layer(layer, ratio, &mut published))
            .collect()
    }

    fn plan_layer(
        &self,
        layer: usize,
        ratio: usize,
        published: &mut Published,
    ) -> Result<LayerPlan, ConfigError> {
        let backbone = layer < self.n_layers;
        let kv_source = backbone && self.kv_source_layers.contains(&layer);
        let index_source = backbone && self.index_source_layers.contains(&layer);
        if kv_source {
            if ratio == 0 {
                return Err(ConfigError::KvSourceRatioZero { layer });
            }
            published.kv_source = Some((layer, ratio));
        }
        let attention = if ratio == 0 {
            if index_source {
                return Err(ConfigError::IndexSourceRatioZero { layer });
            }
            AttentionPlan::WindowOnly
        } else {
            self.sparse_attention(layer, ratio, index_source, published)?
        };
        Ok(LayerPlan {
            layer,
            ratio,
            dspark_stage: layer.checked_sub(self.n_layers),
            compressor: kv_source.then_some(CompressorPlan { gated: ratio > 1 }),
            attention,
            candidate_source: self.candidate.is_some_and(|c| c.source_layer == layer),
            rope: self.rope.for_ratio(ratio),
            engram: position(&self.engram.layer_ids, layer),
            dspark_target: position(&self.dspark.target_layers, layer),
        })
    }

    fn sparse_attention(
        &self,
        layer: usize,
        ratio: usize,
        index_source: bool,
        published: &mut Published,
    ) -> Result<AttentionPlan, ConfigError> {
        let role = if index_source {
            "index source"
        } else {
            "reuse"
        };
        let (kv_source, kv_ratio) =
            published
                .kv_source
                .ok_or(ConfigError::NoKvSource { layer, ratio, role })?;
        if kv_ratio != ratio {
            return Err(ConfigError::RatioMismatch {
                layer,
                ratio,
                kv_source,
                kv_ratio,
            });
        }
        let selection = if index_source {
            let candidates_from = self
                .candidate
                .map(|c| c.source_layer)
                .filter(|&c| c < layer);
            if let Some(candidate_source) = candidates_from
                && candidate_source != kv_source
            {
                return Err(ConfigError::CandidateKvMismatch {
                    layer,
                    kv_source,
                    candidate_source,
                });
            }
            published.index_source = Some((layer, kv_source));
            Selection::Indexer { candidates_from }
        } else {
            let (index_source, index_kv_source) = published
                .index_source
                .ok_or(ConfigError::NoIndexSource { layer, ratio })?;
            if index_kv_source != kv_source {
                return Err(ConfigError::ReuseAcrossKvSources {
                    layer,
                    kv_source,
                    index_source,
                    index_kv_source,
                });
            }
            Selection::Reuse { index_source }
        };
        Ok(AttentionPlan::Sparse {
            kv_source,
            selection,
        })
    }

    fn check_nonzero(&self) -> Result<(), ConfigError> {
        let a = &self.attention;
        let mut sizes = vec![
            (keys::VOCAB_SIZE, self.vocab_size),
            (keys::HIDDEN_SIZE, self.hidden_size),
            (keys::N_LAYERS, self.n_layers),
            (keys::N_HEADS, a.n_heads),
            (keys::HEAD_DIM, a.head_dim),
            (keys::ROPE_HEAD_DIM, a.rope_head_dim),
            (keys::Q_LORA_RANK, a.q_lora_rank),
            (keys::O_GROUPS, a.o_groups),
            (keys::O_LORA_RANK, a.o_lora_rank),
            (keys::WINDOW, a.window),
            (keys::INDEX_N_HEADS, self.indexer.n_heads),
            (keys::INDEX_HEAD_DIM, self.indexer.head_dim),
            (keys::INDEX_TOPK, self.indexer.topk),
            (keys::HC_MULT, self.mhc.mult),
            (keys::HC_SINKHORN_ITERS, self.mhc.sinkhorn_iters),
            (keys::N_ROUTED_EXPERTS, self.moe.n_routed_experts),
            (keys::N_ACTIVATED_EXPERTS, self.moe.n_activated_experts),
            (keys::MOE_INTER_DIM, self.moe.inter_dim),
            (keys::ENGRAM_N_HEADS, self.engram.n_heads),
            (keys::ENGRAM_HEAD_DIM, self.engram.head_dim),
            (keys::ENGRAM_COMPRESSED_VOCAB, self.engram.compressed_vocab),
            (keys::DSPARK_BLOCK_SIZE, self.dspark.block_size),
            (keys::DSPARK_MARKOV_RANK, self.dspark.markov_rank),
            (keys::DSPARK_N_ROUTED_EXPERTS, self.dspark.n_routed_experts),
            (
                keys::DSPARK_N_ACTIVATED_EXPERTS,
                self.dspark.n_activated_experts,
            ),
        ];
        if let Some(c) = self.candidate {
            sizes.push((keys::CANDIDATE_TOPK_BLOCKS, c.topk_blocks));
            sizes.push((keys::CANDIDATE_BLOCK_SIZE, c.block_size));
        }
        match sizes.into_iter().find(|&(_, size)| size == 0) {
            Some((key, _)) => Err(ConfigError::Zero { key }),
            None => Ok(()),
        }
    }

    /// Widths along which FP8 activations, FP8 weight blocks, FP4 groups or
    /// the FP8 window KV are blocked by 32.
    fn check_block_multiples(&self) -> Result<(), ConfigError> {
        let widths = [
            (keys::HIDDEN_SIZE, self.hidden_size),
            (keys::HEAD_DIM, self.attention.head_dim),
            (keys::Q_LORA_RANK, self.attention.q_lora_rank),
            (keys::O_LORA_RANK, self.attention.o_lora_rank),
            (keys::INDEX_HEAD_DIM, self.indexer.head_dim),
            (keys::MOE_INTER_DIM, self.moe.inter_dim),
            (keys::ENGRAM_HEAD_DIM, self.engram.head_dim),
        ];
        match widths
            .into_iter()
            .find(|&(_, width)| !width.is_multiple_of(BLOCK))
        {
            Some((key, value)) => Err(ConfigError::NotMultiple {
                key,
                value,
                of: format!("{BLOCK}, the FP8/FP4 block width"),
            }),
            None => Ok(()),
        }
    }

    fn check_dims(&self) -> Result<(), ConfigError> {
        let a = &self.attention;
        if !a.rope_head_dim.is_multiple_of(2) {
            return Err(ConfigError::NotMultiple {
                key: keys::ROPE_HEAD_DIM,
                value: a.rope_head_dim,
                of: "2: RoPE rotates pairs".into(),
            });
        }
        for (limit_key, limit) in [
            (keys::HEAD_DIM, a.head_dim),
            (keys::INDEX_HEAD_DIM, self.indexer.head_dim),
        ] {
            if a.rope_head_dim > limit {
                return Err(ConfigError::Exceeds {
                    key: keys::ROPE_HEAD_DIM,
                    value: a.rope_head_dim,
                    limit_key,
                    limit,
                });
            }
        }
        if !a.n_heads.is_multiple_of(a.o_groups) {
            return Err(ConfigError::NotMultiple {
                key: keys::N_HEADS,
                value: a.n_heads,
                of: format!("{} = {}", keys::O_GROUPS, a.o_groups),
            });
        }
        Ok(())
    }

    fn check_floats(&self) -> Result<(), ConfigError> {
        let y = &self.rope.yarn;
        let values = [
            (keys::NORM_EPS, self.norm_eps),
            (keys::ROPE_THETA, self.rope.theta),
            (keys::COMPRESS_ROPE_THETA, self.rope.compress_theta),
            (keys::YARN_FACTOR, y.factor),
            (keys::BETA_FAST, y.beta_fast),
            (keys::BETA_SLOW, y.beta_slow),
            (keys::HC_EPS, self.mhc.eps),
            (keys::ROUTE_SCALE, self.moe.route_scale),
            (keys::GATE_TEMP, self.moe.gate_temp),
            (keys::SWIGLU_LIMIT, self.moe.swiglu_limit),
        ];
        if let Some((key, value)) = values
            .into_iter()
            .find(|&(_, v)| !(v.is_finite() && v > 0.0))
        {
            return Err(ConfigError::BadValue {
                key,
                value: value.to_string(),
                why: "must be positive and finite".into(),
            });
        }
        if y.beta_fast <= y.beta_slow {
            return Err(ConfigError::BadValue {
                key: keys::BETA_FAST,
                value: y.beta_fast.to_string(),
                why: format!("must exceed {} = {}", keys::BETA_SLOW, y.beta_slow),
            });
        }
        Ok(())
    }

    fn check_tokens(&self) -> Result<(), ConfigError> {
        let t = &self.tokens;
        let mut ids = vec![
            (keys::BOS, t.bos),
            (keys::EOS, t.eos),
            (keys::PAD, t.pad),
            (keys::DSPARK_NOISE_TOKEN, self.dspark.noise_token_id),
            (keys::ENGRAM_PAD_ID, self.engram.pad_id),
        ];
        ids.extend(t.image.map(|id| (keys::IMAGE, id)));
        match ids
            .into_iter()
            .find(|&(_, id)| !usize::try_from(id).is_ok_and(|id| id < self.vocab_size))
        {
            Some((key, id)) => Err(ConfigError::TokenOutOfRange {
                key,
                id,
                vocab: self.vocab_size,
            }),
            None => Ok(()),
        }
    }

    fn check_quant(&self) -> Result<(), ConfigError> {
        let q = &self.quant;
        if q.weights == WeightFormat::Fp4 {
            return Err(ConfigError::Unsupported {
                key: keys::WEIGHT_DTYPE,
                value: "fp4".into(),
                why: "dense weights are FP8 or BF16; only routed experts are FP4",
            });
        }
        if q.weight_block != [BLOCK, BLOCK] {
            return Err(ConfigError::Unsupported {
                key: keys::WEIGHT_BLOCK,
                value: format!("{:?}", q.weight_block),
                why: "V4.1 scales weights per 32×32 block and activations per 1×32 \
                      (a 128×128 grid is V4-style)",
            });
        }
        Ok(())
    }

    fn check_experts(&self) -> Result<(), ConfigError> {
        if self.moe.n_shared_experts != 1 {
            return Err(ConfigError::Unsupported {
                key: keys::N_SHARED_EXPERTS,
                value: self.moe.n_shared_experts.to_string(),
                why: "the reference has exactly one shared expert",
            });
        }
        for (key, value, limit_key, limit) in [
            (
                keys::N_ACTIVATED_EXPERTS,
                self.moe.n_activated_experts,
                keys::N_ROUTED_EXPERTS,
                self.moe.n_routed_experts,
            ),
            (
                keys::DSPARK_N_ACTIVATED_EXPERTS,
                self.dspark.n_activated_experts,
                keys::DSPARK_N_ROUTED_EXPERTS,
                self.dspark.n_routed_experts,
            ),
        ] {
            if value > limit {
                return Err(ConfigError::Exceeds {
                    key,
                    value,
                    limit_key,
                    limit,
                });
            }
        }
        if self.dspark.n_stages > 0 && self.dspark.target_layers.is_empty() {
            return Err(ConfigError::BadValue {
                key: keys::DSPARK_TARGETS,
                value: "[]".into(),
                why: format!("{} DSpark stages need target layers", self.dspark.n_stages),
            });
        }
        Ok(())
    }

    /// Every listed layer id is a backbone layer, listed once.
    fn check_layer_lists(&self) -> Result<(), ConfigError> {
        let lists = [
            (keys::KV_SOURCES, &self.kv_source_layers),
            (keys::INDEX_SOURCES, &self.index_source_layers),
            (keys::ENGRAM_LAYERS, &self.engram.layer_ids),
            (keys::DSPARK_TARGETS, &self.dspark.target_layers),
        ];
        for (key, ids) in lists {
            let mut seen = HashSet::new();
            for &id in ids {
                if id >= self.n_layers {
                    return Err(ConfigError::LayerOutOfRange {
                        key,
                        id,
                        n_layers: self.n_layers,
                    });
                }
                if !seen.insert(id) {
                    return Err(ConfigError::Duplicate { key, id });
                }
            }
        }
        Ok(())
    }

    fn check_ratios(&self) -> Result<(), ConfigError> {
        if self.compress_ratios.len() != self.n_total_layers() {
            return Err(ConfigError::RatiosLength {
                len: self.compress_ratios.len(),
                n_layers: self.n_layers,
                n_stages: self.dspark.n_stages,
            });
        }
        for (layer, &ratio) in self.compress_ratios.iter().enumerate() {
            if ratio > 2 {
                return Err(ConfigError::UnsupportedRatio { layer, ratio });
            }
            if let Some(stage) = layer.checked_sub(self.n_layers)
                && ratio != 0
            {
                return Err(ConfigError::StageRatio {
                    layer,
                    stage,
                    ratio,
                });
            }
        }
        Ok(())
    }

    fn check_candidate(&self) -> Result<(), ConfigError> {
        let Some(candidate) = self.candidate else {
            return Ok(());
        };
        let layer = candidate.source_layer;
        if layer >= self.n_layers {
            return Err(ConfigError::LayerOutOfRange {
                key: keys::CANDIDATE_SOURCE,
                id: layer,
                n_layers: self.n_layers,
            });
        }
        if !self.index_source_layers.contains(&layer) {
            return Err(ConfigError::CandidateNotIndexSource { layer });
        }
        if !self.kv_source_layers.contains(&layer) {
            return Err(ConfigError::CandidateNotKvSource { layer });
        }
        Ok(())
    }
}

/// What the layers so far have published for the ones after them: the
/// latest KV source (layer, ratio) and the latest index source (layer, the KV
/// source it selects from).
#[derive(Default)]
struct Published {
    kv_source: Option<(usize, usize)>,
    index_source: Option<(usize, usize)>,
}

fn position(ids: &[usize], layer: usize) -> Option<usize> {
    ids.iter().position(|&id| id == layer)
}

/// The smallest prime above `n`.
fn next_prime(n: u64) -> Option<u64> {
    (n.checked_add(1)?..=u64::MAX).find(|&c| is_prime(c))
}

/// Deterministic Miller–Rabin; these twelve bases decide every 64-bit n.
fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    if let Some(&p) = BASES.iter().find(|&&p| n.is_multiple_of(p)) {
        return n == p;
    }
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    BASES.iter().all(|&a| {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            return true;
        }
        (1..s).any(|_| {
            x = mul_mod(x, x, n);
            x == n - 1
        })
    })
}

fn mul_mod(a: u64, b: u64, n: u64) -> u64 {
    (u128::from(a) * u128::from(b) % u128::from(n)) as u64
}

fn pow_mod(mut base: u64, mut exp: u64, n: u64) -> u64 {
    let mut result = 1;
    base %= n;
    while exp > 0 {
        if exp & 1 == 1 {
            result = mul_mod(result, base, n);
        }
        base = mul_mod(base, base, n);
        exp >>= 1;
    }
    result
}

/// A JSON value type: how to parse it and how to name it in errors.
struct Kind<T> {
    parse: fn(&Value) -> Option<T>,
    expected: &'static str,
}

const UINT: Kind<usize> = Kind {
    parse: |v| v.as_u64().and_then(|n| usize::try_from(n).ok()),
    expected: "a non-negative integer",
};
const UINT64: Kind<u64> = Kind {
    parse: Value::as_u64,
    expected: "a non-negative integer",
};
const TOKEN: Kind<u32> = Kind {
    parse: |v| v.as_u64().and_then(|n| u32::try_from(n).ok()),
    expected: "a token id",
};
const INT: Kind<i64> = Kind {
    parse: Value::as_i64,
    expected: "an integer",
};
const FLOAT: Kind<f64> = Kind {
    parse: Value::as_f64,
    expected: "a number",
};
const BOOL: Kind<bool> = Kind {
    parse: Value::as_bool,
    expected: "a boolean",
};
const TEXT: Kind<String> = Kind {
    parse: |v| v.as_str().map(str::to_owned),
    expected: "a string",
};
const UINTS: Kind<Vec<usize>> = Kind {
    parse: |v| v.as_array()?.iter().map(UINT.parse).collect(),
    expected: "a list of non-negative integers",
};
const UINT64S: Kind<Vec<u64>> = Kind {
    parse: |v| v.as_array()?.iter().map(Value::as_u64).collect(),
    expected: "a list of non-negative integers",
};
const PAIR: Kind<[usize; 2]> = Kind {
    parse: |v| (UINTS.parse)(v)?.try_into().ok(),
    expected: "a pair of non-negative integers",
};

/// Reads keys of one form from a parsed file.
struct Reader<'a> {
    root: &'a Map<String, Value>,
    form: ConfigForm,
}

impl Reader<'_> {
    /// The key's value; absent and `null` are the same.
    fn optional<T>(&self, key: Key, kind: Kind<T>) -> Result<Option<T>, ConfigError> {
        let name = key.name(self.form);
        let mut parts = name.split('.');
        let first = parts.next().and_then(|part| self.root.get(part));
        let value = parts.fold(first, |value, part| value?.get(part));
        match value.filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => (kind.parse)(v)
                .map(Some)
                .ok_or_else(|| ConfigError::WrongType {
                    form: self.form,
                    key: name,
                    value: shown(v),
                    expected: kind.expected,
                }),
        }
    }

    fn required<T>(&self, key: Key, kind: Kind<T>) -> Result<T, ConfigError> {
        self.optional(key, kind)?
            .ok_or_else(|| ConfigError::MissingKey {
                form: self.form,
                key: key.name(self.form),
            })
    }
}

/// A JSON value for an error message, cut to a readable length.
fn shown(value: &Value) -> String {
    const MAX: usize = 60;
    let text = value.to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

fn read_config(r: &Reader) -> Result<ModelConfig, ConfigError> {
    check_fixed_facts(r)?;
    Ok(ModelConfig {
        vocab_size: r.required(keys::VOCAB_SIZE, UINT)?,
        hidden_size: r.required(keys::HIDDEN_SIZE, UINT)?,
        n_layers: r.required(keys::N_LAYERS, UINT)?,
        norm_eps: r.required(keys::NORM_EPS, FLOAT)?,
        tokens: SpecialTokens {
            bos: r.optional(keys::BOS, TOKEN)?.unwrap_or(0),
            eos: r.optional(keys::EOS, TOKEN)?.unwrap_or(1),
            pad: r.optional(keys::PAD, TOKEN)?.unwrap_or(2),
            image: r.optional(keys::IMAGE, TOKEN)?,
        },
        attention: read_attention(r)?,
        rope: read_rope(r)?,
        compress_ratios: r.required(keys::COMPRESS_RATIOS, UINTS)?,
        kv_source_layers: r.required(keys::KV_SOURCES, UINTS)?,
        index_source_layers: r.required(keys::INDEX_SOURCES, UINTS)?,
        indexer: IndexerConfig {
            n_heads: r.required(keys::INDEX_N_HEADS, UINT)?,
            head_dim: r.required(keys::INDEX_HEAD_DIM, UINT)?,
            topk: r.required(keys::INDEX_TOPK, UINT)?,
        },
        candidate: read_candidate(r)?,
        mhc: MhcConfig {
            mult: r.required(keys::HC_MULT, UINT)?,
            sinkhorn_iters: r.required(keys::HC_SINKHORN_ITERS, UINT)?,
            eps: r.required(keys::HC_EPS, FLOAT)?,
        },
        moe: read_moe(r)?,
        engram: read_engram(r)?,
        dspark: read_dspark(r)?,
        quant: read_quant(r)?,
    })
}

/// Keys that V4.1 fixes and [`ModelConfig`] therefore does not hold: accepted
/// when absent or equal to the V4.1 value, rejected otherwise (a V4 or other
/// model's config).
fn check_fixed_facts(r: &Reader) -> Result<(), ConfigError> {
    let texts: [(Key, &[&str], &'static str); 5] = [
        (
            keys::MODEL_TYPE,
            &["deepseek_v41", "deepseek_v41_text"],
            "not a DeepSeek-V4.1 config",
        ),
        (
            keys::TEXT_MODEL_TYPE,
            &["deepseek_v41", "deepseek_v41_text"],
            "not a DeepSeek-V4.1 config",
        ),
        (
            keys::TOPK_METHOD,
            &["noaux_tc"],
            "V4.1 routes by noaux_tc (the bias only selects)",
        ),
        (keys::ROPE_TYPE, &["yarn"], "ratio > 0 layers use YaRN"),
        (keys::SCALE_FMT, &["ue8m0"], "V4.1 scales are E8M0 (ue8m0)"),
    ];
    for (key, allowed, why) in texts {
        if let Some(value) = r.optional(key, TEXT)?
            && !allowed.contains(&value.as_str())
        {
            return Err(ConfigError::Unsupported {
                key,
                value: format!("{value:?}"),
                why,
            });
        }
    }
    let counts: [(Key, usize, &'static str); 2] = [
        (
            keys::N_KV_HEADS,
            1,
            "V4.1 attention is MQA (one latent is both K and V)",
        ),
        (
            keys::NUM_HASH_LAYERS,
            0,
            "hash-routed MoE layers are V4-style; V4.1 has none",
        ),
    ];
    for (key, allowed, why) in counts {
        if let Some(value) = r.optional(key, UINT)?
            && value != allowed
        {
            return Err(ConfigError::Unsupported {
                key,
                value: value.to_string(),
                why,
            });
        }
    }
    Ok(())
}

fn read_attention(r: &Reader) -> Result<AttentionConfig, ConfigError> {
    Ok(AttentionConfig {
        n_heads: r.required(keys::N_HEADS, UINT)?,
        head_dim: r.required(keys::HEAD_DIM, UINT)?,
        rope_head_dim: r.required(keys::ROPE_HEAD_DIM, UINT)?,
        q_lora_rank: r.required(keys::Q_LORA_RANK, UINT)?,
        o_groups: r.required(keys::O_GROUPS, UINT)?,
        o_lora_rank: r.required(keys::O_LORA_RANK, UINT)?,
        window: r.required(keys::WINDOW, UINT)?,
    })
}

fn read_rope(r: &Reader) -> Result<RopeConfig, ConfigError> {
    Ok(RopeConfig {
        theta: r.required(keys::ROPE_THETA, FLOAT)?,
        compress_theta: r.required(keys::COMPRESS_ROPE_THETA, FLOAT)?,
        yarn: YarnConfig {
            factor: r.required(keys::YARN_FACTOR, FLOAT)?,
            original_seq_len: r.required(keys::YARN_ORIGINAL_LEN, UINT)?,
            beta_fast: r.required(keys::BETA_FAST, FLOAT)?,
            beta_slow: r.required(keys::BETA_SLOW, FLOAT)?,
        },
    })
}

/// `candidate_source_layer` -1 disables the pre-filter; its other keys are
/// then not read.
fn read_candidate(r: &Reader) -> Result<Option<CandidateConfig>, ConfigError> {
    let source = r.required(keys::CANDIDATE_SOURCE, INT)?;
    if source == -1 {
        return Ok(None);
    }
    let source_layer = usize::try_from(source).map_err(|_| ConfigError::BadValue {
        key: keys::CANDIDATE_SOURCE,
        value: source.to_string(),
        why: "must be a layer id, or -1 to disable the candidate pre-filter".into(),
    })?;
    Ok(Some(CandidateConfig {
        source_layer,
        topk_blocks: r.required(keys::CANDIDATE_TOPK_BLOCKS, UINT)?,
        block_size: r.required(keys::CANDIDATE_BLOCK_SIZE, UINT)?,
    }))
}

/// `norm_topk_prob` defaults to true and `gate_temp` to 1.0, the reference
/// defaults (the flat form carries neither).
fn read_moe(r: &Reader) -> Result<MoeConfig, ConfigError> {
    let score_func = r.required(keys::SCORE_FUNC, TEXT)?;
    Ok(MoeConfig {
        n_routed_experts: r.required(keys::N_ROUTED_EXPERTS, UINT)?,
        n_activated_experts: r.required(keys::N_ACTIVATED_EXPERTS, UINT)?,
        n_shared_experts: r.required(keys::N_SHARED_EXPERTS, UINT)?,
        inter_dim: r.required(keys::MOE_INTER_DIM, UINT)?,
        score_func: match score_func.as_str() {
            "softmax" => ScoreFunc::Softmax,
            "sigmoid" => ScoreFunc::Sigmoid,
            "sqrtsoftplus" => ScoreFunc::SqrtSoftplus,
            _ => {
                return Err(ConfigError::Unsupported {
                    key: keys::SCORE_FUNC,
                    value: format!("{score_func:?}"),
                    why: "expected softmax, sigmoid or sqrtsoftplus",
                });
            }
        },
        route_scale: r.required(keys::ROUTE_SCALE, FLOAT)?,
        norm_topk_prob: r.optional(keys::NORM_TOPK_PROB, BOOL)?.unwrap_or(true),
        gate_temp: r.optional(keys::GATE_TEMP, FLOAT)?.unwrap_or(1.0),
        swiglu_limit: r.required(keys::SWIGLU_LIMIT, FLOAT)?,
    })
}

fn read_engram(r: &Reader) -> Result<EngramConfig, ConfigError> {
    Ok(EngramConfig {
        layer_ids: r.required(keys::ENGRAM_LAYERS, UINTS)?,
        table_rows: r.required(keys::ENGRAM_TABLE_ROWS, UINT64S)?,
        max_ngram: r.required(keys::ENGRAM_MAX_NGRAM, UINT)?,
        n_heads: r.required(keys::ENGRAM_N_HEADS, UINT)?,
        head_dim: r.required(keys::ENGRAM_HEAD_DIM, UINT)?,
        hash_space: r.required(keys::ENGRAM_HASH_SPACE, UINT64)?,
        compressed_vocab: r.required(keys::ENGRAM_COMPRESSED_VOCAB, UINT)?,
        pad_id: r.required(keys::ENGRAM_PAD_ID, TOKEN)?,
    })
}

fn read_dspark(r: &Reader) -> Result<DsparkConfig, ConfigError> {
    Ok(DsparkConfig {
        n_stages: r.required(keys::DSPARK_STAGES, UINT)?,
        block_size: r.required(keys::DSPARK_BLOCK_SIZE, UINT)?,
        noise_token_id: r.required(keys::DSPARK_NOISE_TOKEN, TOKEN)?,
        target_layers: r.required(keys::DSPARK_TARGETS, UINTS)?,
        markov_rank: r.required(keys::DSPARK_MARKOV_RANK, UINT)?,
        n_routed_experts: r.required(keys::DSPARK_N_ROUTED_EXPERTS, UINT)?,
        n_activated_experts: r.required(keys::DSPARK_N_ACTIVATED_EXPERTS, UINT)?,
    })
}

/// The dense format is required (`quant_method` / `dtype`); the expert
/// format defaults to it and the weight block to 32 × 32.
fn read_quant(r: &Reader) -> Result<QuantConfig, ConfigError> {
    let weights = read_format(r, keys::WEIGHT_DTYPE)?.ok_or(ConfigError::MissingKey {
        form: r.form,
        key: keys::WEIGHT_DTYPE.name(r.form),
    })?;
    Ok(QuantConfig {
        weights,
        experts: read_format(r, keys::EXPERT_DTYPE)?.unwrap_or(weights),
        weight_block: r
            .optional(keys::WEIGHT_BLOCK, PAIR)?
            .unwrap_or([BLOCK, BLOCK]),
    })
}

fn read_format(r: &Reader, key: Key) -> Result<Option<WeightFormat>, ConfigError> {
    let Some(name) = r.optional(key, TEXT)? else {
        return Ok(None);
    };
    match name.as_str() {
        "bf16" | "bfloat16" => Ok(Some(WeightFormat::Bf16)),
        "fp8" => Ok(Some(WeightFormat::Fp8)),
        "fp4" => Ok(Some(WeightFormat::Fp4)),
        _ => Err(ConfigError::Unsupported {
            key,
            value: format!("{name:?}"),
            why: "expected bf16, fp8 or fp4",
        }),
    }
}
