//! The drafters of speculative decoding: the [`Drafter`] trait the engine
//! drafts through, and [`DsparkDrafter`], the checkpoint's DSpark stages
//! (`v41-flash.md` §9).
//!
//! Invariant: a proposal is a function of the request's accepted history
//! (features, tokens) and its seed alone; `probs`, when present, is the
//! exact distribution each draft token was drawn from (`None`: each token
//! was chosen deterministically, a point mass), which the acceptance rule
//! needs to stay lossless.

use super::rng::{self, Domain};
use super::sampling::{SamplingParams, distribution_by_id, sample_row};
use crate::model::Result;
use crate::model::dspark::{DraftRequest, DsparkWeights, SeedRequest};
use crate::model::forward::Model;
use crate::model::pool::{SeqId, StatePool};
use crate::tensor::Tensor;

/// What a drafter is given for one request at one decode step.
pub struct DraftInput<'a> {
    pub seq: SeqId,
    /// BF16 `[p + 1 − fed_from, targets · D]`: the target features of the
    /// accepted positions `fed_from ..= p` the drafter has not seen yet.
    pub features: &'a Tensor,
    pub fed_from: usize,
    /// The last position the target has processed.
    pub p: usize,
    /// The prompt and the output so far; its last token (position p + 1)
    /// is the one the drafts continue, not yet fed to the target.
    pub context: &'a [u32],
    pub params: &'a SamplingParams,
    /// Draft tokens wanted (at most the drafter's block).
    pub n: usize,
}

/// Draft tokens for positions p + 2 … and what the scheduler and the
/// acceptance rule need about them.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Per token, the predicted probability that it is accepted given that
    /// the earlier ones were (in [0, 1]).
    pub confidence: Vec<f32>,
    /// Per token, the distribution it was drawn from (kept ids with
    /// probabilities); `None` for deterministic choices.
    pub probs: Option<Vec<Vec<(u32, f64)>>>,
}

/// A source of draft tokens.
pub trait Drafter: Send + Sync {
    /// Up to `input.n` drafts for `input.seq` (it may keep its own state in
    /// `pool`, seeded only with the accepted positions it is shown).
    fn draft(&self, model: &Model, pool: &mut StatePool, input: DraftInput) -> Result<Proposal>;

    /// The drafts of several requests (distinct sequences) of one step, in
    /// order: by default one [`Drafter::draft`] each. A drafter that batches
    /// them returns what `draft` would for each.
    fn draft_batch(
        &self,
        model: &Model,
        pool: &mut StatePool,
        inputs: Vec<DraftInput>,
    ) -> Result<Vec<Proposal>> {
        inputs
            .into_iter()
            .map(|i| self.draft(model, pool, i))
            .collect()
    }
}

/// The checkpoint's DSpark drafter: greedy drafts at temperature 0,
/// otherwise each draft sampled from the drafter's logits under the
/// request's temperature, top-k and top-p (Domain::Draft uniforms).
pub struct DsparkDrafter {
    pub weights: DsparkWeights,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One request's draft chooser, owned for the batch.
type BoxedChooser<'a> = Box<dyn FnMut(usize, &[f32]) -> u32 + 'a>;

impl Drafter for DsparkDrafter {
    fn draft(&self, model: &Model, pool: &mut StatePool, input: DraftInput) -> Result<Proposal> {
        let mut one = self.draft_batch(model, pool, vec![input])?;
        one.pop().ok_or_else(|| {
            crate::Error::Argument {
                op: "DsparkDrafter",
                arg: "input",
                value: "1 request".into(),
                why: "the batched draft returned no proposal",
            }
            .into()
        })
    }

