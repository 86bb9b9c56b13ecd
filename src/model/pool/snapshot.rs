//! Deep copies of one sequence's state out of a [`StatePool`] and back into
//! a pool: what the engine's prefix cache keeps (`serving.md` §7): the
//! compressed KV entries and index keys of every KV source, the ratio-2
//! partial groups, the Engram history and, for the exact path, the window
//! rings.
//!
//! Invariant: a [`SeqSnapshot`] owns copies of every row it holds, so it
//! stays valid whatever later happens to the pool it came from (the
//! sequence freed, its pages reused, the pool dropped). Restoring checks the
//! snapshot against the target pool (page size, caches, row layouts, free
//! pages and slots) before it takes anything, then copies the rows into
//! fresh pages: the restored sequence shares no page with any other
//! sequence, and a failed restore changes nothing.

use super::{BlockTable, Pages, SeqId, Sequence, StatePool, take_page};
use crate::error::Error as OpError;
use crate::model::error::Result;
use crate::tensor::Tensor;

/// One block table's pages, copied.
#[derive(Debug)]
struct TableCopy {
    first: usize,
    pages: usize,
    /// `[pages · page_rows, width]`; `None` for a table without pages.
    rows: Option<Tensor>,
}

/// A sequence's state at one position, owned outside any pool.
#[derive(Debug)]
pub struct SeqSnapshot {
    pos: usize,
    page_rows: usize,
    /// Every ring (backbone layers, then DSpark stages); `None`: the
    /// global state only.
    rings: Option<Vec<TableCopy>>,
    ring_begin: Vec<usize>,
    ring_end: Vec<usize>,
    entries: Vec<TableCopy>,
    n_entries: Vec<usize>,
    keys: Vec<TableCopy>,
    /// Per source: the partial group's kv and score rows `[1, head_dim]`.
    pending: Vec<Option<(Tensor, Tensor)>>,
    history: Vec<Option<i64>>,
    bytes: usize,
}

impl SeqSnapshot {
    /// The position the snapshot was taken at (tokens processed).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Whether it holds the window rings (what an exact restore needs).
    pub fn has_rings(&self) -> bool {
        self.rings.is_some()
    }

    /// Bytes of the rows it owns.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

fn copy_out(pages: &Pages, t: &BlockTable, pr: usize) -> Result<TableCopy> {
    if t.pages.is_empty() {
        return Ok(TableCopy {
            first: t.first,
            pages: 0,
            rows: None,
        });
    }
    let mut shape = pages.rows.shape().to_vec();
    shape[0] = t.pages.len() * pr;
    let mut out = Tensor::empty(&pages.rows.device(), pages.rows.dtype(), &shape)?;
    for (i, &p) in t.pages.iter().enumerate() {
        out.copy_rows_from(i * pr, &pages.rows, p as usize * pr, pr)?;
    }
    Ok(TableCopy {
        first: t.first,
        pages: t.pages.len(),
        rows: Some(out),
    })
}

/// Copies `c` into fresh pages appended to `t` (each page is in `t` before
/// its rows are copied, so a failure leaves every taken page in `t`).
fn copy_in(
    pages: &mut Pages,
    c: &TableCopy,
    pr: usize,
    seq: SeqId,
    t: &mut BlockTable,
) -> Result<()> {
    t.first = c.first;
    if let Some(rows) = &c.rows {
        for i in 0..c.pages {
            let q = take_page(pages, seq)?;
            t.pages.push_back(q);
            pages
                .rows
                .copy_rows_from(q as usize * pr, rows, i * pr, pr)?;
        }
    }
    Ok(())
}

/// Whether `c`'s rows fit `pages`' row layout.
fn fits(pages: &Pages, c: &TableCopy) -> bool {
    c.rows.as_ref().is_none_or(|r| {
        r.dtype() == pages.rows.dtype() && r.shape().get(1..) == pages.rows.shape().get(1..)
    })
}

fn mismatch(why: &'static str, value: String) -> crate::model::Error {
    OpError::Argument {
        op: "StatePool::restore",
        arg: "snapshot",
        value,
        why,
    }
    .into()
}

impl StatePool {
    /// The bytes [`StatePool::snapshot`] of `seq` would own
    /// ([`SeqSnapshot::bytes`]), computed without copying anything: what a
    /// cache compares with its budget and the pool's device memory before
    /// the copy is made.
    pub fn snapshot_bytes(&self, seq: SeqId, rings: bool) -> Result<usize> {
        let s = self.get(seq)?;
        let pr = self.cfg.page_rows;
        let table_bytes = |pages: &Pages, tables: &[BlockTable]| {
            let row = pages.rows.row_bytes();
            tables
                .iter()
                .map(|t| t.pages.len() * pr * row)
                .sum::<usize>()
        };
        let pending = s.pending.iter().filter(|&&p| p).count()
            * (self.pending_kv.row_bytes() + self.pending_score.row_bytes());
        Ok(if rings {
            table_bytes(&self.ring_pages, &s.rings)
        } else {
            0
        } + table_bytes(&self.comp_pages, &s.entries)
            + table_bytes(&self.key_pages, &s.keys)
            + pending)
    }

