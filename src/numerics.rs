//! Bit-exact scalar conversions and block quantisers (and, in
//! `share_scales`, the exact scale sharing of MXFP8 operands), following
//! `shared/spec/v41-flash.md` §10. These are the CPU reference numerics that
//! every GPU kernel is compared with bit for bit; they never approximate.
//!
//! Invariants a caller can rely on:
//! - e4m3 encoding saturates to ±448 (the clamp precedes the rounding), rounds
//!   to nearest even, and maps NaN to 0x7F.
//! - E8M0 scales produced here are finite powers of two, except the FP4
//!   quantisers' NaN scale (below).
//! - Non-finite input: e2m1 has no NaN or infinity, so a FP4 block holding a
//!   NaN or ±Inf gets the NaN scale ([`E8M0_NAN`], or [`E4M3_NAN`] for the
//!   E4M3-scaled variant) and every code [`FP4_NAN_BLOCK_CODE`]: the block
//!   decodes to NaN, and a NaN reaches the logits instead of turning into a
//!   finite value. The FP8 quantiser keeps NaN per element (its e4m3 code
//!   0x7F is NaN) and takes its scale over the other elements.
//! - e2m1 rounding breaks ties towards the even *code*.

use crate::dtype::{E4M3, E8M0, Fp4x2};
use half::bf16;

mod share_scales;
pub(crate) use share_scales::check_share_args;
pub use share_scales::share_mx_scales;

/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// FP8 activation amax floor (§10.1).
pub const FP8_AMAX_FLOOR: f32 = 1e-4;
/// FP4/E8M0 amax floor: 6 · 2^−126 (§10.3).
pub const FP4_E8M0_AMAX_FLOOR: f32 = 6.0 * f32::MIN_POSITIVE;
/// FP4/E4M3 amax floor: 6 · 2^−9 (§10.3).
pub const FP4_E4M3_AMAX_FLOOR: f32 = 6.0 / 512.0;

/// The E8M0 NaN byte.
pub const E8M0_NAN: E8M0 = E8M0(0xFF);
/// The e4m3 NaN byte that [`f32_to_e4m3`] writes.
pub const E4M3_NAN: E4M3 = E4M3(0x7F);
/// The e2m1 code of every element of a FP4 block whose scale is NaN (+6:
/// what [`f32_to_e2m1`] gives for a positive NaN). The scale alone makes the
/// block NaN; the code is fixed so that every backend writes the same bytes.
pub const FP4_NAN_BLOCK_CODE: u8 = 7;

/// BF16 → f32 (exact).
#[inline]
pub fn bf16_to_f32(x: bf16) -> f32 {
    x.to_f32()
}

/// f32 → BF16, round to nearest even (identical to `__float2bfloat16`).
#[inline]
pub fn f32_to_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// e4m3 → f32 (exact).
#[inline]
pub fn e4m3_to_f32(x: E4M3) -> f32 {
    float8::F8E4M3::from_bits(x.0).to_f32()
}

/// f32 → e4m3 with saturation to ±448, nearest even, NaN → 0x7F
/// (identical to CUDA `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`).
#[inline]
pub fn f32_to_e4m3(x: f32) -> E4M3 {
    if x.is_nan() {
        return E4M3(0x7F);
    }
    E4M3(float8::F8E4M3::from_f32(x.clamp(-E4M3_MAX, E4M3_MAX)).to_bits())
}

/// E8M0 → f32: 2^(byte − 127); 0xFF is NaN. Bytes 0 and 1 (2^−127, 2^−126)
/// are f32 subnormal/normal and exact.
#[inline]
pub fn e8m0_to_f32(x: E8M0) -> f32 {
    match x.0 {
        0xFF => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        b => f32::from_bits((b as u32) << 23),
    }
}

/// The power-of-two scale 2^⌈log2(amax · inv_max)⌉ of §10.1, with the product
/// in fp32 and the ceiling taken on the bit pattern (exponent, plus one when
/// the mantissa is nonzero). `amax` must already be floored (positive, normal
/// product). Returns the E8M0 byte.
#[inline]
pub fn ceil_pow2_scale(amax: f32, inv_max: f32) -> E8M0 {
    let bits = (amax * inv_max).to_bits();
    let exp = ((bits >> 23) & 0xFF) as i32;
    let mant = bits & 0x7F_FFFF;
    let e = exp - 127 + i32::from(mant != 0);
    E8M0((e + 127).clamp(0, 254) as u8)
}

/// e2m1 magnitudes by 3-bit code.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// e2m1 nibble → f32 (exact).
#[inline]
pub fn e2m1_to_f32(nibble: u8) -> f32 {
    let m = E2M1_VALUES
        .get(usize::from(nibble & 7))
        .copied()
        .unwrap_or(0.0); // & 7: always in
    if nibble & 8 != 0 { -m } else { m }
}

