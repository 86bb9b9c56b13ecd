//! The MoE FFN of one block (`v41-flash.md` §7): fp32 router GEMM,
//! √softplus routing, FP4 routed experts and the FP8 shared expert with the
//! clamped SwiGLU, combined in ascending expert id with the shared expert last.

use super::config::ModelConfig;
use super::weights::MoeWeights;
use crate::cpu_backend::moe::{moe_combine, route, swiglu};
use half::bf16;

/// `x` is `[len, D]` (the `ffn_norm` output); returns `[len, D]` and each
/// token's selected experts (ascending).
pub fn moe(
    cfg: &ModelConfig,
    w: &MoeWeights,
    top_k: usize,
    x: &[bf16],
    len: usize,
) -> (Vec<bf16>, Vec<Vec<usize>>) {
    let d = cfg.hidden_size;
    let m = cfg.moe;
    let (limit, temp) = (m.swiglu_limit as f32, m.gate_temp as f32);
    let logits = w.gate.forward_f32(x, len);
    let n_experts = w.gate.out_dim;
    let mut out = Vec::with_capacity(len * d);
    let mut selected = Vec::with_capacity(len);
    for t in 0..len {
        let xt = &x[t * d..(t + 1) * d];
        let z: Vec<f32> = logits[t * n_experts..(t + 1) * n_experts]
            .iter()
            .map(|v| v / temp)
            .collect();
        let r = route(&z, &w.bias, top_k, m.route_scale as f32);
        let routed: Vec<Vec<bf16>> = r
            .experts
            .iter()
            .zip(&r.weights)
            .map(|(&e, &weight)| {
                let ex = &w.experts[e];
                let h = swiglu(&ex.w1.forward(xt, 1), &ex.w3.forward(xt, 1), weight, limit);
                ex.w2.forward(&h, 1)
            })
            .collect();
        let s = &w.shared;
        let shared = s.w2.forward(
            &swiglu(&s.w1.forward(xt, 1), &s.w3.forward(xt, 1), 1.0, limit),
            1,
        );
        let refs: Vec<&[bf16]> = routed.iter().map(|v| v.as_slice()).collect();
        out.extend(moe_combine(&refs, &shared));
        selected.push(r.experts);
    }
    (out, selected)
}
