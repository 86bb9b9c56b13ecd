//! Exact scale sharing for MXFP8 operands (issue 13; `kernels-cuda/gemm/
//! README.md`, "Lab: the consumer pipeline"): inside every run of
//! `group / 32` consecutive 32-deep blocks of K, a block whose E8M0 scale
//! 2^e is below the run's largest 2^E is rewritten to scale 2^E, each of its
//! e4m3 codes v replaced by the code of v · 2^(e − E), when every such code
//! of the run is exact. A GEMM can then promote once per run (one chained
//! wgmma, DeepGEMM's rate at 128) wherever a run shares one scale, and per
//! 32 elsewhere.
//!
//! Invariant: every element's value, code · scale, is unchanged bit for bit
//! (sign of zero included), and a run that is not rewritten keeps its bytes.
//! So the per-32 reference GEMM (`cpu_backend::gemm`) gives the same bits on
//! the rewritten operand: each block sum is the old one times 2^(e − E)
//! exactly (the products are exact and at least 2^−27, far from fp32's
//! subnormals) and each a_s · b_s the old one times 2^(E − e), while those
//! products stay in fp32's normal range, which the reference assumes anyway.

use crate::dtype::{E4M3, E8M0};
use crate::error::{Error, Result};
use crate::numerics::{E8M0_NAN, e4m3_to_f32, f32_to_e4m3};

/// K elements per scale block.
use crate::contract::MX_BLOCK as BLOCK;

/// Rewrites `codes` (`[rows, k]` e4m3, row-major) and `scales` (one E8M0
/// per `rows_per_scale` rows and 32 of K: `[⌈rows / rows_per_scale⌉,
/// ⌈k / 32⌉]`; 1 for activations' 1 × 32 blocks, 32 for weights' 32 × 32)
/// so that every run of `group / 32` blocks (the last run of a row may be
/// shorter) shares its largest scale wherever that is exact, as the module
/// says. A run holding a NaN scale, or a NaN code in a block that would
/// shift, is left as it is.
/// Returns how many runs share one scale afterwards (those that already
/// did included), out of `⌈rows / rows_per_scale⌉ · ⌈⌈k / 32⌉ / (group /
/// 32)⌉`.
pub fn share_mx_scales(
    codes: &mut [E4M3],
    scales: &mut [E8M0],
    rows: usize,
    k: usize,
    rows_per_scale: usize,
    group: usize,
) -> Result<usize> {
    const OP: &str = "share_mx_scales";
    check_share_args(OP, group, rows_per_scale)?;
    let want_codes = rows.checked_mul(k);
    if want_codes != Some(codes.len()) {
        return Err(Error::Shape {
            op: OP,
            tensor: "codes",
            got: vec![codes.len()],
            expected: format!("rows · k = {rows} · {k} values"),
        });
    }
    let kb = k.div_ceil(BLOCK);
    let scale_rows = rows.div_ceil(rows_per_scale);
    if scale_rows.checked_mul(kb) != Some(scales.len()) {
        return Err(Error::Shape {
            op: OP,
            tensor: "scales",
            got: vec![scales.len()],
            expected: format!("[{scale_rows}, {kb}] scales"),
        });
    }
    let per = group / BLOCK;
    let Some(chunk) = k.checked_mul(rows_per_scale).filter(|&c| c > 0) else {
        // No K (so no codes and no scales) or an absurd row group: nothing to share.
        return Ok(0);
    };
    let mut shared = 0;
    let mut next = Vec::new();
    // One scale row (its 1 or 32 rows of codes) at a time, run by run.
    for (srow, rows_of) in scales.chunks_mut(kb).zip(codes.chunks_mut(chunk)) {
        for (ri, run) in srow.chunks_mut(per).enumerate() {
            if run.contains(&E8M0_NAN) {
                continue;
            }
            let top = run.iter().map(|s| s.0).max().unwrap_or(0);
            if run.iter().all(|s| s.0 == top) {
                shared += 1;
                continue;
            }
            let cols = |j: usize| {
                let c0 = (ri * per + j) * BLOCK;
                c0..(c0 + BLOCK).min(k)
            };
            // Every rewritten code, block by block and row by row, while
            // each one is exact.
            next.clear();
            let exact = run.iter().enumerate().all(|(j, s)| {
                let d = i32::from(top) - i32::from(s.0);
                d == 0
                    || rows_of.chunks(k).all(|row| {
                        row.get(cols(j)).is_some_and(|block| {
                            block.iter().all(|&v| match shifted(v, d) {
                                Some(c) => {
                                    next.push(c);
                                    true
                                }
                                None => false,
                            })
                        })
                    })
            });
            if !exact {
                continue;
            }
            let mut it = next.iter();
            for (j, s) in run.iter_mut().enumerate() {
                if s.0 == top {
                    continue;
                }
                *s = E8M0(top);
                for row in rows_of.chunks_mut(k) {
                    for (v, &c) in row.get_mut(cols(j)).into_iter().flatten().zip(&mut it) {
                        *v = c;
                    }
                }
            }
            shared += 1;
        }
    }
    Ok(shared)
}

/// The argument checks of [`share_mx_scales`] and `ops::mx_share_scales`,
/// on behalf of `op`: `group` a positive multiple of 32, at least one row
/// per scale.
pub(crate) fn check_share_args(
    op: &'static str,
    group: usize,
    rows_per_scale: usize,
) -> Result<()> {
    if group == 0 || !group.is_multiple_of(BLOCK) {
        return Err(Error::Argument {
            op,
            arg: "group",
            value: group.to_string(),
            why: "a positive multiple of 32",
        });
    }
    if rows_per_scale == 0 {
        return Err(Error::Argument {
            op,
            arg: "rows_per_scale",
            value: "0".into(),
            why: "at least one row per scale",
        });
    }
    Ok(())
}

/// The e4m3 code of `v` · 2^−d (d ≥ 1) when that value is exactly an e4m3
/// value, same sign of zero included; None otherwise (NaN included).
fn shifted(v: E4M3, d: i32) -> Option<E4M3> {
    let x = e4m3_to_f32(v);
    if x.is_nan() {
        return None;
    }
    if x == 0.0 {
        return Some(v);
    }
    // A nonzero e4m3 value is below 2^9 (448) and at least 2^−9 apart from
    // zero: past d = 17 none survives (448 · 2^−18 < 2^−9).
    if d > 17 {
        return None;
    }
    // 2^-d from its bits (d <= 17): exact by construction.
    let y = x * f32::from_bits(((127 - d) as u32) << 23);
    let c = f32_to_e4m3(y);
    (e4m3_to_f32(c).to_bits() == y.to_bits()).then_some(c)
}
