//! Engram before a block (`v41-flash.md` §8): each token's n-gram ids (from
//! the sequence's history of compressed ids) hash to 24 table rows, which
//! are looked up, projected to one key per stream and a shared value, and
//! gate each stream's update.
//!
//! Invariant: a token's n-gram ids depend only on its own sequence's last
//! four compressed ids, so the update is batch-independent.

use super::linear::Fp8Linear;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// An Engram layer's table and projections.
#[derive(Clone, Debug)]
pub struct Engram {
    /// U8 `[rows, head_dim + head_dim/32]`: e4m3 values then E8M0 scales.
    pub table: Tensor,
    /// `[(streams + 1) · D, columns · head_dim]`.
    pub wkv: Fp8Linear,
    /// BF16 `[streams, D]` each.
    pub q_weight: Tensor,
    pub k_weight: Tensor,
    /// The layer's primes in column order.
    pub primes: Vec<u64>,
    pub multipliers: [i64; 4],
    pub head_dim: usize,
}

impl Engram {
    /// Updates the streams BF16 `[T, 4, D]` from the tokens' n-gram ids
    /// I64 `[T, 4]` (newest first). The table rows come from `engram_rows`
    /// (in range by construction); their device check is left in `checks`.
    pub fn forward(
        &self,
        streams: &Tensor,
        ngram_ids: &Tensor,
        eps: f32,
        checks: &mut ops::DeviceChecks,
    ) -> Result<Tensor> {
        let rows = ops::engram_rows(ngram_ids, &self.multipliers, &self.primes)?;
        let lookups = ops::engram_lookup_deferred(&self.table, &rows, self.head_dim, checks)?;
        let &[t, c, d] = streams.shape() else {
            return Err(crate::ops::shape_error(
                "Engram::forward",
                "streams",
                streams,
                "[T, 4, D]".into(),
            ));
        };
        let kv = self.wkv.forward(&lookups)?.reshape(&[t, c + 1, d])?;
        ops::engram_gate_update(streams, &kv, &self.q_weight, &self.k_weight, eps)
    }
}
