//! Criterion benchmark of the CPU reference slice (RMSNorm, FP8 1×32
//! quantiser) at V4.1's hidden width. The CPU backend is the oracle, not a
//! fast path; this tracks that it stays usable for the tests and the main job.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer::{Tensor, ops};
use half::bf16;
use std::hint::black_box;

fn input(rows: usize, dim: usize) -> Tensor {
    let v: Vec<bf16> = (0..rows * dim)
        .map(|i| bf16::from_f32(((i * 7919) % 2001) as f32 / 500.0 - 2.0))
        .collect();
    Tensor::from_vec(v, &[rows, dim]).expect("shape")
}

fn bench(c: &mut Criterion) {
    let dim = 5120;
    let w = Tensor::from_vec(vec![bf16::ONE; dim], &[dim]).expect("shape");
    let mut g = c.benchmark_group("slice_cpu");
    for rows in [1usize, 64] {
        let x = input(rows, dim);
        g.throughput(Throughput::Bytes((4 * rows * dim) as u64));
        g.bench_function(format!("rms_norm/{rows}x{dim}"), |b| {
            b.iter(|| ops::rms_norm(black_box(&x), &w, 1e-20).expect("valid"))
        });
        g.throughput(Throughput::Bytes((3 * rows * dim + rows * dim / 32) as u64));
        g.bench_function(format!("act_quant_fp8/{rows}x{dim}"), |b| {
            b.iter(|| ops::act_quant_fp8(black_box(&x)).expect("valid"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
