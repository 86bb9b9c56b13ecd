//! Batch invariance on the CPU, in SGLang's three modes (`serving.md` §4.5):
//! a request's sampled tokens and logprobs are bitwise the same alone and
//! in every batch composition — one prompt across batch sizes, short and
//! long prompts mixed, and prompts sharing prefixes of 1, 511, 2048 and
//! 4097 tokens. 22 compositions in all, sampled at temperature > 0 with
//! per-request seeds (and one greedy request per mode).

mod common;

use deepinfer::engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use deepinfer::engine::{Engine, EngineConfig, Output, SamplingParams};
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::HashMap;

type Request = (Vec<u32>, SamplingParams);

fn request(rng: &mut StdRng, prompt: Vec<u32>, greedy: bool) -> Request {
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

fn tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
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

#[test]
fn outputs_are_bitwise_the_same_in_every_batch_composition() {
    let mut rng = common::rng("batch_invariance");
    let engine = Engine::new(
        common::tiny::tiny_model(rng.random()).0,
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
    assert!(c.compositions >= 20, "{} compositions", c.compositions);
}

/// More requests than `max_seqs`: a finished request's place goes to the
/// next waiting one, and every request's tokens and logprobs are bitwise
/// those of its run alone, plain and speculative (admitted in waves), with
/// requests that end at their first token among them.
#[test]
fn waiting_requests_take_finished_places_without_changing_any_output() {
    let mut rng = common::rng("batch_refill");
    let seed = rng.random();
    let mut reqs: Vec<Request> = (0..11)
        .map(|_| {
            let n = rng.random_range(1..30);
            let t = tokens(&mut rng, n);
            let greedy = rng.random_bool(0.3);
            request(&mut rng, t, greedy)
        })
        .collect();
    for r in reqs.iter_mut().step_by(4) {
        r.1.max_tokens = 1;
    }
    // Three requests share a 24-token prefix (one repeats it exactly), so
    // the later ones can hit what the first stored.
    let shared = tokens(&mut rng, 24);
    for (k, extra) in [(2usize, 5usize), (6, 0), (9, 11)] {
        let tail = tokens(&mut rng, extra);
        reqs[k].0 = shared.iter().copied().chain(tail).collect();
    }
    let (prompts, params): (Vec<_>, Vec<_>) = reqs.iter().cloned().unzip();
    for nextn in [0usize, 2] {
        let engine = |max_seqs| {
            let (model, dw) = common::tiny::tiny_model(seed);
            let cfg = EngineConfig {
                max_context: 128,
                max_seqs,
                batch_invariant: true,
                nextn,
                ..EngineConfig::default()
            };
            let e = Engine::new(model, cfg).unwrap();
            match (nextn, dw) {
                (0, _) => e,
                (_, Some(weights)) => {
                    e.with_drafter(Box::new(deepinfer::engine::drafter::DsparkDrafter {
                        weights,
                    }))
                }
                (_, None) => panic!("the tiny config has DSpark stages"),
            }
        };
        let (three, one) = (engine(3), engine(1));
        // With a prefix cache too: a later request may hit what an earlier
        // one of the same call stored.
        let cached = engine(3).with_prefix_cache(
            PrefixCache::new(PrefixCacheConfig {
                block_tokens: 4,
                budget_bytes: 1 << 26,
            })
            .unwrap(),
        );
        let via_cache: Vec<Output> = cached
            .generate(&prompts, &params)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let hits = cached.prefix_cache_stats().unwrap().hits;
        assert!(hits > 0, "nextn {nextn}: the shared prefix must hit");
        let serial: Vec<Output> = one
            .generate(&prompts, &params)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let got = three.generate(&prompts, &params);
        for (i, g) in got.into_iter().enumerate() {
            let g = g.unwrap();
            let alone = one
                .generate(
                    std::slice::from_ref(&prompts[i]),
                    std::slice::from_ref(&params[i]),
                )
                .remove(0)
                .unwrap();
            let bits = |o: &Output| -> Vec<u32> {
                o.logprobs
                    .as_ref()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            };
            assert_eq!(g.tokens, alone.tokens, "nextn {nextn}: request {i}");
            assert_eq!(
                bits(&g),
                bits(&alone),
                "nextn {nextn}: logprobs of request {i}"
            );
            if params[i].max_tokens == 1 {
                assert_eq!(g.tokens.len(), 1, "request {i} ends at its first token");
            }
            for (what, o) in [
                ("one place", &serial[i]),
                ("the prefix cache", &via_cache[i]),
            ] {
                assert_eq!(o.tokens, alone.tokens, "nextn {nextn}, {what}: request {i}");
                assert_eq!(
                    bits(o),
                    bits(&alone),
                    "nextn {nextn}, {what}: logprobs of request {i}"
                );
            }
        }
    }
}
