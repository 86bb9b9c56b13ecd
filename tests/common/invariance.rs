//! Batch invariance in SGLang's three modes (`serving.md` §4.5), one body
//! for every device: a request's sampled tokens and logprobs are bitwise
//! the same alone and in every batch composition — one prompt across batch
//! sizes, short and long prompts mixed, and prompts sharing prefixes of 1,
//! 511, 2048 and 4097 tokens. 22 compositions in all, sampled at
//! temperature > 0 with per-request seeds (and one greedy request per mode).

use deepinfer::Device;
use deepinfer::engine::{Engine, EngineConfig, Output, SamplingParams};
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::HashMap;

pub type Request = (Vec<u32>, SamplingParams);

pub fn request(rng: &mut StdRng, prompt: Vec<u32>, greedy: bool) -> Request {
    let p = SamplingParams {
        temperature: if greedy {
            0.0
        } else {
            rng.random_range(0.6..1.4)
        },
        top_p: if rng.random_bool(0.5) { 1.0 } else { 0.9 },
        top_k: if rng.random_bool(0.5) { 0 } else { 50 },
        max_tokens: rng.random_range(3..7),
        seq_seed: rng.random(),
        logprobs: true,
        ..SamplingParams::default()
    };
    (prompt, p)
}

pub fn tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..512)).collect()
}

struct Checker {
    engine: Engine,
    alone: HashMap<usize, Output>,
    compositions: usize,
}

impl Checker {
    /// Runs `batch` (indices into `reqs`) together and compares every
    /// request with its run alone.
    fn check(&mut self, reqs: &[Request], batch: &[usize], mode: &str) {
        let (prompts, params): (Vec<_>, Vec<_>) = batch.iter().map(|&i| reqs[i].clone()).unzip();
        let together = self.engine.generate(&prompts, &params);
        for (&i, t) in batch.iter().zip(together) {
            let t = t.unwrap();
            let alone = self.alone.entry(i).or_insert_with(|| {
                self.engine
                    .generate(
                        std::slice::from_ref(&reqs[i].0),
                        std::slice::from_ref(&reqs[i].1),
                    )
                    .remove(0)
                    .unwrap()
            });
            assert_eq!(t.tokens, alone.tokens, "{mode}: request {i} in {batch:?}");
            let bits = |o: &Output| {
                o.logprobs
                    .as_ref()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                bits(&t),
                bits(alone),
                "{mode}: logprobs of request {i} in {batch:?}"
            );
        }
        self.compositions += 1;
    }
}

/// SGLang's three modes (module doc) on the tiny model loaded onto
/// `device` with `batch_invariant` set: every request of every composition
/// bitwise its run alone. `quick` (the sanitizer passes) keeps the single
/// mode's six compositions. Returns how many compositions were checked.
pub fn compositions_match_solo_runs(test: &str, device: &Device, quick: bool) -> usize {
    let mut rng = super::rng(test);
    let engine = Engine::new(
        super::tiny::tiny_model_on(rng.random(), device).0,
        EngineConfig {
            max_context: 4200,
            max_seqs: 16,
            batch_invariant: true,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut c = Checker {
        engine,
        alone: HashMap::new(),
        compositions: 0,
    };

    // Single: one prompt among 1..16 others of random lengths.
    let needle = tokens(&mut rng, 17);
    let mut reqs: Vec<Request> = vec![request(&mut rng, needle, false)];
    for _ in 0..15 {
        let n = rng.random_range(1..40);
        let t = tokens(&mut rng, n);
        reqs.push(request(&mut rng, t, false));
    }
    for size in [2usize, 3, 5, 8, 12, 16] {
        let mut batch: Vec<usize> = (1..16).collect();
        batch.truncate(size - 1);
        batch.insert(rng.random_range(0..size), 0);
        c.check(&reqs, &batch, "single");
    }
    if quick {
        return c.compositions;
    }

    // Mixed: short (2–10) and long (200–400) prompts in shuffled batches.
    let base = reqs.len();
    for k in 0..10 {
        let n = if k % 2 == 0 {
            rng.random_range(2..11)
        } else {
            rng.random_range(200..401)
        };
        let t = tokens(&mut rng, n);
        reqs.push(request(&mut rng, t, k == 0));
    }
    for _ in 0..8 {
        let size = rng.random_range(2..8);
        let mut batch: Vec<usize> = (base..base + 10).collect();
        for i in (1..batch.len()).rev() {
            batch.swap(i, rng.random_range(0..=i));
        }
        batch.truncate(size);
        c.check(&reqs, &batch, "mixed");
    }

    // Prefix: requests sharing a prefix of 1, 511, 2048 or 4097 tokens.
    for (l, n, compositions) in [
        (1usize, 4usize, 4usize),
        (511, 3, 2),
        (2048, 2, 1),
        (4097, 2, 1),
    ] {
        let prefix = tokens(&mut rng, l);
        let base = reqs.len();
        for k in 0..n {
            let mut p = prefix.clone();
            let extra = rng.random_range(1..6);
            p.extend(tokens(&mut rng, extra));
            reqs.push(request(&mut rng, p, k == 0 && l == 1));
        }
        for _ in 0..compositions {
            let mut batch: Vec<usize> = (base..base + n).collect();
            for i in (1..batch.len()).rev() {
                batch.swap(i, rng.random_range(0..=i));
            }
            let size = rng.random_range(2..=n);
            batch.truncate(size);
            c.check(&reqs, &batch, &format!("prefix {l}"));
        }
    }
    c.compositions
}
