//! The random-weight generator's numerics, below the ops and the backends so
//! that the model's checkpoint generator, the CPU op and the CUDA kernel
//! (`kernels-cuda/random/`) share one definition: a counter-based splitmix64
//! stream per parameter, Irwin–Hall normal variates, and the stored formats'
//! encoders (spec §10).
//!
//! Values: element i of a parameter with stream key k is
//! `round_f32(mean + std · g_i)`, g_i = (u_1 + u_2 + u_3 + u_4 − 2) · √3 in
//! f64, u_j = (mix(k + (4i + j) · γ) >> 11) / 2^53. Only IEEE-exact
//! operations (+, −, ×, ÷ by powers of two, one rounding to f32) are
//! involved and none is fused, so every platform and device gives the same
//! bits.
//!
//! Encoders:
//! - FP8 block weights: per block, scale = 2^⌈log2(amax · 1/448)⌉ (the
//!   smallest power of two with amax / scale ≤ 448, amax floored at 1e-4, the
//!   ceiling on the fp32 bit pattern as in §10.1), values e4m3(x / scale)
//!   saturating at ±448. FP8 rows (Engram tables) are the 1 × 32 case.
//! - FP4 weights: each row rounded to BF16, then per 32 along K
//!   [`fp4_e8m0_quant_block`] (scale 2^⌈log2(amax / 6)⌉, e2m1 ties to the
//!   even code), packed with the even element in the low nibble.
//!
//! Invariant: [`encode_rows`] gives one byte vector per stored tensor
//! ([`RandomParam::stored`]), each exactly that tensor's byte size, and
//! encodes rows independently of the rows outside their scale block (one
//! block row for FP8 blocks, one row otherwise), so encoding a split by
//! block rows piece by piece gives the same bytes.

use std::ops::Range;

use half::bf16;

use crate::contract::MX_BLOCK;
use crate::dtype::DType;
use crate::numerics::{
    E4M3_MAX, FP8_AMAX_FLOOR, ceil_pow2_scale, e8m0_to_f32, f32_to_e4m3, fnv1a64,
    fp4_e8m0_quant_block, pack_fp4, round_f32,
};

/// How a parameter's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Bf16,
    F32,
    /// e4m3 values and one E8M0 scale per `[rows, cols]` block.
    Fp8Block([usize; 2]),
    /// e4m3 values and one E8M0 scale per 32 along the last dim.
    Fp8Row,
    /// Packed e2m1 pairs (⌈cols/2⌉ bytes a row) and one E8M0 scale per 32
    /// along the last dim.
    Fp4,
}

impl Format {
    /// The scale block `[rows, cols]` of a quantised format.
    pub fn scale_block(self) -> Option<[usize; 2]> {
        match self {
            Format::Bf16 | Format::F32 => None,
            Format::Fp8Block([br, bc]) => Some([br.max(1), bc.max(1)]),
            Format::Fp8Row | Format::Fp4 => Some([1, MX_BLOCK]),
        }
    }
}

/// One random parameter as a `[rows, cols]` matrix: its stream, its value
/// distribution and its stored format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomParam {
    /// The stream's starting counter ([`stream_key`]).
    pub key: u64,
    pub mean: f64,
    pub std: f64,
    pub rows: usize,
    pub cols: usize,
    pub format: Format,
}

impl RandomParam {
    /// The stored tensors as `[rows, cols]` matrices: the values, then the
    /// scale grid of a quantised format (a packed FP4 shape counts e2m1
    /// values, as [`crate::Tensor`] does).
    pub fn stored(&self) -> Vec<(DType, [usize; 2])> {
        let (r, c) = (self.rows, self.cols);
        let value = match self.format {
            Format::Bf16 => DType::BF16,
            Format::F32 => DType::F32,
            Format::Fp8Block(_) | Format::Fp8Row => DType::F8E4M3,
            Format::Fp4 => DType::F4E2M1x2,
        };
        let mut out = vec![(value, [r, c])];
        if let Some([br, bc]) = self.format.scale_block() {
            out.push((DType::E8M0, [r.div_ceil(br), c.div_ceil(bc)]));
        }
        out
    }
}

/// Stream outputs one normal variate consumes ([`normal`]).
pub const NORMAL_DRAWS: u64 = 4;

/// The increment of splitmix64's counter.
pub const SPLITMIX_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// √3 in f64 (correctly rounded), the Irwin–Hall sum's rescale.
pub const SQRT3: f64 = 1.732_050_807_568_877_2;

