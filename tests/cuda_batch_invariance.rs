//! The batch-invariant mode on the H200 (`DEEPINFER_BATCH_INVARIANT=1`,
//! issue 12): a device handle from `with_batch_invariant_kernels` makes
//! every op compute a row independently of the row count.
//!
//! - The BF16 linears (one pinned cuBLASLt algorithm, no split-K reduction;
//!   the head's needs a workspace) and the grouped `wo_a`: rows of M = 1 …
//!   2048 (M tiles from 1 to 16 and more) bitwise the same rows of the
//!   largest M, at V4.1's BF16 shapes and tails; the
//!   pinned path within the CPU reference's `calc_diff` bounds of
//!   `cuda_blas.rs` (F32 out < 1e-5, BF16 out ≤ 1e-4). The default cuBLAS
//!   path is reported beside it (whether it differs across M), not asserted.
//! - The MXFP8 linear under `GemmImpl::Auto` (on such a device the skinny
//!   kernel with its K split from N and K for M ≤ 64, the large kernel cut
//!   into that split above): rows bitwise across M = 1 … 200, across the
//!   M ≤ 64 boundary where a plain device switches kernels; the control
//!   asserts that on a plain handle the rows at M = 64 and 200 do differ.
//! - The tiny model through the engine: the CPU test body of
//!   `batch_invariance.rs` (SGLang's three modes, 22 compositions; the
//!   single mode's six under DEEPINFER_QUICK) with every tensor on the GPU,
//!   allocations NaN-poisoned.
//! - A CUDA model on a plain handle with `batch_invariant` set is a typed
//!   error, not a silently variant engine.
#![cfg(deepinfer_cuda)]

mod common;

use common::invariance::compositions_match_solo_runs;
use deepinfer::cpu_backend;
use deepinfer::device::CudaDevice;
use deepinfer::engine::{Engine, EngineConfig};
use deepinfer::numerics::calc_diff;
use deepinfer::ops::{self, GemmImpl};
use deepinfer::{DType, Device, Tensor};
use half::bf16;

fn cuda() -> CudaDevice {
    CudaDevice::new(0)
        .expect("the CUDA tests need a GPU: run them from the GPU bundle")
        .with_poisoned_allocations()
}

/// Output bits of `t` (F32 or BF16) as u32s.
fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        _ => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v.into())
            .collect(),
        _ => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
    }
}

/// The BF16 linear (`groups` 1) or grouped linear of `x` `[m, G·K]` rows.
fn linear(x: &Tensor, w: &Tensor, groups: usize, out: DType) -> Tensor {
    if groups == 1 {
        ops::bf16_linear(x, w, out).unwrap()
    } else {
        ops::grouped_bf16_linear(x, w, groups).unwrap()
    }
}

/// (N, K, groups, output) of V4.1's BF16 linears (head, router,
/// compressor wkv, index wk, wo_a) and tails.
const BF16_LINEARS: &[(usize, usize, usize, DType)] = &[
    (129_280, 5120, 1, DType::F32),
    (384, 5120, 1, DType::F32),
    (512, 5120, 1, DType::F32),
    (128, 512, 1, DType::BF16),
    (1024, 4096, 8, DType::BF16),
    (100, 72, 1, DType::F32),
    (24, 40, 3, DType::BF16),
];

#[test]
fn pinned_bf16_linear_rows_do_not_depend_on_the_row_count() {
    let cuda = cuda();
    let (plain, pinned) = (
        Device::Cuda(cuda.clone()),
        Device::Cuda(cuda.with_batch_invariant_kernels()),
    );
    let mut rng = common::rng("cuda_bi_bf16");
    let ms: &[usize] = if common::quick() {
        &[1, 3, 65]
    } else {
        &[1, 3, 8, 64, 65, 129, 257, 300, 1024, 2048]
    };
    let big = *ms.last().unwrap();
    let mut report = Vec::new();
    let shapes = if common::quick() {
        &BF16_LINEARS[5..]
    } else {
        BF16_LINEARS
    };
    for &(n, k, g, out) in shapes {
        let x = common::random_activations(&mut rng, big * g * k, 2.0);
        let w = common::random_activations(&mut rng, g * n * k, 0.05);
        let wd = Tensor::from_vec(w.clone(), &[g * n, k])
            .unwrap()
            .to_device(&plain)
            .unwrap();
        let rows = |dev: &Device, m: usize| {
            let xd = Tensor::from_vec(x[..m * g * k].to_vec(), &[m, g * k])
                .unwrap()
                .to_device(dev)
                .unwrap();
            linear(&xd, &wd, g, out)
        };
        let full = rows(&pinned, big);
        let full_bits = bits(&full);
        assert!(
            values(&full).iter().all(|v| v.is_finite()),
            "{n}x{k}x{g}: output not fully written"
        );
        // The pinned algorithm is a correct GEMM: the CPU reference's bounds,
        // on the first `cpu_rows` rows (all of them below 10^10 products).
        let cpu_rows = if big * g * n * k > 10_000_000_000 {
            4
        } else {
            big
        };
        let want: Vec<f64> = (0..g)
            .map(|gi| {
                let xg: Vec<bf16> = x[..cpu_rows * g * k]
                    .chunks_exact(g * k)
                    .flat_map(|r| r[gi * k..(gi + 1) * k].iter().copied())
                    .collect();
                let wg = &w[gi * n * k..(gi + 1) * n * k];
                match out {
                    DType::F32 => cpu_backend::f32_gemm(&xg, wg, cpu_rows, n, k)
                        .into_iter()
                        .map(f64::from)
                        .collect::<Vec<_>>(),
                    _ => cpu_backend::bf16_gemm(&xg, wg, cpu_rows, n, k)
                        .into_iter()
                        .map(|v| v.to_f64())
                        .collect(),
                }
            })
            .fold(vec![Vec::new(); cpu_rows], |mut acc: Vec<Vec<f64>>, yg| {
                for (r, y) in yg.chunks_exact(n).enumerate() {
                    acc[r].extend_from_slice(y);
                }
                acc
            })
            .concat();
        let d = calc_diff(&values(&full)[..cpu_rows * g * n], &want);
        let bound = if out == DType::F32 { 1e-5 } else { 1e-4 };
        assert!(d < bound, "{n}x{k}x{g}: calc_diff {d:e} against the CPU");
        let mut default_varies = false;
        let plain_full = bits(&rows(&plain, big));
        for &m in &ms[..ms.len() - 1] {
            let got = bits(&rows(&pinned, m));
            assert_eq!(
                got,
                full_bits[..m * g * n],
                "{n}x{k}x{g}: the first {m} rows differ from the same rows at M = {big}"
            );
            default_varies |= bits(&rows(&plain, m)) != plain_full[..m * g * n];
        }
        report.push(format!(
            "{n}x{k}x{g} {out:?}: pinned rows bitwise invariant over M = {ms:?}, calc_diff {d:.2e} \
             against the CPU on {cpu_rows} rows; the default cuBLAS path {}",
            if default_varies {
                "varies with M"
            } else {
                "did not vary here"
            }
        ));
    }
    common::keep_report("cuda_batch_invariance.txt", &(report.join("\n") + "\n"));
}

