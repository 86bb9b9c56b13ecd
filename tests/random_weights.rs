//! Random weights without a file (`RandomWeights`, `load::random_weights_on`):
//! for the tiny config every manifest tensor it generates is bitwise the
//! generator's shard bytes for the same seed, whatever the thread count and
//! chunk size (chunks of one row, of one 32-row FP8 block row, and whole
//! tensors), a model built from it equals the model loaded from the shards
//! in every weight (backbone and drafter) and in its logits, another seed
//! gives other weights, and a name outside the manifest is an error naming
//! it. At full width, a chunked expert and FP8 projection of the official
//! config equal the generator's single-threaded bytes.

mod common;

use common::weights::{drafter_tensors, tensors};
use deepinfer::Device;
use deepinfer::model::checkpoint::{RandomWeights, TensorSource, param_bytes};
use deepinfer::model::config::{ModelConfig, V41_FLASH_CONFIG};
use deepinfer::model::forward::Model;
use deepinfer::model::load::{load_weights_on, modulo_token_map, random_weights_on};

const SEED: u64 = 0x5eed;

fn bytes_of<S: TensorSource>(source: &S, name: &str) -> Vec<u8> {
    source.read(name, |v| Ok(v.bytes().to_vec())).unwrap()
}

#[test]
fn every_generated_tensor_is_the_generators_file_bytes() {
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(SEED);
    for (threads, chunk) in [(1, usize::MAX), (3, 1), (4, 1000), (16, 1 << 22)] {
        let random = RandomWeights::new(&cfg, SEED)
            .unwrap()
            .with_threads(threads)
            .with_chunk_values(chunk);
        assert_eq!(random.manifest().len(), ck.manifest().len());
        // Scales before their weights, then weights before their scales:
        // the spare copy of either must be the one the generator wrote.
        let mut names: Vec<&str> = ck
            .manifest()
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        if threads == 3 {
            names.reverse();
        }
        for name in names {
            let want = ck.get(name).unwrap();
            let got = random
                .read(name, |v| {
                    assert_eq!(
                        (v.dtype(), v.shape()),
                        (want.dtype(), want.shape()),
                        "{name}"
                    );
                    Ok(v.bytes().to_vec())
                })
                .unwrap();
            assert!(
                got == want.bytes(),
                "{name}: threads {threads}, chunk {chunk}"
            );
        }
    }
}

#[test]
fn a_model_built_in_memory_equals_the_model_loaded_from_the_shards() {
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(SEED);
    let (file, file_ds) = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &Device::Cpu).unwrap();
    let (mem, mem_ds) = random_weights_on(&cfg, SEED, &Device::Cpu, true).unwrap();
    let (want, got) = (tensors(&file), tensors(&mem));
    assert_eq!(want.len(), got.len());
    let (fd, md) = (file_ds.unwrap(), mem_ds.unwrap());
    let (want_ds, got_ds) = (drafter_tensors(&fd), drafter_tensors(&md));
    assert_eq!(want_ds.len(), got_ds.len());
    for ((name, w), (_, g)) in want.iter().zip(&got).chain(want_ds.iter().zip(&got_ds)) {
        assert_eq!((w.dtype(), w.shape()), (g.dtype(), g.shape()), "{name}");
        assert!(
            w.to_le_bytes().unwrap() == g.to_le_bytes().unwrap(),
            "{name} differs"
        );
    }
    assert_eq!(file.engram_token_map, mem.engram_token_map);
    // Without the drafter: the same backbone, no stages.
    let (bare, none) = random_weights_on(&cfg, SEED, &Device::Cpu, false).unwrap();
    assert!(none.is_none());
    assert_eq!(tensors(&bare).len(), want.len());
    // And the same logits.
    let tokens: Vec<u32> = (0..20).map(|i| (i * 91 + 7) % 512).collect();
    let logits = |w| {
        let model = Model::new(cfg.clone(), w).unwrap();
        let mut pool = deepinfer::model::runner::single_sequence_pool(&model, 32).unwrap();
        let seq = pool.add_sequence().unwrap();
        let out = model.forward(&mut pool, seq, &tokens).unwrap();
        out.logits.to_le_bytes().unwrap()
    };
    assert!(logits(file) == logits(mem), "logits differ");
}

#[test]
fn another_seed_gives_other_weights_and_unknown_names_are_errors() {
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(SEED);
    let other = RandomWeights::new(&cfg, SEED + 1).unwrap();
    for name in [
        "embed.weight",
        "layers.0.attn.wq_a.weight",
        "layers.2.ffn.experts.1.w2.scale",
    ] {
        assert!(
            bytes_of(&other, name) != ck.get(name).unwrap().bytes(),
            "{name}"
        );
    }
    let e = other
        .read("layers.0.attn.no_such.weight", |_| Ok(()))
        .unwrap_err();
    assert!(
        e.to_string().contains("layers.0.attn.no_such.weight"),
        "{e}"
    );
}

/// Full-width parameters of the official config (an expert's w1 and the
/// FP8 `wq_b` with its 32 × 32 block scales): chunked on 16 threads, they
/// are the single-threaded generator's bytes.
#[test]
fn full_width_parameters_chunked_equal_the_generator() {
    let cfg = ModelConfig::from_hf_json(V41_FLASH_CONFIG)
        .unwrap()
        .ep_rank(64)
        .unwrap();
    let random = RandomWeights::new(&cfg, SEED)
        .unwrap()
        .with_threads(16)
        .with_chunk_values(100_000);
    for name in [
        "layers.3.ffn.experts.5.w1.weight",
        "layers.20.attn.wq_b.weight",
    ] {
        let param = random
            .manifest()
            .params()
            .iter()
            .find(|p| p.name == name)
            .unwrap();
        assert!(
            random.param_bytes(param).unwrap() == param_bytes(param, SEED),
            "{name}"
        );
    }
}
