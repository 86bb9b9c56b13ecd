//! Prefix reuse on the CPU (`serving.md` §3, §7) on the tiny model (window
//! 8, KV sources 2/4/6, late layers 7–11): an exact hit continues bitwise as
//! a cold run (prefix lengths on and off block boundaries, ratio-2 partial
//! groups pending at the hit, one-token suffixes, decode afterwards);
//! compact replay and decoder truncation equal the exact path bitwise
//! when they keep the receptive field of the stacked windows, and stay
//! within a drift bound below it; a small budget evicts without touching
//! live sequences; hash collisions and mismatched tokens never reuse state;
//! bad settings are typed errors.

mod common;

use deepinfer::engine::{
    Engine, EngineConfig, PrefixCache, PrefixCacheConfig, SamplingParams, YocoMode,
};
use deepinfer::model::forward::{Capture, Model, SeqInput};
use deepinfer::model::pool::{PoolConfig, StatePool};
use deepinfer::model::truncate::EntryShape;
use deepinfer::numerics::calc_diff;
use rand::Rng;
use rand::rngs::StdRng;

fn model(seed: u64) -> Model {
    common::tiny::tiny_model(seed).0
}

fn engine(seed: u64, mode: YocoMode, keep: usize, cache: Option<PrefixCacheConfig>) -> Engine {
    let e = Engine::new(
        model(seed),
        EngineConfig {
            max_context: 256,
            yoco_mode: mode,
            yoco_keep_tokens: keep,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    match cache {
        Some(c) => e.with_prefix_cache(PrefixCache::new(c).unwrap()),
        None => e,
    }
}

fn tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(3..500)).collect()
}

fn params(rng: &mut StdRng, n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        max_tokens: n,
        seq_seed: rng.random(),
        logprobs: true,
        ..SamplingParams::default()
    }
}

fn pool(m: &Model, seqs: usize) -> StatePool {
    pool_paged(m, seqs, 4)
}

fn pool_paged(m: &Model, seqs: usize, page_rows: usize) -> StatePool {
    let pc = PoolConfig::fitting(&m.cfg, seqs, 256, 256, page_rows).unwrap();
    StatePool::new(&m.cfg, &m.device(), pc).unwrap()
}

fn logits(m: &Model, p: &mut StatePool, seq: u64, toks: &[u32]) -> Vec<f32> {
    let out = m.forward(p, seq, toks).unwrap();
    out.logits.to_vec::<f32>().unwrap()
}

/// At the pool level: a snapshot after H tokens, restored into another
/// pool, gives the suffix and the decode steps after it the cold logits
/// bit for bit.
#[test]
fn an_exact_restore_continues_bitwise_as_a_cold_run() {
    let mut rng = common::rng("prefix_exact_pool");
    let m = model(rng.random());
    let v = m.cfg.vocab_size;
    // Odd H leaves a partial group in the ratio-2 sources; H below the
    // window, at it and far past it; suffixes of 1 token and more.
    for (h, suffix) in [(1, 1), (7, 1), (8, 3), (9, 1), (21, 5), (64, 1), (75, 9)] {
        let all = tokens(&mut rng, h + suffix);
        let mut cold = pool(&m, 1);
        let c = cold.add_sequence().unwrap();
        let want = logits(&m, &mut cold, c, &all);
        let mut src = pool(&m, 1);
        let s = src.add_sequence().unwrap();
        m.forward(&mut src, s, &all[..h]).unwrap();
        assert_eq!(src.has_pending(s, 2).unwrap(), h % 2 == 1);
        let snap = src.snapshot(s, true).unwrap();
        // What the cache budgets before copying is what the copy owns.
        assert_eq!(src.snapshot_bytes(s, true).unwrap(), snap.bytes(), "H {h}");
        assert_eq!(
            src.snapshot_bytes(s, false).unwrap(),
            src.snapshot(s, false).unwrap().bytes(),
            "H {h}, global state"
        );
        drop(src);
        let mut dst = pool(&m, 2);
        let other = dst.add_sequence().unwrap();
        m.forward(&mut dst, other, &tokens(&mut rng, 5)).unwrap();
        let d = dst.restore(&snap).unwrap();
        assert_eq!(dst.position(d).unwrap(), h);
        assert_eq!(dst.has_pending(d, 4).unwrap(), h % 2 == 1);
        let got = logits(&m, &mut dst, d, &all[h..]);
        assert_eq!(got, want[h * v..], "H {h}, suffix {suffix}");
        for _ in 0..4 {
            let t = [rng.random_range(3..500)];
            assert_eq!(
                logits(&m, &mut dst, d, &t),
                logits(&m, &mut cold, c, &t),
                "decode after H {h}"
            );
        }
    }
}

