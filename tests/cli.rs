//! The command line as a user meets it: bad flags, switches and JSONL lines
//! are clear errors (a bad line fails alone), a JSONL batch writes one
//! result per line, and `score --dump-logits` writes the logits that
//! `score` printed log-probabilities of. Runs the built binary on the tiny
//! default, generated into a private cache.

mod common;

use common::TempDir;
use std::process::{Command, Output};

fn deepinfer(cache: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deepinfer"));
    c.args(args)
        .env("DEEPINFER_CACHE", cache.path())
        .env_remove("RUST_LOG");
    for var in [
        "DEEPINFER_HF_MODEL_DIR",
        "DEEPINFER_BATCH_INVARIANT",
        "DEEPINFER_DETERMINISTIC_SAMPLING",
        "DEEPINFER_ENABLE_MTP_VARLEN",
        "DEEPINFER_USE_NEXTN_DECODE",
        "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE",
        "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS",
    ] {
        c.env_remove(var);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    limit_child(&mut c);
    c.output().expect("the deepinfer binary runs")
}

/// Every CLI run is a child under [`CHILD_DATA_BYTES`] of data (heap and
/// private mappings; the checkpoint's file mappings do not count) and
/// [`CHILD_CPU_SECONDS`] of CPU time: an absurd size or a spin ends the
/// child, not the machine.
const CHILD_DATA_BYTES: u64 = 2 << 30;
const CHILD_CPU_SECONDS: u64 = 300;

fn limit_child(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit, which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            for (resource, value) in [
                (libc::RLIMIT_DATA, CHILD_DATA_BYTES),
                (libc::RLIMIT_CPU, CHILD_CPU_SECONDS),
            ] {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fails_with(cache: &TempDir, args: &[&str], env: &[(&str, &str)], want: &[&str]) {
    let o = deepinfer(cache, args, env);
    let e = stderr(&o);
    assert!(!o.status.success(), "{args:?} {env:?} succeeded: {e}");
    for w in want {
        assert!(e.contains(w), "{args:?} {env:?}: {e:?} lacks {w:?}");
    }
}

#[test]
fn bad_flags_and_switches_are_clear_errors() {
    let cache = TempDir::new("cli-bad");
    let none: &[(&str, &str)] = &[];
    fails_with(&cache, &["run", "--max-new", "abc"], none, &["--max-new"]);
    fails_with(
        &cache,
        &["run", "--device", "tpu"],
        none,
        &["device", "tpu"],
    );
    // Where this process can open no GPU (no driver, or a CPU-only build),
    // the main job on cuda:0 is a typed error naming it; where it can, the
    // job runs there.
    if "cuda:0".parse::<deepinfer::Device>().is_err() {
        fails_with(&cache, &["run", "--device", "cuda:0"], none, &["cuda:0"]);
    } else {
        let o = deepinfer(&cache, &["run", "--device", "cuda:0"], none);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    fails_with(
        &cache,
        &["run", "--prompt", "1,x,3"],
        none,
        &["= x", "token ids"],
    );
    fails_with(
        &cache,
        &["run", "--prompt", "1,999999"],
        none,
        &["999999", "vocabulary"],
    );
    fails_with(
        &cache,
        &["run", "--max-new", "99999999999999"],
        none,
        &["max_tokens", "99999999999999"],
    );
    fails_with(&cache, &["run", "--temperature=-1"], none, &["temperature"]);
    fails_with(
        &cache,
        &["run", "--engram-tables", "disk"],
        none,
        &["--engram-tables"],
    );
    fails_with(
        &cache,
        &["run", "--prompt-text", "hi"],
        none,
        &["tokenizer"],
    );
    fails_with(
        &cache,
        &["run", "--stop", "x"],
        none,
        &["stop", "tokenizer"],
    );
    fails_with(&cache, &["run", "--regex", "a+"], none, &["tokenizer"]);
    fails_with(
        &cache,
        &["run", "--json-schema", "missing-schema.json"],
        none,
        &["--json-schema", "no such file"],
    );
    fails_with(
        &cache,
        &["run", "--batch-invariant", "2"],
        none,
        &["--batch-invariant", "0 or 1"],
    );
    fails_with(
        &cache,
        &["run"],
        &[("DEEPINFER_BATCH_INVARIANT", "yes")],
        &["DEEPINFER_BATCH_INVARIANT"],
    );
    fails_with(
        &cache,
        &["run"],
        &[("DEEPINFER_DETERMINISTIC_SAMPLING", "1")],
        &["BATCH_INVARIANT=1", "MTP_VARLEN=0"],
    );
    // A flag beats its variable: the same contradiction, lifted by the flag.
    let o = deepinfer(
        &cache,
        &["run", "--max-new", "2", "--batch-invariant", "1"],
        &[
            ("DEEPINFER_DETERMINISTIC_SAMPLING", "1"),
            ("DEEPINFER_BATCH_INVARIANT", "0"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Speculative decoding runs on the default model's drafter; more drafts
    // than its block are refused.
    let o = deepinfer(&cache, &["run", "--max-new", "3", "--nextn", "2"], none);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with(
        &cache,
        &["run", "--nextn", "9"],
        none,
        &["USE_NEXTN_DECODE", "dspark_block_size"],
    );
    fails_with(
        &cache,
        &["run", "--yoco-mode", "fast"],
        none,
        &["exact or compact"],
    );
    fails_with(
        &cache,
        &["run", "--yoco-keep-tokens", "3"],
        none,
        &["KEEP_TOKENS", "minimum 13"],
    );
    fails_with(
        &cache,
        &["run", "--model", "/nonexistent/model"],
        none,
        &["/nonexistent/model"],
    );
    // An unknown DEEPINFER_* variable is warned about, not fatal.
    let o = deepinfer(
        &cache,
        &["run", "--max-new", "2"],
        &[("DEEPINFER_BATCH_INVARIENT", "1")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("DEEPINFER_BATCH_INVARIENT"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_jsonl_batch_writes_a_line_per_request_and_bad_lines_fail_alone() {
    let cache = TempDir::new("cli-jsonl");
    let dir = TempDir::new("cli-jsonl-files");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    std::fs::write(
        &input,
        [
            r#"{"prompt_ids": [0, 5, 9], "max_tokens": 4}"#,
            r#"{"prompt_ids": [0, 5, 9], "max_tokens": 4, "temperature": 1.0, "seed": 3, "logprobs": true}"#,
            r#"{"prompt_ids": [0, 5, 9], "max_tokens": 4, "colour": "red"}"#,
            r#"not json"#,
            r#"{"max_tokens": 4}"#,
            r#"{"prompt_ids": [0, -1]}"#,
            "",
            r#"{"prompt_ids": [3], "max_tokens": 0}"#,
            r#"{"prompt_ids": [3], "prompt": "both"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let o = deepinfer(
        &cache,
        &[
            "run",
            "--prompts",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
        &[],
    );
    // Bad lines make the command fail, after every line's result is written.
    assert!(!o.status.success());
    assert!(stderr(&o).contains("6 of 8 requests"), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i);
    }
    assert_eq!(lines[0]["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lines[1]["logprobs"].as_array().unwrap().len(), 4);
    let err = |i: usize| lines[i]["error"].as_str().unwrap_or_default().to_string();
    assert!(
        err(2).contains("line 3") && err(2).contains("colour") && err(2).contains("unknown key"),
        "{}",
        err(2)
    );
    assert!(err(3).contains("line 4"), "{}", err(3));
    assert!(
        err(4).contains("line 5") && err(4).contains("prompt"),
        "{}",
        err(4)
    );
    assert!(
        err(5).contains("line 6") && err(5).contains("prompt_ids"),
        "{}",
        err(5)
    );
    assert!(err(6).contains("max_tokens"), "{}", err(6));
    assert!(err(7).contains("not both"), "{}", err(7));
    // The greedy request alone gives the same tokens as in the batch.
    let alone = deepinfer(&cache, &["run", "--prompt", "0,5,9", "--max-new", "4"], &[]);
    let text = String::from_utf8_lossy(&alone.stdout);
    let want: Vec<String> = lines[0]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert!(
        text.contains(&format!("output: {}", want.join(","))),
        "{text}"
    );
    // With the Engram tables in host memory (the embedded model has Engram
    // layers): the same tokens.
    let host = deepinfer(
        &cache,
        &[
            "run",
            "--prompt",
            "0,5,9",
            "--max-new",
            "4",
            "--engram-tables",
            "host",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&host.stdout);
    assert!(
        text.contains(&format!("output: {}", want.join(","))),
        "{text}\n{}",
        stderr(&host)
    );
}

#[test]
fn score_dumps_the_logits_it_scored() {
    let cache = TempDir::new("cli-score");
    let dir = TempDir::new("cli-score-files");
    let dump = dir.path().join("logits.safetensors");
    let o = deepinfer(
        &cache,
        &[
            "score",
            "--prompt",
            "0,17,42",
            "--continuation",
            "7,99,3",
            "--dump-logits",
            dump.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: Vec<f32> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .take(3)
        .map(|l| l.split('\t').nth(1).unwrap().parse().unwrap())
        .collect();
    let bytes = std::fs::read(&dump).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let logits = st.tensor("logits").unwrap();
    assert_eq!(logits.shape(), [3, 512]);
    let tokens = st.tensor("tokens").unwrap();
    assert_eq!(tokens.shape(), [3]);
    let rows: Vec<f32> = logits
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // Each printed logprob is ln softmax of its dumped row (f64, 1e-5).
    for (i, (&t, &lp)) in [7usize, 99, 3].iter().zip(&printed).enumerate() {
        let row = &rows[i * 512..(i + 1) * 512];
        let m = row.iter().fold(f64::MIN, |a, &x| a.max(f64::from(x)));
        let z: f64 = row.iter().map(|&x| (f64::from(x) - m).exp()).sum();
        let want = f64::from(row[t]) - m - z.ln();
        assert!(
            (want - f64::from(lp)).abs() < 1e-5,
            "token {t}: {want} vs {lp}"
        );
    }
}

#[test]
fn absurd_sizes_are_refused_before_allocation() {
    let cache = TempDir::new("cli-sizes");
    let none: &[(&str, &str)] = &[];
    fails_with(
        &cache,
        &["slice", "--rows", "100000000"],
        none,
        &["--rows", "4096"],
    );
    fails_with(&cache, &["slice", "--dim", "0"], none, &["--dim"]);
    fails_with(
        &cache,
        &["run", "--max-new", "18446744073709551615"],
        none,
        &["max_tokens"],
    );
    // The Why's other literal: 2e18 aborted on the allocation.
    fails_with(
        &cache,
        &["run", "--max-new", "2000000000000000000"],
        none,
        &["max_tokens", "2000000000000000000"],
    );
    let o = deepinfer(&cache, &["run", "--max-new", "18446744073709551615"], none);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("output:"),
        "no output header before the error"
    );
}

/// Issue 15 item 6: `gen-weights` states the checkpoint's total size before
/// it writes (the refusal when the file system has too little room is
/// `tests/checkpoint.rs`'s `the_generator_refuses_a_checkpoint_that_does_not_fit`).
#[test]
fn gen_weights_states_the_total_size_up_front() {
    use deepinfer::model::checkpoint::Manifest;
    use deepinfer::model::config::ModelConfig;
    let none: &[(&str, &str)] = &[];
    let cache = TempDir::new("cli-gen-size");
    let dir = TempDir::new("cli-gen-size-model");
    let out = dir.path().join("m");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny");
    let o = deepinfer(
        &cache,
        &[
            "gen-weights",
            "--config",
            config,
            "--out",
            out.to_str().unwrap(),
        ],
        none,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = Manifest::new(&ModelConfig::from_dir(config.as_ref()).unwrap()).unwrap();
    let want = format!(
        "writing {} tensors, {} bytes",
        manifest.len(),
        manifest.total_bytes()
    );
    let first = stderr(&o).lines().next().unwrap_or_default().to_string();
    assert!(
        first.starts_with(&want),
        "{first:?} does not start with {want:?}"
    );
    // Stated before the write starts: a second run into the now full
    // directory is refused by the generator, after the statement.
    let o = deepinfer(
        &cache,
        &[
            "gen-weights",
            "--config",
            config,
            "--out",
            out.to_str().unwrap(),
        ],
        none,
    );
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.starts_with(&want) && err.contains("already holds"),
        "{err}"
    );
}

/// Issue 15 item 5: a NaN weight is found by `--check-finite` (named with
/// its tensor), by default on the embedded models, and, when the load check
/// is off, by the engine at the first logits it samples from (naming the
/// position and decode step).
#[test]
fn non_finite_weights_fail_at_load_when_checked_and_at_the_logits_otherwise() {
    use deepinfer::model::config::ModelConfig;
    use deepinfer::model::engram_map::write_map;
    use deepinfer::model::load::modulo_token_map;
    let none: &[(&str, &str)] = &[];
    let cache = TempDir::new("cli-nan");
    let dir = TempDir::new("cli-nan-model");
    let model = dir.path().join("m");
    let m = model.to_str().unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny");
    let o = deepinfer(
        &cache,
        &["gen-weights", "--config", config, "--out", m, "--seed", "5"],
        none,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg = ModelConfig::from_dir(&model).unwrap();
    write_map(
        &model,
        &modulo_token_map(&cfg),
        cfg.engram.compressed_vocab,
        None,
    )
    .unwrap();
    let run = ["run", "--model", m, "--prompt", "0,5,9", "--max-new", "2"];
    let checked = [&run[..], &["--check-finite"]].concat();
    let o = deepinfer(&cache, &checked, none);
    assert!(o.status.success(), "a clean model passes: {}", stderr(&o));
    common::tiny::poison(&model, "norm.weight", 0);
    fails_with(
        &cache,
        &checked,
        none,
        &["norm.weight", "NaN or infinite", "index 0"],
    );
    // Unchecked at load, the NaN reaches the logits of the first step.
    fails_with(
        &cache,
        &run,
        none,
        &["logits", "non-finite logit", "position 3", "decode step 0"],
    );
    // The embedded default: checked without the flag.
    let o = deepinfer(&cache, &["run", "--max-new", "1"], none);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let default_dir = e
        .lines()
        .find_map(|l| l.strip_prefix("model: embedded tiny default ("))
        .and_then(|l| l.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no default model line in {e:?}"));
    common::tiny::poison(std::path::Path::new(default_dir), "norm.weight", 0);
    fails_with(&cache, &["run", "--max-new", "1"], none, &["norm.weight"]);
}
