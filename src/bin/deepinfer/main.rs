//! The deepinfer command line. `run` (the default) is offline inference
//! (greedy or sampled, through the engine) on the CPU reference model — the embedded tiny default unless `--model`
//! names a directory with a config and safetensors shards; `score` gives
//! teacher-forced log-probabilities of a continuation; `slice` runs the
//! first kernel slice on any device; `info` reports the build and devices;
//! `gen-weights` writes a deterministic random-weight checkpoint.

mod slice;

use clap::{Parser, Subcommand};
use deepinfer::engine::{Engine, EngineConfig, MAX_CONTEXT, SamplingParams};
use deepinfer::model::checkpoint::{GenerateOptions, generate_from_dir};
use deepinfer::model::runner::{default_model, default_model_dir, load_model, resolve_model};
use deepinfer::{Device, Error};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(version, about = "deepinfer: DeepSeek-V4.1-Flash kernels and runner")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

/// The default prompt: BOS then a fixed run of token ids.
const DEFAULT_PROMPT: &str = "0,17,42,7,99,3,250,11,64,5,128,31";

#[derive(Subcommand)]
enum Cmd {
    /// Offline generation on the CPU reference model (greedy unless a
    /// temperature is given).
    Run {
        /// Model directory (config + shards) or `hf:ORG/NAME[@REV]` in the
        /// Hugging Face cache; default: `$DEEPINFER_HF_MODEL_DIR`, else the
        /// embedded tiny model.
        #[arg(long)]
        model: Option<String>,
        /// Comma-separated prompt token ids.
        #[arg(long, default_value = DEFAULT_PROMPT)]
        prompt: String,
        /// Tokens to generate.
        #[arg(long, default_value_t = 32)]
        max_new: usize,
        /// Sampling temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Nucleus mass in (0, 1].
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Candidates kept by logit; 0 keeps all.
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// The request's seed (same seed, same tokens).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Scan every weight for NaN/±Inf before running (always on for the
        /// embedded default model).
        #[arg(long)]
        check_finite: bool,
    },
    /// Teacher-forced scoring: the log-probability of each continuation
    /// token after the prompt (the mode for comparing implementations).
    Score {
        /// As for `run`.
        #[arg(long)]
        model: Option<String>,
        /// Comma-separated prompt token ids.
        #[arg(long, default_value = DEFAULT_PROMPT)]
        prompt: String,
        /// Comma-separated continuation token ids.
        #[arg(long)]
        continuation: String,
        /// Temperature of the scored distribution.
        #[arg(long, default_value_t = 1.0)]
        temperature: f32,
    },
    /// Run the RMSNorm → FP8 quantiser slice on a small input.
    Slice {
        /// cpu, cuda[:N] or ascend[:N].
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Rows (tokens).
        #[arg(long, default_value_t = 4)]
        rows: usize,
        /// Hidden width (V4.1: 5120).
        #[arg(long, default_value_t = 5120)]
        dim: usize,
    },
    /// Print the build's accelerator, kernel families and visible devices.
    Info,
    /// Write a deterministic random-weight checkpoint (official format) for
    /// the config in a model directory, with its config files beside it.
    GenWeights {
        /// Directory holding config.json and/or inference-config.json.
        #[arg(long)]
        config: PathBuf,
        /// Output directory (created; must hold no *.safetensors yet).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Shard size limit in MiB.
        #[arg(long, default_value_t = 4096)]
        shard_mib: u64,
    },
}

/// Comma-separated token ids, or a typed error naming the bad one.
fn parse_ids(arg: &'static str, text: &str) -> deepinfer::model::Result<Vec<u32>> {
    Ok(text
        .split(',')
        .map(|t| {
            t.trim().parse().map_err(|_| Error::Argument {
                op: "deepinfer",
                arg,
                value: t.into(),
                why: "expected comma-separated token ids",
            })
        })
        .collect::<Result<_, _>>()?)
}

fn load(
    model: Option<&str>,
    check_finite: bool,
) -> deepinfer::model::Result<deepinfer::model::forward::Model> {
    match resolve_model(model)? {
        Some(dir) => load_model(&dir, check_finite),
        None => {
            eprintln!(
                "model: embedded tiny default ({})",
                default_model_dir().display()
            );
            default_model()
        }
    }
}

