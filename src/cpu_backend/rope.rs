//! Rotary position embedding reference (`v41-flash.md` §3.2), with the
//! per-layer θ and optional YaRN frequency blend, and the inverse rotation
//! applied to the attention output (§3.1 step 5).
//!
//! Layout: `x` is `[tokens, heads, head_dim]` BF16 with one position per
//! token. Only the **last** `rope_dim` elements of each head vector rotate
//! (for V4.1 attention: dims 448…511 of 512; for the indexer: 64…127 of
//! 128); the first `head_dim − rope_dim` pass through unchanged. Within that
//! slice, pair i is the adjacent elements (2i, 2i+1) (interleaved, not split
//! halves) and rotates by the angle `fp32(p) · freq_i`.
//!
//! Numerics, which a caller can rely on (all fp32, as the spec states):
//! - freq_i = 1 / θ^(2i/d) with d = `rope_dim`: the exponent 2i/d is an fp32
//!   division, the power is the fp32 value nearest θ^e (evaluated in f64,
//!   then rounded), the reciprocal an fp32 division. With YaRN the blend
//!   below follows in fp32, in the spec's operation order.
//! - The angle is ONE fp32 multiply of `p as f32` (exact for |p| ≤ 2^24,
//!   which covers the 1,048,576-token context) by freq_i; it is never formed
//!   in double precision, because at long context its fp32 rounding is part
//!   of the reference.
//! - cos and sin of that fp32 angle are evaluated in f64 and rounded to fp32
//!   (the correctly rounded fp32 values, barring double rounding); GPU
//!   implementations may differ in the last ulp, as the spec allows.
//! - (x₀, x₁) → (x₀·cos − x₁·sin, x₀·sin + x₁·cos) from the BF16 inputs
//!   promoted to fp32, each product rounded to fp32 (no fused multiply-add),
//!   then rounded to BF16 (nearest even). The inverse uses −sin.

pub use crate::contract::{RopeParams, Yarn};
use half::bf16;
use std::f64::consts::PI;

/// The YaRN correction band (low, high) of §3.2, in double precision:
/// corr(β) = d · ln(L₀ / (2π · β)) / (2 · ln θ), low = max(⌊corr(β_fast)⌋, 0),
/// high = min(⌈corr(β_slow)⌉, d − 1). For θ = 160000, d = 64, L₀ = 65,536,
/// β = 32 / 1 this is (15, 25).
pub fn yarn_band(theta: f64, rope_dim: usize, yarn: &Yarn) -> (i64, i64) {
    let d = rope_dim as f64;
    let corr = |beta: f64| {
        d * (yarn.original_seq_len as f64 / (beta * 2.0 * PI)).ln() / (2.0 * theta.ln())
    };
    let low = (corr(yarn.beta_fast).floor() as i64).max(0);
    let high = (corr(yarn.beta_slow).ceil() as i64).min(rope_dim as i64 - 1);
    (low, high)
}

/// The `rope_dim / 2` rotation frequencies of a layer (radians per position).
/// With YaRN (and `original_seq_len > 0`), for pair i:
/// ramp = clamp((i − low) / max(high − low, 0.001), 0, 1), smooth = 1 − ramp,
/// freq ← (freq / factor) · (1 − smooth) + freq · smooth, all in fp32.
pub fn rope_freqs(params: &RopeParams, rope_dim: usize) -> Vec<f32> {
    let theta = crate::numerics::round_f32(params.theta);
    let freqs = (0..rope_dim / 2).map(|i| {
        let e = (2 * i) as f32 / rope_dim as f32;
        1.0 / crate::numerics::round_f32(f64::from(theta).powf(f64::from(e)))
    });
    match params.yarn {
        Some(yarn) if yarn.original_seq_len > 0 => {
            let (low, high) = yarn_band(params.theta, rope_dim, &yarn);
            let span = (high.saturating_sub(low) as f32).max(0.001);
            let factor = crate::numerics::round_f32(yarn.factor);
            freqs
                .enumerate()
                .map(|(i, f)| {
                    let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
                    let smooth = 1.0 - ramp;
                    f / factor * (1.0 - smooth) + f * smooth
                })
                .collect()
        }
        _ => freqs.collect(),
    }
}

/// Rotates the last `rope_dim` dims of every head of `x` (`[tokens, heads,
/// head_dim]`, tokens = `positions.len()`) by the angles of its token's
/// position. `rope_dim` is even and at most `head_dim`. Returns the new
/// `[tokens, heads, head_dim]`.
pub fn rope(
    x: &[bf16],
    positions: &[i64],
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    params: &RopeParams,
) -> Vec<bf16> {
    rotate(x, positions, heads, head_dim, rope_dim, params, false)
}

/// The inverse of [`rope`] (rotation by −angle, i.e. with −sin), applied to
/// the attention output at the query positions. Same layout and arguments.
pub fn inverse_rope(
    x: &[bf16],
    positions: &[i64],
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    params: &RopeParams,
) -> Vec<bf16> {
    rotate(x, positions, heads, head_dim, rope_dim, params, true)
}

fn rotate(
    x: &[bf16],
    positions: &[i64],
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    params: &RopeParams,
    inverse: bool,
) -> Vec<bf16> {
    let token_len = heads * head_dim;
    let mut out = x[..positions.len() * token_len].to_vec();
    if token_len == 0 {
        return out;
    }
    let freqs = rope_freqs(params, rope_dim);
    let mut cos_sin = vec![(0.0f32, 0.0f32); freqs.len()];
    for (&p, token) in positions.iter().zip(out.chunks_exact_mut(token_len)) {
        for (cs, &f) in cos_sin.iter_mut().zip(&freqs) {
            let angle = f64::from(p as f32 * f);
            let sin = crate::numerics::round_f32(angle.sin());
            *cs = (
                crate::numerics::round_f32(angle.cos()),
                if inverse { -sin } else { sin },
            );
        }
        for head in token.chunks_exact_mut(head_dim) {
            let slice = &mut head[head_dim - rope_dim..];
            for (pair, &(cos, sin)) in slice.chunks_exact_mut(2).zip(&cos_sin) {
                let (x0, x1) = (pair[0].to_f32(), pair[1].to_f32());
                pair[0] = bf16::from_f32(x0 * cos - x1 * sin);
                pair[1] = bf16::from_f32(x0 * sin + x1 * cos);
            }
        }
    }
    out
}
