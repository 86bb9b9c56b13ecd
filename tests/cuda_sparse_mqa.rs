//! The sparse MQA kernel against the CPU op (`ops::sparse_mqa` on the host,
//! itself bitwise the reference over the decoded rows): fresh random pools
//! and queries, outputs NaN-poisoned before the kernel runs, lists with −1,
//! duplicates and out-of-range numbers (i32::MAX, i32::MIN, Nw, Nc + 1000),
//! Kc = 0 (window-only layers), Kw = 0, Kw + Kc not a multiple of 64, an
//! all-empty query (zeros, lse +∞), T ∈ {1, 2, 6, 64, 257}, H 64 and 128,
//! the V4.1 shape (Kw 128, Kc 512) with rows scattered over large pools; a
//! query's result bitwise equal alone and inside batches (batch
//! invariance, V8, V9, V11, V12, V14 and the default on a batch-invariant
//! handle); versions 3 and 5 bitwise equal to each other, versions 12 and 14
//! bitwise version 9, and versions 8, 9, 11 and 12 within the bound below; the
//! generic kernel bitwise the CPU at other shapes (H 1-64, D 64-4096);
//! split-KV (spans of 64-256 entries, every tensor-core version, `Auto`)
//! within the same bounds and a fixed span batch-invariant; CUDA
//! shape limits as typed errors. DEEPINFER_QUICK=1
//! keeps to small shapes (the compute-sanitizer pass, where the out-of-range
//! entries show that nothing outside the pools is read). Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU.
//!
//! Tolerances. The kernel differs from the CPU only in the order of the fp32
//! sums (tensor-core dot products, P·V and the denominator) and in exp
//! (`ex2.approx` for the probabilities, relative error < 2^-21). Those move
//! an fp32 value by ~1e-6 relative, so a BF16 output (or a BF16-rounded
//! probability) lands on the other side of a rounding boundary with
//! probability ~1e-6 / 2^-8 ≈ 3e-4. calc_diff(out) must stay below 1e-6:
//! that is what one output in ~8 off by one BF16 ulp would give (one ulp is
//! 2^-8 to 2^-7 relative, calc_diff = Σ(x−y)² / Σ(x²+y²)), far above the
//! expected ~1e-8 and far below any indexing or masking error (≥ 1e-3).
//! lse: |Δ| ≤ 1e-4 (its fp32 error is ~1e-6 of l), +∞ exactly where the CPU's is.
//!
//! Split-KV changes one more thing: the probabilities are rounded to BF16
//! for P·V relative to the running maximum, which within a span starts from
//! the span's own maximum, not the list's. A probability then differs from
//! the CPU's by up to one BF16 rounding (2^-9 relative, ~1.6e-3 RMS between
//! two independent roundings), and an output that averages many random V
//! rows is small against them, so its relative error is of that order:
//! calc_diff ≈ (1.6e-3)² / 2 ≈ 1.3e-6 (measured 3.1e-6 on the H200 with
//! spans of 64, T 1, against the unsplit bound of 1e-6). SPLIT_OUT_LIMIT is
//! 2e-5: four BF16 roundings' worth (2^-8 relative) and still 50× below an
//! indexing or masking error (≥ 1e-3); lse keeps its bound (l sums the fp32
//! probabilities).
#![cfg(deepinfer_cuda)]

mod common;

