//! Row copies by host index lists, for tensors of any dtype; the
//! expert-parallel dispatch and combine move their rows with them.
//!
//! - [`gather_rows`]: `out[i] = x[rows[i]]` over the first dimension (rank
//!   ≥ 1; ≥ 2 for packed FP4, whose rows are whole bytes), a new tensor.
//! - [`copy_rows_into`]: `dst[dst_rows[i]] = src[src_rows[i]]` over the
//!   rows of the matrix views (every dimension but the last flattened), into
//!   an existing tensor whose other rows are left as they are.
//!
//! Invariant: every index is checked against its tensor's rows, and the
//! destination rows of one copy are distinct, before anything is copied (a
//! typed error names the first bad one); the CPU copies row by row (runs of
//! consecutive indices at once), CUDA copies the whole list in one launch
//! (`kernels-cuda/gather/`), bitwise the same rows.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const OP: &str = "gather_rows";
const COPY_OP: &str = "copy_rows_into";

/// The rows of a tensor `op` gathers from: its first dimension (rank ≥ 1,
/// and ≥ 2 for packed FP4, whose rank-1 row is half a byte).
fn gathered_rows(op: &'static str, x: &Tensor) -> Result<usize> {
    match x.shape() {
        [_] if x.dtype() == DType::F4E2M1x2 => Err(super::shape_error(
            op,
            "x",
            x,
            "rank >= 2 (a packed FP4 row of rank 1 is half a byte)".into(),
        )),
        [n, ..] => Ok(*n),
        [] => Err(super::shape_error(op, "x", x, "rank >= 1".into())),
    }
}

/// Rows `rows[0], rows[1], …` of `x` as a new tensor on x's device
/// (`[rows.len(), …]`); an index may repeat.
pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let n_rows = gathered_rows(OP, x)?;
    if let Some(&bad) = rows.iter().find(|&&r| r >= n_rows) {
        return Err(Error::Argument {
            op: OP,
            arg: "rows",
            value: bad.to_string(),
            why: "a row index at or past x's rows",
        });
    }
    let shape: Vec<usize> = std::iter::once(rows.len())
        .chain(x.shape().iter().skip(1).copied())
        .collect();
    let mut out = Tensor::empty(&x.device(), x.dtype(), &shape)?;
    match x.device() {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let row_bytes = x.dtype().storage_bytes(x.shape().iter().skip(1).product());
            crate::cuda_backend::copy_rows(
                &dev,
                x,
                Some(rows),
                &mut out,
                None,
                (rows.len(), row_bytes),
            )?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let mut at = 0;
    while let Some(rest @ [start, ..]) = rows.get(at..) {
        let start = *start;
        let run = rest
            .iter()
            .zip(start..)
            .take_while(|&(&r, want)| r == want)
            .count();
        out.copy_rows_from(at, x, start, run)?;
        at += run;
    }
    Ok(out)
}

const BLOCKS_OP: &str = "gather_row_blocks";

/// The first `n` rows of the blocks `blocks[0], blocks[1], …` of `x`, one
/// after another, as a new tensor on x's device (`[n, …]`): block b is rows
/// `b·block_rows .. (b + 1)·block_rows` of x and lies wholly inside it, and
/// `n` ≤ `blocks.len()·block_rows` (a paged pool's first n rows from its
/// page list). On CUDA one gather launch copies the whole blocks and one
/// copy the partial last one; a block may repeat.
pub fn gather_row_blocks(
    x: &Tensor,
    block_rows: usize,
    blocks: &[usize],
    n: usize,
) -> Result<Tensor> {
    let n_rows = gathered_rows(BLOCKS_OP, x)?;
    let bad = |arg: &'static str, value: usize, why: &'static str| Error::Argument {
        op: BLOCKS_OP,
        arg,
        value: value.to_string(),
        why,
    };
    if block_rows == 0 {
        return Err(bad("block_rows", 0, "must be positive"));
    }
    let whole = n_rows / block_rows;
    if let Some(&b) = blocks.iter().find(|&&b| b >= whole) {
        return Err(bad("blocks", b, "a block at or past x's last whole block"));
    }
    if blocks
        .len()
        .checked_mul(block_rows)
        .is_none_or(|cap| n > cap)
    {
        return Err(bad("n", n, "more rows than the blocks hold"));
    }
    let shape: Vec<usize> = std::iter::once(n)
        .chain(x.shape().iter().skip(1).copied())
        .collect();
    let mut out = Tensor::empty(&x.device(), x.dtype(), &shape)?;
    let (full, tail) = (n / block_rows, n % block_rows);
    match x.device() {
        Device::Cpu => {
            for (i, &b) in blocks.iter().take(full).enumerate() {
                out.copy_rows_from(i * block_rows, x, b * block_rows, block_rows)?;
            }
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let row_bytes = x.dtype().storage_bytes(x.shape().iter().skip(1).product());
            crate::cuda_backend::copy_rows(
                &dev,
                x,
                Some(&blocks[..full]),
                &mut out,
                None,
                (full, row_bytes * block_rows),
            )?;
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(BLOCKS_OP, &d)),
    }
    if let Some(&b) = blocks.get(full).filter(|_| tail > 0) {
        out.copy_rows_from(full * block_rows, x, b * block_rows, tail)?;
    }
    Ok(out)
}

