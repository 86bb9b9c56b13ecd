//! Launch of `kernels-cuda/gather/`: whole rows of any dtype gathered by a
//! host index list (uploaded as int32), one launch for the whole list.

use super::params::di_gather_params;
use super::{i32_param, launch, read_ptr, row_launch, write_ptr};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;

/// `out[i] = src[rows[i]]` for rows of `row_bytes` bytes; the caller checked
/// every index against src's rows and out's shape.
pub fn gather_rows(
    dev: &CudaDevice,
    src: &Tensor,
    rows: &[usize],
    out: &mut Tensor,
    row_bytes: usize,
) -> Result<()> {
    if rows.is_empty() || row_bytes == 0 {
        return Ok(());
    }
    let idx = rows
        .iter()
        .map(|&r| i32_param("row index", r))
        .collect::<Result<Vec<i32>>>()?;
    let bytes: Vec<u8> = idx.iter().flat_map(|r| r.to_le_bytes()).collect();
    let idx = dev.upload(&bytes)?;
    let (sp, _gs) = read_ptr(src.cuda()?, dev);
    let (ip, _gi) = read_ptr(&idx, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let n = i64::from(i32_param("rows", rows.len())?);
    let p = di_gather_params {
        src: sp,
        idx: ip.cast(),
        out: op,
        n,
        row_bytes: i64::try_from(row_bytes).map_err(|_| {
            super::param_error("row bytes", row_bytes, "a kernel's int64 parameter")
        })?,
    };
    let per_thread = if row_bytes.is_multiple_of(16) { 16 } else { 1 };
    let cfg = row_launch(rows.len(), row_bytes / per_thread, 256)?;
    launch(dev, kernels::gather::GATHER_ROWS, cfg, &p)
}
