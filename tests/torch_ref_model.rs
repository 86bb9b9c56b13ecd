//! The CPU model against the independent torch reference model
//! (`tests/torch/reference_model.py`, written from the spec alone) on the
//! tiny config, behind the `torch-ref` feature: routing decisions and every
//! compressed index list must be identical, and the logits must agree to
//! calc_diff < 1e-9. Both sides fix every summation order the spec leaves
//! free (fp32, index order), round transcendentals correctly (f64 libm, one
//! rounding) and break top-k ties towards the lower index, so they agree bit
//! for bit in practice; the threshold only leaves room for a last-ulp libm
//! difference that does not flip a BF16 rounding.
#![cfg(feature = "torch-ref")]

mod common;

use common::TempDir;
use deepinfer::model::checkpoint::{Checkpoint, GenerateOptions, LoadOptions, generate_from_dir};
use deepinfer::model::config::ModelConfig;
use deepinfer::model::forward::{Capture, Model, SeqInput};
use deepinfer::model::load::{load_weights, modulo_token_map};
use deepinfer::model::runner::single_sequence_pool;
use deepinfer::numerics::calc_diff;
use rand::Rng;
use std::path::Path;
use std::process::Command;

fn parse_lists(v: &serde_json::Value) -> Vec<Vec<i64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn cpu_model_matches_the_torch_reference() {
    let mut rng = common::rng("torch_ref_model");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = TempDir::new("torch-ref-model");
    let seed: u64 = rng.random();
    generate_from_dir(
        &root.join("models/tiny"),
        dir.path(),
        &GenerateOptions {
            seed,
            shard_bytes: 4 << 20,
            ..GenerateOptions::default()
        },
    )
    .unwrap();
    let cfg = ModelConfig::from_dir(dir.path()).unwrap();
    let ck = Checkpoint::load(dir.path(), &cfg, &LoadOptions::default()).unwrap();
    let (weights, _) = load_weights(&ck, &cfg, modulo_token_map(&cfg)).unwrap();
    let model = Model::new(cfg, weights).unwrap();
    let vocab = model.cfg.vocab_size;
    let tokens: Vec<u32> = (0..96).map(|_| rng.random_range(0..vocab as u32)).collect();
    let mut pool = single_sequence_pool(&model, tokens.len()).unwrap();
    let seq = pool.add_sequence().unwrap();
    let capture = Capture {
        routing: true,
        index_lists: true,
        ..Capture::default()
    };
    let ours = model
        .step(
            &mut pool,
            &[SeqInput {
                seq,
                tokens: &tokens,
            }],
            capture,
        )
        .unwrap();
    let rows = |t: &deepinfer::Tensor| -> Vec<Vec<i64>> {
        let w = t.shape()[1];
        let v = t.to_vec::<i32>().unwrap();
        (0..t.shape()[0])
            .map(|r| v[r * w..(r + 1) * w].iter().map(|&x| x as i64).collect())
            .collect()
    };

    let (logits_file, routing_file, index_file) = (
        dir.path().join("ref.f32"),
        dir.path().join("routing.json"),
        dir.path().join("index.json"),
    );
    let ids: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    let out = Command::new(common::python())
        .arg(root.join("tests/torch/reference_model.py"))
        .args(["--model-dir".as_ref(), dir.path().as_os_str()])
        .args(["--tokens", &ids.join(",")])
        .args(["--out".as_ref(), logits_file.as_os_str()])
        .args(["--dump-routing".as_ref(), routing_file.as_os_str()])
        .args(["--dump-index".as_ref(), index_file.as_os_str()])
        .output()
        .expect("running the torch reference (scripts/setup installs its virtualenv)");
    assert!(
        out.status.success(),
        "reference failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let routing: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&routing_file).unwrap()).unwrap();
    for (l, layer) in ours.layers.iter().enumerate() {
        let theirs = parse_lists(&routing["experts"][l]);
        let ours = rows(layer.routing.as_ref().unwrap());
        assert_eq!(ours, theirs, "layer {l}: routing decisions differ");
    }
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_file).unwrap()).unwrap();
    // The reference's prefill lists point into [window rows ‖ entries], so
    // its entries carry the window offset S; ours are entry indices.
    let s_len = tokens.len() as i64;
    for (l, layer) in ours.layers.iter().enumerate() {
        if let Some(theirs) = index["layers"].get(l.to_string()) {
            let lists = layer.index_lists.as_ref().unwrap();
            let theirs: Vec<Vec<i64>> = parse_lists(theirs)
                .into_iter()
                .map(|r| {
                    r.into_iter()
                        .map(|x| if x >= 0 { x - s_len } else { x })
                        .collect()
                })
                .collect();
            assert_eq!(
                rows(&lists[0]),
                theirs,
                "layer {l}: compressed index lists differ"
            );
        }
    }
    let theirs: Vec<f64> = std::fs::read(&logits_file)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect();
    let ours_f64: Vec<f64> = ours
        .logits
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_eq!(ours_f64.len(), theirs.len());
    let differing = ours_f64.iter().zip(&theirs).filter(|(a, b)| a != b).count();
    let diff = calc_diff(&ours_f64, &theirs);
    eprintln!(
        "logits: calc_diff {diff:e}, {differing} of {} values differ",
        theirs.len()
    );
    assert!(diff < 1e-9, "calc_diff {diff:e}");
}
