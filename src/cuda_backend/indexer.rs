//! Indexer launches (`kernels-cuda/indexer/`): the index-key row writer, the
//! index scores (the exact SIMT kernel and the integer tensor-core kernel,
//! both bitwise the CPU reference) and the three-pass exact top-k. Callers
//! are the validated wrappers of [`crate::ops`] (dtypes, shapes, devices and
//! the limits documented there are checked before these run); these
//! functions check the kernel-specific limits (the tensor-core kernel's shape
//! and alignment), size grids and the top-k workspace. The candidate-block
//! path (block scores, the top-k of the blocks, compaction) and the reindex
//! mask reuse the same top-k.

use super::params::{
    di_indexer_block_params, di_indexer_quant_params, di_indexer_score_params,
    di_indexer_topk_params,
};
use super::{grid_for, launch, read_ptr, write_ptr};
use super::{i32_param, u32_param};
use crate::Device;
use crate::contract::{ScoreKernel, ScoreShape};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Error;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads of the row writer (one warp per 128 values of a row).
const QUANT_THREADS: usize = 256;
/// Threads of the score kernel (one key per thread); must match the kernel.
const SCORE_THREADS: usize = 256;
/// Threads of the tensor-core score kernel (`DI_INDEXER_FAST_THREADS`).
const FAST_THREADS: usize = 128;
/// Dynamic shared memory of the tensor-core score kernel
/// (`DI_INDEXER_FAST_SMEM_BYTES`; the kernel static-asserts its carve-up).
const FAST_SMEM: u32 = 46_400;
/// Keys per tile of the tensor-core score kernel (one tile per warp step).
const FAST_TILE: usize = 32;
/// Resident CTAs of the tensor-core score kernel per SM (its launch bounds).
const FAST_CTAS_PER_SM: usize = 4;
/// The only `dim` and the most heads the tensor-core score kernel takes.
pub const FAST_DIM: usize = 128;
/// See [`FAST_DIM`].
pub const FAST_MAX_HEADS: usize = 32;
/// Threads of every top-k pass; must match the kernel.
const TOPK_THREADS: u32 = 512;
/// The top-k kernels' chunk (512 threads × 8 entries): segments are whole
/// chunks, and the collect pass skips a round of 4 chunks whose largest keys
/// are all below the threshold.
const TOPK_CHUNK: usize = 4096;
/// Most top-k segments per row; at most `DI_INDEXER_TOPK_MAX_SEGMENTS`.
/// Every CTA sums its row's per-segment histograms, so more segments cost
/// L2 reads that grow with their square.
const TOPK_MAX_SEGMENTS: usize = 128;
/// Top-k CTAs a launch aims at: about one wave of 512-thread CTAs on the
/// H200's 132 SMs (3–4 fit an SM at the passes' 32–40 registers; 384, three
/// an SM, measured level with 512: 290 against 285 µs at 64 × 1M).
const TOPK_TARGET_CTAS: usize = 512;

/// BF16 `x` (`rows × dim`) → index-key rows in `out`.
pub fn index_key_quant(
    dev: &CudaDevice,
    x: &Tensor,
    out: &mut Tensor,
    rows: usize,
    dim: usize,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_indexer_quant_params {
        x: xp,
        out: op,
        rows: rows as i64,
        dim: i32_param("dim", dim)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (grid_for(rows * dim.div_ceil(128), QUANT_THREADS / 32), 1, 1),
        block_dim: (u32_param("QUANT_THREADS", QUANT_THREADS)?, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::indexer::INDEXER_KEY_QUANT, cfg, &p)
}

/// Shared memory of the score kernel: the decoded query and the weights.
pub fn score_smem_bytes(heads: usize, dim: usize) -> usize {
    4 * (heads * dim + heads)
}

/// The pages of `ops::index_scores_paged`: I32 `[batch, width]` page numbers
/// of a key pool of `pool_pages` pages of `page_rows` keys.
#[derive(Clone, Copy)]
pub(crate) struct ScorePages<'a> {
    pub pages: &'a Tensor,
    pub page_rows: usize,
    pub pool_pages: usize,
}

