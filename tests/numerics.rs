//! Bit-exactness of the scalar conversions and block quantisers against
//! independent definitions written here from the format specifications
//! (v41-flash.md §10), never against the code under test.

mod common;

use common::e4m3_spec;

use deepinfer::numerics::*;
use deepinfer::{E4M3, E8M0};
use half::bf16;
use rand::Rng;

/// Nearest finite e4m3 by exhaustive search, ties to the even code,
/// saturating at ±448.
fn e4m3_nearest(x: f32) -> u8 {
    let x = x as f64;
    let mut best = 0u8;
    let mut best_d = f64::INFINITY;
    for code in 0..=255u8 {
        let v = e4m3_spec(code);
        if v.is_nan() || (v == 0.0 && (code & 0x80 != 0) != x.is_sign_negative()) {
            continue;
        }
        let d = (v - x).abs();
        if d < best_d || (d == best_d && code % 2 == 0 && best % 2 == 1) {
            best = code;
            best_d = d;
        }
    }
    best
}

#[test]
fn e4m3_decode_matches_the_format_for_every_code() {
    for code in 0..=255u8 {
        let want = e4m3_spec(code);
        let got = e4m3_to_f32(E4M3(code)) as f64;
        assert!(
            (want.is_nan() && got.is_nan()) || want == got,
            "code {code:#04x}: want {want}, got {got}"
        );
    }
}

#[test]
fn e4m3_encode_is_saturating_nearest_even() {
    let mut rng = common::rng("e4m3_encode");
    // Every midpoint between neighbouring codes, the codes themselves, and
    // random values over the whole range including beyond 448.
    let mut xs: Vec<f32> = Vec::new();
    for code in 0..0x7Eu8 {
        let (a, b) = (e4m3_spec(code), e4m3_spec(code + 1));
        xs.extend([a as f32, ((a + b) / 2.0) as f32, -((a + b) / 2.0) as f32]);
    }
    xs.extend([448.0, 463.9, 464.0, 1e6, -1e6, 0.0, -0.0, 1e-30]);
    xs.extend((0..20000).map(|_| rng.random_range(-600.0f32..600.0)));
    xs.extend((0..20000).map(|_| rng.random_range(-0.02f32..0.02)));
    for x in xs {
        assert_eq!(f32_to_e4m3(x).0, e4m3_nearest(x), "x = {x:e}");
    }
    assert_eq!(f32_to_e4m3(f32::NAN).0 & 0x7F, 0x7F);
}

#[test]
fn e8m0_decodes_every_byte() {
    for b in 0..=254u8 {
        assert_eq!(
            e8m0_to_f32(E8M0(b)) as f64,
            2f64.powi(b as i32 - 127),
            "byte {b}"
        );
    }
    assert!(e8m0_to_f32(E8M0(0xFF)).is_nan());
}

/// The smallest power of two >= p, found by stepping exponents in f64.
fn smallest_pow2_at_least(p: f32) -> i32 {
    let p = p as f64;
    let mut e = -140;
    while 2f64.powi(e) < p {
        e += 1;
    }
    e
}

#[test]
fn ceil_pow2_scale_is_the_smallest_power_of_two_covering_the_product() {
    let mut rng = common::rng("ceil_pow2");
    let mut amaxes: Vec<f32> = (0..50000)
        .map(|_| 2f32.powf(rng.random_range(-13.0..120.0)) * rng.random_range(1.0f32..2.0))
        .collect();
    // Exact powers of two times 448 and their neighbours: the ceiling's edge.
    for e in -10..100 {
        let p = 448.0 * 2f32.powi(e);
        amaxes.extend([
            p,
            f32::from_bits(p.to_bits() + 1),
            f32::from_bits(p.to_bits() - 1),
        ]);
    }
    for amax in amaxes {
        let p = amax * (1.0f32 / 448.0);
        let want = smallest_pow2_at_least(p);
        assert_eq!(
            ceil_pow2_scale(amax, 1.0 / 448.0).0 as i32 - 127,
            want,
            "amax {amax:e}"
        );
    }
}

/// Nearest e2m1 magnitude code by exhaustive search, ties to the even code.
fn e2m1_nearest_code(x: f32) -> u8 {
    let d = |c: u8| (E2M1_VALUES[c as usize] - x.abs()).abs();
    (0..8u8).fold(0, |best, c| {
        if d(c) < d(best) || (d(c) == d(best) && c % 2 == 0) {
            c
        } else {
            best
        }
    })
}

