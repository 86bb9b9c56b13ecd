//! Sparse MQA launches (`kernels-cuda/attention/`): the tensor-core versions
//! at D 512 and H a multiple of 64, one CTA per (query, 64, 32 or 16 heads)
//! by version, and `Auto` (version 12 at 64 heads, version 5 at 32 or 16, the
//! CTA size chosen from the number of CTAs it gives; always version 12 on a
//! batch-invariant handle, since versions 5 and 12 round differently); at
//! every other shape `Auto` runs `sparse_mqa_generic`, one CTA per (query,
//! head). The caller is [`crate::ops::sparse_mqa_into`],
//! which has checked dtypes, shapes (against the chosen version), devices and
//! the output shapes; index values are not checked here: the kernels treat
//! every entry outside its pool as no row and never read it. No CTA's work
//! depends on another's and a head's arithmetic is the same in every CTA
//! of one version, so with a fixed version a query's result does not depend
//! on the batch; `Auto`'s choice between versions 12 and 5 does, which is why
//! a batch-invariant handle always takes version 12. Split-KV (`SparseMqaSplit`) cuts each list
//! into spans of a fixed size, one CTA each writing an fp32 partial output
//! and lse, then `sparse_mqa_combine` merges a query's spans in order: the
//! result depends on the span size, which `Auto` picks from the number of
//! queries only on a handle that is not batch-invariant.

use super::params::{
    DI_SPARSE_MQA_COMBINE_THREADS, DI_SPARSE_MQA_GENERIC_MAX_DIM, DI_SPARSE_MQA_GENERIC_THREADS,
    DI_SPARSE_MQA_V7_SMEM_BYTES, DI_SPARSE_MQA_V11_THREADS, di_sparse_mqa_combine_params,
    di_sparse_mqa_params,
};
use super::{i32_param, u32_param};
use super::{launch, read_ptr, write_ptr};
use crate::contract::{
    SPARSE_MQA_GENERIC_MAX_DIM, SPARSE_MQA_SPLIT_UNIT, SparseMqaKernel, SparseMqaShape,
    SparseMqaSplit,
};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

// The generic kernel's shared memory is sized for the contract's largest D.
const _: () = assert!(DI_SPARSE_MQA_GENERIC_MAX_DIM as usize == SPARSE_MQA_GENERIC_MAX_DIM);

/// (heads, threads, dynamic shared memory) of a CTA: 64 heads (versions 3
/// and 6: `DI_SPARSE_MQA_THREADS`, `DI_SPARSE_MQA_SMEM_BYTES`: a producer
/// warpgroup and two tensor-core warpgroups) and version 5's 32 and 16 heads
/// (two producer warpgroups and one consumer warpgroup:
/// `DI_SPARSE_MQA_THREADS` threads, the `_H32` / `_H16` shared memory); the
/// kernel static-asserts its carve-up.
const CTA_64: (usize, u32, u32) = (64, 384, 230_400);
const CTA_32_V5: (usize, u32, u32) = (32, 384, 181_248);
const CTA_16_V5: (usize, u32, u32) = (16, 384, 156_672);
/// Versions 8 and 9: 64 heads, the raw-row stage in place of the logit
/// exchange.
const CTA_64_V7: (usize, u32, u32) = (64, 384, DI_SPARSE_MQA_V7_SMEM_BYTES);
/// Version 11: 64 heads, 8 producer warps and two consumer warpgroups,
/// version 3's shared memory.
const CTA_64_V11: (usize, u32, u32) = (64, DI_SPARSE_MQA_V11_THREADS, 230_400);

/// Time of one CTA relative to a 64-head CTA (the same list), by heads per
/// CTA: `Auto` takes the CTA size with the fewest waves × this. Measured on
/// the H200 (640 rows, one wave, bench of 06945ec): 41.4–42.5 µs per 64-head
/// CTA (version 14), 1.01× and 0.95× that per 32- and 16-head CTA
/// (version 5).
const CTA_COST: [(usize, f64); 3] = [(64, 1.0), (32, 1.01), (16, 0.95)];

