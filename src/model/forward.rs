//! The V4.1 text model on the CPU reference backend: embedding into the
//! mHC streams, Engram before its blocks, attention and MoE sublayers with
//! the single-pass mHC (lagged pre, one-hot first pre), and the final
//! collapse, norm and fp32 head (`v41-flash.md` §4–§8).
//!
//! Invariant: [`Model::forward`] takes either a whole prompt on a fresh
//! state (prefill) or one token at a time afterwards (decode); each call
//! returns fp32 logits for every token it was given. Decoding token t gives
//! the same logits as a prefill of the first t + 1 tokens.

use super::attention::{Call, Published, attention};
use super::config::{LayerPlan, ModelConfig, ScoreFunc};
use super::ffn::moe;
use super::state::{LayerState, Ring, SequenceState, SourceCaches};
use super::weights::{EngramWeights, HcWeights, ModelWeights};
use crate::cpu_backend::engram::{gate, gather_rows, ngram_hashes, ngram_ids, table_rows, update};
use crate::cpu_backend::mhc::{
    HC_STREAMS, HcSplit, ONE_HOT_PRE, hc_collapse, hc_expand, hc_mixes, hc_split,
};
use crate::cpu_backend::rms_norm;
use crate::error::{Error, Result};
use half::bf16;

/// What a forward call returns for its `len` tokens.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// `[len, vocab]` fp32 logits.
    pub logits: Vec<f32>,
    /// `[len, targets · D]` DSpark target features: the streams entering
    /// each target layer, averaged over the 4 streams (BF16).
    pub features: Vec<bf16>,
    /// Per backbone layer, each token's selected experts (ascending).
    pub routing: Vec<Vec<Vec<usize>>>,
    /// Per backbone layer, each token's compressed index list (with the
    /// window offset; empty for window-only layers).
    pub index_lists: Vec<Vec<Vec<i32>>>,
}

/// A loaded model: its config, derived layer plans and weights.
pub struct Model {
    pub cfg: ModelConfig,
    pub plans: Vec<LayerPlan>,
    pub weights: ModelWeights,
}

fn invalid(arg: &'static str, value: String, why: &'static str) -> Error {
    Error::Argument {
        op: "Model",
        arg,
        value,
        why,
    }
}

