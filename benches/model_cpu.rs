//! Criterion benchmark of the CPU reference model on the tiny config:
//! prefill of a 64-token prompt and one decode step after it. For
//! information only; speed is judged on the GPU.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer::model::runner::default_model;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let model = default_model().expect("the embedded default model loads");
    let prompt: Vec<u32> = (0..64u32)
        .map(|i| (i * 37 + 11) % model.cfg.vocab_size as u32)
        .collect();
    let mut g = c.benchmark_group("model_cpu_tiny");
    g.throughput(Throughput::Elements(prompt.len() as u64));
    g.bench_function("prefill_64", |b| {
        b.iter(|| {
            model
                .forward(black_box(&prompt), &mut model.new_state())
                .expect("valid prompt")
        })
    });
    let mut state = model.new_state();
    model.forward(&prompt, &mut state).expect("valid prompt");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_1_after_64", |b| {
        b.iter(|| {
            model
                .forward(black_box(&[5]), &mut state.clone())
                .expect("valid token")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