use common::attention::{compressed_pool, index_lists, window_pool};
use deepinfer::device::CudaDevice;
use deepinfer::kv_format;
use deepinfer::numerics::calc_diff;
use deepinfer::ops::{SparseMqaKernel, SparseMqaSplit};
use deepinfer::{DType, Device, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

const D: usize = 512;
const OUT_LIMIT: f64 = 1e-6;
const SPLIT_OUT_LIMIT: f64 = 2e-5;
const LSE_TOL: f32 = 1e-4;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

fn quick() -> bool {
    std::env::var("DEEPINFER_QUICK").is_ok_and(|v| v == "1")
}

/// Host inputs of one call.
struct Inputs {
    q: Tensor,
    window: Tensor,
    widx: Tensor,
    compressed: Option<(Tensor, Tensor)>,
    sink: Tensor,
}

impl Inputs {
    fn random(
        rng: &mut StdRng,
        t: usize,
        h: usize,
        window: (usize, usize),
        comp: Option<(usize, usize)>,
        holes: f64,
    ) -> Inputs {
        Inputs::random_dim(rng, (t, h, D), window, comp, holes)
    }

    /// [`Inputs::random`] at head dimension `d`.
    fn random_dim(
        rng: &mut StdRng,
        (t, h, d): (usize, usize, usize),
        (nw, kw): (usize, usize),
        comp: Option<(usize, usize)>,
        holes: f64,
    ) -> Inputs {
        let q = common::random_activations(rng, t * h * d, 1.0);
        let window = window_pool(rng, nw, d, 1.0);
        let widx = index_lists(rng, t, kw, nw, holes);
        let compressed = comp.map(|(nc, kc)| {
            let rows = compressed_pool(rng, nc, d, 1.0);
            let idx = index_lists(rng, t, kc, nc, holes);
            (
                Tensor::from_vec(rows, &[nc, kv_format::compressed_row_bytes(d)]).unwrap(),
                Tensor::from_vec(idx, &[t, kc]).unwrap(),
            )
        });
        let sink: Vec<f32> = (0..h).map(|_| rng.random_range(-3.0..3.0)).collect();
        Inputs {
            q: Tensor::from_vec(q, &[t, h, d]).unwrap(),
            window: Tensor::from_vec(window, &[nw, kv_format::window_row_bytes(d)]).unwrap(),
            widx: Tensor::from_vec(widx, &[t, kw]).unwrap(),
            compressed,
            sink: Tensor::from_vec(sink, &[h]).unwrap(),
        }
    }

    fn to(&self, dev: &Device) -> Inputs {
        Inputs {
            q: self.q.to_device(dev).unwrap(),
            window: self.window.to_device(dev).unwrap(),
            widx: self.widx.to_device(dev).unwrap(),
            compressed: self
                .compressed
                .as_ref()
                .map(|(r, i)| (r.to_device(dev).unwrap(), i.to_device(dev).unwrap())),
            sink: self.sink.to_device(dev).unwrap(),
        }
    }

    /// (out, lse) of the default kernel on the inputs' device, on the host.
    fn run(&self) -> (Vec<bf16>, Vec<f32>) {
        let comp = self.compressed.as_ref().map(|(r, i)| (r, i));
        let (out, lse) =
            ops::sparse_mqa(&self.q, &self.window, &self.widx, comp, &self.sink).unwrap();
        (out.to_vec::<bf16>().unwrap(), lse.to_vec::<f32>().unwrap())
    }

    /// (out, lse) of one CUDA kernel version into fresh (poisoned) outputs.
    fn run_with(&self, dev: &Device, kernel: SparseMqaKernel) -> (Vec<bf16>, Vec<f32>) {
        self.run_split(dev, kernel, SparseMqaSplit::None)
    }

    /// [`Inputs::run_with`] with split-KV.
    fn run_split(
        &self,
        dev: &Device,
        kernel: SparseMqaKernel,
        split: SparseMqaSplit,
    ) -> (Vec<bf16>, Vec<f32>) {
        let comp = self.compressed.as_ref().map(|(r, i)| (r, i));
        let &[t, h, d] = self.q.shape() else {
            unreachable!("q is [T, H, D]")
        };
        let mut out = Tensor::empty(dev, DType::BF16, &[t, h, d]).unwrap();
        let mut lse = Tensor::empty(dev, DType::F32, &[t, h]).unwrap();
        ops::sparse_mqa_into_split(
            &self.q,
            &self.window,
            &self.widx,
            comp,
            &self.sink,
            &mut out,
            &mut lse,
            kernel,
            split,
        )
        .unwrap();
        (out.to_vec::<bf16>().unwrap(), lse.to_vec::<f32>().unwrap())
    }
}

fn compare(label: &str, got: &(Vec<bf16>, Vec<f32>), want: &(Vec<bf16>, Vec<f32>)) {
    compare_within(label, got, want, OUT_LIMIT);
}

/// [`compare`] with the output bound `limit`.
fn compare_within(
    label: &str,
    got: &(Vec<bf16>, Vec<f32>),
    want: &(Vec<bf16>, Vec<f32>),
    limit: f64,
) {
    assert_eq!(got.0.len(), want.0.len(), "{label}");
    assert!(
        got.0.iter().all(|v| v.is_finite()),
        "{label}: non-finite output"
    );
    let diff = calc_diff(&common::to_f64(&got.0), &common::to_f64(&want.0));
    eprintln!("{label}: calc_diff {diff:.3e}");
    assert!(diff <= limit, "{label}: calc_diff {diff:e} > {limit:e}");
    for (i, (g, w)) in got.1.iter().zip(&want.1).enumerate() {
        let ok = if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= LSE_TOL
        };
        assert!(ok, "{label}: lse[{i}] {g} vs {w}");
    }
}

