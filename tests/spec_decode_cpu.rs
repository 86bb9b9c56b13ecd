//! Speculative decoding on the CPU (issue 12 item 4) on the tiny model:
//! greedy speculative output equals greedy plain output token for token
//! and logprob for logprob, for every nextn and both schedules, alone and
//! in a mixed batch, and on the real vocabulary under a grammar (JSON
//! Schema, regex) and with stop strings completed inside an accepted draft
//! (same tokens, logprobs, stop reason and text, nothing streamed past the
//! stop); the batch is refilled from the queue as requests finish, with
//! bitwise unchanged outputs in batch-invariant mode; a rollback after a rejection at any draft position
//! leaves the pool exactly as a plain run (the following logits are
//! bitwise equal); sampled speculative output follows the target
//! distribution (chi-square); it runs through the prefix cache and compact
//! prefill, lossless against the same engine's plain decoding and, in the
//! exact mode, drafting exactly as a cold run; bad configurations are
//! typed errors. The ignored `measure_*` test writes the schedule
//! comparison JSON.

mod common;

use deepinfer::engine::drafter::{DraftInput, Drafter, DsparkDrafter, Proposal};
use deepinfer::engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use deepinfer::engine::rng::{Domain, uniform};
use deepinfer::engine::sampling::distribution;
use deepinfer::engine::{Engine, EngineConfig, Output, SamplingParams, SpecStats, YocoMode};
use deepinfer::model::forward::{Capture, Model, SeqInput};
use deepinfer::model::pool::{PoolConfig, StatePool};
use deepinfer::model::truncate::EntryShape;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

fn config(nextn: usize, varlen: bool) -> EngineConfig {
    EngineConfig {
        max_context: 128,
        max_seqs: 64,
        // Small pages, so a rollback's window look-back crosses pages.
        page_rows: 4,
        nextn,
        mtp_varlen: varlen,
        ..EngineConfig::default()
    }
}

/// The tiny model of `seed` decoding plainly (no drafter).
fn plain_engine(seed: u64) -> Engine {
    Engine::new(common::tiny::tiny_model(seed).0, config(0, false)).unwrap()
}

fn dspark_engine(seed: u64, nextn: usize, varlen: bool) -> Engine {
    let (model, dw) = common::tiny::tiny_model(seed);
    let weights = dw.expect("the tiny config has DSpark stages");
    Engine::new(model, config(nextn, varlen))
        .unwrap()
        .with_drafter(Box::new(DsparkDrafter { weights }))
}

fn prompts(rng: &mut impl Rng, n: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            (0..rng.random_range(3..20))
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        logprobs: true,
        ..SamplingParams::default()
    }
}

fn outputs(engine: &Engine, prompts: &[Vec<u32>], params: &[SamplingParams]) -> Vec<Output> {
    engine
        .generate(prompts, params)
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// The target's own greedy continuation of every context it will see,
/// proposed with a wrong token wherever `wrong(context length, slot)` says
/// (the test-and-bench oracle: its proposals are known to be right or
/// wrong). Its confidence is `confidence(context length, slot)`.
struct Oracle {
    /// Per prompt, the plain greedy output.
    truth: Vec<(Vec<u32>, Vec<u32>)>,
    vocab: u32,
    wrong: Box<dyn Fn(usize, usize, usize) -> bool + Send + Sync>,
    confidence: Box<dyn Fn(usize, usize) -> f32 + Send + Sync>,
}

impl Drafter for Oracle {
    fn draft(
        &self,
        _: &Model,
        _: &mut StatePool,
        input: DraftInput,
    ) -> deepinfer::model::Result<Proposal> {
        let ctx = input.context;
        let (r, (prompt, out)) = self
            .truth
            .iter()
            .enumerate()
            .find(|(_, (p, o))| {
                ctx.len() >= p.len()
                    && ctx[..p.len()] == p[..]
                    && ctx[p.len()..] == o[..(ctx.len() - p.len()).min(o.len())]
            })
            .expect("the oracle knows every request");
        let done = ctx.len() - prompt.len();
        let mut tokens = Vec::new();
        let mut confidence = Vec::new();
        for i in 0..input.n {
            let t = out.get(done + i).copied().unwrap_or(0);
            tokens.push(if (self.wrong)(r, done, i) {
                (t + 1) % self.vocab
            } else {
                t
            });
            confidence.push((self.confidence)(r, i));
        }
        Ok(Proposal {
            tokens,
            confidence,
            probs: None,
        })
    }
}

fn oracle_engine(
    model: Model,
    cfg: EngineConfig,
    truth: Vec<(Vec<u32>, Vec<u32>)>,
    wrong: impl Fn(usize, usize, usize) -> bool + Send + Sync + 'static,
    confidence: impl Fn(usize, usize) -> f32 + Send + Sync + 'static,
) -> Engine {
    let vocab = model.cfg.vocab_size as u32;
    Engine::new(model, cfg)
        .unwrap()
        .with_drafter(Box::new(Oracle {
            truth,
            vocab,
            wrong: Box::new(wrong),
            confidence: Box::new(confidence),
        }))
}

#[test]
fn greedy_speculative_equals_greedy_plain_for_every_nextn_and_schedule() {
    let mut rng = common::rng("spec_greedy");
    let seed = rng.random();
    let plain = plain_engine(seed);
    let vocab = plain.model.cfg.vocab_size;
    let block = plain.model.cfg.dspark.block_size;
    let ps = prompts(&mut rng, 4, vocab);
    let params: Vec<SamplingParams> = (0..4).map(|i| greedy([12, 7, 16, 1][i])).collect();
    let want = outputs(&plain, &ps, &params);
    for nextn in 1..=block {
        for varlen in [false, true] {
            let spec = dspark_engine(seed, nextn, varlen);
            let what = format!("nextn {nextn}, varlen {varlen}");
            let alone = outputs(&spec, &ps[..1], &params[..1]);
            // The drafter's prefill runs every prompt row through every layer.
            let c = spec.prefill_counters();
            let rows = ps[0].len() as u64;
            assert_eq!((c.early_rows, c.late_rows, c.reused_rows), (rows, rows, 0));
            let mixed = outputs(&spec, &ps, &params);
            for (i, (w, g)) in want.iter().zip(&mixed).enumerate() {
                assert_eq!(w.tokens, g.tokens, "{what}, request {i}");
                assert_eq!(w.logprobs, g.logprobs, "{what}, request {i}");
                assert_eq!(w.stop, g.stop, "{what}, request {i}");
            }
            assert_eq!(alone[0].tokens, want[0].tokens, "{what}, alone");
            let s = mixed[0].spec.expect("speculative stats");
            assert!(s.steps >= 1 && s.accepted <= s.verified, "{what}: {s:?}");
            assert_eq!(
                mixed[3].tokens.len(),
                1,
                "max_tokens 1 never drafts past it"
            );
        }
    }
    // A stop token inside a verified block ends the request at the same
    // token as plain decoding (nothing emitted past it).
    let stop = want[0].tokens[5];
    let stopped: Vec<SamplingParams> = params
        .iter()
        .map(|p| SamplingParams {
            stop: vec![stop],
            ..p.clone()
        })
        .collect();
    let want = outputs(&plain, &ps, &stopped);
    assert_eq!(want[0].stop, deepinfer::engine::StopReason::Stop(stop));
    let truth: Vec<_> = ps
        .iter()
        .cloned()
        .zip(want.iter().map(|o| o.tokens.clone()))
        .collect();
    // The oracle proposes the plain tokens, the stop among them, and more
    // after it.
    let oracle = oracle_engine(
        common::tiny::tiny_model(seed).0,
        config(block, false),
        truth,
        |_, _, _| false,
        |_, _| 0.9,
    );
    for (name, engine) in [
        ("dspark fixed", dspark_engine(seed, block, false)),
        ("dspark confidence", dspark_engine(seed, block, true)),
        ("oracle", oracle),
    ] {
        let got = outputs(&engine, &ps, &stopped);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!((&w.tokens, &w.stop), (&g.tokens, &g.stop), "{name}");
        }
    }
}

