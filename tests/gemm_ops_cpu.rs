//! The GEMM op API on the CPU (runs in CI): every typed validation error of
//! `ops::{mxfp8_linear, mxfp4_grouped_contiguous, mxfp4_grouped_masked,
//! bf16_linear}`, the ops against the CPU references bit for bit, the
//! grouped references against a per-expert `fp4_gemm` loop (bit for bit) and
//! against an f64 recomputation (within the fp32 summation bound stated in
//! `f64_reference`), empty experts, zero-row inputs, and masked rows beyond
//! the count left untouched. Inputs are fresh random codes every run
//! (DEEPINFER_SEED replays one).

mod common;

use common::{GEMM_SCALES, random_e4m3, random_e8m0, random_fp4};
use deepinfer::cpu_backend;
use deepinfer::numerics::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, unpack_fp4};
use deepinfer::ops::{self, GemmImpl, SKINNY_MAX_M};
use deepinfer::{DType, E4M3, E8M0, Error, Fp4x2, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;
use std::ops::Range;

fn t<T: deepinfer::dtype::Element>(v: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

fn i32s(v: &[i32]) -> Tensor {
    t(v.to_vec(), &[v.len()])
}

/// Dense FP8 operands: a [m, k], a_s [m, ⌈k/32⌉], w [n, k], w_s [⌈n/32⌉, ⌈k/32⌉].
struct Dense {
    a: Tensor,
    a_s: Tensor,
    w: Tensor,
    w_s: Tensor,
}

fn dense(rng: &mut StdRng, m: usize, n: usize, k: usize) -> Dense {
    let kb = k.div_ceil(32);
    Dense {
        a: t(random_e4m3(rng, m * k), &[m, k]),
        a_s: t(random_e8m0(rng, m * kb, GEMM_SCALES), &[m, kb]),
        w: t(random_e4m3(rng, n * k), &[n, k]),
        w_s: t(
            random_e8m0(rng, n.div_ceil(32) * kb, GEMM_SCALES),
            &[n.div_ceil(32), kb],
        ),
    }
}

/// FP4 expert weights: w [e, n, k] packed, w_s [e, n, ⌈k/32⌉].
fn experts(rng: &mut StdRng, e: usize, n: usize, k: usize) -> (Tensor, Tensor) {
    let kb = k.div_ceil(32);
    (
        t(random_fp4(rng, e * n * k / 2), &[e, n, k]),
        t(random_e8m0(rng, e * n * kb, GEMM_SCALES), &[e, n, kb]),
    )
}

/// Activations a [rows, k] (any leading shape), a_s [.., ⌈k/32⌉].
fn acts(rng: &mut StdRng, lead: &[usize], k: usize) -> (Tensor, Tensor) {
    let rows: usize = lead.iter().product();
    let kb = k.div_ceil(32);
    let mut sa = lead.to_vec();
    sa.push(k);
    let mut ss = lead.to_vec();
    ss.push(kb);
    (
        t(random_e4m3(rng, rows * k), &sa),
        t(random_e8m0(rng, rows * kb, GEMM_SCALES), &ss),
    )
}

/// out[i, j] of a block-scaled GEMM recomputed in f64, with the bound on the
/// CPU reference's fp32 error: inside a block at most 31 roundings of
/// partial sums, then at most ⌈k/32⌉ roundings of the accumulator, each
/// ≤ 2^-24 · (a sum of |terms|): |fp32 − exact| ≤ (32 + ⌈k/32⌉) · 2^-24 ·
/// Σ|a·b·sa·sb| (scale products are exact powers of two).
fn f64_reference(a: &[f32], sa: &[f32], b: &[f32], sb: &[f32], k: usize) -> (f64, f64) {
    let (mut sum, mut abs) = (0.0f64, 0.0f64);
    for (blk, (xa, xb)) in a.chunks(32).zip(b.chunks(32)).enumerate() {
        let s = sa[blk] as f64 * sb[blk] as f64;
        for (x, y) in xa.iter().zip(xb) {
            let p = *x as f64 * *y as f64 * s;
            sum += p;
            abs += p.abs();
        }
    }
    let bound = (32 + k.div_ceil(32)) as f64 * 2f64.powi(-24) * abs;
    (sum, bound)
}

fn dec_e4m3(v: &[E4M3]) -> Vec<f32> {
    v.iter().map(|&c| e4m3_to_f32(c)).collect()
}

fn dec_e8m0(v: &[E8M0]) -> Vec<f32> {
    v.iter().map(|&c| e8m0_to_f32(c)).collect()
}

fn dec_fp4(v: &[Fp4x2]) -> Vec<f32> {
    v.iter()
        .flat_map(|&p| {
            let (lo, hi) = unpack_fp4(p);
            [e2m1_to_f32(lo), e2m1_to_f32(hi)]
        })
        .collect()
}

fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bits_bf16(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn mxfp8_linear_equals_the_reference_and_an_f64_recomputation() {
    let mut rng = common::rng("mxfp8_linear_cpu");
    for &(m, n, k) in &[
        (1, 32, 32),
        (7, 33, 40),
        (65, 64, 96),
        (3, 1, 1),
        (2, 70, 200),
        (SKINNY_MAX_M, 31, 64),
    ] {
        let d = dense(&mut rng, m, n, k);
        let (av, asv) = (
            d.a.as_slice::<E4M3>().unwrap(),
            d.a_s.as_slice::<E8M0>().unwrap(),
        );
        let (wv, wsv) = (
            d.w.as_slice::<E4M3>().unwrap(),
            d.w_s.as_slice::<E8M0>().unwrap(),
        );
        let want32 = cpu_backend::fp8_gemm_f32(av, asv, wv, wsv, m, n, k);
        let want16 = cpu_backend::fp8_gemm(av, asv, wv, wsv, m, n, k);
        let got32 = ops::mxfp8_linear(&d.a, &d.a_s, &d.w, &d.w_s, DType::F32).unwrap();
        let got16 = ops::mxfp8_linear(&d.a, &d.a_s, &d.w, &d.w_s, DType::BF16).unwrap();
        assert_eq!(got32.shape(), &[m, n]);
        assert_eq!(
            bits_f32(got32.as_slice().unwrap()),
            bits_f32(&want32),
            "{m}x{n}x{k}"
        );
        assert_eq!(
            bits_bf16(got16.as_slice().unwrap()),
            bits_bf16(&want16),
            "{m}x{n}x{k}"
        );
        // The CUDA implementation choice does not change the CPU result.
        for imp in [
            GemmImpl::Auto,
            GemmImpl::Large,
            GemmImpl::LargeSplit,
            GemmImpl::LargeShared,
            GemmImpl::Skinny,
            GemmImpl::SkinnyWholeK,
            GemmImpl::LargeSkinnySplit,
        ] {
            if matches!(imp, GemmImpl::Skinny | GemmImpl::SkinnyWholeK) && m > SKINNY_MAX_M {
                continue;
            }
            let mut out = Tensor::filled_bytes(DType::F32, &[m, n], 0xFF).unwrap();
            ops::mxfp8_linear_into(&d.a, &d.a_s, &d.w, &d.w_s, &mut out, imp).unwrap();
            assert_eq!(bits_f32(out.as_slice().unwrap()), bits_f32(&want32));
        }
        let (a, sa, w, sw) = (dec_e4m3(av), dec_e8m0(asv), dec_e4m3(wv), dec_e8m0(wsv));
        let kb = k.div_ceil(32);
        for i in 0..m {
            for j in 0..n {
                let (exact, bound) = f64_reference(
                    &a[i * k..(i + 1) * k],
                    &sa[i * kb..(i + 1) * kb],
                    &w[j * k..(j + 1) * k],
                    &sw[(j / 32) * kb..(j / 32 + 1) * kb],
                    k,
                );
                let got = want32[i * n + j] as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{m}x{n}x{k} [{i},{j}]: {got} vs exact {exact} (bound {bound})"
                );
            }
        }
    }
}

/// Splits `t` rows over `e` experts with some empty groups (at least one
/// empty expert whenever e > 2): exclusive prefix sums.
fn random_offsets(rng: &mut StdRng, e: usize, t: usize) -> Vec<i32> {
    let mut cuts: Vec<usize> = (0..e - 1).map(|_| rng.random_range(0..=t)).collect();
    if e > 2 {
        cuts[0] = cuts[1];
    }
    cuts.sort();
    let mut o = vec![0i32];
    o.extend(cuts.iter().map(|&c| c as i32));
    o.push(t as i32);
    o
}

/// The host data of grouped operands: `a`, `a_s`, `w` (packed FP4), `w_s`.
fn grouped_slices<'t>(
    a: &'t Tensor,
    a_s: &'t Tensor,
    w: &'t Tensor,
    w_s: &'t Tensor,
) -> (&'t [E4M3], &'t [E8M0], &'t [Fp4x2], &'t [E8M0]) {
    (
        a.as_slice().unwrap(),
        a_s.as_slice().unwrap(),
        w.as_slice().unwrap(),
        w_s.as_slice().unwrap(),
    )
}

/// Rows `rows` of the fp32 output `got` (`[.., n]`) of a grouped GEMM
/// against [`f64_reference`]: decoded activations `a` `[.., k]` with scales
/// `sa` `[.., ⌈k/32⌉]` times one expert's weights `w` `[n, k]` (packed FP4)
/// with scales `sw` `[n, ⌈k/32⌉]`.
fn check_expert_rows_f64(
    got: &[f32],
    (a, sa): (&[f32], &[f32]),
    (w, sw): (&[Fp4x2], &[E8M0]),
    rows: Range<usize>,
    n: usize,
    k: usize,
) {
    let kb = k.div_ceil(32);
    let (wd, sd) = (dec_fp4(w), dec_e8m0(sw));
    for r in rows {
        for j in 0..n {
            let (exact, bound) = f64_reference(
                &a[r * k..(r + 1) * k],
                &sa[r * kb..(r + 1) * kb],
                &wd[j * k..(j + 1) * k],
                &sd[j * kb..(j + 1) * kb],
                k,
            );
            let got = got[r * n + j] as f64;
            assert!(
                (got - exact).abs() <= bound,
                "row {r} col {j}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn grouped_contiguous_equals_per_expert_fp4_gemm_and_f64() {
    let mut rng = common::rng("grouped_contiguous_cpu");
    for &(e, rows, n, k) in &[
        (5, 23, 40, 96),
        (3, 9, 33, 70),
        (1, 4, 8, 32),
        (6, 0, 16, 64),
    ] {
        let (a, a_s) = acts(&mut rng, &[rows], k);
        let (w, w_s) = experts(&mut rng, e, n, k);
        let offsets = random_offsets(&mut rng, e, rows);
        let off_t = i32s(&offsets);
        let got32 = ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &off_t, DType::F32).unwrap();
        let got16 = ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &off_t, DType::BF16).unwrap();
        assert_eq!(got32.shape(), &[rows, n]);
        let (g32, g16) = (
            got32.as_slice::<f32>().unwrap(),
            got16.as_slice::<bf16>().unwrap(),
        );
        let (av, asv, wv, wsv) = grouped_slices(&a, &a_s, &w, &w_s);
        let kb = k.div_ceil(32);
        let (wb, sb) = (n * k / 2, n * kb);
        let offs: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
        let ref32 = cpu_backend::fp4_grouped_contiguous_f32(av, asv, wv, wsv, &offs, n, k);
        let ref16 = cpu_backend::fp4_grouped_contiguous(av, asv, wv, wsv, &offs, n, k);
        assert_eq!(bits_f32(g32), bits_f32(&ref32));
        assert_eq!(bits_bf16(g16), bits_bf16(&ref16));
        let (ad, sad) = (dec_e4m3(av), dec_e8m0(asv));
        for x in 0..e {
            let (r0, r1) = (offs[x], offs[x + 1]);
            let (we, se) = (&wv[x * wb..(x + 1) * wb], &wsv[x * sb..(x + 1) * sb]);
            let per32 = cpu_backend::fp4_gemm_f32(
                &av[r0 * k..r1 * k],
                &asv[r0 * kb..r1 * kb],
                we,
                se,
                r1 - r0,
                n,
                k,
            );
            let per16 = cpu_backend::fp4_gemm(
                &av[r0 * k..r1 * k],
                &asv[r0 * kb..r1 * kb],
                we,
                se,
                r1 - r0,
                n,
                k,
            );
            assert_eq!(
                bits_f32(&g32[r0 * n..r1 * n]),
                bits_f32(&per32),
                "expert {x}"
            );
            assert_eq!(
                bits_bf16(&g16[r0 * n..r1 * n]),
                bits_bf16(&per16),
                "expert {x}"
            );
            check_expert_rows_f64(g32, (&ad, &sad), (we, se), r0..r1, n, k);
        }
    }
}

#[test]
fn grouped_masked_equals_per_expert_fp4_gemm_and_leaves_padding_untouched() {
    let mut rng = common::rng("grouped_masked_cpu");
    for &(e, max_m, n, k) in &[(4, 5, 40, 96), (3, 1, 33, 70), (2, 8, 16, 32)] {
        let (a, a_s) = acts(&mut rng, &[e, max_m], k);
        let (w, w_s) = experts(&mut rng, e, n, k);
        // Expert 0 is empty, expert 1 full, the rest random.
        let counts = common::masked_counts(&mut rng, e, max_m);
        let mut out = Tensor::filled_bytes(DType::F32, &[e, max_m, n], 0xFF).unwrap();
        ops::mxfp4_grouped_masked_into(&a, &a_s, &w, &w_s, &i32s(&counts), &mut out).unwrap();
        let got16 =
            ops::mxfp4_grouped_masked(&a, &a_s, &w, &w_s, &i32s(&counts), DType::BF16).unwrap();
        assert_eq!(got16.shape(), &[e, max_m, n]);
        let (g32, g16) = (
            out.as_slice::<f32>().unwrap(),
            got16.as_slice::<bf16>().unwrap(),
        );
        let (av, asv, wv, wsv) = grouped_slices(&a, &a_s, &w, &w_s);
        let kb = k.div_ceil(32);
        let (wb, sb) = (n * k / 2, n * kb);
        let cnt: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
        let ref32 = cpu_backend::fp4_grouped_masked_f32(av, asv, wv, wsv, &cnt, max_m, n, k);
        let ref16 = cpu_backend::fp4_grouped_masked(av, asv, wv, wsv, &cnt, max_m, n, k);
        let (ad, sad) = (dec_e4m3(av), dec_e8m0(asv));
        for x in 0..e {
            let (r0, c) = (x * max_m, cnt[x]);
            let (we, se) = (&wv[x * wb..(x + 1) * wb], &wsv[x * sb..(x + 1) * sb]);
            let per32 = cpu_backend::fp4_gemm_f32(
                &av[r0 * k..(r0 + c) * k],
                &asv[r0 * kb..(r0 + c) * kb],
                we,
                se,
                c,
                n,
                k,
            );
            let valid = r0 * n..(r0 + c) * n;
            let pad = (r0 + c) * n..(r0 + max_m) * n;
            assert_eq!(
                bits_f32(&g32[valid.clone()]),
                bits_f32(&per32),
                "expert {x}"
            );
            assert_eq!(
                bits_f32(&ref32[valid.clone()]),
                bits_f32(&per32),
                "expert {x}"
            );
            assert_eq!(
                bits_bf16(&g16[valid.clone()]),
                bits_bf16(&ref16[valid.clone()]),
                "expert {x}"
            );
            assert!(
                g32[pad.clone()].iter().all(|v| v.is_nan()),
                "padding of expert {x} written"
            );
            assert!(
                ref32[pad].iter().all(|&v| v == 0.0),
                "reference padding is +0.0"
            );
            check_expert_rows_f64(g32, (&ad, &sad), (we, se), r0..r0 + c, n, k);
        }
    }
}

#[test]
fn bf16_linear_equals_the_cpu_references() {
    let mut rng = common::rng("bf16_linear_cpu");
    for &(m, n, k) in &[(1, 8, 16), (7, 33, 40), (4, 1, 1), (3, 17, 257)] {
        let a = common::random_activations(&mut rng, m * k, 2.0);
        let w = common::random_activations(&mut rng, n * k, 0.05);
        let (at, wt) = (t(a.clone(), &[m, k]), t(w.clone(), &[n, k]));
        let g32 = ops::bf16_linear(&at, &wt, DType::F32).unwrap();
        let g16 = ops::bf16_linear(&at, &wt, DType::BF16).unwrap();
        assert_eq!(
            bits_f32(g32.as_slice().unwrap()),
            bits_f32(&cpu_backend::f32_gemm(&a, &w, m, n, k))
        );
        assert_eq!(
            bits_bf16(g16.as_slice().unwrap()),
            bits_bf16(&cpu_backend::bf16_gemm(&a, &w, m, n, k))
        );
    }
}

#[test]
fn zero_rows_and_empty_groups_give_empty_or_untouched_outputs() {
    let mut rng = common::rng("gemm_zero_rows_cpu");
    let d = dense(&mut rng, 0, 40, 64);
    let y = ops::mxfp8_linear(&d.a, &d.a_s, &d.w, &d.w_s, DType::BF16).unwrap();
    assert_eq!(y.shape(), &[0, 40]);
    let a = t(Vec::<bf16>::new(), &[0, 16]);
    let w = t(vec![bf16::ONE; 3 * 16], &[3, 16]);
    assert_eq!(
        ops::bf16_linear(&a, &w, DType::F32).unwrap().shape(),
        &[0, 3]
    );
    let (w4, s4) = experts(&mut rng, 3, 8, 32);
    let (a0, s0) = acts(&mut rng, &[0], 32);
    let y = ops::mxfp4_grouped_contiguous(&a0, &s0, &w4, &s4, &i32s(&[0, 0, 0, 0]), DType::F32)
        .unwrap();
    assert_eq!(y.shape(), &[0, 8]);
    let (am, sm) = acts(&mut rng, &[3, 0], 32);
    let y = ops::mxfp4_grouped_masked(&am, &sm, &w4, &s4, &i32s(&[0, 0, 0]), DType::F32).unwrap();
    assert_eq!(y.shape(), &[3, 0, 8]);
    // Every expert empty: the masked output is left as it was.
    let (am, sm) = acts(&mut rng, &[3, 4], 32);
    let mut out = Tensor::filled_bytes(DType::BF16, &[3, 4, 8], 0xFF).unwrap();
    ops::mxfp4_grouped_masked_into(&am, &sm, &w4, &s4, &i32s(&[0, 0, 0]), &mut out).unwrap();
    assert!(out.as_slice::<bf16>().unwrap().iter().all(|v| v.is_nan()));
}

fn is_dtype(e: &Error, name: &str) -> bool {
    matches!(e, Error::DType { tensor, .. } if *tensor == name)
}

fn is_shape(e: &Error, name: &str) -> bool {
    matches!(e, Error::Shape { tensor, .. } if *tensor == name)
}

fn is_arg(e: &Error, name: &str, value_has: &str) -> bool {
    matches!(e, Error::Argument { arg, value, .. } if *arg == name && value.contains(value_has))
}

#[test]
fn mxfp8_linear_rejects_bad_inputs_with_typed_errors() {
    let mut rng = common::rng("mxfp8_linear_errors");
    let (m, n, k) = (4, 40, 96);
    let d = dense(&mut rng, m, n, k);
    let bf = t(vec![bf16::ZERO; m * k], &[m, k]);
    let run = |a: &Tensor, a_s: &Tensor, w: &Tensor, w_s: &Tensor| {
        ops::mxfp8_linear(a, a_s, w, w_s, DType::BF16).unwrap_err()
    };
    // Wrong dtypes, each named.
    let e = run(&bf, &d.a_s, &d.w, &d.w_s);
    assert!(is_dtype(&e, "a"), "{e}");
    let e = run(&d.a, &d.a, &d.w, &d.w_s);
    assert!(is_dtype(&e, "a_s"), "{e}");
    let e = run(&d.a, &d.a_s, &d.w_s, &d.w_s);
    assert!(is_dtype(&e, "w"), "{e}");
    let e = run(&d.a, &d.a_s, &d.w, &d.w);
    assert!(is_dtype(&e, "w_s"), "{e}");
    // Mismatched K, wrong ranks, wrong scale shapes.
    let other = dense(&mut rng, m, n, k + 32);
    let e = run(&d.a, &d.a_s, &other.w, &other.w_s);
    assert!(is_shape(&e, "w"), "{e}");
    assert!(e.to_string().contains("[40, 128]"), "names the shape: {e}");
    let flat = t(random_e4m3(&mut rng, m * k), &[m * k]);
    assert!(is_shape(&run(&flat, &d.a_s, &d.w, &d.w_s), "a"));
    let e = run(&d.a, &other.a_s, &d.w, &d.w_s);
    assert!(is_shape(&e, "a_s"), "{e}");
    let bad_ws = t(random_e8m0(&mut rng, n * 3, GEMM_SCALES), &[n, 3]);
    let e = run(&d.a, &d.a_s, &d.w, &bad_ws);
    assert!(is_shape(&e, "w_s"), "{e}");
    assert!(
        e.to_string().contains("[2, 3]"),
        "states the expected shape: {e}"
    );
    let k0 = dense(&mut rng, m, n, 0);
    assert!(is_shape(&run(&k0.a, &k0.a_s, &k0.w, &k0.w_s), "a"));
    // Output dtype and shape.
    for dt in [DType::I32, DType::F8E4M3, DType::E8M0] {
        let e = ops::mxfp8_linear(&d.a, &d.a_s, &d.w, &d.w_s, dt).unwrap_err();
        assert!(is_arg(&e, "out_dtype", &dt.to_string()), "{e}");
    }
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::I32, &[m, n]).unwrap();
    let e =
        ops::mxfp8_linear_into(&d.a, &d.a_s, &d.w, &d.w_s, &mut out, GemmImpl::Auto).unwrap_err();
    assert!(is_arg(&e, "out", "I32"), "{e}");
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::F32, &[m, n + 1]).unwrap();
    let e =
        ops::mxfp8_linear_into(&d.a, &d.a_s, &d.w, &d.w_s, &mut out, GemmImpl::Auto).unwrap_err();
    assert!(is_shape(&e, "out"), "{e}");
    // The skinny kernels take at most SKINNY_MAX_M rows.
    let big = dense(&mut rng, SKINNY_MAX_M + 1, 32, 32);
    let mut out =
        Tensor::empty(&deepinfer::Device::Cpu, DType::F32, &[SKINNY_MAX_M + 1, 32]).unwrap();
    for imp in [GemmImpl::Skinny, GemmImpl::SkinnyWholeK] {
        let e =
            ops::mxfp8_linear_into(&big.a, &big.a_s, &big.w, &big.w_s, &mut out, imp).unwrap_err();
        assert!(is_arg(&e, "imp", "M = 65"), "{e}");
    }
    ops::mxfp8_linear_into(
        &big.a,
        &big.a_s,
        &big.w,
        &big.w_s,
        &mut out,
        GemmImpl::Large,
    )
    .unwrap();
}

