//! What a derived layer role looks like: [`LayerPlan`] and the types it is
//! made of ([`AttentionPlan`], [`Selection`], [`CompressorPlan`],
//! [`LayerKind`]), with the queries downstream code asks of a plan.
//!
//! Invariant: the queries only read fields and check nothing. A plan from
//! [`ModelConfig::layer_plans`](super::ModelConfig::layer_plans) (`roles.rs`)
//! is consistent: every `kv_source`, `index_source` and `candidates_from` it
//! names is this or an earlier backbone layer of the role the field implies.

use super::types::LayerRope;

/// The role of one layer or DSpark stage, derived from the config (spec §2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerPlan {
    /// Index into `compress_ratios`; stages are `n_layers ..`.
    pub layer: usize,
    /// Ratio of the compressed cache the layer reads; 0 means window only.
    pub ratio: usize,
    /// `Some(s)` for DSpark stage s (`mtp.s`).
    pub dspark_stage: Option<usize>,
    /// `Some` iff the layer is a KV source: it owns a compressor and the
    /// compressed cache.
    pub compressor: Option<CompressorPlan>,
    pub attention: AttentionPlan,
    /// The layer publishes the candidate mask.
    pub candidate_source: bool,
    pub rope: LayerRope,
    /// `Some(i)`: Engram runs before the block with table i of
    /// `engram.layer_ids`.
    pub engram: Option<usize>,
    /// `Some(i)`: the layer's attention input is DSpark target feature i.
    pub dspark_target: Option<usize>,
}

/// A KV source's compressor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressorPlan {
    /// Owns `compressor.wgate` (ratio > 1; the ratio-1 compressor has none).
    pub gated: bool,
}

/// What a layer attends to besides its own window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPlan {
    /// Ratio 0: the layer's own window only.
    WindowOnly,
    /// Ratio > 0: the window plus selected entries of a compressed cache.
    Sparse {
        /// The KV source whose compressed cache (and index keys) the layer
        /// reads: the most recent KV source at or before it.
        kv_source: usize,
        selection: Selection,
    },
}

/// How a sparse layer selects compressed entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// An index source: runs its own indexer (`indexer.wq_b`,
    /// `weights_proj`) against the index keys of its KV source.
    Indexer {
        /// `Some(c)`: scores outside layer c's candidate blocks are masked
        /// (the candidate source precedes this layer).
        candidates_from: Option<usize>,
    },
    /// Reuses the top-k published by the nearest preceding index source.
    Reuse { index_source: usize },
}

/// The attention modes of spec §2, plus the two window-only kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// A DSpark stage (window only).
    DsparkStage,
    /// A backbone layer with ratio 0.
    WindowOnly,
    /// A KV source running its own indexer over its own keys.
    Full,
    /// An index source that is not a KV source.
    Reindex,
    /// Reuses another layer's top-k.
    Reuse,
}

impl LayerPlan {
    pub fn is_dspark_stage(&self) -> bool {
        self.dspark_stage.is_some()
    }

    pub fn is_window_only(&self) -> bool {
        self.attention == AttentionPlan::WindowOnly
    }

    /// Owns a compressor and the compressed cache.
    pub fn is_kv_source(&self) -> bool {
        self.compressor.is_some()
    }

    /// Runs an indexer (owns `indexer.wq_b` and `weights_proj`).
    pub fn is_index_source(&self) -> bool {
        matches!(self.selection(), Some(Selection::Indexer { .. }))
    }

    /// Owns the index keys (`indexer.wk`, `k_norm`): an index source that is
    /// also a KV source.
    pub fn owns_index_keys(&self) -> bool {
        self.is_index_source() && self.is_kv_source()
    }

    /// An index source that scores another layer's keys.
    pub fn is_reindex(&self) -> bool {
        self.is_index_source() && !self.is_kv_source()
    }

    pub fn is_reuse(&self) -> bool {
        matches!(self.selection(), Some(Selection::Reuse { .. }))
    }

    /// The KV source whose compressed cache the layer reads.
    pub fn kv_source(&self) -> Option<usize> {
        match self.attention {
            AttentionPlan::WindowOnly => None,
            AttentionPlan::Sparse { kv_source, .. } => Some(kv_source),
        }
    }

    /// For index sources: the layer whose index keys the indexer scores.
    pub fn index_keys_from(&self) -> Option<usize> {
        self.kv_source().filter(|_| self.is_index_source())
    }

    /// The layer whose top-k list this layer attends with: itself for an
    /// index source, the reused index source otherwise.
    pub fn topk_from(&self) -> Option<usize> {
        match self.selection()? {
            Selection::Indexer { .. } => Some(self.layer),
            Selection::Reuse { index_source } => Some(index_source),
        }
    }

    /// The candidate source whose mask restricts this layer's indexer.
    pub fn candidates_from(&self) -> Option<usize> {
        match self.selection()? {
            Selection::Indexer { candidates_from } => candidates_from,
            Selection::Reuse { .. } => None,
        }
    }

    pub fn kind(&self) -> LayerKind {
        if self.is_dspark_stage() {
            LayerKind::DsparkStage
        } else if self.is_window_only() {
            LayerKind::WindowOnly
        } else if self.is_reuse() {
            LayerKind::Reuse
        } else if self.is_kv_source() {
            LayerKind::Full
        } else {
            LayerKind::Reindex
        }
    }

    fn selection(&self) -> Option<Selection> {
        match self.attention {
            AttentionPlan::WindowOnly => None,
            AttentionPlan::Sparse { selection, .. } => Some(selection),
        }
    }
}