/// With an oracle that is wrong exactly at draft slot j of every step, the
/// output is still the plain one and every step accepts exactly j drafts
/// (j = nextn: all accepted).
/// An engine of the tiny model `seed` in `mode` (keep 16 ≥ window 8 + one
/// block of 5), with a prefix cache of 4-token blocks when `cached`, and
/// the DSpark drafter when `nextn` > 0.
fn served_engine(seed: u64, mode: YocoMode, cached: bool, nextn: usize) -> Engine {
    let (model, dw) = common::tiny::tiny_model(seed);
    let cfg = EngineConfig {
        yoco_mode: mode,
        yoco_keep_tokens: 16,
        ..config(nextn, nextn > 0)
    };
    let mut e = Engine::new(model, cfg).unwrap();
    if cached {
        let cache = PrefixCacheConfig {
            block_tokens: 4,
            budget_bytes: 1 << 26,
        };
        e = e.with_prefix_cache(PrefixCache::new(cache).unwrap());
    }
    if nextn > 0 {
        let weights = dw.expect("the tiny config has DSpark stages");
        e = e.with_drafter(Box::new(DsparkDrafter { weights }));
    }
    e
}

#[test]
fn speculative_decoding_runs_through_the_prefix_cache_and_compact_prefill() {
    let mut rng = common::rng("spec_prefix_cache");
    let seed = rng.random();
    let vocab = 500;
    // Long shared prefixes, so the second round hits the cache deep in
    // the prompts (and some hits leave fewer than a window to feed).
    let shared: Vec<u32> = (0..44).map(|_| rng.random_range(3..vocab)).collect();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            let cut = [44, 40, 37, 30, 44, 20][i];
            let tail = rng.random_range(1..9);
            shared[..cut]
                .iter()
                .copied()
                .chain((0..tail).map(|_| rng.random_range(3..vocab)))
                .collect()
        })
        .collect();
    let params = vec![greedy(12); prompts.len()];
    let tokens = |o: &[Output]| -> Vec<(Vec<u32>, Vec<u32>)> {
        o.iter()
            .map(|o| {
                let lp = o
                    .logprobs
                    .as_ref()
                    .map(|l| l.iter().map(|x| x.to_bits()).collect());
                (o.tokens.clone(), lp.unwrap_or_default())
            })
            .collect()
    };
    let stats = |o: &[Output]| -> Vec<SpecStats> { o.iter().map(|o| o.spec.unwrap()).collect() };
    // Exact: with the cache, speculative output equals a cold plain run and
    // drafts exactly as a cold speculative run (same accepted counts).
    let cold_plain = tokens(&outputs(
        &served_engine(seed, YocoMode::Exact, false, 0),
        &prompts,
        &params,
    ));
    let cold_spec = outputs(
        &served_engine(seed, YocoMode::Exact, false, 3),
        &prompts,
        &params,
    );
    let cached = served_engine(seed, YocoMode::Exact, true, 3);
    for round in 0..2 {
        let got = outputs(&cached, &prompts, &params);
        assert_eq!(tokens(&got), cold_plain, "exact, round {round}");
        assert_eq!(
            stats(&got),
            stats(&cold_spec),
            "exact, round {round}: the drafts changed"
        );
    }
    let hits = cached.prefix_cache_stats().unwrap();
    assert!(
        hits.hits > 0,
        "the exact rounds must hit the cache: {hits:?}"
    );
    // Compact: speculative output equals the same engine's plain output,
    // hits and truncated late layers included.
    let plain = served_engine(seed, YocoMode::Compact, true, 0);
    let spec = served_engine(seed, YocoMode::Compact, true, 3);
    for round in 0..2 {
        let want = tokens(&outputs(&plain, &prompts, &params));
        let got = outputs(&spec, &prompts, &params);
        assert_eq!(tokens(&got), want, "compact, round {round}");
        assert!(stats(&got).iter().any(|s| s.accepted > 0 || s.verified > 0));
    }
    assert_eq!(
        spec.prefix_cache_stats().unwrap().hits,
        plain.prefix_cache_stats().unwrap().hits
    );
    assert!(spec.prefix_cache_stats().unwrap().hits > 0);
}

#[test]
fn forced_rejections_at_every_draft_position_keep_the_plain_output() {
    let mut rng = common::rng("spec_forced");
    let seed = rng.random();
    let plain = plain_engine(seed);
    let vocab = plain.model.cfg.vocab_size;
    let nextn = plain.model.cfg.dspark.block_size;
    let ps = prompts(&mut rng, 3, vocab);
    let params: Vec<SamplingParams> = (0..3).map(|_| greedy(24)).collect();
    let want = outputs(&plain, &ps, &params);
    let truth: Vec<_> = ps
        .iter()
        .cloned()
        .zip(want.iter().map(|o| o.tokens.clone()))
        .collect();
    for j in 0..=nextn {
        let engine = oracle_engine(
            common::tiny::tiny_model(seed).0,
            config(nextn, false),
            truth.clone(),
            move |_, _, i| i == j,
            |_, _| 0.9,
        );
        let got = outputs(&engine, &ps, &params);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.tokens, g.tokens, "wrong at slot {j}, request {i}");
            assert_eq!(w.logprobs, g.logprobs, "wrong at slot {j}, request {i}");
            let s = g.spec.unwrap();
            // Every step but possibly the last (capped by max_tokens)
            // accepts exactly j drafts.
            assert!(s.accepted >= (s.steps - 1) * j, "slot {j}: {s:?}");
            assert!(s.accepted <= s.steps * j, "slot {j}: {s:?}");
        }
    }
}

