//! Offline inference over the batched model step: requests (token-id
//! prompts with [`SamplingParams`]) run together — one prefill step for all
//! prompts, then one decode step per token for every live request — with
//! counter-based sampling, so a request's tokens depend only on its own
//! prompt, parameters and seed (on the CPU, bitwise whatever its batch).
//!
//! Invariant: a request with bad parameters fails alone with a typed error
//! naming the parameter; the others complete. The pool is sized for the
//! batch from [`EngineConfig`], and every sequence is freed when the batch
//! ends, on success or error.

pub mod rng;
pub mod sampling;

pub use sampling::{Sample, SamplingParams, logprob, sample_row};

use crate::model::forward::{Capture, Model, SeqInput};
use crate::model::pool::{PoolConfig, SeqId, StatePool};
use crate::model::{Error, Result};
use rng::Domain;
use std::time::{Duration, Instant};

/// The largest `max_context`: positions index cache rows with i32.
pub const MAX_CONTEXT: usize = i32::MAX as usize;

/// Limits of one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Requests per batch at most.
    pub max_seqs: usize,
    /// Prompt plus generated tokens per request at most.
    pub max_context: usize,
    /// Rows per pool page.
    pub page_rows: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_seqs: 16,
            max_context: 4096,
            page_rows: 64,
        }
    }
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    Length,
    /// This stop token was generated (it is the last output token).
    Stop(u32),
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    /// Per generated token, when asked for.
    pub logprobs: Option<Vec<f32>>,
    /// The batch's prefill step and decode loop (shared by its requests).
    pub prefill: Duration,
    pub decode: Duration,
}

/// A model and the limits its batches run under.
pub struct Engine {
    pub model: Model,
    pub config: EngineConfig,
}

struct Live {
    index: usize,
    seq: SeqId,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    done: Option<StopReason>,
}

impl Engine {
    pub fn new(model: Model, config: EngineConfig) -> Engine {
        Engine { model, config }
    }

