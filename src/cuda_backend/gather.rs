//! Launch of `kernels-cuda/gather/`: whole rows of any dtype copied by host
//! index lists (uploaded as int32) or by int32 lists already on the device,
//! one launch for the whole list.

use super::params::{di_gather_params, di_paged_rows_params};
use super::{i32_param, launch, read_ptr, row_launch, write_ptr};
use crate::device::{CudaBuffer, CudaDevice};
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;

/// An index list as a device int32 buffer.
fn upload_rows(dev: &CudaDevice, rows: &[usize]) -> Result<CudaBuffer> {
    let idx = rows
        .iter()
        .map(|&r| i32_param("row index", r))
        .collect::<Result<Vec<i32>>>()?;
    let bytes: Vec<u8> = idx.iter().flat_map(|r| r.to_le_bytes()).collect();
    dev.upload(&bytes)
}

/// `out[dst_rows[i]] = src[src_rows[i]]` for `n` rows of `row_bytes` bytes
/// (a `None` list is the identity 0..n). The caller checked every index
/// against its tensor's rows, that both lists hold `n` entries and that the
/// destination rows are distinct.
pub fn copy_rows(
    dev: &CudaDevice,
    src: &Tensor,
    src_rows: Option<&[usize]>,
    out: &mut Tensor,
    dst_rows: Option<&[usize]>,
    (n, row_bytes): (usize, usize),
) -> Result<()> {
    if n == 0 || row_bytes == 0 {
        return Ok(());
    }
    let src_idx = src_rows.map(|r| upload_rows(dev, r)).transpose()?;
    let dst_idx = dst_rows.map(|r| upload_rows(dev, r)).transpose()?;
    launch_copy(
        dev,
        (src, src_idx.as_ref()),
        (out, dst_idx.as_ref()),
        (n, row_bytes),
    )
}

/// `ops::copy_rows_where`: `out[dst_rows[i]] = src[src_rows[i]]` for the
/// `n` pairs of the I32 device lists, rows of `row_bytes` bytes, a pair with
/// a row outside its tensor skipped. The caller checked the dtypes, the
/// lists' lengths and devices, and the row width.
pub fn copy_rows_where(
    dev: &CudaDevice,
    src: &Tensor,
    src_rows: &Tensor,
    out: &mut Tensor,
    dst_rows: &Tensor,
    (n, row_bytes): (usize, usize),
) -> Result<()> {
    if n == 0 || row_bytes == 0 {
        return Ok(());
    }
    launch_copy(
        dev,
        (src, Some(src_rows.cuda()?)),
        (out, Some(dst_rows.cuda()?)),
        (n, row_bytes),
    )
}

/// `ops::gather_blocks`: `out[i] = src[blocks[i]]` for the `n` entries of
/// the I32 device list, rows of `row_bytes` bytes (whole blocks), an entry
/// outside `src` skipped (its row of `out` left as it is). The caller
/// checked the dtypes and the list.
pub fn gather_blocks(
    dev: &CudaDevice,
    src: &Tensor,
    blocks: &Tensor,
    out: &mut Tensor,
    (n, row_bytes): (usize, usize),
) -> Result<()> {
    if n == 0 || row_bytes == 0 {
        return Ok(());
    }
    launch_copy(
        dev,
        (src, Some(blocks.cuda()?)),
        (out, None),
        (n, row_bytes),
    )
}

/// The `copy_rows` launch: `n` > 0 rows of `row_bytes` > 0 bytes, each
/// index list an int32 device buffer of `n` entries or none (the identity).
fn launch_copy(
    dev: &CudaDevice,
    (src, src_idx): (&Tensor, Option<&CudaBuffer>),
    (out, dst_idx): (&mut Tensor, Option<&CudaBuffer>),
    (n, row_bytes): (usize, usize),
) -> Result<()> {
    let (sp, _gs) = read_ptr(src.cuda()?, dev);
    let src_ptr = src_idx.map(|b| read_ptr(b, dev));
    let dst_ptr = dst_idx.map(|b| read_ptr(b, dev));
    let (src_rows, dst_rows) = (rows_of(src, row_bytes)?, rows_of(out, row_bytes)?);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let null = || std::ptr::null::<i32>();
    let p = di_gather_params {
        src: sp,
        src_idx: src_ptr.as_ref().map_or_else(null, |(p, _)| p.cast()),
        out: op,
        dst_idx: dst_ptr.as_ref().map_or_else(null, |(p, _)| p.cast()),
        n: i64::from(i32_param("rows", n)?),
        row_bytes: int64_param("row bytes", row_bytes)?,
        src_rows,
        dst_rows,
    };
    let per_thread = if row_bytes.is_multiple_of(16) { 16 } else { 1 };
    let cfg = row_launch(n, row_bytes / per_thread, 256)?;
    launch(dev, kernels::gather::COPY_ROWS, cfg, &p)
}

fn int64_param(what: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| super::param_error(what, v, "a kernel's int64 parameter"))
}

/// Rows of `row_bytes` bytes in `t`'s storage.
fn rows_of(t: &Tensor, row_bytes: usize) -> Result<i64> {
    int64_param("rows", t.storage_bytes() / row_bytes.max(1))
}

/// `ops::paged_rows` / `ops::paged_window_rows`: `inputs` are (idx or none,
/// positions or none, owner), `tables` (pages, bounds); `dims` are
/// [tokens, width, entries, table_pages, page_rows] as the op checked them.
pub fn paged_rows(
    dev: &CudaDevice,
    (idx, positions, owner): (Option<&Tensor>, Option<&Tensor>, &Tensor),
    (pages, bounds): (&Tensor, &Tensor),
    out: &mut Tensor,
    [tokens, width, entries, table_pages, page_rows]: [usize; 5],
) -> Result<()> {
    let total = tokens.saturating_mul(width);
    if total == 0 {
        return Ok(());
    }
    let ip = idx
        .map(|t| t.cuda().map(|b| read_ptr(b, dev)))
        .transpose()?;
    let pp = positions
        .map(|t| t.cuda().map(|b| read_ptr(b, dev)))
        .transpose()?;
    let (op, _go) = read_ptr(owner.cuda()?, dev);
    let (pg, _gp) = read_ptr(pages.cuda()?, dev);
    let (bd, _gb) = read_ptr(bounds.cuda()?, dev);
    let (o, _gout) = write_ptr(out.cuda_mut()?, dev);
    let p = di_paged_rows_params {
        idx: ip.as_ref().map_or(std::ptr::null(), |(p, _)| p.cast()),
        positions: pp.as_ref().map_or(std::ptr::null(), |(p, _)| p.cast()),
        owner: op.cast(),
        pages: pg.cast(),
        bounds: bd.cast(),
        out: o.cast(),
        tokens: i64::from(i32_param("tokens", tokens)?),
        width: i32_param("width", width)?,
        entries: i32_param("entries", entries)?,
        table_pages: i32_param("table_pages", table_pages)?,
        page_rows: i32_param("page_rows", page_rows)?,
    };
    const THREADS: u32 = 256;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (super::grid_for(total, THREADS as usize), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernels::gather::PAGED_ROWS, cfg, &p)
}