    /// A deep copy of `seq`'s state; the window rings only when `rings`.
    pub fn snapshot(&self, seq: SeqId, rings: bool) -> Result<SeqSnapshot> {
        let s = self.get(seq)?;
        if s.checkpoint.is_some() {
            // Its state past the checkpoint is unverified drafts.
            return Err(OpError::Argument {
                op: "StatePool::snapshot",
                arg: "seq",
                value: seq.to_string(),
                why: "the sequence has an open speculative checkpoint (roll back first)",
            }
            .into());
        }
        let pr = self.cfg.page_rows;
        let copy = |pages: &Pages, tables: &[BlockTable]| -> Result<Vec<TableCopy>> {
            tables.iter().map(|t| copy_out(pages, t, pr)).collect()
        };
        let ring_copy = if rings {
            Some(copy(&self.ring_pages, &s.rings)?)
        } else {
            None
        };
        let entries = copy(&self.comp_pages, &s.entries)?;
        let keys = copy(&self.key_pages, &s.keys)?;
        let pending = self.pending_copies(s)?;
        let table_bytes = |ts: &[TableCopy]| {
            ts.iter()
                .filter_map(|t| t.rows.as_ref())
                .map(Tensor::storage_bytes)
                .sum::<usize>()
        };
        let bytes = ring_copy.as_deref().map_or(0, table_bytes)
            + table_bytes(&entries)
            + table_bytes(&keys)
            + pending
                .iter()
                .flatten()
                .map(|(k, s)| k.storage_bytes() + s.storage_bytes())
                .sum::<usize>();
        Ok(SeqSnapshot {
            pos: s.pos,
            page_rows: pr,
            rings: ring_copy,
            ring_begin: s.ring_begin.clone(),
            ring_end: s.ring_end.clone(),
            entries,
            n_entries: s.n_entries.clone(),
            keys,
            pending,
            history: s.history.iter().copied().collect(),
            bytes,
        })
    }

    /// A new sequence with the whole state of `snap`, window rings
    /// included (the snapshot must hold them): it continues exactly as the
    /// snapshotted sequence would have.
    pub fn restore(&mut self, snap: &SeqSnapshot) -> Result<SeqId> {
        if snap.rings.is_none() {
            return Err(mismatch(
                "an exact restore needs a snapshot taken with its rings",
                format!("global state at position {}", snap.pos),
            ));
        }
        self.restore_with(snap, None)
    }

    /// A new sequence with the global state of `snap` (compressed KV,
    /// index keys, partial groups) at its position H, and empty rings that
    /// start at `replay_from` ≤ H with `history` as the Engram history
    /// there: the state a bounded replay of positions `replay_from .. H`
    /// (a step whose first H − `replay_from` tokens are replayed) starts
    /// from.
    pub fn restore_global(
        &mut self,
        snap: &SeqSnapshot,
        replay_from: usize,
        history: &[Option<i64>],
    ) -> Result<SeqId> {
        if replay_from > snap.pos || history.len() > super::HISTORY {
            return Err(mismatch(
                "replay_from must not pass the snapshot's position, history holds at most 3 ids",
                format!(
                    "replay_from {replay_from}, history of {} at position {}",
                    history.len(),
                    snap.pos
                ),
            ));
        }
        self.restore_with(snap, Some((replay_from, history)))
    }