fn score(
    model: Option<&str>,
    prompt: &str,
    continuation: &str,
    temperature: f32,
) -> deepinfer::model::Result<()> {
    let prompt = parse_ids("prompt", prompt)?;
    let continuation = parse_ids("continuation", continuation)?;
    let model = load(model, false)?;
    let engine = Engine::new(model, EngineConfig::default());
    let lp = engine.score(&prompt, &continuation, temperature)?;
    for (t, l) in continuation.iter().zip(&lp) {
        println!("{t}\t{l}");
    }
    println!("sum\t{}", lp.iter().map(|&l| f64::from(l)).sum::<f64>());
    Ok(())
}

fn run(
    model: Option<&str>,
    check_finite: bool,
    prompt: &str,
    sampling: SamplingParams,
) -> deepinfer::model::Result<()> {
    let prompt = parse_ids("prompt", prompt)?;
    let model = load(model, check_finite)?;
    let sampling = SamplingParams {
        stop: vec![model.cfg.tokens.eos],
        ..sampling
    };
    let engine = Engine::new(
        model,
        EngineConfig {
            max_seqs: 1,
            max_context: prompt
                .len()
                .saturating_add(sampling.max_tokens)
                .saturating_add(1)
                .min(MAX_CONTEXT),
            ..EngineConfig::default()
        },
    );
    let out = engine
        .generate(std::slice::from_ref(&prompt), &[sampling])
        .remove(0)?;
    let secs = |d: std::time::Duration| d.as_secs_f64().max(1e-9);
    println!("prompt ({} tokens): {prompt:?}", prompt.len());
    println!("generated ({} tokens): {:?}", out.tokens.len(), out.tokens);
    println!(
        "prefill {:.1} tokens/s, decode {:.1} tokens/s (CPU reference backend)",
        prompt.len() as f64 / secs(out.prefill),
        out.tokens.len().saturating_sub(1) as f64 / secs(out.decode)
    );
    Ok(())
}

fn gen_weights(
    config: &Path,
    out: &Path,
    seed: u64,
    shard_mib: u64,
) -> deepinfer::model::Result<()> {
    let options = GenerateOptions {
        seed,
        shard_bytes: shard_mib.saturating_mul(1 << 20),
    };
    let generated = generate_from_dir(config, out, &options)?;
    println!(
        "wrote {} tensors ({} bytes) in {} shard(s) to {}",
        generated.tensors,
        generated.bytes,
        generated.shards.len(),
        out.display()
    );
    Ok(())
}

fn info() {
    println!("accelerator: {}", deepinfer::ACCELERATOR);
    for f in deepinfer::kernels::FAMILIES {
        println!(
            "family {}: {} bytes, archs {:?}, kernels {:?}",
            f.name,
            f.image.len(),
            f.archs,
            f.kernels
        );
    }
    match Device::cuda(0) {
        Ok(Device::Cuda(d)) => println!(
            "cuda:0: {} (sm_{:?})",
            d.name().unwrap_or_default(),
            d.compute_capability().ok()
        ),
        Ok(_) => {}
        Err(e) => println!("cuda: {e}"),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let result = match Cli::parse().cmd.unwrap_or(Cmd::Run {
        model: None,
        prompt: DEFAULT_PROMPT.into(),
        max_new: 32,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
        check_finite: false,
    }) {
        Cmd::Run {
            model,
            prompt,
            max_new,
            temperature,
            top_p,
            top_k,
            seed,
            check_finite,
        } => run(
            model.as_deref(),
            check_finite,
            &prompt,
            SamplingParams {
                temperature,
                top_p,
                top_k,
                max_tokens: max_new,
                seq_seed: seed,
                ..SamplingParams::default()
            },
        ),
        Cmd::Score {
            model,
            prompt,
            continuation,
            temperature,
        } => score(model.as_deref(), &prompt, &continuation, temperature),
        Cmd::Slice { device, rows, dim } => slice::run(&device, rows, dim).map_err(Into::into),
        Cmd::Info => {
            info();
            Ok(())
        }
        Cmd::GenWeights {
            config,
            out,
            seed,
            shard_mib,
        } => gen_weights(&config, &out, seed, shard_mib),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