/// A speculative batch's pool is sized for its requests' own tokens
/// (prompt + max_tokens, chunks of the longest prompt or one verify step of
/// nextn + 1), never nextn positions past them: the drafts are capped so
/// that a verify step stays within max_tokens. With `pool_memory` exactly
/// that pool's bytes, an oracle that is always right (every step verifies
/// and accepts all it may, up to the last position) runs to the end and
/// equals plain decoding; one byte less is refused.
#[test]
fn the_speculative_pool_is_sized_for_the_requests_not_nextn_past_them() {
    let mut rng = common::rng("spec_pool_size");
    let seed = rng.random();
    let plain = plain_engine(seed);
    let cfg = plain.model.cfg.clone();
    let nextn = cfg.dspark.block_size;
    let ps = prompts(&mut rng, 3, cfg.vocab_size);
    let params: Vec<SamplingParams> = (0..3).map(|i| greedy([9, 14, 6][i])).collect();
    let want = outputs(&plain, &ps, &params);
    let truth: Vec<_> = ps
        .iter()
        .cloned()
        .zip(want.iter().map(|o| o.tokens.clone()))
        .collect();
    let longest = ps
        .iter()
        .zip(&params)
        .map(|(p, s)| p.len() + s.max_tokens)
        .max()
        .unwrap();
    let chunk = ps.iter().map(Vec::len).max().unwrap().max(nextn + 1);
    let page_rows = config(nextn, false).page_rows;
    let bytes = |context: usize| {
        PoolConfig::fitting(&cfg, ps.len(), context, chunk, page_rows)
            .unwrap()
            .memory_bytes(&cfg)
            .unwrap()
    };
    let exact = bytes(longest);
    // The budget tells the two sizings apart (4-row pages, a ratio-1 source).
    assert!(bytes(longest + nextn) > exact);
    for (budget, fits) in [(exact, true), (exact - 1, false)] {
        let engine = oracle_engine(
            common::tiny::tiny_model(seed).0,
            EngineConfig {
                pool_memory: Some(budget),
                ..config(nextn, false)
            },
            truth.clone(),
            |_, _, _| false,
            |_, _| 0.9,
        );
        let got = engine.generate(&ps, &params);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            match g {
                Ok(g) if fits => {
                    assert_eq!((&w.tokens, &w.logprobs), (&g.tokens, &g.logprobs));
                    let s = g.spec.unwrap();
                    assert!(s.accepted > 0 && s.accepted == s.verified, "{s:?}");
                }
                Err(e) if !fits => assert!(e.to_string().contains("pool_memory"), "{e}"),
                _ => panic!("budget {budget} (pool of {exact} bytes), request {i}: {g:?}"),
            }
        }
    }
}

/// The batched DSpark draft (one pass of the stages for many sequences,
/// the attention grouped by list width) gives every sequence bitwise the
/// draft it gets alone, greedy and with a chooser (the Markov and
/// confidence heads batched too), with contexts shorter and longer than
/// the window in one batch; seeding the rings of many sequences in one
/// `dspark_seed_batch` leaves each bitwise as seeding it alone (the drafts
/// read them), and a sequence twice in one batch is refused by name.
#[test]
fn batched_drafts_equal_the_drafts_made_alone() {
    use deepinfer::model::dspark::{DraftRequest, SeedRequest};
    let mut rng = common::rng("spec_batched_draft");
    let (model, dw) = common::tiny::tiny_model(rng.random());
    let dw = dw.unwrap();
    let cfg = model.cfg.clone();
    let v = cfg.vocab_size as u32;
    let window = cfg.attention.window;
    // Prompt lengths around the window (8 in the tiny config).
    let lens = [3usize, window + 5, 1, window, 2 * window + 3, 5];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..v)).collect())
        .collect();
    let nexts: Vec<u32> = lens.iter().map(|_| rng.random_range(0..v)).collect();
    // A pool with every prompt fed and its drafter seeded but for the last
    // position (one sequence at a time, or all in one `dspark_seed_batch`
    // when `batched`); returns the pool, the sequences and their last
    // features.
    let seeded = |batched: bool| {
        let pc = PoolConfig::fitting(&cfg, lens.len(), 64, 32, 4).unwrap();
        let mut pool = StatePool::new(&cfg, &model.device(), pc).unwrap();
        let mut seqs = Vec::new();
        let mut lasts = Vec::new();
        let mut earlier = Vec::new();
        for prompt in &prompts {
            let seq = pool.add_sequence().unwrap();
            let f = model
                .forward(&mut pool, seq, prompt)
                .unwrap()
                .features
                .unwrap();
            let n = prompt.len();
            if n > 1 {
                earlier.push((seq, f.narrow_rows(0, n - 1).unwrap()));
            }
            seqs.push(seq);
            lasts.push(f.narrow_rows(n - 1, 1).unwrap());
        }
        if batched {
            let reqs: Vec<SeedRequest> = earlier
                .iter()
                .map(|(seq, features)| SeedRequest {
                    seq: *seq,
                    features,
                    start: 0,
                })
                .collect();
            model.dspark_seed_batch(&dw, &mut pool, &reqs).unwrap();
        } else {
            for (seq, features) in &earlier {
                model
                    .dspark_seed(&dw, &mut pool, *seq, features, 0)
                    .unwrap();
            }
        }
        (pool, seqs, lasts)
    };
    let setup = || seeded(false);
    let bits = |d: &deepinfer::model::dspark::Draft| -> (Vec<u32>, Vec<u32>) {
        (
            d.tokens.clone(),
            d.confidence_logits.iter().map(|c| c.to_bits()).collect(),
        )
    };
    // A chooser that is not the argmax: the second-largest logit.
    let second = |_: usize, logits: &[f32]| -> u32 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        order[1] as u32
    };
    for chosen in [false, true] {
        let (mut pool, seqs, lasts) = setup();
        let mut alone = Vec::new();
        for (k, &seq) in seqs.iter().enumerate() {
            let p = lens[k] - 1;
            let d = if chosen {
                let mut c = second;
                model
                    .dspark_draft_with(&dw, &mut pool, seq, &lasts[k], p, nexts[k], &mut c)
                    .unwrap()
            } else {
                model
                    .dspark_draft(&dw, &mut pool, seq, &lasts[k], p, nexts[k])
                    .unwrap()
            };
            alone.push(bits(&d));
        }
        // Seeded in one batch, each drafting alone: the same drafts.
        let (mut pool, seqs, lasts) = seeded(true);
        for (k, &seq) in seqs.iter().enumerate() {
            let d = if chosen {
                let mut c = second;
                model
                    .dspark_draft_with(
                        &dw,
                        &mut pool,
                        seq,
                        &lasts[k],
                        lens[k] - 1,
                        nexts[k],
                        &mut c,
                    )
                    .unwrap()
            } else {
                model
                    .dspark_draft(&dw, &mut pool, seq, &lasts[k], lens[k] - 1, nexts[k])
                    .unwrap()
            };
            assert_eq!(
                bits(&d),
                alone[k],
                "seeded in a batch, chooser {chosen}, request {k}"
            );
        }
        let (mut pool, seqs, lasts) = setup();
        let mut choosers: Vec<_> = seqs.iter().map(|_| second).collect();
        let mut reqs: Vec<DraftRequest> = seqs
            .iter()
            .zip(&lasts)
            .zip(choosers.iter_mut())
            .enumerate()
            .map(|(k, ((&seq, last), c))| DraftRequest {
                seq,
                features: last,
                p: lens[k] - 1,
                next: nexts[k],
                choose: if chosen {
                    Some(c as &mut dyn FnMut(usize, &[f32]) -> u32)
                } else {
                    None
                },
            })
            .collect();
        let batched = model.dspark_draft_batch(&dw, &mut pool, &mut reqs).unwrap();
        let batched: Vec<_> = batched.iter().map(bits).collect();
        assert_eq!(batched, alone, "chooser: {chosen}");
    }
    // A sequence twice in one batch is refused by name.
    let (mut pool, seqs, lasts) = setup();
    let twice = |k: usize| DraftRequest {
        seq: seqs[0],
        features: &lasts[0],
        p: lens[0] - 1,
        next: nexts[k],
        choose: None,
    };
    let e = model
        .dspark_draft_batch(&dw, &mut pool, &mut [twice(0), twice(1)])
        .unwrap_err();
    assert!(e.to_string().contains("seq"), "{e}");
    // So is a sequence seeded twice in one batch, before any ring is written.
    let twice = || SeedRequest {
        seq: seqs[0],
        features: &lasts[0],
        start: lens[0] - 1,
    };
    let e = model
        .dspark_seed_batch(&dw, &mut pool, &[twice(), twice()])
        .unwrap_err();
    assert!(e.to_string().contains("seq"), "{e}");
}

