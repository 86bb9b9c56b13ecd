//! Inputs of the sparse MQA tests: encoded row pools, index lists mixing
//! valid rows, −1, duplicates and out-of-range numbers, and the reference
//! over the whole decoded pools.

use deepinfer::cpu_backend::{kv_format, sparse_attention};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// `n` window rows (528 bytes at d 512) of activations of scale `s`.
pub fn window_pool(rng: &mut StdRng, n: usize, d: usize, s: f32) -> Vec<u8> {
    super::random_activations(rng, n * d, s)
        .chunks_exact(d)
        .flat_map(kv_format::encode_window_row)
        .collect()
}

/// `n` compressed rows (288 bytes at d 512) of activations of scale `s`.
pub fn compressed_pool(rng: &mut StdRng, n: usize, d: usize, s: f32) -> Vec<u8> {
    super::random_activations(rng, n * d, s)
        .chunks_exact(d)
        .flat_map(kv_format::encode_compressed_row)
        .collect()
}

/// `t` lists of `k` entries into a pool of `n` rows: mostly valid rows, with
/// −1 runs, duplicates of earlier entries and out-of-range numbers (n,
/// n + 1000, i32::MAX, i32::MIN, −7) mixed in at rate `holes`.
pub fn index_lists(rng: &mut StdRng, t: usize, k: usize, n: usize, holes: f64) -> Vec<i32> {
    let mut v = Vec::with_capacity(t * k);
    for _ in 0..t {
        let start = v.len();
        for j in 0..k {
            let r: f64 = rng.random();
            let e = if n == 0 || r < holes * 0.5 {
                -1
            } else if r < holes * 0.7 {
                let bad = [
                    n as i64,
                    n as i64 + 1000,
                    i32::MAX as i64,
                    i32::MIN as i64,
                    -7,
                ];
                bad[rng.random_range(0..bad.len())].clamp(i32::MIN as i64, i32::MAX as i64) as i32
            } else if r < holes && j > 0 {
                v[start + rng.random_range(0..j)]
            } else {
                rng.random_range(0..n) as i32
            };
            v.push(e);
        }
    }
    v
}

/// The definition: `sparse_attention::sparse_mqa` of each query over the
/// decoded rows `[window ‖ compressed]`, compressed entries offset by the
/// window row count, out-of-range entries −1. Returns (out, lse).
#[allow(clippy::too_many_arguments)]
pub fn reference(
    q: &[bf16],
    window: &[u8],
    widx: &[i32],
    compressed: &[u8],
    cidx: &[i32],
    sink: &[f32],
    t: usize,
    d: usize,
) -> (Vec<bf16>, Vec<f32>) {
    let h = sink.len();
    let (wb, cb) = (
        kv_format::window_row_bytes(d),
        kv_format::compressed_row_bytes(d),
    );
    let (nw, nc) = (window.len() / wb, compressed.len() / cb);
    let mut rows: Vec<bf16> = window
        .chunks_exact(wb)
        .flat_map(|r| kv_format::decode_window_row(r, d))
        .collect();
    rows.extend(
        compressed
            .chunks_exact(cb)
            .flat_map(|r| kv_format::decode_compressed_row(r, d)),
    );
    let (kw, kc) = (widx.len() / t.max(1), cidx.len() / t.max(1));
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for i in 0..t {
        let list: Vec<i32> = widx[i * kw..(i + 1) * kw]
            .iter()
            .map(|&e| if e >= 0 && (e as usize) < nw { e } else { -1 })
            .chain(cidx[i * kc..(i + 1) * kc].iter().map(|&e| {
                if e >= 0 && (e as usize) < nc {
                    e + nw as i32
                } else {
                    -1
                }
            }))
            .collect();
        let r = sparse_attention::sparse_mqa(&q[i * h * d..(i + 1) * h * d], &rows, &list, sink, d);
        out.extend(r.out);
        lse.extend(r.lse);
    }
    (out, lse)
}
