//! Criterion benchmark of the CPU reference model on the tiny config,
//! through the op API and the paged pool: prefill of a 64-token prompt,
//! one decode step after it (batch 1), and one batched decode step of 8
//! sequences after 64 tokens each (batch 8). For information only; speed is
//! judged on the GPU.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer::model::forward::{Capture, SeqInput};
use deepinfer::model::pool::{PoolConfig, StatePool};
use deepinfer::model::runner::default_model;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let model = default_model().expect("the embedded default model loads");
    let prompt: Vec<u32> = (0..64u32)
        .map(|i| (i * 37 + 11) % model.cfg.vocab_size as u32)
        .collect();
    let pc = PoolConfig::fitting(&model.cfg, 9, 1 << 16, 64, 64).expect("pool sizes");
    let mut pool = StatePool::new(&model.cfg, &model.device(), pc).expect("pool");
    let mut g = c.benchmark_group("model_cpu_tiny");
    g.sample_size(10);
    g.throughput(Throughput::Elements(prompt.len() as u64));
    g.bench_function("prefill_64", |b| {
        b.iter(|| {
            let s = pool.add_sequence().expect("a free slot");
            let out = model
                .forward(&mut pool, s, black_box(&prompt))
                .expect("valid prompt");
            pool.free_sequence(s).expect("live sequence");
            out
        })
    });
    let seqs: Vec<_> = (0..8)
        .map(|_| {
            let s = pool.add_sequence().expect("a free slot");
            model.forward(&mut pool, s, &prompt).expect("valid prompt");
            s
        })
        .collect();
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_batch1_after_64", |b| {
        b.iter(|| {
            model
                .forward(&mut pool, seqs[0], black_box(&[5]))
                .expect("valid token")
        })
    });
    let tok = [5u32];
    let inputs: Vec<SeqInput> = seqs
        .iter()
        .map(|&seq| SeqInput { seq, tokens: &tok })
        .collect();
    g.throughput(Throughput::Elements(8));
    g.bench_function("decode_batch8_after_64", |b| {
        b.iter(|| {
            model
                .step(&mut pool, black_box(&inputs), Capture::default())
                .expect("valid batch")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
