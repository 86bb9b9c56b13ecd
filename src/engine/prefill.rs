//! A batch's prefill through the prefix cache and the YOCO prefill modes
//! (`serving.md` §3, `v41-flash.md` §4–§5).
//!
//! Per request of S prompt tokens: the longest cached prefix H ≤ S − 1
//! (whole blocks) is restored, then the rest is fed, in one batched step,
//! or two when the request's last block boundary H' (H < H' ≤ S − 1) is not
//! cached yet: the first step ends at H', where the sequence is
//! snapshotted into the cache.
//! - Exact: a hit restores the whole state, window rings included; chunked
//!   prefill equals one prefill, so every request's logits equal a cold
//!   run's bitwise.
//! - Compact: a hit restores the global state only and replays the last
//!   `yoco_keep_tokens` tokens before H to rebuild the window rings, with
//!   attention limited to the replayed span; and, hit or not, the layers
//!   after the last KV source run only on the prompt's last
//!   `yoco_keep_tokens` tokens. An approximation of the exact path (its
//!   drift is measured in `benches/prefix_replay_cpu.rs`); a hit no longer
//!   than `yoco_keep_tokens` is not taken (replay would redo it all).
//!
//! Invariant: every request's sequence ends at position S with the
//! logits of its last prompt token at the returned row, and its target
//! features (when the model has DSpark targets) for the positions the late
//! layers ran on, ending at S − 1: with speculative decoding, at least the
//! last window of positions (an exact hit is capped at S − window; compact
//! runs the late layers over the last `yoco_keep_tokens`), all a drafter's
//! window rings read. The cache only ever receives snapshots taken right
//! after whole blocks of the request's own tokens.

use super::prefix_cache::PrefixCache;
use super::{Engine, YocoMode};
use crate::model::Result;
use crate::model::forward::{Capture, SeqInput, StepOutput};
use crate::model::pool::{SeqId, StatePool};
use crate::model::truncate::EntryShape;
use crate::tensor::Tensor;
use std::sync::{Mutex, MutexGuard};

/// Token rows a prefill ran through the layers, for the compute figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillCounters {
    /// Rows through the layers up to the last KV source (replay included).
    pub early_rows: u64,
    /// Rows through the layers after it.
    pub late_rows: u64,
    /// Rows restored from the cache instead of computed.
    pub reused_rows: u64,
}

/// What a batch's prefill leaves: each request's sequence, and the logits
/// `[rows, vocab]` with each request's last prompt token at `last[i]`.
pub(crate) struct Prefilled {
    pub seqs: Vec<SeqId>,
    pub logits: Tensor,
    pub last: Vec<usize>,
    /// Per request, the DSpark target features the prefill computed
    /// (`None` when the model has no target layers or nothing ran them).
    pub tails: Vec<Option<Tail>>,
}

/// The target features `[n, targets · D]` of positions `from .. from + n`,
/// the last of them the prompt's last token.
pub(crate) struct Tail {
    pub features: Tensor,
    pub from: usize,
}

/// Appends a feed's feature rows for positions `from ..` to `tail`; a
/// piece that does not continue it starts it over (the prompt's end is
/// what a drafter reads).
fn extend(tail: &mut Option<Tail>, piece: Tensor, from: usize) -> Result<()> {
    *tail = Some(match tail.take() {
        Some(t) if t.from + t.features.rows() == from => Tail {
            features: Tensor::cat_rows(&[&t.features, &piece])?,
            from: t.from,
        },
        _ => Tail {
            features: piece,
            from,
        },
    });
    Ok(())
}