    fn restore_with(
        &mut self,
        snap: &SeqSnapshot,
        replay: Option<(usize, &[Option<i64>])>,
    ) -> Result<SeqId> {
        let pr = self.cfg.page_rows;
        let n = self.sources.len();
        if snap.page_rows != pr
            || snap.entries.len() != n
            || snap.keys.len() != n
            || snap.ring_end.len() != self.rings
            || snap.rings.as_ref().is_some_and(|r| r.len() != self.rings)
        {
            return Err(mismatch(
                "taken from a pool of another page size or model",
                format!(
                    "{} rows per page, {} sources",
                    snap.page_rows,
                    snap.entries.len()
                ),
            ));
        }
        let rings = snap.rings.as_deref().filter(|_| replay.is_none());
        let ring_list = rings.unwrap_or(&[]);
        let layouts = ring_list.iter().all(|c| fits(&self.ring_pages, c))
            && snap.entries.iter().all(|c| fits(&self.comp_pages, c))
            && snap.keys.iter().all(|c| fits(&self.key_pages, c));
        let hd = self.pending_kv.shape().get(1).copied();
        let pending_ok = snap.pending.iter().enumerate().all(|(i, p)| {
            p.as_ref().is_none_or(|(k, s)| {
                self.sources[i].gated.is_some()
                    && k.shape().get(1).copied() == hd
                    && s.shape().get(1).copied() == hd
            })
        });
        if !layouts || !pending_ok {
            return Err(mismatch(
                "its rows do not fit this pool's row layout",
                format!("snapshot at position {}", snap.pos),
            ));
        }
        let need = |ts: &[TableCopy]| ts.iter().map(|t| t.pages).sum::<usize>();
        for (pages, needed) in [
            (&self.ring_pages, need(ring_list)),
            (&self.comp_pages, need(&snap.entries)),
            (&self.key_pages, need(&snap.keys)),
        ] {
            if needed > pages.free.len() {
                return Err(OpError::OutOfPages {
                    cache: pages.name,
                    seq: self.next_id,
                    needed,
                    free: pages.free.len(),
                    total: pages.total,
                }
                .into());
            }
        }
        let id = self.add_sequence()?;
        let mut s = self.seqs.remove(&id).ok_or_else(|| super::unknown(id))?;
        let copied = self.fill(&mut s, snap, rings, id);
        if let Err(e) = copied {
            self.seqs.insert(id, s);
            self.free_sequence(id)?;
            return Err(e);
        }
        s.pos = snap.pos;
        s.n_entries = snap.n_entries.clone();
        match replay {
            Some((from, history)) => {
                for t in &mut s.rings {
                    t.first = from / pr;
                }
                s.ring_begin = vec![from; self.rings];
                s.ring_end = vec![from; self.rings];
                s.history = history.iter().copied().collect();
            }
            None => {
                s.ring_begin = snap.ring_begin.clone();
                s.ring_end = snap.ring_end.clone();
                s.history = snap.history.iter().copied().collect();
            }
        }
        self.seqs.insert(id, s);
        Ok(id)
    }

    /// Copies the snapshot's tables and partial groups into `s` (a fresh
    /// sequence); on error every page taken is in `s`'s tables.
    fn fill(
        &mut self,
        s: &mut Sequence,
        snap: &SeqSnapshot,
        rings: Option<&[TableCopy]>,
        id: SeqId,
    ) -> Result<()> {
        let pr = self.cfg.page_rows;
        for (t, c) in s.rings.iter_mut().zip(rings.unwrap_or(&[])) {
            copy_in(&mut self.ring_pages, c, pr, id, t)?;
        }
        for (t, c) in s.entries.iter_mut().zip(&snap.entries) {
            copy_in(&mut self.comp_pages, c, pr, id, t)?;
        }
        for (t, c) in s.keys.iter_mut().zip(&snap.keys) {
            copy_in(&mut self.key_pages, c, pr, id, t)?;
        }
        for (i, p) in snap.pending.iter().enumerate() {
            if let Some((kv, score)) = p {
                let row = self.pending_row(s.slot, i)?;
                self.put_pending(row, kv, score, 0)?;
                s.pending[i] = true;
            }
        }
        Ok(())
    }
}