/// f32 → e2m1 nibble: saturate to ±6, round to nearest, ties to the even code
/// (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4).
/// NaN maps to code 7 (±6) with the NaN's sign bit; the FP4 block quantisers
/// below never pass it one (a block holding a NaN gets the NaN scale).
#[inline]
pub fn f32_to_e2m1(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    let a = x.abs();
    // Midpoints between consecutive codes; at a midpoint take the even code.
    let code = if a.is_nan() {
        7
    } else if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// Packs two e2m1 nibbles: `even` in the low nibble.
#[inline]
pub fn pack_fp4(even: u8, odd: u8) -> Fp4x2 {
    Fp4x2((even & 0xF) | (odd << 4))
}

/// Splits a packed byte into (even, odd) nibbles.
#[inline]
pub fn unpack_fp4(p: Fp4x2) -> (u8, u8) {
    (p.0 & 0xF, p.0 >> 4)
}

/// FP8 amax: max(floor, |x_i|) over the elements that are not NaN
/// (`f32::max` drops a NaN, as CUDA's `fmaxf` does in the FP8 kernels): a NaN
/// element keeps its own e4m3 NaN code, so the scale need not carry it.
fn fp8_block_amax(block: &[bf16], floor: f32) -> f32 {
    block.iter().fold(floor, |m, v| m.max(v.to_f32().abs()))
}

/// FP4 amax: max(floor, |x_i|) keeping NaN and ±Inf. The magnitudes' bit
/// patterns are compared as integers: for non-negative f32 that order is the
/// numeric one, and every NaN pattern lies above +Inf, so a block holding a
/// NaN has a NaN amax (the CUDA FP4 quantisers reduce the same way,
/// `numerics.cuh`'s `amax_keep_nan`).
fn fp4_block_amax(block: &[bf16], floor: f32) -> f32 {
    f32::from_bits(
        block
            .iter()
            .fold(floor.to_bits(), |m, v| m.max(v.to_f32().abs().to_bits())),
    )
}

/// The codes of a FP4 block with the NaN scale (see the module header).
fn fill_nan_block(nibbles: &mut [u8], len: usize) {
    for o in nibbles.iter_mut().take(len) {
        *o = FP4_NAN_BLOCK_CODE;
    }
}

/// FP8 1×`block.len()` activation quantisation of one block (§10.1): writes
/// e4m3 codes into `q` and returns the E8M0 scale. A tail block shorter than
/// 32 uses the same rule over its own elements.
pub fn act_quant_block(block: &[bf16], q: &mut [E4M3]) -> E8M0 {
    let scale = ceil_pow2_scale(fp8_block_amax(block, FP8_AMAX_FLOOR), 1.0 / E4M3_MAX);
    let inv = 1.0 / e8m0_to_f32(scale);
    for (o, v) in q.iter_mut().zip(block) {
        // x / 2^e is exact, so the reciprocal multiply equals the division.
        *o = f32_to_e4m3(v.to_f32() * inv);
    }
    scale
}

/// FP4 e2m1 quantisation with one E8M0 scale per block of 32 (§10.3, index
/// keys and queries). Returns the scale; `nibbles[i]` receives element i.
/// A block holding a NaN or ±Inf gets [`E8M0_NAN`] and
/// [`FP4_NAN_BLOCK_CODE`] codes.
pub fn fp4_e8m0_quant_block(block: &[bf16], nibbles: &mut [u8]) -> E8M0 {
    let amax = fp4_block_amax(block, FP4_E8M0_AMAX_FLOOR);
    if !amax.is_finite() {
        fill_nan_block(nibbles, block.len());
        return E8M0_NAN;
    }
    let scale = ceil_pow2_scale(amax, 1.0 / E2M1_MAX);
    let s = e8m0_to_f32(scale);
    for (o, v) in nibbles.iter_mut().zip(block) {
        *o = f32_to_e2m1((v.to_f32() / s).clamp(-E2M1_MAX, E2M1_MAX));
    }
    scale
}

/// FP4 e2m1 quantisation with one E4M3 scale per block of 16 (§10.3, the
/// compressed main KV). The scale is e4m3(amax / 6) and values use a true
/// fp32 division by it. A block holding a NaN or ±Inf gets [`E4M3_NAN`]
/// (not the saturated 448 an infinite amax / 6 would round to) and
/// [`FP4_NAN_BLOCK_CODE`] codes.
pub fn fp4_e4m3_quant_block(block: &[bf16], nibbles: &mut [u8]) -> E4M3 {
    let amax = fp4_block_amax(block, FP4_E4M3_AMAX_FLOOR);
    if !amax.is_finite() {
        fill_nan_block(nibbles, block.len());
        return E4M3_NAN;
    }
    let scale = f32_to_e4m3(amax / E2M1_MAX);
    let s = e4m3_to_f32(scale);
    for (o, v) in nibbles.iter_mut().zip(block) {
        *o = f32_to_e2m1((v.to_f32() / s).clamp(-E2M1_MAX, E2M1_MAX));
    }
    scale
}

/// x rounded once to the nearest fp32 (ties to even; beyond fp32's range
/// ±Inf, NaN stays NaN): the one f64 → f32 narrowing of the crate, named so
/// that it reads as the rounding it is.
#[inline]
#[allow(clippy::cast_possible_truncation)] // rounding is the point
pub fn round_f32(x: f64) -> f32 {
    x as f32
}

/// The low 32 bits of `x` (a counter-based RNG's word split).
#[inline]
#[allow(clippy::cast_possible_truncation)] // dropping the high bits is the point
pub fn low_u32(x: u64) -> u32 {
    x as u32
}

/// The low 64 bits of `x` (PCG64's output and Lemire's reduction).
#[inline]
#[allow(clippy::cast_possible_truncation)] // dropping the high bits is the point
pub fn low_u64(x: u128) -> u64 {
    x as u64
}

/// e^x as the correctly rounded fp32 value (evaluated in f64, rounded
/// once). The spec leaves the last ulp of transcendentals open; fixing it to
/// the correctly rounded value makes every implementation that does the same
/// (the torch reference model included) agree bit for bit.
#[inline]
pub fn exp(x: f32) -> f32 {
    round_f32(f64::from(x).exp())
}

/// σ(x) = 1 / (1 + e^−x) in fp32 with [`exp`].
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Largest BF16 magnitude (bits, sign cleared) whose [`sigmoid`] is ½: every
/// |x| < 2^−25, zero and subnormals included.
const SIGMOID_MAG_LO: u16 = 0x32FF;
/// BF16 magnitude bits of 2^7: from here up (infinity included) [`sigmoid`]
/// is 1 for positive x and 0 for negative x.
const SIGMOID_MAG_HI: u16 = 0x4300;
/// Slots of [`sigmoid_bf16_table`] per sign: ½, the 4096 BF16 magnitudes in
/// [2^−25, 2^7), then the saturated value.
pub const SIGMOID_TABLE_HALF: usize = (SIGMOID_MAG_HI - SIGMOID_MAG_LO) as usize + 1;

/// The slot of [`sigmoid_bf16_table`] that holds `sigmoid(x)` for the
/// non-NaN BF16 value with bits `bits`:
/// `min(max(bits & 0x7FFF, 0x32FF), 0x4300) − 0x32FF + (bits >> 15) · 4098`.
/// The SwiGLU kernels (`tilelang/swiglu_act_quant_fp8.py`) compute exactly
/// this from the top half of an fp32's bits.
#[inline]
pub fn sigmoid_bf16_index(bits: u16) -> usize {
    let mag = (bits & 0x7FFF).clamp(SIGMOID_MAG_LO, SIGMOID_MAG_HI) - SIGMOID_MAG_LO;
    usize::from(mag) + usize::from(bits >> 15) * SIGMOID_TABLE_HALF
}

/// [`sigmoid`] of every non-NaN BF16 value, 2 × [`SIGMOID_TABLE_HALF`]
/// entries at [`sigmoid_bf16_index`]: each slot is `sigmoid` of a BF16 value
/// that indexes it (the ends: ±0 and ±∞), built once. `sigmoid` is constant
/// over the values sharing an end slot (`tests/swiglu_cpu.rs` checks every
/// BF16 input against the table), so a lookup is the reference bit for bit.
pub fn sigmoid_bf16_table() -> &'static [f32] {
    static TABLE: std::sync::LazyLock<Vec<f32>> = std::sync::LazyLock::new(|| {
        let mut t = vec![0.0f32; 2 * SIGMOID_TABLE_HALF];
        for sign in [0u16, 0x8000] {
            // ±0, the magnitudes between, then ±∞ for the saturated slot.
            let mags = std::iter::once(0)
                .chain(SIGMOID_MAG_LO + 1..SIGMOID_MAG_HI)
                .chain(std::iter::once(0x7F80));
            for mag in mags {
                let bits = sign | mag;
                if let Some(slot) = t.get_mut(sigmoid_bf16_index(bits)) {
                    *slot = sigmoid(bf16::from_bits(bits).to_f32());
                }
            }
        }
        t
    });
    &TABLE
}

