//! Sparse MQA with a per-head sink (`v41-flash.md` §3.3, §3.10): the window
//! index lists of prefill and decode, and the attention itself with the
//! reference kernel's exact numerics — 64-entry blocks walked in list order,
//! fp32 logits scaled after the dot product, probabilities rounded to BF16
//! against the running maximum before P·V, the sink added to the denominator
//! only. The result depends on the list order, so callers keep it exactly.
//!
//! Invariants: K = V (one `dim`-wide row per entry, shared by all heads);
//! every index is −1 (no row) or < the number of rows (callers validate);
//! a query whose list is all −1 outputs zeros.

use crate::numerics::exp;
use half::bf16;

/// Entries per block of the online softmax (the reference kernel's tile).
pub const ATTN_BLOCK: usize = 64;

/// Prefill window list of query `p` in a prompt of `len` tokens: entry k is
/// max(0, p − window + 1) + k for k < min(len, window), entries > p are −1.
pub fn window_indices_prefill(p: usize, len: usize, window: usize) -> Vec<i32> {
    let start = (p + 1).saturating_sub(window);
    (0..len.min(window))
        .map(|k| {
            let pos = start + k;
            if pos > p { -1 } else { pos as i32 }
        })
        .collect()
}

/// Decode window list of the token at position `p` over a ring of `window`
/// slots: slots (p mod w) + 1 … w − 1 then 0 … p mod w, oldest first, with
/// every slot number greater than p replaced by −1.
pub fn window_indices_decode(p: usize, window: usize) -> Vec<i32> {
    let cur = p % window;
    (cur + 1..window)
        .chain(0..=cur)
        .map(|slot| if slot > p { -1 } else { slot as i32 })
        .collect()
}

/// Output and log-sum-exp (natural log, including the sink) of one query.
pub struct AttnOut {
    /// `[heads, dim]`.
    pub out: Vec<bf16>,
    /// `[heads]`; +∞ for an all −1 list (the sink term overflows there).
    pub lse: Vec<f32>,
}

/// Attends one query (`q`: `[heads, dim]`) over `rows` (`[n, dim]`) chosen by
/// `indices`, with per-head `sink` logits and softmax scale dim^−½.
pub fn sparse_mqa(q: &[bf16], rows: &[bf16], indices: &[i32], sink: &[f32], dim: usize) -> AttnOut {
    let heads = sink.len();
    let scale = crate::numerics::round_f32((dim as f64).powf(-0.5));
    let mut out = Vec::with_capacity(heads * dim);
    let mut lse = Vec::with_capacity(heads);
    let mut p = [0.0f32; ATTN_BLOCK];
    for (h, qh) in q.chunks_exact(dim).take(heads).enumerate() {
        let qf: Vec<f32> = qh.iter().map(|v| v.to_f32()).collect();
        let (mut m, mut l) = (-1e30f32, 0.0f32);
        let mut acc = vec![0.0f32; dim];
        for block in indices.chunks(ATTN_BLOCK) {
            let logits: Vec<f32> = block
                .iter()
                .map(|&i| match row(rows, i, dim) {
                    Some(k) => qf.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>() * scale,
                    None => f32::NEG_INFINITY,
                })
                .collect();
            let m_new = logits.iter().copied().fold(m, f32::max);
            let alpha = exp(m - m_new);
            for (pj, s) in p.iter_mut().zip(&logits) {
                *pj = exp(s - m_new);
            }
            l = l * alpha + p[..block.len()].iter().sum::<f32>();
            // acc ← acc·α + Σ_j BF16(p_j)·v_j: the block's sum first, in list order.
            let mut pv = vec![0.0f32; dim];
            for (&i, pj) in block.iter().zip(&p) {
                if let Some(v) = row(rows, i, dim) {
                    let pb = bf16::from_f32(*pj).to_f32();
                    pv.iter_mut()
                        .zip(v)
                        .for_each(|(a, x)| *a += pb * x.to_f32());
                }
            }
            acc.iter_mut()
                .zip(&pv)
                .for_each(|(a, s)| *a = *a * alpha + s);
            m = m_new;
        }
        l += exp(sink[h] - m);
        out.extend(acc.iter().map(|a| bf16::from_f32(a / l)));
        lse.push(l.ln() + m);
    }
    AttnOut { out, lse }
}

fn row(rows: &[bf16], index: i32, dim: usize) -> Option<&[bf16]> {
    usize::try_from(index)
        .ok()
        .map(|i| &rows[i * dim..(i + 1) * dim])
}