/// Through the engine: warm the cache, then every request with a cached
/// prefix samples the tokens and logprobs of a cold engine, bitwise.
#[test]
fn exact_hits_through_the_engine_equal_cold_runs_bitwise() {
    let mut rng = common::rng("prefix_exact_engine");
    let seed = rng.random();
    let cfg = PrefixCacheConfig {
        block_tokens: 7,
        budget_bytes: 64 << 20,
    };
    let cached = engine(seed, YocoMode::Exact, 140, Some(cfg));
    let cold = engine(seed, YocoMode::Exact, 140, None);
    let shared = tokens(&mut rng, 40);
    // The warm-up stores the prefix up to its last block boundary ≤ S − 1.
    let mut prompts = Vec::new();
    for len in [7, 8, 14, 21, 22, 35, 36, 40] {
        let mut p = shared[..len].to_vec();
        let n = rng.random_range(1..4);
        p.extend(tokens(&mut rng, n));
        prompts.push(p);
    }
    for p in &prompts {
        let sp = params(&mut rng, 6);
        cached.generate(std::slice::from_ref(p), std::slice::from_ref(&sp));
        let again = cached.generate(std::slice::from_ref(p), std::slice::from_ref(&sp));
        let want = cold.generate(std::slice::from_ref(p), std::slice::from_ref(&sp));
        let (a, w) = (again[0].as_ref().unwrap(), want[0].as_ref().unwrap());
        assert_eq!(a.tokens, w.tokens, "prompt of {}", p.len());
        assert_eq!(a.logprobs, w.logprobs, "prompt of {}", p.len());
    }
    // One-token suffixes after a cached boundary, in one batch.
    let batch: Vec<Vec<u32>> = [14, 21, 35]
        .iter()
        .map(|&l| shared[..=l].to_vec())
        .collect();
    let sps: Vec<SamplingParams> = batch.iter().map(|_| params(&mut rng, 4)).collect();
    let got = cached.generate(&batch, &sps);
    for (i, p) in batch.iter().enumerate() {
        let want = cold.generate(std::slice::from_ref(p), &sps[i..=i]);
        assert_eq!(
            got[i].as_ref().unwrap().tokens,
            want[0].as_ref().unwrap().tokens
        );
        assert_eq!(
            got[i].as_ref().unwrap().logprobs,
            want[0].as_ref().unwrap().logprobs
        );
    }
    let st = cached.prefix_cache_stats().unwrap();
    assert!(st.hits >= 11, "{st:?}");
    let c = cached.prefill_counters();
    assert!(c.reused_rows > 0, "{c:?}");
}

/// Positions a token's last-layer output can depend on through `layers`
/// stacked windows of the model: layers × (window − 1) + 1.
fn receptive_field(m: &Model, layers: usize) -> usize {
    layers * (m.cfg.attention.window - 1) + 1
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m })
        .0
}

/// Decoder truncation alone (no cache) whose tail covers the late layers'
/// receptive field is the exact path bitwise; one token shorter it is not.
#[test]
fn compact_prefill_over_the_late_receptive_field_is_exact() {
    let mut rng = common::rng("prefix_compact_cold");
    let seed = rng.random();
    let m = model(seed);
    let late = m.cfg.n_layers - m.late_layer_start();
    assert_eq!(
        m.late_layer_start(),
        7,
        "the tiny model's last KV source is 6"
    );
    let field = receptive_field(&m, late);
    let exact = engine(seed, YocoMode::Exact, 140, None);
    let full = engine(seed, YocoMode::Compact, field, None);
    let short = engine(seed, YocoMode::Compact, 13, None);
    let mut differs = 0;
    for len in [1, 13, 40, 70, 90] {
        let p = tokens(&mut rng, len);
        let want = exact.prefill_logits(std::slice::from_ref(&p)).unwrap();
        assert_eq!(
            full.prefill_logits(std::slice::from_ref(&p)).unwrap(),
            want,
            "prompt of {len}"
        );
        differs += usize::from(short.prefill_logits(&[p]).unwrap() != want);
    }
    assert_eq!(
        differs, 3,
        "truncating below the field changes prompts over 13"
    );
    let c = short.prefill_counters();
    assert_eq!(c.early_rows, 1 + 13 + 40 + 70 + 90);
    assert_eq!(c.late_rows, 1 + 13 * 4);
}

