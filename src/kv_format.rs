//! Byte layouts of V4.1's quantised cache rows (`v41-flash.md` §10, §11) and
//! their exact encode/decode. Each row stores its values first, then its
//! scales, both in element order:
//!
//! | row | values | scales | bytes at dim 512 / 128 |
//! | --- | --- | --- | --- |
//! | window KV (FP8) | `dim` e4m3 | `dim/32` E8M0 | 528 |
//! | compressed KV (FP4, E4M3 scales) | `dim/2` packed e2m1 | `dim/16` e4m3 | 288 |
//! | index key (FP4, E8M0 scales) | `dim/2` packed e2m1 | `dim/32` E8M0 | 68 (dim 128) |
//!
//! Packed e2m1 keeps the even element in the low nibble. Decoding returns the
//! fake-quantised BF16 values the reference computes with; they are exact
//! (e4m3 × 2^e and e2m1 × e4m3 are BF16-representable). `dim` must be a
//! multiple of the scale group (callers validate).

use crate::contract::{FP4_KV_GROUP, KvRowFormat, MX_BLOCK};
use crate::dtype::{E4M3, E8M0, Fp4x2};
use crate::numerics::{
    act_quant_block, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, fp4_e4m3_quant_block,
    fp4_e8m0_quant_block, pack_fp4, unpack_fp4,
};
use half::bf16;

/// Bytes of a window-KV row of `dim` values.
pub fn window_row_bytes(dim: usize) -> usize {
    KvRowFormat::Window.row_bytes(dim)
}

/// Bytes of a compressed-KV row of `dim` values.
pub fn compressed_row_bytes(dim: usize) -> usize {
    KvRowFormat::Compressed.row_bytes(dim)
}

/// Bytes of an index-key row of `dim` values.
pub fn index_key_row_bytes(dim: usize) -> usize {
    KvRowFormat::IndexKey.row_bytes(dim)
}

/// The encoded row of `format` (one of the three encoders below).
pub fn encode_row(format: KvRowFormat, row: &[bf16]) -> Vec<u8> {
    match format {
        KvRowFormat::Window => encode_window_row(row),
        KvRowFormat::Compressed => encode_compressed_row(row),
        KvRowFormat::IndexKey => encode_index_key_row(row),
    }
}

/// FP8 e4m3 values with one E8M0 scale per 32 (§10.1 rules).
pub fn encode_window_row(row: &[bf16]) -> Vec<u8> {
    let mut q = vec![E4M3(0); row.len()];
    let scales: Vec<u8> = row
        .chunks(MX_BLOCK)
        .zip(q.chunks_mut(MX_BLOCK))
        .map(|(x, q)| act_quant_block(x, q).0)
        .collect();
    q.into_iter().map(|v| v.0).chain(scales).collect()
}

/// A row's `dim` values and its scales, each scale repeated over its group
/// of `group` values. A row shorter than its format decodes to fewer values
/// (the callers check lengths; this never reads past the row).
fn split_row(bytes: &[u8], values: usize, group: usize) -> (&[u8], impl Iterator<Item = u8> + '_) {
    let (v, s) = bytes.split_at_checked(values).unwrap_or((bytes, &[]));
    (
        v,
        s.iter().flat_map(move |&x| std::iter::repeat_n(x, group)),
    )
}

pub fn decode_window_row(bytes: &[u8], dim: usize) -> Vec<bf16> {
    let (values, scales) = split_row(bytes, dim, MX_BLOCK);
    values
        .iter()
        .zip(scales)
        .map(|(&v, s)| bf16::from_f32(e4m3_to_f32(E4M3(v)) * e8m0_to_f32(E8M0(s))))
        .collect()
}

fn pack(nibbles: &[u8]) -> impl Iterator<Item = u8> + '_ {
    nibbles.chunks(2).map(|p| {
        pack_fp4(
            p.first().copied().unwrap_or(0),
            p.get(1).copied().unwrap_or(0),
        )
        .0
    })
}

fn unpack(values: &[u8]) -> impl Iterator<Item = u8> + '_ {
    values.iter().flat_map(|&b| {
        let (lo, hi) = unpack_fp4(Fp4x2(b));
        [lo, hi]
    })
}

/// FP4 e2m1 with one E4M3 scale per 16 (the compressed main KV).
pub fn encode_compressed_row(row: &[bf16]) -> Vec<u8> {
    let mut nibbles = vec![0u8; row.len()];
    let scales: Vec<u8> = row
        .chunks(FP4_KV_GROUP)
        .zip(nibbles.chunks_mut(FP4_KV_GROUP))
        .map(|(x, n)| fp4_e4m3_quant_block(x, n).0)
        .collect();
    pack(&nibbles).chain(scales).collect()
}

pub fn decode_compressed_row(bytes: &[u8], dim: usize) -> Vec<bf16> {
    let (values, scales) = split_row(bytes, dim / 2, FP4_KV_GROUP);
    unpack(values)
        .zip(scales)
        .map(|(n, s)| bf16::from_f32(e2m1_to_f32(n) * e4m3_to_f32(E4M3(s))))
        .collect()
}

/// FP4 e2m1 with one E8M0 scale per 32 (index keys and queries).
pub fn encode_index_key_row(row: &[bf16]) -> Vec<u8> {
    let mut nibbles = vec![0u8; row.len()];
    let scales: Vec<u8> = row
        .chunks(MX_BLOCK)
        .zip(nibbles.chunks_mut(MX_BLOCK))
        .map(|(x, n)| fp4_e8m0_quant_block(x, n).0)
        .collect();
    pack(&nibbles).chain(scales).collect()
}

pub fn decode_index_key_row(bytes: &[u8], dim: usize) -> Vec<bf16> {
    let (values, scales) = split_row(bytes, dim / 2, MX_BLOCK);
    unpack(values)
        .zip(scales)
        .map(|(n, s)| bf16::from_f32(e2m1_to_f32(n) * e8m0_to_f32(E8M0(s))))
        .collect()
}
