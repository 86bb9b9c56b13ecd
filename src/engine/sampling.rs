//! Sampling a token from one row of logits (`serving.md` §4): greedy at
//! temperature 0 (the lowest id among equal maxima), otherwise softmax of
//! logits / temperature restricted by top-k and top-p, drawn by inverse CDF
//! with one counter-based uniform ([`super::rng`]).
//!
//! Invariant: the result depends only on the row, the parameters and the
//! uniform; candidates are ordered by logit descending then id ascending,
//! and all arithmetic after the logits is f64 in that order.

use crate::error::{Error, Result};

/// The sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps everything.
    pub top_p: f32,
    /// Candidates kept by logit; 0 keeps all.
    pub top_k: usize,
    /// New tokens at most.
    pub max_tokens: usize,
    /// Token ids that end the request (the stop token is part of the output).
    pub stop: Vec<u32>,
    /// Strings that end the request once the decoded output contains one
    /// (needs a tokenizer; the output text ends before it).
    pub stop_strings: Vec<String>,
    /// The request's seed: with the same inputs, the same tokens.
    pub seq_seed: u64,
    /// Whether to return each sampled token's log-probability (of the
    /// temperature-scaled distribution, unrestricted by top-k/top-p; under
    /// `so_args`, of the grammar-masked distribution).
    pub logprobs: bool,
    /// The output constraint, if any (needs a tokenizer).
    pub so_args: Option<super::StructuredOutput>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            stop: Vec::new(),
            stop_strings: Vec::new(),
            seq_seed: 0,
            logprobs: false,
            so_args: None,
        }
    }
}

fn bad(arg: &'static str, value: String, why: &'static str) -> Error {
    Error::Argument {
        op: "SamplingParams",
        arg,
        value,
        why,
    }
}

impl SamplingParams {
    /// Checks the parameters against a vocabulary of `vocab` ids and a
    /// limit of `max_tokens_limit` new tokens.
    pub fn validate(&self, vocab: usize, max_tokens_limit: usize) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(bad(
                "temperature",
                self.temperature.to_string(),
                "must be finite and >= 0",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p.to_string(), "must be in (0, 1]"));
        }
        if self.max_tokens == 0 || self.max_tokens > max_tokens_limit {
            return Err(bad(
                "max_tokens",
                self.max_tokens.to_string(),
                "must be at least 1 and fit the pool's context with the prompt",
            ));
        }
        if let Some(&s) = self.stop.iter().find(|&&s| s as usize >= vocab) {
            return Err(bad(
                "stop",
                s.to_string(),
                "stop token id outside the vocabulary",
            ));
        }
        if let Some(s) = self.stop_strings.iter().find(|s| s.is_empty()) {
            return Err(bad(
                "stop_strings",
                format!("{s:?}"),
                "a stop string must not be empty",
            ));
        }
        Ok(())
    }
}

/// A sampled token and its log-probability under softmax(logits / T)
/// (0 for greedy).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub token: u32,
    pub logprob: f32,
}

/// The candidates of a row ordered by logit descending then id ascending
/// (NaNs left out), and their weights exp(z − z_max) for z = logit / t, in
/// that order, with their sum.
fn weights(logits: &[f32], t: f64) -> (Vec<usize>, Vec<f64>, f64) {
    let mut cand: Vec<(usize, f32)> = logits
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let z = |x: f32| f64::from(x) / t;
    let max = cand.first().map_or(0.0, |&(_, x)| z(x));
    let w: Vec<f64> = cand.iter().map(|&(_, x)| (z(x) - max).exp()).collect();
    let total = w.iter().sum();
    (cand.into_iter().map(|(i, _)| i).collect(), w, total)
}

/// ln softmax(logits / temperature)[token], computed exactly as
/// [`sample_row`] reports it (the teacher-forced score of a token).
pub fn logprob(logits: &[f32], token: u32, temperature: f32) -> f32 {
    let (order, w, total) = weights(logits, f64::from(temperature));
    match order.iter().zip(&w).find(|&(&i, _)| i == token as usize) {
        Some((_, &wk)) => crate::numerics::round_f32((wk / total).ln()),
        None => f32::NAN,
    }
}

/// The distribution [`sample_row`] draws from at temperature > 0: its kept
/// candidates (logit descending, id ascending) with their probabilities
/// (f64, summing to 1 over the kept set); empty for a row of NaNs.
#[allow(
    clippy::cast_possible_truncation,
    reason = "every id indexes the row, cut to 2^32 entries at entry"
)]
pub fn distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let logits = logits.get(..1 << 32).unwrap_or(logits);
    let (order, w, total) = weights(logits, f64::from(p.temperature));
    let keep = kept(&w, total, p);
    let sum: f64 = w.iter().take(keep).sum();
    order
        .into_iter()
        .zip(w)
        .take(keep)
        .map(|(id, x)| (id as u32, x / sum))
        .collect()
}

/// How many of the ordered weights `w` top-k and top-p keep.
fn kept(w: &[f64], total: f64, p: &SamplingParams) -> usize {
    let mut keep = if p.top_k == 0 {
        w.len()
    } else {
        p.top_k.min(w.len())
    };
    if p.top_p < 1.0 {
        let (mut acc, target) = (0.0, f64::from(p.top_p) * total);
        for (i, &x) in w.iter().take(keep).enumerate() {
            acc += x;
            if acc >= target {
                keep = i + 1;
                break;
            }
        }
    }
    keep
}

/// Samples one row with uniform `u` in [0, 1). Token ids are u32: only the
/// first 2^32 entries of a (longer, absurd) row can be sampled.
#[allow(
    clippy::cast_possible_truncation,
    reason = "every id indexes the row, cut to 2^32 entries at entry"
)]
pub fn sample_row(logits: &[f32], p: &SamplingParams, u: f64) -> Sample {
    let logits = logits.get(..1 << 32).unwrap_or(logits);
    let argmax = || crate::numerics::argmax(logits);
    if p.temperature == 0.0 {
        return Sample {
            token: argmax() as u32,
            logprob: 0.0,
        };
    }
    let (order, w, total) = weights(logits, f64::from(p.temperature));
    let keep = kept(&w, total, p);
    let kept: f64 = w.iter().take(keep).sum();
    let (mut acc, target) = (0.0, u * kept);
    let mut pick = keep.saturating_sub(1);
    for (i, &x) in w.iter().take(keep).enumerate() {
        acc += x;
        if acc > target {
            pick = i;
            break;
        }
    }
    match order.get(pick).zip(w.get(pick)) {
        Some((&id, &wp)) => Sample {
            token: id as u32,
            logprob: crate::numerics::round_f32((wp / total).ln()),
        },
        // A row of NaNs: nothing to sample from; the greedy rule picks id 0.
        None => Sample {
            token: argmax() as u32,
            logprob: f32::NAN,
        },
    }
}
