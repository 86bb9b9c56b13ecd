//! MoE reference (`v41-flash.md` §7): √softplus routing with biased
//! selection and unbiased renormalised weights, the clamped SwiGLU, and the
//! combine in ascending expert id with the shared expert last.
//!
//! Tie rule (the spec leaves it open): among equal biased scores the lower
//! expert id is selected first. Selected experts are returned in ascending id,
//! the order the combine adds them in.

use crate::numerics::{sigmoid, softplus};
use half::bf16;

/// One token's routing decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Selected expert ids, ascending.
    pub experts: Vec<usize>,
    /// Routing weight of each selected expert (same order).
    pub weights: Vec<f32>,
}

/// Routes one token from its fp32 gate logits (already divided by
/// `gate_temp`): scores √softplus(z); the top `k` by score + bias (ties to the
/// lower id); weights s_i / (Σ s + 1e-20) · `route_scale` on unbiased scores.
pub fn route(logits: &[f32], bias: &[f32], k: usize, route_scale: f32) -> Routing {
    let scores: Vec<f32> = logits.iter().map(|&z| softplus(z).sqrt()).collect();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a] + bias[a], scores[b] + bias[b]);
        sb.total_cmp(&sa).then(a.cmp(&b))
    });
    order.truncate(k);
    // The normaliser sums the selected scores in selection (rank) order, as
    // the reference sums its top-k output.
    let denom = order.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20;
    let mut experts = order;
    experts.sort_unstable();
    let weights = experts
        .iter()
        .map(|&e| scores[e] / denom * route_scale)
        .collect();
    Routing { experts, weights }
}

/// h = SiLU(min(g, L)) · clamp(u, −L, L) · weight in fp32, rounded to BF16
/// (the W2 input before its FP8 quantisation). The shared expert passes 1.0.
pub fn swiglu(g: &[bf16], u: &[bf16], weight: f32, limit: f32) -> Vec<bf16> {
    g.iter()
        .zip(u)
        .map(|(g, u)| {
            let g = g.to_f32().min(limit);
            let u = u.to_f32().clamp(-limit, limit);
            let silu = g * sigmoid(g);
            bf16::from_f32(silu * u * weight)
        })
        .collect()
}

/// Σ routed outputs (given in ascending expert id) + shared, fp32 from 0.0,
/// rounded to BF16 once.
pub fn moe_combine(routed: &[&[bf16]], shared: &[bf16]) -> Vec<bf16> {
    (0..shared.len())
        .map(|x| {
            let acc = routed.iter().fold(0.0f32, |acc, r| acc + r[x].to_f32());
            bf16::from_f32(acc + shared[x].to_f32())
        })
        .collect()
}
