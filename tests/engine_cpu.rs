//! Offline inference on the CPU: the Philox4x32-10 generator against the
//! Random123 known-answer vectors; the sampler (greedy, top-k, top-p, and a
//! χ² test of its distribution at temperature 1); and the engine: a
//! request's tokens depend only on its prompt, parameters and seed, not on
//! the batch; other seeds give other tokens; greedy equals the runner's
//! greedy generation; a request with bad parameters fails alone.

mod common;

use common::limits::{Counting, bounded};
use deepinfer::engine::rng::{Domain, philox4x32_10, uniform};
use deepinfer::engine::{Engine, EngineConfig, SamplingParams, StopReason, sample_row};
use deepinfer::model::forward::Model;
use deepinfer::model::runner::generate_greedy;
use rand::Rng;
use std::time::Duration;

/// The absurd-length cases run under [`bounded`]'s memory and time limits.
#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn philox_matches_the_random123_known_answers() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn uniforms_are_in_range_and_domains_are_apart() {
    let mut rng = common::rng("engine_uniform");
    let seed: u64 = rng.random();
    let mut sum = 0.0;
    for p in 0..10_000u64 {
        let u = uniform(seed, p, 0, Domain::Target);
        assert!((0.0..1.0).contains(&u));
        sum += u;
        assert_ne!(u, uniform(seed, p, 0, Domain::Draft));
        assert_ne!(u, uniform(seed, p, 1, Domain::Target));
        assert_eq!(
            u,
            uniform(seed, p, 0, Domain::Target),
            "a draw is a function of its key"
        );
    }
    let mean = sum / 10_000.0;
    assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
}

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..SamplingParams::default()
    }
}

#[test]
fn the_sampler_is_greedy_at_zero_and_restricts_by_top_k_and_top_p() {
    let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
    for u in [0.0, 0.3, 0.999] {
        assert_eq!(
            sample_row(&logits, &params(0.0), u).token,
            1,
            "ties go to the lower id"
        );
        let k1 = SamplingParams {
            top_k: 1,
            ..params(1.0)
        };
        assert_eq!(sample_row(&logits, &k1, u).token, 1);
        let k2 = SamplingParams {
            top_k: 2,
            ..params(1.0)
        };
        assert!([1, 2].contains(&sample_row(&logits, &k2, u).token));
        // The two 3.0 logits hold 2·e^3 / Σ ≈ 0.84 of the mass: top_p 0.8
        // keeps exactly them.
        let p8 = SamplingParams {
            top_p: 0.8,
            ..params(1.0)
        };
        assert!([1, 2].contains(&sample_row(&logits, &p8, u).token));
    }
    assert_eq!(
        sample_row(&logits, &params(1.0), 0.0).token,
        1,
        "u = 0 picks the most likely"
    );
    let s = sample_row(&logits, &params(1.0), 0.0);
    let total: f64 = logits.iter().map(|&l| (l as f64 - 3.0).exp()).sum();
    assert!((s.logprob as f64 - (1.0 / total).ln()).abs() < 1e-6);
}

