//! `deepinfer slice`: the first vertical slice (RMSNorm with eps 1e-20, then
//! the FP8 1×32 activation quantiser) on a small deterministic input, on any
//! device; the GPU bundle runs it on the H200.

use deepinfer::numerics::{e4m3_to_f32, e8m0_to_f32};
use deepinfer::{Device, E4M3, E8M0, Tensor, ops};
use half::bf16;

fn input(rows: usize, dim: usize) -> deepinfer::Result<(Tensor, Tensor)> {
    // A fixed pseudo-random input so the main job's output is reproducible.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // The top 24 bits: exact in f32, and state >> 40 always fits a u32.
        u32::try_from(state >> 40).map_or(0.0, |v| v as f32) / (1u32 << 24) as f32 * 2.0 - 1.0
    };
    let x: Vec<bf16> = (0..rows * dim)
        .map(|_| bf16::from_f32(next() * 3.0))
        .collect();
    let w: Vec<bf16> = (0..dim)
        .map(|_| bf16::from_f32(1.0 + 0.1 * next()))
        .collect();
    Ok((
        Tensor::from_vec(x, &[rows, dim])?,
        Tensor::from_vec(w, &[dim])?,
    ))
}

/// The slice prints every row: more than this is not a demo but a mistake.
const MAX_ROWS: usize = 4096;
/// RMSNorm's widest row (V4.1: 5120).
const MAX_DIM: usize = 1 << 16;

pub fn run(device: &str, rows: usize, dim: usize) -> deepinfer::Result<()> {
    let device: Device = device.parse()?;
    for (arg, value, max) in [("--rows", rows, MAX_ROWS), ("--dim", dim, MAX_DIM)] {
        if value == 0 || value > max {
            return Err(deepinfer::Error::Argument {
                op: "deepinfer slice",
                arg,
                value: value.to_string(),
                why: if arg == "--rows" {
                    "must be in 1..=4096 (the slice prints every row)"
                } else {
                    "must be in 1..=65536"
                },
            });
        }
    }
    let (x, w) = input(rows, dim)?;
    let (x, w) = (x.to_device(&device)?, w.to_device(&device)?);
    let y = ops::rms_norm(&x, &w, 1e-20)?;
    let (q, s) = ops::act_quant_fp8(&y)?;
    let y = y.to_vec::<bf16>()?;
    let q = q.to_vec::<E4M3>()?;
    let s = s.to_vec::<E8M0>()?;
    println!("deepinfer slice on {device}: rms_norm(eps=1e-20) -> act_quant_fp8, {rows}x{dim}");
    let blocks = dim.div_ceil(32);
    let rows_of = y
        .chunks_exact(dim)
        .zip(q.chunks_exact(dim))
        .zip(s.chunks_exact(blocks));
    for (r, ((yr, qr), sr)) in rows_of.enumerate() {
        let ms: f64 = yr.iter().map(|v| (v.to_f64()).powi(2)).sum::<f64>() / dim as f64;
        let err = yr
            .iter()
            .zip(qr)
            .zip(sr.iter().flat_map(|&b| std::iter::repeat_n(b, 32)))
            .map(|((yv, &qv), sv)| {
                let deq = e4m3_to_f32(qv) * e8m0_to_f32(sv);
                (deq - yv.to_f32()).abs() / yv.to_f32().abs().max(1e-3)
            })
            .fold(0.0f32, f32::max);
        println!(
            "row {r}: mean(y^2) = {ms:.4}, first scales = 2^{:?}, max rel dequant error = {err:.4}",
            sr.iter()
                .take(4)
                .map(|e| i32::from(e.0) - 127)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}
