//! Random paged-pool problems for `ops::paged_rows` and
//! `ops::paged_window_rows`, with the expected lists from an independent
//! model of the pool: a map (entry, logical page) → physical page, not the
//! ops' table arithmetic.
#![allow(dead_code)]

use deepinfer::{Device, Tensor, ops};
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::HashMap;

/// One problem: tables, owners, logical lists and positions, and what each
/// op must return.
pub struct Problem {
    pub page_rows: usize,
    pub entries: usize,
    pub table_pages: usize,
    pub pages: Vec<i32>,
    pub bounds: Vec<i32>,
    pub owner: Vec<i32>,
    pub width: usize,
    pub idx: Vec<i32>,
    pub positions: Vec<i64>,
    pub expect_rows: Vec<i32>,
    pub expect_window: Vec<i32>,
}

impl Problem {
    pub fn tensors(&self) -> [Tensor; 5] {
        let t = self.owner.len();
        [
            Tensor::from_vec(self.pages.clone(), &[self.entries, self.table_pages]).unwrap(),
            Tensor::from_vec(self.bounds.clone(), &[self.entries, 3]).unwrap(),
            Tensor::from_vec(self.owner.clone(), &[t]).unwrap(),
            Tensor::from_vec(self.idx.clone(), &[t, self.width]).unwrap(),
            Tensor::from_vec(self.positions.clone(), &[t]).unwrap(),
        ]
    }
}

/// A problem of `tokens` rows over `entries` tables: each entry holds a
/// run of logical pages from `first` (some missing: −1), valid rows
/// `lo .. hi`; owners are mostly valid entries, some out of range; logical
/// rows are mostly inside an entry's span, some negative or far past it.
pub fn problem(rng: &mut StdRng, tokens: usize, entries: usize, width: usize) -> Problem {
    let page_rows = [1usize, 3, 16, 64, 256][rng.random_range(0..5)];
    let table_pages = rng.random_range(1..8usize);
    let pool_pages = 4096i32;
    let mut map: HashMap<(i32, i64), i32> = HashMap::new();
    let mut pages = Vec::new();
    let mut bounds = Vec::new();
    let mut span = Vec::new();
    for e in 0..entries as i32 {
        let first = rng.random_range(0..5i64);
        for c in 0..table_pages as i64 {
            let p = if rng.random_bool(0.15) {
                -1
            } else {
                rng.random_range(0..pool_pages)
            };
            pages.push(p);
            if p >= 0 {
                map.insert((e, first + c), p);
            }
        }
        let start = first * page_rows as i64;
        let end = start + (table_pages * page_rows) as i64;
        let lo = rng.random_range(start.saturating_sub(2).max(0)..=start + page_rows as i64);
        let hi = rng.random_range(lo..=end + 2);
        bounds.extend([first as i32, lo as i32, hi as i32]);
        span.push((lo, hi));
    }
    let expect_of = |e: i32, r: i64| -> i32 {
        let Some(&(lo, hi)) = usize::try_from(e).ok().and_then(|e| span.get(e)) else {
            return -1;
        };
        if r < 0 || r < lo || r >= hi {
            return -1;
        }
        match map.get(&(e, r / page_rows as i64)) {
            Some(&p) => p * page_rows as i32 + (r % page_rows as i64) as i32,
            None => -1,
        }
    };
    let mut owner = Vec::new();
    let (mut idx, mut positions) = (Vec::new(), Vec::new());
    let (mut expect_rows, mut expect_window) = (Vec::new(), Vec::new());
    for _ in 0..tokens {
        let e = match rng.random_range(0..20) {
            0 => -1 - rng.random_range(0..3),
            1 => entries as i32 + rng.random_range(0..3),
            _ => rng.random_range(0..entries as i32),
        };
        owner.push(e);
        let (lo, hi) = usize::try_from(e)
            .ok()
            .and_then(|e| span.get(e))
            .copied()
            .unwrap_or((0, 8));
        for _ in 0..width {
            let r: i64 = match rng.random_range(0..10) {
                0 => -rng.random_range(1..5),
                1 => hi + rng.random_range(0..1000),
                _ => rng.random_range((lo - 3).max(0)..hi + 3),
            };
            idx.push(r as i32);
            expect_rows.push(expect_of(e, r));
        }
        let p: i64 = rng.random_range(0..hi + 4);
        positions.push(p);
        let first = (p + 1 - width as i64).max(0);
        for j in 0..width as i64 {
            let r = first + j;
            expect_window.push(if r > p { -1 } else { expect_of(e, r) });
        }
    }
    Problem {
        page_rows,
        entries,
        table_pages,
        pages,
        bounds,
        owner,
        width,
        idx,
        positions,
        expect_rows,
        expect_window,
    }
}

/// Edge cases with known answers (worked out by hand), each with its name:
/// extreme positions, a page whose rows lie past i32, width 0, no tokens.
pub fn edges() -> Vec<(Problem, &'static str)> {
    let mk = |positions: Vec<i64>,
              idx: Vec<i32>,
              width: usize,
              pages: Vec<i32>,
              expect_window: Vec<i32>,
              expect_rows: Vec<i32>| Problem {
        page_rows: 4,
        entries: 1,
        table_pages: pages.len(),
        pages,
        bounds: vec![0, 0, i32::MAX],
        owner: vec![0; positions.len()],
        width,
        idx,
        positions,
        expect_rows,
        expect_window,
    };
    vec![
        (
            mk(
                vec![i64::MAX, i64::MIN, -1],
                vec![-1; 6],
                2,
                vec![5, 6],
                vec![-1; 6],
                vec![-1; 6],
            ),
            "extreme positions",
        ),
        (
            // Page i32::MAX / 2 holds rows past i32 at 4 rows a page.
            mk(
                vec![5, 1],
                vec![5, 1, 0, 3],
                2,
                vec![7, i32::MAX / 2],
                vec![-1, -1, 28, 29],
                vec![-1, 29, 28, 31],
            ),
            "rows past i32",
        ),
        (
            mk(vec![3, 9], vec![], 0, vec![1], vec![], vec![]),
            "width 0",
        ),
        (mk(vec![], vec![], 3, vec![1], vec![], vec![]), "no tokens"),
    ]
}

/// Both ops over `p` on `device`: (`paged_rows`, `paged_window_rows`), read
/// back to the host.
pub fn run_on(p: &Problem, device: &Device) -> (Vec<i32>, Vec<i32>) {
    let [pages, bounds, owner, idx, positions] = p.tensors().map(|t| t.to_device(device).unwrap());
    let tables = ops::BlockTables {
        pages: &pages,
        bounds: &bounds,
        page_rows: p.page_rows,
    };
    let rows = ops::paged_rows(&idx, &owner, tables).unwrap();
    let window = ops::paged_window_rows(&positions, &owner, tables, p.width).unwrap();
    (rows.to_vec().unwrap(), window.to_vec().unwrap())
}
