//! The ratio-2 compressor (`v41-flash.md` §3.4): each group of two
//! consecutive tokens becomes one BF16 entry by a per-channel two-way softmax
//! of their gate scores, in fp32 ([`compress_ratio2`]); and the whole path of
//! a source's new entries in one pass ([`compressor_rows_into`]): the pooling
//! of listed groups (a partial group's pending token from an earlier call
//! included), `compressor.norm`, the latent the index keys are computed
//! from, RoPE at the entry's position and the FP4 compressed row stored at
//! its pool slot. The ratio-1 compressor is a plain BF16 linear followed by
//! [`super::kv_rows_into`] with the compressed format.
//!
//! Invariant: bitwise [`cpu_backend::compressor::pool_ratio2`] per group,
//! then bitwise the row writers' composition (`ops::kv_rows`), on every
//! device; the partial group (an odd trailing token) is the caller's state.
//!
//! [`cpu_backend::compressor::pool_ratio2`]: crate::cpu_backend::compressor::pool_ratio2

use super::kv_cache::{Dest, Input, RowNorm, RowRope, RowsIn, RowsOut};
use super::{common_device, shape_error};
use crate::contract::KvRowFormat;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// F32 `kv` and `score` `[2n, hd]` (rows 2j and 2j + 1 form group j) →
/// BF16 entries `[n, hd]`.
pub fn compress_ratio2(kv: &Tensor, score: &Tensor) -> Result<Tensor> {
    const OP: &str = "compress_ratio2";
    let hd = validate_kv(OP, kv, score)?;
    let rows = kv.rows();
    if !rows.is_multiple_of(2) {
        return Err(shape_error(
            OP,
            "kv",
            kv,
            "[2n, hd] with an even row count".into(),
        ));
    }
    let device = common_device(OP, &[("kv", kv), ("score", score)])?;
    let mut out = Tensor::empty(&device, DType::BF16, &[rows / 2, hd])?;
    RowsIn {
        op: OP,
        input: Input::Pool2 {
            kv,
            score,
            pending: None,
            groups: None,
        },
        rows: rows / 2,
        dim: hd,
        format: KvRowFormat::Compressed,
        norm: None,
        rope: None,
    }
    .run(Dest::None, Some(&mut out))?;
    Ok(out)
}

/// A ratio-2 source's new entries in one pass: entry j pools the two
/// members of `groups[j]` (I32 `[n, 2]`, in token order; a member r ≥ 0 is
/// row r of the F32 projections `kv`/`score` `[R, hd]`, r < 0 is row −1 − r
/// of the `pending` pair `[P, hd]`, the partial groups of earlier calls),
/// is normalised by `norm` (written to `out.latent` when given: the index
/// keys' input), rotated by `rope` (its position j · 2) and stored as the
/// 288-byte compressed row at `out.slots[j]` of `out.pool`. A group with a
/// member out of range writes nothing.
pub fn compressor_rows_into(
    kv: &Tensor,
    score: &Tensor,
    pending: Option<(&Tensor, &Tensor)>,
    groups: &Tensor,
    norm: RowNorm<'_>,
    rope: RowRope<'_>,
    out: RowsOut<'_>,
) -> Result<()> {
    const OP: &str = "compressor_rows_into";
    let hd = validate_kv(OP, kv, score)?;
    if let Some((pk, ps)) = pending {
        for (name, t) in [("pending_kv", pk), ("pending_score", ps)] {
            t.expect_dtype(OP, name, DType::F32)?;
            if !matches!(*t.shape(), [_, d] if d == hd) || t.shape() != pk.shape() {
                return Err(shape_error(
                    OP,
                    name,
                    t,
                    format!("[P, {hd}] (pending_kv's shape)"),
                ));
            }
        }
    }
    groups.expect_dtype(OP, "groups", DType::I32)?;
    let &[n, 2] = groups.shape() else {
        return Err(shape_error(OP, "groups", groups, "[n, 2]".into()));
    };
    RowsIn {
        op: OP,
        input: Input::Pool2 {
            kv,
            score,
            pending,
            groups: Some(groups),
        },
        rows: n,
        dim: hd,
        format: KvRowFormat::Compressed,
        norm: Some(norm),
        rope: Some(rope),
    }
    .run_into(out)
}

/// F32 `kv` `[R, hd]` (hd > 0) and a `score` of the same shape; returns hd.
fn validate_kv(op: &'static str, kv: &Tensor, score: &Tensor) -> Result<usize> {
    kv.expect_dtype(op, "kv", DType::F32)?;
    score.expect_dtype(op, "score", DType::F32)?;
    let &[_, hd] = kv.shape() else {
        return Err(shape_error(op, "kv", kv, "[R, hd]".into()));
    };
    // The compressed row packs FP4 pairs with one scale per 16 values.
    if hd == 0 || hd > i32::MAX as usize || !hd.is_multiple_of(KvRowFormat::Compressed.group()) {
        return Err(shape_error(
            op,
            "kv",
            kv,
            "[R, hd] with hd a positive multiple of 16".into(),
        ));
    }
    if score.shape() != kv.shape() {
        return Err(shape_error(
            op,
            "score",
            score,
            format!("{:?} (kv's shape)", kv.shape()),
        ));
    }
    Ok(hd)
}
