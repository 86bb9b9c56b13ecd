//! Kernel launches for the CUDA backend (built with DEEPINFER_ACCELERATOR=nvidia).
//! Each launch fills the op's parameter struct (bound from
//! `kernels-cuda/include/deepinfer/params.h` by bindgen) and passes it by value.
//! Callers are the validated wrappers of [`crate::ops`]: shapes and dtypes are
//! already checked when these functions run.

mod act_quant;
pub mod blas;
mod elementwise;
mod embedding;
mod engram;
mod gather;
pub mod gemm;
pub mod gemm_skinny;
mod hc_streams;
pub mod indexer;
pub(crate) mod kv_rows;
mod moe;
mod random;
mod rms_norm;
pub(crate) mod scratch;
pub(crate) mod sparse_mqa;
mod tilelang;
mod tilelang_mhc;
mod tilelang_moe_route;
mod tilelang_rope;
mod tilelang_swiglu;
mod tma;

pub use act_quant::{
    act_quant_fp8, act_quant_fp8_shared, act_quant_shared_fuses, mx_share_scales, mxfp8_dequantize,
};
pub use elementwise::{ScalarOp, add_f32, copy_cols, scalar};
pub use embedding::{argmax, embedding, first_non_finite};
pub use engram::{EngramHash, engram_gate_update, engram_lookup, engram_rows};
pub use gather::{copy_rows, copy_rows_where, gather_blocks, paged_rows};
pub use hc_streams::{HcOp, hc_streams};
pub use moe::{
    MaskedDims, check_ids, moe_combine, moe_masked_combine, moe_masked_layout, moe_masked_scatter,
    moe_permute, moe_permute_fp8,
};
pub use random::random_param;
pub use rms_norm::rms_norm;
pub use tilelang::rms_norm_act_quant_fp8;
pub use tilelang_mhc::{mhc_expand, mhc_expand_pre, mhc_pre};
pub use tilelang_moe_route::{moe_layout, moe_route};
pub use tilelang_rope::rope;
pub use tilelang_swiglu::swiglu_act_quant_fp8;

use crate::device::{CudaBuffer, CudaDevice};
use crate::error::{Error, Result};
use crate::kernels::KernelRef;
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// The parameter structs, generated from the C header.
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    clippy::indexing_slicing // bindgen's layout assertions
)]
pub mod params {
    include!(concat!(env!("OUT_DIR"), "/params.rs"));
}

// SAFETY: the structs are `#[repr(C)]` plain data generated from the same
// header the kernels include (bindgen's layout tests assert size and
// alignment), and contain only integers, floats and raw device addresses.
unsafe impl cudarc::driver::DeviceRepr for params::di_rms_norm_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_act_quant_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_act_quant_shared_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_dequant_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_share_scales_params {}
// SAFETY: as above (skinny GEMM structs: addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_gemm_skinny_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_gemm_skinny_reduce_params {}
// SAFETY: as above; the two `di_tensor_map` members are opaque byte arrays
// encoded by `tma::encode_u8` (the driver's CUtensorMap, 64-byte aligned as
// the header and bindgen's `align(64)` require).
unsafe impl cudarc::driver::DeviceRepr for params::di_mx_gemm_params {}
// SAFETY: as above: one `di_tensor_map` (first, 64-byte aligned) and the
// skinny GEMM struct.
unsafe impl cudarc::driver::DeviceRepr for params::di_masked_v6_params {}
// SAFETY: as above (indexer structs: addresses, integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_indexer_quant_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_indexer_score_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_indexer_topk_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_indexer_block_params {}
// SAFETY: as above (addresses, integers and one float).
unsafe impl cudarc::driver::DeviceRepr for params::di_sparse_mqa_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_sparse_mqa_combine_params {}
// SAFETY: as above (addresses, integers and one float).
unsafe impl cudarc::driver::DeviceRepr for params::di_kv_rows_params {}
// SAFETY: as above (the glue kernels' structs: addresses, integers, floats
// and fixed-size integer arrays).
unsafe impl cudarc::driver::DeviceRepr for params::di_elementwise_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_copy_cols_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_embedding_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_argmax_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_hc_params {}
// SAFETY: as above (addresses, integers and two doubles).
unsafe impl cudarc::driver::DeviceRepr for params::di_random_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_check_ids_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_engram_rows_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_engram_lookup_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_engram_gate_params {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for params::di_moe_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_moe_permute_fp8_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_gather_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_paged_rows_params {}
// SAFETY: as above (addresses and integers).
unsafe impl cudarc::driver::DeviceRepr for params::di_moe_masked_params {}

/// `v` as a kernel's int32 parameter. The op validated its sizes first; a
/// value past 2^31 − 1 is still an error naming it, never a wrapped launch.
fn i32_param(what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| param_error(what, v, "a kernel's int32 parameter"))
}

/// `v` as a launch dimension, shared-memory size or uint32 parameter.
fn u32_param(what: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| param_error(what, v, "a launch's uint32 value"))
}

fn param_error(what: &'static str, v: usize, why: &'static str) -> Error {
    Error::Argument {
        op: "CUDA launch",
        arg: what,
        value: v.to_string(),
        why,
    }
}