/// One request's progress: tokens from `from` are still to be fed, the
/// first `pos − from` of them replayed.
struct Req<'a> {
    tokens: &'a [u32],
    seq: SeqId,
    from: usize,
    pos: usize,
    store: Option<usize>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Engine {
    pub(crate) fn prefill(&self, pool: &mut StatePool, prompts: &[&[u32]]) -> Result<Prefilled> {
        let compact = self.config.yoco_mode == YocoMode::Compact;
        let keep = self.config.yoco_keep_tokens;
        let mut reqs = Vec::with_capacity(prompts.len());
        let mut counters = PrefillCounters::default();
        // Speculative decoding seeds the drafter's window rings from the
        // features computed here, so an exact hit must leave at least a
        // window of positions to feed (compact always runs the late layers
        // over the last `keep` ≥ window + one block positions).
        let window = self.model.cfg.attention.window;
        let speculative = self.config.nextn > 0;
        for &tokens in prompts {
            let s = tokens.len();
            // A compact hit no longer than the replay would redo it all.
            let min_len = if compact { keep } else { 0 };
            let max_len = if speculative && !compact {
                s.saturating_sub(window)
            } else {
                s.saturating_sub(1)
            };
            let hit = self
                .prefix_cache
                .as_ref()
                .and_then(|c| lock(c).lookup(tokens, (min_len, max_len), !compact));
            let restored = hit.and_then(|(h, snap)| {
                let got = if compact {
                    let from = h - keep;
                    let hist = self.history_at(tokens, from);
                    pool.restore_global(&snap, from, &hist).map(|id| (id, from, h))
                } else {
                    pool.restore(&snap).map(|id| (id, h, h))
                };
                // A snapshot the pool cannot take (out of pages now, or from a
                // pool of another layout) costs the reuse, not the request.
                // Either way the cache learns what became of its hit.
                if let Some(c) = &self.prefix_cache {
                    match &got {
                        Ok(_) => lock(c).hit_used(h),
                        Err(e) => {
                            tracing::warn!(prefix = h, error = %e, "prefix restore failed; prefilling cold");
                            lock(c).restore_failed();
                        }
                    }
                }
                got.ok()
            });
            let (seq, from, pos) = match restored {
                Some(r) => r,
                None => (pool.add_sequence()?, 0, 0),
            };
            counters.reused_rows += pos as u64;
            let store = self.prefix_cache.as_ref().and_then(|c| {
                let c = lock(c);
                let bt = c.config().block_tokens;
                // The last boundary a later hit on this prompt may take.
                let at = max_len / bt * bt;
                (at > pos && !c.contains(&tokens[..at])).then_some(at)
            });
            reqs.push(Req {
                tokens,
                seq,
                from,
                pos,
                store,
            });
        }
        // The steps to the new block boundaries, then to the prompts' ends.
        let late = |r: &Req, end: usize| {
            let s = r.tokens.len();
            if compact {
                end.saturating_sub(s.saturating_sub(keep).max(r.from))
            } else {
                end - r.from
            }
        };
        let mut tails: Vec<Option<Tail>> = reqs.iter().map(|_| None).collect();
        let mut keep_tails = |which: &[usize], ends: &[usize], out: &StepOutput| -> Result<()> {
            let Some(features) = out.features.as_ref().filter(|_| speculative) else {
                return Ok(());
            };
            for ((&k, &end), rows) in which.iter().zip(ends).zip(&out.rows) {
                if !rows.is_empty() {
                    let piece = features.narrow_rows(rows.start, rows.len())?;
                    extend(&mut tails[k], piece, end - rows.len())?;
                }
            }
            Ok(())
        };
        let first: Vec<usize> = (0..reqs.len())
            .filter(|&k| reqs[k].store.is_some())
            .collect();
        if !first.is_empty() {
            let ends: Vec<usize> = first.iter().map(|&k| reqs[k].store.unwrap_or(0)).collect();
            let out = self.feed(pool, &reqs, &first, &ends, &late, &mut counters)?;
            keep_tails(&first, &ends, &out)?;
            for (&k, &end) in first.iter().zip(&ends) {
                let r = &mut reqs[k];
                if let Some(c) = &self.prefix_cache {
                    // Room in the budget first (evicting), then the device's
                    // free memory, then the copy; a snapshot that cannot be
                    // taken costs the reuse, not the request.
                    let need = pool.snapshot_bytes(r.seq, !compact)?;
                    if lock(c).make_room(end, need) {
                        let free = pool.device().available_memory();
                        let snap = match free.map(|f| f.is_none_or(|f| need <= f)) {
                            Ok(true) => pool.snapshot(r.seq, !compact).map(Some),
                            Ok(false) => Ok(None),
                            Err(e) => Err(e.into()),
                        };
                        match snap {
                            Ok(Some(snap)) => {
                                lock(c).insert(&r.tokens[..end], snap)?;
                            }
                            Ok(None) => lock(c).snapshot_failed(),
                            Err(e) => {
                                tracing::warn!(prefix = end, bytes = need, error = %e, "prefix snapshot failed; not cached");
                                lock(c).snapshot_failed();
                            }
                        }
                    }
                }
                r.from = end;
                r.pos = end;
            }
        }
        let all: Vec<usize> = (0..reqs.len()).collect();
        let ends: Vec<usize> = reqs.iter().map(|r| r.tokens.len()).collect();
        let out = self.feed(pool, &reqs, &all, &ends, &late, &mut counters)?;
        keep_tails(&all, &ends, &out)?;
        let c = &mut *lock(&self.counters);
        c.early_rows += counters.early_rows;
        c.late_rows += counters.late_rows;
        c.reused_rows += counters.reused_rows;
        Ok(Prefilled {
            seqs: reqs.iter().map(|r| r.seq).collect(),
            last: out.rows.iter().map(|r| r.end.saturating_sub(1)).collect(),
            logits: out.logits,
            tails,
        })
    }

    /// One step feeding requests `which` up to `ends`.
    fn feed(
        &self,
        pool: &mut StatePool,
        reqs: &[Req],
        which: &[usize],
        ends: &[usize],
        late: &dyn Fn(&Req, usize) -> usize,
        counters: &mut PrefillCounters,
    ) -> Result<StepOutput> {
        let mut inputs = Vec::with_capacity(which.len());
        let mut shapes = Vec::with_capacity(which.len());
        for (&k, &end) in which.iter().zip(ends) {
            let r = &reqs[k];
            inputs.push(SeqInput {
                seq: r.seq,
                tokens: &r.tokens[r.from..end],
            });
            let shape = EntryShape {
                replay: r.pos - r.from,
                late_rows: late(r, end),
            };
            counters.early_rows += (end - r.from) as u64;
            counters.late_rows += shape.late_rows.min(end - r.from) as u64;
            shapes.push(shape);
        }
        self.model
            .step_shaped(pool, &inputs, &shapes, Capture::default())
    }

    /// The Engram history at position `at` of `tokens`: the compressed ids
    /// of the (up to) three tokens before it, oldest first.
    fn history_at(&self, tokens: &[u32], at: usize) -> Vec<Option<i64>> {
        let map = &self.model.weights.engram_token_map;
        tokens[at.saturating_sub(3)..at]
            .iter()
            .map(|&t| map.get(t as usize).copied())
            .collect()
    }

    /// The logits (fp32, one vocabulary row each) of every prompt's last
    /// token after a prefill as [`Engine::generate`] runs it: through the
    /// prefix cache and the configured prefill mode.
    pub fn prefill_logits(&self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let v = self.model.cfg.vocab_size;
        let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.is_empty()
            || prompts.iter().any(Vec::is_empty)
            || max_len >= self.config.max_context
            || prompts.len() > self.config.max_seqs
        {
            return Err(crate::Error::Argument {
                op: "Engine::prefill_logits",
                arg: "prompts",
                value: format!("{} prompts of up to {max_len} tokens", prompts.len()),
                why: "1..=max_seqs non-empty prompts shorter than max_context",
            }
            .into());
        }
        let mut pool = self.pool(prompts.len(), max_len + 1, max_len)?;
        let batch: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let pre = self.prefill(&mut pool, &batch)?;
        let host = pre.logits.to_vec::<f32>()?;
        Ok(pre
            .last
            .iter()
            .map(|&r| host[r * v..(r + 1) * v].to_vec())
            .collect())
    }

    /// Installs an empty prefix cache.
    pub fn with_prefix_cache(self, cache: PrefixCache) -> Engine {
        Engine {
            prefix_cache: Some(Mutex::new(cache)),
            ..self
        }
    }

    /// The prefix cache's statistics (`None` without a cache).
    pub fn prefix_cache_stats(&self) -> Option<super::prefix_cache::CacheStats> {
        self.prefix_cache.as_ref().map(|c| lock(c).stats())
    }

    /// The prefill row counts since the engine was built.
    pub fn prefill_counters(&self) -> PrefillCounters {
        *lock(&self.counters)
    }
}
