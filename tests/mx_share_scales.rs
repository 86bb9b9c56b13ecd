//! `numerics::share_mx_scales` (issue 13): every element's value is
//! unchanged bit for bit, the count it returns is the number of runs that
//! share one scale afterwards, a second pass changes nothing, the per-32
//! reference GEMM gives the same bits on the rewritten operands, and bad
//! arguments are typed errors. Values are decoded here from the e4m3 and
//! E8M0 field definitions, not by the code under test. Operands are fresh
//! random, quantised by the library's quantiser, with odd row counts and K
//! tails, NaN codes and NaN scales. The op on the CPU runs the body that
//! `cuda_glue` runs on the GPU (`common::share_scales`).

mod common;

use common::share_scales::{Op, operand};
use deepinfer::cpu_backend::fp8_gemm_f32;
use deepinfer::numerics::share_mx_scales;
use deepinfer::{Device, E4M3, E8M0, Error};

fn share(op: &mut Op, group: usize) -> usize {
    share_mx_scales(&mut op.codes, &mut op.scales, op.rows, op.k, op.rps, group).unwrap()
}

#[test]
fn values_are_unchanged_and_the_count_is_the_uniform_runs() {
    let mut rng = common::rng("mx_share_scales_values");
    let mut rewritten = 0usize;
    for (rows, k, rps) in [
        (37, 1000, 1),
        (64, 4096, 1),
        (70, 1312, 32),
        (256, 4096, 32),
    ] {
        for shape in 0..3 {
            for group in [64, 128, 256] {
                let before = operand(&mut rng, rows, k, rps, shape);
                let mut after = before.clone();
                let n = share(&mut after, group);
                let what = format!("rows {rows} k {k} rps {rps} shape {shape} group {group}");
                assert_eq!(after.values(), before.values(), "values changed: {what}");
                assert_eq!(n, after.uniform_runs(group), "count: {what}");
                assert!(
                    n >= before.uniform_runs(group),
                    "fewer uniform runs: {what}"
                );
                rewritten += after
                    .scales
                    .iter()
                    .zip(&before.scales)
                    .filter(|(a, b)| a != b)
                    .count();
                // A second pass finds nothing left to share exactly.
                let mut again = after.clone();
                assert_eq!(share(&mut again, group), n, "second count: {what}");
                assert!(
                    again.codes == after.codes && again.scales == after.scales,
                    "second pass changed bytes: {what}"
                );
            }
        }
    }
    assert!(
        rewritten > 1000,
        "only {rewritten} scales rewritten: the test would not see a wrong rewrite"
    );
}

#[test]
fn the_per_32_reference_gemm_gives_the_same_bits() {
    let mut rng = common::rng("mx_share_scales_gemm");
    for (m, n, k, shape) in [(19, 45, 1000, 0), (33, 64, 512, 1), (16, 96, 1312, 2)] {
        let mut a = operand(&mut rng, m, k, 1, shape);
        let mut b = operand(&mut rng, n, k, 32, 0);
        // NaN scales and codes would make rows NaN on both sides alike; the
        // bit comparison wants finite results.
        for op in [&mut a, &mut b] {
            op.codes
                .iter_mut()
                .filter(|c| c.0 & 0x7F == 0x7F)
                .for_each(|c| c.0 = 0x38);
            op.scales
                .iter_mut()
                .filter(|s| s.0 == 0xFF)
                .for_each(|s| s.0 = 127);
        }
        let want = fp8_gemm_f32(&a.codes, &a.scales, &b.codes, &b.scales, m, n, k);
        let changed = share(&mut a.clone(), 128) > a.uniform_runs(128);
        assert!(changed, "m {m} k {k}: nothing to rewrite");
        for group in [64, 128] {
            let (mut a2, mut b2) = (a.clone(), b.clone());
            share(&mut a2, group);
            share(&mut b2, group);
            let got = fp8_gemm_f32(&a2.codes, &a2.scales, &b2.codes, &b2.scales, m, n, k);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "m {m} n {n} k {k} group {group}");
        }
    }
}

#[test]
fn an_inexact_shift_leaves_the_run_as_it_was() {
    // Two blocks of one row: scales 2^0 and 2^1 (bytes 127, 128).
    let mk = |low: u8| {
        let mut codes = vec![E4M3(0x38); 64]; // 1.0
        codes[5] = E4M3(low);
        (codes, vec![E8M0(127), E8M0(128)])
    };
    // 0x30 = 0.5 halves to 0.25 (0x28): exact, so the run is shared.
    let (mut codes, mut scales) = mk(0x30);
    assert_eq!(
        share_mx_scales(&mut codes, &mut scales, 1, 64, 1, 64).unwrap(),
        1
    );
    assert_eq!(scales, vec![E8M0(128), E8M0(128)]);
    assert_eq!(codes[5], E4M3(0x28));
    assert_eq!(codes[0], E4M3(0x30));
    assert_eq!(codes[40], E4M3(0x38));
    // 0x01 = 2^-9, e4m3's smallest step: its half is not an e4m3 value.
    let (mut codes, mut scales) = mk(0x01);
    let before = (codes.clone(), scales.clone());
    assert_eq!(
        share_mx_scales(&mut codes, &mut scales, 1, 64, 1, 64).unwrap(),
        0
    );
    assert_eq!((codes, scales), before);
    // Negative zero keeps its sign.
    let (mut codes, mut scales) = mk(0x80);
    assert_eq!(
        share_mx_scales(&mut codes, &mut scales, 1, 64, 1, 64).unwrap(),
        1
    );
    assert_eq!(codes[5], E4M3(0x80));
}

#[test]
fn bad_arguments_are_typed_errors() {
    let mut codes = vec![E4M3(0x38); 64];
    let mut scales = vec![E8M0(127); 2];
    let arg = |e: Error| {
        matches!(
            e,
            Error::Argument {
                op: "share_mx_scales",
                ..
            }
        )
    };
    let shape = |e: Error| {
        matches!(
            e,
            Error::Shape {
                op: "share_mx_scales",
                ..
            }
        )
    };
    for group in [0, 48] {
        assert!(arg(share_mx_scales(
            &mut codes,
            &mut scales,
            1,
            64,
            1,
            group
        )
        .unwrap_err()));
    }
    assert!(arg(
        share_mx_scales(&mut codes, &mut scales, 1, 64, 0, 64).unwrap_err()
    ));
    assert!(shape(
        share_mx_scales(&mut codes, &mut scales, 2, 64, 1, 64).unwrap_err()
    ));
    assert!(shape(
        share_mx_scales(&mut codes, &mut scales[..1], 1, 64, 1, 64).unwrap_err()
    ));
    assert!(shape(
        share_mx_scales(&mut codes, &mut scales, usize::MAX, 2, 1, 64).unwrap_err()
    ));
    assert_eq!(
        scales,
        vec![E8M0(127), E8M0(127)],
        "refused calls wrote nothing"
    );
}

#[test]
fn the_op_gives_the_bytes_of_numerics_on_the_cpu() {
    let mut rng = common::rng("mx_share_scales_op_cpu");
    common::share_scales::op_matches_numerics(&Device::Cpu, &mut rng);
}

#[test]
fn the_fused_quantiser_gives_the_bytes_of_the_composition_on_the_cpu() {
    let mut rng = common::rng("act_quant_fp8_shared_cpu");
    common::share_scales::quant_shared_matches_the_composition(&Device::Cpu, &mut rng);
}

#[test]
fn every_code_and_shift_agrees_with_a_search_of_all_codes() {
    common::share_scales::every_code_and_shift(&Device::Cpu);
}
