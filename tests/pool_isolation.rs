//! Sequences sharing one `StatePool` never read or write each other's pages
//! (issue 15, item 7): random interleavings of `add_sequence`, `fork`,
//! batched steps of random chunk lengths and frees over many sequences of
//! the tiny model, in a pool with small pages that are recycled between
//! sequences, give every sequence bitwise the logits of its solo run (one
//! whole-prompt forward in a pool of its own). A read of a stale or foreign
//! row, or a write into another sequence's page, changes some logit. After
//! the last free every page is back on the free lists. Fixed seeds: every
//! run replays the same schedules.

mod common;

use deepinfer::Tensor;
use deepinfer::model::forward::{Capture, Model, SeqInput};
use deepinfer::model::pool::{PoolConfig, SeqId, StatePool};
use deepinfer::model::runner::single_sequence_pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// The schedules' seeds.
const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 0x5eed];
/// Sequences started per schedule (forks come on top).
const SEQUENCES: usize = 16;
/// Sequences alive at once at most.
const LIVE: usize = 6;
const MAX_LEN: usize = 56;
const MAX_CHUNK: usize = 9;
/// Small pages, so rings drop and reuse pages every few steps and freed
/// pages go to other sequences while their old rows are still there.
const PAGE_ROWS: usize = 4;

/// A sequence in the shared pool: its whole token stream, how many of its
/// tokens have run, and the logits of its solo run.
struct Seq {
    id: SeqId,
    tokens: Vec<u32>,
    done: usize,
    solo: Vec<u32>,
}

/// The logits of `tokens` run alone, as bits, row-major `[len, vocab]`.
fn solo_bits(model: &Model, tokens: &[u32]) -> Vec<u32> {
    let mut pool = single_sequence_pool(model, tokens.len() + 1).unwrap();
    let seq = pool.add_sequence().unwrap();
    bits(&model.forward(&mut pool, seq, tokens).unwrap().logits)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..512)).collect()
}

/// One random schedule; returns (steps, tokens checked).
fn schedule(model: &Model, seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let v = model.cfg.vocab_size;
    let pc = PoolConfig::fitting(&model.cfg, LIVE, MAX_LEN + 1, MAX_CHUNK, PAGE_ROWS).unwrap();
    let mut pool = StatePool::new(&model.cfg, &model.device(), pc).unwrap();
    let all_free = pool.free_pages();
    let mut live: Vec<Seq> = Vec::new();
    let mut started = 0;
    let (mut steps, mut checked) = (0, 0);
    let mut ever: HashMap<SeqId, ()> = HashMap::new();
    while started < SEQUENCES || !live.is_empty() {
        // Add a sequence (sometimes several before the next step).
        while started < SEQUENCES && live.len() < LIVE && (live.is_empty() || rng.random_bool(0.4))
        {
            let n = rng.random_range(1..=MAX_LEN);
            let t = tokens(&mut rng, n);
            let id = pool.add_sequence().unwrap();
            assert!(ever.insert(id, ()).is_none(), "sequence id {id} reused");
            live.push(Seq {
                id,
                solo: solo_bits(model, &t),
                tokens: t,
                done: 0,
            });
            started += 1;
        }
        // Fork a sequence that has run some tokens: the copy continues with
        // tokens of its own.
        if live.len() < LIVE && rng.random_bool(0.15) {
            let candidates: Vec<usize> = (0..live.len())
                .filter(|&k| live[k].done > 0 && live[k].done < MAX_LEN)
                .collect();
            if !candidates.is_empty() {
                let k = candidates[rng.random_range(0..candidates.len())];
                let done = live[k].done;
                let mut t = live[k].tokens[..done].to_vec();
                let extra = rng.random_range(1..=MAX_LEN - done);
                t.extend(tokens(&mut rng, extra));
                let id = pool.fork(live[k].id).unwrap();
                assert!(ever.insert(id, ()).is_none(), "sequence id {id} reused");
                assert_eq!(pool.position(id).unwrap(), done);
                live.push(Seq {
                    id,
                    solo: solo_bits(model, &t),
                    tokens: t,
                    done,
                });
            }
        }
        // A step over a random non-empty subset, each with a random chunk,
        // in a random order.
        let mut order: Vec<usize> = (0..live.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        order.truncate(rng.random_range(1..=order.len()));
        let chunks: Vec<(usize, usize)> = order
            .iter()
            .map(|&k| {
                let s = &live[k];
                let left = s.tokens.len() - s.done;
                (k, rng.random_range(1..=left.min(MAX_CHUNK)))
            })
            .collect();
        let inputs: Vec<SeqInput> = chunks
            .iter()
            .map(|&(k, n)| SeqInput {
                seq: live[k].id,
                tokens: &live[k].tokens[live[k].done..live[k].done + n],
            })
            .collect();
        let out = model.step(&mut pool, &inputs, Capture::default()).unwrap();
        let got = bits(&out.logits);
        for (&(k, n), rows) in chunks.iter().zip(&out.rows) {
            let s = &mut live[k];
            assert_eq!(rows.len(), n);
            for (i, r) in rows.clone().enumerate() {
                let p = s.done + i;
                assert!(
                    got[r * v..(r + 1) * v] == s.solo[p * v..(p + 1) * v],
                    "seed {seed}, step {steps}: sequence {} at position {p} differs from its solo run",
                    s.id
                );
            }
            s.done += n;
            assert_eq!(pool.position(s.id).unwrap(), s.done);
            checked += n;
        }
        steps += 1;
        // Free the finished sequences, and now and then one midway.
        let mut k = 0;
        while k < live.len() {
            let s = &live[k];
            if s.done == s.tokens.len() || rng.random_bool(0.03) {
                pool.free_sequence(s.id).unwrap();
                assert!(pool.position(s.id).is_err(), "a freed sequence is gone");
                live.swap_remove(k);
            } else {
                k += 1;
            }
        }
    }
    assert_eq!(
        pool.free_pages(),
        all_free,
        "seed {seed}: every page is free again after the last free"
    );
    (steps, checked)
}

#[test]
fn interleaved_sequences_match_their_solo_runs_bitwise() {
    let t0 = std::time::Instant::now();
    let (model, _) = common::tiny::tiny_model(15);
    let (mut steps, mut checked) = (0, 0);
    for seed in SEEDS {
        let (s, c) = schedule(&model, seed);
        steps += s;
        checked += c;
    }
    eprintln!(
        "pool_isolation: {} schedules, {steps} steps, {checked} token logits checked bitwise in {:.1} s",
        SEEDS.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(checked > SEEDS.len() * SEQUENCES);
}
