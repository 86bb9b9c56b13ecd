//! Speculative verification (`serving.md` §2.1–§2.2): the exact acceptance
//! rule for one drafted position, and the scheduler that decides how many
//! drafts each request verifies in a step.
//!
//! Invariant (acceptance, lossless): at temperature 0 a draft is accepted
//! iff it equals the target's greedy token (the token emitted either way is
//! the target's). At temperature > 0 a draft d drawn from q is accepted
//! with probability min(1, p(d) / q(d)) (a Domain::Reject coin at slot 0),
//! otherwise the token is drawn from norm(max(p − q, 0)) (slot 1; its mass
//! summed in id order, the draw walking p's ranks), so each
//! emitted token follows p, the distribution `sample_row` draws from; a
//! position without a draft (the bonus) samples p exactly as plain
//! decoding does. The scheduler only chooses which drafts are offered,
//! never the rule.
//!
//! Invariant (scheduler): the chosen lengths never exceed each request's
//! cap; the confidence schedule offers a contiguous prefix per request.

use super::rng::{self, Domain};
use super::sampling::{Ranked, Sample, SamplingParams, sample_row};

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
#[allow(
    clippy::cast_possible_truncation,
    reason = "ids index the row, cut to 2^32 entries at entry"
)]
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
    // p over the kept set: its mass in id order, its ranks lazily (the
    // residual draw below walks them in rank order and stops early).
    let row = row.get(..1 << 32).unwrap_or(row);
    let mut target = Ranked::new(row, f64::from(p.temperature));
    let keep = target.keep(p);
    let (kept, mass) = target.kept(keep);
    let prob = |t: u32| match kept.get(t as usize) {
        Some(true) => target.weight(t as usize) / mass,
        _ => 0.0,
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
    let (pd, qd) = (prob(d), q_of(d));
    let coin = rng::uniform(p.seq_seed, position, 0, Domain::Reject);
    let with_logprob = |target: &Ranked, token: u32| Sample {
        token,
        logprob: target.logprob(row, token as usize),
    };
    if qd > 0.0 && coin < pd / qd {
        return (with_logprob(&target, d), true);
    }
    // norm(max(p − q, 0)): its mass over the kept ids in id order, the
    // draw by the running sum in rank order.
    let residual = |t: u32| (prob(t) - q_of(t)).max(0.0);
    let total: f64 = kept
        .iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(id, _)| residual(id as u32))
        .sum();
    let u = rng::uniform(p.seq_seed, position, 1, Domain::Reject);
    if total <= 0.0 {
        // p ≤ q everywhere means p = q: the draft was accepted surely, so
        // this is unreachable but for rounding; p itself is then exact.
        return (sample_row(row, p, u), false);
    }
    let (mut acc, goal) = (0.0, u * total);
    let mut pick = None;
    for k in 0..keep {
        // Rank k < keep is kept: its p is its weight over the kept mass.
        let (id, w) = target.at(k);
        let id = id as u32;
        let x = (w / mass - q_of(id)).max(0.0);
        if x > 0.0 {
            acc += x;
            pick = Some(id);
            if acc > goal {
                break;
            }
        }
    }
    (with_logprob(&target, pick.unwrap_or(d)), false)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampling::{distribution, logprob};

    /// The acceptance rule computed the plain way: p as the full kept list
    /// (`distribution`, rank order), q searched in its list, the residual's
    /// mass summed over p's ids in id order and drawn in rank order.
    fn plain(row: &[f32], p: &SamplingParams, draft: Offered, position: u64) -> (Sample, bool) {
        let (d, q) = draft;
        let target = distribution(row, p);
        let prob = |t: u32| target.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
        let q_of = |t: u32| match q {
            Some(q) => q.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1),
            None => f64::from(u8::from(t == d)),
        };
        let with_logprob = |token| Sample {
            token,
            logprob: logprob(row, token, p.temperature),
        };
        let coin = rng::uniform(p.seq_seed, position, 0, Domain::Reject);
        if q_of(d) > 0.0 && coin < prob(d) / q_of(d) {
            return (with_logprob(d), true);
        }
        let mut by_id: Vec<(u32, f64)> = target.clone();
        by_id.sort_by_key(|e| e.0);
        let total: f64 = by_id.iter().map(|e| (e.1 - q_of(e.0)).max(0.0)).sum();
        let u = rng::uniform(p.seq_seed, position, 1, Domain::Reject);
        if total <= 0.0 {
            return (sample_row(row, p, u), false);
        }
        let (mut acc, goal, mut pick) = (0.0, u * total, None);
        for &(id, x) in &target {
            let r = (x - q_of(id)).max(0.0);
            if r > 0.0 {
                acc += r;
                pick = Some(id);
                if acc > goal {
                    break;
                }
            }
        }
        (with_logprob(pick.unwrap_or(d)), false)
    }

    /// `decide` (lazy ranks, q by hash) equals the plain rule bit for bit
    /// over rows of 7 to 3000 logits, point-mass and distribution drafts
    /// (inside and outside p's kept set), top-k and top-p, 40 positions
    /// each (accepting and rejecting).
    #[test]
    fn decide_is_the_plain_rule() {
        let mut next = crate::testing::xorshift(0x2545_F491_4F6C_DD1D);
        let (mut accepted, mut rejected) = (0, 0);
        for n in [7usize, 300, 3000] {
            let row: Vec<f32> = (0..n)
                .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0)
                .collect();
            for (top_k, top_p) in [(0usize, 1.0f32), (5, 1.0), (0, 0.8)] {
                let p = SamplingParams {
                    temperature: 0.9,
                    top_k,
                    top_p,
                    seq_seed: next(),
                    ..SamplingParams::default()
                };
                // A skewed q over a few ids, one of them maybe outside p.
                let q: Vec<(u32, f64)> = (0..4)
                    .map(|i| ((next() % n as u64) as u32, [0.4, 0.3, 0.2, 0.1][i]))
                    .collect();
                for position in 0..40u64 {
                    let d = (next() % n as u64) as u32;
                    for draft in [(d, None), (q[0].0, Some(q.as_slice()))] {
                        let got = decide(&row, &p, Some(draft), position);
                        let want = plain(&row, &p, draft, position);
                        assert_eq!(got.0.token, want.0.token, "n {n} {p:?} {position}");
                        assert_eq!(got.0.logprob.to_bits(), want.0.logprob.to_bits());
                        assert_eq!(got.1, want.1);
                        if got.1 {
                            accepted += 1;
                        } else {
                            rejected += 1;
                        }
                    }
                }
            }
        }
        assert!(accepted > 10 && rejected > 10, "{accepted} / {rejected}");
    }
}
