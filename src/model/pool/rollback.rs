//! Speculative-decoding rollback (`serving.md` §2.5): a checkpoint of one
//! sequence taken before a verify step, and [`StatePool::rollback_to`],
//! which truncates the sequence to any position between the checkpoint and
//! its end without copying its caches.
//!
//! Invariant: after `checkpoint(seq)` at position c, any steps, and
//! `rollback_to(seq, a)` with c ≤ a ≤ the current position, every piece of
//! the sequence's state is what a plain run over its first a tokens leaves:
//! - window rings are position-addressed pages, so a write at a rejected
//!   position never lands on an accepted one; while the checkpoint is open
//!   no page inside the window of position c is freed, and the rollback
//!   marks the rows ≥ a unwritten and trims to a's window;
//! - compressed entries and index keys are truncated to a / ratio (a ratio-2
//!   entry whose pair holds a rejected position is dropped);
//! - a ratio-2 partial group holds exactly the last accepted token when a
//!   is odd (its kv and score rows are recorded while the checkpoint is
//!   open, or were saved with it) and nothing when a is even;
//! - the Engram history is recomputed from the checkpoint's history and
//!   the compressed ids of the accepted tokens (a pure function of ids);
//! - the DSpark stage rings are seeded only with accepted positions (by the
//!   engine, after the rollback): the rollback drops the rows past c that
//!   the last draft block wrote as scratch.
//!
//! The checkpoint closes with the rollback (rolling back to the current
//! position commits everything).
//!
//! Indexing invariant: as in the pool, every per-sequence and checkpoint
//! vector holds one entry per source or ring of the pool.
#![allow(clippy::indexing_slicing)]

use super::{HISTORY, SeqId, StatePool, unknown};
use crate::error::Error as OpError;
use crate::model::error::Result;
use crate::tensor::Tensor;
use std::collections::VecDeque;

/// What a sequence looked like at its checkpoint, and what it was fed since.
#[derive(Clone, Debug)]
pub(super) struct Checkpoint {
    pos: usize,
    history: VecDeque<Option<i64>>,
    /// Per source, the partial group's (kv, score) rows at the checkpoint.
    saved: Vec<Option<(Tensor, Tensor)>>,
    /// Per source (ratio-2 ones only), the (kv, score) rows of every token
    /// fed since the checkpoint, in position order.
    fed: Vec<Vec<(Tensor, Tensor)>>,
    /// The compressed ids of the tokens fed since the checkpoint.
    ids: Vec<Option<i64>>,
}

impl Checkpoint {
    /// The position the checkpoint was taken at.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    pub(super) fn record_ids(&mut self, ids: &[Option<i64>]) {
        self.ids.extend_from_slice(ids);
    }
}

fn bad(arg: &'static str, value: String, why: &'static str) -> OpError {
    OpError::Argument {
        op: "StatePool::rollback",
        arg,
        value,
        why,
    }
}

impl StatePool {
    /// Opens a checkpoint of `seq` at its current position (before a
    /// verify step). One checkpoint per sequence at a time.
    pub fn checkpoint(&mut self, seq: SeqId) -> Result<()> {
        let s = self.get(seq)?;
        if s.checkpoint.is_some() {
            return Err(bad(
                "seq",
                seq.to_string(),
                "the sequence already has an open checkpoint (roll back first)",
            )
            .into());
        }
        let saved = self.pending_copies(s)?;
        let cp = Checkpoint {
            pos: s.pos,
            history: s.history.clone(),
            saved,
            fed: vec![Vec::new(); self.sources.len()],
            ids: Vec::new(),
        };
        self.get_mut(seq)?.checkpoint = Some(Box::new(cp));
        Ok(())
    }

    /// Whether `seq` has an open checkpoint.
    pub fn has_checkpoint(&self, seq: SeqId) -> Result<bool> {
        Ok(self.get(seq)?.checkpoint.is_some())
    }

    /// Records the kv and score rows `row .. row + len` of a ratio-2
    /// compressor's step for `seq` while it has a checkpoint (nothing
    /// otherwise): the candidates for the partial group after a rollback.
    pub(crate) fn record_group_rows(
        &mut self,
        seq: SeqId,
        layer: usize,
        kv: &Tensor,
        score: &Tensor,
        row: usize,
        len: usize,
    ) -> Result<()> {
        let src = self.source(layer)?;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        if let Some(cp) = &mut s.checkpoint {
            for r in row..row + len {
                cp.fed[src].push((kv.narrow_rows(r, 1)?, score.narrow_rows(r, 1)?));
            }
        }
        Ok(())
    }

    /// Truncates `seq` to its first `pos` tokens (see the module's
    /// invariant) and closes its checkpoint. `pos` must lie between the
    /// checkpoint and the sequence's position; otherwise nothing changes.
    pub fn rollback_to(&mut self, seq: SeqId, pos: usize) -> Result<()> {
        let (pr, window, n_layers) = (self.cfg.page_rows, self.window, self.n_layers);
        let s = self.get(seq)?;
        let Some(cp) = s.checkpoint.as_deref() else {
            return Err(bad(
                "seq",
                seq.to_string(),
                "the sequence has no open checkpoint",
            )
            .into());
        };
        if pos < cp.pos || pos > s.pos {
            return Err(bad(
                "pos",
                pos.to_string(),
                "outside the checkpoint's position .. the sequence's position",
            )
            .into());
        }
        let slot = s.slot;
        // The partial groups to restore, before anything changes.
        let mut groups = Vec::with_capacity(self.sources.len());
        for (i, src) in self.sources.iter().enumerate() {
            if s.n_entries[i] != s.pos / src.ratio {
                return Err(bad(
                    "seq",
                    seq.to_string(),
                    "a source's entries do not match the sequence's position",
                )
                .into());
            }
            groups.push(match src.gated {
                Some(_) if pos % 2 == 1 => {
                    let g = if pos > cp.pos {
                        cp.fed[i].get(pos - 1 - cp.pos)
                    } else {
                        cp.saved[i].as_ref()
                    };
                    Some(g.cloned().ok_or_else(|| {
                        bad(
                            "pos",
                            pos.to_string(),
                            "the partial group of the last accepted token was not recorded",
                        )
                    })?)
                }
                _ => None,
            });
        }
        for (i, g) in groups.iter().enumerate() {
            if let Some((kv, score)) = g {
                let row = self.pending_row(slot, i)?;
                self.put_pending(row, kv, score, 0)?;
            }
        }
        let ratios: Vec<usize> = self.sources.iter().map(|s| s.ratio).collect();
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        let Some(cp) = s.checkpoint.take() else {
            return Err(bad(
                "seq",
                seq.to_string(),
                "the sequence has no open checkpoint",
            )
            .into());
        };
        let accepted = pos - cp.pos;
        let mut history = cp.history;
        for &id in cp.ids.iter().take(accepted) {
            history.push_back(id);
            if history.len() > HISTORY {
                history.pop_front();
            }
        }
        s.history = history;
        for (i, ratio) in ratios.into_iter().enumerate() {
            s.n_entries[i] = pos / ratio;
            s.pending[i] = groups[i].is_some();
        }
        for (r, end) in s.ring_end.iter_mut().enumerate() {
            *end = (*end).min(if r < n_layers { pos } else { cp.pos });
        }
        let keep = (pos + 1).saturating_sub(window);
        for t in &mut s.rings[..n_layers] {
            t.trim(keep, pr, &mut self.ring_pages.free);
        }
        s.pos = pos;
        Ok(())
    }
}
