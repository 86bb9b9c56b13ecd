//! Sparse MQA reference against an exact f64 softmax with sink, and the
//! window index lists against the examples the spec's rules give (§3.3).

mod common;

use deepinfer::cpu_backend::sparse_attention::*;
use deepinfer::numerics::calc_diff;
use half::bf16;
use rand::Rng;

#[test]
fn prefill_window_lists_follow_the_causal_window() {
    // window 4, prompt of 5: query p sees max(0, p-3)..=p, trailing -1 while filling.
    let want: [&[i32]; 5] = [
        &[0, -1, -1, -1],
        &[0, 1, -1, -1],
        &[0, 1, 2, -1],
        &[0, 1, 2, 3],
        &[1, 2, 3, 4],
    ];
    for (p, w) in want.iter().enumerate() {
        assert_eq!(window_indices_prefill(p, 5, 4), *w, "p = {p}");
    }
    assert_eq!(
        window_indices_prefill(1, 2, 4),
        vec![0, 1],
        "a short prompt lists min(S, window) entries"
    );
}

#[test]
fn decode_window_lists_are_oldest_first_ring_slots() {
    assert_eq!(window_indices_decode(0, 4), vec![-1, -1, -1, 0]);
    assert_eq!(window_indices_decode(2, 4), vec![-1, 0, 1, 2]);
    assert_eq!(window_indices_decode(5, 4), vec![2, 3, 0, 1]);
    assert_eq!(window_indices_decode(131, 128).len(), 128);
    assert_eq!(
        window_indices_decode(131, 128)[0],
        4,
        "slot (p mod w) + 1 is the oldest"
    );
}

fn exact(q: &[bf16], rows: &[bf16], idx: &[i32], sink: &[f32], dim: usize) -> Vec<f64> {
    let scale = 1.0 / (dim as f64).sqrt();
    let mut out = Vec::new();
    for (h, qh) in q.chunks(dim).enumerate() {
        let live: Vec<usize> = idx
            .iter()
            .filter(|&&i| i >= 0)
            .map(|&i| i as usize)
            .collect();
        let s: Vec<f64> = live
            .iter()
            .map(|&i| {
                qh.iter()
                    .zip(&rows[i * dim..(i + 1) * dim])
                    .map(|(a, b)| a.to_f64() * b.to_f64())
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().copied().fold(sink[h] as f64, f64::max);
        let denom = s.iter().map(|x| (x - m).exp()).sum::<f64>() + (sink[h] as f64 - m).exp();
        for d in 0..dim {
            out.push(
                live.iter()
                    .zip(&s)
                    .map(|(&i, x)| (x - m).exp() * rows[i * dim + d].to_f64())
                    .sum::<f64>()
                    / denom,
            );
        }
    }
    out
}

#[test]
fn attention_matches_an_exact_softmax_with_sink() {
    let mut rng = common::rng("sparse_mqa");
    let (heads, dim, n_rows) = (8, 64, 300);
    for n_idx in [1usize, 63, 64, 65, 200] {
        let q = common::random_activations(&mut rng, heads * dim, 1.0);
        let rows = common::random_activations(&mut rng, n_rows * dim, 1.0);
        let sink: Vec<f32> = (0..heads).map(|_| rng.random_range(-3.0..3.0)).collect();
        let idx: Vec<i32> = (0..n_idx)
            .map(|_| {
                if rng.random::<f32>() < 0.1 {
                    -1
                } else {
                    rng.random_range(0..n_rows as i32)
                }
            })
            .collect();
        let got = sparse_mqa(&q, &rows, &idx, &sink, dim);
        let want = exact(&q, &rows, &idx, &sink, dim);
        // BF16 probabilities (rel. error 2^-9) and a BF16 output: ~1e-6.
        let diff = calc_diff(&common::to_f64(&got.out), &want);
        assert!(diff < 1e-5, "n_idx {n_idx}: calc_diff {diff}");
        assert_eq!(got.lse.len(), heads);
    }
}

#[test]
fn an_all_minus_one_list_gives_zeros() {
    let (heads, dim) = (4, 32);
    let q = vec![bf16::ONE; heads * dim];
    let rows = vec![bf16::from_f32(f32::NAN); 2 * dim];
    let got = sparse_mqa(&q, &rows, &[-1; 70], &[0.5; 4], dim);
    assert!(
        got.out.iter().all(|v| v.to_f32() == 0.0),
        "zeros, and the NaN rows were never read"
    );
    let empty = sparse_mqa(&q, &rows, &[], &[0.5; 4], dim);
    assert!(empty.out.iter().all(|v| v.to_f32() == 0.0));
}

#[test]
fn the_sink_only_enters_the_denominator() {
    let mut rng = common::rng("sink");
    let (heads, dim) = (2, 32);
    let q = common::random_activations(&mut rng, heads * dim, 1.0);
    let rows = common::random_activations(&mut rng, 10 * dim, 1.0);
    let idx: Vec<i32> = (0..10).collect();
    let no_sink = sparse_mqa(&q, &rows, &idx, &[-1e4, -1e4], dim);
    let strong = sparse_mqa(&q, &rows, &idx, &[30.0, 30.0], dim);
    let norm = |v: &[bf16]| v.iter().map(|x| x.to_f64().abs()).sum::<f64>();
    assert!(
        norm(&strong.out) < 1e-6 * norm(&no_sink.out).max(1.0),
        "a dominant sink drives the output to zero"
    );
    assert!(strong.lse.iter().all(|&l| (l - 30.0).abs() < 1e-3));
}