    /// One pass of the stages for every request ([`Model::dspark_draft_batch`]).
    fn draft_batch(
        &self,
        model: &Model,
        pool: &mut StatePool,
        inputs: Vec<DraftInput>,
    ) -> Result<Vec<Proposal>> {
        // Every input is checked before any ring is seeded, so a refused
        // batch changes nothing.
        let mut nexts = Vec::with_capacity(inputs.len());
        for (k, input) in inputs.iter().enumerate() {
            let rows = input.features.rows();
            let next = input
                .context
                .last()
                .copied()
                .filter(|&t| (t as usize) < model.cfg.vocab_size);
            let (fed_from, p) = (input.fed_from, input.p);
            let bad = if rows != p + 1 - fed_from.min(p + 1) {
                Some((
                    "features",
                    format!("{rows} rows for positions {fed_from} ..= {p}"),
                    "one row per position the drafter has not seen",
                ))
            } else if inputs.iter().take(k).any(|o| o.seq == input.seq) {
                Some((
                    "seq",
                    input.seq.to_string(),
                    "a sequence drafts once per batch",
                ))
            } else if next.is_none() {
                Some((
                    "context",
                    format!("{:?}", input.context.last()),
                    "drafting needs the token the drafts continue, below the vocabulary size",
                ))
            } else {
                None
            };
            if let Some((arg, value, why)) = bad {
                return Err(crate::Error::Argument {
                    op: "DsparkDrafter",
                    arg,
                    value,
                    why,
                }
                .into());
            }
            nexts.push(next.unwrap_or_default());
        }
        // Every request's unseen positions but the last are seeded in one
        // batch (the draft seeds the last, position p, with its block).
        let mut earlier = Vec::with_capacity(inputs.len());
        let mut lasts = Vec::with_capacity(inputs.len());
        for input in &inputs {
            let rows = input.features.rows();
            if rows > 1 {
                earlier.push((input, input.features.narrow_rows(0, rows - 1)?));
            }
            lasts.push(input.features.narrow_rows(rows.saturating_sub(1), 1)?);
        }
        let seeds: Vec<SeedRequest> = earlier
            .iter()
            .map(|(input, features)| SeedRequest {
                seq: input.seq,
                features,
                start: input.fed_from,
            })
            .collect();
        model.dspark_seed_batch(&self.weights, pool, &seeds)?;
        let mut probs: Vec<Vec<Vec<(u32, f64)>>> = inputs.iter().map(|_| Vec::new()).collect();
        let mut choosers: Vec<BoxedChooser> = inputs
            .iter()
            .zip(probs.iter_mut())
            .map(|(input, probs)| {
                let (params, p) = (input.params, input.p);
                let sampled = params.temperature > 0.0;
                Box::new(move |i: usize, logits: &[f32]| -> u32 {
                    let u = if sampled {
                        let pos = (p + 2 + i) as u64;
                        probs.push(distribution_by_id(logits, params));
                        rng::uniform(params.seq_seed, pos, 0, Domain::Draft)
                    } else {
                        0.0
                    };
                    sample_row(logits, params, u).token
                }) as BoxedChooser
            })
            .collect();
        let mut reqs: Vec<DraftRequest> = inputs
            .iter()
            .zip(lasts.iter().zip(&nexts))
            .zip(choosers.iter_mut())
            .map(|((input, (last, next)), choose)| DraftRequest {
                seq: input.seq,
                features: last,
                p: input.p,
                next: *next,
                choose: Some(&mut **choose),
            })
            .collect();
        let drafts = model.dspark_draft_batch(&self.weights, pool, &mut reqs)?;
        drop(reqs);
        drop(choosers);
        Ok(drafts
            .into_iter()
            .zip(probs)
            .zip(&inputs)
            .map(|((draft, probs), input)| {
                let n = input.n;
                Proposal {
                    tokens: draft.tokens.iter().take(n).copied().collect(),
                    confidence: draft
                        .confidence_logits
                        .iter()
                        .take(n)
                        .map(|&c| sigmoid(c))
                        .collect(),
                    probs: (input.params.temperature > 0.0)
                        .then(|| probs.into_iter().take(n).collect()),
                }
            })
            .collect())
    }
}
