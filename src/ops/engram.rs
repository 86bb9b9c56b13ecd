//! Engram (`v41-flash.md` §8): the hashed table rows of each token's
//! n-grams ([`engram_rows`]), their lookup and dequantisation
//! ([`engram_lookup`]), and the per-stream gate and residual update
//! ([`engram_gate_update`]). The n-gram ids come from the runner's history
//! of compressed ids (host data, like the token ids).
//!
//! Invariant: bitwise [`cpu_backend::engram`] (`ngram_hashes`, `table_rows`,
//! `gather_rows`, `gate`, `update`) per token and stream on the CPU. On
//! CUDA the rows and the lookup are bitwise too; the gate's three sums are
//! block reductions, so the gate (and through it the update) differs from
//! the CPU by fp32 rounding only (`tests/cuda_glue.rs` bounds it). A CUDA
//! lookup skips a row out of range and records it: [`engram_lookup`] reads
//! that back (so it waits for its kernel), [`engram_lookup_deferred`]
//! leaves it to [`DeviceChecks::verdict`].
//!
//! [`cpu_backend::engram`]: crate::cpu_backend::engram

use super::{DeviceChecks, common_device, shape_error};
use crate::contract::MX_BLOCK;
use crate::cpu_backend::engram;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const LOOKUP: &str = "engram_lookup";

/// The table rows `[T, cols]` (I64, global row numbers) of the n-gram ids
/// `ids` I64 `[T, 4]` (the compressed ids at p, p−1, p−2, p−3: newest
/// first, padded, as [`crate::contract::ngram_ids`] makes them),
/// hashed with the layer's `multipliers` and reduced modulo each column's
/// prime (`primes`, column order, each table offset by the primes before it).
pub fn engram_rows(ids: &Tensor, multipliers: &[i64; 4], primes: &[u64]) -> Result<Tensor> {
    const OP: &str = "engram_rows";
    ids.expect_dtype(OP, "ids", DType::I64)?;
    let &[t, 4] = ids.shape() else {
        return Err(shape_error(OP, "ids", ids, "[T, 4]".into()));
    };
    // Every row is below the sum of the primes, and rows are I64.
    let sum = primes.iter().try_fold(0u64, |s, &p| s.checked_add(p));
    if primes.is_empty()
        || !primes.len().is_multiple_of(engram::ORDERS.len())
        || primes.contains(&0)
        || sum.is_none_or(|s| i64::try_from(s).is_err())
    {
        return Err(Error::Argument {
            op: OP,
            arg: "primes",
            value: format!("{primes:?}"),
            why: "a positive multiple of 3 columns (n-gram orders 2..=4 × heads), every prime \
                  positive, their sum below 2^63",
        });
    }
    match ids.device() {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&ids.device(), DType::I64, &[t, primes.len()])?;
            let hash = crate::cuda_backend::EngramHash {
                multipliers,
                primes,
            };
            crate::cuda_backend::engram_rows(&dev, ids, &hash, &mut out, t)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let rows: Vec<i64> = ids
        .as_slice::<i64>()?
        .chunks_exact(4)
        .flat_map(|n| match *n {
            [a, b, c, d] => {
                engram::table_rows(&engram::ngram_hashes(&[a, b, c, d], multipliers), primes)
            }
            _ => Vec::new(), // chunks_exact(4) yields no other length
        })
        .map(|r| r as i64)
        .collect();
    Tensor::from_vec(rows, &[t, primes.len()])
}

/// Rows `rows` I64 `[T, cols]` of the FP8 table U8 `[R, hd + hd/32]`
/// (e4m3 values then E8M0 scales per 32), dequantised: BF16 `[T, cols·hd]`.
pub fn engram_lookup(table: &Tensor, rows: &Tensor, head_dim: usize) -> Result<Tensor> {
    DeviceChecks::at_once(
        |c| engram_lookup_deferred(table, rows, head_dim, c),
        |f| Ok(bad_row(rows.to_vec::<i64>()?.get(f.at).copied())),
    )
}

fn bad_row(v: Option<i64>) -> Error {
    Error::Argument {
        op: LOOKUP,
        arg: "rows",
        value: v.map_or_else(|| "?".into(), |v| v.to_string()),
        why: "table row outside the table",
    }
}

