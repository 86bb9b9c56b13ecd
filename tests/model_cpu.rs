//! The CPU model end to end on the tiny config (every layer role active),
//! through the op API and the paged state pool: generated official-format
//! weights load into a `Model`; logits are finite and not flat; decoding
//! token t gives bit-for-bit the logits of a prefill of the first t + 1
//! tokens, and a prompt fed in chunks of any size gives those of one
//! prefill, over 300+ tokens (window wrap, compressed entries, a top-k
//! smaller than the visible entries, candidate blocks, odd partial groups,
//! Engram look-back across the start); a sequence's logits are bitwise the
//! same alone or inside any batch (prefill/decode/chunk mixes, neighbours of
//! every length), with the routed experts in either grouped layout; the pool returns pages on free and reports running out as
//! a typed error without touching other sequences; bad input is a typed
//! error; the DSpark drafter produces greedy drafts with confidences.

mod common;

use common::TempDir;
use common::limits::{Counting, bounded};
use common::tiny::tiny_model;
use deepinfer::Error;
use deepinfer::model::checkpoint::{
    Checkpoint, CheckpointError, GenerateOptions, LoadOptions, TensorProblem, generate,
};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::forward::{Capture, Model, MoeLayout, SeqInput};
use deepinfer::model::pool::{PoolConfig, StatePool};
use rand::Rng;
use std::path::Path;
use std::time::Duration;

/// The bad-input cases run under [`bounded`]'s memory and time limits.
#[global_allocator]
static ALLOC: Counting = Counting;

/// A pool for `seqs` sequences of up to `context` tokens, fed in chunks of
/// up to `chunk`, with small pages (so tables span many pages).
fn pool(model: &Model, seqs: usize, context: usize, chunk: usize) -> StatePool {
    let pc = PoolConfig::fitting(&model.cfg, seqs, context, chunk, 4).unwrap();
    StatePool::new(&model.cfg, &model.device(), pc).unwrap()
}

