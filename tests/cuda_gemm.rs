//! The large-M block-scaled GEMMs of `kernels-cuda/gemm/` (sm_90a: TMA +
//! wgmma with per-32 promotion) against the CPU references of
//! `cpu_backend::gemm` on the same quantized inputs: `mxfp8_gemm` against
//! `fp8_gemm_f32` and `mxfp4_grouped_contiguous` against `fp4_gemm_f32` per
//! expert group,
//! for BF16 and F32 outputs.
//!
//! Threshold: `calc_diff` < 1e-3 (the bound for FP8 and FP4 GEMMs;
//! the kernels differ from the reference only in the fp32 summation order
//! inside a 32-deep block and in fusing the promotion multiply-add). Outputs
//! are NaN-poisoned (every valid element must be written and finite); inputs
//! are fresh random e4m3 values (no NaN codes), e2m1 nibbles and E8M0 scales
//! in 2^-10..2^4. Shapes cover real V4.1 projections, M/N/K tails and expert
//! groups that are empty (first, middle, last), single-row, or not a multiple
//! of the 128-row tile, and M (or an expert's rows) above 16 128-row blocks
//! (the banded tile order), K of 1 to 64 128-deep stages, odd and even (the
//! consumers take stages in pairs). The dense GEMM runs with whole tiles and
//! with the last wave's tiles split over K (`TileSplit::LastWave`, shapes
//! whose plan splits on 132 SMs: one wave and several, odd stage counts per
//! piece, M/N/K tails in a split tile; a rerun gives the same bits, whichever
//! piece finishes last), and with every tile in the skinny kernel's K split
//! (`TileSplit::Pieces` from `gemm_skinny::split_k`; plans that do not cover
//! K, or that chain, are typed errors). With `DensePlan::chain` (GemmImpl::LargeShared) it
//! runs again on scales made equal across a stage for a random half of the
//! (64-row group, stage) pairs and most (32-row weight block, stage) pairs,
//! so chained and per-32 stages mix inside a tile, against the same
//! reference and threshold. DEEPINFER_QUICK=1 (the sanitizer passes) keeps only
//! small shapes that still cover every tail, a split and the empty groups.
//! Built only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU.
#![cfg(deepinfer_cuda)]

mod common;

