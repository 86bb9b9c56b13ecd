//! Validation of a whole config: [`ModelConfig::validate`] and the value
//! checks it runs (non-zero sizes, block multiples, dims, floats, token ids,
//! weight formats, expert counts) before the Engram and layer-role checks.
//!
//! Invariant: checks run in a fixed order and the first failure is returned,
//! so one config always yields the same error.

use super::error::ConfigError;
use super::keys::{self, Key};
use super::types::{ModelConfig, WeightFormat};
use crate::contract::{MHC_MAX_SINKHORN_ITERS, MOE_MAX_EXPERTS, MX_BLOCK};

/// One documented maximum: the key, the limit, V4.1-Flash's value and how
/// to read the value from a config.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub key: Key,
    pub max: u64,
    pub v41: u64,
    pub value: fn(&ModelConfig) -> usize,
}

const fn limit(key: Key, max: u64, v41: u64, value: fn(&ModelConfig) -> usize) -> Limit {
    Limit {
        key,
        max,
        v41,
        value,
    }
}

/// Documented maxima of every config size that scales memory or a loop.
/// Each limit is at least 8× the value V4.1-Flash uses, so any real model
/// of the family fits, while a typo of a few orders of magnitude is refused
/// before anything is allocated.
pub const LIMITS: [Limit; 26] = [
    limit(keys::VOCAB_SIZE, 1 << 21, 129_280, |c| c.vocab_size),
    limit(keys::HIDDEN_SIZE, 1 << 16, 5120, |c| c.hidden_size),
    limit(keys::N_LAYERS, 512, 40, |c| c.n_layers),
    limit(keys::N_HEADS, 1024, 64, |c| c.attention.n_heads),
    limit(keys::HEAD_DIM, 4096, 512, |c| c.attention.head_dim),
    limit(keys::Q_LORA_RANK, 1 << 16, 1280, |c| {
        c.attention.q_lora_rank
    }),
    limit(keys::O_GROUPS, 1024, 8, |c| c.attention.o_groups),
    limit(keys::O_LORA_RANK, 1 << 16, 1024, |c| {
        c.attention.o_lora_rank
    }),
    limit(keys::WINDOW, 1 << 16, 128, |c| c.attention.window),
    limit(keys::INDEX_N_HEADS, 1024, 32, |c| c.indexer.n_heads),
    limit(keys::INDEX_HEAD_DIM, 4096, 128, |c| c.indexer.head_dim),
    limit(keys::INDEX_TOPK, 1 << 16, 512, |c| c.indexer.topk),
    limit(keys::CANDIDATE_TOPK_BLOCKS, 1 << 16, 2048, |c| {
        c.candidate.map_or(0, |x| x.topk_blocks)
    }),
    limit(keys::CANDIDATE_BLOCK_SIZE, 1 << 16, 8, |c| {
        c.candidate.map_or(0, |x| x.block_size)
    }),
    limit(keys::HC_MULT, 64, 4, |c| c.mhc.mult),
    limit(
        keys::HC_SINKHORN_ITERS,
        MHC_MAX_SINKHORN_ITERS as u64,
        20,
        |c| c.mhc.sinkhorn_iters,
    ),
    limit(keys::N_ROUTED_EXPERTS, MOE_MAX_EXPERTS as u64, 384, |c| {
        c.moe.n_routed_experts
    }),
    limit(keys::N_SHARED_EXPERTS, 64, 1, |c| c.moe.n_shared_experts),
    limit(keys::MOE_INTER_DIM, 1 << 17, 2304, |c| c.moe.inter_dim),
    limit(keys::ENGRAM_MAX_NGRAM, 32, 4, |c| c.engram.max_ngram),
    limit(keys::ENGRAM_N_HEADS, 256, 8, |c| c.engram.n_heads),
    limit(keys::ENGRAM_HEAD_DIM, 4096, 256, |c| c.engram.head_dim),
    limit(keys::DSPARK_STAGES, 64, 3, |c| c.dspark.n_stages),
    limit(keys::DSPARK_BLOCK_SIZE, 256, 5, |c| c.dspark.block_size),
    limit(keys::DSPARK_MARKOV_RANK, 1 << 16, 256, |c| {
        c.dspark.markov_rank
    }),
    limit(
        keys::DSPARK_N_ROUTED_EXPERTS,
        MOE_MAX_EXPERTS as u64,
        128,
        |c| c.dspark.n_routed_experts,
    ),
];

/// Rows of one Engram table at most (V4.1: 384,016,682, 101 GB).
pub const ENGRAM_TABLE_ROWS_LIMIT: u64 = 1 << 32;

/// Engram hash primes at most: layers × (max_ngram − 1) × heads (V4.1: 2 ×
/// 3 × 8 = 48). Each is searched for at load, so this bounds the time a
/// config takes to validate (4096 primes near 2^62: about 0.1 s).
pub const ENGRAM_PRIMES_LIMIT: usize = 4096;

impl ModelConfig {
    /// Checks every value and the layer roles; the loaders call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_nonzero()?;
        self.check_limits()?;
        self.check_block_multiples()?;
        self.check_dims()?;
        self.check_floats()?;
        self.check_tokens()?;
        self.check_quant()?;
        self.check_experts()?;
        // Before the Engram primes: their count grows with the list length.
        self.check_layer_lists()?;
        self.engram.check(self.vocab_size)?;
        self.layer_plans().map(drop)
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

    /// Every size that scales memory or a loop against [`LIMITS`]; the
    /// floats that are only meaningful small (epsilons) against 0.1.
    fn check_limits(&self) -> Result<(), ConfigError> {
        for l in LIMITS {
            let v = (l.value)(self) as u64;
            if v > l.max {
                return Err(ConfigError::TooLarge {
                    key: l.key,
                    value: v,
                    limit: l.max,
                    v41: l.v41,
                });
            }
        }
        let e = &self.engram;
        if let Some(&rows) = e.table_rows.iter().max()
            && rows > ENGRAM_TABLE_ROWS_LIMIT
        {
            return Err(ConfigError::TooLarge {
                key: keys::ENGRAM_TABLE_ROWS,
                value: rows,
                limit: ENGRAM_TABLE_ROWS_LIMIT,
                v41: 384_016_682,
            });
        }
        for (key, eps) in [
            (keys::NORM_EPS, self.norm_eps),
            (keys::HC_EPS, self.mhc.eps),
        ] {
            if eps > 0.1 {
                return Err(ConfigError::BadValue {
                    key,
                    value: eps.to_string(),
                    why: "an epsilon above 0.1 swamps the statistic it guards".into(),
                });
            }
        }
        let y = &self.rope.yarn;
        if y.factor > 1.0 && y.original_seq_len == 0 {
            return Err(ConfigError::BadValue {
                key: keys::YARN_ORIGINAL_LEN,
                value: "0".into(),
                why: format!(
                    "YaRN scaling ({} = {}) needs the original length",
                    keys::YARN_FACTOR,
                    y.factor
                ),
            });
        }
        Ok(())
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
            .find(|&(_, width)| !width.is_multiple_of(MX_BLOCK))
        {
            Some((key, value)) => Err(ConfigError::NotMultiple {
                key,
                value,
                of: format!("{MX_BLOCK}, the FP8/FP4 block width"),
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
        if q.weight_block != [MX_BLOCK, MX_BLOCK] {
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
}
