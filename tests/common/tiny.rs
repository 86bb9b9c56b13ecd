//! The tiny config (`models/tiny`, every V4.1 layer role) with fresh
//! generated official-format weights, loaded into a model and its drafter.

use super::TempDir;
use deepinfer::Device;
use deepinfer::model::checkpoint::{Checkpoint, GenerateOptions, LoadOptions, generate};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::dspark::DsparkWeights;
use deepinfer::model::forward::Model;
use deepinfer::model::load::{load_weights_on, modulo_token_map};
use std::path::Path;

/// The tiny config and a checkpoint of it with weights generated from
/// `seed`, in a temporary directory (kept alive by the returned guard).
pub fn tiny_checkpoint(seed: u64) -> (ModelConfig, TempDir, Checkpoint) {
    let cfg =
        ModelConfig::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny")).unwrap();
    let dir = TempDir::new("model");
    generate(
        &cfg,
        dir.path(),
        &GenerateOptions {
            seed,
            shard_bytes: 4 << 20,
            ..GenerateOptions::default()
        },
    )
    .unwrap();
    let ck = Checkpoint::load(dir.path(), &cfg, &LoadOptions::default()).unwrap();
    (cfg, dir, ck)
}

/// The tiny model of [`tiny_checkpoint`]`(seed)` loaded onto `device`.
pub fn tiny_model_on(seed: u64, device: &Device) -> (Model, Option<DsparkWeights>) {
    let (cfg, _dir, ck) = tiny_checkpoint(seed);
    let (weights, dspark) = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), device).unwrap();
    (Model::new(cfg, weights).unwrap(), dspark)
}

/// [`tiny_model_on`] with the Engram tables where `engram` says.
#[allow(dead_code, reason = "only some test binaries place the Engram tables")]
pub fn tiny_model_placed(
    seed: u64,
    device: &Device,
    engram: deepinfer::model::layers::engram::EngramPlacement,
) -> Model {
    use deepinfer::model::load::{WeightOptions, load_weights_with};
    let (cfg, _dir, ck) = tiny_checkpoint(seed);
    let options = WeightOptions {
        drafter: false,
        engram,
    };
    let (weights, _) =
        load_weights_with(&ck, &cfg, modulo_token_map(&cfg), device, options).unwrap();
    Model::new(cfg, weights).unwrap()
}

/// The tiny model with weights generated from `seed`, on the CPU.
pub fn tiny_model(seed: u64) -> (Model, Option<DsparkWeights>) {
    tiny_model_on(seed, &Device::Cpu)
}

/// The real-vocabulary tiny model (`models/tiny-v4vocab`) written to `dir`
/// with weights from `seed`, the real tokenizer and its Engram map, as an
/// engine.
pub fn v4vocab_engine(dir: &Path, seed: u64) -> deepinfer::engine::Engine {
    use deepinfer::engine::{Engine, EngineConfig};
    use deepinfer::model::runner::{TINY_V4VOCAB_CONFIG, v4_tokenizer_path};
    let cfg = ModelConfig::from_hf_json(TINY_V4VOCAB_CONFIG).unwrap();
    generate(
        &cfg,
        dir,
        &GenerateOptions {
            seed,
            shard_bytes: 64 << 20,
            ..GenerateOptions::default()
        },
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), TINY_V4VOCAB_CONFIG).unwrap();
    let tok = v4_tokenizer_path().expect("the V4 tokenizer (scripts/setup installs it)");
    std::fs::copy(tok, dir.join("tokenizer.json")).unwrap();
    Engine::from_dir(
        dir,
        EngineConfig {
            max_context: 256,
            max_seqs: 64,
            ..EngineConfig::default()
        },
        false,
    )
    .unwrap()
}

/// Overwrites 4 data bytes of tensor `name`, from byte `at` of its data, in
/// the shard of `dir` that holds it with 0xFF (NaN in f32, bf16, e4m3 and E8M0).
pub fn poison(dir: &std::path::Path, name: &str, at: usize) {
    use std::io::{Seek, SeekFrom, Write};
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension() != Some("safetensors".as_ref()) {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let (header, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        if let Some(info) = meta.info(name) {
            let (start, end) = info.data_offsets;
            assert!(start + at + 4 <= end, "{name}: byte {at} is outside it");
            let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.seek(SeekFrom::Start((8 + header + start + at) as u64))
                .unwrap();
            f.write_all(&[0xFF; 4]).unwrap();
            return;
        }
    }
    panic!("no shard of {} holds {name}", dir.display());
}
