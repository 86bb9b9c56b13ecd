//! Sampling a token from one row of logits (`serving.md` §4): greedy at
//! temperature 0 (the lowest id among equal maxima), otherwise softmax of
//! logits / temperature restricted by top-k and top-p, drawn by inverse CDF
//! with one counter-based uniform ([`super::rng`]).
//!
//! Invariant: the result depends only on the row, the parameters and the
//! uniform. Candidates (the non-NaN logits) rank by logit descending then id
//! ascending; all arithmetic after the logits is f64: the weights
//! exp(z − z_max), their sums over a set (all candidates, the kept ones) in
//! id order, and the running sums of top-p and of the draw in rank order.
//! The rank order is built lazily ([`Ranked`]): a step sorts only the
//! candidates it reaches (a vocabulary row of 129,280 logits sorts in
//! milliseconds; a peaked row's top-p prefix and draw reach a few hundred).

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

/// A row's candidates with their weights, ranked lazily: `keys[..sorted]`
/// hold the first `sorted` candidates in rank order, the rest any order.
pub(super) struct Ranked {
    /// Rank key of each candidate: the complement of `f32::total_cmp`'s
    /// order of its logit (so +0.0 ranks before −0.0) above its id.
    keys: Vec<u64>,
    sorted: usize,
    /// exp(z − z_max) by id, z = logit / t (0 for a NaN logit).
    w: Vec<f64>,
    /// The sum of every candidate's weight, in id order.
    total: f64,
}

impl Ranked {
    /// The candidates of `logits` (at most 2^32 entries) at temperature `t`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the caller cuts the row to 2^32 entries"
    )]
    pub(super) fn new(logits: &[f32], t: f64) -> Ranked {
        let key = |i: usize, x: f32| {
            let b = x.to_bits();
            let up = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
            (u64::from(!up) << 32) | i as u64
        };
        let keys: Vec<u64> = logits
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.is_nan())
            .map(|(i, &x)| key(i, x))
            .collect();
        let z = |x: f32| f64::from(x) / t;
        let max = keys
            .iter()
            .min()
            .and_then(|&k| logits.get(id_of(k)))
            .map_or(0.0, |&x| z(x));
        let w: Vec<f64> = logits
            .iter()
            .map(|&x| if x.is_nan() { 0.0 } else { (z(x) - max).exp() })
            .collect();
        let total = w.iter().sum();
        Ranked {
            keys,
            sorted: 0,
            w,
            total,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The id and weight of the candidate of rank `r` (< len), sorting the
    /// next chunk of ranks when `r` is past the sorted ones: at least 4×
    /// the sorted count and 256, found by selection, then sorted.
    pub(super) fn at(&mut self, r: usize) -> (usize, f64) {
        if r >= self.sorted {
            let end = (r + 1).max(self.sorted * 4).max(256).min(self.keys.len());
            if let Some(rest) = self.keys.get_mut(self.sorted..) {
                let n = end - self.sorted;
                if n < rest.len() {
                    rest.select_nth_unstable(n - 1);
                }
                if let Some(chunk) = rest.get_mut(..n) {
                    chunk.sort_unstable();
                }
            }
            self.sorted = end;
        }
        let id = self.keys.get(r).map_or(0, |&k| id_of(k));
        (id, self.weight(id))
    }

    /// The candidates of the first `keep` ranks as a mask by id (sorting
    /// the ranks up to `keep` unless every candidate is kept), and the sum
    /// of their weights in id order.
    pub(super) fn kept(&mut self, keep: usize) -> (Vec<bool>, f64) {
        let keep = keep.min(self.len());
        if keep < self.len()
            && let Some(last) = keep.checked_sub(1)
        {
            self.at(last);
        }
        let mut kept = vec![false; self.w.len()];
        for &k in self.keys.iter().take(keep) {
            if let Some(slot) = kept.get_mut(id_of(k)) {
                *slot = true;
            }
        }
        let sum = self
            .w
            .iter()
            .zip(&kept)
            .filter(|(_, k)| **k)
            .map(|(w, _)| w)
            .sum();
        (kept, sum)
    }

    /// The weight of id `i` (0 outside the row and for a NaN logit).
    pub(super) fn weight(&self, i: usize) -> f64 {
        self.w.get(i).copied().unwrap_or(0.0)
    }

    /// ln softmax(logits / t)[id] of the `logits` this was built from (NaN
    /// for a NaN logit or an id outside the row).
    pub(super) fn logprob(&self, logits: &[f32], id: usize) -> f32 {
        match logits.get(id) {
            Some(x) if !x.is_nan() => {
                crate::numerics::round_f32((self.weight(id) / self.total).ln())
            }
            _ => f32::NAN,
        }
    }

    /// [`Ranked::kept`]'s sum alone: the total when every candidate is
    /// kept (the same bits: the total adds only 0.0 for the NaN ids).
    fn kept_sum(&mut self, keep: usize) -> f64 {
        if keep >= self.len() {
            self.total
        } else {
            self.kept(keep).1
        }
    }

    /// How many ranks top-k and top-p keep: top-k's count, cut at the first
    /// rank where the running sum in rank order reaches top_p · total.
    pub(super) fn keep(&mut self, p: &SamplingParams) -> usize {
        let mut keep = if p.top_k == 0 {
            self.len()
        } else {
            p.top_k.min(self.len())
        };
        if p.top_p < 1.0 {
            let (mut acc, target) = (0.0, f64::from(p.top_p) * self.total);
            for r in 0..keep {
                acc += self.at(r).1;
                if acc >= target {
                    keep = r + 1;
                    break;
                }
            }
        }
        keep
    }
}

