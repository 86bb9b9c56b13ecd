//! FP8 1×32 activation quantiser reference: one E8M0 scale per 32 elements of
//! each row, the tail block over its own elements.

use crate::contract::MX_BLOCK;
use crate::dtype::{E4M3, E8M0};
use crate::numerics::act_quant_block;
use half::bf16;

/// `x` is `[rows, k]`; returns (`[rows, k]` e4m3, `[rows, ⌈k/32⌉]` E8M0).
pub fn act_quant_fp8(x: &[bf16], rows: usize, k: usize) -> (Vec<E4M3>, Vec<E8M0>) {
    let mut q = vec![E4M3(0); rows * k];
    let mut scales = Vec::with_capacity(rows * k.div_ceil(MX_BLOCK));
    for (xr, qr) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        for (xb, qb) in xr.chunks(MX_BLOCK).zip(qr.chunks_mut(MX_BLOCK)) {
            scales.push(act_quant_block(xb, qb));
        }
    }
    (q, scales)
}
