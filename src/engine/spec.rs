//! The speculative decode loop (`DEEPINFER_USE_NEXTN_DECODE` > 0): per
//! step, every live request drafts up to `nextn` tokens, the scheduler
//! ([`super::verify::schedule`]) picks how many each verifies, one target
//! step verifies them all (s_q = k + 1 per request), each request accepts
//! by the exact rule ([`super::verify::decide`]), emits, and rolls its
//! state back to the accepted tokens ([`StatePool::rollback_to`]). The
//! engine's serve loop runs these steps as it runs plain decode steps,
//! admitting a waiting request into a finished one's place between them.
//!
//! Invariant: a request emits exactly the tokens plain decoding would
//! (greedy: the same tokens and logprobs, bitwise on the CPU; sampled: the
//! same distribution), one at a time through the same emission path, so
//! constraints, stop tokens, stop strings and `max_tokens` end it at the
//! same token; drafts are capped so that no step verifies past
//! `max_tokens`. After a step its pool state is that of a plain run over
//! its accepted tokens, and the drafter has seen the features of exactly
//! the accepted positions from its seed on: the prefill's last positions,
//! at least a window of them (all of them on a cold exact prefill), so its
//! window rings hold what a seed from position 0 would leave.
//!
//! Indexing invariant: `k` indexes `live` and the per-request vectors
//! (one entry per live request), `j` the step's active requests.
#![allow(clippy::indexing_slicing)]

use super::drafter::{DraftInput, Drafter, Proposal};
use super::prefill::{Prefilled, Tail};
use super::verify::{Schedule, SpecStats, decide, schedule};
use super::{Engine, GreedyRows, Live, SamplingParams, TokenEvent, arg, check_finite};
use crate::model::Result;
use crate::model::forward::{Capture, SeqInput};
use crate::model::pool::StatePool;
use crate::tensor::Tensor;

/// Per request, the target features its drafter is seeded with.
#[derive(Default)]
pub(super) struct Seeds(Vec<Unseen>);

impl Seeds {
    /// Appends the seeds of newly admitted requests (in admission order,
    /// as they are appended to the live requests).
    pub(super) fn append(&mut self, more: Seeds) {
        self.0.extend(more.0);
    }

    /// Drops the features of request `k`, which finished (its sequence is
    /// freed; it drafts no more).
    pub(super) fn forget(&mut self, k: usize) {
        if let Some(u) = self.0.get_mut(k) {
            u.features = None;
        }
    }
}

/// Per request: the target features the drafter has not seen yet.
struct Unseen {
    features: Option<Tensor>,
    from: usize,
}

impl Engine {
    /// The prefill speculative decoding starts from: the engine's own
    /// (prefix cache and prefill mode included), whose target features of
    /// each prompt's last positions seed the drafter. A missing drafter or
    /// missing features fail here, before any token is sampled.
    pub(super) fn prefill_for_drafter(
        &self,
        pool: &mut StatePool,
        prompts: &[&[u32]],
    ) -> Result<(Prefilled, Seeds)> {
        self.drafter()?;
        let mut pre = self.prefill(pool, prompts)?;
        let mut seeds = Vec::with_capacity(pre.tails.len());
        for tail in std::mem::take(&mut pre.tails) {
            let Tail { features, from } = tail.ok_or_else(|| {
                arg(
                    "DEEPINFER_USE_NEXTN_DECODE",
                    self.config.nextn.to_string(),
                    "speculative decoding needs the model's DSpark target features",
                )
            })?;
            // The stage rings keep the last window: the positions before it
            // would be seeded only to be trimmed.
            let rows = features.rows();
            let keep = rows.min(self.model.cfg.attention.window);
            seeds.push(Unseen {
                features: Some(features.narrow_rows(rows - keep, keep)?),
                from: from + rows - keep,
            });
        }
        Ok((pre, Seeds(seeds)))
    }

    fn drafter(&self) -> Result<&dyn Drafter> {
        self.drafter.as_deref().ok_or_else(|| {
            arg(
                "DEEPINFER_USE_NEXTN_DECODE",
                self.config.nextn.to_string(),
                "speculative decoding needs a drafter (the checkpoint's mtp.* stages, or \
                 Engine::with_drafter)",
            )
        })
    }

