//! Sparse MQA launches (`kernels-cuda/attention/`, versions 1-3): one CTA of
//! `DI_SPARSE_MQA_THREADS` threads per (query, 64 heads). The caller is
//! [`crate::ops::sparse_mqa_into`], which has checked dtypes, shapes (D 512,
//! H a multiple of 64), devices and the output shapes; index values are not
//! checked here: the kernel treats every entry outside its pool as no row and
//! never reads it. The grid is (T, H / 64) whatever T is, and no CTA's work
//! depends on another's, so a query's result does not depend on the batch.

use super::params::di_sparse_mqa_params;
use super::{allow_smem, launch, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels;
use crate::ops::{SPARSE_MQA_CUDA_HEAD_GROUP, SparseMqaKernel, SparseMqaShape};
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`DI_SPARSE_MQA_THREADS`: a producer warpgroup and two
/// tensor-core warpgroups).
const THREADS: u32 = 384;
/// Dynamic shared memory per CTA (`DI_SPARSE_MQA_SMEM_BYTES`; the kernel
/// static-asserts its carve-up).
const SMEM: u32 = 229_920;

/// out `[T, H, 512]` and lse `[T, H]` of the chosen kernel version (all three
/// share the grid, block and shared-memory layout).
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
) -> Result<()> {
    if s.t == 0 {
        return Ok(());
    }
    let kernel = match version {
        SparseMqaKernel::V1 => kernels::attention::SPARSE_MQA_V1,
        SparseMqaKernel::V2 => kernels::attention::SPARSE_MQA_V2,
        SparseMqaKernel::V3 => kernels::attention::SPARSE_MQA_V3,
    };
    allow_smem(dev, kernel, SMEM)?;
    let (qp, _gq) = read_ptr(q.cuda().expect("validated: q is on this device"), dev);
    let (wp, _gw) = read_ptr(window.cuda().expect("validated"), dev);
    let (wip, _gwi) = read_ptr(window_idx.cuda().expect("validated"), dev);
    let (sp, _gs) = read_ptr(sink.cuda().expect("validated"), dev);
    let comp = compressed.map(|(rows, idx)| {
        (
            read_ptr(rows.cuda().expect("validated"), dev),
            read_ptr(idx.cuda().expect("validated"), dev),
        )
    });
    let (cp, cip) = comp
        .as_ref()
        .map_or((std::ptr::null(), std::ptr::null()), |((c, _), (ci, _))| {
            (*c, *ci)
        });
    let (op, _go) = write_ptr(out.cuda_mut().expect("validated"), dev);
    let (lp, _gl) = write_ptr(lse.cuda_mut().expect("validated"), dev);
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
        h: s.h as i32,
        kw: s.kw as i32,
        kc: s.kc as i32,
        scale: (s.d as f64).powf(-0.5) as f32,
    };
    let cfg = LaunchConfig {
        grid_dim: (s.t as u32, (s.h / SPARSE_MQA_CUDA_HEAD_GROUP) as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: SMEM,
    };
    launch(dev, kernel, cfg, &p)
}