/// torch's softplus with β = 1 and threshold 20: x above 20, else
/// ln(1 + e^x) evaluated in f64 and rounded once.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        round_f32(f64::from(x).exp().ln_1p())
    }
}

/// DeepGEMM's `calc_diff`: 1 − 2·Σxy / (Σx² + Σy²) in fp64. 0 for identical
/// inputs; behaves like 1 − cosine similarity when the norms match.
pub fn calc_diff(x: &[f64], y: &[f64]) -> f64 {
    let (mut xy, mut xx, mut yy) = (0.0f64, 0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(y) {
        xy += a * b;
        xx += a * a;
        yy += b * b;
    }
    let denom = xx + yy;
    if denom == 0.0 {
        return 0.0;
    }
    1.0 - 2.0 * xy / denom
}

/// Index of the largest value (ties to the lowest index; a NaN never wins
/// over a number; 0 for an empty or all-NaN slice): the greedy rule of
/// `ops::argmax` and of the engine's sampler.
pub fn argmax(values: &[f32]) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        match best {
            Some((_, b)) if !(v > b || b.is_nan() && !v.is_nan()) => {}
            _ => best = Some((i, v)),
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// FNV-1a 64 of `bytes`: the content hash of the fatbin registry, the
/// generator's per-tensor streams and the Engram map cache.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
