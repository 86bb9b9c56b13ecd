//! Compressor pooling reference (`v41-flash.md` §3.4). Ratio 2: each entry
//! pools two consecutive tokens with a per-channel two-way softmax over their
//! gate scores, in fp32, rounded to BF16 (then `compressor.norm`, RMSNorm, is
//! the caller's next step). An odd trailing token waits in fp32 state for its
//! partner. Ratio 1 has no gate: each token's BF16 projection is an entry.
//!
//! Invariant: tokens are pushed in position order; entry j covers positions
//! 2j and 2j + 1 and becomes visible once both were pushed.

use crate::numerics::exp;
use half::bf16;

/// `e[c] = Σ_t softmax_t(score_t[c]) · kv_t[c]` over the two tokens t of a
/// group, max-subtracted, all fp32, rounded to BF16.
pub fn pool_ratio2(kv: [&[f32]; 2], score: [&[f32]; 2]) -> Vec<bf16> {
    (0..kv[0].len())
        .map(|c| {
            let m = score[0][c].max(score[1][c]);
            let (e0, e1) = (exp(score[0][c] - m), exp(score[1][c] - m));
            let sum = e0 + e1;
            bf16::from_f32(e0 / sum * kv[0][c] + e1 / sum * kv[1][c])
        })
        .collect()
}

/// The ratio-2 compressor's partial-group state: the fp32 projections of a
/// token still waiting for its partner.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ratio2State {
    pending: Option<(Vec<f32>, Vec<f32>)>,
}

impl Ratio2State {
    /// Whether a token is waiting (the number of tokens pushed is odd).
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Pushes one token's fp32 `kv` and `score` projections; returns the
    /// pooled entry when this token completes a group.
    pub fn push(&mut self, kv: Vec<f32>, score: Vec<f32>) -> Option<Vec<bf16>> {
        match self.pending.take() {
            None => {
                self.pending = Some((kv, score));
                None
            }
            Some((kv0, s0)) => Some(pool_ratio2([&kv0, &kv], [&s0, &score])),
        }
    }
}
