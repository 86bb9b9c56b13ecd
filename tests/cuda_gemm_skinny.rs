//! The skinny (decode) GEMMs of `cuda_backend::gemm_skinny` on the GPU, both
//! versions (V1 verified, V2 new) on every case, against the CPU references
//! on the same quantized inputs:
//! `mxfp8_gemm_skinny` against `cpu_backend::gemm::fp8_gemm_f32` (rounded to
//! BF16 for the BF16 output), `mxfp4_grouped_masked` against `fp4_gemm_f32`
//! per expert. Threshold: `calc_diff` < 1e-3 (the bound for FP8 and
//! FP4; only the fp32 summation order differs, so real values are far
//! smaller). Outputs are NaN-poisoned (0xFF) before each launch; every valid
//! element must be finite (written), and masked rows at or beyond an
//! expert's clamped count must still hold the poison bytes (not written).
//! Covered: M ∈ {1, 2, 7, 8, 9, 33, 47, 64} on the model's N×K, N tails (8, 33,
//! 100, 136) and K tails (16, 48, 80, 1296), split-K (bitwise repeatable),
//! empty experts, counts above max_m and below 0 (clamped), more than 128
//! experts, BF16 and F32 outputs, and the typed errors (K % 16 != 0, M > 64).
//! V1 and V2 must agree bitwise wherever they run the same token tile (dense
//! M ≤ 32; masked max_m ≤ 32): same tiles, same split-order sum; above that
//! (V2: 32-token tiles, V1: 64) they may differ only by the tensor-core
//! summation order (calc_diff < 1e-3 between them, besides each against the
//! CPU). The dense cases run back to back on one stream, so V2's cached
//! tickets are reused (and must come back zero) across launches of every
//! size. Inputs are fresh random codes every run (DEEPINFER_SEED replays one).
//! DEEPINFER_QUICK=1 (the sanitizer passes) keeps a short list of small
//! shapes that still covers the tails, split-K and empty experts.
//! Masked V3 (max_m ≤ 16, N % 16 == 0, K % 32 == 0: `v3_layout`, which
//! also picks 16- or 32-row units and f16 or e4m3 token staging) runs on
//! every case it takes, against the CPU (calc_diff < 1e-3) and against V1
//! (calc_diff < 1e-3: its K split over warps orders the block sums
//! differently), with odd K/32 (a half-used last block pair), 9..16 tokens
//! (the second token mma) and repeat runs bitwise equal; the other cases
//! must return its typed error. Masked V6 (N % 64 == 0, K % 256 == 0, any
//! max_m: past 16 tokens an expert's rows go in windows of 16, `v6_layout`)
//! is held to the same checks, with windows over more experts than its
//! threads rank at once. For both, an expert's rows keep their bits when
//! another expert's count changes (batch invariance); V6's first window
//! keeps its bits when the others are cut. V6 over the contiguous layout
//! (`mxfp4_grouped_contiguous_v6`) is held to the CPU and, row by row,
//! bitwise to the masked V6 (its own test's doc has the cases).
#![cfg(deepinfer_cuda)]

mod common;

use common::{GEMM_SCALES, random_e4m3, random_e8m0, random_fp4};
use deepinfer::cpu_backend::{fp4_gemm_f32, fp8_gemm_f32};
use deepinfer::cuda_backend::gemm_skinny::{
    SkinnyVersion, mxfp4_grouped_contiguous_v6, mxfp4_grouped_masked, mxfp4_grouped_masked_with,
    mxfp8_gemm_skinny, mxfp8_gemm_skinny_with, split_k, v3_layout, v6_layout,
};
use deepinfer::device::CudaDevice;
use deepinfer::numerics::calc_diff;
use deepinfer::{DType, Device, E4M3, E8M0, Error, Fp4x2, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// The issue's `calc_diff` bound for FP8 × FP8 and FP8 × FP4 GEMMs.
const MAX_DIFF: f64 = 1e-3;

fn quick() -> bool {
    std::env::var("DEEPINFER_QUICK").is_ok_and(|v| v == "1")
}

fn gpu() -> CudaDevice {
    CudaDevice::new(0)
        .expect("the CUDA tests need a GPU: run them from the GPU bundle")
        .with_poisoned_allocations()
}

fn host<T: deepinfer::dtype::Element>(v: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

/// The output as f64, with whether each element is the untouched poison
/// pattern (all bytes 0xFF).
fn download(out: &Tensor) -> (Vec<f64>, Vec<bool>) {
    let h = out.to_device(&Device::Cpu).unwrap();
    match h.dtype() {
        DType::F32 => h
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|v| (*v as f64, v.to_bits() == u32::MAX))
            .unzip(),
        DType::BF16 => h
            .as_slice::<bf16>()
            .unwrap()
            .iter()
            .map(|v| (v.to_f64(), v.to_bits() == u16::MAX))
            .unzip(),
        d => panic!("unexpected output dtype {d}"),
    }
}

/// The CPU result in the output's dtype (BF16: one rounding of the fp32
/// accumulator, which is what `fp8_gemm` / `fp4_gemm` return), as f64.
fn expected(f32s: &[f32], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::BF16 => f32s.iter().map(|&v| bf16::from_f32(v).to_f64()).collect(),
        _ => f32s.iter().map(|&v| v as f64).collect(),
    }
}