/// (T, H, window (Nw, Kw), compressed (Nc, Kc), share of odd entries).
type Case = (usize, usize, (usize, usize), Option<(usize, usize)>, f64);

#[test]
fn sparse_mqa_matches_the_cpu_op() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda");
    let mut cases: Vec<Case> = vec![
        (1, 64, (300, 128), Some((2000, 512)), 0.05),
        (2, 64, (200, 128), None, 0.2),
        (6, 64, (50, 37), Some((90, 100)), 0.3),
        (3, 64, (10, 0), Some((70, 65)), 0.2),
        (2, 128, (64, 64), Some((64, 1)), 0.1),
        (1, 64, (5, 1), None, 0.0),
        (2, 64, (3, 70), Some((2, 70)), 0.5),
    ];
    if !quick() {
        cases.extend([
            (64, 64, (64 * 128, 128), Some((20_000, 512)), 0.02),
            (257, 64, (257 * 128, 128), Some((30_000, 512)), 0.02),
            (33, 64, (100, 129), Some((1000, 700)), 0.1),
        ]);
    }
    for (t, h, w, c, holes) in cases {
        let host = Inputs::random(&mut rng, t, h, w, c, holes);
        let label = format!("T {t} H {h} window {w:?} compressed {c:?} holes {holes}");
        let want = host.run();
        let gpu_inputs = host.to(&dev);
        let v3 = gpu_inputs.run_with(&dev, SparseMqaKernel::V3);
        compare(&format!("{label} V3"), &v3, &want);
        // Versions 8, 9, 11 and 12 (wgmma) sum the dot products in other orders:
        // within the bound against the CPU, not bitwise V3.
        for kernel in [
            SparseMqaKernel::V8,
            SparseMqaKernel::V9,
            SparseMqaKernel::V11,
            SparseMqaKernel::V12,
        ] {
            let got = gpu_inputs.run_with(&dev, kernel);
            compare(&format!("{label} {kernel:?}"), &got, &want);
        }
        let bits = |v: &(Vec<bf16>, Vec<f32>)| {
            let o: Vec<u16> = v.0.iter().map(|x| x.to_bits()).collect();
            let l: Vec<u32> = v.1.iter().map(|x| x.to_bits()).collect();
            (o, l)
        };
        // Version 5 decodes the rows exactly and shares version 3's
        // consumers, whose per-head arithmetic is the same in every CTA size,
        // so they agree bit for bit.
        for kernel in [SparseMqaKernel::V5Heads32, SparseMqaKernel::V5Heads16] {
            let got = gpu_inputs.run_with(&dev, kernel);
            assert!(
                bits(&got) == bits(&v3),
                "{label}: {kernel:?} differs from V3"
            );
        }
        // Auto runs version 14 (bitwise V9) or version 5 (bitwise V3), whichever the
        // query count favours at 64-head shapes, else the generic kernel.
        let auto = bits(&gpu_inputs.run_with(&dev, SparseMqaKernel::Auto));
        let v9 = bits(&gpu_inputs.run_with(&dev, SparseMqaKernel::V9));
        let generic = bits(&gpu_inputs.run_with(&dev, SparseMqaKernel::Generic));
        assert!(
            auto == v9 || auto == bits(&v3) || auto == generic,
            "{label}: Auto is none of the versions it picks from"
        );
        // Version 12 computes version 9's logits, P, rescale factors and P·V
        // shapes (one warpgroup's P·V takes P from shared memory instead of
        // registers), and zeros for missing rows: bit for bit version 9.
        let v12 = bits(&gpu_inputs.run_with(&dev, SparseMqaKernel::V12));
        assert!(v12 == v9, "{label}: V12 differs from V9");
        // Version 14 fills the same tiles (warpgroup 1 decodes 6 of every
        // 16 rows) for version 12's consumers: bit for bit.
        let v14 = bits(&gpu_inputs.run_with(&dev, SparseMqaKernel::V14));
        assert!(v14 == v9, "{label}: V14 differs from V9");
    }
}

