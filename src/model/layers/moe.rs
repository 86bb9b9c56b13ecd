//! The MoE FFN of one block (`v41-flash.md` §7): fp32 router GEMM,
//! √softplus routing, the grouped FP4 routed experts and the FP8 shared
//! expert with the clamped SwiGLU, combined in ascending expert id with the
//! shared expert last.
//!
//! Invariant: every token is computed independently of the others (the
//! grouped GEMMs compute each row alone), so a token's output does not
//! depend on the batch.

use super::linear::{Bf16Linear, Fp4Experts, Fp8Linear, Normed};
use crate::contract::MX_BLOCK;
use crate::dtype::DType;
use crate::model::error::Result;
use crate::model::marks::Marks;
use crate::ops;
use crate::tensor::Tensor;

/// The shared expert.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// `w1` and `w3` as one `[2 · inter, D]` linear, their rows interleaved
    /// in blocks of 32 (the layout `ops::swiglu_act_quant_fp8` reads).
    pub w13: Fp8Linear,
    pub w2: Fp8Linear,
}

/// A MoE FFN: router, FP4 routed experts, FP8 shared expert.
#[derive(Clone, Debug)]
pub struct Moe {
    /// `[experts, D]` BF16, used as an fp32 GEMM.
    pub gate: Bf16Linear,
    /// `[experts]` F32 selection bias.
    pub bias: Tensor,
    /// Each expert's `w1` and `w3` as one `[2 · inter, D]` projection, rows
    /// interleaved in blocks of 32 like [`SharedExpert::w13`].
    pub w13: Fp4Experts,
    pub w2: Fp4Experts,
    pub shared: SharedExpert,
}

/// The routing settings of one MoE.
#[derive(Clone, Copy, Debug)]
pub struct MoeParams {
    pub top_k: usize,
    pub route_scale: f32,
    pub gate_temp: f32,
    pub swiglu_limit: f32,
    pub layout: MoeLayout,
}

/// Which grouped layout the routed experts run in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MoeLayout {
    /// Rows grouped by expert, one after another (`moe_layout`, the
    /// contiguous FP4 GEMM): the layout of prefill, and of every step on a
    /// batch-invariant device (its kernels do not depend on the row count).
    Contiguous,
    /// Each expert's rows in a fixed-capacity `[E, T, ·]` buffer
    /// (`moe_masked_*`, the masked FP4 GEMM, whose work follows the rows
    /// each expert holds rather than 128-row tiles).
    Masked,
    /// On a device that is not batch-invariant, masked for steps of at
    /// most 16 tokens, and for steps of up to [`MASKED_MAX_TOKENS`] while
    /// the tokens an expert gets on average (top-k · T / experts) stay at
    /// most [`MASKED_MAX_PER_EXPERT`] and the buffers at most
    /// [`MASKED_MAX_ROWS`] rows; contiguous otherwise.
    #[default]
    Auto,
}

/// The most tokens a step runs in the masked layout under
/// [`MoeLayout::Auto`] whatever its experts: its buffers hold T rows an
/// expert (`[E, T, ·]`), so they grow with T · experts.
pub const MASKED_MAX_TOKENS: usize = 256;

/// The most rows (experts · T) of the masked layout's buffers under
/// [`MoeLayout::Auto`] past 16 tokens: 48 experts × 256 tokens, the largest
/// point measured (an EP-8 rank at batch 256), about 0.3 GB of buffers a
/// layer at V4.1's widths; a rank of more experts runs larger batches
/// contiguous.
pub const MASKED_MAX_ROWS: usize = 48 * 256;

/// The most tokens an expert gets on average (top-k · T / experts) in a
/// step that [`MoeLayout::Auto`] runs masked; at most 16 tokens every step
/// is masked. The masked kernel (V6) takes an expert's rows in windows of 16,
/// each reading its weights again; the contiguous one pads every expert to
/// 128-row tiles. Measured at one EP rank of V4.1-Flash (H200, 2026-12-04,
/// `benches/results/2026-12-04-h200-model-sweep-masked-windows.json`
/// against `…-device-tables.json`, routed experts per decode step):
/// 8 tokens an expert 17.5 ms masked against 57.9 contiguous, 16: 13.1
/// against 30.4, 32: 43.3 against 58.7, 64: 9.3 against 9.3 (6 experts)
/// and 37.8 against 31.0 (24 experts), 256: 31.9 against 17.9.
pub const MASKED_MAX_PER_EXPERT: usize = 32;

impl MoeLayout {
    /// The layout a step of `tokens` rows, each routed to `top_k` of
    /// `experts`, runs on `device`.
    pub fn resolve(
        self,
        tokens: usize,
        experts: usize,
        top_k: usize,
        device: &crate::device::Device,
    ) -> MoeLayout {
        let few = tokens <= 16
            || (tokens <= MASKED_MAX_TOKENS
                && experts.saturating_mul(tokens) <= MASKED_MAX_ROWS
                && tokens.saturating_mul(top_k) <= MASKED_MAX_PER_EXPERT.saturating_mul(experts));
        match self {
            MoeLayout::Auto if few && !device.batch_invariant() => MoeLayout::Masked,
            MoeLayout::Auto => MoeLayout::Contiguous,
            l => l,
        }
    }
}

