//! Host-resident weights of the V4.1 model in the formats the forward pass
//! consumes, and the linear layers' forward rules (`v41-flash.md` §10.6):
//! FP8 and FP4 linears quantise their BF16 input per 1 × 32 and return BF16;
//! BF16 linears take their input unquantised and return BF16; fp32 linears
//! promote input and weight and return fp32.
//!
//! Invariant: every weight is row-major `[out, in]`; FP8 scales sit on a
//! 32 × 32 grid (`[⌈out/32⌉, ⌈in/32⌉]`), FP4 scales one per (row, 32 along in).

use crate::cpu_backend::{self, bf16_gemm, f32_gemm, fp4_gemm, fp8_gemm};
use crate::dtype::{E4M3, E8M0, Fp4x2};
use half::bf16;

/// An FP8 e4m3 linear with E8M0 scales per 32 × 32 block.
#[derive(Clone, Debug)]
pub struct Fp8Linear {
    pub weight: Vec<E4M3>,
    pub scale: Vec<E8M0>,
    pub out_dim: usize,
    pub in_dim: usize,
}

/// A packed FP4 e2m1 linear (routed experts) with one E8M0 scale per row and
/// 32 input elements.
#[derive(Clone, Debug)]
pub struct Fp4Linear {
    pub weight: Vec<Fp4x2>,
    pub scale: Vec<E8M0>,
    pub out_dim: usize,
    pub in_dim: usize,
}

/// A BF16 linear.
#[derive(Clone, Debug)]
pub struct Bf16Linear {
    pub weight: Vec<bf16>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl Fp8Linear {
    /// `x` is `[rows, in]` BF16; returns `[rows, out]` BF16.
    pub fn forward(&self, x: &[bf16], rows: usize) -> Vec<bf16> {
        let (q, s) = cpu_backend::act_quant_fp8(x, rows, self.in_dim);
        fp8_gemm(
            &q,
            &s,
            &self.weight,
            &self.scale,
            rows,
            self.out_dim,
            self.in_dim,
        )
    }

    /// The weight dequantised to BF16 (exact: e4m3 × 2^e), as the reference
    /// does for `wo_a`.
    pub fn dequantize(&self) -> Vec<bf16> {
        let kb = self.in_dim.div_ceil(32);
        (0..self.out_dim * self.in_dim)
            .map(|i| {
                let (r, c) = (i / self.in_dim, i % self.in_dim);
                let s = crate::numerics::e8m0_to_f32(self.scale[(r / 32) * kb + c / 32]);
                bf16::from_f32(crate::numerics::e4m3_to_f32(self.weight[i]) * s)
            })
            .collect()
    }
}

impl Fp4Linear {
    /// `x` is `[rows, in]` BF16; returns `[rows, out]` BF16.
    pub fn forward(&self, x: &[bf16], rows: usize) -> Vec<bf16> {
        let (q, s) = cpu_backend::act_quant_fp8(x, rows, self.in_dim);
        fp4_gemm(
            &q,
            &s,
            &self.weight,
            &self.scale,
            rows,
            self.out_dim,
            self.in_dim,
        )
    }
}

impl Bf16Linear {
    /// BF16 × BF16 with fp32 accumulation, BF16 out.
    pub fn forward(&self, x: &[bf16], rows: usize) -> Vec<bf16> {
        bf16_gemm(x, &self.weight, rows, self.out_dim, self.in_dim)
    }

    /// Input and weight promoted to fp32, fp32 out.
    pub fn forward_f32(&self, x: &[bf16], rows: usize) -> Vec<f32> {
        f32_gemm(x, &self.weight, rows, self.out_dim, self.in_dim)
    }
}

/// The mHC parameters of one sublayer.
#[derive(Clone, Debug)]
pub struct HcWeights {
    /// `[24, 4·D]` fp32.
    pub func: Vec<f32>,
    pub base: [f32; 24],
    pub scale: [f32; 3],
}

/// A KV source's compressor.
#[derive(Clone, Debug)]
pub struct CompressorWeights {
    /// `[head_dim, D]`: fp32 projection at ratio 2, BF16 at ratio 1.
    pub wkv: Bf16Linear,
    /// Present at ratio 2 only.
    pub wgate: Option<Bf16Linear>,
    pub norm: Vec<bf16>,
}

/// The index keys owned by a KV source that is also an index source.
#[derive(Clone, Debug)]
pub struct IndexKeyWeights {
    /// `[index_head_dim, head_dim]`.
    pub wk: Bf16Linear,
    pub k_norm: Vec<bf16>,
}

/// An index source's query side (and its keys when it owns them).
#[derive(Clone, Debug)]
pub struct IndexerWeights {
    /// `[index_heads · index_head_dim, q_lora_rank]`.
    pub wq_b: Fp8Linear,
    /// `[index_heads, D]`.
    pub weights_proj: Bf16Linear,
    pub keys: Option<IndexKeyWeights>,
}

/// One layer's (or DSpark stage's) attention.
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    pub wq_a: Fp8Linear,
    pub q_norm: Vec<bf16>,
    pub wq_b: Fp8Linear,
    pub wkv: Fp8Linear,
    pub kv_norm: Vec<bf16>,
    /// `wo_a` dequantised to BF16: `[groups · o_rank, (heads/groups) · head_dim]`,
    /// group g's block in rows g·o_rank … (g+1)·o_rank − 1.
    pub wo_a: Vec<bf16>,
    pub wo_b: Fp8Linear,
    pub sink: Vec<f32>,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
}

/// One SwiGLU expert.
#[derive(Clone, Debug)]
pub struct Expert<L> {
    pub w1: L,
    pub w2: L,
    pub w3: L,
}

/// A MoE FFN: router, FP4 routed experts, FP8 shared expert.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `[experts, D]` BF16, used as an fp32 GEMM.
    pub gate: Bf16Linear,
    pub bias: Vec<f32>,
    pub experts: Vec<Expert<Fp4Linear>>,
    pub shared: Expert<Fp8Linear>,
}

/// An Engram layer's table and projections.
#[derive(Clone, Debug)]
pub struct EngramWeights {
    /// Rows of `head_dim` e4m3 values then `head_dim / 32` E8M0 scales.
    pub table: Vec<u8>,
    /// `[(mult + 1) · D, columns · head_dim]`.
    pub wkv: Fp8Linear,
    /// `[mult, D]` each.
    pub q_weight: Vec<bf16>,
    pub k_weight: Vec<bf16>,
    /// The layer's primes in column order.
    pub primes: Vec<u64>,
    pub multipliers: [i64; 4],
}

/// One backbone block or DSpark stage.
#[derive(Clone, Debug)]
pub struct BlockWeights {
    pub attn_norm: Vec<bf16>,
    pub ffn_norm: Vec<bf16>,
    pub hc_attn: HcWeights,
    pub hc_ffn: HcWeights,
    pub attn: AttentionWeights,
    pub ffn: MoeWeights,
    pub engram: Option<EngramWeights>,
}

/// The whole text model (the DSpark stages come with the drafter).
#[derive(Clone, Debug)]
pub struct ModelWeights {
    /// `[vocab, D]`.
    pub embed: Vec<bf16>,
    /// `[vocab, D]`, used as an fp32 GEMM.
    pub head: Bf16Linear,
    pub norm: Vec<bf16>,
    pub blocks: Vec<BlockWeights>,
    /// Token id → Engram compressed id.
    pub engram_token_map: Vec<i64>,
}