    /// One speculative step of the live requests `active` (indices into
    /// `live`, none of them done): each drafts, the scheduler picks how
    /// many drafts each verifies, one target step verifies them all, and
    /// each accepts, emits and rolls back to its accepted tokens. `seeds`
    /// holds one entry per request of `live` (the drafter's unseen
    /// features), as [`Engine::admit`] appends them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn speculative_step(
        &self,
        pool: &mut StatePool,
        live: &mut [Live],
        active: &[usize],
        seeds: &mut Seeds,
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let drafter = self.drafter()?;
        let Seeds(unseen) = seeds;
        if unseen.len() != live.len() {
            return Err(arg(
                "DEEPINFER_USE_NEXTN_DECODE",
                format!("{} seeds for {} requests", unseen.len(), live.len()),
                "every admitted request has its drafter seed",
            ));
        }
        let which = if self.config.mtp_varlen {
            Schedule::Confidence
        } else {
            Schedule::Fixed
        };
        let proposals = self.propose(drafter, pool, live, active, unseen, params, prompts)?;
        let caps: Vec<usize> = proposals.iter().map(|p| p.tokens.len()).collect();
        let conf: Vec<Vec<f32>> = proposals.iter().map(|p| p.confidence.clone()).collect();
        let lens = schedule(which, &conf, &caps, &self.spec_costs);
        let mut fed: Vec<Vec<u32>> = Vec::with_capacity(active.len());
        for (j, &k) in active.iter().enumerate() {
            let l = &live[k];
            let last = *l.tokens.last().ok_or_else(|| {
                arg(
                    "prompts",
                    l.index.to_string(),
                    "a live request without a token",
                )
            })?;
            fed.push(
                std::iter::once(last)
                    .chain(proposals[j].tokens.iter().take(lens[j]).copied())
                    .collect(),
            );
            pool.checkpoint(l.seq)?;
        }
        let inputs: Vec<SeqInput> = active
            .iter()
            .zip(&fed)
            .map(|(&k, t)| SeqInput {
                seq: live[k].seq,
                tokens: t,
            })
            .collect();
        let out = self.model.step(pool, &inputs, Capture::default())?;
        // A greedy, unconstrained batch verifies on the logits' device: per
        // row its argmax and first non-finite index, not the logits.
        let logits = if active.iter().all(|&k| live[k].greedy(params)) {
            Verified::Greedy(GreedyRows::of(&out.logits)?)
        } else {
            Verified::Host(out.logits.to_vec::<f32>()?)
        };
        for (j, &k) in active.iter().enumerate() {
            let rows = out.rows[j].clone();
            let start = pool.position(live[k].seq)? - rows.len();
            let (emitted, accepted) = self.accept(
                &logits,
                rows.start,
                &proposals[j],
                lens[j],
                &mut live[k],
                params,
                prompts,
                on_token,
            );
            let l = &mut live[k];
            let stats = l.spec.get_or_insert_with(SpecStats::default);
            stats.steps += 1;
            stats.verified += lens[j];
            stats.accepted += accepted;
            pool.rollback_to(l.seq, start + emitted.max(1))?;
            let seen = out.features.as_ref().ok_or_else(|| {
                arg(
                    "DEEPINFER_USE_NEXTN_DECODE",
                    "1".into(),
                    "the step lost its features",
                )
            })?;
            unseen[k] = Unseen {
                features: Some(seen.narrow_rows(rows.start, emitted.max(1))?),
                from: start,
            };
        }
        Ok(())
    }

    /// The drafts of this step for requests `active` (indices into `live`),
    /// drafted in one batch: none for a request that may emit only one more
    /// token, otherwise up to `nextn`, capped so that every accepted draft
    /// plus the target's own token fits `max_tokens`.
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        drafter: &dyn Drafter,
        pool: &mut StatePool,
        live: &[Live],
        active: &[usize],
        unseen: &mut [Unseen],
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
    ) -> Result<Vec<Proposal>> {
        let none = || Proposal {
            tokens: Vec::new(),
            confidence: Vec::new(),
            probs: None,
        };
        // Per drafting request: (its place in `active`, cap, features,
        // context, position).
        let mut asks = Vec::new();
        for (j, &k) in active.iter().enumerate() {
            let l = &live[k];
            let p = &params[l.index];
            let cap = self
                .config
                .nextn
                .min(p.max_tokens.saturating_sub(l.tokens.len() + 1));
            if cap == 0 {
                continue;
            }
            let Some(features) = unseen[k].features.take() else {
                continue;
            };
            let context: Vec<u32> = prompts[l.index].iter().chain(&l.tokens).copied().collect();
            asks.push((j, k, cap, features, context, pool.position(l.seq)?));
        }
        let inputs: Vec<DraftInput> = asks
            .iter()
            .map(|(_, k, cap, features, context, at)| DraftInput {
                seq: live[*k].seq,
                features,
                fed_from: unseen[*k].from,
                p: at - 1,
                context,
                params: &params[live[*k].index],
                n: *cap,
            })
            .collect();
        let drafted = if inputs.is_empty() {
            Vec::new()
        } else {
            drafter.draft_batch(&self.model, pool, inputs)?
        };
        if drafted.len() != asks.len() {
            return Err(arg(
                "Drafter::draft_batch",
                format!("{} proposals for {} requests", drafted.len(), asks.len()),
                "a drafter returns one proposal per request",
            ));
        }
        let mut out: Vec<Proposal> = active.iter().map(|_| none()).collect();
        for ((j, _, cap, ..), mut proposal) in asks.into_iter().zip(drafted) {
            // A drafter is user code: never verify more than asked (the pool
            // was sized for nextn + 1 tokens a step), and a sampled draft must
            // say what it was drawn from, or acceptance would not be lossless.
            proposal.tokens.truncate(cap);
            proposal.confidence.truncate(proposal.tokens.len());
            if let Some(q) = &mut proposal.probs {
                if q.len() < proposal.tokens.len() {
                    return Err(arg(
                        "Drafter::draft",
                        format!(
                            "{} tokens, {} distributions",
                            proposal.tokens.len(),
                            q.len()
                        ),
                        "a drafter that returns distributions returns one per drafted token",
                    ));
                }
                q.truncate(proposal.tokens.len());
            }
            out[j] = proposal;
        }
        Ok(out)
    }

    /// Accepts and emits along one request's verify rows (rows
    /// `first_row ..= first_row + k` of the step's `logits`); returns how
    /// many tokens it emitted and how many of them were accepted drafts. A
    /// failure fails the request alone.
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &self,
        logits: &Verified,
        first_row: usize,
        proposal: &Proposal,
        k: usize,
        l: &mut Live,
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> (usize, usize) {
        let v = self.model.cfg.vocab_size;
        let p = &params[l.index];
        let (mut emitted, mut drafts) = (0, 0);
        for i in 0..=k {
            let position = l.position(prompts);
            let draft = (i < k).then(|| {
                let q = proposal.probs.as_ref().and_then(|q| q.get(i));
                (proposal.tokens[i], q.map(Vec::as_slice))
            });
            let r = first_row + i;
            let mut step = || -> Result<bool> {
                let (s, accepted) = match logits {
                    Verified::Host(host) => {
                        let row = &host[r * v..(r + 1) * v];
                        check_finite(row, position, l.tokens.len())?;
                        match &mut l.constraint {
                            Some(c) => {
                                let mut masked = row.to_vec();
                                c.mask(&mut masked)?;
                                decide(&masked, p, draft, position)
                            }
                            None => decide(row, p, draft, position),
                        }
                    }
                    // `decide`'s greedy rule: the argmax, accepted when it
                    // is the draft.
                    Verified::Greedy(rows) => {
                        let s = rows.pick(r, position, l.tokens.len())?;
                        (s, draft.is_some_and(|(d, _)| d == s.token))
                    }
                };
                self.emit(s, l, p, on_token)?;
                Ok(accepted)
            };
            match step() {
                Ok(accepted) => {
                    emitted += 1;
                    drafts += usize::from(accepted);
                    if !accepted || l.done.is_some() {
                        break;
                    }
                }
                Err(e) => {
                    l.failed = Some(e);
                    l.done = Some(super::StopReason::Length);
                    break;
                }
            }
        }
        (emitted, drafts)
    }
}

/// What a verification step reads of its logits: all of them on the host,
/// or, for a greedy unconstrained batch, each row's argmax and first
/// non-finite index from the device ([`GreedyRows`]).
enum Verified<'a> {
    Host(Vec<f32>),
    Greedy(GreedyRows<'a>),
}
