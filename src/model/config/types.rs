//! The typed model configuration: [`ModelConfig`] and the per-component
//! structs it holds, plus the small accessors that only read fields.
//!
//! Invariant: these are plain data. A value built by hand has not been
//! checked; only configs returned by the loaders (or that pass
//! [`ModelConfig::validate`]) satisfy the invariants of the parent module.

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

impl ModelConfig {
    /// Backbone layers plus DSpark stages: the length of `compress_ratios`.
    pub fn n_total_layers(&self) -> usize {
        self.n_layers + self.dspark.n_stages
    }

    /// The longest sequence its positions are trained for: YaRN's original
    /// length × factor (1,048,576 for V4.1, its `max_position_embeddings`);
    /// without YaRN, unbounded (`usize::MAX`; the engine caps it).
    pub fn max_position(&self) -> usize {
        let y = &self.rope.yarn;
        if y.original_seq_len == 0 {
            return usize::MAX;
        }
        let n = y.original_seq_len as f64 * y.factor.max(1.0);
        #[allow(
            clippy::cast_possible_truncation,
            reason = "f64 → usize saturates, and n is in [0, usize::MAX) here"
        )]
        let m = if n >= usize::MAX as f64 {
            usize::MAX
        } else {
            n as usize
        };
        m
    }
}
