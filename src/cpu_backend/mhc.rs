//! Single-pass mHC reference (`v41-flash.md` §6): the 24 mixes of one
//! sublayer from its 4 × D residual streams, the pre/post/comb split with the
//! 20-iteration Sinkhorn in the spec's exact operation order, the collapse
//! with a (lagged) pre, and the expand. All arithmetic is fp32 in a fixed,
//! documented order; streams and sublayer outputs are BF16.
//!
//! Invariant: `streams` is stream-major (stream 0's D values, then stream
//! 1's, …), `hc_fn` is `[24, 4·D]` row-major fp32.

use crate::numerics::{exp, sigmoid};
use half::bf16;

pub use crate::contract::{HC_MIXES, HC_STREAMS, ONE_HOT_PRE};

/// The split of one sublayer's mixes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcSplit {
    pub pre: [f32; HC_STREAMS],
    pub post: [f32; HC_STREAMS],
    /// `comb[j][k]`: from source stream j to destination stream k, after Sinkhorn.
    pub comb: [[f32; HC_STREAMS]; HC_STREAMS],
}

/// m = (hc_fn · S) · 1/√(mean(S²) + eps): each row's dot product and the
/// sum of squares are accumulated in fp32 in index order.
pub fn hc_mixes(streams: &[bf16], hc_fn: &[f32], eps: f32) -> [f32; HC_MIXES] {
    let s: Vec<f32> = streams.iter().map(|v| v.to_f32()).collect();
    let sum_sq: f32 = s.iter().map(|v| v * v).sum();
    let inv_rms = 1.0 / (sum_sq / s.len() as f32 + eps).sqrt();
    let mut m = [0.0f32; HC_MIXES];
    for (mi, row) in m.iter_mut().zip(hc_fn.chunks_exact(s.len())) {
        let dot: f32 = row.iter().zip(&s).map(|(w, x)| w * x).sum();
        *mi = dot * inv_rms;
    }
    m
}

/// Splits the mixes with `scale` (3) and `base` (24), then runs Sinkhorn on comb.
pub fn hc_split(
    m: &[f32; HC_MIXES],
    scale: &[f32; 3],
    base: &[f32; HC_MIXES],
    hc_eps: f32,
    iters: usize,
) -> HcSplit {
    let mut pre = [0.0; HC_STREAMS];
    let mut post = [0.0; HC_STREAMS];
    let mut comb = [[0.0; HC_STREAMS]; HC_STREAMS];
    for i in 0..HC_STREAMS {
        pre[i] = sigmoid(m[i] * scale[0] + base[i]) + hc_eps;
        post[i] = 2.0 * sigmoid(m[4 + i] * scale[1] + base[4 + i]);
    }
    for (j, row) in comb.iter_mut().enumerate() {
        for (k, c) in row.iter_mut().enumerate() {
            *c = m[8 + 4 * j + k] * scale[2] + base[8 + 4 * j + k];
        }
    }
    HcSplit {
        pre,
        post,
        comb: sinkhorn(comb, hc_eps, iters),
    }
}

/// Sinkhorn in the spec's order: row softmax, + eps; columns ÷ (sum + eps);
/// then `iters − 1` times rows ÷ (sum + eps) and columns ÷ (sum + eps).
pub fn sinkhorn(
    mut c: [[f32; HC_STREAMS]; HC_STREAMS],
    eps: f32,
    iters: usize,
) -> [[f32; HC_STREAMS]; HC_STREAMS] {
    for row in c.iter_mut() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = exp(*v - max);
            sum += *v;
        }
        for v in row.iter_mut() {
            *v = *v / sum + eps;
        }
    }
    let normalise_columns = |c: &mut [[f32; HC_STREAMS]; HC_STREAMS]| {
        for k in 0..HC_STREAMS {
            let sum: f32 = (0..HC_STREAMS).map(|j| c[j][k]).sum::<f32>() + eps;
            for row in c.iter_mut() {
                row[k] /= sum;
            }
        }
    };
    normalise_columns(&mut c);
    for _ in 1..iters {
        for row in c.iter_mut() {
            let sum: f32 = row.iter().sum::<f32>() + eps;
            for v in row.iter_mut() {
                *v /= sum;
            }
        }
        normalise_columns(&mut c);
    }
    c
}

/// u = Σ_i pre_i · S_i in fp32 (i ascending), rounded to BF16.
pub fn hc_collapse(streams: &[bf16], pre: &[f32; HC_STREAMS]) -> Vec<bf16> {
    let d = streams.len() / HC_STREAMS;
    (0..d)
        .map(|x| {
            let u =
                (0..HC_STREAMS).fold(0.0f32, |acc, i| acc + pre[i] * streams[i * d + x].to_f32());
            bf16::from_f32(u)
        })
        .collect()
}

/// `S'_k = post_k · F + Σ_j comb[j][k] · S_j` in fp32: the stream mix is
/// summed first (j ascending, as the reference's matrix product), then added
/// to the post term; rounded to BF16 once per element.
pub fn hc_expand(streams: &[bf16], f_out: &[bf16], split: &HcSplit) -> Vec<bf16> {
    let d = f_out.len();
    let mut out = Vec::with_capacity(HC_STREAMS * d);
    for k in 0..HC_STREAMS {
        out.extend((0..d).map(|x| {
            let mix = (1..HC_STREAMS).fold(split.comb[0][k] * streams[x].to_f32(), |acc, j| {
                acc + split.comb[j][k] * streams[j * d + x].to_f32()
            });
            let acc = split.post[k] * f_out[x].to_f32() + mix;
            bf16::from_f32(acc)
        }));
    }
    out
}