/// Device address of a buffer's first byte, for a kernel that reads it.
/// The returned guard must outlive the launch that uses the address.
#[allow(
    clippy::cast_possible_truncation,
    reason = "CUDA hosts are 64-bit: a device address fits usize"
)]
fn read_ptr<'a>(
    buf: &'a CudaBuffer,
    dev: &'a CudaDevice,
) -> (*const std::ffi::c_void, impl Drop + 'a) {
    let (p, guard) = buf.slice().device_ptr(dev.raw_stream());
    (p as usize as *const std::ffi::c_void, guard)
}

/// Device address of a buffer's first byte, for a kernel that writes it.
#[allow(
    clippy::cast_possible_truncation,
    reason = "CUDA hosts are 64-bit: a device address fits usize"
)]
fn write_ptr<'a>(
    buf: &'a mut CudaBuffer,
    dev: &'a CudaDevice,
) -> (*mut std::ffi::c_void, impl Drop + 'a) {
    let (p, guard) = buf.slice_mut().device_ptr_mut(dev.raw_stream());
    (p as usize as *mut std::ffi::c_void, guard)
}

/// The error of a failed launch of `kernel`.
fn launch_failed(kernel: KernelRef) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Driver {
        during: format!("launching {}::{}", kernel.family.name, kernel.name),
        source,
    }
}

/// Launches `kernel` with one by-value parameter struct.
fn launch<P: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    kernel: KernelRef,
    cfg: LaunchConfig,
    params: &P,
) -> Result<()> {
    let func = dev.function(kernel)?;
    let failed = launch_failed(kernel);
    if kernel.pdl && dev.pdl() {
        let mut args = [std::ptr::from_ref(params)
            .cast_mut()
            .cast::<std::ffi::c_void>()];
        // SAFETY: as below; `args` holds the address of `params`, alive
        // across the call.
        return unsafe { launch_dependent(dev, &func, cfg, &mut args) }.map_err(failed);
    }
    let mut builder = dev.raw_stream().launch_builder(&func);
    builder.arg(params);
    // SAFETY: `params` is the exact struct the kernel's single argument is
    // declared with; its device addresses come from live buffers whose guards
    // the caller holds across this call, and the caller has checked that the
    // sizes in `params` fit those buffers.
    unsafe { builder.launch(cfg) }.map_err(failed)?;
    Ok(())
}

