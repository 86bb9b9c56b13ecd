//! The full-width layer stack of the CUDA test (`common::fullwidth`): it
//! keeps the official dimensions and has every layer role of the official
//! schedule (window-only, Engram, Full ratio 2 and ratio 1, the candidate
//! source, Reindex, Reuse of both ratios) and the 3 DSpark stages.

mod common;

use deepinfer::model::config::{LayerKind, ModelConfig, V41_FLASH_CONFIG};

#[test]
fn the_fullwidth_stack_keeps_the_dimensions_and_covers_every_role() {
    let cfg = common::fullwidth::fullwidth_stack();
    let official = ModelConfig::from_hf_json(V41_FLASH_CONFIG).unwrap();
    assert_eq!(cfg.hidden_size, official.hidden_size);
    assert_eq!(cfg.attention, official.attention);
    assert_eq!(cfg.indexer, official.indexer);
    assert_eq!(cfg.candidate.unwrap().topk_blocks, 2048);
    assert_eq!(cfg.vocab_size, 129_280);
    assert_eq!(cfg.moe.inter_dim, 2304);
    assert_eq!(cfg.moe.n_routed_experts, 24);
    let plans = cfg.layer_plans().unwrap();
    let kinds: Vec<(LayerKind, usize, bool, bool)> = plans
        .iter()
        .map(|p| (p.kind(), p.ratio, p.engram.is_some(), p.candidate_source))
        .collect();
    use LayerKind::*;
    assert_eq!(
        kinds,
        [
            (WindowOnly, 0, false, false),
            (WindowOnly, 0, true, false),
            (Full, 2, true, false),
            (Reuse, 2, false, false),
            (Full, 1, false, true),
            (Reindex, 1, false, false),
            (Reuse, 1, false, false),
            (DsparkStage, 0, false, false),
            (DsparkStage, 0, false, false),
            (DsparkStage, 0, false, false),
        ]
    );
    assert_eq!(plans[5].candidates_from(), Some(4));
    assert_eq!(plans[6].topk_from(), Some(5));
}
