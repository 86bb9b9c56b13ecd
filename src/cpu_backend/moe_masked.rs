//! The masked (fixed-capacity) MoE layout of the expert-parallel
//! low-latency mode, the reference of `kernels-cuda/moe/masked.cu`.
//!
//! Layout: `E` experts of `C` rows each (`[E, C, ·]` buffers, row
//! `e · C + c`). Entry `j = token · top_k + slot` routed to expert `e` takes
//! rank `r = #{j' < j : ids[j'] == e}` (the entries of earlier tokens and
//! earlier slots), so an expert's rows hold its entries in ascending entry
//! order, the layout depends on nothing but the ids (no atomics on the
//! device) and an entry's row never depends on later tokens. Entry j lands
//! on row `pos[j] = e · C + r` when `r < C`; otherwise it is dropped
//! (`pos[j] = -1`) and counted in `dropped[e]`. An id outside `0..E` is
//! dropped and counted in `dropped[E]`.

use crate::dtype::{E4M3, E8M0};
use crate::numerics::act_quant_block;
use half::bf16;

/// The masked layout of `n` routed entries.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskedLayout {
    /// Row of each entry in the `[E, C]` buffers, or −1 when dropped, `[n]`.
    pub pos: Vec<i32>,
    /// Rows filled per expert, `min(entries, C)`, `[E]`.
    pub counts: Vec<i32>,
    /// Routing weight of each row, 0.0 past an expert's count, `[E · C]`.
    pub w_out: Vec<f32>,
    /// Entries dropped per expert past its capacity, then the entries whose
    /// id lies outside `0..E`, `[E + 1]`.
    pub dropped: Vec<i32>,
}

/// The layout of `ids` (`[n]` expert ids, any value) with their routing
/// `weights` (`[n]`) over `experts` experts of `capacity` rows. Panics when
/// `experts · capacity` or `n` reaches 2^31 (int32 rows).
pub fn masked_layout(
    ids: &[i32],
    weights: &[f32],
    experts: usize,
    capacity: usize,
) -> MaskedLayout {
    assert!(
        i32::try_from(experts * capacity).is_ok() && i32::try_from(ids.len()).is_ok(),
        "masked_layout: int32 rows"
    );
    let mut seen = vec![0usize; experts];
    let mut pos = Vec::with_capacity(ids.len());
    let mut w_out = vec![0.0f32; experts * capacity];
    let mut dropped = vec![0i32; experts + 1];
    for (&e, &w) in ids.iter().zip(weights) {
        let Some(e) = usize::try_from(e).ok().filter(|&e| e < experts) else {
            pos.push(-1);
            dropped[experts] += 1;
            continue;
        };
        let r = seen[e];
        seen[e] += 1;
        if r < capacity {
            let row = e * capacity + r;
            w_out[row] = w;
            pos.push(row as i32);
        } else {
            pos.push(-1);
            dropped[e] += 1;
        }
    }
    MaskedLayout {
        pos,
        counts: seen.iter().map(|&s| s.min(capacity) as i32).collect(),
        w_out,
        dropped,
    }
}

/// The rows of `pos` (`[tokens · top_k]`, a layout's) that lie in `0..rows`,
/// as (entry, row) pairs: the entries a scatter writes and a combine reads.
fn placed(pos: &[i32], rows: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    pos.iter().enumerate().filter_map(move |(j, &p)| {
        usize::try_from(p)
            .ok()
            .filter(|&p| p < rows)
            .map(|p| (j, p))
    })
}

/// BF16 payload: `out[pos[j]] = x[j / top_k]` for every entry whose row
/// lies in `0..rows` of `out` (`[rows, d]`); other rows are left as they are.
pub fn masked_scatter_bf16(x: &[bf16], pos: &[i32], top_k: usize, d: usize, out: &mut [bf16]) {
    let rows = out.len().checked_div(d).unwrap_or(0);
    for (j, p) in placed(pos, rows) {
        let t = j / top_k;
        out[p * d..(p + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
    }
}

/// FP8 payload: the 1 × 32 quantisation of `x[j / top_k]` (bitwise
/// `act_quant_fp8` of that row, `d` a multiple of 32) into row `pos[j]` of
/// `q` (`[rows, d]`) and `scales` (`[rows, d / 32]`).
pub fn masked_scatter_fp8(
    x: &[bf16],
    pos: &[i32],
    top_k: usize,
    d: usize,
    q: &mut [E4M3],
    scales: &mut [E8M0],
) {
    let rows = q.len().checked_div(d).unwrap_or(0);
    let blocks = d / crate::contract::MX_BLOCK;
    for (j, p) in placed(pos, rows) {
        let t = j / top_k;
        let xr = &x[t * d..(t + 1) * d];
        let qr = &mut q[p * d..(p + 1) * d];
        let sr = &mut scales[p * blocks..(p + 1) * blocks];
        for ((xb, qb), s) in xr
            .chunks(crate::contract::MX_BLOCK)
            .zip(qr.chunks_mut(crate::contract::MX_BLOCK))
            .zip(sr.iter_mut())
        {
            *s = act_quant_block(xb, qb);
        }
    }
}

/// `out[t] = BF16(Σ_slot row(pos[t · top_k + slot]) + shared[t])`: the
/// expert rows of `expert_out` (`[rows, d]`) summed from 0.0 in fp32 in slot
/// order, a dropped entry (a row outside `0..rows`) adding 0.0, the shared
/// row last, one rounding: bitwise `moe_combine` over the same rows with
/// zero rows for the dropped entries. `shared` and the result are
/// `[tokens, d]`.
pub fn masked_combine(
    expert_out: &[bf16],
    pos: &[i32],
    shared: &[bf16],
    top_k: usize,
    d: usize,
) -> Vec<bf16> {
    let rows = expert_out.len().checked_div(d).unwrap_or(0);
    let tokens = shared.len().checked_div(d).unwrap_or(0);
    let mut out = Vec::with_capacity(tokens * d);
    for t in 0..tokens {
        let rows_of: Vec<Option<usize>> = pos[t * top_k..(t + 1) * top_k]
            .iter()
            .map(|&p| usize::try_from(p).ok().filter(|&p| p < rows))
            .collect();
        for x in 0..d {
            let acc = rows_of.iter().fold(0.0f32, |acc, r| {
                acc + r.map_or(0.0, |r| expert_out[r * d + x].to_f32())
            });
            out.push(bf16::from_f32(acc + shared[t * d + x].to_f32()));
        }
    }
    out
}
