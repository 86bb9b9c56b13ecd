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
    /// gathers their rows ([`Engram::host_rows`]) and uploads them with
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
    /// [`ops::engram_rows`]), each checked to lie in the host table. Their
    /// bytes are copied by [`HostGather::copy_into`], which cannot fail
    /// past a length check, so a caller can check every layer's rows before
    /// it overwrites anything.
    pub fn host_rows(&self, ngram_ids: &Tensor) -> Result<HostGather<'_>> {
        const OP: &str = "Engram::host_rows";
        let rows = ops::engram_rows(ngram_ids, &self.multipliers, &self.primes)?;
        let rows = rows.as_slice::<i64>()?;
        let table = self.table.as_slice::<u8>()?;
        let rb = self.row_bytes()?;
        let bad = |r: i64| Error::Argument {
            op: OP,
            arg: "rows",
            value: r.to_string(),
            why: "table row outside the host table",
        };
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
        Ok(HostGather { table, spans, rb })
    }

    /// Bytes of one table row (the table's second dimension, positive).
    pub fn row_bytes(&self) -> Result<usize> {
        match *self.table.shape() {
            [_, rb] if rb > 0 => Ok(rb),
            _ => Err(Error::Shape {
                op: "Engram",
                tensor: "table",
                got: self.table.shape().to_vec(),
                expected: "[rows, head_dim + head_dim/32]".into(),
            }),
        }
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

/// The checked rows of one step of a host table ([`Engram::host_rows`]).
pub struct HostGather<'a> {
    table: &'a [u8],
    /// Each row's byte offset in `table`, in bounds.
    spans: Vec<usize>,
    /// Bytes a row.
    rb: usize,
}

impl HostGather<'_> {
    /// Bytes of the gathered rows: T · cols · row bytes.
    pub fn bytes(&self) -> usize {
        self.spans.len() * self.rb
    }

    /// Copies the rows into `out` ([`HostGather::bytes`] long), token-major,
    /// columns in order. Large steps copy on several threads (the copies
    /// are independent; random 264-byte reads from a table of tens of GB
    /// are bound by memory latency, not bandwidth).
    pub fn copy_into(&self, out: &mut [u8]) -> Result<()> {
        const ROWS_PER_THREAD: usize = 4096;
        let threads = match self.spans.len() {
            n if n > ROWS_PER_THREAD => {
                crate::parallel::available_threads().min(n.div_ceil(ROWS_PER_THREAD))
            }
            _ => 1,
        };
        self.copy_by(out, threads)
    }

    /// [`HostGather::copy_into`] by `threads` threads (blocks of rows,
    /// see [`crate::parallel::try_for_each`]).
    fn copy_by(&self, out: &mut [u8], threads: usize) -> Result<()> {
        let (table, spans, rb) = (self.table, self.spans.as_slice(), self.rb);
        if out.len() != self.bytes() {
            return Err(Error::Shape {
                op: "HostGather::copy_into",
                tensor: "out",
                got: vec![out.len()],
                expected: format!("{} bytes ({} rows of {rb})", self.bytes(), spans.len()),
            });
        }
        if rb == 0 {
            return Ok(());
        }
        let per = spans.len().div_ceil(threads.max(1) * 4).max(1);
        let blocks: Vec<(&mut [u8], &[usize])> =
            out.chunks_mut(per * rb).zip(spans.chunks(per)).collect();
        crate::parallel::try_for_each(
            blocks,
            threads,
            |(dst, spans)| {
                for (d, &at) in dst.chunks_exact_mut(rb).zip(spans) {
                    if let Some(src) = table.get(at..at + rb) {
                        d.copy_from_slice(src);
                    }
                }
                Ok(())
            },
            || Error::Argument {
                op: "HostGather::copy_into",
                arg: "threads",
                value: threads.to_string(),
                why: "a copying thread panicked",
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::model::layers::linear::Fp8Linear;

    /// The host gather copies exactly the rows `engram_rows` names, in
    /// order (against `ops::gather_rows` of the same rows), for steps of
    /// 400 tokens (2400 rows) and of 3, by 1, 2, 3 and 7 threads.
    #[test]
    fn host_rows_copy_the_hashed_rows_in_order() {
        let primes: Vec<u64> = vec![101, 103, 107, 109, 113, 127];
        let rows_total: u64 = primes.iter().sum();
        let rb = 32 + 1;
        let bytes: Vec<u8> = (0..rows_total as usize * rb)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let table = Tensor::from_vec(bytes, &[rows_total as usize, rb]).unwrap();
        let zeros =
            |shape: &[usize], dtype| Tensor::zeros(&crate::Device::Cpu, dtype, shape).unwrap();
        let e = Engram {
            table: table.clone(),
            placement: EngramPlacement::Host,
            wkv: Fp8Linear {
                weight: zeros(&[32, 32], DType::F8E4M3),
                scale: zeros(&[1, 1], DType::E8M0),
            },
            q_weight: zeros(&[4, 8], DType::BF16),
            k_weight: zeros(&[4, 8], DType::BF16),
            primes: primes.clone(),
            multipliers: [
                76_632_096_046_245,
                4_839_876_093_313,
                35_959_672_319_349,
                73_987_337_458_391,
            ],
            head_dim: 32,
        };
        for t in [400usize, 3] {
            let ids: Vec<i64> = (0..4 * t).map(|i| (i as i64 * 7919) % 997).collect();
            let ids = Tensor::from_vec(ids, &[t, 4]).unwrap();
            let gather = e.host_rows(&ids).unwrap();
            let mut got = vec![0xA5u8; gather.bytes()];
            gather.copy_into(&mut got).unwrap();
            let rows = ops::engram_rows(&ids, &e.multipliers, &primes).unwrap();
            let rows: Vec<usize> = rows
                .as_slice::<i64>()
                .unwrap()
                .iter()
                .map(|&r| r as usize)
                .collect();
            let want = ops::gather_rows(&table, &rows)
                .unwrap()
                .to_vec::<u8>()
                .unwrap();
            assert_eq!(got, want, "{t} tokens");
            assert_eq!(got.len(), t * primes.len() * rb);
            // Every thread count gives the same bytes (this machine may
            // have one core: the count is forced here), over a poisoned
            // buffer each time.
            for threads in [1, 2, 3, 7] {
                let mut by = vec![0x5Au8; gather.bytes()];
                gather.copy_by(&mut by, threads).unwrap();
                assert_eq!(by, want, "{t} tokens, {threads} threads");
            }
            // A buffer of the wrong length is a typed error.
            let mut short = vec![0u8; gather.bytes() - 1];
            assert!(matches!(
                gather.copy_into(&mut short),
                Err(Error::Shape { tensor: "out", .. })
            ));
        }
    }
}