impl Model {
    /// Checks that the weights fit the config's layer roles.
    pub fn new(cfg: ModelConfig, weights: ModelWeights) -> Result<Model> {
        let plans = cfg.layer_plans()?;
        if cfg.moe.score_func != ScoreFunc::SqrtSoftplus {
            return Err(invalid(
                "score_func",
                format!("{:?}", cfg.moe.score_func),
                "only sqrtsoftplus routing is implemented",
            ));
        }
        if weights.blocks.len() != cfg.n_layers {
            return Err(invalid(
                "blocks",
                weights.blocks.len().to_string(),
                "one block of weights per backbone layer",
            ));
        }
        let has_engram = !cfg.engram.layer_ids.is_empty();
        if has_engram && weights.engram_token_map.len() != cfg.vocab_size {
            return Err(invalid(
                "engram_token_map",
                weights.engram_token_map.len().to_string(),
                "the Engram token map needs one compressed id per vocabulary entry",
            ));
        }
        for (plan, b) in plans.iter().zip(&weights.blocks) {
            let a = &b.attn;
            let keys = a.indexer.as_ref().is_some_and(|i| i.keys.is_some());
            if a.compressor.is_some() != plan.is_kv_source()
                || a.indexer.is_some() != plan.is_index_source()
                || keys != plan.owns_index_keys()
                || b.engram.is_some() != plan.engram.is_some()
            {
                return Err(invalid(
                    "blocks",
                    format!("layer {}", plan.layer),
                    "the weights' compressor, indexer or Engram parts contradict the layer's role",
                ));
            }
        }
        Ok(Model {
            cfg,
            plans,
            weights,
        })
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> SequenceState {
        let a = self.cfg.attention;
        SequenceState {
            pos: 0,
            layers: self.plans[..self.cfg.n_layers]
                .iter()
                .map(|p| LayerState {
                    ring: Ring::new(a.window, a.head_dim),
                    source: p.is_kv_source().then(SourceCaches::default),
                })
                .collect(),
            engram_history: Vec::new(),
        }
    }

    /// Runs `tokens` at positions `state.pos ..`. A call with more than one
    /// token must start a sequence.
    pub fn forward(&self, tokens: &[u32], state: &mut SequenceState) -> Result<ForwardOutput> {
        let cfg = &self.cfg;
        if tokens.is_empty() {
            return Err(invalid("tokens", "[]".into(), "the prompt is empty"));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(invalid(
                "tokens",
                t.to_string(),
                "token id is not below the vocabulary size",
            ));
        }
        if state.pos > 0 && tokens.len() > 1 {
            return Err(invalid(
                "tokens",
                tokens.len().to_string(),
                "after the prompt, tokens are decoded one at a time (chunked prefill is not implemented)",
            ));
        }
        let (d, len) = (cfg.hidden_size, tokens.len());
        let call = Call {
            start: state.pos,
            len,
        };
        let map = &self.weights.engram_token_map;
        if !map.is_empty() {
            state
                .engram_history
                .extend(tokens.iter().map(|&t| Some(map[t as usize])));
        }

        let mut streams: Vec<Vec<bf16>> = tokens
            .iter()
            .map(|&t| self.weights.embed[t as usize * d..(t as usize + 1) * d].repeat(HC_STREAMS))
            .collect();
        let mut pre = vec![ONE_HOT_PRE; len];
        let mut published = Published::default();
        let n_targets = cfg.dspark.target_layers.len();
        let mut features = vec![bf16::ZERO; len * n_targets * d];
        let (mut routing, mut index_lists) = (Vec::new(), Vec::new());
        for (plan, block) in self.plans.iter().zip(&self.weights.blocks) {
            if let Some(e) = &block.engram {
                self.engram(e, call, &mut streams, &state.engram_history);
            }
            if let Some(i) = plan.dspark_target {
                for (t, s) in streams.iter().enumerate() {
                    let at = (t * n_targets + i) * d;
                    for (x, f) in features[at..at + d].iter_mut().enumerate() {
                        let sum: f32 = (0..HC_STREAMS).map(|c| s[c * d + x].to_f32()).sum();
                        *f = bf16::from_f32(sum / HC_STREAMS as f32);
                    }
                }
            }
            let (splits, x) =
                self.sublayer_input(&block.hc_attn, &block.attn_norm, &streams, &mut pre);
            let (f, lists) = attention(
                cfg,
                plan,
                &block.attn,
                &x,
                call,
                &mut state.layers,
                &mut published,
            );
            if std::env::var("TRACE").is_ok() {
                eprintln!(
                    "T {} attn_in {} attn_out {} apost {:?}",
                    plan.layer,
                    x[(len - 1) * d..]
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.to_f64() * (i + 1) as f64)
                        .sum::<f64>(),
                    f[(len - 1) * d..]
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.to_f64() * (i + 1) as f64)
                        .sum::<f64>(),
                    splits[len - 1].post
                );
            }
            expand(&mut streams, &f, &splits, d);
            index_lists.push(lists);
            let (splits, x) =
                self.sublayer_input(&block.hc_ffn, &block.ffn_norm, &streams, &mut pre);
            let (f, selected) = moe(cfg, &block.ffn, cfg.moe.n_activated_experts, &x, len);
            if std::env::var("TRACE").is_ok() {
                eprintln!(
                    "T {} ffn_in {} ffn_out {}",
                    plan.layer,
                    x[(len - 1) * d..].iter().map(|v| v.to_f64()).sum::<f64>(),
                    f[(len - 1) * d..].iter().map(|v| v.to_f64()).sum::<f64>()
                );
            }
            expand(&mut streams, &f, &splits, d);
            if std::env::var("TRACE").is_ok() {
                eprintln!(
                    "T {} streams {} pre {:?} postc {:?}",
                    plan.layer,
                    streams[len - 1].iter().map(|v| v.to_f64()).sum::<f64>(),
                    pre[len - 1],
                    splits[len - 1].post
                );
            }
            routing.push(selected);
        }
        state.pos += len;
        Ok(ForwardOutput {
            logits: self.head(&streams, &pre),
            features,
            routing,
            index_lists,
        })
    }

    /// The sublayer's mHC: mixes and split from the current streams, the
    /// collapse with the lagged pre (then replaced by this sublayer's pre),
    /// and the sublayer norm. Returns (splits, normed input `[len, D]`).
    pub(super) fn sublayer_input(
        &self,
        hc: &HcWeights,
        norm: &[bf16],
        streams: &[Vec<bf16>],
        pre: &mut [[f32; 4]],
    ) -> (Vec<HcSplit>, Vec<bf16>) {
        let cfg = &self.cfg;
        let eps = cfg.norm_eps as f32;
        let mut splits = Vec::with_capacity(streams.len());
        let mut u = Vec::with_capacity(streams.len() * cfg.hidden_size);
        for (s, p) in streams.iter().zip(pre.iter_mut()) {
            let m = hc_mixes(s, &hc.func, eps);
            let split = hc_split(
                &m,
                &hc.scale,
                &hc.base,
                cfg.mhc.eps as f32,
                cfg.mhc.sinkhorn_iters,
            );
            u.extend(hc_collapse(s, p));
            *p = split.pre;
            splits.push(split);
        }
        (
            splits,
            rms_norm(&u, norm, streams.len(), cfg.hidden_size, eps),
        )
    }

    /// Engram before a block: 24 hashed rows per token, projected to one key
    /// per stream and a shared value, gated per stream.
    fn engram(
        &self,
        e: &EngramWeights,
        call: Call,
        streams: &mut [Vec<bf16>],
        history: &[Option<i64>],
    ) {
        let cfg = &self.cfg;
        let d = cfg.hidden_size;
        let pad = self.weights.engram_token_map[cfg.engram.pad_id as usize];
        let eps = cfg.norm_eps as f32;
        let lookups: Vec<bf16> = (0..call.len)
            .flat_map(|i| {
                let ids = ngram_ids(&history[..call.start + i + 1], pad);
                let rows = table_rows(&ngram_hashes(&ids, &e.multipliers), &e.primes);
                gather_rows(&e.table, &rows, cfg.engram.head_dim)
            })
            .collect();
        let kv = e.wkv.forward(&lookups, call.len);
        let width = (HC_STREAMS + 1) * d;
        for (t, s) in streams.iter_mut().enumerate() {
            let kv_t = &kv[t * width..(t + 1) * width];
            let value = &kv_t[HC_STREAMS * d..];
            for c in 0..HC_STREAMS {
                let sc = &s[c * d..(c + 1) * d];
                let g = gate(
                    sc,
                    &kv_t[c * d..(c + 1) * d],
                    &e.q_weight[c * d..(c + 1) * d],
                    &e.k_weight[c * d..(c + 1) * d],
                    eps,
                );
                let new = update(sc, g, value);
                s[c * d..(c + 1) * d].copy_from_slice(&new);
            }
        }
    }

    /// Final collapse with the last pre, `norm`, and the fp32 head.
    fn head(&self, streams: &[Vec<bf16>], pre: &[[f32; 4]]) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let u: Vec<bf16> = streams
            .iter()
            .zip(pre)
            .flat_map(|(s, p)| hc_collapse(s, p))
            .collect();
        let h = rms_norm(
            &u,
            &self.weights.norm,
            streams.len(),
            d,
            self.cfg.norm_eps as f32,
        );
        self.weights.head.forward_f32(&h, streams.len())
    }
}

/// S ← expand(S, F, split) for every token.
pub(super) fn expand(streams: &mut [Vec<bf16>], f: &[bf16], splits: &[HcSplit], d: usize) {
    for ((s, split), ft) in streams.iter_mut().zip(splits).zip(f.chunks(d)) {
        *s = hc_expand(s, ft, split);
    }
}