/// Pool level: checkpoint, verify k tokens of which the first `a` are the
/// plain continuation, roll back to a + 1 fed tokens, and decode on: every
/// later logit and every later DSpark draft (stage rings seeded with the
/// accepted positions only) is bitwise the plain run's, and the entries and
/// partial groups match, for every a, several k and start parities.
#[test]
fn rollback_leaves_the_pool_as_a_plain_run_bitwise() {
    let mut rng = common::rng("spec_rollback");
    let (model, dw) = common::tiny::tiny_model(rng.random());
    let dw = dw.unwrap();
    let cfg = model.cfg.clone();
    let v = cfg.vocab_size;
    let pc = PoolConfig::fitting(&cfg, 2, 96, 32, 4).unwrap();
    let mut pool = StatePool::new(&cfg, &model.device(), pc).unwrap();
    let sources: Vec<usize> = model
        .plans
        .iter()
        .take(cfg.n_layers)
        .filter(|p| p.is_kv_source())
        .map(|p| p.layer)
        .collect();
    // Feeds `tokens[t .. t + n]`, seeds the drafter with all but the last
    // new position and drafts at the last: (logits rows, the draft).
    let feed = |pool: &mut StatePool, seq, tokens: &[u32], t: usize, n: usize| {
        let out = model.forward(pool, seq, &tokens[t..t + n]).unwrap();
        let f = out.features.unwrap();
        if n > 1 {
            model
                .dspark_seed(&dw, pool, seq, &f.narrow_rows(0, n - 1).unwrap(), t)
                .unwrap();
        }
        let last = f.narrow_rows(n - 1, 1).unwrap();
        let draft = tokens.get(t + n).map(|&next| {
            model
                .dspark_draft(&dw, pool, seq, &last, t + n - 1, next)
                .unwrap()
        });
        (out.logits.to_vec::<f32>().unwrap(), draft)
    };
    for (prompt_len, k) in [(9usize, 5usize), (10, 5), (3, 2), (12, 3), (11, 1)] {
        let tokens: Vec<u32> = (0..prompt_len + 20)
            .map(|_| rng.random_range(0..v as u32))
            .collect();
        // The plain run: prompt, then one token per step, drafting at each.
        let plain_seq = pool.add_sequence().unwrap();
        let (mut plain, mut drafts) = (vec![], vec![]);
        feed(&mut pool, plain_seq, &tokens, 0, prompt_len);
        for t in prompt_len..tokens.len() {
            let (logits, draft) = feed(&mut pool, plain_seq, &tokens, t, 1);
            plain.push(logits);
            drafts.push(draft);
        }
        pool.free_sequence(plain_seq).unwrap();
        for a in 0..=k {
            let seq = pool.add_sequence().unwrap();
            feed(&mut pool, seq, &tokens, 0, prompt_len);
            // Verify [t_q, x_1 .. x_k]: right up to slot a, then wrong.
            let q = prompt_len;
            let mut fed: Vec<u32> = tokens[q..q + 1 + k].to_vec();
            for x in fed.iter_mut().skip(a + 1) {
                *x = (*x + 7) % v as u32;
            }
            pool.checkpoint(seq).unwrap();
            let out = model.forward(&mut pool, seq, &fed).unwrap();
            let verify = out.logits.to_vec::<f32>().unwrap();
            for i in 0..=a {
                assert_eq!(
                    verify[i * v..(i + 1) * v],
                    plain[i][..],
                    "verify row {i}, a {a}"
                );
            }
            pool.rollback_to(seq, q + a + 1).unwrap();
            assert_eq!(pool.position(seq).unwrap(), q + a + 1);
            let plain_pos = q + a + 1;
            for &layer in &sources {
                let ratio = model.plans[layer].ratio;
                assert_eq!(
                    pool.entries(seq, layer).unwrap(),
                    plain_pos / ratio,
                    "layer {layer}"
                );
                if ratio == 2 {
                    assert_eq!(pool.has_pending(seq, layer).unwrap(), plain_pos % 2 == 1);
                }
            }
            // The drafter sees the accepted positions only, then drafts.
            let f = out.features.unwrap();
            if a > 0 {
                model
                    .dspark_seed(&dw, &mut pool, seq, &f.narrow_rows(0, a).unwrap(), q)
                    .unwrap();
            }
            let next = tokens[q + a + 1];
            let draft = model
                .dspark_draft(
                    &dw,
                    &mut pool,
                    seq,
                    &f.narrow_rows(a, 1).unwrap(),
                    q + a,
                    next,
                )
                .unwrap();
            assert_eq!(Some(draft), drafts[a], "draft after the rollback, a {a}");
            // Decode on, as a mixed step of 1 + 2 tokens then singles.
            let mut t = q + a + 1;
            while t < tokens.len() {
                let n = if t == q + a + 1 {
                    2.min(tokens.len() - t)
                } else {
                    1
                };
                let (got, draft) = feed(&mut pool, seq, &tokens, t, n);
                for i in 0..n {
                    assert_eq!(
                        got[i * v..(i + 1) * v],
                        plain[t + i - q][..],
                        "prompt {prompt_len}, k {k}, a {a}: position {}",
                        t + i
                    );
                }
                assert_eq!(draft, drafts[t + n - 1 - q], "draft at {}", t + n - 1);
                t += n;
            }
            pool.free_sequence(seq).unwrap();
        }
    }
}

