//! The layout of one batched step: each entry is one sequence's new tokens
//! (a whole prompt, a prefill chunk or one decode token), laid out one
//! after another as the rows of the step's `[T, ..]` tensors (varlen, like a
//! scheduler's output).
//!
//! Invariant: entries name distinct sequences; entry i owns rows
//! `row .. row + len` and positions `start .. start + len`, of which the
//! first `replay` are replayed (already in the sequence's global state:
//! they rebuild window rows only, `v41-flash.md` §5) and the rest are new.

use super::pool::SeqId;
use crate::tensor::Tensor;

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

/// A step's entries and the positions of all its rows (I64 `[T]` on the
/// model's device).
pub struct Batch {
    pub entries: Vec<Entry>,
    pub positions: Tensor,
}