fn check(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (not written?)", got[i]);
    }
    let d = calc_diff(got, want);
    assert!(d < MAX_DIFF, "{what}: calc_diff {d:e} >= {MAX_DIFF:e}");
}

const DENSE_QUICK: &[(usize, usize, usize)] = &[
    (1, 100, 1296),
    (9, 33, 48),
    (33, 136, 80),
    (64, 8, 16),
    (7, 512, 640),
    (2, 65, 256),
    (47, 100, 1296),
];

fn dense_shapes() -> Vec<(usize, usize, usize)> {
    if quick() {
        return DENSE_QUICK.to_vec();
    }
    let ms = [1, 2, 7, 8, 9, 33, 47, 64];
    let mut v = Vec::new();
    for &m in &ms {
        v.push((m, 1280, 5120));
        v.push((m, 512, 5120));
    }
    v.push((1, 32768, 1280));
    v.push((8, 5120, 8192));
    for (i, &n) in [8, 33, 100, 136].iter().enumerate() {
        for (j, &k) in [16, 48, 80, 1296].iter().enumerate() {
            v.push((ms[(4 * i + j) % ms.len()], n, k));
        }
    }
    v
}

#[test]
fn mxfp8_gemm_skinny_matches_the_cpu_reference() {
    let dev = gpu();
    let device = Device::Cuda(dev.clone());
    let mut rng = common::rng("mxfp8_gemm_skinny");
    for (m, n, k) in dense_shapes() {
        let kb = k.div_ceil(32);
        let a = host(random_e4m3(&mut rng, m * k), &[m, k]);
        let a_s = host(random_e8m0(&mut rng, m * kb, GEMM_SCALES), &[m, kb]);
        let b = host(random_e4m3(&mut rng, n * k), &[n, k]);
        let b_s = host(
            random_e8m0(&mut rng, n.div_ceil(32) * kb, GEMM_SCALES),
            &[n.div_ceil(32), kb],
        );
        let want = fp8_gemm_f32(
            a.as_slice().unwrap(),
            a_s.as_slice().unwrap(),
            b.as_slice().unwrap(),
            b_s.as_slice().unwrap(),
            m,
            n,
            k,
        );
        let [a, a_s, b, b_s] = [&a, &a_s, &b, &b_s].map(|t| t.to_device(&device).unwrap());
        for dtype in [DType::BF16, DType::F32] {
            let mut results = Vec::new();
            for version in VERSIONS {
                let run = || {
                    let mut out = Tensor::empty(&device, dtype, &[m, n]).unwrap();
                    mxfp8_gemm_skinny_with(&dev, &a, &a_s, &b, &b_s, &mut out, version).unwrap();
                    out
                };
                let out = run();
                let (got, _) = download(&out);
                let what = format!(
                    "{version:?} m={m} n={n} k={k} {dtype} splits={:?}",
                    split_k(n, k)
                );
                check(&what, &got, &expected(&want, dtype));
                if split_k(n, k).0 > 1 {
                    assert_eq!(bits(&out), bits(&run()), "{what}: split-K not repeatable");
                }
                results.push((bits(&out), got));
            }
            compare_versions(&format!("m={m} n={n} k={k} {dtype}"), m <= 32, &results);
        }
    }
}

