//! Bounded replay and decoder truncation in a step (`v41-flash.md` §4–§5):
//! how each entry of a step is shaped ([`EntryShape`]: leading tokens that
//! are replayed rather than new, and how many of its last tokens the late
//! layers see), where the late layers start (after the last KV source,
//! derived from the layer plans), and the narrowing of a step's batch,
//! residual rows and published selections to the entries' tails at the
//! first late layer.
//!
//! Invariant: the narrowed batch holds each kept entry's last `late_rows`
//! rows in order, ending at the same position as the entry; an entry with
//! no late rows is dropped; every per-entry tensor in [`Published`] stays
//! aligned with the kept entries, and every `[T, ..]` tensor narrowed by
//! [`Tails::rows`] with the narrowed rows.

use super::batch::{Batch, Entry};
use super::config::LayerPlan;
use super::inputs::StepInputs;
use super::layers::attention::Published;
use crate::model::error::Result;
use crate::tensor::Tensor;
use std::ops::Range;

/// How a step treats one entry's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryShape {
    /// Leading tokens that are replayed: positions `pos − replay .. pos`
    /// (pos = the sequence's position), already in its global state
    /// (restored from a snapshot). They rebuild the window rows and feed
    /// attention but add no compressed entry, partial group or position.
    /// Fewer than the entry's tokens: a step brings at least one new token.
    pub replay: usize,
    /// The layers after the last KV source run only on the entry's last
    /// `late_rows` tokens (at least the entry's length: all of them). The
    /// step returns logits for those tokens only.
    pub late_rows: usize,
}

impl EntryShape {
    /// Every token new and through every layer (a plain step).
    pub fn full(len: usize) -> EntryShape {
        EntryShape {
            replay: 0,
            late_rows: len,
        }
    }
}

/// The first layer after the last KV source of the backbone (0 when there
/// is none): every layer from here on owns only window KV, so its outputs
/// feed no other sequence state than its own ring and the logits.
pub fn late_layer_start(plans: &[LayerPlan], n_layers: usize) -> usize {
    plans
        .iter()
        .take(n_layers)
        .filter(|p| p.is_kv_source())
        .map(|p| p.layer + 1)
        .max()
        .unwrap_or(0)
}

/// The entries' tails: the narrowed batch and, per kept entry, its index
/// in the full batch and its first kept row (relative to the entry).
pub(crate) struct Tails {
    pub batch: Batch,
    kept: Vec<(usize, usize)>,
    /// Row ranges of the full batch that are kept, in order.
    ranges: Vec<Range<usize>>,
}

impl Tails {
    pub fn of(b: &Batch, shapes: &[EntryShape], inputs: &StepInputs) -> Result<Tails> {
        let mut entries = Vec::new();
        let (mut kept, mut ranges, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        let mut row = 0;
        for (i, (e, s)) in b.entries.iter().zip(shapes).enumerate() {
            let n = s.late_rows.min(e.len);
            if n == 0 {
                continue;
            }
            let off = e.len - n;
            entries.push(Entry {
                seq: e.seq,
                start: e.start + off,
                len: n,
                replay: e.replay.saturating_sub(off),
                row,
            });
            positions.extend((e.start + off..e.start + e.len).map(|p| p as i64));
            kept.push((i, off));
            ranges.push(e.row + off..e.row + e.len);
            row += n;
        }
        Ok(Tails {
            batch: Batch::new(entries, positions, inputs, &b.positions.device())?,
            kept,
            ranges,
        })
    }

    /// The kept rows of a `[T, ..]` tensor of the full batch.
    pub fn rows(&self, t: &Tensor) -> Result<Tensor> {
        if self.ranges.is_empty() {
            let mut shape = t.shape().to_vec();
            if let Some(r) = shape.first_mut() {
                *r = 0;
            }
            return Ok(Tensor::empty(&t.device(), t.dtype(), &shape)?);
        }
        let parts: Vec<Tensor> = self
            .ranges
            .iter()
            .map(|r| t.narrow_rows(r.start, r.len()))
            .collect::<std::result::Result<_, _>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(Tensor::cat_rows(&refs)?)
    }

    /// The published selections narrowed to the kept entries' tails.
    pub fn narrow_published(&self, p: &mut Published) -> Result<()> {
        for l in p
            .topk
            .values_mut()
            .chain(p.candidates.values_mut())
            .flatten()
        {
            *l = self.rows(l)?;
        }
        // Physical rows were made for the full batch's entries.
        p.rows.clear();
        Ok(())
    }

    /// Where each entry of the full batch has its rows in the narrowed one
    /// (an empty range for a dropped entry).
    pub fn entry_rows(&self, n_entries: usize) -> Vec<Range<usize>> {
        let mut out = Vec::with_capacity(n_entries);
        let mut k = 0;
        let mut at = 0;
        for i in 0..n_entries {
            match (self.kept.get(k), self.batch.entries.get(k)) {
                (Some(&(j, _)), Some(e)) if j == i => {
                    out.push(e.row..e.row + e.len);
                    at = e.row + e.len;
                    k += 1;
                }
                _ => out.push(at..at),
            }
        }
        out
    }
}
