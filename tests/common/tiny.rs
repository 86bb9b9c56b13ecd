//! The tiny config (`models/tiny`, every V4.1 layer role) with fresh
//! generated official-format weights, loaded into a model and its drafter.

use super::TempDir;
use deepinfer::model::checkpoint::{Checkpoint, GenerateOptions, LoadOptions, generate};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::dspark::DsparkWeights;
use deepinfer::model::forward::Model;
use deepinfer::model::load::{load_weights, modulo_token_map};
use std::path::Path;

/// The tiny model with weights generated from `seed`.
pub fn tiny_model(seed: u64) -> (Model, Option<DsparkWeights>) {
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