const VERSIONS: [SkinnyVersion; 2] = [SkinnyVersion::V1, SkinnyVersion::V2];

/// The output's raw bits (BF16 or F32).
fn bits(t: &Tensor) -> Vec<u32> {
    let h = t.to_device(&Device::Cpu).unwrap();
    match h.dtype() {
        DType::F32 => h
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DType::BF16 => h
            .as_slice::<bf16>()
            .unwrap()
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
        d => panic!("unexpected output dtype {d}"),
    }
}

/// V1 against V2 (`results` in [`VERSIONS`] order: bits and values of the
/// elements compared): bitwise where they run the same tiles, else within
/// the calc_diff bound of each other.
fn compare_versions(what: &str, same_tiles: bool, results: &[(Vec<u32>, Vec<f64>)]) {
    let [(b1, v1), (b2, v2)] = results else {
        panic!("{what}: expected two versions");
    };
    if same_tiles {
        assert!(b1 == b2, "{what}: V1 and V2 differ with the same tiles");
    } else {
        let d = calc_diff(v1, v2);
        assert!(
            d < MAX_DIFF,
            "{what}: V1 vs V2 calc_diff {d:e} >= {MAX_DIFF:e}"
        );
    }
}

/// One masked case: experts, max_m, N, K and the counts (any i32; the kernel
/// clamps them to [0, max_m]).
struct Masked {
    max_m: usize,
    n: usize,
    k: usize,
    counts: Vec<i32>,
}

/// Counts that start with the required cases (empty, 1, 7, full, above
/// max_m, negative) and continue at random, some of them empty.
fn counts(rng: &mut StdRng, e: usize, max_m: usize) -> Vec<i32> {
    let fixed = [0, 1, 7, max_m as i32, max_m as i32 + 9, -4];
    (0..e)
        .map(|i| match fixed.get(i) {
            Some(&c) => c,
            None if rng.random_range(0..3) == 0 => 0,
            None => rng.random_range(1..=max_m as i32),
        })
        .collect()
}

fn masked_cases(rng: &mut StdRng) -> Vec<Masked> {
    let mut case = |e: usize, max_m: usize, n: usize, k: usize| Masked {
        max_m,
        n,
        k,
        counts: counts(rng, e, max_m),
    };
    let mut v = vec![
        case(5, 8, 100, 80),
        case(6, 64, 33, 48),
        case(7, 8, 136, 1296),
        case(9, 16, 8, 16),
        // V3 tails: odd K/32 (3, 41), 16-token tiles, a single 16-row group,
        // 32-row units (N % 32 == 0, K <= 2560), f16 tokens (all of these)
        // and e4m3 tokens (16 tokens at K = 5120, where f16 does not fit).
        case(7, 16, 48, 96),
        case(5, 8, 32, 1312),
        case(6, 3, 16, 32),
        case(4, 16, 48, 5120),
        // Several units per CTA crossing experts: V3 with 4 K-block pairs
        // (fewer than its 16 warps: some warps have none) and 32-row units
        // of an odd K/32; V6 (N % 64 == 0, K % 256 == 0) with one 8-block
        // chunk, 16 tokens over a 16-block chunk and an 8-block tail, two
        // full chunks, and about 4 units per CTA.
        case(6, 8, 2304, 256),
        case(6, 8, 4096, 96),
        case(5, 16, 128, 768),
        case(7, 8, 192, 512),
        case(6, 4, 8192, 256),
        // V6 token windows (max_m > 16: up to 3 windows of 16 an expert).
        case(6, 40, 128, 512),
    ];
    // More than 128 experts (the kernel ranks them 128 at a time), mostly
    // empty as in decode.
    let mut many = case(200, 8, 64, 64);
    for (i, c) in many.counts.iter_mut().enumerate() {
        if i >= 6 && i % 37 != 5 {
            *c = 0;
        }
    }
    v.push(many);
    // V6 windows over more experts than its 544 threads rank at once,
    // mostly empty, a few past one window.
    let mut wide = case(700, 24, 64, 256);
    for (i, c) in wide.counts.iter_mut().enumerate() {
        if i % 97 != 3 && i != 699 {
            *c = 0;
        }
    }
    v.push(wide);
    if !quick() {
        v.push(case(8, 8, 2304, 5120));
        v.push(case(16, 64, 2304, 5120));
        v.push(case(5, 64, 5120, 2304));
        v.push(case(12, 32, 136, 1296));
        v.push(case(10, 16, 5120, 2304));
    }
    v
}

