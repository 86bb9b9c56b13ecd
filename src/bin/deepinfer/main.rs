//! The deepinfer command line. `run` (the default) is offline inference
//! through the engine (greedy or sampled, ids or text, one prompt streamed
//! or a JSONL batch) on the CPU reference model — the embedded tiny default
//! unless `--model` names a directory with a config and safetensors shards;
//! `score` gives teacher-forced log-probabilities of a continuation (and
//! dumps the logits); `slice` runs the first kernel slice on any device;
//! `info` reports the build and devices; `gen-weights` writes a
//! deterministic random-weight checkpoint.
//!
//! The same no-panic lints as the library (`src/lib.rs`).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

mod engine_args;
mod run;
mod slice;

use clap::{Parser, Subcommand};
use deepinfer::Device;
use deepinfer::model::checkpoint::{GenerateOptions, generate_from_dir};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(version, about = "deepinfer: DeepSeek-V4.1-Flash kernels and runner")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Offline generation (greedy unless a temperature is given).
    Run(run::RunArgs),
    /// Teacher-forced scoring: the log-probability of each continuation
    /// token after the prompt (the mode for comparing implementations).
    Score(run::ScoreArgs),
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

fn gen_weights(
    config: &Path,
    out: &Path,
    seed: u64,
    shard_mib: u64,
) -> deepinfer::model::Result<()> {
    let options = GenerateOptions {
        seed,
        shard_bytes: shard_mib.saturating_mul(1 << 20),
        ..GenerateOptions::default()
    };
    let cfg = deepinfer::model::config::ModelConfig::from_dir(config)?;
    let manifest = deepinfer::model::checkpoint::Manifest::new(&cfg)?;
    eprintln!(
        "writing {} tensors, {} bytes ({:.2} GiB), to {}",
        manifest.len(),
        manifest.total_bytes(),
        manifest.total_bytes() as f64 / (1u64 << 30) as f64,
        out.display()
    );
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
    // The host threads the library's parallel host work (the Engram host
    // gather) sizes itself by: the process's CPU quota, not the machine's.
    match std::thread::available_parallelism() {
        Ok(n) => println!("host threads: {n}"),
        Err(e) => println!("host threads: unknown ({e})"),
    }
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
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cmd = match Cli::parse().cmd {
        Some(c) => c,
        // No subcommand: `run` with its defaults.
        None => match Cli::try_parse_from(["deepinfer", "run"]) {
            Ok(Cli { cmd: Some(c) }) => c,
            Ok(Cli { cmd: None }) => return ExitCode::FAILURE,
            Err(e) => e.exit(),
        },
    };
    let result = match cmd {
        Cmd::Run(a) => run::run(&a),
        Cmd::Score(a) => run::score(&a),
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
