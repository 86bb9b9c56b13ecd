//! The DSpark drafter's forward (`v41-flash.md` §9): target features from
//! the backbone, per-stage rings of projected features, the bidirectional
//! 5-row draft block through the stages, and the Markov and confidence heads.
//! Verification and scheduling are the engine's (a later issue).
//!
//! Invariant: the stage rings hold the projected target features of every
//! position seen so far (slot p mod window); a draft at position p reads the
//! features of p and the real next token t_(p+1).

use super::attention::output_projection;
use super::config::ModelConfig;
use super::ffn::moe;
use super::forward::Model;
use super::state::Ring;
use super::weights::{Bf16Linear, BlockWeights, Fp8Linear};
use crate::cpu_backend::kv_format::{decode_window_row, encode_window_row};
use crate::cpu_backend::mhc::{HC_STREAMS, ONE_HOT_PRE, hc_collapse};
use crate::cpu_backend::sparse_attention::sparse_mqa;
use crate::cpu_backend::{RopeParams, f32_gemm, inverse_rope, rms_norm, rope};
use half::bf16;

/// The drafter's weights (`mtp.*`).
#[derive(Clone, Debug)]
pub struct DsparkWeights {
    /// `[D, targets · D]`.
    pub main_proj: Fp8Linear,
    pub main_norm: Vec<bf16>,
    pub stages: Vec<BlockWeights>,
    /// The last stage's `norm`.
    pub norm: Vec<bf16>,
    /// `[vocab, rank]`.
    pub markov_embed: Vec<bf16>,
    /// `[vocab, rank]`, used as an fp32 GEMM.
    pub markov_head: Bf16Linear,
    /// `[1, D + rank]`.
    pub confidence: Vec<bf16>,
}

/// The drafter's per-sequence state: one ring per stage.
#[derive(Clone, Debug)]
pub struct DsparkState {
    pub rings: Vec<Ring>,
}

/// One draft block's output.
#[derive(Clone, Debug, PartialEq)]
pub struct Draft {
    /// token_1 … token_n (greedy).
    pub tokens: Vec<u32>,
    /// Confidence logit of each block position (σ of it is the conditional
    /// acceptance probability).
    pub confidence_logits: Vec<f32>,
}

fn stage_rope(cfg: &ModelConfig) -> RopeParams {
    RopeParams {
        theta: cfg.rope.theta,
        yarn: None,
    }
}

impl Model {
    /// A fresh drafter state.
    pub fn new_dspark_state(&self) -> DsparkState {
        let a = self.cfg.attention;
        DsparkState {
            rings: (0..self.cfg.dspark.n_stages)
                .map(|_| Ring::new(a.window, a.head_dim))
                .collect(),
        }
    }

    /// main_x = main_norm(main_proj(features)) for `[len, targets·D]` features.
    fn main_x(&self, dw: &DsparkWeights, features: &[bf16], len: usize) -> Vec<bf16> {
        let d = self.cfg.hidden_size;
        rms_norm(
            &dw.main_proj.forward(features, len),
            &dw.main_norm,
            len,
            d,
            self.cfg.norm_eps as f32,
        )
    }

    /// Writes the projected target features of positions `start ..` into
    /// every stage's ring (prefill seeds all prompt positions this way).
    pub fn dspark_seed(
        &self,
        dw: &DsparkWeights,
        features: &[bf16],
        start: usize,
        state: &mut DsparkState,
    ) {
        let cfg = &self.cfg;
        let (d, a) = (cfg.hidden_size, cfg.attention);
        let len = features.len() / (cfg.dspark.target_layers.len() * d);
        let main_x = self.main_x(dw, features, len);
        let positions: Vec<i64> = (start..start + len).map(|p| p as i64).collect();
        for (stage, ring) in dw.stages.iter().zip(&mut state.rings) {
            let kv = rms_norm(
                &stage.attn.wkv.forward(&main_x, len),
                &stage.attn.kv_norm,
                len,
                a.head_dim,
                cfg.norm_eps as f32,
            );
            let kv = rope(
                &kv,
                &positions,
                1,
                a.head_dim,
                a.rope_head_dim,
                &stage_rope(cfg),
            );
            for (i, row) in kv.chunks(a.head_dim).enumerate() {
                ring.write(start + i, encode_window_row(row));
            }
        }
    }