fn prompt(rng: &mut rand::rngs::StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

fn logits(out: &deepinfer::model::forward::StepOutput) -> Vec<f32> {
    out.logits.to_vec::<f32>().unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of a whole prefill of `tokens` in a fresh pool.
fn prefill(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut p = pool(model, 1, tokens.len(), tokens.len());
    let seq = p.add_sequence().unwrap();
    logits(&model.forward(&mut p, seq, tokens).unwrap())
}

#[test]
fn prefill_logits_are_finite_and_not_flat() {
    let mut rng = common::rng("model_prefill");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let tokens = prompt(&mut rng, 37, vocab);
    let out = prefill(&model, &tokens);
    assert_eq!(out.len(), 37 * vocab);
    assert!(out.iter().all(|v| v.is_finite()));
    for row in out.chunks(vocab) {
        let mean = row.iter().sum::<f32>() / vocab as f32;
        let std = (row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / vocab as f32).sqrt();
        assert!(std > 0.1, "flat logits: std {std}");
    }
}

#[test]
fn decoding_and_chunks_match_prefill_bit_for_bit() {
    let mut rng = common::rng("model_decode_vs_prefill");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let n = 301;
    let tokens = prompt(&mut rng, n, vocab);
    let mut p = pool(&model, 1, n, n);
    let seq = p.add_sequence().unwrap();
    let mut decoded = logits(&model.forward(&mut p, seq, &tokens[..1]).unwrap());
    // The step arena (`model::inputs`): a decode step reuses the storage of
    // the previous one's uploads wherever their shapes agree (on this run
    // 90 % of the uploads, and every upload in 114 of the 300 steps; the
    // rest follow the context: table widths, the indexer's key pages).
    let (mut uploads, mut reused, mut whole_steps) = (0, 0, 0);
    for &t in &tokens[1..] {
        decoded.extend(logits(&model.forward(&mut p, seq, &[t]).unwrap()));
        let s = p.inputs().stats();
        uploads += s.uploads;
        reused += s.reused;
        whole_steps += usize::from(s.uploads > 0 && s.reused == s.uploads);
    }
    assert!(
        reused * 10 > uploads * 8 && whole_steps > 50,
        "{reused} of {uploads} uploads reused, {whole_steps} steps reused every one"
    );
    // Every path was active: the KV sources hold one entry per complete group
    // (odd n leaves a ratio-2 group pending), the top-k is below the visible
    // entries, and the rings wrapped many pages.
    for plan in model.plans.iter().filter(|p| p.is_kv_source()) {
        assert_eq!(
            p.entries(seq, plan.layer).unwrap(),
            n / plan.ratio,
            "layer {}",
            plan.layer
        );
        if plan.ratio == 2 {
            assert!(p.has_pending(seq, plan.layer).unwrap());
        }
        assert!(n / plan.ratio > model.cfg.indexer.topk);
    }
    let whole = prefill(&model, &tokens);
    assert!(
        bits(&whole) == bits(&decoded),
        "decode differs from one prefill of 301"
    );
    for len in [1usize, 2, 3, 8, 9, 17, 130] {
        let pre = prefill(&model, &tokens[..len]);
        assert_eq!(
            bits(&pre[(len - 1) * vocab..]),
            bits(&decoded[(len - 1) * vocab..len * vocab]),
            "token {}: decode differs from a prefill of {len}",
            len - 1
        );
    }
    // Chunked prefill: fixed and random chunk sizes, including 1 and sizes
    // past a window and past the page size.
    for plan in [
        vec![7usize; 43],
        vec![1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 70],
        vec![150, 151],
    ] {
        let mut p = pool(&model, 1, n, 160);
        let seq = p.add_sequence().unwrap();
        let mut got = Vec::new();
        let mut at = 0;
        for c in plan.iter().copied().chain(std::iter::repeat(1)) {
            if at == n {
                break;
            }
            let c = c.min(n - at);
            got.extend(logits(
                &model.forward(&mut p, seq, &tokens[at..at + c]).unwrap(),
            ));
            at += c;
        }
        assert!(
            bits(&got) == bits(&whole),
            "chunks {plan:?} differ from one prefill"
        );
    }
}

/// Engram tables in host memory (each step's host half hashes its tokens'
/// n-grams, gathers their rows and uploads them; the device dequantises
/// what was uploaded) give the device tables' logits bit for bit: batched
/// prefill chunks of different lengths, then batched decode steps past the
/// n-gram look-back's start.
#[test]
fn host_engram_tables_give_the_device_tables_logits() {
    use deepinfer::model::forward::SeqInput;
    use deepinfer::model::layers::engram::EngramPlacement;
    use deepinfer::model::load::{WeightOptions, load_weights_with, modulo_token_map};
    let mut rng = common::rng("engram_host_tables");
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(rng.random());
    let load = |engram| {
        let options = WeightOptions {
            drafter: false,
            engram,
        };
        let cpu = deepinfer::Device::Cpu;
        let (w, _) = load_weights_with(&ck, &cfg, modulo_token_map(&cfg), &cpu, options).unwrap();
        Model::new(cfg.clone(), w).unwrap()
    };
    let (on_device, on_host) = (load(EngramPlacement::Device), load(EngramPlacement::Host));
    let placements = |m: &Model| -> Vec<EngramPlacement> {
        m.weights
            .blocks
            .iter()
            .filter_map(|b| b.engram.as_ref().map(|e| e.placement))
            .collect()
    };
    assert!(
        !placements(&on_device).is_empty(),
        "the tiny config has Engram layers"
    );
    assert!(
        placements(&on_host)
            .iter()
            .all(|&p| p == EngramPlacement::Host)
    );
    let vocab = cfg.vocab_size;
    let prompts: Vec<Vec<u32>> = [23usize, 9, 40]
        .iter()
        .map(|&n| prompt(&mut rng, n, vocab))
        .collect();
    let run = |model: &Model| -> Vec<u32> {
        let mut p = pool(model, prompts.len(), 80, 40);
        let seqs: Vec<_> = prompts.iter().map(|_| p.add_sequence().unwrap()).collect();
        let mut out = Vec::new();
        // Prefill in two batched chunks, then 20 batched decode steps.
        for (lo, hi) in [(0usize, 5usize), (5, 40)] {
            let inputs: Vec<SeqInput> = seqs
                .iter()
                .zip(&prompts)
                .filter(|(_, t)| t.len() > lo)
                .map(|(&seq, t)| SeqInput {
                    seq,
                    tokens: &t[lo..hi.min(t.len())],
                })
                .collect();
            out.extend(bits(&logits(
                &model.step(&mut p, &inputs, Capture::default()).unwrap(),
            )));
        }
        let next: Vec<Vec<u32>> = (0..20)
            .map(|step| {
                (0..seqs.len())
                    .map(|i| ((step * 37 + i * 101) % vocab) as u32)
                    .collect()
            })
            .collect();
        for tokens in &next {
            let inputs: Vec<SeqInput> = seqs
                .iter()
                .zip(tokens)
                .map(|(&seq, t)| SeqInput {
                    seq,
                    tokens: std::slice::from_ref(t),
                })
                .collect();
            out.extend(bits(&logits(
                &model.step(&mut p, &inputs, Capture::default()).unwrap(),
            )));
        }
        out
    };
    let (want, got) = (run(&on_device), run(&on_host));
    assert_eq!(want.len(), got.len());
    if let Some(i) = want.iter().zip(&got).position(|(a, b)| a != b) {
        panic!(
            "host tables differ from device tables at logit {i} (row {})",
            i / vocab
        );
    }
    // An engine whose config names another placement than its model's
    // tables is refused, naming the switch.
    let refused = deepinfer::engine::Engine::new(on_host, Default::default())
        .err()
        .expect("a host-table model under a device-table config");
    assert!(refused.to_string().contains("engram_tables"), "{refused}");
}

/// `Model::mhc_fusion` off (each expand alone, then the front half) gives
/// the fused path's logits bit for bit on the CPU, in prefill and decode.
#[test]
fn the_mhc_fusion_switch_keeps_the_logits() {
    let mut rng = common::rng("model_mhc_fusion");
    let (mut model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let tokens = prompt(&mut rng, 30, vocab);
    let mut run = |fusion: bool| {
        model.mhc_fusion = fusion;
        let mut p = pool(&model, 1, 40, 40);
        let seq = p.add_sequence().unwrap();
        let mut out = bits(&logits(&model.forward(&mut p, seq, &tokens[..25]).unwrap()));
        for &t in &tokens[25..] {
            out.extend(bits(&logits(&model.forward(&mut p, seq, &[t]).unwrap())));
        }
        out
    };
    assert!(run(true) == run(false));
}

#[test]
fn a_sequence_gives_the_same_logits_alone_or_in_any_batch() {
    let mut rng = common::rng("model_batch_invariance");
    let (mut model, _) = tiny_model(rng.random());
    // The CPU is batch-invariant: Auto runs the contiguous layout there.
    let cpu = deepinfer::Device::Cpu;
    assert_eq!(
        MoeLayout::Auto.resolve(1, 8, 2, &cpu),
        MoeLayout::Contiguous
    );
    assert_eq!(
        MoeLayout::Masked.resolve(4096, 8, 2, &cpu),
        MoeLayout::Masked
    );
    let vocab = model.cfg.vocab_size;
    let n_seqs = 5;
    let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(20..70)).collect();
    let prompts: Vec<Vec<u32>> = lens.iter().map(|&l| prompt(&mut rng, l, vocab)).collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|t| prefill(&model, t)).collect();
    let mut compositions = 0;
    for round in 0..8 {
        // Odd rounds run the routed experts in the masked layout: on the
        // CPU its rows are computed exactly as the contiguous layout's.
        model.moe_layout = if round % 2 == 1 {
            MoeLayout::Masked
        } else {
            MoeLayout::Auto
        };
        // A fresh pool of all sequences; each step takes a random subset,
        // each with a random chunk of its remaining tokens.
        let mut p = pool(&model, n_seqs, 70, 70);
        let seqs: Vec<_> = (0..n_seqs).map(|_| p.add_sequence().unwrap()).collect();
        let mut done = vec![0usize; n_seqs];
        let mut got: Vec<Vec<f32>> = vec![Vec::new(); n_seqs];
        while done.iter().zip(&lens).any(|(d, l)| d < l) {
            let mut picked: Vec<usize> = (0..n_seqs)
                .filter(|&i| done[i] < lens[i] && rng.random_bool(0.7))
                .collect();
            if picked.is_empty() {
                picked.push((0..n_seqs).find(|&i| done[i] < lens[i]).unwrap());
            }
            let chunks: Vec<usize> = picked
                .iter()
                .map(|&i| {
                    let left = lens[i] - done[i];
                    match rng.random_range(0..3) {
                        0 => 1,
                        1 => left,
                        _ => rng.random_range(1..=left),
                    }
                })
                .collect();
            let inputs: Vec<SeqInput> = picked
                .iter()
                .zip(&chunks)
                .map(|(&i, &c)| SeqInput {
                    seq: seqs[i],
                    tokens: &prompts[i][done[i]..done[i] + c],
                })
                .collect();
            let out = model.step(&mut p, &inputs, Capture::default()).unwrap();
            let all = logits(&out);
            for ((&i, &c), rows) in picked.iter().zip(&chunks).zip(&out.rows) {
                got[i].extend_from_slice(&all[rows.start * vocab..rows.end * vocab]);
                done[i] += c;
            }
            compositions += 1;
        }
        for i in 0..n_seqs {
            assert!(
                bits(&got[i]) == bits(&alone[i]),
                "round {round}: sequence {i} differs in a batch"
            );
        }
    }
    assert!(
        compositions >= 20,
        "only {compositions} batch compositions ran"
    );
}

#[test]
fn sequences_added_and_freed_mid_stream_never_touch_each_others_pages() {
    let mut rng = common::rng("model_pool_churn");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..9)
        .map(|_| {
            let n = rng.random_range(5..40);
            prompt(&mut rng, n, vocab)
        })
        .collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|t| prefill(&model, t)).collect();
    // Room for three live sequences at a time: freed pages are reused by
    // the next sequence while the others keep running.
    let mut p = pool(&model, 3, 40, 40);
    let mut waiting: Vec<usize> = (0..prompts.len()).collect();
    let mut live: Vec<(usize, deepinfer::model::pool::SeqId, usize)> = Vec::new();
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    while !waiting.is_empty() || !live.is_empty() {
        while live.len() < 3 && !waiting.is_empty() && rng.random_bool(0.6) {
            let i = waiting.remove(0);
            live.push((i, p.add_sequence().unwrap(), 0));
        }
        if live.is_empty() {
            continue;
        }
        let chunks: Vec<usize> = live
            .iter()
            .map(|&(i, _, done)| rng.random_range(1..=(prompts[i].len() - done).min(6)))
            .collect();
        let inputs: Vec<SeqInput> = live
            .iter()
            .zip(&chunks)
            .map(|(&(i, seq, done), &c)| SeqInput {
                seq,
                tokens: &prompts[i][done..done + c],
            })
            .collect();
        let out = model.step(&mut p, &inputs, Capture::default()).unwrap();
        let all = logits(&out);
        for ((entry, &c), rows) in live.iter_mut().zip(&chunks).zip(&out.rows) {
            got[entry.0].extend_from_slice(&all[rows.start * vocab..rows.end * vocab]);
            entry.2 += c;
        }
        live.retain(|&(i, seq, done)| {
            let finished = done == prompts[i].len();
            if finished {
                p.free_sequence(seq).unwrap();
            }
            !finished
        });
    }
    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
        assert!(bits(g) == bits(a), "sequence {i} differs after the churn");
    }
}