/// Index scores of `q` against `keys` into BF16 `scores` `[batch, n]` with
/// the chosen kernel; with `paged`, `keys` is a pool read through the pages
/// (each batch row's n = width · page_rows keys). [`ScoreKernel::Auto`]
/// takes the tensor-core kernel when it applies (dim 128, heads ≤ 32, keys
/// 4-byte aligned, pages of whole 32-key tiles) and the exact SIMT kernel
/// otherwise; [`ScoreKernel::Tensor`] on a shape it cannot take is a typed
/// error. Both kernels are bitwise the CPU reference.
pub(crate) fn index_scores(
    dev: &CudaDevice,
    (q, w, keys, visible): (&Tensor, &Tensor, &Tensor, &Tensor),
    scores: &mut Tensor,
    s: ScoreShape,
    kernel: ScoreKernel,
    paged: Option<ScorePages<'_>>,
) -> Result<()> {
    let row_bytes = s.dim / 2 + s.dim / 32;
    let (qp, _gq) = read_ptr(q.cuda()?, dev);
    let (wp, _gw) = read_ptr(w.cuda()?, dev);
    let (kp, _gk) = read_ptr(keys.cuda()?, dev);
    let (vp, _gv) = read_ptr(visible.cuda()?, dev);
    let (sp, _gs) = write_ptr(scores.cuda_mut()?, dev);
    let pg = paged
        .map(|p| p.pages.cuda().map(|b| read_ptr(b, dev)))
        .transpose()?;
    let key_addr = kp as usize;
    let tiles_fit = paged.is_none_or(|p| p.page_rows.is_multiple_of(FAST_TILE));
    let fits =
        s.dim == FAST_DIM && s.heads <= FAST_MAX_HEADS && key_addr.is_multiple_of(4) && tiles_fit;
    let fast = match kernel {
        ScoreKernel::Auto => fits,
        ScoreKernel::Exact => false,
        ScoreKernel::Tensor if fits => true,
        ScoreKernel::Tensor => {
            return Err(Error::Argument {
                op: "index_scores",
                arg: "kernel",
                value: format!(
                    "Tensor (dim {}, heads {}, keys address {key_addr:#x})",
                    s.dim, s.heads
                ),
                why: "the tensor-core kernel needs dim 128, heads <= 32, 4-byte aligned keys and pages of whole 32-key tiles",
            });
        }
    };
    if s.batch == 0 || s.n == 0 {
        return Ok(());
    }
    let p = di_indexer_score_params {
        q: qp,
        w: wp,
        keys: kp,
        visible: vp as *const i32,
        scores: sp,
        n: s.n as i64,
        key_batch_stride: if s.per_row_keys {
            (s.n * row_bytes) as i64
        } else {
            0
        },
        batch: i32_param("batch", s.batch)?,
        heads: i32_param("heads", s.heads)?,
        dim: i32_param("dim", s.dim)?,
        pages: pg.as_ref().map_or(std::ptr::null(), |(p, _)| p.cast()),
        pages_stride: paged.map_or(0, |p| p.pages.shape().get(1).copied().unwrap_or(0)) as i64,
        page_rows: paged.map_or(0, |p| p.page_rows) as i64,
        pool_pages: paged.map_or(0, |p| p.pool_pages) as i64,
    };
    if fast {
        return index_scores_fast(dev, &p, s);
    }
    // Keys per CTA from n alone (the score of an entry never depends on the
    // grid); the grid's y is the batch row.
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("grid", s.n.div_ceil(SCORE_THREADS).min(1024))?,
            u32_param("batch", s.batch)?,
            1,
        ),
        block_dim: (u32_param("SCORE_THREADS", SCORE_THREADS)?, 1, 1),
        shared_mem_bytes: u32_param("shared memory", score_smem_bytes(s.heads, s.dim))?,
    };
    launch(dev, kernels::indexer::INDEXER_SCORES_EXACT, cfg, &p)
}