#[test]
fn grouped_contiguous_rejects_bad_inputs_with_typed_errors() {
    let mut rng = common::rng("grouped_contiguous_errors");
    let (e, rows, n, k) = (3, 10, 16, 64);
    let (a, a_s) = acts(&mut rng, &[rows], k);
    let (w, w_s) = experts(&mut rng, e, n, k);
    let good = i32s(&[0, 4, 4, 10]);
    let run = |a: &Tensor, a_s: &Tensor, w: &Tensor, w_s: &Tensor, o: &Tensor| {
        ops::mxfp4_grouped_contiguous(a, a_s, w, w_s, o, DType::BF16).unwrap_err()
    };
    ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &good, DType::BF16).unwrap();
    // Dtypes.
    let e8 = t(random_e4m3(&mut rng, e * n * k), &[e, n, k]);
    assert!(is_dtype(&run(&a, &a_s, &e8, &w_s, &good), "w"));
    assert!(is_dtype(&run(&a_s, &a_s, &w, &w_s, &good), "a"));
    assert!(is_dtype(
        &run(&a, &a_s, &w, &w_s, &t(vec![0i64; 4], &[4])),
        "offsets"
    ));
    // Odd K: FP4 packs two per byte.
    let (ao, so) = acts(&mut rng, &[rows], 33);
    let err = run(&ao, &so, &w, &w_s, &good);
    assert!(
        is_shape(&err, "a") && err.to_string().contains("even K"),
        "{err}"
    );
    // Mismatched K, scale shapes, offsets length.
    let (a2, s2) = acts(&mut rng, &[rows], k + 32);
    assert!(is_shape(&run(&a2, &s2, &w, &w_s, &good), "w"));
    let (_, ws_bad) = experts(&mut rng, e, n + 1, k);
    assert!(is_shape(&run(&a, &a_s, &w, &ws_bad, &good), "w_s"));
    let (_, as_bad) = acts(&mut rng, &[rows + 1], k);
    assert!(is_shape(&run(&a, &as_bad, &w, &w_s, &good), "a_s"));
    assert!(is_shape(
        &run(&a, &a_s, &w, &w_s, &i32s(&[0, 4, 10])),
        "offsets"
    ));
    // Offset values: first, monotone, last.
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[1, 4, 4, 10]));
    assert!(is_arg(&err, "offsets", "offsets[0] = 1"), "{err}");
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[0, 6, 3, 10]));
    assert!(is_arg(&err, "offsets", "offsets[2] = 3"), "{err}");
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[0, -2, 4, 10]));
    assert!(is_arg(&err, "offsets", "offsets[1] = -2"), "{err}");
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[0, 4, 4, 9]));
    assert!(is_arg(&err, "offsets", "offsets[3] = 9"), "{err}");
    // Output.
    let err = ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &good, DType::I64).unwrap_err();
    assert!(is_arg(&err, "out_dtype", "I64"), "{err}");
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::BF16, &[rows, n - 1]).unwrap();
    let err = ops::mxfp4_grouped_contiguous_into(&a, &a_s, &w, &w_s, &good, &mut out).unwrap_err();
    assert!(is_shape(&err, "out"), "{err}");
}