    /// Drafts after position `p`, whose target features are `features`
    /// (`[targets·D]`) and whose real next token is `next`: seeds the rings
    /// with p, runs the block [next, noise × (n − 1)] through the stages, and
    /// applies the heads greedily.
    pub fn dspark_draft(
        &self,
        dw: &DsparkWeights,
        features: &[bf16],
        p: usize,
        next: u32,
        state: &mut DsparkState,
    ) -> Draft {
        let cfg = &self.cfg;
        let (d, a, n) = (cfg.hidden_size, cfg.attention, cfg.dspark.block_size);
        let eps = cfg.norm_eps as f32;
        self.dspark_seed(dw, features, p, state);
        let block: Vec<u32> = std::iter::once(next)
            .chain(std::iter::repeat_n(cfg.dspark.noise_token_id, n - 1))
            .collect();
        let mut streams: Vec<Vec<bf16>> = block
            .iter()
            .map(|&t| self.weights.embed[t as usize * d..(t as usize + 1) * d].repeat(HC_STREAMS))
            .collect();
        let mut pre = vec![ONE_HOT_PRE; n];
        let positions: Vec<i64> = (p + 1..=p + n).map(|q| q as i64).collect();
        let (h, hd, rd) = (a.n_heads, a.head_dim, a.rope_head_dim);
        let rp = stage_rope(cfg);
        for (stage, ring) in dw.stages.iter().zip(&state.rings) {
            let (splits, x) =
                self.sublayer_input(&stage.hc_attn, &stage.attn_norm, &streams, &mut pre);
            let w = &stage.attn;
            let qr = rms_norm(&w.wq_a.forward(&x, n), &w.q_norm, n, a.q_lora_rank, eps);
            let q = rope(&w.wq_b.forward(&qr, n), &positions, h, hd, rd, &rp);
            let kv = rms_norm(&w.wkv.forward(&x, n), &w.kv_norm, n, hd, eps);
            let mut rows = ring.rows();
            rows.extend(
                rope(&kv, &positions, 1, hd, rd, &rp)
                    .chunks(hd)
                    .flat_map(|r| decode_window_row(&encode_window_row(r), hd)),
            );
            let list: Vec<i32> = (0..a.window.min(p + 1))
                .chain(a.window..a.window + n)
                .map(|i| i as i32)
                .collect();
            let o: Vec<bf16> = (0..n)
                .flat_map(|i| {
                    sparse_mqa(&q[i * h * hd..(i + 1) * h * hd], &rows, &list, &w.sink, hd).out
                })
                .collect();
            let f = output_projection(cfg, w, &inverse_rope(&o, &positions, h, hd, rd, &rp), n);
            super::forward::expand(&mut streams, &f, &splits, d);
            let (splits, x) =
                self.sublayer_input(&stage.hc_ffn, &stage.ffn_norm, &streams, &mut pre);
            let (f, _) = moe(cfg, &stage.ffn, cfg.dspark.n_activated_experts, &x, n);
            super::forward::expand(&mut streams, &f, &splits, d);
        }
        let hidden: Vec<bf16> = streams
            .iter()
            .zip(&pre)
            .flat_map(|(s, pr)| hc_collapse(s, pr))
            .collect();
        let base = self
            .weights
            .head
            .forward_f32(&rms_norm(&hidden, &dw.norm, n, d, eps), n);
        self.markov_and_confidence(dw, &hidden, &base, next)
    }

    /// The Markov head chained through greedy samples, and the confidence head.
    fn markov_and_confidence(
        &self,
        dw: &DsparkWeights,
        hidden: &[bf16],
        base: &[f32],
        first: u32,
    ) -> Draft {
        let (d, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let rank = self.cfg.dspark.markov_rank;
        let n = hidden.len() / d;
        let mut token = first;
        let mut draft = Draft {
            tokens: Vec::with_capacity(n),
            confidence_logits: Vec::with_capacity(n),
        };
        for i in 0..n {
            let e = &dw.markov_embed[token as usize * rank..(token as usize + 1) * rank];
            let bias = dw.markov_head.forward_f32(e, 1);
            let logits: Vec<f32> = base[i * vocab..(i + 1) * vocab]
                .iter()
                .zip(&bias)
                .map(|(a, b)| a + b)
                .collect();
            let mut input = hidden[i * d..(i + 1) * d].to_vec();
            input.extend_from_slice(e);
            draft
                .confidence_logits
                .push(f32_gemm(&input, &dw.confidence, 1, 1, d + rank)[0]);
            token = argmax(&logits);
            draft.tokens.push(token);
        }
        draft
    }
}

/// Index of the largest logit, ties to the lowest id.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
