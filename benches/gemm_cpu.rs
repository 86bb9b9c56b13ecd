//! Criterion benchmark of the CPU GEMM references through the op API: the
//! FP8 dense linear at V4.1's `wkv` shape (512 × 5120) for decode-size M,
//! the FP4-expert grouped linears (contiguous and masked) on a few small
//! experts, and the BF16 linear. The CPU backend is the oracle, not a fast
//! path; this tracks that it stays usable for the tests and the main job.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer::{DType, E4M3, E8M0, Fp4x2, Tensor, ops};
use half::bf16;
use std::hint::black_box;

fn t<T: deepinfer::dtype::Element>(n: usize, shape: &[usize], f: impl Fn(usize) -> T) -> Tensor {
    Tensor::from_vec((0..n).map(f).collect(), shape).expect("shape")
}

fn fp8(i: usize) -> E4M3 {
    E4M3(((i * 7919) % 251) as u8 & 0xBF)
}

fn scale(i: usize) -> E8M0 {
    E8M0(120 + (i % 11) as u8)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm_cpu");
    let (n, k) = (512, 5120);
    let kb = k / 32;
    let w = t(n * k, &[n, k], fp8);
    let w_s = t(n / 32 * kb, &[n / 32, kb], scale);
    for m in [1usize, 8] {
        let a = t(m * k, &[m, k], fp8);
        let a_s = t(m * kb, &[m, kb], scale);
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        g.bench_function(format!("mxfp8_linear/{m}x{n}x{k}"), |b| {
            b.iter(|| ops::mxfp8_linear(black_box(&a), &a_s, &w, &w_s, DType::BF16).expect("valid"))
        });
    }

    let (e, per, n, k) = (4, 8, 256, 1024);
    let kb = k / 32;
    let w = t(e * n * k / 2, &[e, n, k], |i| Fp4x2((i * 131) as u8));
    let w_s = t(e * n * kb, &[e, n, kb], scale);
    let a = t(e * per * k, &[e * per, k], fp8);
    let a_s = t(e * per * kb, &[e * per, kb], scale);
    let offsets = t(e + 1, &[e + 1], |x| (x * per) as i32);
    g.throughput(Throughput::Elements((2 * e * per * n * k) as u64));
    g.bench_function(format!("mxfp4_grouped_contiguous/{e}x{per}x{n}x{k}"), |b| {
        b.iter(|| {
            ops::mxfp4_grouped_contiguous(black_box(&a), &a_s, &w, &w_s, &offsets, DType::BF16)
                .expect("valid")
        })
    });
    let a3 = t(e * per * k, &[e, per, k], fp8);
    let a3_s = t(e * per * kb, &[e, per, kb], scale);
    let counts = t(e, &[e], |_| per as i32);
    g.bench_function(format!("mxfp4_grouped_masked/{e}x{per}x{n}x{k}"), |b| {
        b.iter(|| {
            ops::mxfp4_grouped_masked(black_box(&a3), &a3_s, &w, &w_s, &counts, DType::BF16)
                .expect("valid")
        })
    });

    let (m, n, k) = (8, 512, 2048);
    let a = t(m * k, &[m, k], |i| {
        bf16::from_f32(((i * 7919) % 2001) as f32 / 500.0 - 2.0)
    });
    let w = t(n * k, &[n, k], |i| {
        bf16::from_f32(((i * 104729) % 2001) as f32 / 5e4 - 0.02)
    });
    g.throughput(Throughput::Elements((2 * m * n * k) as u64));
    g.bench_function(format!("bf16_linear/{m}x{n}x{k}"), |b| {
        b.iter(|| ops::bf16_linear(black_box(&a), &w, DType::F32).expect("valid"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