/// The tensor-core score kernel: each warp streams 32-key tiles; the grid
/// fills the GPU about once (the score of an entry never depends on it).
fn index_scores_fast(dev: &CudaDevice, p: &di_indexer_score_params, s: ScoreShape) -> Result<()> {
    let kernel = kernels::indexer::INDEXER_SCORES_FAST;
    dev.allow_dynamic_smem(kernel, FAST_SMEM)?;
    let warps = FAST_THREADS / 32;
    let needed = s.n.div_ceil(FAST_TILE).div_ceil(warps).max(1);
    // One wave: more CTAs than fit would leave a tail (CTAs stride over tiles).
    let fill = (FAST_CTAS_PER_SM * dev.sm_count()) / s.batch;
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("grid", needed.min(fill.max(1)))?,
            u32_param("batch", s.batch)?,
            1,
        ),
        block_dim: (u32_param("FAST_THREADS", FAST_THREADS)?, 1, 1),
        shared_mem_bytes: FAST_SMEM,
    };
    launch(dev, kernel, cfg, p)
}

/// Segment length and count of a top-k row of `n` entries in a launch of
/// `batch` rows: enough segments to fill the GPU once, each a whole number of
/// chunks (a segment of an aligned row starts 16-byte aligned). The picks
/// do not depend on the segmentation (exact counts, lowest index first), so
/// a row's result does not depend on its batch.
fn topk_segments(n: usize, batch: usize) -> (usize, usize) {
    let want = TOPK_TARGET_CTAS
        .div_ceil(batch.max(1))
        .clamp(1, TOPK_MAX_SEGMENTS);
    let seg_len = n.div_ceil(want).next_multiple_of(TOPK_CHUNK);
    (seg_len, n.div_ceil(seg_len).max(1))
}

/// `select` of every row of BF16 `scores` `[batch, n]` into I32 `out`
/// `[batch, k]`, 1 ≤ k ≤ n.
#[allow(clippy::too_many_arguments)]
pub fn index_topk(
    dev: &CudaDevice,
    scores: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
    batch: usize,
    n: usize,
    k: usize,
    offset: usize,
) -> Result<()> {
    if batch == 0 || k == 0 {
        return Ok(());
    }
    let (seg_len, segments) = topk_segments(n, batch);
    let device = Device::Cuda(dev.clone());
    // One workspace: hist_hi and hist_lo [batch, segments, 256] u32, then the
    // chunk maxima [batch, chunks] u16.
    let chunks = n.div_ceil(TOPK_CHUNK);
    let hist_words = batch * segments * 256;
    let words = 2 * hist_words + (batch * chunks).div_ceil(2);
    let mut work = Tensor::empty(&device, DType::I32, &[words])?;
    let (sp, _gs) = read_ptr(scores.cuda()?, dev);
    let (vp, _gv) = read_ptr(visible.cuda()?, dev);
    let (wp, _gw) = write_ptr(work.cuda_mut()?, dev);
    let hist_hi = wp.cast::<u32>();
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_indexer_topk_params {
        scores: sp,
        visible: vp as *const i32,
        hist_hi,
        hist_lo: hist_hi.wrapping_add(hist_words),
        chunk_max: hist_hi.wrapping_add(2 * hist_words).cast::<u16>(),
        out: op as *mut i32,
        n: n as i64,
        seg_len: seg_len as i64,
        chunks: chunks as i64,
        batch: i32_param("batch", batch)?,
        k: i32_param("k", k)?,
        segments: i32_param("segments", segments)?,
        offset: i32_param("offset", offset)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("segments", segments)?,
            u32_param("batch", batch)?,
            1,
        ),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::indexer::INDEXER_TOPK_HIST_HI, cfg, &p)?;
    launch(dev, kernels::indexer::INDEXER_TOPK_HIST_LO, cfg, &p)?;
    launch(dev, kernels::indexer::INDEXER_TOPK_COLLECT, cfg, &p)
}

/// Threads of the block-score and mask kernels; must match the kernel.
const BLOCK_THREADS: usize = 256;
/// Most blocks one CTA of the mask kernel covers (`DI_INDEXER_MASK_MAX_SPAN`).
const MASK_MAX_SPAN: usize = 2048;
/// Fewest blocks one CTA of the mask kernel covers (each CTA reads the whole
/// candidate list, so a CTA should cover more entries than the list has).
const MASK_MIN_SPAN: usize = 256;

fn block_params(batch: usize, n: usize, block: usize, k: usize) -> Result<di_indexer_block_params> {
    Ok(di_indexer_block_params {
        scores: std::ptr::null(),
        visible: std::ptr::null(),
        block_scores: std::ptr::null_mut(),
        cand_in: std::ptr::null(),
        cand_out: std::ptr::null_mut(),
        out: std::ptr::null_mut(),
        n: n as i64,
        blocks: n.div_ceil(block) as i64,
        batch: i32_param("batch", batch)?,
        block: i32_param("block", block)?,
        k: i32_param("k", k)?,
        span: 0,
    })
}

