//! The ratio-2 compressor's pooling (`v41-flash.md` §3.4): each pair of
//! consecutive rows (tokens 2j, 2j + 1 of one group) becomes one BF16 entry
//! by a per-channel two-way softmax of their gate scores, in fp32. The
//! ratio-1 compressor is a plain BF16 linear and needs no op of its own.
//!
//! Invariant: bitwise [`cpu_backend::compressor::pool_ratio2`] per pair; the
//! partial group (an odd trailing token) is the caller's state.
//!
//! [`cpu_backend::compressor::pool_ratio2`]: crate::cpu_backend::compressor::pool_ratio2

use super::{common_device, cpu_only, shape_error};
use crate::cpu_backend::compressor::pool_ratio2;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

const OP: &str = "compress_ratio2";

/// F32 `kv` and `score` `[2n, hd]` (rows 2j and 2j + 1 form group j) →
/// BF16 entries `[n, hd]`.
pub fn compress_ratio2(kv: &Tensor, score: &Tensor) -> Result<Tensor> {
    kv.expect_dtype(OP, "kv", DType::F32)?;
    score.expect_dtype(OP, "score", DType::F32)?;
    let &[rows, hd] = kv.shape() else {
        return Err(shape_error(OP, "kv", kv, "[2n, hd]".into()));
    };
    if !rows.is_multiple_of(2) || hd == 0 {
        return Err(shape_error(
            OP,
            "kv",
            kv,
            "[2n, hd] with an even row count".into(),
        ));
    }
    if score.shape() != kv.shape() {
        return Err(shape_error(
            OP,
            "score",
            score,
            format!("{:?} (kv's shape)", kv.shape()),
        ));
    }
    let device = common_device(OP, &[("kv", kv), ("score", score)])?;
    cpu_only(OP, &device)?;
    let (k, s) = (kv.as_slice::<f32>()?, score.as_slice::<f32>()?);
    let out: Vec<_> = (0..rows / 2)
        .flat_map(|j| {
            let (a, b) = (
                2 * j * hd..(2 * j + 1) * hd,
                (2 * j + 1) * hd..(2 * j + 2) * hd,
            );
            pool_ratio2([&k[a.clone()], &k[b.clone()]], [&s[a], &s[b]])
        })
        .collect();
    Tensor::from_vec(out, &[rows / 2, hd])
}
