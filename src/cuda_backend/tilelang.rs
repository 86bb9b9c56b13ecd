//! Launches of the TileLang-generated kernels (`tilelang/generated/`). Their
//! entry points take raw pointers and ints in the order TileLang emits, not a
//! parameter struct; each launcher documents the generated signature it
//! matches, and the registry constant makes a renamed kernel a compile error.

use super::params::di_act_quant_params;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use cudarc::driver::{LaunchConfig, PushKernelArg};

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
    let func = dev.function(kernel)?;
    let mut b = dev.raw_stream().launch_builder(&func);
    b.arg(&q).arg(&scale).arg(&x).arg(&n_groups);
    let cfg = LaunchConfig {
        grid_dim: ((groups as u64).div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (three 8-byte device addresses, one int); the addresses
    // come from buffers of rows*k, rows*k/32 and rows*k*2 bytes whose guards the
    // caller holds across the launch, and the grid covers exactly n_groups.
    unsafe { b.launch(cfg) }.map_err(|source| Error::Driver {
        during: format!("launching {}::{}", kernel.family.name, kernel.name),
        source,
    })?;
    Ok(())
}