/// The id in a rank key's low half.
#[allow(
    clippy::cast_possible_truncation,
    reason = "ids fit 32 bits: the row is cut to 2^32 entries"
)]
fn id_of(key: u64) -> usize {
    (key & 0xffff_ffff) as usize
}

/// ln softmax(logits / temperature)[token], computed exactly as
/// [`sample_row`] reports it (the teacher-forced score of a token).
pub fn logprob(logits: &[f32], token: u32, temperature: f32) -> f32 {
    let logits = logits.get(..1 << 32).unwrap_or(logits);
    Ranked::new(logits, f64::from(temperature)).logprob(logits, token as usize)
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
    let mut r = Ranked::new(logits, f64::from(p.temperature));
    let keep = r.keep(p);
    let sum = r.kept_sum(keep);
    (0..keep)
        .map(|k| {
            let (id, x) = r.at(k);
            (id as u32, x / sum)
        })
        .collect()
}

/// [`distribution`]'s kept candidates and probabilities (the same set, the
/// same values) in id order: what a drafter records as the distribution a
/// draft was drawn from, which verification looks up by id. Needs no rank
/// order past the kept set's bounds (no sort at all when top-k and top-p
/// keep everything).
#[allow(
    clippy::cast_possible_truncation,
    reason = "every id indexes the row, cut to 2^32 entries at entry"
)]
pub fn distribution_by_id(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let logits = logits.get(..1 << 32).unwrap_or(logits);
    let mut r = Ranked::new(logits, f64::from(p.temperature));
    let keep = r.keep(p);
    let (mask, sum) = r.kept(keep);
    mask.iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(id, _)| (id as u32, r.weight(id) / sum))
        .collect()
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
    let mut r = Ranked::new(logits, f64::from(p.temperature));
    let keep = r.keep(p);
    let (mut acc, target) = (0.0, u * r.kept_sum(keep));
    let mut pick = keep.checked_sub(1);
    for k in 0..keep {
        acc += r.at(k).1;
        if acc > target {
            pick = Some(k);
            break;
        }
    }
    match pick {
        Some(k) => {
            let id = r.at(k).0;
            Sample {
                token: id as u32,
                logprob: r.logprob(logits, id),
            }
        }
        // A row of NaNs: nothing to sample from; the greedy rule picks id 0.
        None => Sample {
            token: argmax() as u32,
            logprob: f32::NAN,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sampler's rule computed the plain way: every candidate ranked by
    /// a full comparison sort (logit descending by `total_cmp`, id
    /// ascending), the total and the kept sum in id order, top-p's and the
    /// draw's running sums in rank order.
    fn full_sort(logits: &[f32], p: &SamplingParams, u: f64) -> (Sample, Vec<(u32, f64)>) {
        let t = f64::from(p.temperature);
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let max = order.first().map_or(0.0, |&i| f64::from(logits[i]) / t);
        let w: Vec<f64> = logits
            .iter()
            .map(|&x| {
                if x.is_nan() {
                    0.0
                } else {
                    (f64::from(x) / t - max).exp()
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        let mut keep = if p.top_k == 0 {
            order.len()
        } else {
            p.top_k.min(order.len())
        };
        if p.top_p < 1.0 {
            let (mut acc, target) = (0.0, f64::from(p.top_p) * total);
            for (r, &i) in order.iter().take(keep).enumerate() {
                acc += w[i];
                if acc >= target {
                    keep = r + 1;
                    break;
                }
            }
        }
        let kept: f64 = if keep == order.len() {
            total
        } else {
            let mut ids: Vec<usize> = order[..keep].to_vec();
            ids.sort_unstable();
            ids.iter().map(|&i| w[i]).sum()
        };
        let (mut acc, target) = (0.0, u * kept);
        let mut pick = keep.checked_sub(1);
        for (r, &i) in order.iter().take(keep).enumerate() {
            acc += w[i];
            if acc > target {
                pick = Some(r);
                break;
            }
        }
        let sample = match pick {
            Some(r) => Sample {
                token: order[r] as u32,
                logprob: crate::numerics::round_f32((w[order[r]] / total).ln()),
            },
            None => Sample {
                token: crate::numerics::argmax(logits) as u32,
                logprob: f32::NAN,
            },
        };
        let dist = order[..keep]
            .iter()
            .map(|&i| (i as u32, w[i] / kept))
            .collect();
        (sample, dist)
    }

    /// The lazily ranked sampler equals the full sort bit for bit (token,
    /// logprob and distribution) on rows of 1 to 5,000 logits: peaked and
    /// flat, with ties, ±0, NaNs and subnormals, over temperatures, top-k,
    /// top-p and draws from 0 to just below 1 (the draws reach past the
    /// first chunks of 256 and 1024 ranks).
    #[test]
    fn lazy_ranking_samples_as_the_full_sort() {
        let mut next = crate::testing::xorshift(0x9E37_79B9_7F4A_7C15);
        let specials = [0.0f32, -0.0, f32::NAN, f32::MIN_POSITIVE / 2.0, 1.0, 1.0];
        let mut cases = 0;
        for &n in &[1usize, 2, 9, 300, 1500, 5000] {
            for shape in 0..3 {
                let row: Vec<f32> = (0..n)
                    .map(|i| {
                        let r = next();
                        let unit = (r >> 40) as f32 / (1u64 << 24) as f32;
                        match (shape, r % 7) {
                            (_, 0) => specials[(r >> 8) as usize % specials.len()],
                            // Flat: many ranks carry mass.
                            (0, _) => unit * 2.0 - 1.0,
                            // Peaked: a few logits far above the rest.
                            (1, _) if i % 97 == 3 => 12.0 + unit,
                            (1, _) => unit * 4.0 - 2.0,
                            // Few distinct values: ties everywhere.
                            _ => ((r >> 8) % 4) as f32,
                        }
                    })
                    .collect();
                for &(t, top_k, top_p) in &[
                    (1.0f32, 0usize, 1.0f32),
                    (0.7, 0, 0.9),
                    (1.3, 50, 1.0),
                    (0.5, 300, 0.95),
                    (2.0, 1, 1.0),
                    (1.0, 0, 0.01),
                ] {
                    let p = SamplingParams {
                        temperature: t,
                        top_k,
                        top_p,
                        ..SamplingParams::default()
                    };
                    for u in [0.0, 0.25, 0.5, 0.9, 0.999_999] {
                        let (want, _) = full_sort(&row, &p, u);
                        let got = sample_row(&row, &p, u);
                        assert_eq!(got.token, want.token, "n {n} shape {shape} {p:?} u {u}");
                        assert_eq!(
                            got.logprob.to_bits(),
                            want.logprob.to_bits(),
                            "n {n} shape {shape} {p:?} u {u}"
                        );
                        cases += 1;
                    }
                    let (_, dist) = full_sort(&row, &p, 0.0);
                    let mut by_id = dist.clone();
                    by_id.sort_by_key(|e| e.0);
                    let got_by_id = distribution_by_id(&row, &p);
                    assert!(
                        got_by_id.len() == by_id.len()
                            && got_by_id
                                .iter()
                                .zip(&by_id)
                                .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits()),
                        "n {n} shape {shape} {p:?}: distribution by id"
                    );
                    let got = distribution(&row, &p);
                    assert_eq!(got.len(), dist.len());
                    assert!(
                        got.iter()
                            .zip(&dist)
                            .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits()),
                        "n {n} shape {shape} {p:?}: distribution"
                    );
                }
            }
        }
        assert_eq!(cases, 6 * 3 * 6 * 5);
    }
}
