//! Launch of the TileLang-generated fused SwiGLU + FP8 1×32 quantiser
//! (`tilelang/swiglu_act_quant_fp8.py`, generated into
//! `tilelang/generated/swiglu_act_quant_fp8.sm_*.cu`). Like the launchers in
//! `tilelang.rs`, it passes raw device addresses and scalars in the order
//! TileLang emits (its parameters sorted: buffers by name, then scalars by
//! name), not the program's order.

use super::{i32_param, u32_param};
use super::{launch_raw, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`THREADS` in `tilelang/swiglu_act_quant_fp8.py`).
const THREADS: u32 = 128;
/// 32-groups per CTA (`GROUPS_PER_CTA`: 4 lanes per group, 2 passes).
const GROUPS_PER_CTA: usize = 64;

/// `deepinfer_swiglu_act_quant_fp8_kernel(const bfloat16_t* gu, fp8_e4_t* q,
/// uchar* scale, const float* weight, float limit, int n_blocks,
/// int n_groups, int n_rows)` with `gu` `[rows, 2 · inter]` (g's and u's
/// 32-blocks alternating), `n_blocks = inter / 32` and
/// `n_groups = rows * inter / 32`: 64 groups of 32 per CTA of 128 threads,
/// `ceil(n_groups / 64)` CTAs, no dynamic shared memory, launch bounds
/// (128, 1). Needs `inter % 32 == 0` (checked by the caller, and again here
/// because a partial group would be read past its row) and
/// `n_groups + 64 < 2^31` (the kernel's 32-bit group index).
#[allow(clippy::too_many_arguments)]
pub fn swiglu_act_quant_fp8(
    dev: &CudaDevice,
    gu: &Tensor,
    weight: &Tensor,
    limit: f32,
    q: &mut Tensor,
    scale: &mut Tensor,
    rows: usize,
    inter: usize,
) -> Result<()> {
    const OP: &str = "swiglu_act_quant_fp8 (TileLang)";
    let kernel = kernels::tilelang_swiglu_act_quant_fp8::DEEPINFER_SWIGLU_ACT_QUANT_FP8_KERNEL;
    if inter == 0 || !inter.is_multiple_of(32) {
        return Err(Error::Shape {
            op: OP,
            tensor: "gu",
            got: gu.shape().to_vec(),
            expected: "a last dimension that is a multiple of 32".into(),
        });
    }
    let groups = rows.checked_mul(inter / 32);
    let fits = |n: usize| i32::try_from(n + GROUPS_PER_CTA).is_ok();
    let (Some(groups), Ok(n_rows), Ok(n_blocks)) = (
        groups.filter(|&n| fits(n)),
        i32::try_from(rows),
        i32::try_from(inter / 32),
    ) else {
        return Err(Error::Argument {
            op: OP,
            arg: "rows * inter / 32",
            value: format!("{rows} * {inter} / 32"),
            why: "the generated kernel indexes 32-groups (plus one CTA's worth) with a 32-bit int",
        });
    };
    if rows == 0 {
        return Ok(());
    }
    let n_groups = i32_param("groups", groups)?;
    let (gp, _gg) = read_ptr(gu.cuda()?, dev);
    let (wp, _gw) = read_ptr(weight.cuda()?, dev);
    let (qp, _gq) = write_ptr(q.cuda_mut()?, dev);
    let (sp, _gs) = write_ptr(scale.cuda_mut()?, dev);
    let (gu, q, scale, weight) = (gp as u64, qp as u64, sp as u64, wp as u64);
    let cfg = LaunchConfig {
        grid_dim: (u32_param("grid", groups.div_ceil(GROUPS_PER_CTA))?, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (four 8-byte device addresses, one float, three ints).
    // The addresses come from whole allocations (256-byte aligned, so the
    // kernel's 16-byte loads of gu and 8-byte stores of q are aligned: a
    // group is 128 and 32 bytes) of rows*inter*4 (gu), rows*4 (weight),
    // rows*inter (q) and rows*inter/32 (scale) bytes, as the caller validated
    // (gu is [rows, 2 inter], weight is [rows]); their guards live until after the
    // launch, gu and weight are only read and q, scale are distinct
    // buffers (&mut). The grid is ceil(n_groups / 64) CTAs: every group below
    // n_groups is written exactly once, the ones past it are masked, and the
    // weight index group / n_blocks stays below n_rows (the kernel checks it
    // too). n_groups + 64 fits in an int, so no group index overflows.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                gu.into(),
                q.into(),
                scale.into(),
                weight.into(),
                limit.into(),
                n_blocks.into(),
                n_groups.into(),
                n_rows.into(),
            ],
        )
    }?;
    Ok(())
}