/// splitmix64's output mixer (Steele, Lea, Flood 2014), a bijection.
pub fn mix(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stream key of the parameter named `name` in a run seeded `seed`:
/// splitmix64's first output of `seed`, xor FNV-1a of the name.
pub fn stream_key(seed: u64, name: &str) -> u64 {
    mix(seed.wrapping_add(SPLITMIX_GAMMA)) ^ fnv1a64(name.as_bytes())
}

/// The unit normal variate of element `i` of stream `key`: mean 0,
/// variance 1, bounded by ±2√3.
pub fn normal(key: u64, i: u64) -> f64 {
    let base = key.wrapping_add(i.wrapping_mul(NORMAL_DRAWS).wrapping_mul(SPLITMIX_GAMMA));
    let mut sum = 0.0f64;
    for j in 1..=NORMAL_DRAWS {
        let u = mix(base.wrapping_add(j.wrapping_mul(SPLITMIX_GAMMA))) >> 11;
        // Exact: a 53-bit integer over 2^53.
        sum += u as f64 / (1u64 << 53) as f64;
    }
    (sum - 2.0) * SQRT3
}

/// Flat elements `range` (row-major) of `p`'s values.
pub fn values(p: &RandomParam, range: Range<usize>) -> Vec<f32> {
    range
        .map(|i| round_f32(p.mean + p.std * normal(p.key, i as u64)))
        .collect()
}

/// The stored bytes of `rows` whole rows of a `format` parameter of `cols`
/// columns (`values` holds `rows × cols`): the bytes of those rows and
/// their scales. For a block format the rows must start on a block-row
/// boundary; then the parts of a split into such row ranges concatenate to
/// the whole encoding.
pub fn encode_rows(format: Format, rows: usize, cols: usize, values: &[f32]) -> Vec<Vec<u8>> {
    match format {
        Format::Bf16 => vec![
            values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        ],
        Format::F32 => vec![values.iter().flat_map(|v| v.to_le_bytes()).collect()],
        Format::Fp8Block(block) => fp8_blocks(values, rows, cols, block),
        Format::Fp8Row => fp8_blocks(values, rows, cols, [1, MX_BLOCK]),
        Format::Fp4 => fp4_rows(values, cols),
    }
}

/// e4m3 codes and one E8M0 scale per `block` of a rows × cols matrix; the
/// scale grid is row-major over ⌈rows/br⌉ × ⌈cols/bc⌉ blocks.
fn fp8_blocks(values: &[f32], rows: usize, cols: usize, block: [usize; 2]) -> Vec<Vec<u8>> {
    let [br, bc] = block.map(|b| b.max(1));
    let (grid_rows, grid_cols) = (rows.div_ceil(br), cols.div_ceil(bc));
    let mut codes = vec![0u8; values.len()];
    let mut scales = Vec::with_capacity(grid_rows * grid_cols);
    for gr in 0..grid_rows {
        let row_range = gr * br..((gr + 1) * br).min(rows);
        for gc in 0..grid_cols {
            let col_range = gc * bc..((gc + 1) * bc).min(cols);
            let cells = || {
                let col_range = col_range.clone();
                row_range
                    .clone()
                    .flat_map(move |r| col_range.clone().map(move |c| r * cols + c))
            };
            // Every cell r · cols + c is below rows · cols = values.len().
            let amax = cells()
                .filter_map(|i| values.get(i))
                .fold(FP8_AMAX_FLOOR, |m, v| m.max(v.abs()));
            let scale = ceil_pow2_scale(amax, 1.0 / E4M3_MAX);
            let s = e8m0_to_f32(scale);
            for i in cells() {
                if let (Some(code), Some(&v)) = (codes.get_mut(i), values.get(i)) {
                    *code = f32_to_e4m3(v / s).0;
                }
            }
            scales.push(scale.0);
        }
    }
    vec![codes, scales]
}

/// Packed e2m1 pairs and one E8M0 scale per 32 along each row.
fn fp4_rows(values: &[f32], cols: usize) -> Vec<Vec<u8>> {
    let mut packed = Vec::with_capacity(values.len() / 2);
    let mut scales = Vec::with_capacity(values.len() / MX_BLOCK + 1);
    let mut nibbles = vec![0u8; cols];
    for row in values.chunks(cols.max(1)) {
        let row: Vec<bf16> = row.iter().map(|&v| bf16::from_f32(v)).collect();
        for (block, out) in row.chunks(MX_BLOCK).zip(nibbles.chunks_mut(MX_BLOCK)) {
            scales.push(fp4_e8m0_quant_block(block, out).0);
        }
        packed.extend(nibbles.chunks(2).map(|p| {
            pack_fp4(
                p.first().copied().unwrap_or(0),
                p.get(1).copied().unwrap_or(0),
            )
            .0
        }));
    }
    vec![packed, scales]
}
