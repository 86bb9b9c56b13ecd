//! Batch invariance on the CPU (the GPU runs the same body in
//! `cuda_batch_invariance.rs`), in SGLang's three modes (`serving.md` §4.5):
//! a request's sampled tokens and logprobs are bitwise the same alone and
//! in every batch composition — one prompt across batch sizes, short and
//! long prompts mixed, and prompts sharing prefixes of 1, 511, 2048 and
//! 4097 tokens. 22 compositions in all, sampled at temperature > 0 with
//! per-request seeds (and one greedy request per mode).

mod common;

use common::invariance::{Request, compositions_match_solo_runs, request, tokens};
use deepinfer::Device;
use deepinfer::engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use deepinfer::engine::{Engine, EngineConfig, Output};
use rand::Rng;

/// The three modes' 22 compositions (`common::invariance`), on the CPU.
#[test]
fn outputs_are_bitwise_the_same_in_every_batch_composition() {
    let n = compositions_match_solo_runs("batch_invariance", &Device::Cpu, false);
    assert!(n >= 20, "{n} compositions");
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
