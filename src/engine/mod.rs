//! Offline inference over the batched model step: requests (text or
//! token-id prompts with [`SamplingParams`]) run together — a batched
//! prefill (through the prefix cache when there is one, `prefill`), then
//! one decode step per token for every live request — with
//! counter-based sampling, so a request's tokens depend only on its own
//! prompt, parameters and seed (on the CPU, bitwise whatever its batch).
//!
//! Invariant: a request with bad parameters fails alone with a typed error
//! naming the parameter; the others complete. The pool is sized for the
//! batch from [`EngineConfig`] and its requests' own tokens (see
//! `Engine::pool`: speculative decoding adds no positions, only a verify
//! step's chunk), and every sequence is freed when the batch ends, on
//! success or error.
//!
//! Indexing invariant: an index is a request's position in the call's
//! prompt list (the results, ids, constraints and parameters each hold one
//! entry per prompt, checked at entry), a live request's number, or its row
//! of the step's `[rows, vocab]` logits. So the crate's `indexing_slicing`
//! lint is lifted here.
#![allow(clippy::indexing_slicing)]

pub mod config;
pub mod drafter;
mod prefill;
pub mod prefix_cache;
pub mod request;
pub mod rng;
pub mod sampling;
mod spec;
pub mod structured;
pub mod verify;

pub use config::{EngineConfig, MAX_CONTEXT, YocoMode};
pub use prefill::PrefillCounters;
pub use prefix_cache::{CacheStats, PrefixCache, PrefixCacheConfig};
pub use request::{Output, Prompt, StopReason};
pub use sampling::{Sample, SamplingParams, logprob, sample_row};
pub use structured::{Constraint, Grammars, SchemaType, StructuredOutput};
pub use verify::{SpecCosts, SpecStats};

use crate::device::Device;
use crate::model::forward::{Capture, Model, SeqInput};
use crate::model::pool::{PoolConfig, PoolMemory, SeqId, StatePool, step_headroom};
use crate::model::runner::load_model_placed;
use crate::model::tokenizer::{TOKENIZER_FILE, Tokenizer};
use crate::model::{Error, Result};
use rng::Domain;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A model, its tokenizer when it has one, and the limits its batches run
/// under.
pub struct Engine {
    pub model: Model,
    pub config: EngineConfig,
    pub tokenizer: Option<Tokenizer>,
    grammars: OnceLock<Grammars>,
    /// The drafter of speculative decoding (`nextn` > 0).
    drafter: Option<Box<dyn drafter::Drafter>>,
    /// The confidence schedule's step-time model.
    pub spec_costs: SpecCosts,
    /// Prefix states kept across batches ([`Engine::with_prefix_cache`]).
    prefix_cache: Option<Mutex<PrefixCache>>,
    counters: Mutex<PrefillCounters>,
}

/// The default step-time model: a step's fixed cost is that of 8 tokens,
/// drafting for one request that of half a token (a profile of the engine
/// replaces it: [`Engine::with_spec_costs`]).
pub const DEFAULT_SPEC_COSTS: SpecCosts = SpecCosts {
    step_fixed: 8.0,
    per_token: 1.0,
    draft_per_request: 0.5,
};

/// A generated token as it is sampled: request `request`'s `index`-th
/// output token (for streaming; see [`Engine::generate_streaming`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    pub request: usize,
    pub index: usize,
    pub token: u32,
}

/// A teacher-forced score.
#[derive(Debug)]
pub struct Scored {
    /// Per continuation token, its log-probability.
    pub logprobs: Vec<f32>,
    /// F32 `[continuation, V]`: row i is the logits that predicted
    /// continuation token i (the prompt's last position, then each
    /// continuation position but the last).
    pub logits: crate::Tensor,
}

struct Live {
    index: usize,
    seq: SeqId,
    constraint: Option<Constraint>,
    /// This request's own failure (it stops; the others go on).
    failed: Option<Error>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    done: Option<StopReason>,
    spec: Option<SpecStats>,
}

impl Live {
    /// Samples greedily and without a grammar: its tokens need only each
    /// row's argmax and finiteness ([`GreedyRows`]).
    fn greedy(&self, params: &[SamplingParams]) -> bool {
        self.constraint.is_none() && params.get(self.index).is_some_and(|p| p.temperature == 0.0)
    }

    /// The absolute position of the request's next token.
    fn position(&self, prompts: &[Vec<u32>]) -> u64 {
        (prompts[self.index].len() + self.tokens.len()) as u64
    }
}

