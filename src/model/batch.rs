//! The layout of one batched step: each entry is one sequence's new tokens
//! (a whole prompt, a prefill chunk or one decode token), laid out one
//! after another as the rows of the step's `[T, ..]` tensors (varlen, like a
//! scheduler's output).
//!
//! Invariant: entries name distinct sequences; entry i owns rows
//! `row .. row + len` and positions `start .. start + len`, of which the
//! first `replay` are replayed (already in the sequence's global state:
//! they rebuild window rows only, `v41-flash.md` §5) and the rest are new.

use super::inputs::{Input, StepInputs};
use super::pool::SeqId;
use crate::device::Device;
use crate::error::Result;

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub seq: SeqId,
    /// Position of its first new token.
    pub start: usize,
    pub len: usize,
    /// Leading rows that are replayed, not new (< `len`).
    pub replay: usize,
    /// Its first row in the step's tensors.
    pub row: usize,
}

/// A step's entries, the positions of all its rows (I64 `[T]`) and the
/// entry of each row (I32 `[T]`, the `owner` of `ops::paged_rows`), both on
/// the model's device, uploaded through the step's arena
/// (`model::inputs`: a step of the same row count reuses their storage).
pub struct Batch {
    pub entries: Vec<Entry>,
    pub positions: Input,
    pub owners: Input,
}

impl Batch {
    /// `entries` laid out as their rows say, with every row's position,
    /// uploaded through `inputs`.
    pub fn new(
        entries: Vec<Entry>,
        positions: Vec<i64>,
        inputs: &StepInputs,
        device: &Device,
    ) -> Result<Batch> {
        let n = positions.len();
        let owners = owners(&entries, n)?;
        Ok(Batch {
            entries,
            positions: inputs.upload(positions, &[n], device)?,
            owners: inputs.upload(owners, &[n], device)?,
        })
    }
}

/// The entry of each of the `n` rows (−1 for a row outside every entry:
/// none, by the layout; such a row owns no table).
fn owners(entries: &[Entry], n: usize) -> Result<Vec<i32>> {
    let mut owners = vec![-1i32; n];
    for (i, e) in entries.iter().enumerate() {
        let i = i32::try_from(i).map_err(|_| crate::Error::Argument {
            op: "Batch::new",
            arg: "entries",
            value: entries.len().to_string(),
            why: "more than 2^31 entries",
        })?;
        if let Some(rows) = owners.get_mut(e.row..e.row + e.len) {
            rows.fill(i);
        }
    }
    Ok(owners)
}
