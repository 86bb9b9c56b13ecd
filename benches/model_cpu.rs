//! Criterion benchmark of the CPU reference model on the tiny config,
//! through the op API and the paged pool: prefill of a 64-token prompt,
//! one decode step after it (batch 1), and one batched decode step of 8
//! sequences after 64 tokens each (batch 8). Each decode sample starts from
//! a fork of the prefilled sequences (the fork is not timed), so the
//! context stays at 64. For information only; speed is judged on the GPU.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer::model::forward::{Capture, SeqInput};
use deepinfer::model::pool::{PoolConfig, StatePool};
use deepinfer::model::runner::{DefaultModel, default_model};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn bench(c: &mut Criterion) {
    let model = default_model(DefaultModel::Tiny).expect("the embedded default model loads");
    let prompt: Vec<u32> = (0..64u32)
        .map(|i| (i * 37 + 11) % model.cfg.vocab_size as u32)
        .collect();
    let pc = PoolConfig::fitting(&model.cfg, 17, 128, 64, 64).expect("pool sizes");
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
    let tok = [5u32];
    for n in [1usize, 8] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("decode_batch{n}_after_64"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let forks: Vec<_> = seqs[..n]
                        .iter()
                        .map(|&s| pool.fork(s).expect("room for the forks"))
                        .collect();
                    let inputs: Vec<SeqInput> = forks
                        .iter()
                        .map(|&seq| SeqInput { seq, tokens: &tok })
                        .collect();
                    let t = Instant::now();
                    let out = model.step(&mut pool, &inputs, Capture::default());
                    total += t.elapsed();
                    black_box(out.expect("valid batch"));
                    for f in forks {
                        pool.free_sequence(f).expect("live fork");
                    }
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
