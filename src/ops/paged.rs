//! Logical rows → physical rows of a paged row pool, on the device: the
//! state pool's caches keep each (sequence, cache)'s rows in pages through
//! a block table, and the attention kernels read physical rows. These ops
//! turn a step's logical lists (index lists, window positions) into the
//! physical lists the kernels take without a round trip through the host.
//!
//! - [`paged_rows`]: `out[t, j]` = the physical row of logical row
//!   `idx[t, j]` of entry `owner[t]`'s table.
//! - [`paged_window_rows`]: the same for the window list of the query at
//!   `positions[t]`: rows `max(0, p + 1 − width) + j`, −1 past p.
//!
//! Rule ([`BlockTables`]): row r of entry e lives at physical row
//! `pages[e, r / page_rows − first_e] · page_rows + r % page_rows` when
//! `lo_e ≤ r < hi_e`, the column lies inside the table and its page is
//! ≥ 0. Every other r maps to −1: a negative r, an owner outside the
//! tables, a missing page, a row past `i32`.
//!
//! Invariant: the shapes and dtypes are checked here; the values are not
//! (they live on the device) and need not be: the CPU reference and the
//! kernel bounds-check every read against the shapes, so any values give
//! the same list on both devices, bitwise.

use crate::cpu_backend::paged::{self, Tables};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{common_device, shape_error};
use crate::tensor::Tensor;

const OP: &str = "paged_rows";
const WINDOW_OP: &str = "paged_window_rows";

/// Per-entry block tables of one cache.
#[derive(Clone, Copy, Debug)]
pub struct BlockTables<'a> {
    /// I32 `[entries, table_pages]`: the physical page of logical page
    /// `first + c` in column c, −1 for none.
    pub pages: &'a Tensor,
    /// I32 `[entries, 3]`: `first`, then the valid logical rows `lo .. hi`.
    pub bounds: &'a Tensor,
    /// Rows per page (> 0).
    pub page_rows: usize,
}

/// The tables' (entries, table_pages) after checking their shapes.
fn check_tables(op: &'static str, t: &BlockTables) -> Result<(usize, usize)> {
    t.pages.expect_dtype(op, "pages", DType::I32)?;
    t.bounds.expect_dtype(op, "bounds", DType::I32)?;
    let (entries, width) = match *t.pages.shape() {
        [e, w] => (e, w),
        _ => {
            return Err(shape_error(
                op,
                "pages",
                t.pages,
                "[entries, table_pages]".into(),
            ));
        }
    };
    if t.bounds.shape() != [entries, 3] {
        return Err(shape_error(
            op,
            "bounds",
            t.bounds,
            format!("[{entries}, 3] (pages' entries)"),
        ));
    }
    if t.page_rows == 0 || i32::try_from(t.page_rows).is_err() {
        return Err(Error::Argument {
            op,
            arg: "page_rows",
            value: t.page_rows.to_string(),
            why: "must be positive and fit i32",
        });
    }
    if i32::try_from(entries).is_err() || i32::try_from(width).is_err() {
        return Err(shape_error(
            op,
            "pages",
            t.pages,
            "fewer than 2^31 entries and pages".into(),
        ));
    }
    Ok((entries, width))
}

/// `owner` is I32 `[tokens]`.
fn check_owner(op: &'static str, owner: &Tensor, tokens: usize) -> Result<()> {
    owner.expect_dtype(op, "owner", DType::I32)?;
    if owner.shape() != [tokens] {
        return Err(shape_error(op, "owner", owner, format!("[{tokens}]")));
    }
    Ok(())
}

/// I32 `[tokens, width]`: the physical row of each logical row of `idx`
/// (I32 `[tokens, width]`) in the table of entry `owner[t]` (I32
/// `[tokens]`), −1 where it has none (see the module doc).
pub fn paged_rows(idx: &Tensor, owner: &Tensor, tables: BlockTables) -> Result<Tensor> {
    idx.expect_dtype(OP, "idx", DType::I32)?;
    let (tokens, width) = match *idx.shape() {
        [t, w] => (t, w),
        _ => return Err(shape_error(OP, "idx", idx, "[tokens, width]".into())),
    };
    check_owner(OP, owner, tokens)?;
    run(OP, Some(idx), None, owner, tables, (tokens, width))
}

/// I32 `[tokens, width]`: the window list of the query at `positions[t]`
/// (I64 `[tokens]`) as physical rows of entry `owner[t]`'s ring: logical
/// rows `max(0, p + 1 − width) + j` in ascending order, −1 past p or where
/// the ring holds no row.
pub fn paged_window_rows(
    positions: &Tensor,
    owner: &Tensor,
    tables: BlockTables,
    width: usize,
) -> Result<Tensor> {
    positions.expect_dtype(WINDOW_OP, "positions", DType::I64)?;
    let tokens = match *positions.shape() {
        [t] => t,
        _ => {
            return Err(shape_error(
                WINDOW_OP,
                "positions",
                positions,
                "[tokens]".into(),
            ));
        }
    };
    check_owner(WINDOW_OP, owner, tokens)?;
    run(
        WINDOW_OP,
        None,
        Some(positions),
        owner,
        tables,
        (tokens, width),
    )
}

fn run(
    op: &'static str,
    idx: Option<&Tensor>,
    positions: Option<&Tensor>,
    owner: &Tensor,
    tables: BlockTables,
    (tokens, width): (usize, usize),
) -> Result<Tensor> {
    let (entries, table_pages) = check_tables(op, &tables)?;
    if i32::try_from(width).is_err() {
        return Err(Error::Argument {
            op,
            arg: "width",
            value: width.to_string(),
            why: "must fit i32",
        });
    }
    let mut named = vec![
        ("owner", owner),
        ("pages", tables.pages),
        ("bounds", tables.bounds),
    ];
    named.extend(idx.map(|t| ("idx", t)));
    named.extend(positions.map(|t| ("positions", t)));
    let device = common_device(op, &named)?;
    let mut out = Tensor::empty(&device, DType::I32, &[tokens, width])?;
    match device {
        Device::Cpu => {
            let list = paged::paged_rows(
                idx.map(|t| t.as_slice::<i32>()).transpose()?,
                positions.map_or(Ok(&[][..]), |t| t.as_slice::<i64>())?,
                owner.as_slice::<i32>()?,
                Tables {
                    pages: tables.pages.as_slice::<i32>()?,
                    bounds: tables.bounds.as_slice::<i32>()?,
                    table_pages,
                    page_rows: tables.page_rows,
                },
                width,
            );
            out.as_mut_slice::<i32>()?.copy_from_slice(&list);
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::paged_rows(
            &dev,
            (idx, positions, owner),
            (tables.pages, tables.bounds),
            &mut out,
            [tokens, width, entries, table_pages, tables.page_rows],
        )?,
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = entries;
            return Err(crate::ops::kernels_not_built(op, &d));
        }
    }
    Ok(out)
}
