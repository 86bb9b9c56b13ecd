//! Cache-row writer reference (`v41-flash.md` §3.1 step 2, §3.4, §3.5): what
//! the model does to a row before it is stored, as one composition —
//! optional RMSNorm ([`rms_norm`]), optional RoPE on the last `rope_dim`
//! values ([`rope`], one head), then `kv_format`'s encoder — and the ratio-2
//! compressor's pooling ([`pool_ratio2`]) of explicitly listed groups, so a
//! partial group left by an earlier call pools with its partner.
//!
//! Invariant: each output row is a function of its own input row (or
//! group), position and the layer's parameters only; the CUDA row writers
//! (`kernels-cuda/kv/`) are bitwise this.

use super::compressor::pool_ratio2;
use super::{RopeParams, rms_norm, rope};
use crate::contract::KvRowFormat;
use crate::kv_format;
use half::bf16;

/// The RoPE of a row writer: one position per row, the last `rope_dim`
/// values rotate.
#[derive(Clone, Copy, Debug)]
pub struct RowRope<'a> {
    pub positions: &'a [i64],
    pub rope_dim: usize,
    pub params: &'a RopeParams,
}

/// `x` `[rows, dim]` → (the latent: x after the optional RMSNorm (`weight`,
/// eps), before RoPE; the encoded rows of `format`, `rows × row_bytes`).
pub fn kv_rows(
    x: &[bf16],
    dim: usize,
    norm: Option<(&[bf16], f32)>,
    rope_args: Option<RowRope<'_>>,
    format: KvRowFormat,
) -> (Vec<bf16>, Vec<u8>) {
    let rows = x.len() / dim;
    let latent = match norm {
        Some((weight, eps)) => rms_norm(x, weight, rows, dim, eps),
        None => x.to_vec(),
    };
    let rows_bytes = |r: &[bf16]| -> Vec<u8> {
        r.chunks_exact(dim)
            .flat_map(|row| kv_format::encode_row(format, row))
            .collect()
    };
    let encoded = match rope_args {
        Some(r) => rows_bytes(&rope(&latent, r.positions, 1, dim, r.rope_dim, r.params)),
        None => rows_bytes(&latent),
    };
    (latent, encoded)
}

/// Group member `r` of the ratio-2 pooling: row `r` of (kv, score) for
/// r ≥ 0, row −1 − r of the pending pair for r < 0; `None` out of range.
fn member<'a>(
    r: i32,
    dim: usize,
    (kv, score): (&'a [f32], &'a [f32]),
    pending: Option<(&'a [f32], &'a [f32])>,
) -> Option<(&'a [f32], &'a [f32])> {
    let (k, s, i) = match usize::try_from(r) {
        Ok(i) => (kv, score, i),
        Err(_) => {
            let (k, s) = pending?;
            (k, s, (-1 - i64::from(r)) as usize)
        }
    };
    let span = i.checked_mul(dim)?..(i + 1).checked_mul(dim)?;
    Some((k.get(span.clone())?, s.get(span)?))
}

/// The pooled BF16 entry of each group (`groups[j]` = its two members in
/// token order, see [`member`]); `None` for a group with a member out of
/// range.
pub fn pool_groups(
    kv: (&[f32], &[f32]),
    pending: Option<(&[f32], &[f32])>,
    groups: &[[i32; 2]],
    dim: usize,
) -> Vec<Option<Vec<bf16>>> {
    groups
        .iter()
        .map(|&[a, b]| {
            let (k0, s0) = member(a, dim, kv, pending)?;
            let (k1, s1) = member(b, dim, kv, pending)?;
            Some(pool_ratio2([k0, k1], [s0, s1]))
        })
        .collect()
}
