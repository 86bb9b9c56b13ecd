//! Ratio-2 pooling against an f64 evaluation of §3.4, and the partial-group
//! state: prefill-style pooling of a whole sequence equals pushing the same
//! tokens one at a time, odd lengths included.

mod common;

use deepinfer::cpu_backend::compressor::{Ratio2State, pool_ratio2};
use half::bf16;
use rand::Rng;

fn rand_vec(rng: &mut rand::rngs::StdRng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-s..s)).collect()
}

#[test]
fn pooling_is_a_per_channel_two_token_softmax() {
    let mut rng = common::rng("pool");
    let c = 512;
    let (k0, k1) = (rand_vec(&mut rng, c, 3.0), rand_vec(&mut rng, c, 3.0));
    let (s0, s1) = (rand_vec(&mut rng, c, 40.0), rand_vec(&mut rng, c, 40.0));
    let e = pool_ratio2([&k0, &k1], [&s0, &s1]);
    for i in 0..c {
        let (a, b) = (s0[i] as f64, s1[i] as f64);
        let w0 = 1.0 / (1.0 + (b - a).exp());
        let want = w0 * k0[i] as f64 + (1.0 - w0) * k1[i] as f64;
        // The fp32 softmax weights carry a few ulps (exp, division) before the
        // two products are summed.
        let terms = (w0 * k0[i] as f64).abs() + ((1.0 - w0) * k1[i] as f64).abs();
        assert!(common::bf16_close(e[i], want, terms, 8), "channel {i}");
    }
}

#[test]
fn streaming_tokens_one_by_one_matches_whole_groups() {
    let mut rng = common::rng("pool_state");
    let c = 64;
    for len in [1usize, 2, 7, 10] {
        let kv: Vec<Vec<f32>> = (0..len).map(|_| rand_vec(&mut rng, c, 2.0)).collect();
        let sc: Vec<Vec<f32>> = (0..len).map(|_| rand_vec(&mut rng, c, 5.0)).collect();
        let whole: Vec<Vec<bf16>> = (0..len / 2)
            .map(|j| pool_ratio2([&kv[2 * j], &kv[2 * j + 1]], [&sc[2 * j], &sc[2 * j + 1]]))
            .collect();
        let mut state = Ratio2State::default();
        let streamed: Vec<Vec<bf16>> = (0..len)
            .filter_map(|t| state.push(kv[t].clone(), sc[t].clone()))
            .collect();
        assert_eq!(streamed, whole, "len {len}");
        assert_eq!(state.has_pending(), len % 2 == 1);
    }
}