/// Heads per CTA for `Auto`: the size whose waves (CTAs over the SMs, one
/// CTA per SM) times its relative cost is least, ties to the larger CTA.
fn auto_heads(t: usize, h: usize, sms: usize) -> usize {
    let cost = |&(heads, c): &(usize, f64)| (t * (h / heads)).div_ceil(sms.max(1)) as f64 * c;
    CTA_COST
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        .map_or(64, |&(heads, _)| heads)
}

/// The span of `SparseMqaSplit::Auto`: none when the queries' CTAs fill a
/// third of the SMs or more (or on a batch-invariant handle); else the
/// fewest 64-entry blocks per span that keep the CTAs within one wave.
/// Measured on the H200 (bench of 18451c5, 640 entries): a span of one or
/// two blocks costs ≈ 20 µs per CTA (the pipeline's start), so split the
/// list in 10, 5 and 4 spans at T 1, 16 and 32 (26, 28 and 34 µs against 40,
/// 40 and 41 for version 5's small CTAs), but 2 spans at T 64 take 54 µs
/// against version 5's 44 (32-head CTAs).
fn auto_split(t: usize, h: usize, entries: usize, sms: usize) -> Option<usize> {
    let ctas = t * (h / 64);
    let spans = sms / ctas.max(1);
    if spans < 3 {
        return None;
    }
    let blocks = entries.div_ceil(SPARSE_MQA_SPLIT_UNIT);
    let per = blocks.div_ceil(spans);
    (per < blocks).then_some(per * SPARSE_MQA_SPLIT_UNIT)
}