#[test]
fn e2m1_rounds_to_nearest_with_ties_to_the_even_code() {
    // The spec's own examples (v41-flash.md §10.3).
    for (x, v) in [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
    ] {
        assert_eq!(e2m1_to_f32(f32_to_e2m1(x)), v, "x = {x}");
        assert_eq!(e2m1_to_f32(f32_to_e2m1(-x)), -v, "x = -{x}");
    }
    let mut rng = common::rng("e2m1");
    for _ in 0..20000 {
        let x: f32 = rng.random_range(-7.0..7.0);
        let best = e2m1_nearest_code(x);
        assert_eq!(f32_to_e2m1(x) & 7, best, "x = {x}");
        assert_eq!(f32_to_e2m1(x) & 8 != 0, x < 0.0);
    }
}

#[test]
fn fp4_packing_puts_the_even_element_in_the_low_nibble() {
    let p = pack_fp4(0x3, 0xA);
    assert_eq!(p.0, 0xA3);
    assert_eq!(unpack_fp4(p), (0x3, 0xA));
}

#[test]
fn act_quant_block_matches_the_spec_on_random_blocks() {
    let mut rng = common::rng("act_quant_block");
    for len in [32usize, 31, 7, 1] {
        for _ in 0..2000 {
            let block = common::random_bf16(&mut rng, len);
            let mut q = vec![E4M3(0); len];
            let s = act_quant_block(&block, &mut q);
            let amax = block.iter().fold(1e-4f32, |m, v| m.max(v.to_f32().abs()));
            let e = smallest_pow2_at_least(amax * (1.0f32 / 448.0));
            assert_eq!(s.0 as i32 - 127, e);
            for (x, q) in block.iter().zip(&q) {
                let scaled = (x.to_f64() / 2f64.powi(e)) as f32;
                assert_eq!(q.0, e4m3_nearest(scaled), "x = {x}, e = {e}");
            }
        }
    }
}

#[test]
fn fp4_quantisers_follow_their_floors_and_scales() {
    let mut rng = common::rng("fp4_quant");
    for _ in 0..2000 {
        let block = common::random_bf16(&mut rng, 32);
        let mut n = [0u8; 32];
        let s = fp4_e8m0_quant_block(&block, &mut n);
        let amax = block
            .iter()
            .fold(6.0 * f32::MIN_POSITIVE, |m, v| m.max(v.to_f32().abs()));
        assert_eq!(
            s.0 as i32 - 127,
            smallest_pow2_at_least(amax * (1.0f32 / 6.0))
        );
        let sc = 2f64.powi(s.0 as i32 - 127);
        for (x, c) in block.iter().zip(n) {
            let v = (x.to_f64() / sc).clamp(-6.0, 6.0) as f32;
            assert_eq!(c & 7, e2m1_nearest_code(v), "x {x} v {v}");
        }
        let mut n16 = [0u8; 16];
        let s16 = fp4_e4m3_quant_block(&block[..16], &mut n16);
        let amax16 = block[..16]
            .iter()
            .fold(6.0 / 512.0, |m: f32, v| m.max(v.to_f32().abs()));
        assert_eq!(s16.0, e4m3_nearest(amax16 / 6.0));
        for (x, c) in block[..16].iter().zip(n16) {
            let v = (x.to_f32() / e4m3_to_f32(s16)).clamp(-6.0, 6.0);
            assert_eq!(c, f32_to_e2m1(v));
        }
    }
}

#[test]
fn bf16_conversion_rounds_to_nearest_even() {
    let mut rng = common::rng("bf16");
    for _ in 0..100000 {
        let x = f32::from_bits(rng.random::<u32>() & 0x7EFF_FFFF);
        let lo = f32::from_bits(x.to_bits() & 0xFFFF_0000);
        let hi = f32::from_bits((x.to_bits() & 0xFFFF_0000) + 0x1_0000);
        let (dl, dh) = ((x as f64 - lo as f64).abs(), (hi as f64 - x as f64).abs());
        let want = if dl < dh || (dl == dh && (lo.to_bits() >> 16).is_multiple_of(2)) {
            lo
        } else {
            hi
        };
        assert_eq!(
            f32_to_bf16(x).to_f32().to_bits(),
            want.to_bits(),
            "x = {x:e}"
        );
    }
    assert_eq!(bf16_to_f32(bf16::from_bits(0x3F80)), 1.0);
}

#[test]
fn calc_diff_is_zero_for_equal_and_two_for_opposite_inputs() {
    let x = [1.0, -2.0, 3.5];
    assert_eq!(calc_diff(&x, &x), 0.0);
    assert!((calc_diff(&x, &[-1.0, 2.0, -3.5]) - 2.0).abs() < 1e-12);
    assert!(calc_diff(&x, &[1.0, -2.0, 3.6]) > 0.0);
}