use common::{GEMM_SCALES, random_e4m3, random_e8m0, random_fp4};
use deepinfer::cpu_backend::{fp4_gemm_f32, fp8_gemm_f32};
use deepinfer::cuda_backend::gemm::{
    DensePlan, TileSplit, mxfp4_grouped_contiguous, mxfp8_gemm, split_plan,
};
use deepinfer::cuda_backend::gemm_skinny::split_k;
use deepinfer::device::CudaDevice;
use deepinfer::numerics::calc_diff;
use deepinfer::{DType, Device, E4M3, E8M0, Error, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// calc_diff bound for every comparison here.
const MAX_DIFF: f64 = 1e-3;

fn gpu() -> (CudaDevice, Device) {
    let dev = CudaDevice::new(0)
        .expect("the CUDA tests need a GPU: run them from the GPU bundle")
        .with_poisoned_allocations();
    (dev.clone(), Device::Cuda(dev))
}

fn quick() -> bool {
    std::env::var("DEEPINFER_QUICK").is_ok_and(|v| v == "1")
}

fn upload<T: deepinfer::dtype::Element>(dev: &Device, v: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
}

/// `f(rows r0..r1)` for chunks of rows on scoped threads, concatenated: the
/// CPU references are row-independent, so splitting M keeps their results.
fn by_rows(m: usize, n: usize, f: impl Fn(usize, usize) -> Vec<f32> + Sync) -> Vec<f32> {
    let chunk = m.div_ceil(16).max(16);
    let parts: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..m)
            .step_by(chunk)
            .map(|r0| {
                let f = &f;
                s.spawn(move || f(r0, (r0 + chunk).min(m)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let out: Vec<f32> = parts.concat();
    assert_eq!(out.len(), m * n);
    out
}

/// Downloads `out` (BF16 or F32, `[rows, n]`) as f64.
fn download(out: &Tensor) -> Vec<f64> {
    match out.dtype() {
        DType::BF16 => common::to_f64(&out.to_vec::<bf16>().unwrap()),
        DType::F32 => out
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        d => panic!("unexpected output dtype {d}"),
    }
}

/// The reference as the output dtype would hold it (BF16: rounded once).
fn expected(reference: &[f32], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::BF16 => reference
            .iter()
            .map(|&v| bf16::from_f32(v).to_f64())
            .collect(),
        _ => reference.iter().map(|&v| v as f64).collect(),
    }
}

fn check(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (not written?)", got[i]);
    }
    let d = calc_diff(got, want);
    assert!(d < MAX_DIFF, "{what}: calc_diff {d:e} >= {MAX_DIFF:e}");
}

const DENSE_SHAPES: &[(usize, usize, usize)] = &[
    // (M, N, K): V4.1 projections (wq_a, wkv, wo_b, wq_b) ...
    (128, 1280, 5120),
    (257, 1280, 5120),
    (128, 512, 5120),
    (257, 512, 5120),
    (128, 5120, 8192),
    (257, 5120, 8192),
    (128, 32768, 1280),
    // ... and tails of M, N and K (K = 16 and 48: a short last scale block).
    (65, 100, 80),
    (129, 33, 48),
    (200, 136, 1296),
    (65, 8, 16),
    (129, 136, 48),
    (200, 8, 80),
    // More than 16 m-blocks: version 2's banded tile order with a short last
    // band (M = 2100: 17 m-blocks).
    (2100, 300, 80),
    // A wave of whole tiles and a split last wave (153 tiles on 132 SMs: 21
    // tiles in 6 pieces of 3 or 4 stages of 20), M and N tails in the split tiles.
    (2100, 1100, 2560),
];

const DENSE_QUICK: &[(usize, usize, usize)] = &[
    (65, 100, 80),
    (129, 33, 48),
    (200, 136, 272),
    (65, 8, 16),
    // One wave, 6 tiles in 5 pieces (2 or 3 of 11 stages, the last one 16 deep).
    (130, 257, 1296),
    // A whole wave, then 8 tiles in 2 pieces (2 and 3 of 5 stages, the last
    // one 48 deep); the split tiles hold the M and N tails.
    (1700, 1250, 560),
];

/// The shapes above split as their comments say on the H200's 132 SMs.
#[test]
fn the_dense_split_shapes_split() {
    let plan = |m: usize, n: usize, k: usize| {
        split_plan(m.div_ceil(128) * n.div_ceil(128), k.div_ceil(128), 132)
    };
    assert_eq!(plan(130, 257, 1296), (0, 5));
    assert_eq!(plan(1700, 1250, 560), (132, 2));
    assert_eq!(plan(2100, 1100, 2560), (132, 6));
    assert_eq!(plan(128, 1280, 5120), (0, 8));
}

/// One dense shape through every plan of `plans`, BF16 and F32 out, against
/// the CPU reference on the same operands (`a` `[m, k]` with `a_s`, `b`
/// `[n, k]` with `b_s`); each run is repeated into a freshly poisoned output
/// and must give the same bits. Returns each plan's F32 output.
#[allow(
    clippy::too_many_arguments,
    reason = "one shape's operands and its plans"
)]
fn dense_case(
    cdev: &CudaDevice,
    dev: &Device,
    (m, n, k): (usize, usize, usize),
    a: &[E4M3],
    a_s: &[E8M0],
    b: &[E4M3],
    b_s: &[E8M0],
    plans: &[DensePlan],
) -> Vec<Vec<f64>> {
    let kb = k.div_ceil(32);
    let reference = by_rows(m, n, |r0, r1| {
        fp8_gemm_f32(
            &a[r0 * k..r1 * k],
            &a_s[r0 * kb..r1 * kb],
            b,
            b_s,
            r1 - r0,
            n,
            k,
        )
    });
    let ad = upload(dev, a.to_vec(), &[m, k]);
    let asd = upload(dev, a_s.to_vec(), &[m, kb]);
    let bd = upload(dev, b.to_vec(), &[n, k]);
    let bsd = upload(dev, b_s.to_vec(), &[n.div_ceil(32), kb]);
    let mut f32_out = Vec::new();
    for &plan in plans {
        for dtype in [DType::BF16, DType::F32] {
            let mut out = Tensor::empty(dev, dtype, &[m, n]).unwrap();
            mxfp8_gemm(cdev, &ad, &asd, &bd, &bsd, &mut out, plan).unwrap();
            let got = download(&out);
            let what = format!("mxfp8_gemm {m}x{n}x{k} {dtype} {plan:?}");
            check(&what, &got, &expected(&reference, dtype));
            // Into a freshly poisoned output: the same bits.
            let mut again = Tensor::empty(dev, dtype, &[m, n]).unwrap();
            mxfp8_gemm(cdev, &ad, &asd, &bd, &bsd, &mut again, plan).unwrap();
            let same = download(&again)
                .iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{what}: a rerun differs");
            if dtype == DType::F32 {
                f32_out.push(got);
            }
        }
    }
    f32_out
}

