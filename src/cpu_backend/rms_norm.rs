//! RMSNorm reference. The sum of squares is accumulated in fp32 in index
//! order; the inverse RMS is `1 / sqrt(mean + eps)` with IEEE sqrt and division.
//! Also the RMSNorm + FP8 1×32 quantiser pair that the fused kernel computes.

use super::act_quant_fp8;
use crate::dtype::{E4M3, E8M0};
use half::bf16;

/// `x` is `[rows, dim]`, `weight` is `[dim]`; returns `[rows, dim]`.
pub fn rms_norm(x: &[bf16], weight: &[bf16], rows: usize, dim: usize, eps: f32) -> Vec<bf16> {
    let mut out = Vec::with_capacity(rows * dim);
    for row in x.chunks_exact(dim).take(rows) {
        let sum_sq: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
        let inv_rms = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
        out.extend(
            row.iter()
                .zip(weight)
                .map(|(v, w)| bf16::from_f32(w.to_f32() * (v.to_f32() * inv_rms))),
        );
    }
    out
}

/// RMSNorm fused with the FP8 1×32 quantiser, stated as the composition it
/// stands for: `y = rms_norm(x)` (BF16), then `act_quant_fp8(y)`. `x` is
/// `[rows, dim]`, `weight` `[dim]`; returns (`y` `[rows, dim]`, `q`
/// `[rows, dim]` e4m3, scales `[rows, ⌈dim/32⌉]` E8M0).
pub fn rms_norm_act_quant_fp8(
    x: &[bf16],
    weight: &[bf16],
    rows: usize,
    dim: usize,
    eps: f32,
) -> (Vec<bf16>, Vec<E4M3>, Vec<E8M0>) {
    let y = rms_norm(x, weight, rows, dim, eps);
    let (q, scales) = act_quant_fp8(&y, rows, dim);
    (y, q, scales)
}
