//! Launches of `kernels-cuda/random/`: the random-weight generator of
//! [`crate::weight_rng`] on the device, one kernel per stored format
//! (elements grid-stride for F32 and BF16, a CTA per FP8 scale block, a
//! thread per FP4 32-block).

use super::params::di_random_params;
use super::{LaunchConfig, flat_launch, grid_for, launch, u32_param, write_ptr};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;
use crate::weight_rng::{Format, RandomParam};

/// Fills `values` (and `scales` for a quantised format), allocated by the
/// caller in the shapes of [`RandomParam::stored`], with `p`'s stored bytes.
pub fn random_param(
    dev: &CudaDevice,
    p: &RandomParam,
    values: &mut Tensor,
    scales: Option<&mut Tensor>,
) -> Result<()> {
    let elems = p.rows.saturating_mul(p.cols);
    if elems == 0 {
        return Ok(());
    }
    let [br, bc] = p.format.scale_block().unwrap_or([1, 1]);
    let (vp, _gv) = write_ptr(values.cuda_mut()?, dev);
    let (sp, _gs) = match scales {
        Some(s) => {
            let (ptr, g) = write_ptr(s.cuda_mut()?, dev);
            (ptr.cast::<u8>(), Some(g))
        }
        None => (std::ptr::null_mut(), None),
    };
    let params = di_random_params {
        values: vp,
        scales: sp,
        key: p.key,
        mean: p.mean,
        std_dev: p.std,
        rows: p.rows as i64,
        cols: p.cols as i64,
        block_rows: br as i64,
        block_cols: bc as i64,
    };
    let (kernel, cfg) = match p.format {
        Format::F32 => (kernels::random::RANDOM_F32, flat_launch(elems)),
        Format::Bf16 => (kernels::random::RANDOM_BF16, flat_launch(elems)),
        Format::Fp8Block(_) | Format::Fp8Row => {
            let blocks = p.rows.div_ceil(br).saturating_mul(p.cols.div_ceil(bc));
            let threads = br.saturating_mul(bc).next_multiple_of(32).clamp(32, 256);
            (
                kernels::random::RANDOM_FP8_BLOCKS,
                LaunchConfig {
                    grid_dim: (grid_for(blocks, 1), 1, 1),
                    block_dim: (u32_param("threads", threads)?, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        }
        Format::Fp4 => (
            kernels::random::RANDOM_FP4,
            flat_launch(p.rows.saturating_mul(p.cols.div_ceil(32))),
        ),
    };
    launch(dev, kernel, cfg, &params)
}
