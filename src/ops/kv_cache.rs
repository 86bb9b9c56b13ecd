//! Cache row writers (`v41-flash.md` §3.1 step 2, §3.4 step 4, §11): BF16
//! rows to the encoded byte rows of [`kv_format`] — the 528-byte FP8 window
//! row ([`window_rows`]) and the 288-byte FP4 compressed row
//! ([`compressed_rows`]). Index-key rows are [`super::index_key_quant`].
//!
//! Invariant: each output row is bitwise `kv_format`'s encoding of its input
//! row; the rows then live in the runner's paged pools (U8 tensors) and the
//! attention op reads them in place.
//!
//! [`kv_format`]: crate::kv_format

use super::{cpu_only, shape_error};
use crate::contract::{FP4_KV_GROUP, MX_BLOCK};
use crate::dtype::DType;
use crate::error::Result;
use crate::kv_format;
use crate::tensor::Tensor;
use half::bf16;

fn encode(
    op: &'static str,
    x: &Tensor,
    group: usize,
    bytes: fn(usize) -> usize,
    enc: fn(&[bf16]) -> Vec<u8>,
) -> Result<Tensor> {
    x.expect_dtype(op, "x", DType::BF16)?;
    let &[t, d] = x.shape() else {
        return Err(shape_error(op, "x", x, "[T, D]".into()));
    };
    if d == 0 || !d.is_multiple_of(group) {
        return Err(shape_error(
            op,
            "x",
            x,
            format!("[T, D] with D a positive multiple of {group}"),
        ));
    }
    cpu_only(op, &x.device())?;
    let rows: Vec<u8> = x
        .as_slice::<bf16>()?
        .chunks_exact(d)
        .flat_map(enc)
        .collect();
    Tensor::from_vec(rows, &[t, bytes(d)])
}

/// BF16 `x` `[T, D]` (D a multiple of 32) → U8 `[T, D + D/32]`: e4m3 values
/// then one E8M0 scale per 32 (the window ring's row, 528 bytes at D 512).
pub fn window_rows(x: &Tensor) -> Result<Tensor> {
    encode(
        "window_rows",
        x,
        MX_BLOCK,
        kv_format::window_row_bytes,
        kv_format::encode_window_row,
    )
}

/// BF16 `x` `[T, D]` (D a multiple of 16) → U8 `[T, D/2 + D/16]`: packed
/// e2m1 then one E4M3 scale per 16 (the compressed-KV row, 288 bytes).
pub fn compressed_rows(x: &Tensor) -> Result<Tensor> {
    encode(
        "compressed_rows",
        x,
        FP4_KV_GROUP,
        kv_format::compressed_row_bytes,
        kv_format::encode_compressed_row,
    )
}
