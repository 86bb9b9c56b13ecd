//! GEMM references for every linear of the model (`v41-flash.md` §10.4,
//! §10.6): the block-scaled FP8 × FP8 and FP4 × FP8 linears, and the
//! unquantised BF16 and fp32 linears.
//!
//! Every function computes `out[m, n] = Σ_k a[m, k] · b[n, k]`: A is the
//! row-major `[M, K]` activation, B the row-major `[N, K]` weight of a linear
//! layer (`[out, in]`), so the product is A · Bᵀ. Results are row-major
//! `[M, N]`. Callers validate slice lengths; any M, N, K (zero included) is
//! accepted, and a K that is not a multiple of 32 ends in a shorter block.
//!
//! Numerics of the block-scaled GEMMs, which a caller can rely on:
//! - K is cut into blocks of 32 starting at k = 0; the last block may be
//!   shorter.
//! - Operands are decoded exactly to fp32 (FP4 e2m1 values are e4m3 values,
//!   so "decoded to FP8" and "decoded to fp32" are the same numbers). Every
//!   product a · b is exact in fp32: e4m3 · e4m3 and e2m1 · e4m3 have at most
//!   8 significant bits and nonzero magnitudes in [2^−18, 448²].
//! - Inside a block the products are summed in fp32 in increasing k, starting
//!   from +0.0, one rounding per addition. The spec leaves the in-block order
//!   to the tensor core, so GPU kernels are compared with `calc_diff`; this
//!   order makes the CPU result deterministic.
//! - The block sum is multiplied by `a_s · b_s` (the fp32 product of the two
//!   E8M0 scales, exact while it stays in fp32's normal range) and added to an
//!   fp32 accumulator that starts at +0.0, blocks in increasing K order.
//! - The `_f32` variants return that accumulator; the others round it once
//!   to BF16 (nearest even). Each output element depends only on its own row
//!   of A and row of B, so the result does not depend on M.
//!
//! The BF16 and fp32 linears promote both operands to fp32 and sum the
//! fp32 products (exact for BF16 × BF16, rounded once when an operand is
//! f32) in increasing k from +0.0: no blocks, no scales.

use crate::dtype::{E4M3, E8M0, Fp4x2};
use crate::numerics::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, unpack_fp4};
use half::bf16;

/// K elements per scale block (activations and weights), and output rows per
/// FP8 weight scale (the 32 × 32 grid).
use crate::contract::MX_BLOCK as BLOCK;

