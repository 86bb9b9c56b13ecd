//! The model config: both official forms load to the same typed config with
//! the values of spec §1, the derived layer roles match the table of spec §2,
//! the tiny configs have every role, and each contradiction is rejected with
//! a message naming the key or layer at fault. Expected values are written
//! from the spec, not from the loader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use deepinfer::contract::MX_BLOCK;
use deepinfer::model::config::{
    AttentionConfig, CandidateConfig, ConfigError, DsparkConfig, EngramConfig, IndexerConfig,
    LayerKind, LayerPlan, MhcConfig, ModelConfig, MoeConfig, QuantConfig, RopeConfig, ScoreFunc,
    SpecialTokens, WeightFormat, YarnConfig,
};
use serde_json::{Value, json};

mod common;

use common::limits::{Counting, bounded};

/// The size-limit cases run under [`bounded`]'s memory and time limits.
#[global_allocator]
static ALLOC: Counting = Counting;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap()
}

const OFFICIAL: &str = "models/deepseek-v4.1-flash";
const TINY: &str = "models/tiny";

fn official_hf() -> Value {
    serde_json::from_str(&read(&format!("{OFFICIAL}/config.json"))).unwrap()
}

fn official_flat() -> Value {
    serde_json::from_str(&read(&format!("{OFFICIAL}/inference-config.json"))).unwrap()
}

/// The official flat config with one edit.
fn flat_with(edit: impl FnOnce(&mut Value)) -> Result<ModelConfig, ConfigError> {
    let mut value = official_flat();
    edit(&mut value);
    ModelConfig::from_inference_json(&value.to_string())
}

/// The official Hugging Face config with one edit.
fn hf_with(edit: impl FnOnce(&mut Value)) -> Result<ModelConfig, ConfigError> {
    let mut value = official_hf();
    edit(&mut value);
    ModelConfig::from_hf_json(&value.to_string())
}

/// The rejection's message, which must contain every fragment.
fn rejected(result: Result<ModelConfig, ConfigError>, fragments: &[&str]) {
    let message = match result {
        Ok(_) => panic!("accepted, expected an error containing {fragments:?}"),
        Err(e) => e.to_string(),
    };
    for fragment in fragments {
        assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
    }
}

/// Spec §1, value by value.
fn spec_v41_flash() -> ModelConfig {
    let mut compress_ratios = vec![0, 0];
    compress_ratios.extend([2; 18]);
    compress_ratios.extend([1; 20]);
    compress_ratios.extend([0; 3]);
    ModelConfig {
        vocab_size: 129_280,
        hidden_size: 5120,
        n_layers: 40,
        norm_eps: 1e-20,
        tokens: SpecialTokens {
            bos: 0,
            eos: 1,
            pad: 2,
            image: Some(129_264),
        },
        attention: AttentionConfig {
            n_heads: 64,
            head_dim: 512,
            rope_head_dim: 64,
            q_lora_rank: 1280,
            o_groups: 8,
            o_lora_rank: 1024,
            window: 128,
        },
        rope: RopeConfig {
            theta: 10_000.0,
            compress_theta: 160_000.0,
            yarn: YarnConfig {
                factor: 16.0,
                original_seq_len: 65_536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
        },
        compress_ratios,
        kv_source_layers: vec![2, 8, 14, 20],
        index_source_layers: vec![2, 8, 14, 20, 24, 28, 32, 36],
        indexer: IndexerConfig {
            n_heads: 32,
            head_dim: 128,
            topk: 512,
        },
        candidate: Some(CandidateConfig {
            source_layer: 20,
            topk_blocks: 2048,
            block_size: 8,
        }),
        mhc: MhcConfig {
            mult: 4,
            sinkhorn_iters: 20,
            eps: 1e-6,
        },
        moe: MoeConfig {
            n_routed_experts: 384,
            n_activated_experts: 6,
            n_shared_experts: 1,
            inter_dim: 2304,
            score_func: ScoreFunc::SqrtSoftplus,
            route_scale: 1.5,
            norm_topk_prob: true,
            gate_temp: 1.0,
            swiglu_limit: 10.0,
        },
        engram: EngramConfig {
            layer_ids: vec![1, 14],
            table_rows: vec![384_006_168, 384_016_682],
            max_ngram: 4,
            n_heads: 8,
            head_dim: 256,
            hash_space: 16_000_000,
            compressed_vocab: 99_092,
            pad_id: 2,
        },
        dspark: DsparkConfig {
            n_stages: 3,
            block_size: 5,
            noise_token_id: 128_799,
            target_layers: vec![37, 38, 39],
            markov_rank: 256,
            n_routed_experts: 128,
            n_activated_experts: 3,
        },
        quant: QuantConfig {
            weights: WeightFormat::Fp8,
            experts: WeightFormat::Fp4,
            weight_block: [32, 32],
        },
    }
}

#[test]
fn official_forms_load_to_the_spec_config() {
    let hf = ModelConfig::from_hf_json(&read(&format!("{OFFICIAL}/config.json"))).unwrap();
    let flat =
        ModelConfig::from_inference_json(&read(&format!("{OFFICIAL}/inference-config.json")))
            .unwrap();
    assert_eq!(hf, flat);
    assert_eq!(hf, spec_v41_flash());
    assert_eq!(hf.n_total_layers(), 43);
}

#[test]
fn official_files_match_the_shared_originals() {
    let shared = repo("../shared/models/deepseek-v4.1-flash");
    if !shared.is_dir() {
        return;
    }
    for name in ["config.json", "inference-config.json"] {
        let original = std::fs::read_to_string(shared.join(name)).unwrap();
        assert_eq!(read(&format!("{OFFICIAL}/{name}")), original, "{name}");
    }
}

/// One layer's role, flattened for comparison with a spec table.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Role {
    ratio: usize,
    kind: LayerKind,
    kv_source: Option<usize>,
    keys_from: Option<usize>,
    topk_from: Option<usize>,
    candidates_from: Option<usize>,
    gated: Option<bool>,
    candidate_source: bool,
    engram: Option<usize>,
    dspark_target: Option<usize>,
    stage: Option<usize>,
}

