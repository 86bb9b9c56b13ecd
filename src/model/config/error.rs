//! [`ConfigError`]: every way a config is rejected, with its message.
//!
//! Invariant: every message names the key, layer or value at fault; the
//! messages are part of the API (tests match on them).

use std::path::PathBuf;

use super::keys::{self, ConfigForm, Key};

/// Why a config was rejected. Every message names the key, layer or value
/// at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
    #[error("neither config.json nor inference-config.json in {}", .0.display())]
    NoConfigFile(PathBuf),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{form}: missing key `{key}`")]
    MissingKey { form: ConfigForm, key: &'static str },
    #[error("{form}: `{key}` = {value} is not {expected}")]
    WrongType {
        form: ConfigForm,
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{key} = {value} is not supported: {why}")]
    Unsupported {
        key: Key,
        value: String,
        why: &'static str,
    },
    #[error("{key} = {value} is invalid: {why}")]
    BadValue {
        key: Key,
        value: String,
        why: String,
    },
    /// A size beyond the documented maximum of [`super::validate::LIMITS`].
    #[error(
        "{key} = {value} exceeds the limit {limit} (V4.1-Flash uses {v41}); \
         such a config would size memory or loops without bound"
    )]
    TooLarge {
        key: Key,
        value: u64,
        limit: u64,
        v41: u64,
    },
    #[error("{key} is 0; it must be positive")]
    Zero { key: Key },
    #[error("{key} = {value} is not a multiple of {of}")]
    NotMultiple { key: Key, value: usize, of: String },
    #[error("{key} = {value} exceeds {limit_key} = {limit}")]
    Exceeds {
        key: Key,
        value: usize,
        limit_key: Key,
        limit: usize,
    },
    #[error("{key} = {id} is not a token id of the {vocab}-token vocabulary")]
    TokenOutOfRange { key: Key, id: u32, vocab: usize },
    #[error(
        "{} has {len} entries, expected {} ({n_layers} layers + {n_stages} DSpark stages)",
        keys::COMPRESS_RATIOS,
        .n_layers + .n_stages
    )]
    RatiosLength {
        len: usize,
        n_layers: usize,
        n_stages: usize,
    },
    #[error(
        "{}[{layer}] = {ratio} is not supported: V4.1 layers read ratio 0, 1 or 2 \
         (ratios 4 and 128 are V4's CSA and HCA)",
        keys::COMPRESS_RATIOS
    )]
    UnsupportedRatio { layer: usize, ratio: usize },
    #[error(
        "{}[{layer}] = {ratio}, but layer {layer} is DSpark stage {stage}, \
         which attends to its window only (ratio 0)",
        keys::COMPRESS_RATIOS
    )]
    StageRatio {
        layer: usize,
        stage: usize,
        ratio: usize,
    },
    #[error("{key} lists layer {id} twice")]
    Duplicate { key: Key, id: usize },
    #[error("{key} names layer {id}, but the backbone has layers 0..{n_layers}")]
    LayerOutOfRange {
        key: Key,
        id: usize,
        n_layers: usize,
    },
    #[error(
        "KV source layer {layer} (in {}) has {}[{layer}] = 0: a KV source must compress",
        keys::KV_SOURCES,
        keys::COMPRESS_RATIOS
    )]
    KvSourceRatioZero { layer: usize },
    #[error(
        "index source layer {layer} (in {}) has {}[{layer}] = 0, so it reads no KV source",
        keys::INDEX_SOURCES,
        keys::COMPRESS_RATIOS
    )]
    IndexSourceRatioZero { layer: usize },
    #[error(
        "{role} layer {layer} (ratio {ratio}) reads no KV source: no layer of {} at or before it",
        keys::KV_SOURCES
    )]
    NoKvSource {
        layer: usize,
        ratio: usize,
        role: &'static str,
    },
    #[error(
        "layer {layer} has {}[{layer}] = {ratio} but reads the ratio-{kv_ratio} cache \
         of KV source layer {kv_source}",
        keys::COMPRESS_RATIOS
    )]
    RatioMismatch {
        layer: usize,
        ratio: usize,
        kv_source: usize,
        kv_ratio: usize,
    },
    #[error(
        "reuse layer {layer} (ratio {ratio}, not in {}) has no preceding index source \
         whose top-k it could reuse",
        keys::INDEX_SOURCES
    )]
    NoIndexSource { layer: usize, ratio: usize },
    #[error(
        "reuse layer {layer} reads KV source layer {kv_source}, but the nearest preceding \
         index source, layer {index_source}, selects entries of KV source layer \
         {index_kv_source} (is layer {kv_source} missing from {}?)",
        keys::INDEX_SOURCES
    )]
    ReuseAcrossKvSources {
        layer: usize,
        kv_source: usize,
        index_source: usize,
        index_kv_source: usize,
    },
    #[error(
        "candidate source layer {layer} ({}) is not an index source (not in {})",
        keys::CANDIDATE_SOURCE,
        keys::INDEX_SOURCES
    )]
    CandidateNotIndexSource { layer: usize },
    #[error(
        "candidate source layer {layer} ({}) is not a KV source (not in {}): \
         its blocks index its own compressed cache",
        keys::CANDIDATE_SOURCE,
        keys::KV_SOURCES
    )]
    CandidateNotKvSource { layer: usize },
    #[error(
        "index source layer {layer} is restricted to the candidate blocks of layer \
         {candidate_source} ({}) but reads KV source layer {kv_source}",
        keys::CANDIDATE_SOURCE
    )]
    CandidateKvMismatch {
        layer: usize,
        kv_source: usize,
        candidate_source: usize,
    },
    #[error(
        "an expert-parallel degree of {ep} is invalid for {experts} routed experts ({}): {why}",
        keys::N_ROUTED_EXPERTS
    )]
    EpDegree {
        ep: usize,
        experts: usize,
        why: &'static str,
    },
    #[error(
        "an expert-parallel degree of {ep} leaves {local} routed experts per rank, fewer \
         than the {k} each token selects ({})",
        keys::N_ACTIVATED_EXPERTS
    )]
    EpTopK { ep: usize, local: usize, k: usize },
    #[error(
        "{} has {tables} entries for {layers} Engram layers ({})",
        keys::ENGRAM_TABLE_ROWS,
        keys::ENGRAM_LAYERS
    )]
    EngramTableCount { tables: usize, layers: usize },
    #[error(
        "{} gives Engram layer {layer} {rows} rows, but its hash primes sum to {expected}",
        keys::ENGRAM_TABLE_ROWS
    )]
    EngramTableRows {
        layer: usize,
        rows: u64,
        expected: u128,
    },
}
