//! The CPU model end to end on the tiny config (every layer role active):
//! generated official-format weights load into a `Model`; logits are finite
//! and not flat; decoding token t gives bit-for-bit the logits of a prefill of
//! the first t + 1 tokens, over 300+ tokens (window wrap, compressed entries,
//! a top-k smaller than the visible entries, candidate blocks, odd partial
//! groups, Engram look-back across the start); bad input is a typed error;
//! the DSpark drafter produces greedy drafts with confidences.

mod common;

use common::TempDir;
use deepinfer::Error;
use deepinfer::model::checkpoint::{Checkpoint, GenerateOptions, LoadOptions, generate};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::dspark::DsparkWeights;
use deepinfer::model::forward::Model;
use deepinfer::model::load::{load_weights, modulo_token_map};
use rand::Rng;
use std::path::Path;

fn tiny_model(seed: u64) -> (Model, Option<DsparkWeights>) {
    let cfg =
        ModelConfig::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny")).unwrap();
    let dir = TempDir::new("model");
    generate(
        &cfg,
        dir.path(),
        &GenerateOptions {
            seed,
            shard_bytes: 4 << 20,
        },
    )
    .unwrap();
    let ck = Checkpoint::load(dir.path(), &cfg, &LoadOptions::default()).unwrap();
    let (weights, dspark) = load_weights(&ck, &cfg, modulo_token_map(&cfg)).unwrap();
    (Model::new(cfg, weights).unwrap(), dspark)
}

fn prompt(rng: &mut rand::rngs::StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

#[test]
fn prefill_logits_are_finite_and_not_flat() {
    let mut rng = common::rng("model_prefill");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let tokens = prompt(&mut rng, 37, vocab);
    let out = model.forward(&tokens, &mut model.new_state()).unwrap();
    assert_eq!(out.logits.len(), 37 * vocab);
    assert!(out.logits.iter().all(|v| v.is_finite()));
    for row in out.logits.chunks(vocab) {
        let mean = row.iter().sum::<f32>() / vocab as f32;
        let std = (row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / vocab as f32).sqrt();
        assert!(std > 0.1, "flat logits: std {std}");
    }
}

#[test]
fn decoding_matches_prefill_bit_for_bit() {
    let mut rng = common::rng("model_decode_vs_prefill");
    let (model, _) = tiny_model(rng.random());
    let vocab = model.cfg.vocab_size;
    let n = 301;
    let tokens = prompt(&mut rng, n, vocab);
    let mut state = model.new_state();
    let mut decoded = model.forward(&tokens[..1], &mut state).unwrap().logits;
    for &t in &tokens[1..] {
        decoded.extend(model.forward(&[t], &mut state).unwrap().logits);
    }
    // Every path was active: the KV sources hold one entry per complete group
    // (odd n leaves a ratio-2 group pending), and their index keys.
    for plan in model.plans.iter().filter(|p| p.is_kv_source()) {
        let src = state.layers[plan.layer].source.as_ref().unwrap();
        assert_eq!(src.entries.len(), n / plan.ratio, "layer {}", plan.layer);
        assert_eq!(
            src.keys.len(),
            if plan.owns_index_keys() {
                n / plan.ratio
            } else {
                0
            }
        );
        assert_eq!(src.pending.has_pending(), plan.ratio == 2);
        assert!(
            n / plan.ratio > model.cfg.indexer.topk,
            "the top-k is smaller than the visible entries"
        );
    }
    for len in [1usize, 2, 3, 8, 9, 16, 17, 33, 130, 301] {
        let prefill = model
            .forward(&tokens[..len], &mut model.new_state())
            .unwrap()
            .logits;
        let last = &prefill[(len - 1) * vocab..];
        let step = &decoded[(len - 1) * vocab..len * vocab];
        assert!(
            last.iter()
                .zip(step)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {}: decode differs from a prefill of {len}",
            len - 1
        );
    }
}

#[test]
fn bad_tokens_are_typed_errors() {
    let (model, _) = tiny_model(1);
    let vocab = model.cfg.vocab_size as u32;
    let e = model.forward(&[], &mut model.new_state()).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "tokens", .. }), "{e}");
    let e = model
        .forward(&[1, vocab], &mut model.new_state())
        .unwrap_err();
    assert!(e.to_string().contains(&vocab.to_string()), "{e}");
    let mut state = model.new_state();
    model.forward(&[1, 2], &mut state).unwrap();
    let e = model.forward(&[3, 4], &mut state).unwrap_err();
    assert!(e.to_string().contains("one at a time"), "{e}");
}

#[test]
fn the_drafter_produces_greedy_drafts_with_confidences() {
    let mut rng = common::rng("model_dspark");
    let (model, dspark) = tiny_model(rng.random());
    let dw = dspark.expect("the tiny config has DSpark stages");
    let cfg = &model.cfg;
    let tokens = prompt(&mut rng, 12, cfg.vocab_size);
    let mut state = model.new_state();
    let out = model.forward(&tokens, &mut state).unwrap();
    let width = cfg.dspark.target_layers.len() * cfg.hidden_size;
    assert_eq!(out.features.len(), 12 * width);
    let mut ds = model.new_dspark_state();
    model.dspark_seed(&dw, &out.features[..11 * width], 0, &mut ds);
    let next = deepinfer::model::dspark::argmax(&out.logits[11 * cfg.vocab_size..]);
    let draft = model.dspark_draft(&dw, &out.features[11 * width..], 11, next, &mut ds.clone());
    assert_eq!(draft.tokens.len(), cfg.dspark.block_size);
    assert!(draft.tokens.iter().all(|&t| (t as usize) < cfg.vocab_size));
    assert!(draft.confidence_logits.iter().all(|c| c.is_finite()));
    let again = model.dspark_draft(&dw, &out.features[11 * width..], 11, next, &mut ds);
    assert_eq!(draft, again, "drafting is deterministic");
}

#[test]
fn a_config_that_contradicts_the_checkpoint_is_rejected_by_name() {
    let cfg =
        ModelConfig::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny")).unwrap();
    let dir = TempDir::new("model-mismatch");
    generate(
        &cfg,
        dir.path(),
        &GenerateOptions {
            seed: 3,
            shard_bytes: 4 << 20,
        },
    )
    .unwrap();
    let mut other = cfg.clone();
    other.moe.n_routed_experts += 2;
    other.moe.inter_dim += 32;
    let e = Checkpoint::load(dir.path(), &other, &LoadOptions::default())
        .map(|_| ())
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "layers.0.ffn.experts.{}.w1.weight",
            cfg.moe.n_routed_experts
        )),
        "missing expert named: {msg}"
    );
    assert!(
        msg.contains("layers.0.ffn.experts.0.w1.weight"),
        "wrong expert shape named: {msg}"
    );
}
