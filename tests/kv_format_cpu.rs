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