#[test]
fn mxfp8_gemm_matches_the_cpu_reference() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp8_gemm_cuda");
    let shapes = if quick() { DENSE_QUICK } else { DENSE_SHAPES };
    for &(m, n, k) in shapes {
        let (splits, stages_per_piece) = split_k(n, k);
        let plans = [
            TileSplit::Whole,
            TileSplit::LastWave,
            TileSplit::Pieces {
                splits,
                stages_per_piece,
            },
        ]
        .map(|split| DensePlan {
            split,
            chain: false,
        });
        let kb = k.div_ceil(32);
        let a = random_e4m3(&mut rng, m * k);
        let a_s = random_e8m0(&mut rng, m * kb, GEMM_SCALES);
        let b = random_e4m3(&mut rng, n * k);
        let b_s = random_e8m0(&mut rng, n.div_ceil(32) * kb, GEMM_SCALES);
        dense_case(&cdev, &dev, (m, n, k), &a, &a_s, &b, &b_s, &plans);
    }
}

/// A `Pieces` plan must be the pieces that cover K (⌈stages / per⌉ of
/// them, none empty) and must not chain: anything else is a typed error
/// before any launch, naming the plan.
#[test]
fn pieces_that_do_not_cover_k_are_typed_errors() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp8_gemm_pieces_error");
    let (m, n, k) = (130, 64, 1024); // 8 stages of 128
    let kb = k / 32;
    let a = upload(&dev, random_e4m3(&mut rng, m * k), &[m, k]);
    let a_s = upload(&dev, random_e8m0(&mut rng, m * kb, GEMM_SCALES), &[m, kb]);
    let b = upload(&dev, random_e4m3(&mut rng, n * k), &[n, k]);
    let b_s = upload(&dev, random_e8m0(&mut rng, 2 * kb, GEMM_SCALES), &[2, kb]);
    let bad = [
        (2, 1, false), // covers 2 of 8 stages
        (9, 1, false), // a piece past K
        (3, 4, false), // the third piece empty
        (0, 4, false), // no pieces
        (2, 0, false), // empty pieces
        (2, 4, true),  // chained
    ];
    for (splits, stages_per_piece, chain) in bad {
        let mut out = Tensor::empty(&dev, DType::BF16, &[m, n]).unwrap();
        let plan = DensePlan {
            split: TileSplit::Pieces {
                splits,
                stages_per_piece,
            },
            chain,
        };
        let e = mxfp8_gemm(&cdev, &a, &a_s, &b, &b_s, &mut out, plan).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    op: "mxfp8_gemm",
                    arg: "plan",
                    ..
                }
            ),
            "{splits} x {stages_per_piece} chain {chain}: {e}"
        );
    }
}

/// `scales` (`[rows, kb]` bytes) with the four blocks of a 128-deep stage
/// set to the stage's first byte, for each (group of `group` rows, stage)
/// with probability `p`: the stages a chained warpgroup (64 rows of A) or a
/// weight block (one row of 32 × 32 scales) may chain.
fn stage_uniform(
    rng: &mut StdRng,
    scales: &mut [E8M0],
    rows: usize,
    kb: usize,
    group: usize,
    p: f64,
) {
    for g in 0..rows.div_ceil(group) {
        for st in 0..kb.div_ceil(4) {
            if !rng.random_bool(p) {
                continue;
            }
            for r in g * group..((g + 1) * group).min(rows) {
                let first = scales[r * kb + 4 * st];
                for b in 4 * st..(4 * st + 4).min(kb) {
                    scales[r * kb + b] = first;
                }
            }
        }
    }
}