/// ((T, H, D), window (Nw, Kw), compressed (Nc, Kc), share of odd entries).
type DimCase = (
    (usize, usize, usize),
    (usize, usize),
    Option<(usize, usize)>,
    f64,
);

/// The generic kernel (what `Auto` runs at every shape the tensor-core
/// versions do not take; also forced at the V4.1 shape) against the CPU op:
/// out bitwise (it keeps the CPU's sequential fp32 sums, no FMA, and the
/// same exp), lse within 4 ulps of max(|lse|, 16) (f64 log rounded once vs
/// the host's logf, then + m; |ln l| < 16 for these sinks and logits). The
/// tiny config's H 4, D 64; H 1 and 5; D 192 and 4096 (the largest); lists
/// with holes, duplicates and out-of-range entries, and Kw + Kc across
/// several 64-entry blocks.
#[test]
fn the_generic_kernel_is_bitwise_the_cpu_at_every_shape() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda_generic");
    let mut cases: Vec<DimCase> = vec![
        ((3, 4, 64), (8, 8), Some((20, 8)), 0.2),
        ((1, 1, 128), (5, 70), None, 0.3),
        ((5, 5, 192), (40, 33), Some((50, 100)), 0.2),
        ((2, 3, 4096), (4, 3), Some((4, 2)), 0.0),
        ((2, 64, 512), (300, 128), Some((2000, 150)), 0.05),
    ];
    if !quick() {
        cases.push(((40, 4, 64), (400, 8), Some((300, 136)), 0.1));
    }
    for ((t, h, d), w, c, holes) in cases {
        let host = Inputs::random_dim(&mut rng, (t, h, d), w, c, holes);
        let label = format!("T {t} H {h} D {d} window {w:?} compressed {c:?} holes {holes}");
        let want = host.run();
        let gpu_inputs = host.to(&dev);
        let mut kernels = vec![SparseMqaKernel::Generic];
        if d != D || !h.is_multiple_of(64) {
            kernels.push(SparseMqaKernel::Auto);
        }
        for kernel in kernels {
            let (out, lse) = gpu_inputs.run_with(&dev, kernel);
            let first = out
                .iter()
                .zip(&want.0)
                .position(|(g, w)| g.to_bits() != w.to_bits());
            assert!(
                first.is_none(),
                "{label} {kernel:?}: out[{}] GPU {} CPU {}",
                first.unwrap_or(0),
                out[first.unwrap_or(0)],
                want.0[first.unwrap_or(0)]
            );
            for (i, (g, w)) in lse.iter().zip(&want.1).enumerate() {
                let ok = if w.is_infinite() {
                    g == w
                } else {
                    (g - w).abs() <= 4.0 * f32::EPSILON * w.abs().max(16.0)
                };
                assert!(ok, "{label} {kernel:?}: lse[{i}] {g} vs {w}");
            }
        }
    }
}

