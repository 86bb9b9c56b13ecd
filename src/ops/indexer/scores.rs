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
        Device::Cuda(dev) => crate::cuda_backend::indexer::index_scores(
            &dev,
            (q, w, keys, visible),
            out,
            s,
            kernel,
            None,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = kernel;
            Err(crate::ops::kernels_not_built(SCORES, &d))
        }
    }
}

pub(super) const PAGED: &str = "index_scores_paged";

/// [`index_scores`] of each query row against its own keys read in place
/// from a paged pool: `key_pool` `[rows, R]` holds pages of `page_rows`
/// keys, and row b scores the n = width · page_rows keys of its pages
/// `pages[b]` (I32 `[batch, width]`) in order: key t is pool row
/// `pages[b][t / page_rows] · page_rows + t % page_rows`. No key is copied
/// (a batched decode's indexer reads every sequence's keys through its
/// block table). A key at or past `visible[b]`, or on a page outside the
/// pool's whole pages (negative, or at or past rows / page_rows), scores
/// −∞ and is not read. Returns BF16 `[batch, n]`.
pub fn index_scores_paged(
    q: &Tensor,
    w: &Tensor,
    key_pool: &Tensor,
    pages: &Tensor,
    page_rows: usize,
    visible: &Tensor,
) -> Result<Tensor> {
    index_scores_paged_with(q, w, key_pool, pages, page_rows, visible, ScoreKernel::Auto)
}

/// [`index_scores_paged`] with an explicit CUDA kernel (tests and benches;
/// the tensor-core kernel needs `page_rows` a multiple of 32).
pub fn index_scores_paged_with(
    q: &Tensor,
    w: &Tensor,
    key_pool: &Tensor,
    pages: &Tensor,
    page_rows: usize,
    visible: &Tensor,
    kernel: ScoreKernel,
) -> Result<Tensor> {
    pages.expect_dtype(PAGED, "pages", DType::I32)?;
    if page_rows == 0 {
        return Err(crate::error::Error::Argument {
            op: PAGED,
            arg: "page_rows",
            value: "0".into(),
            why: "must be positive",
        });
    }
    // The pool as one cache shared by every row: dtype, row and device checks.
    let (device, mut s) = validate_scores(q, w, key_pool, visible)?;
    if s.per_row_keys {
        return Err(shape_error(
            PAGED,
            "key_pool",
            key_pool,
            "[rows, R] (one pool of index-key rows)".into(),
        ));
    }
    common_device(PAGED, &[("q", q), ("pages", pages)])?;
    let width = match *pages.shape() {
        [b, w] if b == s.batch => w,
        _ => {
            return Err(shape_error(
                PAGED,
                "pages",
                pages,
                format!("[{}, width] (q's batch)", s.batch),
            ));
        }
    };
    let pool_pages = s.n / page_rows;
    s.n = width
        .checked_mul(page_rows)
        .filter(|&n| n <= i32::MAX as usize)
        .ok_or_else(|| {
            shape_error(
                PAGED,
                "pages",
                pages,
                format!("width × page_rows ({page_rows}) below 2^31 keys"),
            )
        })?;
    let mut out = Tensor::empty(&device, DType::BF16, &[s.batch, s.n])?;
    match device {
        Device::Cpu => {
            // The reference: every row's keys gathered (zero rows for a page
            // outside the pool), scored as a per-row cache, then −∞ on the
            // keys of those pages.
            let list = pages.as_slice::<i32>()?;
            let mut gathered = Vec::with_capacity(s.batch);
            for b in 0..s.batch {
                let row = Tensor::from_vec(list[b * width..(b + 1) * width].to_vec(), &[width])?;
                let keys = crate::ops::gather_blocks(key_pool, page_rows, &row)?;
                gathered.push(keys.reshape(&[1, s.n, key_pool.shape()[1]])?);
            }
            let refs: Vec<&Tensor> = gathered.iter().collect();
            let keys = if refs.is_empty() {
                Tensor::empty(&device, DType::F4E2M1x2, &[0, s.n, key_pool.shape()[1]])?
            } else {
                Tensor::cat_rows(&refs)?
            };
            index_scores_into_with(q, w, &keys, visible, &mut out, kernel)?;
            let o = out.as_mut_slice::<bf16>()?;
            for b in 0..s.batch {
                for (c, &pg) in list[b * width..(b + 1) * width].iter().enumerate() {
                    if usize::try_from(pg).map_or(true, |p| p >= pool_pages) {
                        let at = b * s.n + c * page_rows;
                        o[at..at + page_rows].fill(bf16::NEG_INFINITY);
                    }
                }
            }
            Ok(out)
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::indexer::index_scores(
                &dev,
                (q, w, key_pool, visible),
                &mut out,
                s,
                kernel,
                Some(crate::cuda_backend::indexer::ScorePages {
                    pages,
                    page_rows,
                    pool_pages,
                }),
            )?;
            Ok(out)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = (kernel, pool_pages);
            Err(crate::ops::kernels_not_built(PAGED, &d))
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
