//! Loading a [`ModelConfig`] from either official JSON form (the Hugging
//! Face `config.json` or the flat `inference-config.json`): the public
//! loaders and the mapping of keys onto the typed config. Both forms share
//! this code; only the key spellings differ ([`Key::name`]).
//!
//! Invariant: every loader validates before returning, so a config it
//! returns has passed [`ModelConfig::validate`].

use crate::contract::MX_BLOCK;
use std::path::Path;

use serde_json::Value;

use super::error::ConfigError;
use super::keys::{self, ConfigForm, Key};
use super::reader::{
    BOOL, FLOAT, INT, PAIR, Reader, TEXT, TOKEN, UINT, UINT64, UINT64S, UINTS, shown,
};
use super::types::{
    AttentionConfig, CandidateConfig, DsparkConfig, EngramConfig, IndexerConfig, MhcConfig,
    ModelConfig, MoeConfig, QuantConfig, RopeConfig, ScoreFunc, SpecialTokens, WeightFormat,
    YarnConfig,
};

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
            .unwrap_or([MX_BLOCK, MX_BLOCK]),
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