impl Engine {
    /// An engine without a tokenizer (prompts and outputs are token ids);
    /// `config` is checked against the model ([`EngineConfig::validate`]).
    pub fn new(model: Model, config: EngineConfig) -> Result<Engine> {
        config.validate(&model.cfg)?;
        if config.batch_invariant && !model.device().batch_invariant() {
            return Err(arg(
                "batch_invariant",
                format!("1 with a model on {}", model.device()),
                "load the model on Device::with_batch_invariant_kernels (Engine::from_dir_on does)",
            ));
        }
        if let Some(e) = model
            .weights
            .blocks
            .iter()
            .filter_map(|b| b.engram.as_ref())
            .find(|e| e.placement != config.engram_tables)
        {
            return Err(arg(
                "engram_tables",
                format!(
                    "{:?} with a model whose Engram tables are {:?}",
                    config.engram_tables, e.placement
                ),
                "load the model with the placement the config names (Engine::from_dir_on does)",
            ));
        }
        Ok(Engine {
            model,
            config,
            tokenizer: None,
            grammars: OnceLock::new(),
            drafter: None,
            spec_costs: DEFAULT_SPEC_COSTS,
            prefix_cache: None,
            counters: Mutex::default(),
        })
    }

    /// The drafter speculative decoding proposes with (`nextn` > 0).
    pub fn with_drafter(self, drafter: Box<dyn drafter::Drafter>) -> Engine {
        Engine {
            drafter: Some(drafter),
            ..self
        }
    }

    /// The step-time model of the confidence schedule.
    pub fn with_spec_costs(self, spec_costs: SpecCosts) -> Engine {
        Engine { spec_costs, ..self }
    }

    /// Text prompts, output text and stop strings through `tokenizer`,
    /// whose ids must all be rows of the model's embedding (a tokenizer
    /// with fewer ids than the vocabulary is allowed; a sampled id past it
    /// fails its request when decoded).
    pub fn with_tokenizer(self, tokenizer: Tokenizer) -> Result<Engine> {
        if tokenizer.len() > self.model.cfg.vocab_size {
            return Err(arg(
                "tokenizer",
                format!(
                    "{} ids for a {}-id vocabulary",
                    tokenizer.len(),
                    self.model.cfg.vocab_size
                ),
                "the tokenizer has ids the model cannot embed",
            ));
        }
        Ok(Engine {
            tokenizer: Some(tokenizer),
            grammars: OnceLock::new(),
            ..self
        })
    }

    /// The model of `dir` ([`load_model`]) with the directory's
    /// `tokenizer.json` when it has one; `config.max_context` is capped at
    /// the model's trained positions ([`ModelConfig::max_position`]).
    ///
    /// [`ModelConfig::max_position`]: crate::model::config::ModelConfig::max_position
    pub fn from_dir(dir: &Path, config: EngineConfig, check_finite: bool) -> Result<Engine> {
        Engine::from_dir_on(dir, &crate::Device::Cpu, config, check_finite)
    }

    /// [`Engine::from_dir`] with the weights (and the drafter's) loaded onto
    /// `device`: the forward, the state pool and the drafter run there; the
    /// sampler and structured output read the logits on the host. With
    /// `config.batch_invariant` the device's ops pick only batch-invariant
    /// kernels ([`crate::Device::with_batch_invariant_kernels`]).
    pub fn from_dir_on(
        dir: &Path,
        device: &crate::Device,
        config: EngineConfig,
        check_finite: bool,
    ) -> Result<Engine> {
        // Batch invariance is a property of the device handle the weights
        // (and so every activation) live on: its ops pick invariant kernels.
        let device = match config.batch_invariant {
            true => device.with_batch_invariant_kernels(),
            false => device.clone(),
        };
        let (model, dspark) = load_model_placed(dir, &device, check_finite, config.engram_tables)?;
        let config = EngineConfig {
            max_context: config.max_context.min(model.cfg.max_position()),
            ..config
        };
        let mut engine = Engine::new(model, config)?;
        if let (true, Some(weights)) = (config.nextn > 0, dspark) {
            engine = engine.with_drafter(Box::new(drafter::DsparkDrafter { weights }));
        }
        Ok(if dir.join(TOKENIZER_FILE).is_file() {
            engine.with_tokenizer(Tokenizer::from_dir(dir)?)?
        } else {
            engine
        })
    }