#[test]
fn the_pool_frees_pages_and_running_out_is_a_typed_error() {
    let mut rng = common::rng("model_pool");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let a_tokens = prompt(&mut rng, 40, vocab);
    let b_tokens = prompt(&mut rng, 40, vocab);
    // Room for a bit more than one sequence's compressed entries.
    let mut pc = PoolConfig::fitting(&model.cfg, 2, 40, 40, 4).unwrap();
    pc.compressed_pages = pc.compressed_pages * 3 / 4;
    let mut p = StatePool::new(&model.cfg, &model.device(), pc).unwrap();
    let free0 = p.free_pages();
    let a = p.add_sequence().unwrap();
    let b = p.add_sequence().unwrap();
    // Interleave a and b token by token until one runs out of compressed
    // pages; the scheduler then frees that one and the other finishes. The
    // survivor's logits are its own prefill's, bit for bit.
    let toks = [&a_tokens, &b_tokens];
    let ids = [a, b];
    let mut outs = [Vec::new(), Vec::new()];
    let mut failed = None;
    for i in 0..40 {
        for s in 0..2 {
            if failed == Some(s) {
                continue;
            }
            match model.forward(&mut p, ids[s], &toks[s][i..i + 1]) {
                Ok(o) => outs[s].extend(logits(&o)),
                Err(e) => {
                    assert!(failed.is_none(), "both sequences ran out: {e}");
                    assert!(
                        matches!(
                            e.op(),
                            Some(Error::OutOfPages {
                                cache: "compressed KV",
                                ..
                            })
                        ),
                        "{e}"
                    );
                    assert_eq!(
                        p.position(ids[s]).unwrap(),
                        i,
                        "a failed step moves nothing"
                    );
                    p.free_sequence(ids[s]).unwrap();
                    failed = Some(s);
                }
            }
        }
    }
    let lost = failed.expect("the small pool never ran out");
    let kept = 1 - lost;
    assert!(
        bits(&outs[kept]) == bits(&prefill(&model, toks[kept])),
        "the failure changed the survivor"
    );
    p.free_sequence(ids[kept]).unwrap();
    assert_eq!(p.free_pages(), free0, "freeing returns every page");
    let e = p.position(a).unwrap_err();
    assert!(
        matches!(e.op(), Some(Error::Argument { arg: "seq", .. })),
        "{e}"
    );
    let alone_a = prefill(&model, &a_tokens);
    // The freed pages serve a new sequence that gets a's logits again.
    let c = p.add_sequence().unwrap();
    let again = logits(&model.forward(&mut p, c, &a_tokens).unwrap());
    assert!(bits(&again) == bits(&alone_a));
}