const DEVICE_BLOCKS_OP: &str = "gather_blocks";

/// The blocks `blocks[0], blocks[1], …` of `x` one after another, as a new
/// tensor on x's device (`[blocks.len()·block_rows, …]`), from an I32
/// list `blocks` `[n]` on x's device: block b is rows `b·block_rows ..
/// (b + 1)·block_rows` of x. A block outside x's whole blocks (or
/// negative) gives zero rows. [`gather_row_blocks`] with the list on the
/// device, read by the kernel (no host copy: a CUDA graph can replay it
/// with new lists); a block may repeat.
pub fn gather_blocks(x: &Tensor, block_rows: usize, blocks: &Tensor) -> Result<Tensor> {
    let n_rows = gathered_rows(DEVICE_BLOCKS_OP, x)?;
    if block_rows == 0 {
        return Err(Error::Argument {
            op: DEVICE_BLOCKS_OP,
            arg: "block_rows",
            value: "0".into(),
            why: "must be positive",
        });
    }
    blocks.expect_dtype(DEVICE_BLOCKS_OP, "blocks", DType::I32)?;
    let n = match blocks.shape() {
        &[n] => n,
        _ => {
            return Err(super::shape_error(
                DEVICE_BLOCKS_OP,
                "blocks",
                blocks,
                "[n]".into(),
            ));
        }
    };
    let device = super::common_device(DEVICE_BLOCKS_OP, &[("x", x), ("blocks", blocks)])?;
    let rows = n.checked_mul(block_rows).ok_or_else(|| Error::Argument {
        op: DEVICE_BLOCKS_OP,
        arg: "blocks",
        value: n.to_string(),
        why: "more rows than an index can name",
    })?;
    let shape: Vec<usize> = std::iter::once(rows)
        .chain(x.shape().iter().skip(1).copied())
        .collect();
    let mut out = Tensor::zeros(&device, x.dtype(), &shape)?;
    let whole = n_rows / block_rows;
    match device {
        Device::Cpu => {
            for (i, &b) in blocks.as_slice::<i32>()?.iter().enumerate() {
                if let Ok(b) = usize::try_from(b)
                    && b < whole
                {
                    out.copy_rows_from(i * block_rows, x, b * block_rows, block_rows)?;
                }
            }
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            // Whole blocks of x are the kernel's rows (its row count is
            // x's bytes over a block's, rounded down): a block past them is
            // a row outside x, which the kernel skips.
            let row_bytes = x.dtype().storage_bytes(x.shape().iter().skip(1).product());
            crate::cuda_backend::gather_blocks(
                &dev,
                x,
                blocks,
                &mut out,
                (n, row_bytes * block_rows),
            )?;
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(DEVICE_BLOCKS_OP, &d)),
    }
    Ok(out)
}

/// The rows of `t`'s matrix view: (rows, row length), every dimension but
/// the last flattened; packed FP4 is refused (a row must be whole bytes of a
/// byte-addressable dtype for the element copies below).
fn matrix_rows(op: &'static str, t: &Tensor, name: &'static str) -> Result<(usize, usize)> {
    match t.shape().split_last() {
        Some((&width, lead)) if t.dtype() != DType::F4E2M1x2 => Ok((lead.iter().product(), width)),
        _ => Err(super::shape_error(
            op,
            name,
            t,
            "rank >= 1, not packed FP4".into(),
        )),
    }
}