impl Moe {
    /// `x` BF16 `[T, D]` (the `ffn_norm` output, with its quantisation) →
    /// BF16 `[T, D]` and the selected expert ids I32 `[T, top_k]`
    /// (ascending per token).
    pub fn forward(&self, x: &Normed, p: MoeParams) -> Result<(Tensor, Tensor)> {
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
        x: &Normed,
        p: MoeParams,
        marks: &mut Marks,
        checks: &mut ops::DeviceChecks,
    ) -> Result<(Tensor, Tensor)> {
        let mut logits = self.gate.forward_f32(x)?;
        if p.gate_temp != 1.0 {
            logits = ops::div_scalar(&logits, p.gate_temp)?;
        }
        let (ids, weights) = ops::moe_route(&logits, &self.bias, p.top_k, p.route_scale)?;
        if p.layout
            .resolve(x.rows(), self.gate.out_dim(), p.top_k, &x.device())
            == MoeLayout::Masked
        {
            return self.masked(x, ids, &weights, p, marks);
        }
        let (_, offsets, perm) = ops::moe_layout(&ids, self.gate.out_dim())?;
        // The norm's own quantisation, permuted: the same bits as
        // quantising the permuted BF16 rows (the quantiser is per row).
        let (xq, xs, wg) = ops::moe_permute_fp8_deferred(&x.q, &x.s, &weights, &perm, checks)?;
        marks.mark("moe.route")?;
        let gu = self.w13.forward(&xq, &xs, &offsets)?;
        let (hq, hs) = ops::swiglu_act_quant_fp8(&gu, &wg, p.swiglu_limit)?;
        let routed = self.w2.forward(&hq, &hs, &offsets)?;
        marks.mark("moe.experts")?;
        let shared = self.shared_expert(x, p)?;
        marks.mark("moe.shared")?;
        let out = ops::moe_combine_deferred(&routed, &perm, &shared, checks)?;
        marks.mark("moe.combine")?;
        Ok((out, ids))
    }

    /// The routed experts in the masked layout ([`MoeLayout::Masked`]),
    /// capacity T (a token routes to an expert at most once, so nothing is
    /// dropped): the same rows, quantisation, SwiGLU weights and combine
    /// order as the contiguous path. Rows past an expert's count are +0.0
    /// through the experts (the GEMM outputs start zeroed), so no kernel
    /// reads memory nothing wrote.
    fn masked(
        &self,
        x: &Normed,
        ids: Tensor,
        weights: &Tensor,
        p: MoeParams,
        marks: &mut Marks,
    ) -> Result<(Tensor, Tensor)> {
        let device = x.device();
        let (t, d) = (x.rows(), x.shape().get(1).copied().unwrap_or(0));
        let e = self.gate.out_dim();
        let mut pos = Tensor::empty(&device, DType::I32, &[t, p.top_k])?;
        let mut counts = Tensor::empty(&device, DType::I32, &[e])?;
        let mut w_rows = Tensor::empty(&device, DType::F32, &[e, t])?;
        let mut dropped = Tensor::empty(&device, DType::I32, &[e + 1])?;
        ops::moe_masked_layout_into(
            &ids,
            weights,
            &mut pos,
            &mut counts,
            &mut w_rows,
            &mut dropped,
        )?;
        let mut xq = Tensor::zeros(&device, DType::F8E4M3, &[e, t, d])?;
        let mut xs = Tensor::zeros(&device, DType::E8M0, &[e, t, d / MX_BLOCK])?;
        ops::moe_masked_scatter_into(x, &pos, &mut xq, Some(&mut xs))?;
        marks.mark("moe.route")?;
        let gu = self.w13.forward_masked(&xq, &xs, &counts)?;
        let inter = gu.shape().get(2).copied().unwrap_or(0) / 2;
        let (hq, hs) = ops::swiglu_act_quant_fp8(
            &gu.reshape(&[e * t, 2 * inter])?,
            &w_rows.reshape(&[e * t])?,
            p.swiglu_limit,
        )?;
        let hq = hq.reshape(&[e, t, inter])?;
        let hs = hs.reshape(&[e, t, inter / MX_BLOCK])?;
        let routed = self.w2.forward_masked(&hq, &hs, &counts)?;
        marks.mark("moe.experts")?;
        let shared = self.shared_expert(x, p)?;
        marks.mark("moe.shared")?;
        let mut out = Tensor::empty(&device, DType::BF16, &[t, d])?;
        ops::moe_masked_combine_into(&routed, &pos, &shared, &mut out)?;
        marks.mark("moe.combine")?;
        Ok((out, ids))
    }

    /// The shared expert of `x`: the clamped SwiGLU of the FP8 `w1`, `w3`
    /// (one GEMM, `w13`, on x's quantisation) with weight 1, then `w2`.
    fn shared_expert(&self, x: &Normed, p: MoeParams) -> Result<Tensor> {
        let s = &self.shared;
        let gu = s.w13.forward_normed(x)?;
        let ones = Tensor::full_f32(&x.device(), &[x.rows()], 1.0)?;
        let (hq, hs) = ops::swiglu_act_quant_fp8(&gu, &ones, p.swiglu_limit)?;
        Ok(ops::mxfp8_linear(
            &hq,
            &hs,
            &s.w2.weight,
            &s.w2.scale,
            DType::BF16,
        )?)
    }
}