#[test]
fn grouped_masked_rejects_bad_inputs_with_typed_errors() {
    let mut rng = common::rng("grouped_masked_errors");
    let (e, max_m, n, k) = (3, 4, 16, 64);
    let (a, a_s) = acts(&mut rng, &[e, max_m], k);
    let (w, w_s) = experts(&mut rng, e, n, k);
    let good = i32s(&[0, 4, 2]);
    let run = |a: &Tensor, a_s: &Tensor, w: &Tensor, w_s: &Tensor, c: &Tensor| {
        ops::mxfp4_grouped_masked(a, a_s, w, w_s, c, DType::F32).unwrap_err()
    };
    ops::mxfp4_grouped_masked(&a, &a_s, &w, &w_s, &good, DType::F32).unwrap();
    // Counts beyond max_m or negative, wrong length or dtype.
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[0, 5, 2]));
    assert!(
        is_arg(&err, "counts", "counts[1] = 5 with max_m = 4"),
        "{err}"
    );
    let err = run(&a, &a_s, &w, &w_s, &i32s(&[0, 1, -1]));
    assert!(is_arg(&err, "counts", "counts[2] = -1"), "{err}");
    assert!(is_shape(&run(&a, &a_s, &w, &w_s, &i32s(&[0, 1])), "counts"));
    assert!(is_dtype(
        &run(&a, &a_s, &w, &w_s, &t(vec![0f32; 3], &[3])),
        "counts"
    ));
    // Rank, experts, K, scales.
    let (a2, s2) = acts(&mut rng, &[e * max_m], k);
    assert!(is_shape(&run(&a2, &s2, &w, &w_s, &good), "a"));
    let (a4, s4) = acts(&mut rng, &[e + 1, max_m], k);
    assert!(is_shape(&run(&a4, &s4, &w, &w_s, &good), "a"));
    let (ao, so) = acts(&mut rng, &[e, max_m], 31);
    assert!(is_shape(&run(&ao, &so, &w, &w_s, &good), "a"));
    let (ak, sk) = acts(&mut rng, &[e, max_m], k + 2);
    assert!(is_shape(&run(&ak, &sk, &w, &w_s, &good), "w"));
    let (_, as_bad) = acts(&mut rng, &[e, max_m + 1], k);
    assert!(is_shape(&run(&a, &as_bad, &w, &w_s, &good), "a_s"));
    assert!(is_dtype(&run(&a, &a_s, &w, &w, &good), "w_s"));
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::F32, &[e, max_m, n + 1]).unwrap();
    let err = ops::mxfp4_grouped_masked_into(&a, &a_s, &w, &w_s, &good, &mut out).unwrap_err();
    assert!(is_shape(&err, "out"), "{err}");
}

