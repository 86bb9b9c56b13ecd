//! Per-sequence state carried between forward calls: each layer's window
//! ring, each KV source's compressed cache, index-key cache and partial
//! compressor group, the Engram n-gram history and the position.
//!
//! Invariant: caches hold encoded rows (the byte formats of
//! `cpu_backend::kv_format`), exactly what a GPU cache would hold; entry j of
//! a KV source's caches covers positions j·ratio … (j+1)·ratio − 1.

use crate::cpu_backend::compressor::Ratio2State;
use crate::cpu_backend::kv_format::{
    decode_compressed_row, decode_index_key_row, decode_window_row,
};
use half::bf16;

/// A layer's sliding-window ring of encoded window-KV rows.
#[derive(Clone, Debug)]
pub struct Ring {
    slots: Vec<Vec<u8>>,
    dim: usize,
}

impl Ring {
    pub fn new(window: usize, dim: usize) -> Ring {
        Ring {
            slots: vec![Vec::new(); window],
            dim,
        }
    }

    /// Writes the row of position `p` into slot p mod window.
    pub fn write(&mut self, p: usize, row: Vec<u8>) {
        let w = self.slots.len();
        self.slots[p % w] = row;
    }

    /// All slots decoded, `[window, dim]`; empty slots are zero rows (index
    /// lists never point at them).
    pub fn rows(&self) -> Vec<bf16> {
        self.slots
            .iter()
            .flat_map(|s| {
                if s.is_empty() {
                    vec![bf16::ZERO; self.dim]
                } else {
                    decode_window_row(s, self.dim)
                }
            })
            .collect()
    }
}

/// A KV source's caches.
#[derive(Clone, Debug, Default)]
pub struct SourceCaches {
    /// Encoded compressed-KV entries (FP4, E4M3 scales per 16).
    pub entries: Vec<Vec<u8>>,
    /// Encoded index keys (FP4, E8M0 scales per 32), when the source owns keys.
    pub keys: Vec<Vec<u8>>,
    /// The ratio-2 compressor's waiting token.
    pub pending: Ratio2State,
}

impl SourceCaches {
    /// All entries decoded to their fake-quantised BF16 values, `[n, dim]`.
    pub fn entry_rows(&self, dim: usize) -> Vec<bf16> {
        self.entries
            .iter()
            .flat_map(|e| decode_compressed_row(e, dim))
            .collect()
    }

    /// All index keys decoded, `[n, dim]`.
    pub fn key_rows(&self, dim: usize) -> Vec<bf16> {
        self.keys
            .iter()
            .flat_map(|k| decode_index_key_row(k, dim))
            .collect()
    }
}

/// One layer's state.
#[derive(Clone, Debug)]
pub struct LayerState {
    pub ring: Ring,
    /// `Some` for KV sources.
    pub source: Option<SourceCaches>,
}

/// The state of one sequence.
#[derive(Clone, Debug)]
pub struct SequenceState {
    /// Tokens processed so far (the next token's position).
    pub pos: usize,
    /// Backbone layers, in order.
    pub layers: Vec<LayerState>,
    /// Engram compressed id of every position so far.
    pub engram_history: Vec<Option<i64>>,
}