#[test]
fn rollback_misuse_is_a_typed_error_that_changes_nothing() {
    let (model, _) = common::tiny::tiny_model(7);
    let pc = PoolConfig::fitting(&model.cfg, 1, 64, 16, 4).unwrap();
    let mut pool = StatePool::new(&model.cfg, &model.device(), pc).unwrap();
    let seq = pool.add_sequence().unwrap();
    model.forward(&mut pool, seq, &[3, 4, 5, 6]).unwrap();
    let e = pool.rollback_to(seq, 4).unwrap_err();
    assert!(e.to_string().contains("no open checkpoint"), "{e}");
    pool.checkpoint(seq).unwrap();
    let e = pool.checkpoint(seq).unwrap_err();
    assert!(
        e.to_string().contains("already has an open checkpoint"),
        "{e}"
    );
    model.forward(&mut pool, seq, &[7, 8]).unwrap();
    for bad in [3usize, 7] {
        let e = pool.rollback_to(seq, bad).unwrap_err();
        assert!(e.to_string().contains(&bad.to_string()), "{e}");
        assert_eq!(pool.position(seq).unwrap(), 6);
    }
    assert!(pool.has_checkpoint(seq).unwrap());
    // A replaying step would rewrite rows the checkpoint restores: refused,
    // and the sequence stays where it was.
    let e = model
        .step_shaped(
            &mut pool,
            &[SeqInput {
                seq,
                tokens: &[8, 9],
            }],
            &[EntryShape {
                replay: 1,
                late_rows: 2,
            }],
            Capture::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("open rollback checkpoint"), "{e}");
    assert_eq!(pool.position(seq).unwrap(), 6);
    // A snapshot (the prefix cache's) of unverified drafts is refused.
    let e = pool.snapshot(seq, true).unwrap_err();
    assert!(e.to_string().contains("open speculative checkpoint"), "{e}");
    pool.rollback_to(seq, 5).unwrap();
    assert!(pool.snapshot(seq, true).is_ok());
    assert!(!pool.has_checkpoint(seq).unwrap());
    assert!(pool.rollback_to(99, 5).is_err());
}

#[test]
fn bad_speculative_configs_are_typed_errors() {
    let (model, _) = common::tiny::tiny_model(3);
    let block = model.cfg.dspark.block_size;
    let cfg = model.cfg.clone();
    for (c, what) in [
        (config(0, true), "ENABLE_MTP_VARLEN"),
        (config(block + 1, false), "DEEPINFER_USE_NEXTN_DECODE"),
        (
            EngineConfig {
                deterministic_sampling: true,
                batch_invariant: true,
                ..config(2, true)
            },
            "DETERMINISTIC_SAMPLING",
        ),
    ] {
        let e = c.validate(&cfg).unwrap_err();
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    // nextn without a drafter fails every request with a typed error.
    let engine = Engine::new(model, config(2, false)).unwrap();
    let r = engine.generate(&[vec![3u32, 4, 5]], &[greedy(4)]);
    let e = r[0].as_ref().unwrap_err();
    assert!(e.to_string().contains("drafter"), "{e}");
}

/// A user drafter that breaks the trait's contract: more tokens than asked
/// (`overlong`), or fewer distributions than tokens.
struct Unruly {
    overlong: bool,
}

impl Drafter for Unruly {
    fn draft(
        &self,
        _: &Model,
        _: &mut StatePool,
        input: DraftInput,
    ) -> deepinfer::model::Result<Proposal> {
        let n = if self.overlong { input.n + 7 } else { input.n };
        Ok(Proposal {
            tokens: vec![1; n],
            confidence: vec![0.5; n],
            probs: (!self.overlong).then(|| vec![vec![(1, 1.0)]; n - 1]),
        })
    }
}

/// An overlong proposal is cut to what was asked (the output is still the
/// plain greedy one); a sampled proposal missing a distribution is a typed
/// error naming the drafter, not a silently lossy acceptance.
#[test]
fn a_drafter_breaking_its_contract_is_cut_or_refused() {
    let seed = 5;
    let plain = plain_engine(seed);
    let ps = vec![vec![3u32, 4, 5, 6]];
    let want = outputs(&plain, &ps, &[greedy(9)]);
    let engine = |overlong| {
        Engine::new(common::tiny::tiny_model(seed).0, config(3, false))
            .unwrap()
            .with_drafter(Box::new(Unruly { overlong }))
    };
    let got = outputs(&engine(true), &ps, &[greedy(9)]);
    assert_eq!(got[0].tokens, want[0].tokens);
    let s = got[0].spec.expect("speculative stats");
    assert!(s.verified <= 3 * s.steps, "{s:?}");
    let r = engine(false).generate(&ps, &[greedy(9)]);
    let e = r[0].as_ref().unwrap_err();
    assert!(e.to_string().contains("Drafter::draft"), "{e}");
}

/// Chi-square critical values at significance 0.001 for 1 ..= 20 degrees
/// of freedom.
const CHI2_001: [f64; 20] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909,
    34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820, 45.315,
];

/// A drafter whose draft distribution q is known and differs from the
/// target's: 0.4 / 0.3 / 0.1 / 0.1 over the target's 4 kept ids in reverse
/// order of probability, and 0.1 on an id the target never keeps.
struct Skewed {
    /// Context last token → the target's kept ids at the next position.
    kept: HashMap<u32, Vec<u32>>,
    outside: u32,
}

impl Drafter for Skewed {
    fn draft(
        &self,
        _: &Model,
        _: &mut StatePool,
        input: DraftInput,
    ) -> deepinfer::model::Result<Proposal> {
        let last = *input.context.last().unwrap();
        let kept = &self.kept[&last];
        let mut q: Vec<(u32, f64)> = kept
            .iter()
            .rev()
            .zip([0.4, 0.3, 0.1, 0.1])
            .map(|(&t, w)| (t, w))
            .collect();
        q.push((self.outside, 0.1));
        let u = uniform(
            input.params.seq_seed,
            (input.p + 2) as u64,
            0,
            Domain::Draft,
        );
        let (mut acc, mut pick) = (0.0, q[0].0);
        for &(t, w) in &q {
            acc += w;
            pick = t;
            if acc > u {
                break;
            }
        }
        Ok(Proposal {
            tokens: vec![pick],
            confidence: vec![0.5],
            probs: Some(vec![q]),
        })
    }
}