#[test]
fn a_forked_sequence_continues_like_the_original_and_apart_from_it() {
    let mut rng = common::rng("model_fork");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    // 33 tokens: an odd ratio-2 partial group and wrapped rings at the fork.
    let tokens = prompt(&mut rng, 60, vocab);
    let whole = prefill(&model, &tokens);
    let mut p = pool(&model, 3, 60, 60);
    let a = p.add_sequence().unwrap();
    model.forward(&mut p, a, &tokens[..33]).unwrap();
    let b = p.fork(a).unwrap();
    assert_eq!(p.position(b).unwrap(), 33);
    let other = prompt(&mut rng, 10, vocab);
    // a takes a different path; b continues the prompt and must match it.
    model.forward(&mut p, a, &other).unwrap();
    let rest = logits(&model.forward(&mut p, b, &tokens[33..]).unwrap());
    assert!(
        bits(&rest) == bits(&whole[33 * vocab..]),
        "the fork lost state"
    );
    p.free_sequence(a).unwrap();
    let again = logits(&model.forward(&mut p, b, &[1]).unwrap());
    assert!(again.iter().all(|v| v.is_finite()));
}

#[test]
fn pool_budgets_are_explicit_and_bounded() {
    let (model, _) = tiny_model(4);
    let cfg = &model.cfg;
    let big = PoolConfig::fitting(cfg, 4, 1000, 64, 16).unwrap();
    let two = PoolConfig::fitting(cfg, 2, 1000, 64, 16).unwrap();
    let budget = two.memory_bytes(cfg).unwrap();
    assert!(budget < big.memory_bytes(cfg).unwrap());
    let small = PoolConfig::from_budget(cfg, budget, 4, 1000, 64, 16).unwrap();
    assert!(small.memory_bytes(cfg).unwrap() <= budget);
    assert!(
        small.window_pages > 0 && small.window_pages < big.window_pages,
        "{small:?}"
    );
    let e = PoolConfig::from_budget(cfg, 1000, 4, 1000, 64, 16).unwrap_err();
    assert!(e.to_string().contains("budget_bytes"), "{e}");
    let e = PoolConfig::fitting(cfg, 0, 10, 10, 16).unwrap_err();
    assert!(e.to_string().contains("max_seqs"), "{e}");
    let e = PoolConfig::fitting(cfg, 1, 10, 10, 0).unwrap_err();
    assert!(e.to_string().contains("page_rows"), "{e}");
    let (e, _) = bounded(
        "pool of 2^19 × 2^30",
        1 << 20,
        Duration::from_secs(2),
        || PoolConfig::fitting(cfg, 1 << 19, 1 << 30, 10, 1 << 16).unwrap_err(),
    );
    assert!(e.to_string().contains("2^31"), "{e}");
}