#[test]
fn mxfp4_grouped_masked_matches_the_cpu_reference() {
    let dev = gpu();
    let device = Device::Cuda(dev.clone());
    let mut rng = common::rng("mxfp4_grouped_masked");
    for case in masked_cases(&mut rng) {
        let Masked { max_m, n, k, .. } = case;
        let e = case.counts.len();
        let kb = k.div_ceil(32);
        let a = host(random_e4m3(&mut rng, e * max_m * k), &[e, max_m, k]);
        let a_s = host(
            random_e8m0(&mut rng, e * max_m * kb, GEMM_SCALES),
            &[e, max_m, kb],
        );
        let b = host(random_fp4(&mut rng, e * n * k / 2), &[e, n, k]);
        let b_s = host(random_e8m0(&mut rng, e * n * kb, GEMM_SCALES), &[e, n, kb]);
        let counts = host(case.counts.clone(), &[e]);
        let (ah, ash, bh, bsh) = (
            a.as_slice::<E4M3>().unwrap(),
            a_s.as_slice::<E8M0>().unwrap(),
            b.as_slice::<Fp4x2>().unwrap(),
            b_s.as_slice::<E8M0>().unwrap(),
        );
        let rows: Vec<usize> = case
            .counts
            .iter()
            .map(|&c| c.clamp(0, max_m as i32) as usize)
            .collect();
        let want: Vec<Vec<f32>> = (0..e)
            .map(|x| {
                let (ar, br) = (x * max_m, x * n);
                fp4_gemm_f32(
                    &ah[ar * k..(ar + rows[x]) * k],
                    &ash[ar * kb..(ar + rows[x]) * kb],
                    &bh[br * k / 2..(br + n) * k / 2],
                    &bsh[br * kb..(br + n) * kb],
                    rows[x],
                    n,
                    k,
                )
            })
            .collect();
        let [a, a_s, b, b_s, counts] =
            [&a, &a_s, &b, &b_s, &counts].map(|t| t.to_device(&device).unwrap());
        let takes = [
            (SkinnyVersion::V3, v3_layout(e, max_m, n, k).is_some()),
            (SkinnyVersion::V6, v6_layout(e, max_m, n, k).is_some()),
        ];
        let mut versions = VERSIONS.to_vec();
        versions.extend(takes.iter().filter(|t| t.1).map(|t| t.0));
        for dtype in [DType::BF16, DType::F32] {
            let mut results = Vec::new();
            for (version, _) in takes.iter().filter(|t| !t.1) {
                let mut out = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
                let err = mxfp4_grouped_masked_with(
                    &dev, &a, &a_s, &b, &b_s, &counts, &mut out, *version,
                )
                .unwrap_err();
                assert!(
                    matches!(err, Error::Shape { tensor: "b", .. }),
                    "{version:?}: {err}"
                );
            }
            for &version in &versions {
                let mut out = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
                mxfp4_grouped_masked_with(&dev, &a, &a_s, &b, &b_s, &counts, &mut out, version)
                    .unwrap();
                if matches!(version, SkinnyVersion::V3 | SkinnyVersion::V6) {
                    let mut again = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
                    mxfp4_grouped_masked_with(
                        &dev, &a, &a_s, &b, &b_s, &counts, &mut again, version,
                    )
                    .unwrap();
                    let rep = format!("{version:?} e={e} max_m={max_m} n={n} k={k} {dtype}");
                    assert!(bits(&out) == bits(&again), "{rep}: repeat differs");
                    // Batch invariance: without expert 1's tokens every unit
                    // after it moves to another CTA (and warp deal); the
                    // other experts' rows keep their bits.
                    let mut fewer = case.counts.clone();
                    fewer[1] = 0;
                    let fewer = host(fewer, &[e]).to_device(&device).unwrap();
                    let mut other = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
                    mxfp4_grouped_masked_with(
                        &dev, &a, &a_s, &b, &b_s, &fewer, &mut other, version,
                    )
                    .unwrap();
                    let (all, without) = (bits(&out), bits(&other));
                    for (x, &r) in rows.iter().enumerate().skip(2) {
                        let valid = x * max_m * n..(x * max_m + r) * n;
                        assert!(
                            all[valid.clone()] == without[valid],
                            "{rep}: expert {x} changes with expert 1's count"
                        );
                    }
                    // V6 windows: with every count cut to one window, the
                    // first window's rows keep their bits (a window's sums
                    // do not depend on the others).
                    if version == SkinnyVersion::V6 && max_m > 16 {
                        let one: Vec<i32> = case.counts.iter().map(|&c| c.min(16)).collect();
                        let one = host(one, &[e]).to_device(&device).unwrap();
                        let mut first = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
                        mxfp4_grouped_masked_with(
                            &dev, &a, &a_s, &b, &b_s, &one, &mut first, version,
                        )
                        .unwrap();
                        let first = bits(&first);
                        for (x, &r) in rows.iter().enumerate() {
                            let valid = x * max_m * n..(x * max_m + r.min(16)) * n;
                            assert!(
                                all[valid.clone()] == first[valid],
                                "{rep}: expert {x}'s first window changes with its others"
                            );
                        }
                    }
                }
                let (got, poison) = download(&out);
                let all_bits = bits(&out);
                let (mut vb, mut vv) = (Vec::new(), Vec::new());
                for x in 0..e {
                    let what = format!(
                        "{version:?} expert {x}/{e} count {} (clamped {}) max_m={max_m} n={n} \
                         k={k} {dtype}",
                        case.counts[x], rows[x]
                    );
                    let base = x * max_m * n;
                    let valid = base..base + rows[x] * n;
                    check(&what, &got[valid.clone()], &expected(&want[x], dtype));
                    let untouched = &poison[base + rows[x] * n..base + max_m * n];
                    assert!(
                        untouched.iter().all(|&p| p),
                        "{what}: a row at or beyond the count was written"
                    );
                    vb.extend_from_slice(&all_bits[valid.clone()]);
                    vv.extend_from_slice(&got[valid]);
                }
                results.push((vb, vv));
            }
            let what = format!("masked e={e} max_m={max_m} n={n} k={k} {dtype}");
            for (version, (_, vv)) in versions.iter().zip(&results).skip(2) {
                let d = calc_diff(&results[0].1, vv);
                assert!(d < MAX_DIFF, "{what}: V1 vs {version:?} calc_diff {d:e}");
            }
            results.truncate(2);
            compare_versions(&what, max_m <= 32, &results);
        }
    }
}

