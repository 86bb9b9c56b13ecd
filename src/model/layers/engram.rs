//! Engram before a block (`v41-flash.md` §8): each token's n-gram ids (from
//! the sequence's history of compressed ids) hash to 24 table rows, which
//! are looked up, projected to one key per stream and a shared value, and
//! gate each stream's update.
//!
//! Invariant: a token's n-gram ids depend only on its own sequence's last
//! four compressed ids, so the update is batch-independent. Where the table
//! lives changes where its rows are gathered, not their bytes: both
//! placements dequantise the same rows with the same op.

use super::linear::Fp8Linear;
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::Tensor;

/// Where an Engram layer's table lives (`v41-flash.md` §8.5: a table is
/// about 101 GB at V4.1's size, and its row addresses depend only on token
/// ids, so the rows can be fetched before the device needs them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngramPlacement {
    /// On the weights' device: the lookup gathers the rows there.
    #[default]
    Device,
    /// In host memory: each step's host half hashes its tokens' n-grams,
    /// gathers their rows ([`Engram::gather_host`]) and uploads them with
    /// the step's inputs; the device dequantises what was uploaded. The
    /// table takes no device memory.
    Host,
}

/// An Engram layer's table and projections.
#[derive(Clone, Debug)]
pub struct Engram {
    /// U8 `[rows, head_dim + head_dim/32]`: e4m3 values then E8M0 scales;
    /// on the host for [`EngramPlacement::Host`].
    pub table: Tensor,
    pub placement: EngramPlacement,
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

/// The rows a [`EngramPlacement::Host`] layer gathered for a step, on the
/// step's device: `rows` U8 `[T · cols, row bytes]` (token-major, columns in
/// order) and `index` I64 `[T, cols]` = 0 .. T · cols, the lookup of
/// `rows` that reads them back in place.
pub struct StagedRows<'a> {
    pub rows: &'a Tensor,
    pub index: &'a Tensor,
}

impl Engram {
    /// The host half of a [`EngramPlacement::Host`] layer: the table rows
    /// of `ngram_ids` (I64 `[T, 4]` on the host, newest first; hashed by
    /// [`ops::engram_rows`]) copied from the host table: `T · cols` rows of
    /// the table's row bytes, token-major, columns in order. Large steps
    /// copy on several threads (the copies are independent).
    pub fn gather_host(&self, ngram_ids: &Tensor) -> Result<Vec<u8>> {
        const OP: &str = "Engram::gather_host";
        let rows = ops::engram_rows(ngram_ids, &self.multipliers, &self.primes)?;
        let rows = rows.as_slice::<i64>()?;
        let table = self.table.as_slice::<u8>()?;
        let rb = self.table.shape().get(1).copied().unwrap_or(0);
        let bad = |r: i64| Error::Argument {
            op: OP,
            arg: "rows",
            value: r.to_string(),
            why: "table row outside the host table",
        };
        // Every row's bytes, checked before anything is copied.
        let spans = rows
            .iter()
            .map(|&r| {
                usize::try_from(r)
                    .ok()
                    .and_then(|r| r.checked_mul(rb))
                    .filter(|&at| at.checked_add(rb).is_some_and(|end| end <= table.len()))
                    .ok_or_else(|| bad(r))
            })
            .collect::<Result<Vec<usize>>>()?;
        let mut out = Vec::new();
        out.try_reserve_exact(spans.len().saturating_mul(rb))
            .map_err(|_| Error::Argument {
                op: OP,
                arg: "ngram_ids",
                value: format!("{} rows of {rb} bytes", spans.len()),
                why: "the host could not hold the gathered rows",
            })?;
        out.resize(spans.len() * rb, 0);
        let copy = |dst: &mut [u8], spans: &[usize]| {
            for (d, &at) in dst.chunks_exact_mut(rb.max(1)).zip(spans) {
                if let Some(src) = table.get(at..at + rb) {
                    d.copy_from_slice(src);
                }
            }
        };
        const ROWS_PER_THREAD: usize = 4096;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(spans.len().div_ceil(ROWS_PER_THREAD))
            .max(1);
        if threads == 1 || rb == 0 {
            copy(&mut out, &spans);
        } else {
            let per = spans.len().div_ceil(threads);
            std::thread::scope(|scope| {
                for (dst, part) in out.chunks_mut(per * rb).zip(spans.chunks(per)) {
                    scope.spawn(move || copy(dst, part));
                }
            });
        }
        Ok(out)
    }

    /// Updates the streams BF16 `[T, 4, D]` from the tokens' n-gram ids
    /// I64 `[T, 4]` (newest first). A [`EngramPlacement::Device`] table's
    /// rows come from `engram_rows` (in range by construction), a host
    /// table's from `staged` (what the host half gathered); the lookup's
    /// device check is left in `checks`.
    pub fn forward(
        &self,
        streams: &Tensor,
        ngram_ids: &Tensor,
        staged: Option<StagedRows<'_>>,
        eps: f32,
        checks: &mut ops::DeviceChecks,
    ) -> Result<Tensor> {
        let lookups = match (self.placement, staged) {
            (EngramPlacement::Device, None) => {
                let rows = ops::engram_rows(ngram_ids, &self.multipliers, &self.primes)?;
                ops::engram_lookup_deferred(&self.table, &rows, self.head_dim, checks)?
            }
            (EngramPlacement::Host, Some(s)) => {
                ops::engram_lookup_deferred(s.rows, s.index, self.head_dim, checks)?
            }
            (placement, staged) => {
                return Err(Error::Argument {
                    op: "Engram::forward",
                    arg: "staged",
                    value: format!("{} for a {placement:?} table", staged.is_some()),
                    why: "a host table's rows come staged from the step's host half; a device table's are gathered on the device",
                });
            }
        };
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
