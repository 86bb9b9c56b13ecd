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

/// An independent statement of the generator's stream: splitmix64 stepped
/// one output at a time from the parameter's key (the run seed's first
/// output xor FNV-1a of the name), four uniforms per normal, summed in
/// order. `weight_rng::values` jumps to any element in O(1); both agree
/// from the start and from the middle.
#[test]
fn the_counter_stream_is_splitmix64_drawn_in_order() {
    use deepinfer::weight_rng::{Format, RandomParam, stream_key, values};
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    let name = "layers.7.attn.wq_b.weight";
    let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let key = mix(SEED.wrapping_add(GAMMA)) ^ fnv;
    assert_eq!(stream_key(SEED, name), key);
    let p = RandomParam {
        key,
        mean: 0.25,
        std: 0.5,
        rows: 9,
        cols: 31,
        format: Format::F32,
    };
    let mut state = key;
    let want: Vec<f32> = (0..p.rows * p.cols)
        .map(|_| {
            let mut sum = 0.0f64;
            for _ in 0..4 {
                state = state.wrapping_add(GAMMA);
                sum += (mix(state) >> 11) as f64 / 9_007_199_254_740_992.0;
            }
            (0.25 + 0.5 * ((sum - 2.0) * 3f64.sqrt())) as f32
        })
        .collect();
    assert_eq!(values(&p, 0..want.len()), want);
    assert_eq!(values(&p, 100..want.len()), want[100..]);
}

/// `ops::random_param` on the CPU carries the checkpoint generator's bytes
/// of every tiny-config parameter in the manifest's stored dtypes (its
/// plumbing: both share `weight_rng`, which the stream test above and the
/// checkpoint tests pin; the GPU test compares the kernels with it).
#[test]
fn the_random_param_op_is_the_generators_bytes_on_the_cpu() {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny");
    let cfg = ModelConfig::from_dir(&tiny).unwrap();
    let random = RandomWeights::new(&cfg, SEED).unwrap();
    let mut formats = std::collections::HashSet::new();
    for param in random.manifest().params() {
        let made = deepinfer::ops::random_param(&Device::Cpu, &param.random(SEED)).unwrap();
        let want = param_bytes(param, SEED);
        assert_eq!(made.len(), want.len(), "{}", param.name);
        for ((t, w), spec) in made.iter().zip(&want).zip(param.tensors()) {
            assert_eq!(t.dtype(), spec.dtype.tensor_dtype(), "{}", spec.name);
            assert!(t.to_le_bytes().unwrap() == *w, "{}", spec.name);
        }
        formats.insert(format!("{:?}", param.format));
    }
    assert!(formats.len() >= 5, "{formats:?}");
}
