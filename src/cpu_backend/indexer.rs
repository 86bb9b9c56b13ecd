//! Indexer reference (`v41-flash.md` §3.5–3.7): BF16 index scores, the exact
//! top-K selection with its output list convention, the candidate-block
//! pre-filter and reindexing inside the candidates.
//!
//! Tie rule (upstream leaves it to the top-k implementation): among equal
//! scores the lower entry index wins, and among equal block scores the lower
//! block index wins. Because scores are BF16, ties at the K-th place are
//! common; every selection here is deterministic under this rule.

use half::bf16;

/// Score of every entry t < `keys.len() / dim` for one query:
/// s_t = Σ_h bf16(w_h · relu(bf16(q_h · k_t))), the head sum in fp32 (h
/// ascending) rounded to BF16 once. Entries at or beyond `visible` get −∞.
/// `q` is `[heads, dim]`, `keys` `[n, dim]`, `w` `[heads]` (already × 2^−6).
pub fn index_scores(q: &[bf16], keys: &[bf16], w: &[bf16], dim: usize, visible: usize) -> Vec<f32> {
    let qf: Vec<f32> = q.iter().map(|v| v.to_f32()).collect();
    keys.chunks_exact(dim)
        .enumerate()
        .map(|(t, k)| {
            if t >= visible {
                return f32::NEG_INFINITY;
            }
            let kf: Vec<f32> = k.iter().map(|v| v.to_f32()).collect();
            let sum = qf.chunks_exact(dim).zip(w).fold(0.0f32, |acc, (qh, wh)| {
                let dot: f32 = qh.iter().zip(&kf).map(|(a, b)| a * b).sum();
                let relu = bf16::from_f32(dot).to_f32().max(0.0);
                acc + bf16::from_f32(wh.to_f32() * relu).to_f32()
            });
            bf16::from_f32(sum).to_f32()
        })
        .collect()
}

/// Indices of the `k` largest scores (ties to the lower index).
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The published index list of one query: the `k` best entries sorted
/// ascending, every pick ≥ `visible` (a −∞ pick) replaced by −1 and moved to
/// the end, the others shifted by the window offset `offset`.
pub fn select(scores: &[f32], k: usize, visible: usize, offset: usize) -> Vec<i32> {
    let mut picks = top_k(scores, k);
    picks.sort_unstable();
    let (live, dead): (Vec<usize>, Vec<usize>) = picks.into_iter().partition(|&t| t < visible);
    live.into_iter()
        .map(|t| (t + offset) as i32)
        .chain(dead.into_iter().map(|_| -1))
        .collect()
}

/// The candidate mask of one query with `visible` entries: blocks of
/// `block` positions scored by their maximum (−∞ outside the visible range),
/// the block holding the newest visible entry pinned to +∞, the best
/// min(`keep`, blocks) kept, unreachable (−∞) picks dropped.
pub fn candidate_mask(scores: &[f32], visible: usize, block: usize, keep: usize) -> Vec<bool> {
    let n_blocks = scores.len().div_ceil(block);
    let mut block_scores: Vec<f32> = (0..n_blocks)
        .map(|b| {
            (b * block..((b + 1) * block).min(scores.len()))
                .filter(|&t| t < visible)
                .map(|t| scores[t])
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    if visible > 0 {
        block_scores[(visible - 1) / block] = f32::INFINITY;
    }
    let mut mask = vec![false; scores.len()];
    for b in top_k(&block_scores, keep.min(n_blocks)) {
        if block_scores[b] > f32::NEG_INFINITY {
            let end = ((b + 1) * block).min(scores.len());
            mask[b * block..end].iter_mut().for_each(|m| *m = true);
        }
    }
    mask
}

/// Reindex: scores outside the candidate mask become −∞ before selection.
pub fn mask_scores(scores: &[f32], mask: &[bool]) -> Vec<f32> {
    scores
        .iter()
        .zip(mask)
        .map(|(&s, &m)| if m { s } else { f32::NEG_INFINITY })
        .collect()
}