/// out `[T, H, D]` and lse `[T, H]` of the chosen kernel version and split.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_mqa(
    dev: &CudaDevice,
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    out: &mut Tensor,
    lse: &mut Tensor,
    s: SparseMqaShape,
    version: SparseMqaKernel,
    split: SparseMqaSplit,
) -> Result<()> {
    if s.t == 0 {
        return Ok(());
    }
    let entries = s.kw + s.kc;
    let tensor_cores = version != SparseMqaKernel::Generic && s.fits_tensor_cores();
    let span = match split {
        _ if !tensor_cores => None,
        SparseMqaSplit::None => None,
        SparseMqaSplit::Entries(n) => (n < entries).then_some(n),
        SparseMqaSplit::Auto if dev.batch_invariant() => None,
        SparseMqaSplit::Auto => auto_split(s.t, s.h, entries, dev.sm_count()),
    };
    // A split runs 64-head CTAs (version 5's smaller CTAs duplicate the
    // decode, which the split divides instead); so does a batch-invariant
    // handle (version 5 is not bitwise version 14, so the CTA size must not
    // follow the batch).
    let version = match (version, span) {
        (SparseMqaKernel::Auto, Some(_)) => SparseMqaKernel::V14,
        (SparseMqaKernel::Auto, None) if dev.batch_invariant() && s.fits_tensor_cores() => {
            SparseMqaKernel::V14
        }
        (v, _) => v,
    };
    use kernels::attention as k;
    let auto = |heads| match heads {
        16 => (k::SPARSE_MQA_V5_H16, CTA_16_V5),
        32 => (k::SPARSE_MQA_V5_H32, CTA_32_V5),
        _ => (k::SPARSE_MQA_V14, CTA_64),
    };
    // One head per CTA, the query and accumulator in shared memory.
    let generic = (
        1,
        DI_SPARSE_MQA_GENERIC_THREADS,
        u32_param("smem", (2 * s.d + 192) * 4)?,
    );
    let (kernel, (heads, threads, smem)) = match version {
        SparseMqaKernel::V3 => (k::SPARSE_MQA_V3, CTA_64),
        SparseMqaKernel::V5Heads32 => (k::SPARSE_MQA_V5_H32, CTA_32_V5),
        SparseMqaKernel::V5Heads16 => (k::SPARSE_MQA_V5_H16, CTA_16_V5),
        SparseMqaKernel::V8 => (k::SPARSE_MQA_V8, CTA_64_V7),
        SparseMqaKernel::V9 => (k::SPARSE_MQA_V9, CTA_64_V7),
        SparseMqaKernel::V11 => (k::SPARSE_MQA_V11, CTA_64_V11),
        SparseMqaKernel::V12 => (k::SPARSE_MQA_V12, CTA_64),
        SparseMqaKernel::V14 => (k::SPARSE_MQA_V14, CTA_64),
        SparseMqaKernel::Generic => (k::SPARSE_MQA_GENERIC, generic),
        SparseMqaKernel::Auto if !s.fits_tensor_cores() => (k::SPARSE_MQA_GENERIC, generic),
        SparseMqaKernel::Auto => auto(auto_heads(s.t, s.h, dev.sm_count())),
    };
    dev.allow_dynamic_smem(kernel, smem)?;
    let (qp, _gq) = read_ptr(q.cuda()?, dev);
    let (wp, _gw) = read_ptr(window.cuda()?, dev);
    let (wip, _gwi) = read_ptr(window_idx.cuda()?, dev);
    let (sp, _gs) = read_ptr(sink.cuda()?, dev);
    let comp = match compressed {
        Some((rows, idx)) => Some((read_ptr(rows.cuda()?, dev), read_ptr(idx.cuda()?, dev))),
        None => None,
    };
    let (cp, cip) = comp
        .as_ref()
        .map_or((std::ptr::null(), std::ptr::null()), |((c, _), (ci, _))| {
            (*c, *ci)
        });
    let splits = span.map_or(1, |n| entries.div_ceil(n));
    let device = crate::Device::Cuda(dev.clone());
    let mut parts = match span {
        Some(_) => Some((
            Tensor::empty(&device, DType::F32, &[s.t, splits, s.h, s.d])?,
            Tensor::empty(&device, DType::F32, &[s.t, splits, s.h])?,
        )),
        None => None,
    };
    let part_ptrs = match parts.as_mut() {
        Some((po, pl)) => Some((
            write_ptr(po.cuda_mut()?, dev),
            write_ptr(pl.cuda_mut()?, dev),
        )),
        None => None,
    };
    let (pop, plp) = part_ptrs.as_ref().map_or(
        (std::ptr::null_mut(), std::ptr::null_mut()),
        |((po, _), (pl, _))| (*po, *pl),
    );
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let (lp, _gl) = write_ptr(lse.cuda_mut()?, dev);
    let p = di_sparse_mqa_params {
        q: qp,
        window: wp,
        window_idx: wip as *const i32,
        compressed: cp,
        compressed_idx: cip as *const i32,
        sink: sp as *const f32,
        out: op,
        lse: lp as *mut f32,
        nw: s.nw as i64,
        nc: s.nc as i64,
        h: i32_param("h", s.h)?,
        kw: i32_param("kw", s.kw)?,
        kc: i32_param("kc", s.kc)?,
        d: i32_param("d", s.d)?,
        scale: crate::numerics::round_f32((s.d as f64).powf(-0.5)),
        split: i32_param("split", span.unwrap_or(0))?,
        part_out: pop as *mut f32,
        part_lse: plp as *mut f32,
    };
    let cfg = LaunchConfig {
        grid_dim: (
            u32_param("t", s.t)?,
            u32_param("head groups", s.h / heads)?,
            u32_param("splits", splits)?,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    };
    launch(dev, kernel, cfg, &p)?;
    if span.is_none() {
        return Ok(());
    }
    let c = di_sparse_mqa_combine_params {
        part_out: pop as *const f32,
        part_lse: plp as *const f32,
        sink: sp as *const f32,
        out: op,
        lse: lp as *mut f32,
        h: i32_param("h", s.h)?,
        splits: i32_param("splits", splits)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (u32_param("t", s.t)?, u32_param("h", s.h)?, 1),
        block_dim: (DI_SPARSE_MQA_COMBINE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, k::SPARSE_MQA_COMBINE, cfg, &c)
}