/// Sampled speculative decoding at temperature 1 with top-k 4 (a 4-id
/// vocabulary per position): over 2048 seeds the first two output tokens
/// (the second decided by the acceptance rule against one draft, the third
/// the bonus) follow P(t1) · P(t2 | t1) of the target, for the DSpark
/// drafter and for a drafter with a known skewed q. The threshold is the
/// chi-square 0.001 quantile (cells with expected count < 5 pooled), so a
/// correct rule fails one run in a thousand; a rule that emitted the
/// drafts' distribution would miss by far (q puts 10 % outside p's ids).
#[test]
fn sampled_speculative_output_follows_the_target_distribution() {
    let mut rng = common::rng("spec_sampled");
    let seed = rng.random();
    let model = common::tiny::tiny_model(seed).0;
    let v = model.cfg.vocab_size;
    let prompt: Vec<u32> = (0..6).map(|_| rng.random_range(0..v as u32)).collect();
    let sp = |s: u64| SamplingParams {
        temperature: 1.0,
        top_k: 4,
        max_tokens: 3,
        seq_seed: s,
        ..SamplingParams::default()
    };
    // The target's P(t1) and P(t2 | t1) by teacher forcing.
    let plain = Engine::new(model, config(0, false)).unwrap();
    let after = |ctx: &[u32]| {
        let out = plain.score(ctx, &[0], 1.0).unwrap();
        distribution(&out.logits.to_vec::<f32>().unwrap(), &sp(0))
    };
    let first = after(&prompt);
    let mut expected: HashMap<(u32, u32), f64> = HashMap::new();
    let mut kept = HashMap::new();
    for &(t1, p1) in &first {
        let ctx: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        let second = after(&ctx);
        kept.insert(t1, second.iter().map(|x| x.0).collect::<Vec<_>>());
        for &(t2, p2) in &second {
            expected.insert((t1, t2), p1 * p2);
        }
    }
    let outside = (0..v as u32)
        .find(|t| kept.values().all(|k| !k.contains(t)))
        .unwrap();
    let drafters: Vec<(&str, Box<dyn Drafter>)> = vec![
        (
            "dspark",
            Box::new(DsparkDrafter {
                weights: common::tiny::tiny_model(seed).1.unwrap(),
            }),
        ),
        (
            "skewed",
            Box::new(Skewed {
                kept: kept.clone(),
                outside,
            }),
        ),
    ];
    let n = 2048u64;
    let seeds = Arc::new(rng.random::<u64>());
    for (name, drafter) in drafters {
        let engine = Engine::new(common::tiny::tiny_model(seed).0, config(1, false))
            .unwrap()
            .with_drafter(drafter);
        let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
        let mut stats = SpecStats::default();
        for batch in 0..n / 64 {
            let ps = vec![prompt.clone(); 64];
            let params: Vec<_> = (0..64).map(|i| sp(*seeds ^ (batch * 64 + i))).collect();
            for o in outputs(&engine, &ps, &params) {
                assert_eq!(o.tokens.len(), 3);
                *counts.entry((o.tokens[0], o.tokens[1])).or_default() += 1;
                let s = o.spec.unwrap();
                stats.steps += s.steps;
                stats.verified += s.verified;
                stats.accepted += s.accepted;
            }
        }
        let unexpected: u64 = counts
            .iter()
            .filter(|(c, _)| !expected.contains_key(c))
            .map(|(_, &k)| k)
            .sum();
        assert_eq!(unexpected, 0, "{name}: tokens outside the target's support");
        let (mut chi2, mut cells, mut pooled_e, mut pooled_o) = (0.0, 0, 0.0, 0.0);
        for (cell, &p) in &expected {
            let e = p * n as f64;
            let o = counts.get(cell).copied().unwrap_or(0) as f64;
            if e < 5.0 {
                pooled_e += e;
                pooled_o += o;
            } else {
                chi2 += (o - e).powi(2) / e;
                cells += 1;
            }
        }
        if pooled_e > 0.0 {
            chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
            cells += 1;
        }
        let df = cells - 1;
        let limit = CHI2_001[df - 1];
        println!("{name}: chi2 {chi2:.2} over {df} df (limit {limit}), {stats:?}");
        assert!(
            stats.verified > 0 && stats.accepted > 0 || name == "dspark",
            "{name}: {stats:?}"
        );
        assert!(
            chi2 < limit,
            "{name}: chi2 {chi2} >= {limit} ({df} df), counts {counts:?}"
        );
    }
}

/// A request's conditional acceptance probability at draft slot i in the
/// measurement: four difficulty classes, falling along the block.
fn accept_prob(r: usize, i: usize) -> f32 {
    [0.95f32, 0.8, 0.5, 0.2][r % 4] * 0.9f32.powi(i as i32)
}

/// A fixed uniform per (request, output length, slot) for the oracle's errors.
fn coin(r: usize, done: usize, i: usize) -> f32 {
    uniform(0x5eed, (r * 1000 + done) as u64, i as u32, Domain::Draft) as f32
}

/// Σ and counts over a run's outputs.
fn summary(outs: &[Output], wall: f64) -> serde_json::Value {
    let mut s = SpecStats::default();
    let mut by_class = [SpecStats::default(); 4];
    let mut tokens = 0;
    for (r, o) in outs.iter().enumerate() {
        let x = o.spec.unwrap_or_default();
        for t in [&mut s, &mut by_class[r % 4]] {
            t.steps += x.steps;
            t.verified += x.verified;
            t.accepted += x.accepted;
        }
        tokens += o.tokens.len();
    }
    let per = |x: &SpecStats| {
        serde_json::json!({
            "request_steps": x.steps,
            "accepted_length": (x.accepted + x.steps) as f64 / x.steps.max(1) as f64,
            "verify_tokens_per_step": x.verified as f64 / x.steps.max(1) as f64,
            "acceptance_rate": x.accepted as f64 / x.verified.max(1) as f64,
        })
    };
    let mut v = per(&s);
    v["batch_steps"] = outs
        .iter()
        .map(|o| o.spec.unwrap_or_default().steps)
        .max()
        .unwrap_or(0)
        .into();
    v["tokens"] = tokens.into();
    v["decode_s"] = wall.into();
    v["by_class"] = by_class.iter().map(per).collect::<Vec<_>>().into();
    v
}