/// Launches `func` on `dev`'s stream as a programmatic dependent of the
/// kernel before it (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`):
/// the kernel may be scheduled while that one still runs. Only for kernels
/// that open with `DI_PDL_ENTRY()` (`KernelRef::pdl`), which waits for the
/// previous grid's completion before anything else.
///
/// # Safety
/// `args` holds one pointer per kernel parameter, in order, each to a live
/// value of the parameter's exact type; the addresses in those values obey
/// the contract of the launch that passes them.
unsafe fn launch_dependent(
    dev: &CudaDevice,
    func: &cudarc::driver::CudaFunction,
    cfg: LaunchConfig,
    args: &mut [*mut std::ffi::c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    let stream = dev.raw_stream();
    stream.context().bind_to_thread()?;
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    };
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &raw mut attr,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attr` live across the call; `func` is a loaded
    // function of this device's context (bound above); the parameter
    // pointers are the caller's contract.
    unsafe {
        sys::cuLaunchKernelEx(
            &raw const config,
            func.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// One argument of a generated (TileLang) kernel, whose entry points take raw
/// device addresses and scalars rather than a parameter struct.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    F32(f32),
}

impl From<u64> for Arg {
    fn from(p: u64) -> Arg {
        Arg::Ptr(p)
    }
}

impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}

impl From<u32> for Arg {
    fn from(v: u32) -> Arg {
        Arg::U32(v)
    }
}

impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}

/// Launches `kernel` with `args` in order.
///
/// # Safety
/// `args` must match the kernel's parameter list in order and size, every
/// address must point into a live buffer (whose guard the caller holds across
/// the call) large enough for everything the kernel touches under `cfg`, and
/// buffers the kernel writes must not alias buffers it reads unless the
/// kernel allows it.
pub(crate) unsafe fn launch_raw(
    dev: &CudaDevice,
    kernel: KernelRef,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<()> {
    let func = dev.function(kernel)?;
    let failed = launch_failed(kernel);
    if kernel.pdl && dev.pdl() {
        let mut ptrs: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| {
                let p: *const std::ffi::c_void = match a {
                    Arg::Ptr(p) => std::ptr::from_ref(p).cast(),
                    Arg::I32(v) => std::ptr::from_ref(v).cast(),
                    Arg::U32(v) => std::ptr::from_ref(v).cast(),
                    Arg::F32(v) => std::ptr::from_ref(v).cast(),
                };
                p.cast_mut()
            })
            .collect();
        // SAFETY: this function's contract; `ptrs` points into `args`, alive
        // across the call.
        return unsafe { launch_dependent(dev, &func, cfg, &mut ptrs) }.map_err(failed);
    }
    let mut builder = dev.raw_stream().launch_builder(&func);
    for arg in args {
        match arg {
            Arg::Ptr(p) => builder.arg(p),
            Arg::I32(v) => builder.arg(v),
            Arg::U32(v) => builder.arg(v),
            Arg::F32(v) => builder.arg(v),
        };
    }
    // SAFETY: this function's contract, which the caller upholds.
    unsafe { builder.launch(cfg) }.map_err(failed)?;
    Ok(())
}

/// Resident CTAs per device, kernel and CTA shape: occupancy × SMs.
static SLOTS: LazyLock<Mutex<HashMap<SlotKey, usize>>> = LazyLock::new(Mutex::default);
/// (device ordinal, family, kernel, threads, dynamic shared memory).
type SlotKey = (usize, &'static str, &'static str, u32, u32);

/// CTAs of `kernel` (`threads` a CTA, `smem` bytes of dynamic shared
/// memory) resident on the whole of `dev` at once (at least 1): the grid of
/// a persistent kernel. Queried once per key. Call after
/// [`CudaDevice::allow_dynamic_smem`] where `smem` exceeds 48 KiB.
pub(crate) fn resident_ctas(
    dev: &CudaDevice,
    kernel: KernelRef,
    threads: u32,
    smem: u32,
) -> Result<usize> {
    let key = (
        dev.ordinal(),
        kernel.family.name,
        kernel.name,
        threads,
        smem,
    );
    let slots = || {
        SLOTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(&v) = slots().get(&key) {
        return Ok(v);
    }
    let per_sm = dev
        .function(kernel)?
        .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
        .map_err(|source| Error::Driver {
            during: format!(
                "querying the occupancy of {}::{}",
                kernel.family.name, kernel.name
            ),
            source,
        })?;
    let v = (per_sm as usize * dev.sm_count()).max(1);
    slots().insert(key, v);
    Ok(v)
}

/// The "bad slots" of the checking kernels (`params.h`): `n` int64 on the
/// device, each set to `i64::MAX`, that a kernel lowers to the first
/// position whose index input is out of range. One slot per launch; a
/// caller that reads them later ([`BadSlots::read`]) takes one sync for
/// many launches.
pub struct BadSlots(crate::tensor::Tensor);

impl BadSlots {
    pub fn new(dev: &CudaDevice, n: usize) -> Result<BadSlots> {
        // Device memsets, no host copy: slots can be made inside a capture.
        Ok(BadSlots(crate::tensor::Tensor::full_i64(
            &crate::device::Device::Cuda(dev.clone()),
            &[n],
            i64::MAX,
        )?))
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.0.numel()
    }

    /// Copies `blank`'s slots over these (a device copy, capturable).
    pub fn copy_from(&mut self, blank: &BadSlots) -> Result<()> {
        self.0.copy_rows_from(0, &blank.0, 0, self.slots())
    }

    /// Slot `i`'s address for a launch (`i` below [`BadSlots::slots`],
    /// checked); the guard must outlive it.
    fn ptr<'a>(&'a mut self, dev: &'a CudaDevice, i: usize) -> Result<(*mut i64, impl Drop + 'a)> {
        if i >= self.slots() {
            return Err(Error::Argument {
                op: "bad slots",
                arg: "slot",
                value: i.to_string(),
                why: "past the slots allocated",
            });
        }
        let (p, g) = write_ptr(self.0.cuda_mut()?, dev);
        // A device address: plain arithmetic (i < slots() keeps it inside
        // the slots' allocation).
        Ok((p.cast::<i64>().wrapping_add(i), g))
    }

    /// Each slot's first bad position, if any (reading them waits for the
    /// launches on the stream).
    pub fn read(&self) -> Result<Vec<Option<usize>>> {
        Ok(self
            .0
            .to_vec::<i64>()?
            .into_iter()
            .map(|b| {
                Some(b)
                    .filter(|&b| b != i64::MAX)
                    .and_then(|b| usize::try_from(b).ok())
            })
            .collect())
    }
}

/// A grid-stride launch over `work` items, 256 threads a CTA.
fn flat_launch(work: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_for(work, 256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One CTA per row (grid-stride over `rows`), its threads over `units` of
/// the row: the next multiple of 32, within 32 ..= `max`. The thread count
/// depends on the row's width alone, never on the row count, so a kernel's
/// per-row reduction tree is the same at every batch.
fn row_launch(rows: usize, units: usize, max: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (grid_for(rows, 1), 1, 1),
        block_dim: (
            u32_param("threads", units.next_multiple_of(32).clamp(32, max))?,
            1,
            1,
        ),
        shared_mem_bytes: 0,
    })
}

/// A grid for a grid-stride kernel: enough CTAs to cover `work` items of
/// `per_cta`, capped so huge inputs loop instead of overflowing the grid.
fn grid_for(work: usize, per_cta: usize) -> u32 {
    const MAX_GRID: u32 = 132 * 64;
    u32::try_from(work.div_ceil(per_cta)).map_or(MAX_GRID, |g| g.clamp(1, MAX_GRID))
}
