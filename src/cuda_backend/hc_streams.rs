//! Launches of `kernels-cuda/hc_streams/`: the mHC streams' init, collapse
//! and mean, one thread per output element (256 a CTA, grid-stride).

use super::params::di_hc_params;
use super::{flat_launch, launch, read_ptr, write_ptr};
use crate::cpu_backend::mhc::HC_STREAMS;
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;

/// Which stream op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HcOp {
    /// x `[T, D]` → streams `[T, 4, D]`.
    Init,
    /// streams and pre `[T, 4]` → `[T, D]`.
    Collapse,
    /// streams → `[T, D]`.
    Mean,
}

/// Runs `op` over `tokens` rows of width `d` (`pre` only for
/// [`HcOp::Collapse`]).
pub fn hc_streams(
    dev: &CudaDevice,
    op: HcOp,
    x: &Tensor,
    pre: Option<&Tensor>,
    out: &mut Tensor,
    tokens: usize,
    d: usize,
) -> Result<()> {
    let elems = tokens.saturating_mul(d);
    if elems == 0 {
        return Ok(());
    }
    let (kernel, work) = match op {
        HcOp::Init => (
            kernels::hc_streams::HC_INIT_BF16,
            elems.saturating_mul(HC_STREAMS),
        ),
        HcOp::Collapse => (kernels::hc_streams::HC_COLLAPSE_BF16, elems),
        HcOp::Mean => (kernels::hc_streams::HC_STREAM_MEAN_BF16, elems),
    };
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let pre = pre.map(|t| t.cuda()).transpose()?;
    let (pp, _gp) = match pre {
        Some(b) => {
            let (p, g) = read_ptr(b, dev);
            (p, Some(g))
        }
        None => (std::ptr::null(), None),
    };
    let (op_, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_hc_params {
        x: xp,
        pre: pp.cast(),
        out: op_,
        tokens: tokens as i64,
        d: d as i64,
    };
    launch(dev, kernel, flat_launch(work), &p)
}
