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
//! are overwritten by later seeds before any list reads them. Seeding and
//! drafting take several sequences at once, their rows stacked through the
//! row-wise ops, and leave each sequence bitwise what it gets alone.

use super::forward::Model;
use super::layers::Block;
use super::layers::attention::stage_list;
use super::layers::linear::{Bf16Linear, Fp8Linear, Normed};
use super::layers::mhc::Streams;
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

/// One sequence's draft in [`Model::dspark_draft_batch`]: the features of
/// its position `p` (`[1, targets·D]`), its real next token, and how its
/// drafts are chosen (`None`: greedily).
pub struct DraftRequest<'a> {
    pub seq: SeqId,
    pub features: &'a Tensor,
    pub p: usize,
    pub next: u32,
    pub choose: Option<Chooser<'a>>,
}

/// One sequence's seed in [`Model::dspark_seed_batch`]: the target
/// features (`[len, targets·D]`) of its positions `start .. start + len`.
pub struct SeedRequest<'a> {
    pub seq: SeqId,
    pub features: &'a Tensor,
    pub start: usize,
}

fn no_draft(op: &'static str) -> crate::model::error::Error {
    crate::Error::Argument {
        op,
        arg: "seq",
        value: "1 request".into(),
        why: "the batched draft returned no draft",
    }
    .into()
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

impl Model {
    fn stage_rope(&self) -> RopeParams {
        RopeParams {
            theta: self.cfg.rope.theta,
            yarn: None,
        }
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
        self.dspark_seed_batch(
            dw,
            pool,
            &[SeedRequest {
                seq,
                features,
                start,
            }],
        )
    }

    /// [`Model::dspark_seed`] for several sequences (distinct) in one pass:
    /// their rows are stacked through the projection, the norm and every
    /// stage's window K/V (all row-wise), then each sequence's rows go to
    /// its own rings, so every ring is bitwise what seeding it alone
    /// leaves. Every request is checked before any ring is written.
    pub fn dspark_seed_batch(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        reqs: &[SeedRequest],
    ) -> Result<()> {
        let _launching = self.launching();
        let width = self.cfg.dspark.target_layers.len() * self.cfg.hidden_size;
        let mut positions = Vec::new();
        for (k, r) in reqs.iter().enumerate() {
            let len = r.features.rows();
            if len == 0 || r.features.shape() != [len, width] {
                return Err(ops::shape_error(
                    "dspark_seed",
                    "features",
                    r.features,
                    format!("[T >= 1, {width}] (the target layers' features)"),
                )
                .into());
            }
            if reqs.iter().take(k).any(|o| o.seq == r.seq) {
                return Err(crate::Error::Argument {
                    op: "dspark_seed",
                    arg: "seq",
                    value: r.seq.to_string(),
                    why: "a sequence is seeded once per batch",
                }
                .into());
            }
            positions.extend((r.start..r.start + len).map(|q| q as i64));
        }
        let features: Vec<&Tensor> = reqs.iter().map(|r| r.features).collect();
        let stacked = match features.as_slice() {
            [] => return Ok(()),
            [one] => (*one).clone(),
            many => Tensor::cat_rows(many)?,
        };
        let main_x = Normed::new(
            &dw.main_proj.forward(&stacked)?,
            &dw.main_norm,
            crate::numerics::round_f32(self.cfg.norm_eps),
        )?;
        let rows = positions.len();
        let positions = Tensor::from_vec(positions, &[rows])?.to_device(&self.device())?;
        for (s, stage) in dw.stages.iter().enumerate() {
            let kv = stage
                .attn
                .window_kv(&self.cfg, &main_x, &positions, &self.stage_rope())?;
            let ring = pool.stage_ring(s);
            let mut at = 0;
            for r in reqs {
                let len = r.features.rows();
                pool.reserve_ring(r.seq, ring, r.start + len)?;
                pool.write_ring(r.seq, ring, r.start, &kv, at, len)?;
                pool.trim_ring(r.seq, ring, r.start + len - 1)?;
                at += len;
            }
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
        let mut one = [DraftRequest {
            seq,
            features,
            p,
            next,
            choose: None,
        }];
        let mut drafts = self.dspark_draft_batch(dw, pool, &mut one)?;
        drafts.pop().ok_or_else(|| no_draft("dspark_draft"))
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
        let mut one = [DraftRequest {
            seq,
            features,
            p,
            next,
            choose: Some(choose),
        }];
        let mut drafts = self.dspark_draft_batch(dw, pool, &mut one)?;
        drafts.pop().ok_or_else(|| no_draft("dspark_draft_with"))
    }

    /// The draft blocks of several sequences (distinct) in one pass through
    /// the stages: their rows are stacked for every row-wise op (norms,
    /// projections, MoE, heads), and the attention runs once per group of
    /// sequences whose lists have one width (all of them once every p + 1 ≥
    /// window), so each draft is bitwise what [`Model::dspark_draft_with`]
    /// gives it alone.
    pub fn dspark_draft_batch(
        &self,
        dw: &DsparkWeights,
        pool: &mut StatePool,
        reqs: &mut [DraftRequest],
    ) -> Result<Vec<Draft>> {
        let _launching = self.launching();
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = &self.cfg;
        let (a, n) = (cfg.attention, cfg.dspark.block_size);
        let device = self.device();
        let mut block = Vec::with_capacity(reqs.len() * n);
        let mut positions = Vec::with_capacity(reqs.len() * n);
        for (k, r) in reqs.iter().enumerate() {
            if r.features.rows() != 1 {
                return Err(ops::shape_error(
                    "dspark_draft",
                    "features",
                    r.features,
                    "one row: the features of position p".into(),
                )
                .into());
            }
            if reqs.iter().take(k).any(|o| o.seq == r.seq) {
                return Err(crate::Error::Argument {
                    op: "dspark_draft",
                    arg: "seq",
                    value: r.seq.to_string(),
                    why: "a sequence drafts once per batch",
                }
                .into());
            }
            let next_id = i32::try_from(r.next)
                .ok()
                .filter(|&t| (t as usize) < cfg.vocab_size)
                .ok_or(crate::Error::Argument {
                    op: "dspark_draft",
                    arg: "next",
                    value: r.next.to_string(),
                    why: "token id is not below the vocabulary size",
                })?;
            block.push(next_id);
            block.extend(std::iter::repeat_n(cfg.dspark.noise_token_id as i32, n - 1));
            positions.extend((r.p + 1..r.p + 1 + n).map(|q| q as i64));
        }
        let seeds: Vec<SeedRequest> = reqs
            .iter()
            .map(|r| SeedRequest {
                seq: r.seq,
                features: r.features,
                start: r.p,
            })
            .collect();
        self.dspark_seed_batch(dw, pool, &seeds)?;
        for r in reqs.iter() {
            for s in 0..dw.stages.len() {
                pool.reserve_ring(r.seq, pool.stage_ring(s), r.p + 1 + n)?;
            }
        }
        let rows = block.len();
        let ids = Tensor::from_vec(block, &[rows])?.to_device(&device)?;
        let mut streams = Streams::new(
            ops::hc_init(&ops::embedding(&self.weights.embed, &ids)?)?,
            self.mhc_fusion,
        );
        let one_hot: Vec<f32> = (0..rows).flat_map(|_| ONE_HOT_PRE).collect();
        let mut pre = Tensor::from_vec(one_hot, &[rows, HC_STREAMS])?.to_device(&device)?;
        let positions = Tensor::from_vec(positions, &[rows])?.to_device(&device)?;
        let rope = self.stage_rope();
        let hp = self.mhc_params();
        for (s, stage) in dw.stages.iter().enumerate() {
            let ring = pool.stage_ring(s);
            let (x, mix) = stage
                .hc_attn
                .input(&mut streams, &mut pre, &stage.attn_norm, hp)?;
            let w = &stage.attn;
            let (q, _) = w.query(cfg, &x, &positions, &rope)?;
            let kv = w.window_kv(cfg, &x, &positions, &rope)?;
            let mut lists = Vec::with_capacity(reqs.len());
            for (k, r) in reqs.iter().enumerate() {
                pool.write_ring(r.seq, ring, r.p + 1, &kv, k * n, n)?;
                lists.push(stage_list(pool, r.seq, ring, a.window, r.p, n)?);
            }
            let f = self.attend_by_width(w, pool, &q, &positions, &lists, n, &rope)?;
            streams.expand_later(f, mix)?;
            let (x, mix) = stage
                .hc_ffn
                .input(&mut streams, &mut pre, &stage.ffn_norm, hp)?;
            let (f, _) = stage
                .ffn
                .forward(&x, self.moe_params(cfg.dspark.n_activated_experts))?;
            streams.expand_later(f, mix)?;
        }
        let hidden = ops::hc_collapse(streams.ready()?, &pre)?;
        let base = self.weights.head.forward_f32(&ops::rms_norm(
            &hidden,
            &dw.norm,
            crate::numerics::round_f32(cfg.norm_eps),
        )?)?;
        self.markov_and_confidence(dw, &hidden, &base, reqs)
    }

    /// The stage attention of stacked blocks of `n` rows (`q`, `positions`),
    /// block k attending over `lists[k]`: one call per list width, so no
    /// list is padded, then the rows back in block order.
    #[allow(clippy::too_many_arguments)]
    fn attend_by_width(
        &self,
        w: &super::layers::attention::Attention,
        pool: &StatePool,
        q: &Tensor,
        positions: &Tensor,
        lists: &[Vec<i32>],
        n: usize,
        rope: &RopeParams,
    ) -> Result<Tensor> {
        let device = self.device();
        let mut widths: Vec<usize> = lists.iter().map(Vec::len).collect();
        widths.sort_unstable();
        widths.dedup();
        let rows_of =
            |ks: &[usize]| -> Vec<usize> { ks.iter().flat_map(|&k| k * n..(k + 1) * n).collect() };
        let mut parts = Vec::with_capacity(widths.len());
        let mut order = Vec::with_capacity(lists.len() * n);
        for width in widths {
            let group: Vec<(usize, &Vec<i32>)> = lists
                .iter()
                .enumerate()
                .filter(|(_, l)| l.len() == width)
                .collect();
            let ks: Vec<usize> = group.iter().map(|&(k, _)| k).collect();
            let idx: Vec<i32> = group
                .iter()
                .flat_map(|&(_, l)| (0..n).flat_map(move |_| l.iter().copied()))
                .collect();
            let idx = Tensor::from_vec(idx, &[ks.len() * n, width])?.to_device(&device)?;
            let f = if ks.len() == lists.len() {
                w.attend(&self.cfg, pool, q, &idx, None, positions, rope)?
            } else {
                let rows = rows_of(&ks);
                let (qg, pg) = (
                    ops::gather_rows(q, &rows)?,
                    ops::gather_rows(positions, &rows)?,
                );
                w.attend(&self.cfg, pool, &qg, &idx, None, &pg, rope)?
            };
            parts.push(f);
            order.extend(rows_of(&ks));
        }
        if let [only] = parts.as_slice() {
            return Ok(only.clone());
        }
        // Row `order[j]` of the stacked blocks is row j of the parts.
        let mut back = vec![0usize; order.len()];
        for (j, &r) in order.iter().enumerate() {
            if let Some(b) = back.get_mut(r) {
                *b = j;
            }
        }
        let all = Tensor::cat_rows(&parts.iter().collect::<Vec<_>>())?;
        Ok(ops::gather_rows(&all, &back)?)
    }

    /// The Markov head chained through the chosen tokens (greedy where a
    /// request has no chooser), and the confidence head, for the stacked
    /// blocks of `reqs` (`hidden` and `base`: block k's rows k·n ..): block
    /// position i of every request in one pass (one row each through the
    /// row-wise embedding, GEMMs and argmax), so each draft is bitwise the
    /// one its request gets alone.
    fn markov_and_confidence(
        &self,
        dw: &DsparkWeights,
        hidden: &Tensor,
        base: &Tensor,
        reqs: &mut [DraftRequest],
    ) -> Result<Vec<Draft>> {
        let (r, n) = (reqs.len(), self.cfg.dspark.block_size);
        let v = self.cfg.vocab_size;
        let device = self.device();
        let mut tokens: Vec<u32> = reqs.iter().map(|q| q.next).collect();
        let mut drafts: Vec<Draft> = (0..r)
            .map(|_| Draft {
                tokens: Vec::with_capacity(n),
                confidence_logits: Vec::with_capacity(n),
            })
            .collect();
        let chosen = reqs.iter().any(|q| q.choose.is_some());
        for i in 0..n {
            let rows: Vec<usize> = (0..r).map(|k| k * n + i).collect();
            let ids: Vec<i32> = tokens
                .iter()
                .map(|&t| {
                    i32::try_from(t).map_err(|_| crate::Error::Argument {
                        op: "dspark_draft",
                        arg: "choose",
                        value: t.to_string(),
                        why: "a chosen draft token is not a token id",
                    })
                })
                .collect::<std::result::Result<_, _>>()?;
            let ids = Tensor::from_vec(ids, &[r])?.to_device(&device)?;
            let e = ops::embedding(&dw.markov_embed, &ids)?;
            let logits = ops::add(
                &ops::gather_rows(base, &rows)?,
                &dw.markov_head.forward_f32(&e)?,
            )?;
            let input = ops::cat_cols(&[&ops::gather_rows(hidden, &rows)?, &e])?;
            let conf = dw.confidence.forward_f32(&input)?.to_vec::<f32>()?;
            let greedy = ops::argmax(&logits)?.to_vec::<i32>()?;
            let host = match chosen {
                true => logits.to_vec::<f32>()?,
                false => Vec::new(),
            };
            for (k, (q, d)) in reqs.iter_mut().zip(&mut drafts).enumerate() {
                d.confidence_logits.extend(conf.get(k));
                let token = match (q.choose.as_mut(), host.get(k * v..(k + 1) * v)) {
                    (Some(choose), Some(row)) => choose(i, row),
                    _ => greedy
                        .get(k)
                        .and_then(|&id| u32::try_from(id).ok())
                        .ok_or_else(|| no_draft("dspark_draft"))?,
                };
                if let Some(t) = tokens.get_mut(k) {
                    *t = token;
                }
                d.tokens.push(token);
            }
        }
        Ok(drafts)
    }
}