/// Accepted length and verify tokens per step, fixed-k against
/// confidence-scheduled, at batch 1, 8 and 64, for the DSpark drafter (random
/// weights: acceptance is meaningless) and for the oracle (the target's own
/// greedy continuation, wrong with known per-request, per-slot rates, which
/// its confidence reports exactly). Writes
/// benches/results/2026-12-01-cpu-spec-decode.json.
#[test]
#[ignore = "measurement: cargo test --test spec_decode_cpu -- --ignored measure"]
fn measure_fixed_against_confidence_scheduled_verification() {
    let seed = 20261201;
    let nextn = 5;
    let max_tokens = 32;
    let plain = plain_engine(seed);
    let v = plain.model.cfg.vocab_size;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let all = prompts(&mut rng, 64, v);
    let params: Vec<_> = (0..64).map(|_| greedy(max_tokens)).collect();
    let t = std::time::Instant::now();
    let want = outputs(&plain, &all, &params);
    let plain_s = t.elapsed().as_secs_f64();
    // The step-time model, profiled: one decode step of 1 and of 64 tokens.
    let time_step = |n: usize| {
        let r = outputs(&plain, &all[..n], &vec![greedy(2); n]);
        r[0].decode.as_secs_f64()
    };
    let (t1, t64) = (time_step(1), time_step(64));
    let per_token = ((t64 - t1) / 63.0).max(1e-9);
    let costs = deepinfer::engine::SpecCosts {
        step_fixed: (t1 - per_token).max(0.0) / per_token,
        per_token: 1.0,
        draft_per_request: 0.0,
    };
    let truth: Vec<_> = all
        .iter()
        .cloned()
        .zip(want.iter().map(|o| o.tokens.clone()))
        .collect();
    // The profiled CPU (compute-bound: a token costs about a step) and a
    // memory-bound GPU-like model (a step costs 64 tokens' worth).
    let models = [
        ("cpu_profiled", costs),
        (
            "memory_bound_64",
            deepinfer::engine::SpecCosts {
                step_fixed: 64.0,
                per_token: 1.0,
                draft_per_request: 0.0,
            },
        ),
    ];
    // Modelled decode cost per emitted token (token units): every batch
    // step costs step_fixed plus its tokens.
    let modelled = |s: &serde_json::Value, batch: usize, fixed: f64| {
        let steps = s["batch_steps"].as_f64().unwrap();
        let fed = s["request_steps"].as_f64().unwrap()
            * (1.0 + s["verify_tokens_per_step"].as_f64().unwrap());
        let emitted = s["tokens"].as_f64().unwrap() - batch as f64;
        (fixed * steps + fed) / emitted
    };
    let mut records = Vec::new();
    for drafter in ["oracle", "dspark"] {
        for batch in [1usize, 8, 64] {
            let plain_cost: Vec<f64> = models
                .iter()
                .map(|(_, c)| (c.step_fixed + batch as f64) / batch as f64)
                .collect();
            let runs = [
                ("fixed", None),
                ("confidence", Some(0)),
                ("confidence", Some(1)),
            ];
            for (schedule, model) in runs {
                let varlen = model.is_some();
                let cfg = config(nextn, varlen);
                let engine = match drafter {
                    "oracle" => oracle_engine(
                        common::tiny::tiny_model(seed).0,
                        cfg,
                        truth.clone(),
                        |r, done, i| coin(r, done, i) >= accept_prob(r, i),
                        accept_prob,
                    ),
                    _ => dspark_engine(seed, nextn, varlen),
                }
                .with_spec_costs(models[model.unwrap_or(0)].1);
                let t = std::time::Instant::now();
                let got = outputs(&engine, &all[..batch], &params[..batch]);
                let wall = t.elapsed().as_secs_f64();
                for (w, g) in want.iter().zip(&got) {
                    assert_eq!(w.tokens, g.tokens, "{drafter} batch {batch} {schedule}");
                }
                let mut s = summary(&got, wall);
                let costed: Vec<f64> = models
                    .iter()
                    .map(|(_, c)| modelled(&s, batch, c.step_fixed))
                    .collect();
                s["modelled_cost_per_token"] = serde_json::json!({
                    "cpu_profiled": costed[0],
                    "memory_bound_64": costed[1],
                    "plain_cpu_profiled": plain_cost[0],
                    "plain_memory_bound_64": plain_cost[1],
                });
                let scheduled_for = model.map(|m| models[m].0);
                println!(
                    "{drafter:6} batch {batch:2} {schedule:10} {:16}: accepted length {:.3}, verify tokens/step {:.3}, acceptance {:.3}, batch steps {}, cost/token cpu {:.3} (plain {:.3}) mem64 {:.3} (plain {:.3})",
                    scheduled_for.unwrap_or("-"),
                    s["accepted_length"].as_f64().unwrap(),
                    s["verify_tokens_per_step"].as_f64().unwrap(),
                    s["acceptance_rate"].as_f64().unwrap(),
                    s["batch_steps"],
                    costed[0],
                    plain_cost[0],
                    costed[1],
                    plain_cost[1],
                );
                records.push(serde_json::json!({
                    "op": "spec_decode",
                    "shape": {
                        "batch": batch,
                        "nextn": nextn,
                        "max_tokens": max_tokens,
                        "drafter": drafter,
                        "schedule": schedule,
                        "scheduled_for": scheduled_for,
                    },
                    "ours": s,
                    "what": "greedy speculative decode on the tiny model (CPU); per request-step means; outputs equal plain greedy",
                    "peers": [],
                }));
            }
        }
    }
    let doc = serde_json::json!({
        "device": "cpu",
        "date": "2026-12-01",
        "commit": std::env::var("DEEPINFER_BENCH_COMMIT").unwrap_or_default(),
        "model": "models/tiny (random weights, seed 20261201)",
        "oracle": "target's own greedy continuation; conditional acceptance at slot i = [0.95, 0.8, 0.5, 0.2][request % 4] * 0.9^i, reported exactly as its confidence",
        "spec_costs": {
            "step_fixed_tokens": costs.step_fixed,
            "profiled_step_1_s": t1,
            "profiled_step_64_s": t64,
        },
        "plain_decode_s_batch64": plain_s,
        "records": records,
    });
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/results/2026-12-01-cpu-spec-decode.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
}

/// The real-vocabulary tiny model written once to `dir`: its engine under
/// `nextn` and the schedule (`varlen`), with the checkpoint's DSpark
/// drafter when `nextn` > 0.
fn v4vocab_spec_engine(dir: &std::path::Path, nextn: usize, varlen: bool) -> Engine {
    Engine::from_dir(
        dir,
        EngineConfig {
            max_context: 256,
            max_seqs: 64,
            nextn,
            mtp_varlen: varlen,
            ..EngineConfig::default()
        },
        false,
    )
    .unwrap()
}

/// Asserts that `got` is `want` token for token, logprob for logprob
/// (bitwise), with the same stop reason and text.
fn assert_same(want: &[Output], got: &[Output], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.tokens, g.tokens, "{what}, request {i}");
        let bits = |o: &Output| -> Vec<u32> {
            o.logprobs
                .as_ref()
                .map(|l| l.iter().map(|x| x.to_bits()).collect())
                .unwrap_or_default()
        };
        assert_eq!(bits(w), bits(g), "{what}, request {i}");
        assert_eq!(w.stop, g.stop, "{what}, request {i}");
        assert_eq!(w.text, g.text, "{what}, request {i}");
    }
}

/// Runs `engine` streaming; asserts it reported exactly the tokens each
/// output holds (nothing emitted past a stop).
fn streamed(engine: &Engine, prompts: &[Vec<u32>], params: &[SamplingParams]) -> Vec<Output> {
    let mut events: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let outs: Vec<Output> = engine
        .generate_streaming(prompts, params, &mut |e| {
            assert_eq!(e.index, events[e.request].len());
            events[e.request].push(e.token);
        })
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (i, (o, e)) in outs.iter().zip(&events).enumerate() {
        assert_eq!(&o.tokens, e, "request {i}: streamed tokens");
    }
    outs
}

/// An oracle over the real-vocabulary model: the plain outputs `truth`,
/// wrong at every draft slot where (request + done + slot) % 4 == 3 when
/// `errs`, with confidence falling along the block.
fn v4vocab_oracle(
    dir: &std::path::Path,
    nextn: usize,
    varlen: bool,
    truth: Vec<(Vec<u32>, Vec<u32>)>,
    errs: bool,
) -> Engine {
    let engine = v4vocab_spec_engine(dir, nextn, varlen);
    let vocab = engine.model.cfg.vocab_size as u32;
    engine.with_drafter(Box::new(Oracle {
        truth,
        vocab,
        wrong: Box::new(move |r, done, i| errs && (r + done + i) % 4 == 3),
        confidence: Box::new(|_, i| 0.95 - 0.1 * i as f32),
    }))
}

fn v4vocab_prompts(rng: &mut impl Rng, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            (0..rng.random_range(2..8))
                .map(|_| rng.random_range(0..128_000))
                .collect()
        })
        .collect()
}