#[test]
fn mxfp8_gemm_chained_stages_match_the_cpu_reference() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp8_gemm_chain_cuda");
    let shapes = if quick() { DENSE_QUICK } else { DENSE_SHAPES };
    let plans = [false, true].map(|chain| DensePlan {
        split: TileSplit::LastWave,
        chain,
    });
    // Shapes where the chained kernel's bits differ from the per-32 one's:
    // proof that stages chained (a chained sum rounds differently).
    let mut differ = 0;
    for &(m, n, k) in shapes {
        let kb = k.div_ceil(32);
        let a = random_e4m3(&mut rng, m * k);
        let mut a_s = random_e8m0(&mut rng, m * kb, GEMM_SCALES);
        stage_uniform(&mut rng, &mut a_s, m, kb, 64, 0.5);
        let b = random_e4m3(&mut rng, n * k);
        let mut b_s = random_e8m0(&mut rng, n.div_ceil(32) * kb, GEMM_SCALES);
        stage_uniform(&mut rng, &mut b_s, n.div_ceil(32), kb, 1, 0.8);
        let out = dense_case(&cdev, &dev, (m, n, k), &a, &a_s, &b, &b_s, &plans);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        differ += usize::from(bits(&out[0]) != bits(&out[1]));
    }
    assert!(
        differ > 0,
        "no shape chained a stage: the chained kernel ran the per-32 path"
    );
}