    /// The grammar compiler over the tokenizer, built on first use.
    pub fn grammars(&self) -> Result<&Grammars> {
        if let Some(g) = self.grammars.get() {
            return Ok(g);
        }
        let Some(tok) = &self.tokenizer else {
            return Err(arg(
                "so_args",
                "a constraint".into(),
                "structured output needs a model with a tokenizer.json",
            ));
        };
        let t = self.model.cfg.tokens;
        let g = Grammars::new(tok, t.eos, t.bos)?;
        Ok(self.grammars.get_or_init(|| g))
    }

    /// A prompt's ids: text through the tokenizer.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Text(text) => match &self.tokenizer {
                Some(t) => Ok(t.encode(text)?),
                None => Err(arg(
                    "prompt",
                    format!("text of {} bytes", text.len()),
                    "a text prompt needs a model with a tokenizer.json",
                )),
            },
        }
    }

    /// Teacher-forced scoring: one prefill of `prompt ‖ continuation`, and
    /// for every continuation token its log-probability under
    /// softmax(logits / `temperature`) at its position (computed exactly as
    /// [`sample_row`] reports the logprob of a sampled token).
    pub fn score(&self, prompt: &[u32], continuation: &[u32], temperature: f32) -> Result<Scored> {
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
        let mut pool = self.pool(1, tokens.len(), tokens.len())?;
        let seq = pool.add_sequence()?;
        let out = self.model.forward(&mut pool, seq, &tokens)?;
        let v = self.model.cfg.vocab_size;
        let logits = out
            .logits
            .narrow_rows(prompt.len() - 1, continuation.len())?;
        let host = logits.to_vec::<f32>()?;
        let logprobs = continuation
            .iter()
            .enumerate()
            .map(|(i, &t)| logprob(&host[i * v..(i + 1) * v], t, temperature))
            .collect();
        Ok(Scored { logprobs, logits })
    }

    /// Runs every request to completion; result i belongs to request i.
    pub fn generate<P: Clone + Into<Prompt>>(
        &self,
        prompts: &[P],
        params: &[SamplingParams],
    ) -> Vec<Result<Output>> {
        self.generate_streaming(prompts, params, &mut |_| {})
    }

    /// [`Engine::generate`], calling `on_token` for every token as it is
    /// sampled.
    pub fn generate_streaming<P: Clone + Into<Prompt>>(
        &self,
        prompts: &[P],
        params: &[SamplingParams],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Vec<Result<Output>> {
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
        let cfg = &self.model.cfg;
        let mut ok = Vec::new();
        let mut ids: Vec<Vec<u32>> = Vec::with_capacity(prompts.len());
        let mut constraints: Vec<Option<Constraint>> = (0..prompts.len()).map(|_| None).collect();
        for (i, (p, sp)) in prompts.iter().zip(params).enumerate() {
            let p = match self.encode(&p.clone().into()) {
                Ok(p) => p,
                Err(e) => {
                    results[i] = Some(Err(e));
                    ids.push(Vec::new());
                    continue;
                }
            };
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
                if !sp.stop_strings.is_empty() && self.tokenizer.is_none() {
                    return Err(arg(
                        "stop_strings",
                        format!("{:?}", sp.stop_strings),
                        "stop strings need a model with a tokenizer.json",
                    ));
                }
                Ok(())
            };
            let constraint = || -> Result<Option<Constraint>> {
                check()?;
                match &sp.so_args {
                    None => Ok(None),
                    Some(so) => Ok(Some(self.grammars()?.compile(so)?)),
                }
            };
            match constraint() {
                Ok(c) => {
                    ok.push(i);
                    constraints[i] = c;
                }
                Err(e) => results[i] = Some(Err(e)),
            }
            ids.push(p);
        }
        if !ok.is_empty() {
            match self.run(&ids, params, &ok, &mut constraints, on_token) {
                Ok(outs) => {
                    for (i, o) in ok.iter().zip(outs) {
                        results[*i] = Some(o);
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
            .enumerate()
            .map(|(i, r)| {
                r.unwrap_or_else(|| {
                    Err(arg(
                        "prompts",
                        i.to_string(),
                        "the request was left unanswered",
                    ))
                })
            })
            .collect()
    }

    fn run(
        &self,
        prompts: &[Vec<u32>],
        params: &[SamplingParams],
        which: &[usize],
        constraints: &mut [Option<Constraint>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<Vec<Result<Output>>> {
        let longest = which
            .iter()
            .map(|&i| prompts[i].len() + params[i].max_tokens)
            .max()
            .unwrap_or(1);
        let chunk = which.iter().map(|&i| prompts[i].len()).max().unwrap_or(1);
        // A verify step feeds up to nextn + 1 tokens in one chunk, but no
        // position past `longest` (see `Engine::pool`).
        let nextn = self.config.nextn;
        let chunk = chunk.max(nextn + 1);
        // At most max_seqs requests run at once; a finished one's place goes
        // to the next waiting one (plain and speculative decoding alike).
        let cap = self.config.max_seqs.max(1);
        let mut pool = self.pool(which.len().min(cap), longest, chunk)?;
        let mut live: Vec<Live> = Vec::with_capacity(which.len());
        let (mut prefill, mut decode) = (Duration::ZERO, Duration::ZERO);
        let served = self.serve(
            &mut pool,
            which,
            &mut live,
            (&mut prefill, &mut decode),
            constraints,
            params,
            prompts,
            on_token,
        );
        // A failure after some requests finished fails the others only
        // (those still running, or never admitted).
        let failure = served.err();
        let mut outs: Vec<Result<Output>> = Vec::with_capacity(which.len());
        let admitted = live.len();
        for l in live {
            if l.done.is_none()
                && l.failed.is_none()
                && let Some(e) = &failure
            {
                outs.push(Err(arg_from(e)));
                continue;
            }
            outs.push(self.output(l, params, prompts, prefill, decode));
        }
        for _ in admitted..which.len() {
            outs.push(Err(match &failure {
                Some(e) => arg_from(e),
                None => arg(
                    "prompts",
                    admitted.to_string(),
                    "the request was never admitted",
                ),
            }));
        }
        Ok(outs)
    }

    /// Admits `which` into `pool` (at most max_seqs at once, refilling
    /// finished places) and decodes every admitted request to its end,
    /// appending them to `live` in admission order; `times` accumulates the
    /// prefill and decode durations.
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        pool: &mut StatePool,
        which: &[usize],
        live: &mut Vec<Live>,
        times: (&mut Duration, &mut Duration),
        constraints: &mut [Option<Constraint>],
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let (prefill, decode) = times;
        let speculative = self.config.nextn > 0;
        let cap = self.config.max_seqs.max(1);
        // Under speculative decoding, one drafter seed per admitted request.
        let mut seeds = spec::Seeds::default();
        // Plain decode steps on a GPU replay a graph of their device half.
        let graphed = self.config.cuda_graphs && matches!(self.model.device(), Device::Cuda(_));
        let mut graph = crate::model::graph::DecodeGraph::new();
        let mut freed: Vec<bool> = Vec::with_capacity(which.len());
        let mut next = 0;
        loop {
            for (k, (l, f)) in live.iter().zip(freed.iter_mut()).enumerate() {
                if l.done.is_some() && !*f {
                    pool.free_sequence(l.seq)?;
                    seeds.forget(k);
                    *f = true;
                }
            }
            let running = freed.iter().filter(|f| !**f).count();
            if running < cap && next < which.len() {
                let group = &which[next..(next + cap - running).min(which.len())];
                next += group.len();
                let t0 = Instant::now();
                if let Some(more) =
                    self.admit(pool, group, live, constraints, params, prompts, on_token)?
                {
                    seeds.append(more);
                }
                freed.resize(live.len(), false);
                *prefill += t0.elapsed();
                // A request may be done at its first token: free it first.
                continue;
            }
            // A live request has sampled at least its prefill token.
            let (active, toks): (Vec<usize>, Vec<[u32; 1]>) = live
                .iter()
                .enumerate()
                .filter(|(_, l)| l.done.is_none())
                .filter_map(|(k, l)| l.tokens.last().map(|&t| (k, [t])))
                .unzip();
            if active.is_empty() {
                if next < which.len() {
                    continue;
                }
                break;
            }
            let t1 = Instant::now();
            if speculative {
                self.speculative_step(pool, live, &active, &mut seeds, params, prompts, on_token)?;
            } else if graphed {
                // Here no request can join before one finishes (the
                // admission above would have run): pipeline the steps.
                self.decode_pipelined(
                    pool, live, &active, toks, &mut graph, params, prompts, on_token,
                )?;
                // Frees and prefills come next on the stream: not an idle
                // gap between decode steps.
                graph.restart_gaps();
            } else {
                let inputs: Vec<SeqInput> = active
                    .iter()
                    .zip(&toks)
                    .map(|(&k, t)| SeqInput {
                        seq: live[k].seq,
                        tokens: t,
                    })
                    .collect();
                let out = self.model.step(pool, &inputs, Capture::default())?;
                let rows: Vec<(usize, usize)> = active.iter().copied().zip(0..).collect();
                self.sample(&out.logits, &rows, live, params, prompts, on_token)?;
            }
            *decode += t1.elapsed();
        }
        Ok(())
    }

    /// Plain decode steps of the requests `active` (their last tokens
    /// `toks`) on a GPU, replayed from `graph` and pipelined (issue 11's
    /// async scheduling): the host half of step N+1 (`Model::decode_prepare`,
    /// each request's token of step N standing in for its next one) runs
    /// while step N is on the device; once step N is sampled its tokens
    /// replace the stand-ins (`Model::decode_set_tokens`) and step N+1
    /// launches. Returns once a request of `active` has finished (the
    /// batch may then change), after waiting for the last launched step.
    ///
    /// Every prepared step launches (its claims are in the pool): a request
    /// that finished at step N by a stop token or a grammar still has its
    /// row in step N+1, whose output for it is dropped; it feeds at most
    /// position S + e ≤ S + `max_tokens` − 1, inside its pool's sizing
    /// ([`Engine::pool`]). A step after which a request reaches
    /// `max_tokens` is not followed by a prepared one. Tokens, log-probs
    /// and streaming events are those of [`Model::decode_graphed`] steps;
    /// the one step with a finished request's row has one more row than a
    /// serial engine's, so on a device that is not batch-invariant the
    /// other requests' last bits may differ from a serial run's there, as
    /// with any other batch.
    #[allow(clippy::too_many_arguments)]
    fn decode_pipelined(
        &self,
        pool: &mut StatePool,
        live: &mut [Live],
        active: &[usize],
        mut toks: Vec<[u32; 1]>,
        graph: &mut crate::model::graph::DecodeGraph,
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let model = &self.model;
        let seqs: Vec<SeqId> = active.iter().map(|&k| live[k].seq).collect();
        fn inputs<'a>(seqs: &[SeqId], toks: &'a [[u32; 1]]) -> Vec<SeqInput<'a>> {
            seqs.iter()
                .zip(toks)
                .map(|(&seq, t)| SeqInput { seq, tokens: t })
                .collect()
        }
        let rows: Vec<(usize, usize)> = active.iter().copied().zip(0..).collect();
        let prep = model.decode_prepare(pool, &inputs(&seqs, &toks), graph)?;
        let mut launched = model.decode_launch(pool, prep, graph)?;
        model.decode_advance(pool, &mut launched, graph)?;
        loop {
            // Whether a request reaches max_tokens with the step in flight.
            let last = active.iter().any(|&k| {
                let l = &live[k];
                params
                    .get(l.index)
                    .is_none_or(|p| l.tokens.len() + 1 >= p.max_tokens)
            });
            let next = if last {
                None
            } else {
                Some(model.decode_prepare(pool, &inputs(&seqs, &toks), graph)?)
            };
            let out = model.decode_wait(pool, launched, graph)?;
            self.sample(&out.logits, &rows, live, params, prompts, on_token)?;
            let Some(mut next) = next else {
                return Ok(());
            };
            if active.iter().all(|&k| live[k].done.is_some()) {
                // Nobody left to decode: the prepared step is not launched
                // (its sequences are freed next, claims and all).
                return Ok(());
            }
            // Each live request's new token; a finished one keeps its
            // stand-in (its row's output is dropped).
            for (t, &k) in toks.iter_mut().zip(active) {
                if let (None, Some(&x)) = (&live[k].done, live[k].tokens.last()) {
                    *t = [x];
                }
            }
            let flat: Vec<u32> = toks.iter().map(|t| t[0]).collect();
            model.decode_set_tokens(pool, &mut next, &flat)?;
            launched = model.decode_launch(pool, next, graph)?;
            model.decode_advance(pool, &mut launched, graph)?;
            if active.iter().any(|&k| live[k].done.is_some()) {
                let out = model.decode_wait(pool, launched, graph)?;
                let still: Vec<(usize, usize)> = rows
                    .iter()
                    .copied()
                    .filter(|&(k, _)| live[k].done.is_none())
                    .collect();
                return self.sample(&out.logits, &still, live, params, prompts, on_token);
            }
        }
    }

    /// The output of a finished request (its own failure, if it failed).
    fn output(
        &self,
        l: Live,
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        prefill: Duration,
        decode: Duration,
    ) -> Result<Output> {
        if let Some(e) = l.failed {
            return Err(e);
        }
        let Some(stop) = l.done else {
            return Err(arg(
                "prompts",
                l.index.to_string(),
                "the request left the decode loop unfinished",
            ));
        };
        let p = &params[l.index];
        let text = match &self.tokenizer {
            Some(t) => {
                // A final stop token or EOS ends the output; it is
                // not text.
                let body = match l.tokens.split_last() {
                    Some((last, body))
                        if p.stop.contains(last) || *last == self.model.cfg.tokens.eos =>
                    {
                        body
                    }
                    _ => &l.tokens[..],
                };
                let mut text = t.decode(body)?;
                if let StopReason::StopString(s) = &stop
                    && let Some(at) = text.find(s.as_str())
                {
                    text.truncate(at);
                }
                Some(text)
            }
            None => None,
        };
        Ok(Output {
            prompt: prompts[l.index].clone(),
            tokens: l.tokens,
            text,
            stop,
            logprobs: p.logprobs.then_some(l.logprobs),
            prefill,
            decode,
            spec: l.spec,
        })
    }

    /// Prefills requests `group` (indices into `prompts`) into `pool`,
    /// appends them to `live` and samples each one's first token; returns
    /// the drafter's seeds under speculative decoding.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        pool: &mut StatePool,
        group: &[usize],
        live: &mut Vec<Live>,
        constraints: &mut [Option<Constraint>],
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<Option<spec::Seeds>> {
        let batch: Vec<&[u32]> = group.iter().map(|&i| &prompts[i][..]).collect();
        // Speculative decoding seeds its drafter with the target features of
        // each prompt's last positions, which the prefill computes.
        let (pre, seeds) = if self.config.nextn > 0 {
            let (pre, seeds) = self.prefill_for_drafter(pool, &batch)?;
            (pre, Some(seeds))
        } else {
            (self.prefill(pool, &batch)?, None)
        };
        let start = live.len();
        for (&i, &seq) in group.iter().zip(&pre.seqs) {
            live.push(Live {
                index: i,
                seq,
                constraint: constraints[i].take(),
                failed: None,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                done: None,
                spec: None,
            });
        }
        let last: Vec<(usize, usize)> = pre
            .last
            .iter()
            .enumerate()
            .map(|(j, &r)| (start + j, r))
            .collect();
        self.sample(&pre.logits, &last, live, params, prompts, on_token)?;
        Ok(seeds)
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
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let v = self.model.cfg.vocab_size;
        if rows
            .iter()
            .all(|&(k, _)| live.get(k).is_some_and(|l| l.greedy(params)))
        {
            return self.sample_greedy(logits, rows, live, params, prompts, on_token);
        }
        let host = logits.to_vec::<f32>()?;
        let row = |r: usize| {
            host.get(r * v..(r + 1) * v)
                .ok_or_else(|| arg("rows", r.to_string(), "a row past the logits"))
        };
        // The unconstrained rows' draws depend on nothing but their row and
        // request: several threads take them (a vocabulary row is a few ms
        // of sorting and exp), then every row is emitted in order.
        // (request, row, params, position, step) of each free row.
        let jobs: Vec<(usize, usize, &SamplingParams, u64, usize)> = rows
            .iter()
            .filter_map(|&(k, r)| {
                let l = live.get(k).filter(|l| l.constraint.is_none())?;
                Some((k, r, &params[l.index], l.position(prompts), l.tokens.len()))
            })
            .collect();
        let drawn = crate::parallel::map(
            &jobs,
            crate::parallel::available_threads(),
            |&(_, r, p, position, step)| draw(row(r)?, p, position, step, None),
            || arg("rows", "a sampling thread".into(), "panicked"),
        )?;
        let mut drawn = jobs.iter().map(|j| j.0).zip(drawn);
        for &(k, r) in rows {
            let l = &mut live[k];
            let sampled = match &l.constraint {
                None => match drawn.next() {
                    Some((at, s)) if at == k => {
                        s.and_then(|s| self.emit(s, l, &params[l.index], on_token))
                    }
                    _ => Err(arg(
                        "rows",
                        k.to_string(),
                        "a free row without its draw (internal)",
                    )),
                },
                Some(_) => {
                    row(r).and_then(|row| self.sample_one(row, l, params, prompts, on_token))
                }
            };
            if let Err(e) = sampled {
                l.failed = Some(e);
                l.done = Some(StopReason::Length);
            }
        }
        Ok(())
    }

    /// [`Engine::sample`] when every row is greedy and unconstrained: the
    /// argmax and the finiteness check run where the logits are
    /// (`ops::argmax`, `ops::first_non_finite`), so only two ints a row
    /// leave the device (and a failing row, to name its value). Bitwise
    /// the host path: the same argmax rule, the same error.
    fn sample_greedy(
        &self,
        logits: &crate::Tensor,
        rows: &[(usize, usize)],
        live: &mut [Live],
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let picked: Vec<usize> = rows.iter().map(|&(_, r)| r).collect();
        let all = picked.len() == logits.rows() && picked.iter().enumerate().all(|(i, &r)| i == r);
        let gathered;
        let x = if all {
            logits
        } else {
            gathered = crate::ops::gather_rows(logits, &picked)?;
            &gathered
        };
        let greedy = GreedyRows::of(x)?;
        for (i, &(k, _)) in rows.iter().enumerate() {
            let l = &mut live[k];
            let p = &params[l.index];
            let position = l.position(prompts);
            let sampled = greedy
                .pick(i, position, l.tokens.len())
                .and_then(|s| self.emit(s, l, p, on_token));
            if let Err(e) = sampled {
                l.failed = Some(e);
                l.done = Some(StopReason::Length);
            }
        }
        Ok(())
    }

    /// Samples one request's next token from its logits `row`.
    fn sample_one(
        &self,
        row: &[f32],
        l: &mut Live,
        params: &[SamplingParams],
        prompts: &[Vec<u32>],
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let p = &params[l.index];
        let s = draw(
            row,
            p,
            l.position(prompts),
            l.tokens.len(),
            l.constraint.as_mut(),
        )?;
        self.emit(s, l, p, on_token)
    }

    /// Appends a chosen token to a request's output, consumes it in its
    /// constraint, reports it, and marks the request done on a stop token
    /// or string, a complete grammar or `max_tokens`.
    fn emit(
        &self,
        s: Sample,
        l: &mut Live,
        p: &SamplingParams,
        on_token: &mut dyn FnMut(TokenEvent),
    ) -> Result<()> {
        let grammar_done = match &mut l.constraint {
            Some(c) => c.consume(s.token)?,
            None => false,
        };
        l.tokens.push(s.token);
        l.logprobs.push(s.logprob);
        on_token(TokenEvent {
            request: l.index,
            index: l.tokens.len() - 1,
            token: s.token,
        });
        if p.stop.contains(&s.token) {
            l.done = Some(StopReason::Stop(s.token));
        } else if let Some(hit) = self.stop_string(&l.tokens, &p.stop_strings)? {
            l.done = Some(StopReason::StopString(hit));
        } else if grammar_done {
            l.done = Some(StopReason::Grammar);
        } else if l.tokens.len() == p.max_tokens {
            l.done = Some(StopReason::Length);
        }
        Ok(())
    }
}

impl Engine {
    /// The first of `stops` that the decoded output now ends within: only
    /// the text of the last tokens is decoded (a stop string of n bytes
    /// spans at most n tokens, plus up to 3 of a split UTF-8 character).
    fn stop_string(&self, tokens: &[u32], stops: &[String]) -> Result<Option<String>> {
        let Some(tok) = &self.tokenizer else {
            return Ok(None);
        };
        if stops.is_empty() {
            return Ok(None);
        }
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let tail = &tokens[tokens.len().saturating_sub(longest + 3)..];
        let last = &tokens[tokens.len() - 1..];
        let text = tok.decode(tail)?;
        let before = tok.decode(&tail[..tail.len() - last.len()])?;
        // A hit that was already complete before the last token would have
        // stopped the request then; only the new text can complete one.
        Ok(stops
            .iter()
            .find(|s| text.contains(s.as_str()) && !before.contains(s.as_str()))
            .cloned())
    }
}

impl Engine {
    /// The state pool of one batch: `seqs` sequences of up to `context`
    /// tokens fed in chunks of up to `chunk`, within `min(pool_memory, free
    /// device memory − a step's headroom)` (`pool::PoolMemory`; checked
    /// before anything is allocated).
    ///
    /// Sizing invariant: `context` is the longest prompt + `max_tokens`
    /// (a bound the caches never reach: the last sampled token is never
    /// fed, so the positions fed end at S + `max_tokens` − 1 for a prompt of
    /// S), and speculative decoding adds no positions to it, since the drafts
    /// of a step are capped so that every accepted draft plus the target's
    /// own token fits `max_tokens` (`spec::propose`): a verify step of
    /// `[last, d_1 .. d_k]` at position S + e − 1 (e tokens emitted) feeds
    /// positions up to S + e − 1 + k ≤ S + `max_tokens` − 2. It only widens
    /// `chunk` to nextn + 1 (a verify step's rows, which the window rings
    /// hold on top of the checkpoint's window). Sizing `context` nextn past
    /// the longest request would reserve pages no step can reach
    /// (`tests/spec_decode_cpu.rs` runs an always-right drafter within a
    /// `pool_memory` of exactly this pool).
    fn pool(&self, seqs: usize, context: usize, chunk: usize) -> Result<StatePool> {
        let cfg = &self.model.cfg;
        let device = self.model.device();
        let headroom = step_headroom(&device, cfg, seqs.saturating_mul(chunk));
        let memory = PoolMemory::query(&device, 0, headroom, self.config.pool_memory)?;
        let pc = PoolConfig::within(cfg, &memory, seqs, context, chunk, self.config.page_rows)?;
        StatePool::new(cfg, &device, pc)
    }
}

/// Each row's greedy token and first non-finite index (−1: none) of a
/// logits tensor, computed where the logits are (`ops::argmax`,
/// `ops::first_non_finite`): two ints a row leave a GPU, and a failing row
/// only to name its value.
struct GreedyRows<'a> {
    ids: Vec<i32>,
    bad: Vec<i32>,
    logits: &'a crate::Tensor,
}

impl<'a> GreedyRows<'a> {
    fn of(logits: &'a crate::Tensor) -> Result<GreedyRows<'a>> {
        Ok(GreedyRows {
            ids: crate::ops::argmax(logits)?.to_vec::<i32>()?,
            bad: crate::ops::first_non_finite(logits)?.to_vec::<i32>()?,
            logits,
        })
    }

    /// Row `r`'s greedy sample (what `sample_row` gives at temperature 0),
    /// or the error [`check_finite`] gives for its first non-finite logit;
    /// `position` and `step` name the row in that error.
    fn pick(&self, r: usize, position: u64, step: usize) -> Result<Sample> {
        if let Ok(at) = usize::try_from(self.bad[r]) {
            let row = self.logits.narrow_rows(r, 1)?.to_vec::<f32>()?;
            return Err(non_finite(row[at], at, position, step));
        }
        Ok(Sample {
            token: u32::try_from(self.ids[r]).unwrap_or(0),
            logprob: 0.0,
        })
    }
}

/// A logits row with a NaN or ±Inf fails its request: the error names the
/// value, its vocabulary id, the position the row predicts and the decode
/// step (the index of the output token it was to choose).
fn check_finite(row: &[f32], position: u64, step: usize) -> Result<()> {
    match row.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        Some((bad, &x)) => Err(non_finite(x, bad, position, step)),
        None => Ok(()),
    }
}

/// One request's token from its logits `row` for `position` (decode step
/// `step`): the row checked finite, then drawn with the request's uniform
/// there, through `constraint`'s mask when it has one.
fn draw(
    row: &[f32],
    p: &SamplingParams,
    position: u64,
    step: usize,
    constraint: Option<&mut Constraint>,
) -> Result<Sample> {
    check_finite(row, position, step)?;
    let u = rng::uniform(p.seq_seed, position, 0, Domain::Target);
    Ok(match constraint {
        Some(c) => {
            let mut masked = row.to_vec();
            c.mask(&mut masked)?;
            sample_row(&masked, p, u)
        }
        None => sample_row(row, p, u),
    })
}

/// The error of logit `x` at vocabulary id `bad` (non-finite) of the row
/// predicting `position`, at decode step `step` of its request.
fn non_finite(x: f32, bad: usize, position: u64, step: usize) -> Error {
    arg(
        "logits",
        format!("{x} at vocabulary id {bad}, position {position}, decode step {step}"),
        "non-finite logit",
    )
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
