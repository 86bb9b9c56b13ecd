//! The DSpark drafter's forward (`v41-flash.md` §9): target features from
//! the backbone, per-stage rings of projected features (in the sequence's
//! pool pages), the bidirectional 5-row draft block through the stages, and
//! the Markov and confidence heads. Verification and scheduling are the
//! engine's.
//!
//! Invariant: a stage ring holds the projected target features of the
//! positions seeded so far (the last `window` of them); a draft at
//! position p reads the features of p and the real next token t_(p+1). The
//! block's own rows are written past p only for the draft's attention and
//! are overwritten by later seeds before any list reads them.

use super::batch::{Batch, Entry};
use super::forward::Model;
use super::layers::Block;
use super::layers::attention::stage_list;
use super::layers::linear::{Bf16Linear, Fp8Linear};
use super::pool::{SeqId, StatePool};
use crate::contract::{HC_STREAMS, ONE_HOT_PRE, RopeParams};
use crate::model::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// The drafter's weights (`mtp.*`).
#[derive(Clone, Debug)]
pub struct DsparkWeights {
    /// `[D, targets · D]`.
    pub main_proj: Fp8Linear,
    pub main_norm: Tensor,
    pub stages: Vec<Block>,
    /// The last stage's `norm`.
    pub norm: Tensor,
    /// `[vocab, rank]` BF16.
    pub markov_embed: Tensor,
    /// `[vocab, rank]`, used as an fp32 GEMM.
    pub markov_head: Bf16Linear,
    /// `[1, D + rank]`, used as an fp32 GEMM.
    pub confidence: Bf16Linear,
}

/// Chooses draft i from its host fp32 logits (sampled drafting).
pub type Chooser<'a> = &'a mut dyn FnMut(usize, &[f32]) -> u32;

/// One draft block's output.
#[derive(Clone, Debug, PartialEq)]
pub struct Draft {
    /// token_1 … token_n (greedy).
    pub tokens: Vec<u32>,
    /// Confidence logit of each block position (σ of it is the conditional
    /// acceptance probability).
    pub confidence_logits: Vec<f32>,
}

impl Model {
    fn stage_rope(&self) -> RopeParams {
        RopeParams {
            theta: self.cfg.rope.theta,
            yarn: None,
        }
    }

    fn positions(&self, from: usize, n: usize) -> Result<Tensor> {
        let p: Vec<i64> = (from..from + n).map(|p| p as i64).collect();
        Ok(Tensor::from_vec(p, &[n])?.to_device(&self.device())?)
    }

    /// Writes the projected target features (`[len, targets·D]`, BF16) of
    /// positions `start ..` into every stage's ring of `seq` (prefill seeds
    /// all prompt positions this way).
    pub fn dspark_seed(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        seq: SeqId,
        features: &Tensor,
        start: usize,
    ) -> Result<()> {
        let width = self.cfg.dspark.target_layers.len() * self.cfg.hidden_size;
        let len = features.rows();
        if len == 0 || features.shape() != [len, width] {
            return Err(ops::shape_error(
                "dspark_seed",
                "features",
                features,
                format!("[T >= 1, {width}] (the target layers' features)"),
            )
            .into());
        }
        let main_x = ops::rms_norm(
            &dw.main_proj.forward(features)?,
            &dw.main_norm,
            crate::numerics::round_f32(self.cfg.norm_eps),
        )?;
        let positions = self.positions(start, len)?;
        for s in 0..dw.stages.len() {
            pool.reserve_ring(seq, pool.stage_ring(s), start + len)?;
        }
        for (s, stage) in dw.stages.iter().enumerate() {
            let rows = stage
                .attn
                .window_kv(&self.cfg, &main_x, &positions, &self.stage_rope())?;
            let ring = pool.stage_ring(s);
            pool.write_ring(seq, ring, start, &rows, 0, len)?;
            pool.trim_ring(seq, ring, start + len - 1)?;
        }
        Ok(())
    }

    /// Drafts after position `p` of `seq`, whose target features are
    /// `features` (`[1, targets·D]`) and whose real next token is `next`:
    /// seeds the rings with p, runs the block [next, noise × (n − 1)]
    /// through the stages, and applies the heads greedily.
    pub fn dspark_draft(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        seq: SeqId,
        features: &Tensor,
        p: usize,
        next: u32,
    ) -> Result<Draft> {
        self.draft_block(dw, pool, seq, features, p, next, None)
    }