#[test]
fn skinny_kernel_limits_are_typed_errors() {
    let dev = gpu();
    let device = Device::Cuda(dev.clone());
    let zeros = |dtype: DType, shape: &[usize]| {
        Tensor::filled_bytes(dtype, shape, 0)
            .unwrap()
            .to_device(&device)
            .unwrap()
    };
    let n = 64;
    // The dense kernel on zero operands `[m, k]` (two K blocks of scales)
    // into an `[m, n]` output of `out_dtype`: the error it returns.
    let dense_err = |m: usize, k: usize, out_dtype: DType| {
        let mut out = Tensor::empty(&device, out_dtype, &[m, n]).unwrap();
        mxfp8_gemm_skinny(
            &dev,
            &zeros(DType::F8E4M3, &[m, k]),
            &zeros(DType::E8M0, &[m, 2]),
            &zeros(DType::F8E4M3, &[n, k]),
            &zeros(DType::E8M0, &[2, 2]),
            &mut out,
        )
        .unwrap_err()
    };
    // K % 16 != 0.
    let (m, k) = (4, 40);
    let err = dense_err(m, k, DType::BF16);
    assert!(matches!(err, Error::Shape { tensor: "a", .. }), "{err}");
    let err = mxfp4_grouped_masked(
        &dev,
        &zeros(DType::F8E4M3, &[2, m, k]),
        &zeros(DType::E8M0, &[2, m, 2]),
        &zeros(DType::F4E2M1x2, &[2, n, k]),
        &zeros(DType::E8M0, &[2, n, 2]),
        &zeros(DType::I32, &[2]),
        &mut Tensor::empty(&device, DType::F32, &[2, m, n]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Shape { tensor: "a", .. }), "{err}");
    // M > 64.
    let err = dense_err(65, 64, DType::F32);
    assert!(matches!(err, Error::Shape { tensor: "a", .. }), "{err}");
    // V3 and V6 are masked-only.
    for version in [SkinnyVersion::V3, SkinnyVersion::V6] {
        let mut out = Tensor::empty(&device, DType::F32, &[4, n]).unwrap();
        let err = mxfp8_gemm_skinny_with(
            &dev,
            &zeros(DType::F8E4M3, &[4, 64]),
            &zeros(DType::E8M0, &[4, 2]),
            &zeros(DType::F8E4M3, &[n, 64]),
            &zeros(DType::E8M0, &[2, 2]),
            &mut out,
            version,
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::Argument { arg: "version", .. }),
            "{version:?}: {err}"
        );
    }
}