/// [`engram_lookup`] whose CUDA check of the rows is read later, by
/// [`DeviceChecks::verdict`] (no sync here; an entry whose row is outside
/// the table stays unwritten until then). The CPU checks at once.
// Without CUDA no kernel records into `checks`.
#[cfg_attr(not(deepinfer_cuda), allow(unused_variables))]
pub fn engram_lookup_deferred(
    table: &Tensor,
    rows: &Tensor,
    head_dim: usize,
    checks: &mut DeviceChecks,
) -> Result<Tensor> {
    const OP: &str = LOOKUP;
    table.expect_dtype(OP, "table", DType::U8)?;
    rows.expect_dtype(OP, "rows", DType::I64)?;
    let row_bytes = head_dim.saturating_add(head_dim / MX_BLOCK);
    let &[r, rb] = table.shape() else {
        return Err(shape_error(OP, "table", table, "[R, row bytes]".into()));
    };
    // rb == row_bytes bounds head_dim by a dimension of an allocated tensor.
    if head_dim == 0 || !head_dim.is_multiple_of(MX_BLOCK) || rb != row_bytes {
        return Err(shape_error(
            OP,
            "table",
            table,
            format!("[R, {row_bytes}] (head_dim {head_dim}, a multiple of 32)"),
        ));
    }
    let &[t, cols] = rows.shape() else {
        return Err(shape_error(OP, "rows", rows, "[T, cols]".into()));
    };
    let device = common_device(OP, &[("table", table), ("rows", rows)])?;
    let width = cols.checked_mul(head_dim).ok_or_else(|| {
        shape_error(
            OP,
            "rows",
            rows,
            "[T, cols] with cols × head_dim in usize".into(),
        )
    })?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&table.device(), DType::BF16, &[t, width])?;
            let slot = checks.slot(&dev, OP, "rows")?;
            crate::cuda_backend::engram_lookup(&dev, table, rows, &mut out, (r, head_dim), slot)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let ids = rows.as_slice::<i64>()?;
    if let Some(&bad) = ids.iter().find(|&&x| x < 0 || x as u64 >= r as u64) {
        return Err(bad_row(Some(bad)));
    }
    let ids: Vec<u64> = ids.iter().map(|&x| x as u64).collect();
    let out = engram::gather_rows(table.as_slice::<u8>()?, &ids, head_dim);
    Tensor::from_vec(out, &[t, width])
}

/// The gated update of the 4 streams, BF16 `[T, 4, D]`, by the projected
/// lookup `kv` BF16 `[T, 5, D]` (one key per stream, then the shared value)
/// with `q_weight`, `k_weight` BF16 `[4, D]` and the RMS epsilon `eps`:
/// S_c ← BF16(S_c + gate_c · value).
pub fn engram_gate_update(
    streams: &Tensor,
    kv: &Tensor,
    q_weight: &Tensor,
    k_weight: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    const OP: &str = "engram_gate_update";
    for (name, t) in [
        ("streams", streams),
        ("kv", kv),
        ("q_weight", q_weight),
        ("k_weight", k_weight),
    ] {
        t.expect_dtype(OP, name, DType::BF16)?;
    }
    let &[t, c, d] = streams.shape() else {
        return Err(shape_error(
            OP,
            "streams",
            streams,
            "[T, streams, D]".into(),
        ));
    };
    if c.checked_add(1).is_none_or(|c1| kv.shape() != [t, c1, d]) {
        let expected = format!("[{t}, {}, {d}]", c.saturating_add(1));
        return Err(shape_error(OP, "kv", kv, expected));
    }
    for (name, w) in [("q_weight", q_weight), ("k_weight", k_weight)] {
        if w.shape() != [c, d] {
            return Err(shape_error(OP, name, w, format!("[{c}, {d}]")));
        }
    }
    let device = common_device(
        OP,
        &[
            ("streams", streams),
            ("kv", kv),
            ("q_weight", q_weight),
            ("k_weight", k_weight),
        ],
    )?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&streams.device(), DType::BF16, &[t, c, d])?;
            crate::cuda_backend::engram_gate_update(
                &dev,
                streams,
                kv,
                q_weight,
                k_weight,
                &mut out,
                (t, c, d),
                eps,
            )?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let (s, k) = (streams.as_slice::<bf16>()?, kv.as_slice::<bf16>()?);
    let (qw, kw) = (q_weight.as_slice::<bf16>()?, k_weight.as_slice::<bf16>()?);
    let mut out = Vec::with_capacity(s.len());
    for tok in 0..t {
        let kv_t = &k[tok * (c + 1) * d..(tok + 1) * (c + 1) * d];
        let value = &kv_t[c * d..];
        for ci in 0..c {
            let sc = &s[(tok * c + ci) * d..(tok * c + ci + 1) * d];
            let r = ci * d..(ci + 1) * d;
            let g = engram::gate(sc, &kv_t[r.clone()], &qw[r.clone()], &kw[r], eps);
            out.extend(engram::update(sc, g, value));
        }
    }
    Tensor::from_vec(out, &[t, c, d])
}
