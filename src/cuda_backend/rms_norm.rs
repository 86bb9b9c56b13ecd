//! RMSNorm launch: one CTA per row; the register-cached 16-byte vector kernel
//! when dim % 8 == 0 and dim <= 32768, else the scalar kernel.

use super::{grid_for, launch, params::di_rms_norm_params, read_ptr, write_ptr};
use super::{i32_param, u32_param};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

pub fn rms_norm(
    dev: &CudaDevice,
    x: &Tensor,
    weight: &Tensor,
    out: &mut Tensor,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    if rows > 0 {
        let (xb, wb) = (x.cuda()?, weight.cuda()?);
        // Thread count from dim alone, so every row reduces the same way at
        // any batch size. The vector kernel caches 4 groups of 8 per thread.
        let (kernel, threads) = if dim.is_multiple_of(8) && dim <= 8 * 4 * 1024 {
            (
                kernels::norm::RMS_NORM_BF16_VEC8,
                (dim / 8).div_ceil(4).div_ceil(32) * 32,
            )
        } else {
            (
                kernels::norm::RMS_NORM_BF16_SCALAR,
                dim.div_ceil(32).clamp(1, 16) * 32,
            )
        };
        let threads = u32_param("threads", threads)?;
        let (xp, _gx) = read_ptr(xb, dev);
        let (wp, _gw) = read_ptr(wb, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        let p = di_rms_norm_params {
            x: xp,
            weight: wp,
            out: op,
            rows: rows as i64,
            dim: i32_param("dim", dim)?,
            eps,
        };
        let cfg = LaunchConfig {
            grid_dim: (grid_for(rows, 1), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(dev, kernel, cfg, &p)?;
    }
    Ok(())
}
