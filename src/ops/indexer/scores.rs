//! The BF16 index scores (`index_scores`) on the CPU reference or the SIMT /
//! tensor-core CUDA kernels (see the family doc in `mod.rs`).

use super::*;
use crate::contract::MX_BLOCK;
use crate::cpu_backend;
use crate::device::Device;
use crate::dtype::{DType, Fp4x2};
use crate::error::Result;
use crate::kv_format;
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;
use half::bf16;

pub(super) const SCORES: &str = "index_scores";

/// Index scores `[batch, n]` (BF16) of FP4 queries `q` `[batch, heads, R]`
/// against FP4 keys `[n, R]` (one cache shared by every query, as in a
/// prefill) or `[batch, n, R]` (one cache per query row, as in a batched
/// decode), with head weights `w` `[batch, heads]` (BF16, already × 2^−6) and
/// `visible` `[batch]` (I32): s_t = Σ_h bf16(w_h·relu(bf16(q_h·k_t))) in
/// head order, −∞ for t ≥ visible. `R = dim + dim/16` nibbles, dim a multiple
/// of 32, heads × dim ≤ [`INDEX_SCORE_MAX_HEADS_X_DIM`].
pub fn index_scores(q: &Tensor, w: &Tensor, keys: &Tensor, visible: &Tensor) -> Result<Tensor> {
    let (device, s) = validate_scores(q, w, keys, visible)?;
    let mut out = Tensor::empty(&device, DType::BF16, &[s.batch, s.n])?;
    index_scores_into(q, w, keys, visible, &mut out)?;
    Ok(out)
}

/// [`index_scores`] into a preallocated BF16 `out` `[batch, n]`.
pub fn index_scores_into(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    index_scores_into_with(q, w, keys, visible, out, ScoreKernel::Auto)
}

/// [`index_scores_into`] with an explicit CUDA kernel (tests and benches).
pub fn index_scores_into_with(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
    kernel: ScoreKernel,
) -> Result<()> {
    let (_, s) = validate_scores(q, w, keys, visible)?;
    out.expect_output(SCORES, "out", DType::BF16, &[s.batch, s.n])?;
    match common_device(SCORES, &[("q", q), ("out", out)])? {
        Device::Cpu => {
            let (qb, wb) = (q.as_slice::<Fp4x2>()?, w.as_slice::<bf16>()?);
            let (kb, vis) = (keys.as_slice::<Fp4x2>()?, visible.as_slice::<i32>()?);
            let row = s.dim / 2 + s.dim / MX_BLOCK;
            let decode = |rows: &[Fp4x2]| -> Vec<bf16> {
                rows.chunks_exact(row)
                    .flat_map(|r| {
                        let bytes: Vec<u8> = r.iter().map(|b| b.0).collect();
                        kv_format::decode_index_key_row(&bytes, s.dim)
                    })
                    .collect()
            };
            let shared = (!s.per_row_keys).then(|| decode(kb));
            let o = out.as_mut_slice::<bf16>()?;
            for b in 0..s.batch {
                let qd = decode(&qb[b * s.heads * row..(b + 1) * s.heads * row]);
                let own;
                let kd = match &shared {
                    Some(k) => k,
                    None => {
                        own = decode(&kb[b * s.n * row..(b + 1) * s.n * row]);
                        &own
                    }
                };
                let visible = usize::try_from(vis[b]).map_or(0, |v| v.min(s.n));
                let wh = &wb[b * s.heads..(b + 1) * s.heads];
                let sc = cpu_backend::indexer::index_scores(&qd, kd, wh, s.dim, visible);
                for (d, v) in o[b * s.n..(b + 1) * s.n].iter_mut().zip(sc) {
                    *d = bf16::from_f32(v);
                }
            }
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::indexer::index_scores(&dev, q, w, keys, visible, out, s, kernel)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = kernel;
            Err(crate::ops::kernels_not_built(SCORES, &d))
        }
    }
}

pub(super) fn validate_scores(
    q: &Tensor,
    w: &Tensor,
    keys: &Tensor,
    visible: &Tensor,
) -> Result<(Device, ScoreShape)> {
    q.expect_dtype(SCORES, "q", DType::F4E2M1x2)?;
    w.expect_dtype(SCORES, "w", DType::BF16)?;
    keys.expect_dtype(SCORES, "keys", DType::F4E2M1x2)?;
    visible.expect_dtype(SCORES, "visible", DType::I32)?;
    let device = common_device(
        SCORES,
        &[("q", q), ("w", w), ("keys", keys), ("visible", visible)],
    )?;
    let row_expect =
        "an index-key row as last dimension (dim + dim/16 nibbles, dim a positive multiple of 32)";
    let (batch, heads, nib) = match *q.shape() {
        [b, h, r] if h > 0 => (b, h, r),
        _ => {
            return Err(shape_error(
                SCORES,
                "q",
                q,
                format!("[batch, heads > 0, R] with R {row_expect}"),
            ));
        }
    };
    let dim = dim_of_row(nib).ok_or_else(|| {
        shape_error(
            SCORES,
            "q",
            q,
            format!("[batch, heads, R] with R {row_expect}"),
        )
    })?;
    if heads
        .checked_mul(dim)
        .is_none_or(|hd| hd > INDEX_SCORE_MAX_HEADS_X_DIM)
    {
        return Err(shape_error(
            SCORES,
            "q",
            q,
            format!("heads × dim ≤ {INDEX_SCORE_MAX_HEADS_X_DIM}"),
        ));
    }
    let (n, per_row_keys) = match *keys.shape() {
        [n, r] if r == nib => (n, false),
        [b, n, r] if b == batch && r == nib => (n, true),
        _ => {
            return Err(shape_error(
                SCORES,
                "keys",
                keys,
                format!("[n, {nib}] or [{batch}, n, {nib}] (q's batch and row)"),
            ));
        }
    };
    if n > i32::MAX as usize {
        return Err(shape_error(
            SCORES,
            "keys",
            keys,
            "fewer than 2^31 rows".into(),
        ));
    }
    if w.shape() != [batch, heads] {
        return Err(shape_error(
            SCORES,
            "w",
            w,
            format!("[{batch}, {heads}] (q's batch and heads)"),
        ));
    }
    check_visible(SCORES, visible, batch, "q's")?;
    Ok((
        device,
        ScoreShape {
            batch,
            heads,
            dim,
            n,
            per_row_keys,
        },
    ))
}