#[test]
fn an_empty_list_gives_zeros_and_infinite_lse() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda_empty");
    let mut host = Inputs::random(&mut rng, 3, 64, (4, 70), Some((4, 30)), 0.0);
    // Query 1: −1 and out-of-range numbers only.
    let mut widx = host.widx.to_vec::<i32>().unwrap();
    let bad = [-1, 4, i32::MAX, i32::MIN, 1000];
    for (k, e) in widx[70..140].iter_mut().enumerate() {
        *e = bad[k % bad.len()];
    }
    host.widx = Tensor::from_vec(widx, &[3, 70]).unwrap();
    let (rows, cidx) = host.compressed.take().unwrap();
    let mut cidx = cidx.to_vec::<i32>().unwrap();
    for (k, e) in cidx[30..60].iter_mut().enumerate() {
        *e = bad[k % bad.len()];
    }
    host.compressed = Some((rows, Tensor::from_vec(cidx, &[3, 30]).unwrap()));
    let g = host.to(&dev);
    let want = host.run();
    for kernel in [
        SparseMqaKernel::Auto,
        SparseMqaKernel::V8,
        SparseMqaKernel::V9,
        SparseMqaKernel::V11,
        SparseMqaKernel::V12,
        SparseMqaKernel::V14,
    ] {
        for split in [SparseMqaSplit::None, SparseMqaSplit::Entries(64)] {
            let got = g.run_split(&dev, kernel, split);
            compare_within(
                &format!("empty query {kernel:?} {split:?}"),
                &got,
                &want,
                SPLIT_OUT_LIMIT,
            );
            let (out, lse) = got;
            assert!(out[64 * D..128 * D].iter().all(|v| v.to_bits() == 0));
            assert!(lse[64..128].iter().all(|&v| v == f32::INFINITY));
        }
    }
}

