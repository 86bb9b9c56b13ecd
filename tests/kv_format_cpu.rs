//! Cache row formats: byte sizes from the spec's table (§11), the layout
//! (values then scales, even element in the low nibble), exactness of the
//! decoded BF16 values, idempotence of fake quantisation, and error bounds.

mod common;

use deepinfer::kv_format::*;
use half::bf16;

#[test]
fn row_sizes_match_the_spec() {
    assert_eq!(window_row_bytes(512), 528);
    assert_eq!(compressed_row_bytes(512), 288);
    assert_eq!(index_key_row_bytes(128), 68);
    let mut rng = common::rng("kv_sizes");
    let row = common::random_activations(&mut rng, 512, 2.0);
    assert_eq!(encode_window_row(&row).len(), 528);
    assert_eq!(encode_compressed_row(&row).len(), 288);
    assert_eq!(encode_index_key_row(&row[..128]).len(), 68);
}

#[test]
fn layout_is_values_then_scales_with_the_even_element_low() {
    // 32 values: element 0 = 6 (max of its group), element 1 = -3.
    let mut row = vec![bf16::ZERO; 32];
    row[0] = bf16::from_f32(6.0);
    row[1] = bf16::from_f32(-3.0);
    let b = encode_index_key_row(&row);
    // amax 6 -> scale 2^ceil(log2(6 * fp32(1/6))) = 2^0 (byte 127); 6 -> code 7, -3 -> code 0xD.
    assert_eq!(b[16], 127, "the scale follows the 16 value bytes");
    assert_eq!(
        b[0], 0xD7,
        "element 0 in the low nibble, element 1 in the high nibble"
    );
    let w = encode_window_row(&row);
    assert_eq!(w[32], 127 - 6, "amax 6: scale 2^ceil(log2(6/448)) = 2^-6");
}

#[test]
fn decoded_rows_are_exact_idempotent_and_close() {
    let mut rng = common::rng("kv_roundtrip");
    for _ in 0..50 {
        // Wide-range values, except for the E4M3-scaled format, whose scale
        // saturates at 448 (values beyond 6·448 clip): post-norm KV stays far below.
        let row = common::random_bf16(&mut rng, 512);
        let kv_row = common::random_activations(&mut rng, 512, 4.0);
        // Error bounds: e4m3 keeps 3 mantissa bits (relative 2^-4) and its
        // subnormal step is at most amax·2^-16; e2m1 with a scale s ≤ amax/3
        // rounds to a grid whose widest half-gap is s.
        let cases: [(&str, Vec<bf16>, f64, f64); 3] = [
            (
                "window fp8",
                decode_window_row(&encode_window_row(&row), 512),
                2f64.powi(-4),
                2f64.powi(-16),
            ),
            (
                "compressed fp4",
                decode_compressed_row(&encode_compressed_row(&kv_row), 512),
                0.0,
                1.0 / 3.0,
            ),
            (
                "index key fp4",
                decode_index_key_row(&encode_index_key_row(&row), 512),
                0.0,
                1.0 / 3.0,
            ),
        ];
        for (name, deq, rel, abs) in cases {
            let again = match name {
                "window fp8" => decode_window_row(&encode_window_row(&deq), 512),
                "compressed fp4" => decode_compressed_row(&encode_compressed_row(&deq), 512),
                _ => decode_index_key_row(&encode_index_key_row(&deq), 512),
            };
            assert_eq!(again, deq, "{name}: fake quantisation is idempotent");
            let src = if name == "compressed fp4" {
                &kv_row
            } else {
                &row
            };
            for (g, (x, d)) in src.chunks(32).zip(deq.chunks(32)).enumerate() {
                let amax = x.iter().fold(0.0f64, |m, v| m.max(v.to_f64().abs()));
                for (x, d) in x.iter().zip(d) {
                    let err = (x.to_f64() - d.to_f64()).abs();
                    assert!(
                        err <= rel * x.to_f64().abs() + amax * abs + 1e-30,
                        "{name} group {g}: {x} -> {d}"
                    );
                }
            }
        }
    }
}

/// Issue 15: a NaN or ±Inf never leaves a quantiser as a finite value. e4m3
/// keeps NaN per element (0x7F) and ±Inf decodes to ±Inf (448 · 2^127
/// overflows); e2m1 has neither, so a FP4 block holding one is stored with
/// the NaN scale (E8M0 0xFF, e4m3 0x7F for the compressed rows) and code 7 in
/// every element, and decodes to NaN. The row's other blocks are untouched.
#[test]
fn non_finite_values_are_never_quantised_into_finite_ones() {
    use deepinfer::contract::KvRowFormat;
    let dim = 96;
    let clean: Vec<bf16> = (0..dim)
        .map(|i| bf16::from_f32(i as f32 * 0.37 - 11.0))
        .collect();
    let bad = [bf16::NAN, -bf16::NAN, bf16::INFINITY, bf16::NEG_INFINITY];
    let formats = [
        (KvRowFormat::Window, 32, None),
        (KvRowFormat::Compressed, 16, Some(0x7Fu8)),
        (KvRowFormat::IndexKey, 32, Some(0xFFu8)),
    ];
    for (format, group, nan_scale) in formats {
        let decode = |bytes: &[u8]| match format {
            KvRowFormat::Window => decode_window_row(bytes, dim),
            KvRowFormat::Compressed => decode_compressed_row(bytes, dim),
            KvRowFormat::IndexKey => decode_index_key_row(bytes, dim),
        };
        let want_clean = decode(&encode_row(format, &clean));
        assert!(want_clean.iter().all(|v| v.is_finite()));
        for b in bad {
            for at in [0, 17, dim - 1] {
                let mut row = clean.clone();
                row[at] = b;
                let bytes = encode_row(format, &row);
                let got = decode(&bytes);
                let what = format!("{format:?}, {b} at {at}");
                assert!(!got[at].is_finite(), "{what}: decoded {}", got[at]);
                let block = at / group;
                for (i, (g, w)) in got.iter().zip(&want_clean).enumerate() {
                    if i / group != block {
                        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}");
                    } else if nan_scale.is_some() {
                        assert!(g.is_nan(), "{what}: element {i} decoded {g}");
                    }
                }
                if let Some(s) = nan_scale {
                    let values = dim / 2;
                    assert_eq!(bytes[values + block], s, "{what}: scale byte");
                    let nibbles = &bytes[block * group / 2..(block + 1) * group / 2];
                    assert!(nibbles.iter().all(|&n| n == 0x77), "{what}: {nibbles:x?}");
                }
            }
        }
    }
}