/// Compact replay after a hit. Replaying the whole model's receptive field
/// (12 × 7 + 1 = 85 tokens) rebuilds every ring row the last tokens read
/// exactly: bitwise the exact path. Replaying 48 drifts, within the bound
/// stated in ARCHITECTURE.md ("Prefix cache and bounded replay"): over 40
/// random models the mean calc_diff was 1e-3 to 1.7e-2 and the argmax
/// agreement 5 to 10 of 10 (the tiny model's logits are nearly flat, so
/// the argmax flips on small drift); unrelated logits give ≈ 1 and ≈ 0.
#[test]
fn compact_replay_is_exact_over_the_receptive_field_and_bounded_below_it() {
    let mut rng = common::rng("prefix_compact_drift");
    let seed = rng.random();
    let cfg = PrefixCacheConfig {
        block_tokens: 16,
        budget_bytes: 64 << 20,
    };
    let m = model(seed);
    let field = receptive_field(&m, m.cfg.n_layers);
    assert_eq!(field, 85);
    let exact = engine(seed, YocoMode::Exact, 140, None);
    let shared = tokens(&mut rng, 112);
    let prompts: Vec<Vec<u32>> = (0..10)
        .map(|_| {
            let extra = rng.random_range(1..16);
            [shared.clone(), tokens(&mut rng, extra)].concat()
        })
        .collect();
    let want: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            exact
                .prefill_logits(std::slice::from_ref(p))
                .unwrap()
                .remove(0)
        })
        .collect();
    let warm = [shared.clone(), vec![7]].concat();
    for (keep, bitwise) in [(field, true), (48, false)] {
        let compact = engine(seed, YocoMode::Compact, keep, Some(cfg));
        compact.prefill_logits(std::slice::from_ref(&warm)).unwrap();
        let (mut sum, mut agree, mut changed) = (0.0f64, 0, 0);
        for (p, w) in prompts.iter().zip(&want) {
            let got = compact
                .prefill_logits(std::slice::from_ref(p))
                .unwrap()
                .remove(0);
            if bitwise {
                assert_eq!(&got, w, "keep {keep}: prompt of {}", p.len());
            }
            sum += calc_diff(&f64s(&got), &f64s(w));
            changed += usize::from(&got != w);
            agree += usize::from(argmax(&got) == argmax(w));
        }
        let st = compact.prefix_cache_stats().unwrap();
        assert_eq!(st.hits, prompts.len() as u64, "keep {keep}: {st:?}");
        let c = compact.prefill_counters();
        assert_eq!(c.reused_rows, 112 * prompts.len() as u64, "{c:?}");
        if !bitwise {
            let mean = sum / prompts.len() as f64;
            assert!(changed > 0, "replay of 48 changed nothing: not exercised");
            assert!(mean < 3e-2, "keep {keep}: mean calc_diff {mean}");
            assert!(agree >= 4, "keep {keep}: argmax agreement {agree} of 10");
        }
    }
}

