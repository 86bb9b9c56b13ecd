//! The W2 input of an expert: the clamped SwiGLU times the routing weight
//! (`moe::swiglu`, `v41-flash.md` §7.2), rounded to BF16, then the FP8 1×32
//! quantiser (§10.1). Stated as that composition, one row (token) at a time,
//! because each row has its own routing weight.

use super::act_quant_fp8;
use super::moe::swiglu;
use crate::dtype::{E4M3, E8M0};
use half::bf16;

/// `g` and `u` are `[rows, inter]` (the W1 and W3 outputs), `weight` is
/// `[rows]` (1.0 for the shared expert), `limit` is L. Returns (`q`
/// `[rows, inter]` e4m3, scales `[rows, ⌈inter/32⌉]` E8M0) of
/// `h = BF16(SiLU(min(g, L)) · clamp(u, −L, L) · weight)`.
pub fn swiglu_act_quant_fp8(
    g: &[bf16],
    u: &[bf16],
    weight: &[f32],
    rows: usize,
    inter: usize,
    limit: f32,
) -> (Vec<E4M3>, Vec<E8M0>) {
    let mut h = Vec::with_capacity(rows * inter);
    for ((gr, ur), &w) in g
        .chunks_exact(inter)
        .zip(u.chunks_exact(inter))
        .zip(weight)
        .take(rows)
    {
        h.extend(swiglu(gr, ur, w, limit));
    }
    act_quant_fp8(&h, rows, inter)
}