    /// [`Model::dspark_draft`] with draft i chosen by `choose(i, logits_i)`
    /// (the host fp32 logits of block position i) instead of greedily: the
    /// Markov head chains through the chosen tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn dspark_draft_with(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        seq: SeqId,
        features: &Tensor,
        p: usize,
        next: u32,
        choose: Chooser,
    ) -> Result<Draft> {
        self.draft_block(dw, pool, seq, features, p, next, Some(choose))
    }

    #[allow(clippy::too_many_arguments)]
    fn draft_block(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        seq: SeqId,
        features: &Tensor,
        p: usize,
        next: u32,
        choose: Option<Chooser>,
    ) -> Result<Draft> {
        let cfg = &self.cfg;
        let (a, n) = (cfg.attention, cfg.dspark.block_size);
        let device = self.device();
        if features.rows() != 1 {
            return Err(ops::shape_error(
                "dspark_draft",
                "features",
                features,
                "one row: the features of position p".into(),
            )
            .into());
        }
        let next_id = i32::try_from(next)
            .ok()
            .filter(|&t| (t as usize) < cfg.vocab_size)
            .ok_or(crate::Error::Argument {
                op: "dspark_draft",
                arg: "next",
                value: next.to_string(),
                why: "token id is not below the vocabulary size",
            })?;
        self.dspark_seed(dw, pool, seq, features, p)?;
        for s in 0..dw.stages.len() {
            pool.reserve_ring(seq, pool.stage_ring(s), p + 1 + n)?;
        }
        let block: Vec<i32> = std::iter::once(next_id)
            .chain(std::iter::repeat_n(cfg.dspark.noise_token_id as i32, n - 1))
            .collect();
        let ids = Tensor::from_vec(block, &[n])?.to_device(&device)?;
        let mut streams = ops::hc_init(&ops::embedding(&self.weights.embed, &ids)?)?;
        let one_hot: Vec<f32> = (0..n).flat_map(|_| ONE_HOT_PRE).collect();
        let mut pre = Tensor::from_vec(one_hot, &[n, HC_STREAMS])?.to_device(&device)?;
        let positions = self.positions(p + 1, n)?;
        let rope = self.stage_rope();
        let hp = self.mhc_params();
        let b = Batch {
            entries: vec![Entry {
                seq,
                start: p + 1,
                len: n,
                replay: 0,
                row: 0,
            }],
            positions: positions.clone(),
        };
        for (s, stage) in dw.stages.iter().enumerate() {
            let ring = pool.stage_ring(s);
            let (x, mix) = stage
                .hc_attn
                .input(&streams, &mut pre, &stage.attn_norm, hp)?;
            let w = &stage.attn;
            let (q, _) = w.query(cfg, &x, &positions, &rope)?;
            let rows = w.window_kv(cfg, &x, &positions, &rope)?;
            pool.write_ring(seq, ring, p + 1, &rows, 0, n)?;
            let list = stage_list(pool, &b, ring, a.window, p)?;
            let f = w.attend(cfg, pool, &q, &list, None, &positions, &rope)?;
            streams = mix.expand(&streams, &f)?;
            let (x, mix) = stage
                .hc_ffn
                .input(&streams, &mut pre, &stage.ffn_norm, hp)?;
            let (f, _) = stage
                .ffn
                .forward(&x, self.moe_params(cfg.dspark.n_activated_experts))?;
            streams = mix.expand(&streams, &f)?;
        }
        let hidden = ops::hc_collapse(&streams, &pre)?;
        let base = self.weights.head.forward_f32(&ops::rms_norm(
            &hidden,
            &dw.norm,
            crate::numerics::round_f32(cfg.norm_eps),
        )?)?;
        self.markov_and_confidence(dw, &hidden, &base, next, choose)
    }

    /// The Markov head chained through the chosen tokens (greedy without
    /// `choose`), and the confidence head.
    fn markov_and_confidence(
        &self,
        dw: &DsparkWeights,
        hidden: &Tensor,
        base: &Tensor,
        first: u32,
        mut choose: Option<Chooser>,
    ) -> Result<Draft> {
        let n = hidden.rows();
        let device = self.device();
        let mut token = first;
        let mut draft = Draft {
            tokens: Vec::with_capacity(n),
            confidence_logits: Vec::with_capacity(n),
        };
        for i in 0..n {
            let id = Tensor::from_vec(vec![token as i32], &[1])?.to_device(&device)?;
            let e = ops::embedding(&dw.markov_embed, &id)?;
            let logits = ops::add(&base.narrow_rows(i, 1)?, &dw.markov_head.forward_f32(&e)?)?;
            let input = ops::cat_cols(&[&hidden.narrow_rows(i, 1)?, &e])?;
            let conf = dw.confidence.forward_f32(&input)?.to_vec::<f32>()?;
            draft.confidence_logits.extend(conf.first());
            token = match choose.as_mut() {
                Some(choose) => choose(i, &logits.to_vec::<f32>()?),
                None => super::runner::greedy_id(&logits)?,
            };
            draft.tokens.push(token);
        }
        Ok(draft)
    }
}