#[test]
fn bad_inputs_are_typed_errors() {
    let (model, _) = tiny_model(1);
    let vocab = model.cfg.vocab_size as u32;
    let mut p = pool(&model, 2, 16, 16);
    let s = p.add_sequence().unwrap();
    let e = model.forward(&mut p, s, &[]).unwrap_err();
    assert!(
        matches!(e.op(), Some(Error::Argument { arg: "tokens", .. })),
        "{e}"
    );
    let e = model.forward(&mut p, s, &[1, vocab]).unwrap_err();
    assert!(e.to_string().contains(&vocab.to_string()), "{e}");
    let e = model.forward(&mut p, 99, &[1]).unwrap_err();
    assert!(
        matches!(e.op(), Some(Error::Argument { arg: "seq", .. })),
        "{e}"
    );
    let e = model
        .step(
            &mut p,
            &[
                SeqInput {
                    seq: s,
                    tokens: &[1],
                },
                SeqInput {
                    seq: s,
                    tokens: &[2],
                },
            ],
            Capture::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    let e = model.step(&mut p, &[], Capture::default()).unwrap_err();
    assert!(
        matches!(e.op(), Some(Error::Argument { arg: "inputs", .. })),
        "{e}"
    );
    assert_eq!(
        p.position(s).unwrap(),
        0,
        "failed steps leave the sequence untouched"
    );
    let _t = p.add_sequence().unwrap();
    let e = p.add_sequence().unwrap_err();
    assert!(e.to_string().contains("max_seqs"), "{e}");
}

#[test]
fn the_drafter_produces_greedy_drafts_with_confidences() {
    let mut rng = common::rng("model_dspark");
    let (model, dspark) = tiny_model(rng.random());
    let dw = dspark.expect("the tiny config has DSpark stages");
    let cfg = &model.cfg;
    let tokens = prompt(&mut rng, 12, cfg.vocab_size);
    let mut p = pool(&model, 1, 12, 12);
    let seq = p.add_sequence().unwrap();
    let out = model.forward(&mut p, seq, &tokens).unwrap();
    let features = out.features.expect("the tiny config has target layers");
    assert_eq!(
        features.shape(),
        [12, cfg.dspark.target_layers.len() * cfg.hidden_size]
    );
    model
        .dspark_seed(&dw, &mut p, seq, &features.narrow_rows(0, 11).unwrap(), 0)
        .unwrap();
    let last = out.logits.narrow_rows(11, 1).unwrap();
    let next = deepinfer::ops::argmax(&last)
        .unwrap()
        .to_vec::<i32>()
        .unwrap()[0] as u32;
    let f11 = features.narrow_rows(11, 1).unwrap();
    let draft = model
        .dspark_draft(&dw, &mut p, seq, &f11, 11, next)
        .unwrap();
    assert_eq!(draft.tokens.len(), cfg.dspark.block_size);
    assert!(draft.tokens.iter().all(|&t| (t as usize) < cfg.vocab_size));
    assert!(draft.confidence_logits.iter().all(|c| c.is_finite()));
    // Bad drafter inputs are typed errors that leave the rings as they were
    // (the repeat below must still equal the first draft).
    for bad in [cfg.vocab_size as u32, u32::MAX] {
        let (e, _) = bounded("dspark_draft next", 4 << 20, Duration::from_secs(2), || {
            model
                .dspark_draft(&dw, &mut p, seq, &f11, 11, bad)
                .unwrap_err()
        });
        assert!(e.to_string().contains("next"), "{e}");
    }
    // Features of the wrong row count or width: refused by name, each
    // under 4 MiB and 2 s.
    let two = features.narrow_rows(10, 2).unwrap();
    let narrow = deepinfer::Tensor::from_vec(
        vec![half::bf16::ONE; cfg.hidden_size],
        &[1, cfg.hidden_size],
    )
    .unwrap();
    for (label, bad) in [("two feature rows", &two), ("narrow features", &narrow)] {
        let (e, _) = bounded(label, 4 << 20, Duration::from_secs(2), || {
            model
                .dspark_draft(&dw, &mut p, seq, bad, 11, next)
                .unwrap_err()
        });
        assert!(e.to_string().contains("features"), "{label}: {e}");
    }
    let none = features.narrow_rows(0, 0).unwrap();
    let (e, _) = bounded("no feature rows", 4 << 20, Duration::from_secs(2), || {
        model.dspark_seed(&dw, &mut p, seq, &none, 0).unwrap_err()
    });
    assert!(e.to_string().contains("features"), "{e}");
    let again = model
        .dspark_draft(&dw, &mut p, seq, &f11, 11, next)
        .unwrap();
    assert_eq!(
        draft, again,
        "drafting is deterministic and leaves the rings as they were"
    );
}

/// With capture on, a NaN is traced to the layer and sublayer where it
/// first appears; a clean step reports none.
#[test]
fn a_non_finite_step_names_the_layer_it_started_in() {
    let mut rng = common::rng("model_non_finite");
    let (mut model, _) = tiny_model(rng.random());
    let tokens = prompt(&mut rng, 5, model.cfg.vocab_size);
    let capture = Capture {
        streams: true,
        attention: true,
        moe: true,
        ..Capture::default()
    };
    let run = |model: &Model| {
        let mut p = pool(model, 1, 8, 8);
        let seq = p.add_sequence().unwrap();
        let inputs = [SeqInput {
            seq,
            tokens: &tokens,
        }];
        model.step(&mut p, &inputs, capture).unwrap()
    };
    assert_eq!(run(&model).first_non_finite().unwrap(), None);
    let d = model.cfg.hidden_size;
    model.weights.blocks[1].ffn_norm =
        deepinfer::Tensor::from_vec(vec![half::bf16::NAN; d], &[d]).unwrap();
    let out = run(&model);
    let nf = out.first_non_finite().unwrap().expect("a NaN norm weight");
    assert_eq!((nf.layer, nf.what), (Some(1), "moe"), "{nf}");
    assert_eq!(
        nf.to_string().split(' ').take(3).collect::<Vec<_>>(),
        ["layer", "1", "moe"]
    );
    // Without capture only the logits can show it.
    let mut p = pool(&model, 1, 8, 8);
    let seq = p.add_sequence().unwrap();
    let out = model
        .step(
            &mut p,
            &[SeqInput {
                seq,
                tokens: &tokens,
            }],
            Capture::default(),
        )
        .unwrap();
    let nf = out.first_non_finite().unwrap().expect("NaN logits");
    assert_eq!((nf.layer, nf.what), (None, "logits"));
}

#[test]
fn a_config_that_contradicts_the_checkpoint_is_rejected_by_name() {
    let cfg =
        ModelConfig::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny")).unwrap();
    let dir = TempDir::new("model-mismatch");
    generate(
        &cfg,
        dir.path(),
        &GenerateOptions {
            seed: 3,
            shard_bytes: 4 << 20,
            ..GenerateOptions::default()
        },
    )
    .unwrap();
    let mut other = cfg.clone();
    other.moe.n_routed_experts += 2;
    other.moe.inter_dim += 32;
    let e = Checkpoint::load(dir.path(), &other, &LoadOptions::default())
        .map(|_| ())
        .unwrap_err();
    let msg = e.to_string();
    let CheckpointError::Invalid { problems, .. } = &e else {
        panic!("expected Invalid: {msg}");
    };
    let missing = format!(
        "layers.0.ffn.experts.{}.w1.weight",
        cfg.moe.n_routed_experts
    );
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, TensorProblem::Missing { name, .. } if *name == missing)),
        "missing expert named"
    );
    assert!(
        problems.iter().any(|p| matches!(
            p,
            TensorProblem::WrongShape { name, .. } if name == "layers.0.ffn.experts.0.w1.weight"
        )),
        "wrong expert shape named"
    );
    // The message counts every problem and lists the first 20.
    assert!(
        msg.contains(&format!("{} problem(s)", problems.len())),
        "{msg}"
    );
    assert!(msg.contains("layers.0.ffn.experts.0.w1.weight"), "{msg}");
}