/// FP8 × FP8 linear with a BF16 result. `a` is `[m, k]` e4m3 with `a_s`
/// `[m, ⌈k/32⌉]` (1 × 32 activation scales); `b` is `[n, k]` e4m3 with `b_s`
/// `[⌈n/32⌉, ⌈k/32⌉]` (32 × 32 weight blocks). Returns `[m, n]`.
pub fn fp8_gemm(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[E4M3],
    b_s: &[E8M0],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<bf16> {
    to_bf16(fp8_gemm_f32(a, a_s, b, b_s, m, n, k))
}

/// [`fp8_gemm`] returning the fp32 accumulator instead of its BF16 rounding.
pub fn fp8_gemm_f32(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[E4M3],
    b_s: &[E8M0],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let lut = e4m3_table();
    let kb = k.div_ceil(BLOCK);
    block_scaled(
        &decode_e4m3(&lut, &a[..m * k]),
        a_s,
        m,
        n,
        k,
        |row, buf| {
            for (v, q) in buf.iter_mut().zip(&b[row * k..(row + 1) * k]) {
                *v = lut[q.0 as usize];
            }
        },
        |row| &b_s[(row / BLOCK) * kb..(row / BLOCK + 1) * kb],
    )
}

/// FP4 × FP8 linear with a BF16 result (the routed experts). `a` and `a_s`
/// as in [`fp8_gemm`]; `b` is `[n, k]` packed e2m1, each row ⌈k/2⌉ bytes with
/// element 2i in the low nibble of byte i (for an odd k the last high nibble
/// is padding and ignored); `b_s` is `[n, ⌈k/32⌉]`, one E8M0 scale per output
/// row and K block. Returns `[m, n]`.
pub fn fp4_gemm(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<bf16> {
    to_bf16(fp4_gemm_f32(a, a_s, b, b_s, m, n, k))
}

/// [`fp4_gemm`] returning the fp32 accumulator instead of its BF16 rounding.
pub fn fp4_gemm_f32(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let row_bytes = k.div_ceil(2);
    let kb = k.div_ceil(BLOCK);
    block_scaled(
        &decode_e4m3(&e4m3_table(), &a[..m * k]),
        a_s,
        m,
        n,
        k,
        |row, buf| {
            let packed = &b[row * row_bytes..(row + 1) * row_bytes];
            for (pair, p) in buf.chunks_mut(2).zip(packed) {
                let (even, odd) = unpack_fp4(*p);
                pair[0] = e2m1_to_f32(even);
                if let Some(v) = pair.get_mut(1) {
                    *v = e2m1_to_f32(odd);
                }
            }
        },
        |row| &b_s[row * kb..(row + 1) * kb],
    )
}

/// FP4 × FP8 grouped linear over experts in the contiguous layout (MoE
/// prefill) with a BF16 result: rows `offsets[e]..offsets[e + 1]` of `a`
/// (`[t, k]` e4m3, `a_s` `[t, ⌈k/32⌉]`) belong to expert e and are multiplied
/// by its weight, `b[e]` (`[e, n, k]` packed e2m1, `b_s` `[e, n, ⌈k/32⌉]`).
/// Returns `[t, n]`; each group is exactly [`fp4_gemm`] of its rows, so the
/// numerics are those of [`fp4_gemm`]. `offsets` has `e + 1` entries,
/// non-decreasing, from 0 to t (callers validate; a violation panics).
pub fn fp4_grouped_contiguous(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    offsets: &[usize],
    n: usize,
    k: usize,
) -> Vec<bf16> {
    to_bf16(fp4_grouped_contiguous_f32(a, a_s, b, b_s, offsets, n, k))
}

/// [`fp4_grouped_contiguous`] returning the fp32 accumulators.
pub fn fp4_grouped_contiguous_f32(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    offsets: &[usize],
    n: usize,
    k: usize,
) -> Vec<f32> {
    let t = offsets.last().copied().unwrap_or(0);
    let mut out = vec![0.0f32; t * n];
    for (e, w) in offsets.windows(2).enumerate() {
        let (r0, r1) = (w[0], w[1]);
        assert!(r0 <= r1, "offsets must be non-decreasing");
        if r0 == r1 {
            continue;
        }
        expert_rows(&mut out, a, a_s, b, b_s, e, r0..r1, n, k);
    }
    out
}

/// FP4 × FP8 grouped linear over experts in the masked layout (MoE decode)
/// with a BF16 result: `a` is `[e, max_m, k]` e4m3 (`a_s` `[e, max_m,
/// ⌈k/32⌉]`), of which the first `counts[e]` rows of expert e are valid;
/// `b`, `b_s` as in [`fp4_grouped_contiguous`]. Returns `[e, max_m, n]`:
/// valid rows are [`fp4_gemm`] of the expert's rows, rows at or beyond
/// `counts[e]` are +0.0 (the op layer leaves them untouched instead). Every
/// count must be at most `max_m` (callers validate; a violation panics).
#[allow(clippy::too_many_arguments)]
pub fn fp4_grouped_masked(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    counts: &[usize],
    max_m: usize,
    n: usize,
    k: usize,
) -> Vec<bf16> {
    to_bf16(fp4_grouped_masked_f32(a, a_s, b, b_s, counts, max_m, n, k))
}

/// [`fp4_grouped_masked`] returning the fp32 accumulators.
#[allow(clippy::too_many_arguments)]
pub fn fp4_grouped_masked_f32(
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    counts: &[usize],
    max_m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; counts.len() * max_m * n];
    for (e, &m) in counts.iter().enumerate() {
        assert!(m <= max_m, "counts[{e}] = {m} exceeds max_m = {max_m}");
        if m == 0 {
            continue;
        }
        let r0 = e * max_m;
        expert_rows(&mut out, a, a_s, b, b_s, e, r0..r0 + m, n, k);
    }
    out
}

/// Writes [`fp4_gemm_f32`] of the activation rows `rows` (of `a` `[.., k]`,
/// `a_s` `[.., ⌈k/32⌉]`) times expert `e`'s packed weight (`b` `[.., n, k]`,
/// `b_s` `[.., n, ⌈k/32⌉]`) into the same rows of `out` `[.., n]`.
#[allow(clippy::too_many_arguments)]
fn expert_rows(
    out: &mut [f32],
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[Fp4x2],
    b_s: &[E8M0],
    e: usize,
    rows: std::ops::Range<usize>,
    n: usize,
    k: usize,
) {
    let kb = k.div_ceil(BLOCK);
    let (wb, sb) = (n * k.div_ceil(2), n * kb);
    let y = fp4_gemm_f32(
        &a[rows.start * k..rows.end * k],
        &a_s[rows.start * kb..rows.end * kb],
        &b[e * wb..(e + 1) * wb],
        &b_s[e * sb..(e + 1) * sb],
        rows.len(),
        n,
        k,
    );
    out[rows.start * n..rows.end * n].copy_from_slice(&y);
}

/// BF16 × BF16 linear (ratio-1 compressor, indexer `wk` and `weights_proj`,
/// the grouped `wo_a`): fp32 accumulation, one BF16 rounding. `a` is
/// `[m, k]`, `w` is `[n, k]`; returns `[m, n]`. Equal to rounding
/// [`f32_gemm`] of the same operands to BF16.
pub fn bf16_gemm(a: &[bf16], w: &[bf16], m: usize, n: usize, k: usize) -> Vec<bf16> {
    to_bf16(f32_gemm(a, w, m, n, k))
}

/// fp32 linear (ratio-2 compressor, MoE gate, mHC mixes, heads): the input
/// and the weight (BF16 or f32, each independently) are promoted to fp32 and
/// the result is fp32. `a` is `[m, k]`, `w` is `[n, k]`; returns `[m, n]`.
pub fn f32_gemm<A, W>(a: &[A], w: &[W], m: usize, n: usize, k: usize) -> Vec<f32>
where
    A: Copy + Into<f32>,
    W: Copy + Into<f32>,
{
    let a: Vec<f32> = a[..m * k].iter().map(|&v| v.into()).collect();
    let mut out = vec![0.0f32; m * n];
    let mut row = vec![0.0f32; k];
    for j in 0..n {
        for (v, &x) in row.iter_mut().zip(&w[j * k..(j + 1) * k]) {
            *v = x.into();
        }
        for i in 0..m {
            out[i * n + j] = dot(&a[i * k..(i + 1) * k], &row);
        }
    }
    out
}

/// An FP8 weight `w` `[n, k]` e4m3 with 32 × 32 E8M0 block scales `w_s`
/// `[⌈n/32⌉, ⌈k/32⌉]` dequantised to BF16 `[n, k]`: each value is the fp32
/// product e4m3 · 2^e (exact in fp32) rounded once to nearest even, which
/// is exact unless it under- or overflows BF16. A NaN (an e4m3 NaN code or
/// the E8M0 NaN scale) is the canonical BF16 NaN `0x7FC0`, so every device
/// gives the same bits.
pub fn mxfp8_dequantize(w: &[E4M3], w_s: &[E8M0], n: usize, k: usize) -> Vec<bf16> {
    let (lut, kb) = (e4m3_table(), k.div_ceil(BLOCK));
    let mut out = Vec::with_capacity(n * k);
    for (r, row) in w.chunks(k.max(1)).take(n).enumerate() {
        let scales = &w_s[(r / BLOCK) * kb..(r / BLOCK + 1) * kb];
        out.extend(row.iter().enumerate().map(|(c, q)| {
            let v = lut[q.0 as usize] * e8m0_to_f32(scales[c / BLOCK]);
            if v.is_nan() {
                bf16::NAN
            } else {
                bf16::from_f32(v)
            }
        }));
    }
    out
}

/// The §10.4 loop over the decoded activation `a` (`[m, k]` fp32). Each
/// weight row is decoded by `decode_b_row(n, buf)` into `k` fp32 values, and
/// `b_scales(n)` gives that row's ⌈k/32⌉ scales.
fn block_scaled<'s>(
    a: &[f32],
    a_s: &[E8M0],
    m: usize,
    n: usize,
    k: usize,
    decode_b_row: impl Fn(usize, &mut [f32]),
    b_scales: impl Fn(usize) -> &'s [E8M0],
) -> Vec<f32> {
    let kb = k.div_ceil(BLOCK);
    let mut out = vec![0.0f32; m * n];
    let mut row = vec![0.0f32; k];
    for j in 0..n {
        decode_b_row(j, &mut row);
        let sb = b_scales(j);
        for i in 0..m {
            let (ar, sa) = (&a[i * k..(i + 1) * k], &a_s[i * kb..(i + 1) * kb]);
            let mut acc = 0.0f32;
            for (((xa, xb), sa), sb) in ar.chunks(BLOCK).zip(row.chunks(BLOCK)).zip(sa).zip(sb) {
                acc += dot(xa, xb) * (e8m0_to_f32(*sa) * e8m0_to_f32(*sb));
            }
            out[i * n + j] = acc;
        }
    }
    out
}

/// Σ x·y in fp32, in index order from +0.0.
fn dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).fold(0.0f32, |s, (a, b)| s + a * b)
}

fn decode_e4m3(lut: &[f32; 256], q: &[E4M3]) -> Vec<f32> {
    q.iter().map(|c| lut[c.0 as usize]).collect()
}

/// Every e4m3 code decoded to fp32.
fn e4m3_table() -> [f32; 256] {
    std::array::from_fn(|code| e4m3_to_f32(E4M3(code as u8)))
}

fn to_bf16(v: Vec<f32>) -> Vec<bf16> {
    v.into_iter().map(bf16::from_f32).collect()
}