/// Candidate blocks of every row of BF16 `scores` `[batch, n]` into I32
/// `out` `[batch, k]`, k = min(keep, ceil(n / block)) ≥ 1: the kept blocks
/// of `candidate_mask` ascending, then −1. Block scores go to a BF16
/// workspace `[batch, blocks]`, the exact top-k writes its ascending picks
/// into `out` and the compaction drops the −∞ ones in place.
#[allow(clippy::too_many_arguments)]
pub fn index_candidates(
    dev: &CudaDevice,
    scores: &Tensor,
    visible: &Tensor,
    out: &mut Tensor,
    batch: usize,
    n: usize,
    block: usize,
    k: usize,
) -> Result<()> {
    if batch == 0 || k == 0 {
        return Ok(());
    }
    let blocks = n.div_ceil(block);
    let device = Device::Cuda(dev.clone());
    let mut block_scores = Tensor::empty(&device, DType::BF16, &[batch, blocks])?;
    let mut p = block_params(batch, n, block, k)?;
    {
        let (sp, _gs) = read_ptr(scores.cuda()?, dev);
        let (vp, _gv) = read_ptr(visible.cuda()?, dev);
        let (bp, _gb) = write_ptr(block_scores.cuda_mut()?, dev);
        p.scores = sp;
        p.visible = vp as *const i32;
        p.block_scores = bp;
        let cfg = LaunchConfig {
            grid_dim: (
                u32_param("grid", blocks.div_ceil(BLOCK_THREADS).min(4096))?,
                u32_param("batch", batch)?,
                1,
            ),
            block_dim: (u32_param("BLOCK_THREADS", BLOCK_THREADS)?, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(dev, kernels::indexer::INDEXER_BLOCK_SCORES, cfg, &p)?;
    }
    index_topk(dev, &block_scores, visible, out, batch, blocks, k, 0)?;
    let (bp, _gb) = read_ptr(block_scores.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    p.scores = std::ptr::null();
    p.visible = std::ptr::null();
    p.block_scores = bp as *mut std::ffi::c_void;
    p.cand_in = op as *const i32;
    p.cand_out = op as *mut i32;
    let cfg = LaunchConfig {
        grid_dim: (u32_param("batch", batch)?, 1, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::indexer::INDEXER_CANDIDATES_COMPACT, cfg, &p)
}

/// Blocks one CTA of the mask kernel covers: about a thousand CTAs in all,
/// within [`MASK_MIN_SPAN`, `MASK_MAX_SPAN`] (the result never depends on it).
fn mask_span(batch: usize, blocks: usize) -> usize {
    (batch * blocks)
        .div_ceil(1024)
        .next_power_of_two()
        .clamp(MASK_MIN_SPAN, MASK_MAX_SPAN)
}

/// BF16 `out` `[batch, n]` = `scores` where the entry's block (t / block) is
/// listed in its row of `candidates` `[batch, k]` (entries outside
/// [0, ceil(n / block)) ignored), −∞ elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn index_mask_scores(
    dev: &CudaDevice,
    scores: &Tensor,
    candidates: &Tensor,
    out: &mut Tensor,
    batch: usize,
    n: usize,
    block: usize,
    k: usize,
) -> Result<()> {
    if batch == 0 || n == 0 {
        return Ok(());
    }
    let blocks = n.div_ceil(block);
    let span = mask_span(batch, blocks);
    let mut p = block_params(batch, n, block, k)?;
    let (sp, _gs) = read_ptr(scores.cuda()?, dev);
    let (cp, _gc) = read_ptr(candidates.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    p.scores = sp;
    p.cand_in = cp as *const i32;
    p.out = op;
    p.span = i32_param("span", span)?;
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("grid", blocks.div_ceil(span))?,
            u32_param("batch", batch)?,
            1,
        ),
        block_dim: (u32_param("BLOCK_THREADS", BLOCK_THREADS)?, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::indexer::INDEXER_MASK_SCORES, cfg, &p)
}