#[test]
fn sampled_frequencies_follow_the_softmax() {
    // χ² with 7 degrees of freedom; 42 is its 1 − 1e-6 quantile
    // (Wilson–Hilferty), so a correct sampler fails about once in a million.
    let mut rng = common::rng("engine_chi2");
    let logits = [0.3f32, -1.0, 2.0, 0.0, 1.1, -0.4, 0.9, 1.5];
    let t = 1.3f32;
    let z: Vec<f64> = logits.iter().map(|&l| l as f64 / t as f64).collect();
    let norm: f64 = z.iter().map(|v| v.exp()).sum();
    let seed: u64 = rng.random();
    let n = 40_000;
    let mut counts = [0usize; 8];
    for p in 0..n {
        let u = uniform(seed, p as u64, 0, Domain::Target);
        counts[sample_row(&logits, &params(t), u).token as usize] += 1;
    }
    let chi2: f64 = counts
        .iter()
        .zip(&z)
        .map(|(&c, &zi)| {
            let e = n as f64 * zi.exp() / norm;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    assert!(chi2 < 42.0, "chi2 {chi2}, counts {counts:?}");
}

fn tiny_model(seed: u64) -> Model {
    common::tiny::tiny_model(seed).0
}

#[test]
fn a_request_samples_the_same_tokens_alone_or_in_any_batch() {
    let mut rng = common::rng("engine_batch");
    let engine = Engine::new(
        tiny_model(rng.random()),
        EngineConfig {
            max_context: 128,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let vocab = engine.model.cfg.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|_| {
            (0..rng.random_range(3..30))
                .map(|_| rng.random_range(0..vocab))
                .collect()
        })
        .collect();
    let params: Vec<SamplingParams> = (0..4)
        .map(|i| SamplingParams {
            temperature: [0.0, 0.7, 1.0, 1.5][i],
            top_p: [1.0, 0.9, 1.0, 0.95][i],
            top_k: [0, 0, 20, 0][i],
            max_tokens: rng.random_range(5..20),
            seq_seed: rng.random(),
            logprobs: true,
            ..SamplingParams::default()
        })
        .collect();
    let together = engine.generate(&prompts, &params);
    for (i, (p, sp)) in prompts.iter().zip(&params).enumerate() {
        let alone = engine.generate(std::slice::from_ref(p), std::slice::from_ref(sp));
        let (a, t) = (alone[0].as_ref().unwrap(), together[i].as_ref().unwrap());
        assert_eq!(a.tokens, t.tokens, "request {i}");
        assert_eq!(a.logprobs, t.logprobs, "request {i}");
        assert_eq!(t.stop, StopReason::Length);
        assert_eq!(t.tokens.len(), sp.max_tokens);
    }
    // Reordered batch with a neighbour twice as long.
    let order = [2usize, 0, 3, 1];
    let p2: Vec<_> = order.iter().map(|&i| prompts[i].clone()).collect();
    let s2: Vec<_> = order.iter().map(|&i| params[i].clone()).collect();
    for (k, r) in engine.generate(&p2, &s2).iter().enumerate() {
        assert_eq!(
            r.as_ref().unwrap().tokens,
            together[order[k]].as_ref().unwrap().tokens
        );
    }
    // Another seed gives other tokens (at temperature 1 over 128 ids).
    let mut other = params[2].clone();
    other.seq_seed ^= 1;
    let o = engine.generate(&prompts[2..3], &[other]);
    assert_ne!(
        o[0].as_ref().unwrap().tokens,
        together[2].as_ref().unwrap().tokens
    );
}

#[test]
fn greedy_requests_equal_the_runner_and_bad_ones_fail_alone() {
    let mut rng = common::rng("engine_greedy");
    let engine = Engine::new(
        tiny_model(rng.random()),
        EngineConfig {
            max_context: 64,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let vocab = engine.model.cfg.vocab_size as u32;
    let prompt: Vec<u32> = (0..9).map(|_| rng.random_range(0..vocab)).collect();
    let want = generate_greedy(&engine.model, &prompt, 12, None)
        .unwrap()
        .tokens;
    let good = SamplingParams {
        max_tokens: 12,
        ..SamplingParams::default()
    };
    let stop_at = SamplingParams {
        max_tokens: 12,
        stop: vec![want[3]],
        ..SamplingParams::default()
    };
    let bads = [
        SamplingParams {
            temperature: -1.0,
            ..good.clone()
        },
        SamplingParams {
            top_p: 0.0,
            ..good.clone()
        },
        SamplingParams {
            max_tokens: 0,
            ..good.clone()
        },
        SamplingParams {
            max_tokens: 10_000,
            ..good.clone()
        },
        SamplingParams {
            stop: vec![vocab],
            ..good.clone()
        },
    ];
    let mut prompts = vec![prompt.clone(), prompt.clone()];
    let mut params = vec![good.clone(), stop_at];
    for b in &bads {
        prompts.push(prompt.clone());
        params.push(b.clone());
    }
    prompts.push(vec![]);
    params.push(good.clone());
    prompts.push(vec![vocab]);
    params.push(good);
    let out = engine.generate(&prompts, &params);
    assert_eq!(out[0].as_ref().unwrap().tokens, want);
    let stopped = out[1].as_ref().unwrap();
    let first = want.iter().position(|&t| t == want[3]).unwrap();
    assert_eq!(stopped.tokens, want[..=first]);
    assert_eq!(stopped.stop, StopReason::Stop(want[3]));
    for (r, arg) in out[2..].iter().zip([
        "temperature",
        "top_p",
        "max_tokens",
        "max_tokens",
        "stop",
        "prompt",
        "prompt",
    ]) {
        let e = r.as_ref().unwrap_err();
        assert!(
            matches!(e.op(), Some(deepinfer::Error::Argument { arg: a, .. }) if *a == arg),
            "{e}"
        );
    }
}

#[test]
fn absurd_lengths_are_typed_errors_before_any_allocation() {
    let engine = Engine::new(
        tiny_model(3),
        EngineConfig {
            max_context: deepinfer::engine::MAX_CONTEXT,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let huge = SamplingParams {
        max_tokens: usize::MAX,
        ..SamplingParams::default()
    };
    // Each refusal within 2 s and 16 MiB on the calling thread.
    let refused = |label: &str, p: SamplingParams| {
        bounded(label, 16 << 20, Duration::from_secs(2), || {
            engine.generate(&[vec![1, 2]], &[p]).remove(0).unwrap_err()
        })
        .0
    };
    let e = refused("max_tokens usize::MAX", huge);
    assert!(e.to_string().contains("max_tokens"), "{e}");
    // Legal on paper, far beyond this machine: the pool refuses by size.
    let big = SamplingParams {
        max_tokens: 1 << 30,
        ..SamplingParams::default()
    };
    let e = refused("max_tokens 2^30", big);
    assert!(
        e.to_string().contains("bytes") || e.to_string().contains("2^31"),
        "{e}"
    );
    let Err(e) = Engine::new(
        tiny_model(3),
        EngineConfig {
            max_seqs: 0,
            ..EngineConfig::default()
        },
    ) else {
        panic!("max_seqs 0 accepted");
    };
    assert!(e.to_string().contains("max_seqs"), "{e}");
}

#[test]
fn a_pool_budget_refuses_a_batch_it_cannot_hold_and_admits_one_it_can() {
    let with_budget = |bytes| {
        Engine::new(
            tiny_model(3),
            EngineConfig {
                pool_memory: Some(bytes),
                ..EngineConfig::default()
            },
        )
        .unwrap()
    };
    let params = SamplingParams {
        max_tokens: 4,
        ..SamplingParams::default()
    };
    let e = with_budget(1 << 10)
        .generate(&[vec![1, 2, 3]], std::slice::from_ref(&params))
        .remove(0)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("state pool") && msg.contains("1024 available"),
        "{msg}"
    );
    // The same request within a budget of 64 MiB runs.
    let out = with_budget(64 << 20)
        .generate(&[vec![1, 2, 3]], &[params])
        .remove(0)
        .unwrap();
    assert_eq!(out.tokens.len(), 4);
}

#[test]
fn teacher_forced_scores_equal_the_logprobs_of_generation_bitwise() {
    let mut rng = common::rng("engine_score");
    let engine = Engine::new(
        tiny_model(rng.random()),
        EngineConfig {
            max_context: 64,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let vocab = engine.model.cfg.vocab_size as u32;
    let prompt: Vec<u32> = (0..11).map(|_| rng.random_range(0..vocab)).collect();
    let sp = SamplingParams {
        temperature: 1.0,
        max_tokens: 14,
        seq_seed: rng.random(),
        logprobs: true,
        ..SamplingParams::default()
    };
    let out = engine
        .generate(std::slice::from_ref(&prompt), &[sp])
        .remove(0)
        .unwrap();
    let scored = engine.score(&prompt, &out.tokens, 1.0).unwrap().logprobs;
    let want = out.logprobs.unwrap();
    assert_eq!(
        scored.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "score {scored:?} vs generate {want:?}"
    );
    assert!(scored.iter().all(|&l| l <= 0.0 && l.is_finite()));
    assert!(engine.score(&prompt, &[], 1.0).is_err());
    assert!(engine.score(&prompt, &[1], 0.0).is_err());
    assert!(
        engine.score(&prompt, &[vocab], 1.0).is_err(),
        "a token outside the vocabulary"
    );
}

/// The tiny model of `seed` with 4 bytes of tensor `name` from byte `at`
/// poisoned with NaN, and its drafter, loaded without the load-time check.
fn poisoned_tiny(
    seed: u64,
    name: &str,
    at: usize,
) -> (Model, deepinfer::model::dspark::DsparkWeights) {
    use deepinfer::model::checkpoint::{Checkpoint, LoadOptions};
    use deepinfer::model::load::{load_weights_on, modulo_token_map};
    let (cfg, dir, ck) = common::tiny::tiny_checkpoint(seed);
    drop(ck);
    common::tiny::poison(dir.path(), name, at);
    let ck = Checkpoint::load(dir.path(), &cfg, &LoadOptions::default()).unwrap();
    let (w, dspark) =
        load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &deepinfer::Device::Cpu).unwrap();
    (Model::new(cfg, w).unwrap(), dspark.unwrap())
}

/// Issue 15: a NaN whose path runs through a FP4 quantiser reaches the
/// logits instead of turning into a finite value there. A NaN in layer 6's
/// compressor `wkv` (ratio 1: each token's entry is pooled, normed, roped and
/// FP4-quantised into the compressed cache) makes every entry NaN; the FP4
/// quantiser used to drop it (`f32::max` in the amax, NaN → code 7), so the
/// request ran to the end on finite logits. Now the entries carry the NaN
/// scale, and the first step fails with the typed logits error.
#[test]
fn a_nan_through_the_fp4_cache_quantiser_reaches_the_logits() {
    let (model, _) = poisoned_tiny(5, "layers.6.attn.compressor.wkv.weight", 0);
    let engine = Engine::new(
        model,
        EngineConfig {
            max_context: 64,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let params = SamplingParams {
        max_tokens: 4,
        ..SamplingParams::default()
    };
    let r = engine.generate(&[vec![0u32, 5, 9]], std::slice::from_ref(&params));
    match &r[0] {
        Err(deepinfer::model::Error::Op(deepinfer::Error::Argument {
            arg: "logits",
            value,
            ..
        })) => assert!(
            value.contains("NaN") && value.contains("decode step 0"),
            "{value}"
        ),
        other => panic!("expected the non-finite logits error, got {other:?}"),
    }
}

/// Issue 15 item 5: a NaN that reaches the logits at run time fails its
/// request with a typed error naming the position and the decode step, on
/// the plain and on the speculative decode path (`spec.rs`'s accept loop).
/// A NaN in the final norm poisons the first
/// logits (step 0, position 3 after a 3-token prompt); a NaN in the
/// embedding row of the token the clean model chooses first poisons only
/// the next step (step 1, position 4), after one good token.
#[test]
fn non_finite_logits_fail_the_request_naming_the_position_and_step() {
    use deepinfer::engine::drafter::DsparkDrafter;
    let prompt = vec![0u32, 5, 9];
    let params = SamplingParams {
        max_tokens: 6,
        ..SamplingParams::default()
    };
    let clean = Engine::new(
        tiny_model(5),
        EngineConfig {
            max_context: 64,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let first = clean.generate(std::slice::from_ref(&prompt), std::slice::from_ref(&params))[0]
        .as_ref()
        .unwrap()
        .tokens[0];
    let hidden = clean.model.cfg.hidden_size;
    // bf16 rows: byte 2 · hidden · t starts row t.
    let cases = [
        ("norm.weight", 0, "position 3, decode step 0"),
        (
            "embed.weight",
            2 * hidden * first as usize,
            "position 4, decode step 1",
        ),
    ];
    for (name, at, want) in cases {
        for nextn in [0, 2] {
            let (model, weights) = poisoned_tiny(5, name, at);
            let mut engine = Engine::new(
                model,
                EngineConfig {
                    max_context: 64,
                    nextn,
                    ..EngineConfig::default()
                },
            )
            .unwrap();
            if nextn > 0 {
                engine = engine.with_drafter(Box::new(DsparkDrafter { weights }));
            }
            let mut streamed = Vec::new();
            let r = engine.generate_streaming(
                std::slice::from_ref(&prompt),
                std::slice::from_ref(&params),
                &mut |e| streamed.push(e.token),
            );
            match &r[0] {
                Err(deepinfer::model::Error::Op(deepinfer::Error::Argument {
                    arg: "logits",
                    value,
                    why,
                    ..
                })) => {
                    assert!(
                        value.contains("NaN") && value.contains(want),
                        "{name}, nextn {nextn}: {value}"
                    );
                    assert_eq!(*why, "non-finite logit");
                }
                other => panic!("{name}, nextn {nextn}: expected a logits error, got {other:?}"),
            }
            // The tokens before the bad step were good and were streamed.
            let steps = if name == "norm.weight" { 0 } else { 1 };
            assert_eq!(streamed.len(), steps, "{name}, nextn {nextn}");
            assert!(streamed.iter().all(|&t| t == first));
        }
    }
}