/// A budget of about one entry: inserts evict the least recently used,
/// the bytes stay within the budget, and a request restored from an entry
/// that its own batch evicts still equals a cold run.
#[test]
fn a_small_budget_evicts_least_recently_used_without_harm() {
    let mut rng = common::rng("prefix_evict");
    let seed = rng.random();
    let m = model(seed);
    // The engine's pools have its default 64-row pages.
    let mut p = pool_paged(&m, 1, EngineConfig::default().page_rows);
    let s = p.add_sequence().unwrap();
    m.forward(&mut p, s, &tokens(&mut rng, 16)).unwrap();
    let one = p.snapshot(s, true).unwrap().bytes() + 16 * 4;
    let cfg = PrefixCacheConfig {
        block_tokens: 8,
        budget_bytes: one + one / 2,
    };
    let cached = engine(seed, YocoMode::Exact, 140, Some(cfg));
    let cold = engine(seed, YocoMode::Exact, 140, None);
    let a = tokens(&mut rng, 17);
    let b = tokens(&mut rng, 17);
    let sp = params(&mut rng, 5);
    cached.generate(std::slice::from_ref(&a), std::slice::from_ref(&sp));
    // b's entry evicts a's.
    cached.generate(std::slice::from_ref(&b), std::slice::from_ref(&sp));
    let st = cached.prefix_cache_stats().unwrap();
    assert_eq!((st.inserted, st.evicted, st.entries), (2, 1, 1), "{st:?}");
    assert!(st.bytes <= cfg.budget_bytes);
    // b hits; in the same batch c's (longer) prefix is stored and evicts
    // b's entry while b's sequence lives.
    let mut c = b[..16].to_vec();
    c.extend(tokens(&mut rng, 10));
    let both = cached.generate(&[b.clone(), c.clone()], &[sp.clone(), sp.clone()]);
    for (got, prompt) in both.iter().zip([&b, &c]) {
        let want = cold.generate(std::slice::from_ref(prompt), std::slice::from_ref(&sp));
        assert_eq!(
            got.as_ref().unwrap().tokens,
            want[0].as_ref().unwrap().tokens
        );
        assert_eq!(
            got.as_ref().unwrap().logprobs,
            want[0].as_ref().unwrap().logprobs
        );
    }
    let st = cached.prefix_cache_stats().unwrap();
    assert!(st.hits >= 1 && st.evicted >= 2, "{st:?}");
    assert!(st.bytes <= cfg.budget_bytes, "{st:?}");
    // An entry over the whole budget is not kept.
    let tiny = PrefixCacheConfig {
        block_tokens: 8,
        budget_bytes: 64,
    };
    let small = engine(seed, YocoMode::Exact, 140, Some(tiny));
    small.generate(std::slice::from_ref(&a), std::slice::from_ref(&sp));
    let st = small.prefix_cache_stats().unwrap();
    assert_eq!(
        (st.rejected, st.entries, st.bytes, st.snapshot_failures),
        (1, 0, 0, 0),
        "{st:?}"
    );
}

fn constant_hash(_: u64, _: &[u32]) -> u64 {
    42
}

/// Every block hashes alike: prefixes that differ are compared token by
/// token and never reuse each other's state; a prompt that differs from a
/// cached one inside its prefix misses with the real hash too.
#[test]
fn collisions_and_mismatched_tokens_never_reuse_state() {
    let mut rng = common::rng("prefix_collide");
    let seed = rng.random();
    let cfg = PrefixCacheConfig {
        block_tokens: 4,
        budget_bytes: 64 << 20,
    };
    let colliding = Engine::new(
        model(seed),
        EngineConfig {
            max_context: 256,
            ..EngineConfig::default()
        },
    )
    .unwrap()
    .with_prefix_cache(PrefixCache::with_hash(cfg, constant_hash).unwrap());
    let real = engine(seed, YocoMode::Exact, 140, Some(cfg));
    let cold = engine(seed, YocoMode::Exact, 140, None);
    let a = tokens(&mut rng, 21);
    let mut b = a.clone();
    b[10] = if a[10] == 7 { 8 } else { 7 };
    let sp = params(&mut rng, 5);
    for e in [&colliding, &real] {
        e.generate(std::slice::from_ref(&a), std::slice::from_ref(&sp));
        let got = e.generate(std::slice::from_ref(&b), std::slice::from_ref(&sp));
        let want = cold.generate(std::slice::from_ref(&b), std::slice::from_ref(&sp));
        assert_eq!(
            got[0].as_ref().unwrap().tokens,
            want[0].as_ref().unwrap().tokens
        );
        assert_eq!(
            got[0].as_ref().unwrap().logprobs,
            want[0].as_ref().unwrap().logprobs
        );
    }
    let st = colliding.prefix_cache_stats().unwrap();
    assert_eq!(st.hits, 0, "{st:?}");
    assert!(st.collisions > 0, "{st:?}");
    assert_eq!(real.prefix_cache_stats().unwrap().hits, 0);
    // The cached prompt itself still hits.
    let again = colliding.generate(std::slice::from_ref(&a), std::slice::from_ref(&sp));
    let want = cold.generate(&[a], std::slice::from_ref(&sp));
    assert_eq!(
        again[0].as_ref().unwrap().tokens,
        want[0].as_ref().unwrap().tokens
    );
    assert_eq!(colliding.prefix_cache_stats().unwrap().hits, 1);
}