#[test]
fn mxfp8_gemm_rejects_k_not_a_multiple_of_16() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp8_gemm_k_error");
    for k in [40usize, 8, 33] {
        let (m, n, kb) = (130, 64, k.div_ceil(32));
        let a = upload(&dev, random_e4m3(&mut rng, m * k), &[m, k]);
        let a_s = upload(&dev, random_e8m0(&mut rng, m * kb, GEMM_SCALES), &[m, kb]);
        let b = upload(&dev, random_e4m3(&mut rng, n * k), &[n, k]);
        let b_s = upload(
            &dev,
            random_e8m0(&mut rng, n.div_ceil(32) * kb, GEMM_SCALES),
            &[2, kb],
        );
        let mut out = Tensor::empty(&dev, DType::BF16, &[m, n]).unwrap();
        let plan = DensePlan {
            split: TileSplit::LastWave,
            chain: true,
        };
        let e = mxfp8_gemm(&cdev, &a, &a_s, &b, &b_s, &mut out, plan).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Shape {
                    op: "mxfp8_gemm",
                    tensor: "a",
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// Exclusive prefix sums of `counts`.
fn offsets_of(counts: &[usize]) -> Vec<i32> {
    let mut o = vec![0i32];
    for c in counts {
        o.push(o.last().unwrap() + *c as i32);
    }
    o
}

/// Rows of each expert group after the kernel's clamping: group e covers
/// [start_e, end_e) with end_{-1} = clamp(offsets[0], 0, T), start_e =
/// end_{e-1}, end_e = clamp(offsets[e+1], start_e, T).
fn group_ranges(offsets: &[i32], t: usize) -> Vec<(usize, usize)> {
    let mut end = offsets[0].clamp(0, t as i32) as usize;
    offsets[1..]
        .iter()
        .map(|&o| {
            let start = end;
            end = (o.max(start as i32)).min(t as i32) as usize;
            (start, end)
        })
        .collect()
}

struct GroupedCase {
    n: usize,
    k: usize,
    /// Rows per expert (offsets are their prefix sums), unless `offsets` is set.
    counts: Vec<usize>,
    /// Raw offsets handed to the kernel (to exercise the clamping).
    offsets: Option<Vec<i32>>,
}

fn grouped_cases() -> Vec<GroupedCase> {
    let case = |n, k, counts: &[usize]| GroupedCase {
        n,
        k,
        counts: counts.to_vec(),
        offsets: None,
    };
    let mut v = vec![
        // Empty experts first, in the middle and last; a single-row expert;
        // groups not a multiple of 128; N and K tails (K = 96: 3 scale blocks).
        case(100, 96, &[0, 1, 130, 0, 77, 0]),
        case(33, 160, &[5, 0, 0, 129, 1]),
        case(136, 1312, &[0, 200, 64, 3, 0]),
        case(8, 32, &[1, 1, 1, 0, 65]),
    ];
    v.push(GroupedCase {
        n: 72,
        k: 128,
        counts: vec![],
        // T = 300: clamps to [0, 3), [3, 3), [3, 200), [200, 300).
        offsets: Some(vec![-5, 3, 2, 200, 1000]),
    });
    if !quick() {
        // MoE shapes: w1/w3-like (N 4096 over K 4096) and w2-like (N 4096 over
        // K 2048 here), a few experts with realistic prefill group sizes.
        v.push(case(4096, 4096, &[0, 257, 128, 0, 1, 300]));
        v.push(case(4096, 2048, &[129, 0, 384, 64]));
        v.push(case(1280, 5120, &[200, 0, 57]));
        // An expert with more than 16 m-blocks (version 2's bands inside an
        // expert), between a small and an empty one.
        v.push(case(300, 64, &[5, 2100, 0]));
    }
    v
}

#[test]
fn mxfp4_grouped_contiguous_matches_the_cpu_reference_per_group() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp4_grouped_contiguous_cuda");
    for case in grouped_cases() {
        let (n, k) = (case.n, case.k);
        let offsets = case
            .offsets
            .clone()
            .unwrap_or_else(|| offsets_of(&case.counts));
        let e = offsets.len() - 1;
        let t = if case.offsets.is_some() {
            300
        } else {
            case.counts.iter().sum()
        };
        let kb = k.div_ceil(32);
        let a = random_e4m3(&mut rng, t * k);
        let a_s = random_e8m0(&mut rng, t * kb, GEMM_SCALES);
        let b = random_fp4(&mut rng, e * n * k / 2);
        let b_s = random_e8m0(&mut rng, e * n * kb, GEMM_SCALES);
        let ranges = group_ranges(&offsets, t);
        let ad = upload(&dev, a.clone(), &[t, k]);
        let asd = upload(&dev, a_s.clone(), &[t, kb]);
        let bd = upload(&dev, b.clone(), &[e, n, k]);
        let bsd = upload(&dev, b_s.clone(), &[e, n, kb]);
        let offd = upload(&dev, offsets.clone(), &[e + 1]);
        let references: Vec<Vec<f32>> = ranges
            .iter()
            .enumerate()
            .map(|(g, &(r0, r1))| {
                let (bw, bsw) = (
                    &b[g * n * k / 2..(g + 1) * n * k / 2],
                    &b_s[g * n * kb..(g + 1) * n * kb],
                );
                by_rows(r1 - r0, n, |s0, s1| {
                    fp4_gemm_f32(
                        &a[(r0 + s0) * k..(r0 + s1) * k],
                        &a_s[(r0 + s0) * kb..(r0 + s1) * kb],
                        bw,
                        bsw,
                        s1 - s0,
                        n,
                        k,
                    )
                })
            })
            .collect();
        for dtype in [DType::BF16, DType::F32] {
            let mut out = Tensor::empty(&dev, dtype, &[t, n]).unwrap();
            mxfp4_grouped_contiguous(&cdev, &ad, &asd, &bd, &bsd, &offd, &mut out).unwrap();
            let got = download(&out);
            for (g, (&(r0, r1), reference)) in ranges.iter().zip(&references).enumerate() {
                if r1 > r0 {
                    check(
                        &format!("mxfp4 grouped {offsets:?} N {n} K {k} {dtype} group {g}"),
                        &got[r0 * n..r1 * n],
                        &expected(reference, dtype),
                    );
                }
            }
        }
    }
}

#[test]
fn mxfp4_grouped_contiguous_rejects_k_not_a_multiple_of_32() {
    let (cdev, dev) = gpu();
    let mut rng = common::rng("mxfp4_grouped_k_error");
    for k in [48usize, 16, 80] {
        let (t, n, e, kb) = (70, 40, 3, k.div_ceil(32));
        let a = upload(&dev, random_e4m3(&mut rng, t * k), &[t, k]);
        let a_s = upload(&dev, random_e8m0(&mut rng, t * kb, GEMM_SCALES), &[t, kb]);
        let b = random_fp4(&mut rng, e * n * k / 2);
        let b = upload(&dev, b, &[e, n, k]);
        let b_s = upload(
            &dev,
            random_e8m0(&mut rng, e * n * kb, GEMM_SCALES),
            &[e, n, kb],
        );
        let offsets = upload(&dev, offsets_of(&[10, 0, 60]), &[e + 1]);
        let mut out = Tensor::empty(&dev, DType::F32, &[t, n]).unwrap();
        let err =
            mxfp4_grouped_contiguous(&cdev, &a, &a_s, &b, &b_s, &offsets, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Shape {
                    op: "mxfp4_grouped_contiguous",
                    tensor: "b",
                    ..
                }
            ),
            "{err}"
        );
    }
}
