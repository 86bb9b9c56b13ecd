//! Speculative verification (`serving.md` §2.1–§2.2): the exact acceptance
//! rule for one drafted position, and the scheduler that decides how many
//! drafts each request verifies in a step.
//!
//! Invariant (acceptance, lossless): at temperature 0 a draft is accepted
//! iff it equals the target's greedy token (the token emitted either way is
//! the target's). At temperature > 0 a draft d drawn from q is accepted
//! with probability min(1, p(d) / q(d)) (a Domain::Reject coin at slot 0),
//! otherwise the token is drawn from norm(max(p − q, 0)) (slot 1), so each
//! emitted token follows p, the distribution `sample_row` draws from; a
//! position without a draft (the bonus) samples p exactly as plain
//! decoding does. The scheduler only chooses which drafts are offered,
//! never the rule.
//!
//! Invariant (scheduler): the chosen lengths never exceed each request's
//! cap; the confidence schedule offers a contiguous prefix per request.

use super::rng::{self, Domain};
use super::sampling::{Sample, SamplingParams, distribution, logprob, sample_row};

/// How many drafts each request verifies per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every request verifies all its drafts (up to `nextn`).
    Fixed,
    /// The drafter's confidences choose, under a batch budget
    /// (`DEEPINFER_ENABLE_MTP_VARLEN=1`).
    Confidence,
}

/// The step-time model the confidence schedule divides by, in any unit:
/// a verify step of T tokens costs `step_fixed + per_token · T`, drafting
/// for R requests `draft_per_request · R`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecCosts {
    pub step_fixed: f64,
    pub per_token: f64,
    pub draft_per_request: f64,
}

/// Per request, what speculation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify steps the request took part in.
    pub steps: usize,
    /// Draft tokens verified (the target's own token of each step excluded).
    pub verified: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

/// A drafted token and the distribution it was drawn from (`None`: a
/// point mass on it).
pub type Offered<'a> = (u32, Option<&'a [(u32, f64)]>);

/// The token emitted at a position whose target logits (grammar-masked
/// where the request has a constraint) are `row`, and whether `draft` (the
/// drafted token and the distribution it came from, `None` for a point
/// mass) was accepted. `position` is the emitted token's absolute position.
pub fn decide(
    row: &[f32],
    p: &SamplingParams,
    draft: Option<Offered>,
    position: u64,
) -> (Sample, bool) {
    if p.temperature == 0.0 {
        let s = sample_row(row, p, 0.0);
        return (s, draft.is_some_and(|(d, _)| d == s.token));
    }
    let Some((d, q)) = draft else {
        let u = rng::uniform(p.seq_seed, position, 0, Domain::Target);
        return (sample_row(row, p, u), false);
    };
    let target = distribution(row, p);
    let prob = |dist: &[(u32, f64)], t: u32| {
        dist.iter()
            .find(|&&(id, _)| id == t)
            .map_or(0.0, |&(_, x)| x)
    };
    // The draft distribution by id, built once: the residual below asks
    // for q of every id of the target (a linear search each was O(V²)).
    let q_map: Option<std::collections::HashMap<u32, f64>> = q.map(|q| {
        let mut m = std::collections::HashMap::with_capacity(q.len());
        for &(id, x) in q {
            m.entry(id).or_insert(x); // the first entry of an id, as a search finds
        }
        m
    });
    let q_of = |t: u32| match &q_map {
        Some(m) => m.get(&t).copied().unwrap_or(0.0),
        None => f64::from(u8::from(t == d)),
    };
    let (pd, qd) = (prob(&target, d), q_of(d));
    let coin = rng::uniform(p.seq_seed, position, 0, Domain::Reject);
    let with_logprob = |token| Sample {
        token,
        logprob: logprob(row, token, p.temperature),
    };
    if qd > 0.0 && coin < pd / qd {
        return (with_logprob(d), true);
    }
    let residual: Vec<(u32, f64)> = target
        .iter()
        .map(|&(id, x)| (id, (x - q_of(id)).max(0.0)))
        .collect();
    let total: f64 = residual.iter().map(|r| r.1).sum();
    let u = rng::uniform(p.seq_seed, position, 1, Domain::Reject);
    if total <= 0.0 {
        // p ≤ q everywhere means p = q: the draft was accepted surely, so
        // this is unreachable but for rounding; p itself is then exact.
        return (sample_row(row, p, u), false);
    }
    let (mut acc, goal) = (0.0, u * total);
    let mut pick = None;
    for &(id, x) in residual.iter().filter(|r| r.1 > 0.0) {
        acc += x;
        pick = Some(id);
        if acc > goal {
            break;
        }
    }
    (with_logprob(pick.unwrap_or(d)), false)
}

/// The number of drafts each request verifies: `caps` (per request, the
/// drafts it has and may emit) under [`Schedule::Fixed`]; under
/// [`Schedule::Confidence`], the B slots of highest survival Π c over all
/// requests (a contiguous prefix of each, since survival only falls along
/// a request), B maximising (requests + Σ top-B survival) / (draft cost +
/// verify cost of requests + B tokens), as vLLM's adaptive verification.
pub fn schedule(
    schedule: Schedule,
    confidence: &[Vec<f32>],
    caps: &[usize],
    costs: &SpecCosts,
) -> Vec<usize> {
    if schedule == Schedule::Fixed {
        return caps.to_vec();
    }
    // (survival, slot, request), best first; ties by slot then request.
    let mut slots: Vec<(f64, usize, usize)> = Vec::new();
    for (r, (c, &cap)) in confidence.iter().zip(caps).enumerate() {
        let mut s = 1.0;
        for (i, &ci) in c.iter().take(cap).enumerate() {
            s *= f64::from(ci.clamp(0.0, 1.0));
            slots.push((s, i, r));
        }
    }
    slots.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let requests = caps.len() as f64;
    let cost = |b: usize| {
        costs.draft_per_request * requests
            + costs.step_fixed
            + costs.per_token * (requests + b as f64)
    };
    let (mut best, mut best_value, mut gain) = (0, requests / cost(0), requests);
    for (b, slot) in slots.iter().enumerate() {
        gain += slot.0;
        let value = gain / cost(b + 1);
        if value > best_value {
            (best, best_value) = (b + 1, value);
        }
    }
    let mut k = vec![0; caps.len()];
    for &(_, _, r) in slots.iter().take(best) {
        if let Some(k) = k.get_mut(r) {
            *k += 1;
        }
    }
    k
}
