//! Encodes a parameter's f32 values into the bytes of its stored tensors with
//! the crate's bit-exact quantisers (spec §10):
//!
//! - FP8 block weights: per block, scale = 2^⌈log2(amax · 1/448)⌉ (the
//!   smallest power of two with amax / scale ≤ 448, amax floored at 1e-4, the
//!   ceiling on the fp32 bit pattern as in §10.1), values e4m3(x / scale)
//!   saturating at ±448. FP8 rows (Engram tables) are the 1 × 32 case.
//! - FP4 weights: each row rounded to BF16, then per 32 along K
//!   [`fp4_e8m0_quant_block`] (scale 2^⌈log2(amax / 6)⌉, e2m1 ties to the
//!   even code), packed with the even element in the low nibble.
//!
//! Invariant: the output has one byte vector per entry of
//! [`Param::tensors`], each exactly that tensor's byte size, little-endian;
//! and rows are encoded independently of the rows outside their scale
//! block (one block row for FP8 blocks, one row otherwise), so encoding a
//! split by block rows piece by piece gives the same bytes.

use half::bf16;

use super::param::{Format, Param};
use crate::contract::MX_BLOCK;
use crate::numerics::{
    E4M3_MAX, FP8_AMAX_FLOOR, ceil_pow2_scale, e8m0_to_f32, f32_to_e4m3, fp4_e8m0_quant_block,
    pack_fp4,
};

/// The stored bytes of `param` holding `values` (row-major, logical shape).
pub(crate) fn encode(param: &Param, values: &[f32]) -> Vec<Vec<u8>> {
    let (rows, cols) = param.matrix();
    encode_rows(param, rows, cols, values)
}

/// [`encode`] of `rows` whole rows of `param` (`values` holds `rows ×
/// cols`): the bytes of those rows and their scales. For a block format
/// the rows must start on a block-row boundary; then the parts of a split
/// into such row ranges concatenate to the whole encoding.
pub(crate) fn encode_rows(param: &Param, rows: usize, cols: usize, values: &[f32]) -> Vec<Vec<u8>> {
    match param.format {
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