/// Expert e's rows `[P_e, P_{e+1})` of a contiguous launch over `t` rows:
/// P_e the running maximum of clamp(offsets[j], 0, T) over j ≤ e (the
/// contiguous kernels' clamping), written out here from the definition.
fn clamped_groups(offsets: &[i32], t: usize) -> Vec<(usize, usize)> {
    let mut p = Vec::with_capacity(offsets.len());
    let mut run = 0usize;
    for &o in offsets {
        run = run.max(o.clamp(0, t as i32) as usize);
        p.push(run);
    }
    p.windows(2).map(|w| (w[0], w[1])).collect()
}

/// One contiguous V6 launch: `out` `[T, N]` of `dtype` (poisoned), as f64,
/// poison flags and bits.
#[allow(clippy::type_complexity)]
fn contiguous_v6(
    dev: &CudaDevice,
    [a, a_s, b, b_s]: [&Tensor; 4],
    offsets: &[i32],
    dtype: DType,
) -> (Vec<f64>, Vec<bool>, Vec<u32>) {
    let device = Device::Cuda(dev.clone());
    let (t, n) = (a.shape()[0], b.shape()[1]);
    let off = host(offsets.to_vec(), &[offsets.len()])
        .to_device(&device)
        .unwrap();
    let mut out = Tensor::empty(&device, dtype, &[t, n]).unwrap();
    mxfp4_grouped_contiguous_v6(dev, a, a_s, b, b_s, &off, &mut out).unwrap();
    let (got, poison) = download(&out);
    (got, poison, bits(&out))
}

