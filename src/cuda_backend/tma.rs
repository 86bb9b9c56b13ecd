//! Host-side encoding of TMA tensor maps (`CUtensorMap`, the
//! `di_tensor_map` of `params.h`) for byte-element tensors, through the
//! driver's `cuTensorMapEncodeTiled`.
//!
//! Invariants a caller must know: the map holds the raw device address, so
//! the buffer must outlive every launch that uses the map (hold its
//! `read_ptr` guard across the launch); the base must be 16-byte aligned and
//! every stride but the innermost a multiple of 16 bytes (checked here, typed
//! errors); out-of-range elements of a box are loaded as zeros, and the
//! transaction byte count of a load is always the full box.

use super::params::di_tensor_map;
use super::u32_param;
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// Shared-memory layout a map writes its boxes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Swizzle {
    /// Rows of the box packed one after another.
    None,
    /// 128-byte swizzle: 16-byte chunk c of box row r lands at chunk
    /// c ^ (r % 8); the box's inner extent must be at most 128 bytes and the
    /// destination 1024-byte aligned (the layout `smem_desc_k128` expects).
    B128,
}

/// A map over a dense row-major tensor of 1-byte elements.
///
/// `dims` lists the extents innermost first (`[k, rows]` for a `[rows, k]`
/// matrix), `strides` the byte strides of dims 1.. (so `strides.len() ==
/// dims.len() - 1`), `boxes` the box extent per dim (each 1..=256). `op` and
/// `tensor` name the caller in errors.
pub(crate) fn encode_u8(
    op: &'static str,
    tensor: &'static str,
    base: *const std::ffi::c_void,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: Swizzle,
) -> Result<di_tensor_map> {
    let rank = dims.len();
    debug_assert!((1..=5).contains(&rank) && strides.len() + 1 == rank && boxes.len() == rank);
    if !(base as usize).is_multiple_of(16) {
        return Err(Error::Argument {
            op,
            arg: tensor,
            value: format!("device address {:#x}", base as usize),
            why: "TMA needs a 16-byte aligned base address",
        });
    }
    if let Some(s) = strides.iter().find(|s| !s.is_multiple_of(16)) {
        return Err(Error::Argument {
            op,
            arg: tensor,
            value: format!("row stride {s} bytes"),
            why: "TMA needs every row stride to be a multiple of 16 bytes",
        });
    }
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let elem_strides = [1u32; 5];
    let swizzle = match swizzle {
        Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    // SAFETY: `map` is a writable CUtensorMap; `dims`, `strides`, `boxes`
    // and `elem_strides` hold at least `rank` (resp. `rank - 1`) entries, as
    // the driver reads; the base address is only recorded, not dereferenced.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            u32_param("rank", rank)?,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    status.result().map_err(|source| Error::Driver {
        during: format!(
            "{op}: encoding the tensor map of `{tensor}` (dims {dims:?}, box {boxes:?})"
        ),
        source,
    })?;
    Ok(di_tensor_map { opaque: map.opaque })
}
