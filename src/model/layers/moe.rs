//! The MoE FFN of one block (`v41-flash.md` §7): fp32 router GEMM,
//! √softplus routing, the grouped FP4 routed experts and the FP8 shared
//! expert with the clamped SwiGLU, combined in ascending expert id with the
//! shared expert last.
//!
//! Invariant: every token is computed independently of the others (the
//! grouped GEMMs compute each row alone), so a token's output does not
//! depend on the batch.

use super::linear::{Bf16Linear, Fp4Experts, Fp8Linear};
use crate::dtype::DType;
use crate::model::error::Result;
use crate::model::marks::Marks;
use crate::ops;
use crate::tensor::Tensor;

/// The shared expert.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    pub w1: Fp8Linear,
    pub w2: Fp8Linear,
    pub w3: Fp8Linear,
}

/// A MoE FFN: router, FP4 routed experts, FP8 shared expert.
#[derive(Clone, Debug)]
pub struct Moe {
    /// `[experts, D]` BF16, used as an fp32 GEMM.
    pub gate: Bf16Linear,
    /// `[experts]` F32 selection bias.
    pub bias: Tensor,
    pub w1: Fp4Experts,
    pub w2: Fp4Experts,
    pub w3: Fp4Experts,
    pub shared: SharedExpert,
}

/// The routing settings of one MoE.
#[derive(Clone, Copy, Debug)]
pub struct MoeParams {
    pub top_k: usize,
    pub route_scale: f32,
    pub gate_temp: f32,
    pub swiglu_limit: f32,
}

impl Moe {
    /// `x` BF16 `[T, D]` (the `ffn_norm` output) → BF16 `[T, D]` and the
    /// selected expert ids I32 `[T, top_k]` (ascending per token).
    pub fn forward(&self, x: &Tensor, p: MoeParams) -> Result<(Tensor, Tensor)> {
        let mut checks = ops::DeviceChecks::new();
        let out = self.forward_marked(x, p, &mut Marks::off(), &mut checks)?;
        checks.verdict()?;
        Ok(out)
    }

    /// [`Moe::forward`] marking its parts (`moe.route`, `moe.experts`,
    /// `moe.shared`, `moe.combine`), its device range checks left in
    /// `checks` (the permutation comes from `moe_layout` on the same
    /// device, so they hold by construction; the caller reads them once a
    /// step instead of two syncs a layer).
    pub(crate) fn forward_marked(
        &self,
        x: &Tensor,
        p: MoeParams,
        marks: &mut Marks,
        checks: &mut ops::DeviceChecks,
    ) -> Result<(Tensor, Tensor)> {
        let mut logits = self.gate.forward_f32(x)?;
        if p.gate_temp != 1.0 {
            logits = ops::div_scalar(&logits, p.gate_temp)?;
        }
        let (ids, weights) = ops::moe_route(&logits, &self.bias, p.top_k, p.route_scale)?;
        let (_, offsets, perm) = ops::moe_layout(&ids, self.gate.out_dim())?;
        let (xg, wg) = ops::moe_permute_deferred(x, &weights, &perm, checks)?;
        marks.mark("moe.route")?;
        let (xq, xs) = ops::act_quant_fp8(&xg)?;
        let g = self.w1.forward(&xq, &xs, &offsets)?;
        let u = self.w3.forward(&xq, &xs, &offsets)?;
        let (hq, hs) = ops::swiglu_act_quant_fp8(&g, &u, &wg, p.swiglu_limit)?;
        let routed = self.w2.forward(&hq, &hs, &offsets)?;
        marks.mark("moe.experts")?;

        let s = &self.shared;
        let (xq, xs) = ops::act_quant_fp8(x)?;
        let g = s.w1.forward_quantized(&xq, &xs)?;
        let u = s.w3.forward_quantized(&xq, &xs)?;
        let ones = Tensor::full_f32(&x.device(), &[x.rows()], 1.0)?;
        let (hq, hs) = ops::swiglu_act_quant_fp8(&g, &u, &ones, p.swiglu_limit)?;
        let shared = ops::mxfp8_linear(&hq, &hs, &s.w2.weight, &s.w2.scale, DType::BF16)?;
        marks.mark("moe.shared")?;
        let out = ops::moe_combine_deferred(&routed, &perm, &shared, checks)?;
        marks.mark("moe.combine")?;
        Ok((out, ids))
    }
}