/// Split-KV against the CPU op, within SPLIT_OUT_LIMIT: spans of 64 to
/// 256 entries (tails: Kw + Kc not a multiple of the span; one span of a
/// query with no row, whose partial lse is −∞), every tensor-core version,
/// and `Auto` (a split at these query counts). A fixed span keeps a query's
/// result bitwise alone and inside a batch; on a batch-invariant handle
/// `Auto` does not split (bitwise version 9 unsplit). A span that is not a
/// positive multiple of 64 is a typed error.
#[test]
fn split_kv_matches_the_cpu_op_and_a_fixed_span_is_batch_invariant() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda_split");
    let mut cases: Vec<Case> = vec![
        (1, 64, (300, 128), Some((2000, 512)), 0.05),
        (6, 64, (50, 37), Some((90, 100)), 0.3),
        (2, 128, (64, 64), Some((64, 1)), 0.1),
        (3, 64, (10, 0), Some((70, 130)), 0.2),
    ];
    if !quick() {
        cases.push((16, 64, (16 * 128, 128), Some((20_000, 512)), 0.02));
    }
    for (t, h, w, c, holes) in cases {
        let mut host = Inputs::random(&mut rng, t, h, w, c, holes);
        // Query 0's first 64 window entries name no row: with a span of 64
        // its first split is empty.
        if w.1 >= 64 {
            let mut widx = host.widx.to_vec::<i32>().unwrap();
            widx[..64].fill(-1);
            host.widx = Tensor::from_vec(widx, &[t, w.1]).unwrap();
        }
        let label = format!("T {t} H {h} window {w:?} compressed {c:?} holes {holes}");
        let want = host.run();
        let g = host.to(&dev);
        for split in [64, 128, 192, 256].map(SparseMqaSplit::Entries) {
            for kernel in [
                SparseMqaKernel::V3,
                SparseMqaKernel::V5Heads16,
                SparseMqaKernel::V8,
                SparseMqaKernel::V9,
                SparseMqaKernel::V11,
                SparseMqaKernel::V12,
                SparseMqaKernel::V14,
            ] {
                let got = g.run_split(&dev, kernel, split);
                compare_within(
                    &format!("{label} {kernel:?} {split:?}"),
                    &got,
                    &want,
                    SPLIT_OUT_LIMIT,
                );
            }
        }
        let auto = g.run_split(&dev, SparseMqaKernel::Auto, SparseMqaSplit::Auto);
        compare_within(
            &format!("{label} Auto split"),
            &auto,
            &want,
            SPLIT_OUT_LIMIT,
        );
        let inv = dev.with_batch_invariant_kernels();
        let gi = host.to(&inv);
        let unsplit = gi.run_split(&inv, SparseMqaKernel::Auto, SparseMqaSplit::Auto);
        assert!(
            unsplit == g.run_with(&dev, SparseMqaKernel::V9),
            "{label}: Auto on a batch-invariant handle split or left version 9"
        );
    }
    let t = if quick() { 5 } else { 40 };
    let host = Inputs::random(&mut rng, t, 64, (500, 128), Some((3000, 512)), 0.1);
    let g = host.to(&dev);
    for kernel in [
        SparseMqaKernel::V3,
        SparseMqaKernel::V8,
        SparseMqaKernel::V9,
        SparseMqaKernel::V11,
        SparseMqaKernel::V12,
        SparseMqaKernel::V14,
    ] {
        let split = SparseMqaSplit::Entries(128);
        let batch = g.run_split(&dev, kernel, split);
        alone_equals_batch_split(&dev, &host, &batch, t, kernel, split);
    }
    for bad in [0, 100, 1 << 31] {
        let comp = g.compressed.as_ref().map(|(r, i)| (r, i));
        let mut out = Tensor::empty(&dev, DType::BF16, &[t, 64, D]).unwrap();
        let mut lse = Tensor::empty(&dev, DType::F32, &[t, 64]).unwrap();
        let e = ops::sparse_mqa_into_split(
            &g.q,
            &g.window,
            &g.widx,
            comp,
            &g.sink,
            &mut out,
            &mut lse,
            SparseMqaKernel::V3,
            SparseMqaSplit::Entries(bad),
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::Argument { arg: "split", .. }),
            "split {bad}: {e}"
        );
    }
}

#[test]
fn a_query_alone_equals_the_same_query_in_a_batch() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda_batch");
    let t = if quick() { 5 } else { 70 };
    let host = Inputs::random(&mut rng, t, 64, (500, 128), Some((3000, 512)), 0.1);
    let g = host.to(&dev);
    for kernel in [
        SparseMqaKernel::V8,
        SparseMqaKernel::V9,
        SparseMqaKernel::V11,
        SparseMqaKernel::V12,
        SparseMqaKernel::V14,
    ] {
        alone_equals_batch(&dev, &host, &g.run_with(&dev, kernel), t, kernel);
    }
    // Auto picks its version from the query count, so only a
    // batch-invariant handle (always version 14) promises this.
    let inv = dev.with_batch_invariant_kernels();
    let batch = host.to(&inv).run_with(&inv, SparseMqaKernel::Auto);
    alone_equals_batch(&inv, &host, &batch, t, SparseMqaKernel::Auto);
}

/// Queries 0, T/2 and T−1 of `host` run alone with `kernel` give bitwise
/// `batch`'s rows.
fn alone_equals_batch(
    dev: &Device,
    host: &Inputs,
    batch: &(Vec<bf16>, Vec<f32>),
    t: usize,
    kernel: SparseMqaKernel,
) {
    alone_equals_batch_split(dev, host, batch, t, kernel, SparseMqaSplit::None);
}

