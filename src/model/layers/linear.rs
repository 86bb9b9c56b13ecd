//! The linear layers of V4.1 (`v41-flash.md` §10.6) as thin owners of their
//! weight tensors: FP8 and FP4 linears quantise their BF16 input per 1 × 32
//! and return BF16; BF16 linears take their input unquantised and return
//! BF16 or (promoted) fp32.
//!
//! A norm's output that feeds FP8 linears is a [`Normed`]: the BF16 rows
//! with their FP8 quantisation made in the same pass, so the linears that
//! read it share one quantisation.
//!
//! Invariant: every weight is row-major `[out, in]` (FP4 experts stacked
//! `[E, out, in]`); FP8 scales sit on a 32 × 32 grid, FP4 scales one per
//! (row, 32 along in). All tensors of a layer live on one device.

use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;
use std::ops::Deref;

/// The RMSNorm of a sublayer's input (BF16 `y` `[T, D]`) with its FP8 1×32
/// quantisation (`q` e4m3, `s` E8M0 `[T, D/32]`), made in one pass by
/// `ops::rms_norm_act_quant_fp8` (`q`, `s` are bitwise `act_quant_fp8(y)`
/// on every device). Dereferences to `y` for the readers that take BF16.
#[derive(Clone, Debug)]
pub struct Normed {
    pub y: Tensor,
    pub q: Tensor,
    pub s: Tensor,
}

impl Normed {
    /// RMSNorm of `x` with `weight` and `eps`, and its quantisation (two
    /// ops where D passes the fused kernel's [`ops::RMS_NORM_ACT_QUANT_MAX_DIM`]).
    pub fn new(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Normed> {
        if x.shape()
            .last()
            .is_some_and(|&d| d > ops::RMS_NORM_ACT_QUANT_MAX_DIM)
        {
            let y = ops::rms_norm(x, weight, eps)?;
            let (q, s) = ops::act_quant_fp8(&y)?;
            return Ok(Normed { y, q, s });
        }
        let (y, q, s) = ops::rms_norm_act_quant_fp8(x, weight, eps)?;
        Ok(Normed { y, q, s })
    }
}

impl Deref for Normed {
    type Target = Tensor;

    fn deref(&self) -> &Tensor {
        &self.y
    }
}

/// An FP8 e4m3 linear with E8M0 scales per 32 × 32 block.
#[derive(Clone, Debug)]
pub struct Fp8Linear {
    /// `[out, in]` e4m3.
    pub weight: Tensor,
    /// `[⌈out/32⌉, ⌈in/32⌉]` E8M0.
    pub scale: Tensor,
}

impl Fp8Linear {
    /// `x` `[rows, in]` BF16 → `[rows, out]` BF16.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (q, s) = ops::act_quant_fp8(x)?;
        self.forward_quantized(&q, &s)
    }

    /// The linear of an already quantised input (e4m3 `q`, E8M0 `s`).
    pub fn forward_quantized(&self, q: &Tensor, s: &Tensor) -> Result<Tensor> {
        ops::mxfp8_linear(q, s, &self.weight, &self.scale, DType::BF16)
    }

    /// The linear of a norm output, through its quantisation.
    pub fn forward_normed(&self, x: &Normed) -> Result<Tensor> {
        self.forward_quantized(&x.q, &x.s)
    }
}

/// A BF16 linear.
#[derive(Clone, Debug)]
pub struct Bf16Linear {
    /// `[out, in]` BF16.
    pub weight: Tensor,
}

impl Bf16Linear {
    /// BF16 × BF16 with fp32 accumulation, BF16 out.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::bf16_linear(x, &self.weight, DType::BF16)
    }

    /// Input and weight promoted to fp32, fp32 out.
    pub fn forward_f32(&self, x: &Tensor) -> Result<Tensor> {
        ops::bf16_linear(x, &self.weight, DType::F32)
    }

    pub fn out_dim(&self) -> usize {
        self.weight.shape().first().copied().unwrap_or(0)
    }
}

/// One projection of every routed expert: packed FP4 e2m1 `[E, out, in]`
/// with E8M0 scales `[E, out, in/32]`.
#[derive(Clone, Debug)]
pub struct Fp4Experts {
    pub weight: Tensor,
    pub scale: Tensor,
}

impl Fp4Experts {
    /// Rows of the quantised input grouped by expert (`offsets` I32
    /// `[E + 1]`) → BF16 `[rows, out]`.
    pub fn forward(&self, q: &Tensor, s: &Tensor, offsets: &Tensor) -> Result<Tensor> {
        ops::mxfp4_grouped_contiguous(q, s, &self.weight, &self.scale, offsets, DType::BF16)
    }

    /// The masked layout: `q` `[E, C, in]` (with `s`), of which the first
    /// `counts[e]` rows of expert e are valid → BF16 `[E, C, out]`, the
    /// other rows +0.0.
    pub fn forward_masked(&self, q: &Tensor, s: &Tensor, counts: &Tensor) -> Result<Tensor> {
        let dim = |i: usize| q.shape().get(i).copied().unwrap_or(0);
        let (e, c) = (dim(0), dim(1));
        let out_dim = self.weight.shape().get(1).copied().unwrap_or(0);
        let mut out = Tensor::zeros(&q.device(), DType::BF16, &[e, c, out_dim])?;
        ops::mxfp4_grouped_masked_into(q, s, &self.weight, &self.scale, counts, &mut out)?;
        Ok(out)
    }
}
