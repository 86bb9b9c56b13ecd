//! The config keys: [`ConfigForm`] (which file layout), [`Key`] (one key as
//! each form spells it) and a constant for every key the loader reads.
//!
//! Invariant: [`Key::name`] is the path the form's file uses (dotted from
//! the Hugging Face root); `Display` shows both spellings
//! (`` `hf`/`flat` ``, without `text_config.`), so an error that names a
//! `Key` reads the same whichever form was loaded.

use std::fmt;

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

const fn key(hf: &'static str, flat: &'static str) -> Key {
    Key { hf, flat }
}

// Every key the loader reads.
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
pub const COMPRESS_ROPE_THETA: Key = key("text_config.compress_rope_theta", "compress_rope_theta");
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
pub const N_ACTIVATED_EXPERTS: Key = key("text_config.num_experts_per_tok", "n_activated_experts");
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
pub const ENGRAM_MAX_NGRAM: Key = key("text_config.engram_max_ngram_size", "engram_max_ngram_size");
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
