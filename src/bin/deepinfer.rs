//! The deepinfer command line. Until the V4.1 model runner lands, `run`
//! executes the first vertical slice (RMSNorm with eps 1e-20, then the FP8
//! 1×32 activation quantiser) on a small deterministic input, on the CPU by
//! default, `info` reports the build and the devices, and `gen-weights`
//! writes a deterministic random-weight checkpoint for a model config.

use clap::{Parser, Subcommand};
use deepinfer::model::checkpoint::{GenerateOptions, generate_from_dir};
use deepinfer::numerics::{e4m3_to_f32, e8m0_to_f32};
use deepinfer::{Device, E4M3, E8M0, Tensor, ops};
use half::bf16;
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
    /// Run the RMSNorm → FP8 quantiser slice on a small input.
    Run {
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

fn input(rows: usize, dim: usize) -> (Tensor, Tensor) {
    // A fixed pseudo-random input so the main job's output is reproducible.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let x: Vec<bf16> = (0..rows * dim)
        .map(|_| bf16::from_f32(next() * 3.0))
        .collect();
    let w: Vec<bf16> = (0..dim)
        .map(|_| bf16::from_f32(1.0 + 0.1 * next()))
        .collect();
    (
        Tensor::from_vec(x, &[rows, dim]).expect("shape matches"),
        Tensor::from_vec(w, &[dim]).expect("shape matches"),
    )
}

fn run(device: &str, rows: usize, dim: usize) -> deepinfer::Result<()> {
    let device: Device = device.parse()?;
    let (x, w) = input(rows, dim);
    let (x, w) = (x.to_device(&device)?, w.to_device(&device)?);
    let y = ops::rms_norm(&x, &w, 1e-20)?;
    let (q, s) = ops::act_quant_fp8(&y)?;
    let y = y.to_vec::<bf16>()?;
    let q = q.to_vec::<E4M3>()?;
    let s = s.to_vec::<E8M0>()?;
    println!("deepinfer slice on {device}: rms_norm(eps=1e-20) -> act_quant_fp8, {rows}x{dim}");
    let blocks = dim.div_ceil(32);
    for r in 0..rows {
        let yr = &y[r * dim..(r + 1) * dim];
        let ms: f64 = yr.iter().map(|v| (v.to_f64()).powi(2)).sum::<f64>() / dim as f64;
        let err = (0..dim)
            .map(|i| {
                let deq = e4m3_to_f32(q[r * dim + i]) * e8m0_to_f32(s[r * blocks + i / 32]);
                (deq - yr[i].to_f32()).abs() / yr[i].to_f32().abs().max(1e-3)
            })
            .fold(0.0f32, f32::max);
        println!(
            "row {r}: mean(y^2) = {ms:.4}, first scales = 2^{:?}, max rel dequant error = {err:.4}",
            s[r * blocks..r * blocks + blocks.min(4)]
                .iter()
                .map(|e| e.0 as i32 - 127)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}

fn gen_weights(config: &Path, out: &Path, seed: u64, shard_mib: u64) -> deepinfer::Result<()> {
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
    match Cli::parse().cmd.unwrap_or(Cmd::Run {
        device: "cpu".into(),
        rows: 4,
        dim: 5120,
    }) {
        Cmd::Run { device, rows, dim } => match run(&device, rows, dim) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Info => {
            info();
            ExitCode::SUCCESS
        }
        Cmd::GenWeights {
            config,
            out,
            seed,
            shard_mib,
        } => match gen_weights(&config, &out, seed, shard_mib) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
