//! Launches of the TileLang-generated kernels (`tilelang/generated/`). Their
//! entry points take raw pointers and ints in the order TileLang emits, not a
//! parameter struct; each launcher documents the generated signature it
//! matches, and the registry constant makes a renamed kernel a compile error.

use super::params::di_act_quant_params;
use super::{i32_param, u32_param};
use super::{launch_raw, read_ptr, write_ptr};
use crate::contract::RMS_NORM_ACT_QUANT_MAX_DIM;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// `deepinfer_act_quant_fp8_kernel(fp8_e4_t* q, uchar* scale,
/// const bfloat16_t* x, int n_groups)`: one 32-block per group,
/// 128 groups per CTA of 128 threads. Needs k % 32 == 0 (checked by the caller).
pub fn act_quant_fp8(dev: &CudaDevice, p: &di_act_quant_params) -> Result<()> {
    let kernel = kernels::tilelang_act_quant_fp8::DEEPINFER_ACT_QUANT_FP8_KERNEL;
    let groups = p.rows * i64::from(p.k) / 32;
    let n_groups = i32::try_from(groups).map_err(|_| Error::Argument {
        op: "act_quant_fp8 (TileLang)",
        arg: "rows * k / 32",
        value: groups.to_string(),
        why: "the generated kernel indexes 32-blocks with a 32-bit int",
    })?;
    let (q, scale, x) = (p.q as u64, p.scale as u64, p.x as u64);
    let cfg = LaunchConfig {
        // n_groups < 2^31, so the grid fits a u32.
        grid_dim: (n_groups.unsigned_abs().div_ceil(128), 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (three 8-byte device addresses, one int); the addresses
    // come from buffers of rows*k, rows*k/32 and rows*k*2 bytes whose guards the
    // caller holds across the launch, and the grid covers exactly n_groups.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[q.into(), scale.into(), x.into(), n_groups.into()],
        )
    }?;
    Ok(())
}

/// Threads per CTA of the fused RMSNorm + quantiser (`THREADS` in
/// `tilelang/rms_norm_act_quant_fp8.py`).
const RMS_NORM_ACT_QUANT_THREADS: u32 = 256;
/// Its dynamic shared memory: the stage barriers (32 bytes), three staged
/// rows of x of up to 8192 BF16, and one fp32 per thread for the cross-warp
/// sum (`launch_info`; generate.py checks it against the lowered kernel).
const RMS_NORM_ACT_QUANT_SMEM: u32 = 32 + 3 * 8192 * 2 + 4 * RMS_NORM_ACT_QUANT_THREADS;

/// `deepinfer_rms_norm_act_quant_fp8_kernel(fp8_e4_t* q, uchar* scale,
/// const bfloat16_t* weight, bfloat16_t* x, bfloat16_t* y, float eps,
/// int n_blocks, int n_ctas, int n_rows)` with `n_blocks = dim / 32`:
/// persistent, `n_ctas` (the resident CTAs, at most the rows) CTAs of 256
/// threads, CTA b taking rows b, b + n_ctas, ..., each row of x brought to
/// shared memory by a bulk copy (three stages), 50,208 bytes of dynamic
/// shared memory. Needs
/// `dim % 32 == 0` and `dim <= RMS_NORM_ACT_QUANT_MAX_DIM` (checked by the
/// caller, and again here because a wider row would be left half done).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_act_quant_fp8(
    dev: &CudaDevice,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    y: &mut Tensor,
    q: &mut Tensor,
    scale: &mut Tensor,
    rows: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "rms_norm_act_quant_fp8 (TileLang)";
    let kernel = kernels::tilelang_rms_norm_act_quant_fp8::DEEPINFER_RMS_NORM_ACT_QUANT_FP8_KERNEL;
    if dim == 0 || !dim.is_multiple_of(32) || dim > RMS_NORM_ACT_QUANT_MAX_DIM {
        return Err(Error::Shape {
            op: OP,
            tensor: "x",
            got: x.shape().to_vec(),
            expected: format!(
                "a last dimension that is a multiple of 32 and at most {RMS_NORM_ACT_QUANT_MAX_DIM}"
            ),
        });
    }
    let n_rows = i32::try_from(rows).map_err(|_| Error::Argument {
        op: OP,
        arg: "rows",
        value: rows.to_string(),
        why: "the generated kernel takes the row count (its grid) as a 32-bit int",
    })?;
    if rows == 0 {
        return Ok(());
    }
    let n_blocks = i32_param("blocks", dim / 32)?;
    dev.allow_dynamic_smem(kernel, RMS_NORM_ACT_QUANT_SMEM)?;
    let ctas = super::resident_ctas(
        dev,
        kernel,
        RMS_NORM_ACT_QUANT_THREADS,
        RMS_NORM_ACT_QUANT_SMEM,
    )?
    .min(rows);
    let n_ctas = i32_param("ctas", ctas)?;
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (wp, _gw) = read_ptr(weight.cuda()?, dev);
    let (yp, _gy) = write_ptr(y.cuda_mut()?, dev);
    let (qp, _gq) = write_ptr(q.cuda_mut()?, dev);
    let (sp, _gs) = write_ptr(scale.cuda_mut()?, dev);
    let (q, scale, weight, x, y) = (qp as u64, sp as u64, wp as u64, xp as u64, yp as u64);
    let cfg = LaunchConfig {
        grid_dim: (u32_param("ctas", ctas)?, 1, 1),
        block_dim: (RMS_NORM_ACT_QUANT_THREADS, 1, 1),
        shared_mem_bytes: RMS_NORM_ACT_QUANT_SMEM,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (five 8-byte device addresses, one float, three ints).
    // The addresses come from whole allocations (256-byte aligned, so the
    // kernel's 16- and 8-byte vector accesses and its bulk copies of whole
    // rows are aligned: rows are dim*2 and dim bytes with dim % 32 == 0) of
    // rows*dim*2 (x, y), dim*2 (weight), rows*dim (q) and rows*dim/32 (scale)
    // bytes, as the caller validated; their guards live until after the
    // launch, x and weight are only read and y, q, scale are distinct
    // buffers (&mut). The grid is n_ctas <= n_rows CTAs: CTA b takes rows
    // b, b + n_ctas, ... below n_rows, so every row is written once, and a
    // row's n_blocks <= 256 blocks fit a stage (the kernel's register tile
    // too). The dynamic shared memory (stages, barriers, reduction
    // workspace) was allowed above.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                q.into(),
                scale.into(),
                weight.into(),
                x.into(),
                y.into(),
                eps.into(),
                n_blocks.into(),
                n_ctas.into(),
                n_rows.into(),
            ],
        )
    }?;
    Ok(())
}