/// (dst rows, src rows, row width) of a row copy between the matrix views
/// of `dst` and `src`: one dtype, one last dimension.
fn copy_shapes(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<(usize, usize, usize)> {
    src.expect_dtype(op, "src", dst.dtype())?;
    let (n_dst, width) = matrix_rows(op, dst, "dst")?;
    let (n_src, src_width) = matrix_rows(op, src, "src")?;
    if src_width != width {
        return Err(super::shape_error(
            op,
            "src",
            src,
            format!("[…, {width}] (dst's last dimension)"),
        ));
    }
    Ok((n_dst, n_src, width))
}

/// `dst[dst_rows[i]] = src[src_rows[i]]` for every i, over the rows of the
/// matrix views of `dst` and `src` (every dimension but the last flattened:
/// `[L, C, D]` has L·C rows of D). Both tensors have one dtype (not packed
/// FP4), one last dimension and one device; the two lists have one length,
/// every index lies inside its tensor, and no destination row repeats (on
/// CUDA two writers of one row would race). Rows of `dst` not named keep
/// their contents.
pub fn copy_rows_into(
    dst: &mut Tensor,
    dst_rows: &[usize],
    src: &Tensor,
    src_rows: &[usize],
) -> Result<()> {
    let (n_dst, n_src, width) = copy_shapes(COPY_OP, dst, src)?;
    if dst_rows.len() != src_rows.len() {
        return Err(Error::Argument {
            op: COPY_OP,
            arg: "src_rows",
            value: format!("{} indices", src_rows.len()),
            why: "needs one source row per destination row",
        });
    }
    let bad = |arg: &'static str, value: usize, why: &'static str| Error::Argument {
        op: COPY_OP,
        arg,
        value: value.to_string(),
        why,
    };
    if let Some(&r) = src_rows.iter().find(|&&r| r >= n_src) {
        return Err(bad("src_rows", r, "a row index at or past src's rows"));
    }
    let mut seen = vec![false; n_dst];
    for &r in dst_rows {
        match seen.get_mut(r) {
            None => return Err(bad("dst_rows", r, "a row index at or past dst's rows")),
            Some(true) => return Err(bad("dst_rows", r, "a destination row named twice")),
            Some(s) => *s = true,
        }
    }
    let device = super::common_device(COPY_OP, &[("dst", dst), ("src", src)])?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let row_bytes = dst.dtype().storage_bytes(width);
            return crate::cuda_backend::copy_rows(
                &dev,
                src,
                Some(src_rows),
                dst,
                Some(dst_rows),
                (dst_rows.len(), row_bytes),
            );
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(COPY_OP, &d)),
    }
    for (&d, &s) in dst_rows.iter().zip(src_rows) {
        dst.copy_elems_from(d * width, src, s * width, width)?;
    }
    Ok(())
}

const WHERE_OP: &str = "copy_rows_where";

/// [`copy_rows_into`] with the lists on the device: I32 `dst_rows` and
/// `src_rows` `[n]` on dst's device, and a pair whose destination lies
/// outside `[0, dst rows)` or whose source lies outside `[0, src rows)` is
/// skipped (−1 names "no copy"), so the values need no host check and the
/// launch is the same whatever they hold (a CUDA-graph step refills the
/// lists, not the launch). The destination rows of the pairs copied must be
/// distinct: the CPU applies a repeat in order, on CUDA two writers of one
/// row race.
pub fn copy_rows_where(
    dst: &mut Tensor,
    dst_rows: &Tensor,
    src: &Tensor,
    src_rows: &Tensor,
) -> Result<()> {
    let (n_dst, n_src, width) = copy_shapes(WHERE_OP, dst, src)?;
    dst_rows.expect_dtype(WHERE_OP, "dst_rows", DType::I32)?;
    src_rows.expect_dtype(WHERE_OP, "src_rows", DType::I32)?;
    let n = match dst_rows.shape() {
        &[n] => n,
        _ => {
            return Err(super::shape_error(
                WHERE_OP,
                "dst_rows",
                dst_rows,
                "[n]".into(),
            ));
        }
    };
    if src_rows.shape() != [n] {
        return Err(super::shape_error(
            WHERE_OP,
            "src_rows",
            src_rows,
            format!("[{n}] (dst_rows' length)"),
        ));
    }
    let device = super::common_device(
        WHERE_OP,
        &[
            ("dst", dst),
            ("src", src),
            ("dst_rows", dst_rows),
            ("src_rows", src_rows),
        ],
    )?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let row_bytes = dst.dtype().storage_bytes(width);
            return crate::cuda_backend::copy_rows_where(
                &dev,
                src,
                src_rows,
                dst,
                dst_rows,
                (n, row_bytes),
            );
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(WHERE_OP, &d)),
    }
    let inside = |r: i32, rows: usize| usize::try_from(r).ok().filter(|&r| r < rows);
    for (&d, &s) in dst_rows
        .to_vec::<i32>()?
        .iter()
        .zip(&src_rows.to_vec::<i32>()?)
    {
        if let (Some(d), Some(s)) = (inside(d, n_dst), inside(s, n_src)) {
            dst.copy_elems_from(d * width, src, s * width, width)?;
        }
    }
    Ok(())
}