/// V6 over the contiguous layout (`mxfp4_grouped_contiguous_v6`, what the
/// batch-invariant mode's routed experts run), on fresh random rows with
/// two rows before the first group and one after the last:
/// - each expert's rows against `fp4_gemm_f32` (calc_diff < 1e-3), the
///   rows outside every group untouched (poison), BF16 and F32;
/// - every row bitwise the masked V6's on the same row (the masked layout
///   with max_m the largest count: token tile 8 where every count is ≤ 8,
///   else windows of 16), so the two layouts are one kernel's sums;
/// - batch invariance: with expert 1's rows taken out of the batch (every
///   later expert's rows move to other CTAs and offsets) and with the first
///   row of the largest expert taken out (its other rows move to other
///   slots of their windows), every remaining row keeps its bits;
/// - offsets that are negative, past T or decreasing (a fixed pattern, a
///   drop from expert 543 to 544 where there are 700 experts, across the
///   544 threads' first round of the scan, then random ones) are clamped as
///   the contiguous kernel clamps them: the CPU and the masked V6 on the
///   groups recomputed here, bitwise, and nothing written outside them.
///
/// Cases: counts all ≤ 8; windows past 16 (17, 33, 40 rows), an empty
/// expert in each; 700 experts; and without DEEPINFER_QUICK the
/// shared-expert width w2 (N 5120 × K 2304) at decode counts. On a GPU
/// other than sm_90 the launch must return its typed error instead.
#[test]
fn mxfp4_grouped_contiguous_v6_gives_each_row_the_masked_v6_bits() {
    let dev = gpu();
    let device = Device::Cuda(dev.clone());
    let mut rng = common::rng("mxfp4_grouped_contiguous_v6");
    let mut cases: Vec<(Vec<usize>, usize, usize)> = vec![
        (vec![3, 6, 0, 8, 1, 5, 8], 128, 256),
        (vec![17, 9, 0, 1, 40, 16, 7, 33], 192, 512),
        (
            (0..700)
                .map(|i| if i % 9 == 4 || i == 1 { 1 + i % 5 } else { 0 })
                .collect(),
            64,
            256,
        ),
    ];
    if !quick() {
        cases.push((vec![1, 9, 0, 24, 2, 16], 5120, 2304));
    }
    for (counts, n, k) in cases {
        let e = counts.len();
        let kb = k.div_ceil(32);
        let (lead, tail) = (2usize, 1usize);
        let t = lead + counts.iter().sum::<usize>() + tail;
        let mut offsets = vec![lead as i32];
        for c in &counts {
            offsets.push(offsets.last().unwrap() + *c as i32);
        }
        let a = host(random_e4m3(&mut rng, t * k), &[t, k]);
        let a_s = host(random_e8m0(&mut rng, t * kb, GEMM_SCALES), &[t, kb]);
        let b = host(random_fp4(&mut rng, e * n * k / 2), &[e, n, k]);
        let b_s = host(random_e8m0(&mut rng, e * n * kb, GEMM_SCALES), &[e, n, kb]);
        let (ah, ash, bh, bsh) = (
            a.as_slice::<E4M3>().unwrap().to_vec(),
            a_s.as_slice::<E8M0>().unwrap().to_vec(),
            b.as_slice::<Fp4x2>().unwrap().to_vec(),
            b_s.as_slice::<E8M0>().unwrap().to_vec(),
        );
        // The CPU's rows of expert x over [r0, r1) of a.
        let want = |x: usize, (r0, r1): (usize, usize)| {
            fp4_gemm_f32(
                &ah[r0 * k..r1 * k],
                &ash[r0 * kb..r1 * kb],
                &bh[x * n * k / 2..(x + 1) * n * k / 2],
                &bsh[x * n * kb..(x + 1) * n * kb],
                r1 - r0,
                n,
                k,
            )
        };
        let [ad, asd, bd, bsd] = [&a, &a_s, &b, &b_s].map(|x| x.to_device(&device).unwrap());
        let what = format!("contiguous V6 e={e} n={n} k={k} counts {counts:?}");
        if dev.compute_capability().unwrap() != (9, 0) {
            let off = host(offsets.clone(), &[e + 1]).to_device(&device).unwrap();
            let mut out = Tensor::empty(&device, DType::BF16, &[t, n]).unwrap();
            let err = mxfp4_grouped_contiguous_v6(&dev, &ad, &asd, &bd, &bsd, &off, &mut out)
                .unwrap_err();
            assert!(matches!(err, Error::Unsupported { .. }), "{what}: {err}");
            return;
        }
        // The masked V6 on the same rows (each group's rows at the start of
        // its expert's slots): its bits per group.
        let masked_bits = |groups: &[(usize, usize)], dtype: DType| {
            let max_m = groups.iter().map(|g| g.1 - g.0).max().unwrap_or(0).max(1);
            let (mut am, mut asm) = (
                vec![E4M3(0); e * max_m * k],
                vec![E8M0(127); e * max_m * kb],
            );
            for (x, &(r0, r1)) in groups.iter().enumerate() {
                let d = x * max_m;
                am[d * k..(d + r1 - r0) * k].copy_from_slice(&ah[r0 * k..r1 * k]);
                asm[d * kb..(d + r1 - r0) * kb].copy_from_slice(&ash[r0 * kb..r1 * kb]);
            }
            let cnt: Vec<i32> = groups.iter().map(|g| (g.1 - g.0) as i32).collect();
            let [am, asm, cnt] = [
                host(am, &[e, max_m, k]),
                host(asm, &[e, max_m, kb]),
                host(cnt, &[e]),
            ]
            .map(|x| x.to_device(&device).unwrap());
            let mut out_m = Tensor::empty(&device, dtype, &[e, max_m, n]).unwrap();
            mxfp4_grouped_masked_with(
                &dev,
                &am,
                &asm,
                &bd,
                &bsd,
                &cnt,
                &mut out_m,
                SkinnyVersion::V6,
            )
            .unwrap();
            let all = bits(&out_m);
            groups
                .iter()
                .enumerate()
                .map(|(x, g)| all[x * max_m * n..(x * max_m + g.1 - g.0) * n].to_vec())
                .collect::<Vec<_>>()
        };
        // One launch on `offsets` against the CPU and the masked V6 on the
        // clamped groups, nothing written outside them; returns its bits.
        let full = |offsets: &[i32], dtype: DType, what: &str| {
            let groups = clamped_groups(offsets, t);
            let (got, poison, all) = contiguous_v6(&dev, [&ad, &asd, &bd, &bsd], offsets, dtype);
            let masked = masked_bits(&groups, dtype);
            for (x, &(r0, r1)) in groups.iter().enumerate() {
                let what = format!("{what} offsets {offsets:?} expert {x}");
                check(
                    &what,
                    &got[r0 * n..r1 * n],
                    &expected(&want(x, (r0, r1)), dtype),
                );
                assert!(
                    all[r0 * n..r1 * n] == masked[x],
                    "{what}: differs from the masked V6"
                );
            }
            let (p0, pe) = (groups[0].0, groups[e - 1].1);
            assert!(
                poison[..p0 * n].iter().chain(&poison[pe * n..]).all(|&p| p),
                "{what} offsets {offsets:?}: a row outside the groups was written"
            );
            all
        };
        // Rows `gone` out of the batch: the others' new offsets, and each
        // kept row's new index.
        let without = |gone: &[usize]| {
            let keep: Vec<usize> = (0..t).filter(|r| !gone.contains(r)).collect();
            let off: Vec<i32> = offsets
                .iter()
                .map(|&o| o - gone.iter().filter(|&&r| r < o as usize).count() as i32)
                .collect();
            let a2: Vec<E4M3> = keep
                .iter()
                .flat_map(|&r| ah[r * k..(r + 1) * k].to_vec())
                .collect();
            let as2: Vec<E8M0> = keep
                .iter()
                .flat_map(|&r| ash[r * kb..(r + 1) * kb].to_vec())
                .collect();
            (keep, off, a2, as2)
        };
        let groups = clamped_groups(&offsets, t);
        let largest = (0..e).max_by_key(|&x| counts[x]).unwrap();
        for dtype in [DType::BF16, DType::F32] {
            let what = format!("{what} {dtype}");
            let all = full(&offsets, dtype, &what);
            let (_, _, again) = contiguous_v6(&dev, [&ad, &asd, &bd, &bsd], &offsets, dtype);
            assert!(all == again, "{what}: repeat differs");
            let drops: [(&str, Vec<usize>); 2] = [
                ("expert 1's rows", (groups[1].0..groups[1].1).collect()),
                ("the largest expert's first row", vec![groups[largest].0]),
            ];
            for (name, gone) in drops {
                assert!(
                    !gone.is_empty(),
                    "{what}: {name} is empty: the check would be vacuous"
                );
                let (keep, off, a2, as2) = without(&gone);
                let [a2, as2] = [host(a2, &[keep.len(), k]), host(as2, &[keep.len(), kb])]
                    .map(|x| x.to_device(&device).unwrap());
                let (_, _, fewer) = contiguous_v6(&dev, [&a2, &as2, &bd, &bsd], &off, dtype);
                for (new, &old) in keep.iter().enumerate() {
                    if old < lead || old >= t - tail {
                        continue;
                    }
                    assert!(
                        all[old * n..(old + 1) * n] == fewer[new * n..(new + 1) * n],
                        "{what}: row {old} changes when {name} leave the batch"
                    );
                }
            }
        }

        // Garbage offsets (negative, past T, decreasing): a fixed pattern,
        // a drop across the scan's first round of 544 experts, random ones.
        let mut bads: Vec<Vec<i32>> = vec![
            (0..=e)
                .map(|j| match j % 4 {
                    0 => -3,
                    1 => offsets[j] + 2,
                    2 => t as i32 + 5,
                    _ => offsets[j] - 1,
                })
                .collect(),
        ];
        if e > 544 {
            let mut drop = offsets.clone();
            drop[544] = drop[543] - 3;
            bads.push(drop);
        }
        bads.push(
            (0..=e)
                .map(|_| rng.random_range(-3..=t as i32 + 3))
                .collect(),
        );
        for bad in bads {
            full(&bad, DType::F32, &what);
        }
    }
}