#[test]
fn bad_settings_and_mismatched_snapshots_are_typed_errors() {
    let bad = |block_tokens, budget_bytes| {
        PrefixCache::new(PrefixCacheConfig {
            block_tokens,
            budget_bytes,
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    assert!(bad(0, 1 << 20).contains("block_tokens"));
    assert!(bad(1 << 21, 1 << 20).contains("block_tokens"));
    assert!(bad(16, 0).contains("budget_bytes"));
    let m = model(5);
    let e = Engine::new(
        model(5),
        EngineConfig {
            yoco_mode: YocoMode::Compact,
            yoco_keep_tokens: 12,
            ..EngineConfig::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("KEEP_TOKENS") && e.contains("minimum 13"), "{e}");
    let mut p = pool(&m, 2);
    let s = p.add_sequence().unwrap();
    m.forward(&mut p, s, &[5, 6, 7, 8, 9]).unwrap();
    // A global-only snapshot cannot be restored exactly, and inserting it
    // under a length that is not its position or not whole blocks fails.
    let global = p.snapshot(s, false).unwrap();
    let e = p.restore(&global).unwrap_err().to_string();
    assert!(e.contains("snapshot"), "{e}");
    let e = p.restore_global(&global, 6, &[]).unwrap_err().to_string();
    assert!(e.contains("replay_from"), "{e}");
    let mut cache = PrefixCache::new(PrefixCacheConfig {
        block_tokens: 4,
        budget_bytes: 1 << 20,
    })
    .unwrap();
    let e = cache
        .insert(&[5, 6, 7, 8], p.snapshot(s, true).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokens"), "{e}");
    // Another page size.
    let pc = PoolConfig::fitting(&m.cfg, 1, 256, 256, 8).unwrap();
    let mut other = StatePool::new(&m.cfg, &m.device(), pc).unwrap();
    let e = other
        .restore(&p.snapshot(s, true).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("page size"), "{e}");
    // Replay must leave a new token and lie before the position.
    for (replay, n) in [(2, 2), (6, 7)] {
        let toks = vec![9u32; n];
        let e = m
            .step_shaped(
                &mut p,
                &[SeqInput {
                    seq: s,
                    tokens: &toks,
                }],
                &[EntryShape {
                    replay,
                    late_rows: n,
                }],
                Capture::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("replay"), "{e}");
    }
    assert_eq!(p.position(s).unwrap(), 5, "failed steps change nothing");
}

/// Compact with a hit and a new block boundary after it (two steps: the
/// replay plus the new tokens up to the boundary, snapshotted, then the
/// rest), replaying the receptive field: bitwise the exact path, and so is
/// a later prompt that hits the new boundary.
#[test]
fn compact_replay_then_a_new_boundary_stays_exact_over_the_field() {
    let mut rng = common::rng("prefix_compact_boundary");
    let seed = rng.random();
    let cfg = PrefixCacheConfig {
        block_tokens: 16,
        budget_bytes: 64 << 20,
    };
    let exact = engine(seed, YocoMode::Exact, 140, None);
    let compact = engine(seed, YocoMode::Compact, 85, Some(cfg));
    let long = tokens(&mut rng, 152);
    compact.prefill_logits(&[long[..113].to_vec()]).unwrap();
    for len in [152, 150] {
        let p = long[..len].to_vec();
        assert_eq!(
            compact.prefill_logits(std::slice::from_ref(&p)).unwrap(),
            exact.prefill_logits(&[p]).unwrap(),
            "prompt of {len}"
        );
    }
    let st = compact.prefix_cache_stats().unwrap();
    // 113 stores 112; 152 hits 112 and stores 144; 150 hits 144.
    assert_eq!(
        (st.hits, st.hit_tokens, st.inserted),
        (2, 112 + 144, 2),
        "{st:?}"
    );
}

/// A hit the engine's pool cannot take (a snapshot from a pool of another
/// page size, handed over in the cache) costs the reuse, not the request:
/// it prefills cold, bitwise a run without the cache, and the failure is
/// counted as such, not as a hit. In compact mode a cached prefix no longer than the replay is
/// neither taken nor counted as a hit.
#[test]
fn an_unrestorable_hit_prefills_cold_and_short_compact_hits_are_not_taken() {
    let mut rng = common::rng("prefix_restore_fallback");
    let seed = rng.random();
    let m = model(seed);
    let prompt = tokens(&mut rng, 40);
    let cfg = PrefixCacheConfig {
        block_tokens: 16,
        budget_bytes: 64 << 20,
    };
    // The engine's pool has 64-row pages; this one 8.
    let mut other = pool_paged(&m, 1, 8);
    let s = other.add_sequence().unwrap();
    m.forward(&mut other, s, &prompt[..32]).unwrap();
    let mut cache = PrefixCache::new(cfg).unwrap();
    assert!(
        cache
            .insert(&prompt[..32], other.snapshot(s, true).unwrap())
            .unwrap()
    );
    let cached = Engine::new(
        model(seed),
        EngineConfig {
            max_context: 256,
            ..EngineConfig::default()
        },
    )
    .unwrap()
    .with_prefix_cache(cache);
    let cold = engine(seed, YocoMode::Exact, 140, None);
    let sp = params(&mut rng, 5);
    let got = cached.generate(std::slice::from_ref(&prompt), std::slice::from_ref(&sp));
    let want = cold.generate(std::slice::from_ref(&prompt), std::slice::from_ref(&sp));
    let (g, w) = (got[0].as_ref().unwrap(), want[0].as_ref().unwrap());
    assert_eq!((&g.tokens, &g.logprobs), (&w.tokens, &w.logprobs));
    let st = cached.prefix_cache_stats().unwrap();
    // Only a hit that was restored counts (and covers tokens).
    assert_eq!(
        (st.lookups, st.hits, st.hit_tokens, st.restore_failures),
        (1, 0, 0, 1),
        "{st:?}"
    );
    assert_eq!(cached.prefill_counters().reused_rows, 0);

    // Compact, keep 20: a 16-token hit would replay everything.
    let compact = engine(seed, YocoMode::Compact, 20, Some(cfg));
    let short = tokens(&mut rng, 18);
    compact.generate(std::slice::from_ref(&short), std::slice::from_ref(&sp));
    let before = compact.prefix_cache_stats().unwrap();
    assert_eq!(before.inserted, 1, "{before:?}");
    let mut longer = short[..16].to_vec();
    longer.extend(tokens(&mut rng, 3));
    compact.generate(std::slice::from_ref(&longer), std::slice::from_ref(&sp));
    let st = compact.prefix_cache_stats().unwrap();
    assert_eq!((st.lookups, st.hits), (before.lookups + 1, 0), "{st:?}");
}

/// An Engram layer among the late layers (not V4.1's placement, but a legal
/// config): decoder truncation narrows its n-gram ids (and a host table's
/// row index) with the streams, so compact prefill over the receptive field
/// stays bitwise the exact path, with the tables on the device and on the
/// host.
#[test]
fn truncation_narrows_a_late_engram_layer() {
    use deepinfer::model::config::ModelConfig;
    use deepinfer::model::layers::engram::EngramPlacement;
    use deepinfer::model::load::{WeightOptions, random_weights_with};
    let mut rng = common::rng("prefix_late_engram");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny");
    let mut cfg = ModelConfig::from_dir(&dir).unwrap();
    cfg.engram.layer_ids = vec![1, 9];
    let seed = rng.random();
    let prompts: Vec<Vec<u32>> = vec![tokens(&mut rng, 100), tokens(&mut rng, 37)];
    for engram in [EngramPlacement::Device, EngramPlacement::Host] {
        let engine = |yoco_mode, yoco_keep_tokens| {
            let options = WeightOptions {
                drafter: false,
                engram,
            };
            let cpu = deepinfer::Device::Cpu;
            let (w, _) = random_weights_with(&cfg, seed, &cpu, options).unwrap();
            let model = Model::new(cfg.clone(), w).unwrap();
            let late = model.late_layer_start();
            assert!(
                model
                    .plans
                    .iter()
                    .any(|p| p.layer >= late && p.engram.is_some()),
                "an Engram layer at or after layer {late}"
            );
            Engine::new(
                model,
                EngineConfig {
                    max_context: 256,
                    yoco_mode,
                    yoco_keep_tokens,
                    engram_tables: engram,
                    ..EngineConfig::default()
                },
            )
            .unwrap()
        };
        let (exact, compact) = (engine(YocoMode::Exact, 140), engine(YocoMode::Compact, 85));
        assert_eq!(
            compact.prefill_logits(&prompts).unwrap(),
            exact.prefill_logits(&prompts).unwrap(),
            "{engram:?} tables"
        );
    }
}