#[test]
fn bf16_linear_rejects_bad_inputs_with_typed_errors() {
    let a = t(vec![bf16::ONE; 4 * 8], &[4, 8]);
    let w = t(vec![bf16::ONE; 3 * 8], &[3, 8]);
    let e = ops::bf16_linear(&t(vec![1f32; 32], &[4, 8]), &w, DType::F32).unwrap_err();
    assert!(is_dtype(&e, "a"), "{e}");
    let e = ops::bf16_linear(&a, &t(vec![1f32; 24], &[3, 8]), DType::F32).unwrap_err();
    assert!(is_dtype(&e, "w"), "{e}");
    let e = ops::bf16_linear(&a, &t(vec![bf16::ONE; 27], &[3, 9]), DType::F32).unwrap_err();
    assert!(is_shape(&e, "w"), "{e}");
    let e = ops::bf16_linear(&a, &w, DType::F8E4M3).unwrap_err();
    assert!(is_arg(&e, "out_dtype", "F8"), "{e}");
    let mut out = Tensor::empty(&deepinfer::Device::Cpu, DType::BF16, &[3, 4]).unwrap();
    let e = ops::bf16_linear_into(&a, &w, &mut out).unwrap_err();
    assert!(is_shape(&e, "out"), "{e}");
}

/// `ops::mxfp8_dequantize` on the CPU: each value is e4m3 · 2^e computed in
/// f64 (exact) and rounded to BF16 through f32 (exact in f32 for these
/// scales, so one rounding), a NaN code gives the canonical NaN; malformed
/// operands are typed errors naming the tensor.
#[test]
fn mxfp8_dequantize_is_the_block_scaled_value_and_rejects_bad_operands() {
    let mut rng = common::rng("mxfp8_dequantize_cpu");
    let (n, k): (usize, usize) = (45, 70);
    let (nb, kb) = (n.div_ceil(32), k.div_ceil(32));
    let mut w: Vec<E4M3> = (0..n * k).map(|_| E4M3(rng.random())).collect();
    w[3] = E4M3(0x7F);
    let s = random_e8m0(&mut rng, nb * kb, -20..=20);
    let wt = Tensor::from_vec(w.clone(), &[n, k]).unwrap();
    let st = Tensor::from_vec(s.clone(), &[nb, kb]).unwrap();
    let got = ops::mxfp8_dequantize(&wt, &st).unwrap();
    assert_eq!((got.dtype(), got.shape()), (DType::BF16, &[n, k][..]));
    for (i, v) in got.as_slice::<bf16>().unwrap().iter().enumerate() {
        let (r, c) = (i / k, i % k);
        let x = e4m3_to_f32(w[i]) as f64 * e8m0_to_f32(s[(r / 32) * kb + c / 32]) as f64;
        let want = if x.is_nan() {
            bf16::NAN
        } else {
            bf16::from_f64(x)
        };
        assert_eq!(
            v.to_bits(),
            want.to_bits(),
            "element {i} (code {:#x})",
            w[i].0
        );
    }
    let e = ops::mxfp8_dequantize(&wt, &Tensor::from_vec(s[..kb].to_vec(), &[1, kb]).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::Shape { tensor: "w_s", .. }), "{e}");
    let e = ops::mxfp8_dequantize(&st, &st).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "w", .. }), "{e}");
    let e = Tensor::from_vec(vec![1.0f32; 4], &[4])
        .unwrap()
        .into_bytes()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Argument {
                op: "Tensor::into_bytes",
                ..
            }
        ),
        "{e}"
    );
    let bytes = wt.into_bytes().unwrap();
    assert_eq!(bytes.dtype(), DType::U8);
    assert_eq!(bytes.as_slice::<u8>().unwrap()[3], 0x7F);
}