#[test]
fn hub_cache_snapshots_resolve_like_hf_hub() {
    use deepinfer::model::runner::{resolve_hf, resolve_model};
    let hub = TempDir::new("hub");
    let root = hub
        .path()
        .join("models--deepseek-ai--DeepSeek-V4.1-Flash-1017");
    std::fs::create_dir_all(root.join("snapshots/abc123")).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), "abc123\n").unwrap();
    let want = root.join("snapshots/abc123");
    assert_eq!(
        resolve_hf("deepseek-ai/DeepSeek-V4.1-Flash-1017", hub.path()),
        Ok(want.clone())
    );
    assert_eq!(
        resolve_hf("deepseek-ai/DeepSeek-V4.1-Flash-1017@abc123", hub.path()),
        Ok(want)
    );
    let e = resolve_hf("deepseek-ai/DeepSeek-V4.1-Flash-1017@zzz", hub.path()).unwrap_err();
    assert!(e.ends_with("snapshots/zzz"), "{}", e.display());
    let e = resolve_hf("other/model", hub.path()).unwrap_err();
    assert!(
        e.ends_with("models--other--model/refs/main"),
        "{}",
        e.display()
    );
    // A plain path: a directory resolves to itself, a missing one says where it looked.
    let dir = hub.path().to_str().unwrap();
    assert_eq!(
        resolve_model(Some(dir)).unwrap(),
        Some(hub.path().to_path_buf())
    );
    let e = resolve_model(Some("/nonexistent/model")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/model"), "{e}");
}
