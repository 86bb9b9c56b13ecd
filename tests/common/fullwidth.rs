//! A full-width V4.1 layer stack small enough for a test: every official
//! dimension (hidden 5120, 64 heads × 512, q rank 1280, o 8 × 1024, indexer
//! 32 × 128 with top-512, candidate 2048 × 8, experts of width 2304, vocab
//! 129,280, window 128, mHC 4 streams) in 7 backbone layers that cover
//! every layer role of the official schedule, plus its 3 DSpark stages:
//!
//! | layer | ratio | role | official counterpart |
//! | --- | --- | --- | --- |
//! | 0 | 0 | window only | 0 |
//! | 1 | 0 | window only, Engram | 1 |
//! | 2 | 2 | Full (KV source, indexer), Engram | 14 |
//! | 3 | 2 | Reuse of 2 | 3–7 |
//! | 4 | 1 | Full, candidate source | 20 |
//! | 5 | 1 | Reindex within 4's candidates | 24 |
//! | 6 | 1 | Reuse of 5 | 25–27 |
//!
//! V4.1 has no hash-routed layers (spec §1: "Group-limited or hash routing:
//! none"), so there is no such role to cover. The routed experts are one
//! EP-16 rank's 24 (`ModelConfig::ep_rank`, top-6 of them), and the Engram
//! hash space is 16,000 (tables of 384,000 rows instead of 384 million; the
//! lookup's work per token is the official one).

use deepinfer::model::config::{ModelConfig, V41_FLASH_CONFIG};

/// The config of the module doc, validated.
pub fn fullwidth_stack() -> ModelConfig {
    let mut cfg = ModelConfig::from_hf_json(V41_FLASH_CONFIG)
        .unwrap()
        .ep_rank(16)
        .unwrap();
    cfg.n_layers = 7;
    cfg.compress_ratios = vec![0, 0, 2, 2, 1, 1, 1, 0, 0, 0];
    cfg.kv_source_layers = vec![2, 4];
    cfg.index_source_layers = vec![2, 4, 5];
    cfg.candidate.as_mut().unwrap().source_layer = 4;
    cfg.dspark.target_layers = vec![4, 5, 6];
    let e = &mut cfg.engram;
    e.layer_ids = vec![1, 2];
    e.hash_space = 16_000;
    e.table_rows = e
        .table_primes()
        .unwrap()
        .iter()
        .map(|p| p.iter().sum())
        .collect();
    cfg.validate().unwrap();
    cfg
}