    /// Teacher-forced scoring: one prefill of `prompt ‖ continuation`, and
    /// for every continuation token its log-probability under
    /// softmax(logits / `temperature`) at its position (computed exactly as
    /// [`sample_row`] reports the logprob of a sampled token).
    pub fn score(
        &self,
        prompt: &[u32],
        continuation: &[u32],
        temperature: f32,
    ) -> Result<Vec<f32>> {
        if prompt.is_empty() || continuation.is_empty() {
            return Err(arg(
                "prompt",
                format!("{} + {} tokens", prompt.len(), continuation.len()),
                "scoring needs a prompt and a continuation",
            ));
        }
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(arg(
                "temperature",
                temperature.to_string(),
                "scoring needs a finite temperature > 0",
            ));
        }
        let tokens: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
        let pc = PoolConfig::fitting(
            &self.model.cfg,
            1,
            tokens.len(),
            tokens.len(),
            self.config.page_rows,
        )?;
        let mut pool = StatePool::new(&self.model.cfg, &self.model.device(), pc)?;
        let seq = pool.add_sequence()?;
        let out = self.model.forward(&mut pool, seq, &tokens)?;
        let v = self.model.cfg.vocab_size;
        let host = out.logits.to_vec::<f32>()?;
        Ok(continuation
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let r = prompt.len() - 1 + i;
                logprob(&host[r * v..(r + 1) * v], t, temperature)
            })
            .collect())
    }

    /// Runs every request to completion; result i belongs to request i.
    pub fn generate(&self, prompts: &[Vec<u32>], params: &[SamplingParams]) -> Vec<Result<Output>> {
        let mut results: Vec<Option<Result<Output>>> = (0..prompts.len()).map(|_| None).collect();
        if prompts.len() != params.len() {
            let count = format!("{} for {} prompts", params.len(), prompts.len());
            return prompts
                .iter()
                .map(|_| {
                    Err(arg(
                        "params",
                        count.clone(),
                        "one SamplingParams per prompt",
                    ))
                })
                .collect();
        }
        let c = self.config;
        if c.max_seqs == 0 || c.max_context < 2 || c.max_context > MAX_CONTEXT || c.page_rows == 0 {
            return prompts
                .iter()
                .map(|_| {
                    Err(arg(
                        "config",
                        format!("{c:?}"),
                        "max_seqs and page_rows >= 1, 2 <= max_context <= 2^31 - 1",
                    ))
                })
                .collect();
        }
        let cfg = &self.model.cfg;
        let mut ok = Vec::new();
        for (i, (p, sp)) in prompts.iter().zip(params).enumerate() {
            let check = || -> Result<()> {
                if p.is_empty() {
                    return Err(arg("prompt", "[]".into(), "the prompt is empty"));
                }
                if let Some(&t) = p.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                    return Err(arg(
                        "prompt",
                        t.to_string(),
                        "token id is not below the vocabulary size",
                    ));
                }
                if p.len() >= self.config.max_context {
                    return Err(arg(
                        "prompt",
                        p.len().to_string(),
                        "the prompt fills the engine's max_context",
                    ));
                }
                sp.validate(cfg.vocab_size, self.config.max_context - p.len())?;
                Ok(())
            };
            match check() {
                Ok(()) => ok.push(i),
                Err(e) => results[i] = Some(Err(e)),
            }
            if ok.len() > self.config.max_seqs {
                results[i] = Some(Err(arg(
                    "prompts",
                    prompts.len().to_string(),
                    "more requests than the engine's max_seqs",
                )));
                ok.pop();
            }
        }
        if !ok.is_empty() {
            match self.run(prompts, params, &ok) {
                Ok(outs) => {
                    for (i, o) in ok.iter().zip(outs) {
                        results[*i] = Some(Ok(o));
                    }
                }
                Err(e) => {
                    for &i in &ok {
                        results[i] = Some(Err(arg_from(&e)));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every request answered"))
            .collect()
    }

    fn run(
        &self,
        prompts: &[Vec<u32>],
        params: &[SamplingParams],
        which: &[usize],
    ) -> Result<Vec<Output>> {
        let longest = which
            .iter()
            .map(|&i| prompts[i].len() + params[i].max_tokens)
            .max()
            .unwrap_or(1);
        let chunk = which.iter().map(|&i| prompts[i].len()).max().unwrap_or(1);
        let pc = PoolConfig::fitting(
            &self.model.cfg,
            which.len(),
            longest,
            chunk,
            self.config.page_rows,
        )?;
        let mut pool = StatePool::new(&self.model.cfg, &self.model.device(), pc)?;
        let mut live = Vec::with_capacity(which.len());
        for &i in which {
            live.push(Live {
                index: i,
                seq: pool.add_sequence()?,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                done: None,
            });
        }
        let t0 = Instant::now();
        let inputs: Vec<SeqInput> = live
            .iter()
            .map(|l| SeqInput {
                seq: l.seq,
                tokens: &prompts[l.index],
            })
            .collect();
        let out = self.model.step(&mut pool, &inputs, Capture::default())?;
        let last: Vec<(usize, usize)> = out
            .rows
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r.end - 1))
            .collect();
        self.sample(&out.logits, &last, &mut live, params, prompts)?;
        let prefill = t0.elapsed();
        let t1 = Instant::now();
        loop {
            let active: Vec<usize> = (0..live.len())
                .filter(|&k| live[k].done.is_none())
                .collect();
            if active.is_empty() {
                break;
            }
            let toks: Vec<[u32; 1]> = active
                .iter()
                .map(|&k| [*live[k].tokens.last().expect("sampled")])
                .collect();
            let inputs: Vec<SeqInput> = active
                .iter()
                .zip(&toks)
                .map(|(&k, t)| SeqInput {
                    seq: live[k].seq,
                    tokens: t,
                })
                .collect();
            let out = self.model.step(&mut pool, &inputs, Capture::default())?;
            let rows: Vec<(usize, usize)> = active.iter().copied().zip(0..).collect();
            self.sample(&out.logits, &rows, &mut live, params, prompts)?;
        }
        let decode = t1.elapsed();
        Ok(live
            .into_iter()
            .map(|l| Output {
                tokens: l.tokens,
                stop: l.done.expect("loop ends when every request is done"),
                logprobs: params[l.index].logprobs.then_some(l.logprobs),
                prefill,
                decode,
            })
            .collect())
    }

    /// For each (k, r) of `rows`: samples row r of `logits` for request
    /// `live[k]` at its next position, and marks it done on a stop token or
    /// at `max_tokens`.
    fn sample(
        &self,
        logits: &crate::Tensor,
        rows: &[(usize, usize)],
        live: &mut [Live],
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
    ) -> Result<()> {
        let v = self.model.cfg.vocab_size;
        let host = logits.to_vec::<f32>()?;
        for &(k, r) in rows {
            let l = &mut live[k];
            let p = &params[l.index];
            let position = (prompts[l.index].len() + l.tokens.len()) as u64;
            let row = &host[r * v..(r + 1) * v];
            if let Some(bad) = row.iter().position(|x| !x.is_finite()) {
                return Err(arg(
                    "logits",
                    format!("{} at vocabulary id {bad}, position {position}", row[bad]),
                    "non-finite logit",
                ));
            }
            let s = sample_row(
                row,
                p,
                rng::uniform(p.seq_seed, position, 0, Domain::Target),
            );
            l.tokens.push(s.token);
            l.logprobs.push(s.logprob);
            if p.stop.contains(&s.token) {
                l.done = Some(StopReason::Stop(s.token));
            } else if l.tokens.len() == p.max_tokens {
                l.done = Some(StopReason::Length);
            }
        }
        Ok(())
    }
}

fn arg(arg: &'static str, value: String, why: &'static str) -> Error {
    Error::from(crate::Error::Argument {
        op: "Engine::generate",
        arg,
        value,
        why,
    })
}

/// The batch's error for each of its requests (errors are not `Clone`; the
/// message is kept).
fn arg_from(e: &Error) -> Error {
    arg(
        "batch",
        e.to_string(),
        "the batch failed; this request did not run",
    )
}