impl Role {
    fn of(plan: &LayerPlan) -> Role {
        Role {
            ratio: plan.ratio,
            kind: plan.kind(),
            kv_source: plan.kv_source(),
            keys_from: plan.index_keys_from(),
            topk_from: plan.topk_from(),
            candidates_from: plan.candidates_from(),
            gated: plan.compressor.map(|c| c.gated),
            candidate_source: plan.candidate_source,
            engram: plan.engram,
            dspark_target: plan.dspark_target,
            stage: plan.dspark_stage,
        }
    }
}

fn window() -> Role {
    Role {
        ratio: 0,
        kind: LayerKind::WindowOnly,
        kv_source: None,
        keys_from: None,
        topk_from: None,
        candidates_from: None,
        gated: None,
        candidate_source: false,
        engram: None,
        dspark_target: None,
        stage: None,
    }
}

fn stage(s: usize) -> Role {
    Role {
        kind: LayerKind::DsparkStage,
        stage: Some(s),
        ..window()
    }
}

/// A KV source running its own indexer over its own keys.
fn full(layer: usize, ratio: usize) -> Role {
    Role {
        ratio,
        kind: LayerKind::Full,
        kv_source: Some(layer),
        keys_from: Some(layer),
        topk_from: Some(layer),
        gated: Some(ratio > 1),
        ..window()
    }
}

fn reuse(ratio: usize, kv_source: usize, topk_from: usize) -> Role {
    Role {
        ratio,
        kind: LayerKind::Reuse,
        kv_source: Some(kv_source),
        topk_from: Some(topk_from),
        ..window()
    }
}

fn reindex(layer: usize, ratio: usize, kv_source: usize, candidates: usize) -> Role {
    Role {
        ratio,
        kind: LayerKind::Reindex,
        kv_source: Some(kv_source),
        keys_from: Some(kv_source),
        topk_from: Some(layer),
        candidates_from: Some(candidates),
        ..window()
    }
}

/// Spec §2, row by row.
fn spec_v41_role(layer: usize) -> Role {
    match layer {
        0 => window(),
        1 => Role {
            engram: Some(0),
            ..window()
        },
        2 | 8 => full(layer, 2),
        3..=7 => reuse(2, 2, 2),
        9..=13 => reuse(2, 8, 8),
        14 => Role {
            engram: Some(1),
            ..full(14, 2)
        },
        15..=19 => reuse(2, 14, 14),
        20 => Role {
            candidate_source: true,
            ..full(20, 1)
        },
        21..=23 => reuse(1, 20, 20),
        24 | 28 | 32 | 36 => reindex(layer, 1, 20, 20),
        25..=27 => reuse(1, 20, 24),
        29..=31 => reuse(1, 20, 28),
        33..=35 => reuse(1, 20, 32),
        37..=39 => Role {
            dspark_target: Some(layer - 37),
            ..reuse(1, 20, 36)
        },
        40..=42 => stage(layer - 40),
        _ => panic!("V4.1-Flash has 43 layers and stages"),
    }
}

