//! Logical rows → physical rows of a paged row pool: the CPU reference of
//! `ops::paged_rows` and `kernels-cuda/gather/`'s `paged_rows`.
//!
//! Invariant: every read is bounds-checked against the table's shape, so
//! any index values give −1, never a panic or an out-of-range read.

/// Entry `e`'s block table (`pages` `[entries, table_pages]`, `bounds`
/// `[entries, 3]`: the logical page of column 0, then the valid logical
/// rows `lo .. hi`) and its page size.
#[derive(Clone, Copy, Debug)]
pub struct Tables<'a> {
    pub pages: &'a [i32],
    pub bounds: &'a [i32],
    pub table_pages: usize,
    pub page_rows: usize,
}

impl Tables<'_> {
    /// The physical row of logical row `r` of entry `e`, or −1 (a negative
    /// `r`, an entry outside the tables, a row outside `lo .. hi`, a column
    /// outside the table, a negative page, or a row past `i32`).
    pub fn row(&self, e: i64, r: i64) -> i32 {
        let pr = self.page_rows as i64;
        let (Ok(e), true) = (usize::try_from(e), r >= 0 && pr > 0) else {
            return -1;
        };
        let Some(&[first, lo, hi]) = self.bounds.get(3 * e..3 * e + 3) else {
            return -1;
        };
        if r < i64::from(lo) || r >= i64::from(hi) {
            return -1;
        }
        let c = r / pr - i64::from(first);
        let page = usize::try_from(c)
            .ok()
            .filter(|&c| c < self.table_pages)
            .and_then(|c| self.pages.get(e * self.table_pages + c));
        match page {
            Some(&page) if page >= 0 => i32::try_from(i64::from(page) * pr + r % pr).unwrap_or(-1),
            _ => -1,
        }
    }
}

/// `out[t, j]` = the physical row of `idx[t, j]` for entry `owner[t]`
/// (`idx` `[tokens, width]`); with `idx` `None`, of row
/// `max(0, positions[t] + 1 − width) + j`, −1 past `positions[t]` (the
/// window list of a query at that position).
pub fn paged_rows(
    idx: Option<&[i32]>,
    positions: &[i64],
    owner: &[i32],
    tables: Tables,
    width: usize,
) -> Vec<i32> {
    let w = width as i64;
    (0..owner.len() * width)
        .map(|i| {
            let (t, j) = (i / width, (i % width) as i64);
            let r = match idx {
                Some(idx) => idx.get(i).map_or(-1, |&r| i64::from(r)),
                None => match positions.get(t).copied() {
                    // first = max(0, pos + 1 − w) without overflow; first + j
                    // ≤ pos + 1 − w + j ≤ pos for j < w, or ≤ j ≤ pos.
                    Some(pos) if pos >= 0 => {
                        let first = if pos >= w { pos - w + 1 } else { 0 };
                        if first + j > pos { -1 } else { first + j }
                    }
                    _ => -1,
                },
            };
            tables.row(i64::from(owner.get(t).copied().unwrap_or(-1)), r)
        })
        .collect()
}