/// [`alone_equals_batch`] with split-KV.
fn alone_equals_batch_split(
    dev: &Device,
    host: &Inputs,
    batch: &(Vec<bf16>, Vec<f32>),
    t: usize,
    kernel: SparseMqaKernel,
    split: SparseMqaSplit,
) {
    let kw = 128;
    let kc = 512;
    let (widx, cidx) = (
        host.widx.to_vec::<i32>().unwrap(),
        host.compressed.as_ref().unwrap().1.to_vec::<i32>().unwrap(),
    );
    let q = host.q.to_vec::<bf16>().unwrap();
    for i in [0, t / 2, t - 1] {
        let alone = Inputs {
            q: Tensor::from_vec(q[i * 64 * D..(i + 1) * 64 * D].to_vec(), &[1, 64, D]).unwrap(),
            window: host.window.clone(),
            widx: Tensor::from_vec(widx[i * kw..(i + 1) * kw].to_vec(), &[1, kw]).unwrap(),
            compressed: Some((
                host.compressed.as_ref().unwrap().0.clone(),
                Tensor::from_vec(cidx[i * kc..(i + 1) * kc].to_vec(), &[1, kc]).unwrap(),
            )),
            sink: host.sink.clone(),
        };
        let (out, lse) = alone.to(dev).run_split(dev, kernel, split);
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&out),
            bits(&batch.0[i * 64 * D..(i + 1) * 64 * D]),
            "{kernel:?} query {i} out"
        );
        let fbits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            fbits(&lse),
            fbits(&batch.1[i * 64..(i + 1) * 64]),
            "{kernel:?} query {i} lse"
        );
    }
}

#[test]
fn cuda_shape_limits_are_typed_errors() {
    let dev = gpu();
    let mut rng = common::rng("sparse_mqa_cuda_errors");
    // A tensor-core version asked for a shape it does not take; the generic
    // kernel (and Auto) past D 4096 or H 65535.
    let cases = [
        (32, 512, SparseMqaKernel::V3),
        (64, 256, SparseMqaKernel::V5Heads16),
        (96, 512, SparseMqaKernel::V9),
        (1, 4160, SparseMqaKernel::Auto),
        (1, 4160, SparseMqaKernel::Generic),
        (65_536, 64, SparseMqaKernel::Auto),
    ];
    for (h, d, kernel) in cases {
        let q =
            Tensor::from_vec(common::random_activations(&mut rng, h * d, 1.0), &[1, h, d]).unwrap();
        let wb = kv_format::window_row_bytes(d);
        let w = Tensor::from_vec(vec![0u8; 2 * wb], &[2, wb]).unwrap();
        let wi = Tensor::from_vec(vec![0i32, 1], &[1, 2]).unwrap();
        let s = Tensor::from_vec(vec![0f32; h], &[h]).unwrap();
        let (q, w, wi, s) = (
            q.to_device(&dev).unwrap(),
            w.to_device(&dev).unwrap(),
            wi.to_device(&dev).unwrap(),
            s.to_device(&dev).unwrap(),
        );
        let mut out = Tensor::empty(&dev, DType::BF16, &[1, h, d]).unwrap();
        let mut lse = Tensor::empty(&dev, DType::F32, &[1, h]).unwrap();
        let e = ops::sparse_mqa_into_with(&q, &w, &wi, None, &s, &mut out, &mut lse, kernel)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Shape {
                    op: "sparse_mqa",
                    tensor: "q",
                    ..
                }
            ),
            "H {h} D {d} {kernel:?}: {e}"
        );
    }
    let host = Inputs::random(&mut rng, 1, 64, (4, 4), None, 0.0);
    let mut g = host.to(&dev);
    g.window = host.window.clone();
    let e = ops::sparse_mqa(&g.q, &g.window, &g.widx, None, &g.sink)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                tensor: "window",
                ..
            }
        ),
        "{e}"
    );
}