#[test]
fn official_layer_roles_match_the_spec_table() {
    let plans = spec_v41_flash().layer_plans().unwrap();
    assert_eq!(plans.len(), 43);
    for (layer, plan) in plans.iter().enumerate() {
        assert_eq!(plan.layer, layer);
        assert_eq!(Role::of(plan), spec_v41_role(layer), "layer {layer}");
    }
    let owners = |pred: fn(&LayerPlan) -> bool| -> Vec<usize> {
        plans.iter().filter(|p| pred(p)).map(|p| p.layer).collect()
    };
    assert_eq!(owners(LayerPlan::is_kv_source), [2, 8, 14, 20]);
    assert_eq!(owners(LayerPlan::owns_index_keys), [2, 8, 14, 20]);
    assert_eq!(
        owners(LayerPlan::is_index_source),
        [2, 8, 14, 20, 24, 28, 32, 36]
    );
    assert_eq!(owners(LayerPlan::is_reindex), [24, 28, 32, 36]);
    assert_eq!(
        owners(|p| p.compressor.is_some_and(|c| c.gated)),
        [2, 8, 14]
    );
}

#[test]
fn official_rope_is_chosen_per_layer() {
    let yarn = YarnConfig {
        factor: 16.0,
        original_seq_len: 65_536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    for plan in spec_v41_flash().layer_plans().unwrap() {
        if matches!(plan.layer, 0 | 1 | 40..=42) {
            assert_eq!(plan.rope.theta, 10_000.0, "layer {}", plan.layer);
            assert_eq!(plan.rope.yarn, None, "layer {}", plan.layer);
        } else {
            assert_eq!(plan.rope.theta, 160_000.0, "layer {}", plan.layer);
            assert_eq!(plan.rope.yarn, Some(yarn), "layer {}", plan.layer);
        }
    }
    let mut no_yarn = spec_v41_flash();
    no_yarn.rope.yarn.original_seq_len = 0;
    assert_eq!(no_yarn.rope.for_ratio(2).yarn, None);
}

#[test]
fn official_engram_primes_match_the_spec() {
    let primes = spec_v41_flash().engram.table_primes().unwrap();
    assert_eq!(primes.len(), 2);
    assert!(primes.iter().all(|layer| layer.len() == 24));
    assert_eq!(primes[0][..3], [16_000_057, 16_000_079, 16_000_081]);
    assert_eq!(primes[1][23], 16_000_889);
    assert_eq!(primes[0].iter().sum::<u64>(), 384_006_168);
    assert_eq!(primes[1].iter().sum::<u64>(), 384_016_682);
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "deepinfer-model-config-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn from_dir_prefers_config_json_and_falls_back_to_the_flat_file() {
    let official = ModelConfig::from_dir(&repo(OFFICIAL)).unwrap();
    assert_eq!(official, spec_v41_flash());

    let flat_only = TempDir::new("flat-only");
    std::fs::write(
        flat_only.0.join("inference-config.json"),
        official_flat().to_string(),
    )
    .unwrap();
    assert_eq!(ModelConfig::from_dir(&flat_only.0).unwrap(), official);

    // The reference's own inference/config.json is flat under that name.
    let flat_named_config = TempDir::new("flat-config");
    std::fs::write(
        flat_named_config.0.join("config.json"),
        official_flat().to_string(),
    )
    .unwrap();
    assert_eq!(
        ModelConfig::from_dir(&flat_named_config.0).unwrap(),
        official
    );

    let empty = TempDir::new("empty");
    rejected(
        ModelConfig::from_dir(&empty.0),
        &["neither config.json nor inference-config.json", "empty"],
    );

    let broken = TempDir::new("broken");
    let mut value = official_hf();
    value["text_config"]["hidden_size"] = json!(5000);
    std::fs::write(broken.0.join("config.json"), value.to_string()).unwrap();
    rejected(
        ModelConfig::from_dir(&broken.0),
        &["config.json", "`hidden_size`/`dim` = 5000"],
    );
}

#[test]
fn absent_keys_take_the_reference_defaults() {
    let flat = official_flat();
    for key in [
        "gate_temp",
        "norm_topk_prob",
        "bos_token_id",
        "weight_block_size",
    ] {
        assert!(flat.get(key).is_none(), "{key} is in the flat file");
    }
    let config = flat_with(|v| {
        v["norm_topk_prob"] = json!(false);
        v["gate_temp"] = json!(0.5);
        v["bos_token_id"] = json!(7);
        v.as_object_mut().unwrap().remove("expert_dtype");
    })
    .unwrap();
    assert!(!config.moe.norm_topk_prob);
    assert_eq!(config.moe.gate_temp, 0.5);
    assert_eq!(config.tokens.bos, 7);
    assert_eq!(config.quant.experts, WeightFormat::Fp8);
}

#[test]
fn a_missing_key_is_named_in_the_form_read() {
    rejected(
        flat_with(|v| {
            v.as_object_mut().unwrap().remove("dim");
        }),
        &["inference config", "missing key `dim`"],
    );
    rejected(
        hf_with(|v| {
            v["text_config"]
                .as_object_mut()
                .unwrap()
                .remove("hidden_size");
        }),
        &[
            "Hugging Face config",
            "missing key `text_config.hidden_size`",
        ],
    );
    rejected(
        hf_with(|v| {
            v["text_config"]["rope_scaling"]
                .as_object_mut()
                .unwrap()
                .remove("factor");
        }),
        &["missing key `text_config.rope_scaling.factor`"],
    );
    rejected(
        hf_with(|v| {
            v.as_object_mut().unwrap().remove("text_config");
        }),
        &["missing key `text_config`"],
    );
    rejected(
        flat_with(|v| {
            v.as_object_mut().unwrap().remove("dtype");
        }),
        &["missing key `dtype`"],
    );
}

#[test]
fn a_wrongly_typed_value_is_named() {
    rejected(
        flat_with(|v| v["n_layers"] = json!("forty")),
        &["`n_layers` = \"forty\" is not a non-negative integer"],
    );
    rejected(
        hf_with(|v| v["text_config"]["compress_ratios"] = json!([0, -1])),
        &[
            "`text_config.compress_ratios`",
            "a list of non-negative integers",
        ],
    );
    rejected(
        hf_with(|v| v["quantization_config"]["weight_block_size"] = json!([32, 32, 32])),
        &["`quantization_config.weight_block_size`", "a pair"],
    );
    rejected(ModelConfig::from_hf_json("{"), &["invalid JSON"]);
    rejected(
        ModelConfig::from_inference_json("[1, 2]"),
        &["a JSON object"],
    );
}

#[test]
fn the_model_error_wraps_config_errors() {
    let e = deepinfer::model::Error::from(flat_with(|v| v["dim"] = json!(0)).unwrap_err());
    assert_eq!(
        e.to_string(),
        "model config: `hidden_size`/`dim` is 0; it must be positive"
    );
}

#[test]
fn rejects_a_kv_source_with_ratio_zero() {
    rejected(
        flat_with(|v| v["kv_source_layers"] = json!([1, 2, 8, 14, 20])),
        &[
            "KV source layer 1",
            "`kv_source_layer_ids`/`kv_source_layers`",
            "`compress_ratios`[1] = 0",
        ],
    );
}

#[test]
fn rejects_a_candidate_source_that_is_not_an_index_source() {
    rejected(
        flat_with(|v| v["candidate_source_layer"] = json!(22)),
        &[
            "candidate source layer 22",
            "`candidate_source_layer_id`/`candidate_source_layer`",
            "not an index source",
        ],
    );
}

#[test]
fn rejects_a_candidate_source_that_is_not_a_kv_source() {
    rejected(
        flat_with(|v| v["candidate_source_layer"] = json!(24)),
        &["candidate source layer 24", "not a KV source"],
    );
}

#[test]
fn rejects_an_index_source_reading_no_kv_source() {
    rejected(
        flat_with(|v| v["index_source_layers"] = json!([0, 2, 8, 14, 20, 24, 28, 32, 36])),
        &[
            "index source layer 0",
            "`compress_ratios`[0] = 0",
            "reads no KV source",
        ],
    );
    rejected(
        flat_with(|v| v["kv_source_layers"] = json!([8, 14, 20])),
        &["index source layer 2 (ratio 2) reads no KV source"],
    );
}

#[test]
fn rejects_a_compress_ratios_length_that_is_not_layers_plus_stages() {
    rejected(
        flat_with(|v| {
            v["compress_ratios"].as_array_mut().unwrap().pop();
        }),
        &["`compress_ratios` has 42 entries, expected 43 (40 layers + 3 DSpark stages)"],
    );
    rejected(
        flat_with(|v| v["n_mtp_layers"] = json!(2)),
        &["`compress_ratios` has 43 entries, expected 42"],
    );
}

#[test]
fn rejects_duplicate_layer_ids() {
    rejected(
        flat_with(|v| v["kv_source_layers"] = json!([2, 8, 8, 14, 20])),
        &["`kv_source_layer_ids`/`kv_source_layers` lists layer 8 twice"],
    );
    rejected(
        hf_with(|v| v["text_config"]["engram_layer_ids"] = json!([14, 14])),
        &["`engram_layer_ids` lists layer 14 twice"],
    );
    rejected(
        flat_with(|v| v["dspark_target_layer_ids"] = json!([37, 39, 39])),
        &["`dspark_target_layer_ids` lists layer 39 twice"],
    );
}

#[test]
fn rejects_layer_ids_out_of_range() {
    rejected(
        flat_with(|v| v["index_source_layers"] = json!([2, 8, 14, 20, 24, 28, 32, 36, 40])),
        &[
            "`index_source_layer_ids`/`index_source_layers` names layer 40",
            "layers 0..40",
        ],
    );
    rejected(
        flat_with(|v| v["engram_layer_ids"] = json!([1, 41])),
        &["`engram_layer_ids` names layer 41"],
    );
    rejected(
        flat_with(|v| v["candidate_source_layer"] = json!(40)),
        &["`candidate_source_layer_id`/`candidate_source_layer` names layer 40"],
    );
    rejected(
        flat_with(|v| v["candidate_source_layer"] = json!(-2)),
        &[
            "`candidate_source_layer_id`/`candidate_source_layer` = -2",
            "-1 to disable",
        ],
    );
}

#[test]
fn rejects_the_v4_style_128_block_grid() {
    rejected(
        hf_with(|v| v["quantization_config"]["weight_block_size"] = json!([128, 128])),
        &[
            "`quantization_config.weight_block_size`/`weight_block_size` = [128, 128]",
            "32×32",
            "V4-style",
        ],
    );
    rejected(
        flat_with(|v| v["weight_block_size"] = json!([128, 128])),
        &["`weight_block_size` = [128, 128]"],
    );
}

#[test]
fn rejects_other_v4_style_configs() {
    rejected(
        hf_with(|v| v["model_type"] = json!("deepseek_v4")),
        &[
            "`model_type` = \"deepseek_v4\"",
            "not a DeepSeek-V4.1 config",
        ],
    );
    rejected(
        flat_with(|v| {
            v["compress_ratios"][3] = json!(128);
        }),
        &["`compress_ratios`[3] = 128", "V4's CSA and HCA"],
    );
    rejected(
        flat_with(|v| v["num_hash_layers"] = json!(3)),
        &["`num_hash_layers` = 3", "V4-style"],
    );
    rejected(
        flat_with(|v| {
            v.as_object_mut().unwrap().remove("kv_source_layers");
        }),
        &["missing key `kv_source_layers`"],
    );
}

#[test]
fn rejects_a_reuse_layer_with_no_preceding_index_source() {
    rejected(
        flat_with(|v| v["index_source_layers"] = json!([8, 14, 20, 24, 28, 32, 36])),
        &["reuse layer 2 (ratio 2", "no preceding index source"],
    );
}

#[test]
fn rejects_a_reuse_layer_whose_top_k_indexes_another_cache() {
    rejected(
        flat_with(|v| v["index_source_layers"] = json!([2, 14, 20, 24, 28, 32, 36])),
        &[
            "reuse layer 8 reads KV source layer 8",
            "nearest preceding index source, layer 2",
            "KV source layer 2",
        ],
    );
}

#[test]
fn rejects_a_layer_whose_ratio_differs_from_its_kv_source() {
    rejected(
        flat_with(|v| v["compress_ratios"][21] = json!(2)),
        &[
            "layer 21 has `compress_ratios`[21] = 2",
            "ratio-1 cache of KV source layer 20",
        ],
    );
}

#[test]
fn rejects_a_candidate_restriction_over_another_cache() {
    rejected(
        flat_with(|v| {
            v["kv_source_layers"] = json!([2, 8, 14, 20, 30]);
            v["index_source_layers"] = json!([2, 8, 14, 20, 24, 28, 30, 32, 36]);
        }),
        &[
            "index source layer 30",
            "candidate blocks of layer 20",
            "reads KV source layer 30",
        ],
    );
}

#[test]
fn rejects_dspark_target_layers_out_of_range() {
    rejected(
        flat_with(|v| v["dspark_target_layer_ids"] = json!([38, 39, 40])),
        &["`dspark_target_layer_ids` names layer 40"],
    );
    rejected(
        flat_with(|v| v["dspark_target_layer_ids"] = json!([])),
        &[
            "`dspark_target_layer_ids` = []",
            "3 DSpark stages need target layers",
        ],
    );
}

#[test]
fn rejects_a_dspark_stage_with_a_compressed_cache() {
    rejected(
        flat_with(|v| v["compress_ratios"][41] = json!(1)),
        &["`compress_ratios`[41] = 1", "DSpark stage 1", "window only"],
    );
}

#[test]
fn rejects_zero_dims() {
    rejected(
        flat_with(|v| v["dim"] = json!(0)),
        &["`hidden_size`/`dim` is 0"],
    );
    rejected(
        flat_with(|v| v["index_topk"] = json!(0)),
        &["`index_topk` is 0"],
    );
    rejected(
        flat_with(|v| v["candidate_block_size"] = json!(0)),
        &["`candidate_block_size` is 0"],
    );
}

#[test]
fn rejects_a_head_dim_below_the_rope_dims() {
    rejected(
        flat_with(|v| v["rope_head_dim"] = json!(544)),
        &["`qk_rope_head_dim`/`rope_head_dim` = 544 exceeds `head_dim` = 512"],
    );
    rejected(
        flat_with(|v| v["index_head_dim"] = json!(32)),
        &["`qk_rope_head_dim`/`rope_head_dim` = 64 exceeds `index_head_dim` = 32"],
    );
    rejected(
        flat_with(|v| v["rope_head_dim"] = json!(63)),
        &["`rope_head_dim` = 63 is not a multiple of 2"],
    );
}

#[test]
fn rejects_widths_that_the_32_blocks_do_not_divide() {
    rejected(
        flat_with(|v| v["dim"] = json!(5000)),
        &["`hidden_size`/`dim` = 5000 is not a multiple of 32"],
    );
    rejected(
        flat_with(|v| v["moe_inter_dim"] = json!(2300)),
        &["`moe_intermediate_size`/`moe_inter_dim` = 2300 is not a multiple of 32"],
    );
}

#[test]
fn rejects_o_groups_that_do_not_divide_the_heads() {
    rejected(
        flat_with(|v| v["o_groups"] = json!(6)),
        &["`num_attention_heads`/`n_heads` = 64 is not a multiple of `o_groups` = 6"],
    );
}

#[test]
fn rejects_more_activated_than_routed_experts() {
    rejected(
        flat_with(|v| v["n_activated_experts"] = json!(400)),
        &["`num_experts_per_tok`/`n_activated_experts` = 400 exceeds `n_routed_experts` = 384"],
    );
    rejected(
        flat_with(|v| v["n_shared_experts"] = json!(2)),
        &["`n_shared_experts` = 2 is not supported"],
    );
}

#[test]
fn rejects_token_ids_outside_the_vocabulary() {
    rejected(
        flat_with(|v| v["dspark_noise_token_id"] = json!(129_280)),
        &[
            "`dspark_noise_token_id` = 129280",
            "129280-token vocabulary",
        ],
    );
}

#[test]
fn rejects_non_positive_floats() {
    rejected(
        flat_with(|v| v["norm_eps"] = json!(0.0)),
        &["`rms_norm_eps`/`norm_eps` = 0", "positive"],
    );
    rejected(
        flat_with(|v| v["beta_fast"] = json!(1)),
        &["`rope_scaling.beta_fast`/`beta_fast` = 1", "must exceed"],
    );
}

#[test]
fn rejects_engram_tables_that_disagree_with_the_layers() {
    rejected(
        flat_with(|v| v["engram_num_embeddings"] = json!([384_006_168])),
        &["`engram_num_embeddings` has 1 entries for 2 Engram layers"],
    );
    rejected(
        flat_with(|v| v["engram_num_embeddings"] = json!([384_006_168, 384_016_681])),
        &["Engram layer 14 384016681 rows", "sum to 384016682"],
    );
    rejected(
        flat_with(|v| v["engram_compressed_vocab_size"] = json!(200_000)),
        &["`engram_compressed_vocab_size` = 200000 exceeds `vocab_size` = 129280"],
    );
}

#[test]
fn rejects_a_multi_head_kv_config() {
    rejected(
        hf_with(|v| v["text_config"]["num_key_value_heads"] = json!(8)),
        &["`num_key_value_heads` = 8 is not supported", "MQA"],
    );
}

/// The tiny model's roles, by design (models/README.md).
fn tiny_role(layer: usize) -> Role {
    match layer {
        0 => window(),
        1 => Role {
            engram: Some(0),
            ..window()
        },
        2 => full(2, 2),
        3 => reuse(2, 2, 2),
        4 => Role {
            engram: Some(1),
            ..full(4, 2)
        },
        5 => reuse(2, 4, 4),
        6 => Role {
            candidate_source: true,
            ..full(6, 1)
        },
        7 => reuse(1, 6, 6),
        8 => reindex(8, 1, 6, 6),
        9 => Role {
            dspark_target: Some(0),
            ..reuse(1, 6, 8)
        },
        10 => Role {
            dspark_target: Some(1),
            ..reindex(10, 1, 6, 6)
        },
        11 => Role {
            dspark_target: Some(2),
            ..reuse(1, 6, 10)
        },
        12..=14 => stage(layer - 12),
        _ => panic!("the tiny model has 15 layers and stages"),
    }
}

#[test]
fn tiny_forms_agree_and_have_every_role() {
    let hf = ModelConfig::from_hf_json(&read(&format!("{TINY}/config.json"))).unwrap();
    let flat =
        ModelConfig::from_inference_json(&read(&format!("{TINY}/inference-config.json"))).unwrap();
    assert_eq!(hf, flat);
    assert_eq!(ModelConfig::from_dir(&repo(TINY)).unwrap(), hf);

    let plans = hf.layer_plans().unwrap();
    assert_eq!(plans.len(), 15);
    for (layer, plan) in plans.iter().enumerate() {
        assert_eq!(Role::of(plan), tiny_role(layer), "layer {layer}");
    }
    for kind in [
        LayerKind::WindowOnly,
        LayerKind::Full,
        LayerKind::Reindex,
        LayerKind::Reuse,
        LayerKind::DsparkStage,
    ] {
        assert!(plans.iter().any(|p| p.kind() == kind), "{kind:?}");
    }
    let full_ratios: Vec<usize> = plans
        .iter()
        .filter(|p| p.kind() == LayerKind::Full)
        .map(|p| p.ratio)
        .collect();
    assert_eq!(
        full_ratios,
        [2, 2, 1],
        "two ratio-2 KV sources, then ratio 1"
    );
    assert!(plans.iter().any(|p| p.is_reuse() && p.ratio == 2));
    assert!(plans.iter().any(|p| p.is_reuse() && p.ratio == 1));
    assert!(
        plans
            .iter()
            .any(|p| p.is_reuse() && plans[p.topk_from().unwrap()].is_reindex())
    );
    assert!(plans.iter().any(|p| p.candidate_source));
    assert_eq!(plans.iter().filter(|p| p.engram.is_some()).count(), 2);
    assert_eq!(
        plans.iter().filter(|p| p.dspark_target.is_some()).count(),
        3
    );
}

#[test]
fn tiny_widths_fit_the_quantizer_blocks() {
    let c = ModelConfig::from_dir(&repo(TINY)).unwrap();
    let a = &c.attention;
    let widths = [
        c.hidden_size,
        a.head_dim,
        a.q_lora_rank,
        a.o_lora_rank,
        a.o_groups * a.o_lora_rank,
        a.n_heads * a.head_dim / a.o_groups,
        c.indexer.head_dim,
        c.indexer.n_heads * c.indexer.head_dim,
        c.moe.inter_dim,
        c.engram.head_dim,
        c.engram.columns() * c.engram.head_dim,
        c.dspark.target_layers.len() * c.hidden_size,
    ];
    for width in widths {
        assert!(width.is_multiple_of(MX_BLOCK), "{width}");
    }
    let pool = c.candidate.map(|k| k.topk_blocks * k.block_size).unwrap();
    assert!(
        c.indexer.topk < pool,
        "the candidate pool must exceed the top-k"
    );
    let primes = c.engram.table_primes().unwrap();
    assert_eq!(primes[0][..2], [1009, 1013]);
}

/// The real-vocabulary default is the tiny model with V4.1's vocabulary,
/// image and noise ids and compressed-vocabulary size, and nothing else.
#[test]
fn tiny_v4vocab_is_tiny_with_the_real_vocabulary() {
    let dir = "models/tiny-v4vocab";
    let hf = ModelConfig::from_hf_json(&read(&format!("{dir}/config.json"))).unwrap();
    let flat =
        ModelConfig::from_inference_json(&read(&format!("{dir}/inference-config.json"))).unwrap();
    assert_eq!(hf, flat);
    assert_eq!(hf.vocab_size, 129_280);
    assert_eq!(hf.engram.compressed_vocab, 99_092);
    assert_eq!(hf.dspark.noise_token_id, 128_799);
    let tiny = ModelConfig::from_dir(&repo(TINY)).unwrap();
    let mut same = hf.clone();
    same.vocab_size = tiny.vocab_size;
    same.engram.compressed_vocab = tiny.engram.compressed_vocab;
    same.dspark.noise_token_id = tiny.dspark.noise_token_id;
    same.tokens.image = tiny.tokens.image;
    assert_eq!(same, tiny);
}

/// Every size limit is at least 8× V4.1-Flash's value, which the table
/// states correctly, and a value past the limit is refused by name before
/// anything is sized from it (both forms).
#[test]
fn size_limits_refuse_absurd_configs_by_name() {
    use deepinfer::model::config::{ConfigForm, LIMITS};
    let official: serde_json::Value =
        serde_json::from_str(&read("models/deepseek-v4.1-flash/config.json")).unwrap();
    let at = |v: &serde_json::Value, path: &str| -> Option<u64> {
        path.split('.')
            .try_fold(v, |v, k| v.get(k))
            .and_then(|v| v.as_u64())
    };
    for deepinfer::model::config::Limit {
        key,
        max: limit,
        v41,
        ..
    } in LIMITS
    {
        let path = key.name(ConfigForm::HuggingFace);
        assert_eq!(at(&official, path), Some(v41), "{path}");
        assert!(limit >= 8 * v41, "{path}: limit {limit}");
        for (dir, form) in [
            (TINY, ConfigForm::HuggingFace),
            (TINY, ConfigForm::Inference),
        ] {
            let file = match form {
                ConfigForm::HuggingFace => "config.json",
                ConfigForm::Inference => "inference-config.json",
            };
            let mut v: serde_json::Value =
                serde_json::from_str(&read(&format!("{dir}/{file}"))).unwrap();
            let name = key.name(form);
            let mut slot = &mut v;
            for k in name.split('.') {
                slot = slot
                    .get_mut(k)
                    .unwrap_or_else(|| panic!("{name} in {file}"));
            }
            *slot = serde_json::json!(limit + 1);
            let text = v.to_string();
            // Refused within 2 s and 16 MiB (the parse itself takes ~100 KiB).
            let (e, _) = bounded(name, 16 << 20, Duration::from_secs(2), || {
                match form {
                    ConfigForm::HuggingFace => ModelConfig::from_hf_json(&text),
                    ConfigForm::Inference => ModelConfig::from_inference_json(&text),
                }
                .unwrap_err()
            });
            assert!(
                matches!(e, ConfigError::TooLarge { .. })
                    && e.to_string().contains(&key.to_string()),
                "{name} = {}: {e}",
                limit + 1
            );
        }
    }
}

/// Values that pass the size limits' types but not their meaning: each
/// refused by name, under 16 MiB and 2 s.
#[test]
fn large_epsilons_and_yarn_without_a_length_are_refused() {
    let tiny: serde_json::Value =
        serde_json::from_str(&read(&format!("{TINY}/config.json"))).unwrap();
    let mut cases: Vec<(serde_json::Value, &str)> = Vec::new();
    for (key, value) in [
        ("rms_norm_eps", serde_json::json!(1e300)),
        ("hc_eps", serde_json::json!(0.5)),
    ] {
        let mut v = tiny.clone();
        v["text_config"][key] = value;
        cases.push((v, key));
    }
    let mut v = tiny.clone();
    v["text_config"]["rope_scaling"]["original_max_position_embeddings"] = serde_json::json!(0);
    cases.push((v, "original"));
    for (v, want) in cases {
        let text = v.to_string();
        let (e, _) = bounded(want, 16 << 20, Duration::from_secs(2), || {
            ModelConfig::from_hf_json(&text).unwrap_err()
        });
        assert!(e.to_string().contains(want), "{e}");
    }
}

/// The literal values issue 15's Why lists (`sliding_window` 10^9 took 23
/// GB, `n_routed_experts` 10^12 filled 24 GB in the manifest,
/// `hc_sinkhorn_iters` 10^12 hung, `engram_max_ngram_size` 10^6 took 15 s,
/// `index_topk` 10^18, `candidate_topk_blocks` 10^9 and `dspark_block_size`
/// 10^9 were accepted): each is refused by name as too large, within 2 s
/// and 16 MiB.
#[test]
fn the_values_issue_15_found_are_refused_by_name() {
    let tiny: serde_json::Value =
        serde_json::from_str(&read(&format!("{TINY}/config.json"))).unwrap();
    for (key, value) in [
        ("sliding_window", 1_000_000_000u64),
        ("n_routed_experts", 1_000_000_000_000),
        ("hc_sinkhorn_iters", 1_000_000_000_000),
        ("engram_max_ngram_size", 1_000_000),
        ("index_topk", 1_000_000_000_000_000_000),
        ("candidate_topk_blocks", 1_000_000_000),
        ("dspark_block_size", 1_000_000_000),
    ] {
        let mut v = tiny.clone();
        v["text_config"][key] = serde_json::json!(value);
        let text = v.to_string();
        let (e, _) = bounded(key, 16 << 20, Duration::from_secs(2), || {
            ModelConfig::from_hf_json(&text).unwrap_err()
        });
        assert!(
            matches!(e, ConfigError::TooLarge { .. }) && e.to_string().contains(key),
            "{key} = {value}: {e}"
        );
    }
}
