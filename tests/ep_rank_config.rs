//! The one-EP-rank bench config (`ModelConfig::ep_rank`): for EP 8, 16 and
//! 64 it keeps every official dimension and the 43-entry layer schedule
//! with the same layer roles, holds 384 / EP routed experts per backbone
//! layer (the manifest's gates and expert tensors follow), divides the
//! Engram hash space by EP with tables that still match their primes, and
//! refuses a degree that does not divide the experts or leaves fewer than
//! top-k of them, with errors naming the value. A tiny model of an EP rank
//! routes among its local experts only.

use deepinfer::model::checkpoint::{Checkpoint, GenerateOptions, LoadOptions, Manifest, generate};
use deepinfer::model::config::{ConfigError, ModelConfig, V41_FLASH_CONFIG};
use deepinfer::model::forward::{Capture, Model, SeqInput};
use deepinfer::model::load::{load_weights, modulo_token_map};
use deepinfer::model::runner::single_sequence_pool;

mod common;

fn official() -> ModelConfig {
    ModelConfig::from_hf_json(V41_FLASH_CONFIG).unwrap()
}

#[test]
fn the_embedded_config_is_the_official_one() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/deepseek-v4.1-flash");
    assert_eq!(official(), ModelConfig::from_dir(&dir).unwrap());
}

#[test]
fn an_ep_rank_keeps_every_dimension_and_the_schedule_with_384_over_ep_experts() {
    let full = official();
    for (ep, local) in [(8, 48), (16, 24), (64, 6)] {
        let rank = full.ep_rank(ep).unwrap();
        rank.validate().unwrap();
        assert_eq!(rank.moe.n_routed_experts, local, "EP {ep}");
        assert_eq!(
            rank.moe.n_activated_experts, 6,
            "EP {ep}: the official top-k"
        );
        assert_eq!(rank.n_total_layers(), 43);
        assert_eq!(rank.layer_plans().unwrap(), full.layer_plans().unwrap());
        // Nothing else changes but the Engram hash space and table sizes.
        let mut same = rank.clone();
        same.moe.n_routed_experts = full.moe.n_routed_experts;
        same.engram.hash_space = full.engram.hash_space;
        same.engram.table_rows = full.engram.table_rows.clone();
        assert_eq!(
            same, full,
            "EP {ep}: only the experts and Engram tables differ"
        );
        assert_eq!(rank.engram.hash_space, 16_000_000 / ep as u64);
        for (rows, official_rows) in rank.engram.table_rows.iter().zip(&full.engram.table_rows) {
            let ratio = *official_rows as f64 / *rows as f64;
            assert!(
                (ratio / ep as f64 - 1.0).abs() < 0.01,
                "EP {ep}: table of {rows} rows against {official_rows}"
            );
        }
        // The checkpoint of one rank: the local experts in every backbone
        // layer, the drafter's own 128 in each stage.
        let m = Manifest::new(&rank).unwrap();
        assert_eq!(
            m.get("layers.0.ffn.gate.weight").unwrap().shape,
            [local, 5120]
        );
        assert_eq!(m.get("layers.39.ffn.gate.bias").unwrap().shape, [local]);
        let last = format!("layers.39.ffn.experts.{}.w2.weight", local - 1);
        assert_eq!(m.get(&last).unwrap().shape, [5120, 1152]);
        let beyond = format!("layers.0.ffn.experts.{local}.w1.weight");
        assert!(m.get(&beyond).is_none(), "EP {ep}: {beyond}");
        assert!(m.get("mtp.2.ffn.experts.127.w3.weight").is_some());
        let experts = m
            .params()
            .iter()
            .filter(|p| p.name.contains(".ffn.experts."))
            .count();
        assert_eq!(experts, 3 * (40 * local + 3 * 128), "EP {ep}");
    }
}

#[test]
fn ep_1_is_the_official_model() {
    assert_eq!(official().ep_rank(1).unwrap(), official());
}

#[test]
fn a_degree_that_does_not_split_the_experts_or_the_top_k_is_refused() {
    let full = official();
    for ep in [0, 5, 7, 100, 1000] {
        let e = full.ep_rank(ep).unwrap_err();
        assert!(matches!(e, ConfigError::EpDegree { .. }), "EP {ep}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("degree of {ep} ")) && text.contains("384"),
            "{text}"
        );
    }
    // 384 / 128 = 3 and 384 / 384 = 1 experts per rank, below top-6.
    for (ep, local) in [(128, 3), (384, 1)] {
        let e = full.ep_rank(ep).unwrap_err();
        assert!(matches!(e, ConfigError::EpTopK { .. }), "EP {ep}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("degree of {ep} leaves {local} "))
                && text.contains("the 6 each token"),
            "{text}"
        );
    }
}

/// The tiny config (8 experts, top-2) at EP 2: every token's experts are
/// among the rank's 4, in every layer, and the logits are finite.
#[test]
fn a_tiny_ep_rank_routes_among_its_local_experts() {
    let tiny = ModelConfig::from_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny"),
    )
    .unwrap();
    let cfg = tiny.ep_rank(2).unwrap();
    assert_eq!(cfg.moe.n_routed_experts, 4);
    let dir = common::TempDir::new("ep_rank");
    generate(&cfg, dir.path(), &GenerateOptions::default()).unwrap();
    let ck = Checkpoint::load(dir.path(), &cfg, &LoadOptions::default()).unwrap();
    let (weights, _) = load_weights(&ck, &cfg, modulo_token_map(&cfg)).unwrap();
    let model = Model::new(cfg, weights).unwrap();
    let mut pool = single_sequence_pool(&model, 32).unwrap();
    let seq = pool.add_sequence().unwrap();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 512).collect();
    let capture = Capture {
        routing: true,
        ..Capture::default()
    };
    let out = model
        .step(
            &mut pool,
            &[SeqInput {
                seq,
                tokens: &tokens,
            }],
            capture,
        )
        .unwrap();
    assert!(
        out.logits
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite())
    );
    let mut seen = [false; 4];
    for (l, layer) in out.layers.iter().enumerate() {
        let routing = layer.routing.as_ref().unwrap();
        assert_eq!(routing.shape(), [24, 2], "layer {l}");
        for id in routing.to_vec::<i32>().unwrap() {
            assert!((0..4).contains(&id), "layer {l}: expert {id}");
            seen[id as usize] = true;
        }
    }
    assert!(
        seen.iter().all(|&s| s),
        "some local expert never chosen: {seen:?}"
    );
}