/// Greedy speculation under a grammar (JSON Schema and regex, through
/// llguidance) emits exactly the plain constrained tokens, logprobs, stop
/// reasons and text, for nextn 1..=5 and both schedules, with the random
/// DSpark drafter (drafts the grammar mostly forbids) and with an oracle
/// whose drafts are the plain tokens, some of them wrong: accepted drafts
/// advance the grammar, rejected ones never reach it.
#[test]
fn greedy_speculation_under_a_grammar_equals_plain_decoding() {
    use deepinfer::engine::{SchemaType, StopReason, StructuredOutput};
    const SCHEMA: &str = r#"{"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 6},
                     "age": {"type": "integer", "minimum": 0, "maximum": 120},
                     "tag": {"enum": ["red", "green", "blue"]}},
      "required": ["name", "age", "tag"], "additionalProperties": false,
      "x-guidance": {"whitespace_flexible": false}}"#;
    let mut rng = common::rng("spec_grammar");
    let dir = common::TempDir::new("spec_grammar");
    let plain = common::tiny::v4vocab_engine(dir.path(), rng.random());
    let eos = plain.model.cfg.tokens.eos;
    let ps = v4vocab_prompts(&mut rng, 4);
    let params: Vec<SamplingParams> = (0..4)
        .map(|i| {
            let (schema_type, schema) = match i % 2 {
                0 => (SchemaType::Json, SCHEMA),
                _ => (SchemaType::Regex, "[a-z]{2,6}-[0-9]{1,3}"),
            };
            SamplingParams {
                stop: vec![eos],
                so_args: Some(StructuredOutput {
                    schema_type,
                    schema: schema.into(),
                }),
                ..greedy(40)
            }
        })
        .collect();
    let want = outputs(&plain, &ps, &params);
    assert!(
        want.iter()
            .any(|o| matches!(o.stop, StopReason::Grammar | StopReason::Stop(_))),
        "the grammar must end some output: {:?}",
        want.iter().map(|o| &o.stop).collect::<Vec<_>>()
    );
    let truth: Vec<_> = ps
        .iter()
        .cloned()
        .zip(want.iter().map(|o| o.tokens.clone()))
        .collect();
    for nextn in 1..=5 {
        for varlen in [false, true] {
            let what = format!("nextn {nextn}, varlen {varlen}");
            let dspark = v4vocab_spec_engine(dir.path(), nextn, varlen);
            assert_same(
                &want,
                &streamed(&dspark, &ps, &params),
                &format!("dspark, {what}"),
            );
            let oracle = v4vocab_oracle(dir.path(), nextn, varlen, truth.clone(), true);
            let got = streamed(&oracle, &ps, &params);
            assert_same(&want, &got, &format!("oracle, {what}"));
            let accepted: usize = got.iter().map(|o| o.spec.unwrap().accepted).sum();
            assert!(
                accepted > 0,
                "{what}: the oracle's drafts were never accepted"
            );
        }
    }
}

/// A stop string completed by an accepted draft stops speculation exactly
/// where plain decoding stops: the same tokens (the one completing it
/// last), logprobs, stop reason and cut text, and nothing streamed past
/// it, though the oracle drafts the plain continuation beyond the stop.
#[test]
fn a_stop_string_completed_inside_a_draft_stops_where_plain_decoding_does() {
    use deepinfer::engine::StopReason;
    let mut rng = common::rng("spec_stop_strings");
    let dir = common::TempDir::new("spec_stop_strings");
    let plain = common::tiny::v4vocab_engine(dir.path(), rng.random());
    let ps = v4vocab_prompts(&mut rng, 4);
    let free = vec![greedy(24); ps.len()];
    let full = outputs(&plain, &ps, &free);
    // Per request, a stop string from the middle of its own output (the
    // text of tokens 5.. decoded, its first 2 characters).
    let tok = plain.tokenizer.as_ref().unwrap();
    let params: Vec<SamplingParams> = full
        .iter()
        .map(|o| {
            let tail = tok.decode(&o.tokens[5..]).unwrap();
            let stop: String = tail.chars().take(2).collect();
            SamplingParams {
                stop_strings: vec![stop],
                ..greedy(24)
            }
        })
        .collect();
    let want = outputs(&plain, &ps, &params);
    let stopped = want
        .iter()
        .zip(&full)
        .filter(|(w, f)| {
            matches!(w.stop, StopReason::StopString(_)) && w.tokens.len() + 2 < f.tokens.len()
        })
        .count();
    assert!(
        stopped >= 2,
        "stop strings must end outputs early: {want:?}"
    );
    let truth: Vec<_> = ps
        .iter()
        .cloned()
        .zip(full.iter().map(|o| o.tokens.clone()))
        .collect();
    for nextn in 1..=5 {
        for varlen in [false, true] {
            let what = format!("nextn {nextn}, varlen {varlen}");
            let dspark = v4vocab_spec_engine(dir.path(), nextn, varlen);
            assert_same(
                &want,
                &streamed(&dspark, &ps, &params),
                &format!("dspark, {what}"),
            );
            for errs in [false, true] {
                let oracle = v4vocab_oracle(dir.path(), nextn, varlen, truth.clone(), errs);
                let got = streamed(&oracle, &ps, &params);
                assert_same(&want, &got, &format!("oracle (errors {errs}), {what}"));
            }
        }
    }
}

/// Speculative decoding refills its batch: with max_seqs 2, a waiting
/// request takes a finished one's place while the other still decodes
/// (their streamed tokens interleave, and never more than 2 requests are
/// open at once), and in batch-invariant mode the outputs are bitwise
/// those of plain decoding and of speculative decoding with every request
/// at once, drafts included (the same accepted counts).
#[test]
fn speculative_decoding_refills_the_batch_as_requests_finish() {
    let mut rng = common::rng("spec_refill");
    let seed = rng.random();
    let device = deepinfer::Device::Cpu.with_batch_invariant_kernels();
    let engine = |nextn: usize, max_seqs: usize| {
        let (model, dw) = common::tiny::tiny_model_on(seed, &device);
        let cfg = EngineConfig {
            batch_invariant: true,
            max_seqs,
            // The fixed schedule: the confidence schedule's budget is over
            // the batch, so its verify lengths depend on the batch.
            ..config(nextn, false)
        };
        let e = Engine::new(model, cfg).unwrap();
        match nextn {
            0 => e,
            _ => e.with_drafter(Box::new(DsparkDrafter {
                weights: dw.expect("the tiny config has DSpark stages"),
            })),
        }
    };
    let plain = engine(0, 64);
    let ps = prompts(&mut rng, 5, plain.model.cfg.vocab_size);
    let params: Vec<SamplingParams> = [2, 20, 3, 14, 9].into_iter().map(greedy).collect();
    let want = outputs(&plain, &ps, &params);
    let at_once = outputs(&engine(3, 64), &ps, &params);
    assert_same(&want, &at_once, "speculative, every request at once");
    let mut order = Vec::new();
    let refilled: Vec<Output> = engine(3, 2)
        .generate_streaming(&ps, &params, &mut |e| order.push(e.request))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_same(&want, &refilled, "speculative, max_seqs 2");
    let stats = |o: &[Output]| -> Vec<SpecStats> { o.iter().map(|o| o.spec.unwrap()).collect() };
    assert_eq!(stats(&at_once), stats(&refilled), "the drafts changed");
    // Request i is open from its first streamed token to its last.
    let span = |r: usize| {
        let first = order.iter().position(|&x| x == r).unwrap();
        (first, order.iter().rposition(|&x| x == r).unwrap())
    };
    let spans: Vec<(usize, usize)> = (0..ps.len()).map(span).collect();
    assert!(
        spans[2].0 < spans[1].1,
        "request 2 must be admitted when request 0 finishes, before request 1 does: {order:?}"
    );
    for at in 0..order.len() {
        let open = spans.iter().filter(|s| s.0 <= at && at <= s.1).count();
        assert!(open <= 2, "{open} requests open at event {at}: {order:?}");
    }
}