#[test]
fn the_invariant_mxfp8_linear_sums_every_row_count_alike() {
    let cuda = cuda();
    let (plain, pinned) = (
        Device::Cuda(cuda.clone()),
        Device::Cuda(cuda.with_batch_invariant_kernels()),
    );
    let mut plain_differs = false;
    let mut rng = common::rng("cuda_bi_fp8");
    let ms: &[usize] = &[1, 8, 64, 65, 200];
    let big = 200;
    let shapes: &[(usize, usize)] = if common::quick() {
        &[(96, 64)]
    } else {
        &[(1280, 5120), (5120, 8192), (96, 64)]
    };
    for &(n, k) in shapes {
        let kb = k.div_ceil(32);
        // Weights on the plain handle: the mode comes from any operand's
        // handle, here the activations'.
        let up = |t: Tensor| t.to_device(&plain).unwrap();
        let a = common::random_e4m3(&mut rng, big * k);
        let a_s = common::random_e8m0(&mut rng, big * kb, -4..=4);
        let w = up(Tensor::from_vec(common::random_e4m3(&mut rng, n * k), &[n, k]).unwrap());
        let w_s = up(Tensor::from_vec(
            common::random_e8m0(&mut rng, n.div_ceil(32) * kb, -4..=4),
            &[n.div_ceil(32), kb],
        )
        .unwrap());
        // The activations on `dev` decide the handle (and so the mode).
        let run = |dev: &Device, m: usize| {
            let on = |t: Tensor| t.to_device(dev).unwrap();
            let ad = on(Tensor::from_vec(a[..m * k].to_vec(), &[m, k]).unwrap());
            let sd = on(Tensor::from_vec(a_s[..m * kb].to_vec(), &[m, kb]).unwrap());
            let mut out = Tensor::empty(dev, DType::BF16, &[m, n]).unwrap();
            ops::mxfp8_linear_into(&ad, &sd, &w, &w_s, &mut out, GemmImpl::Auto).unwrap();
            bits(&out)
        };
        let full = run(&pinned, big);
        for &m in &ms[..ms.len() - 1] {
            assert_eq!(
                run(&pinned, m),
                full[..m * n],
                "{n}x{k}: the first {m} rows differ from the same rows at M = {big}"
            );
        }
        // The control: on a plain handle Auto switches kernels at M = 64,
        // and at K = 5120 or more the two summation orders leave some
        // BF16 output apart (measured to calc_diff, not bitwise).
        if k >= 5120 {
            let plain_full = run(&plain, big);
            plain_differs |= run(&plain, 64) != plain_full[..64 * n];
        }
    }
    assert!(
        common::quick() || plain_differs,
        "the plain handle's Auto gave the same rows at M = 64 and 200: the test cannot tell the modes apart"
    );
}

#[test]
fn the_tiny_model_is_batch_invariant_on_the_gpu() {
    let dev = Device::Cuda(cuda().with_batch_invariant_kernels());
    let n = compositions_match_solo_runs("cuda_batch_invariance", &dev, common::quick());
    assert!(
        n >= if common::quick() { 6 } else { 20 },
        "{n} compositions"
    );
}

#[test]
fn an_invariant_engine_needs_an_invariant_device() {
    let dev = Device::Cuda(cuda());
    let model = common::tiny::tiny_model_on(7, &dev).0;
    let e = Engine::new(
        model,
        EngineConfig {
            batch_invariant: true,
            ..EngineConfig::default()
        },
    )
    .err()
    .expect("a plain CUDA handle with batch_invariant must be refused");
    assert!(e.to_string().contains("batch_invariant"), "{e}");
}
