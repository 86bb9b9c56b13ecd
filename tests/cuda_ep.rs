//! Expert parallelism on the H200: `ops::gather_rows` and
//! `ops::copy_rows_into` (one launch each) are
//! bitwise the CPU's for every dtype, row widths with and without 16-byte
//! words, repeated and unsorted indices; route → dispatch → grouped FP4 GEMMs →
//! combine with every tensor on the GPU (allocations NaN-poisoned) equals
//! the single-rank MoE composed of the same GPU ops bitwise (the normal
//! mode the contiguous layout's, the low-latency mode the masked layout's:
//! the two GPU kernels sum in different orders), and the CPU's within
//! calc_diff 1e-5 (the GPU GEMMs' fp32 order moves a few percent of the
//! BF16 outputs by one ulp, about 3e-7 measured; an indexing error gives
//! ≥ 1e-2), through the local transport and a one-rank NCCL world, in both
//! modes and with both payloads; the NCCL all-to-all returns what was sent,
//! empty tensors included. (A world larger than the machine is
//! `tests/errors.rs`'s case, run here too.) Under DEEPINFER_QUICK (the
//! sanitizer passes) the NCCL worlds are skipped: libnccl's start-up probes
//! kernels it was not built with (cudaFuncGetAttributes → "no kernel
//! image"), which memcheck reports as API errors of the process.
//!
//! Built only for DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through
//! the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use common::ep::{Problem, bits, ep_rank, problem, single_rank, single_rank_in};
use deepinfer::device::CudaDevice;
use deepinfer::ep::{self, EpConfig, Local, Mode, Payload, Placement, Transport};
use deepinfer::numerics::calc_diff;
use deepinfer::{DType, Device, Error, Tensor, ops};
use rand::Rng;

fn gpu() -> Device {
    let dev = CudaDevice::new(0).expect("the CUDA tests need a GPU: run them from the GPU bundle");
    Device::Cuda(dev.with_poisoned_allocations())
}

/// `got` is bitwise the single-rank MoE of `mode` composed of the same GPU
/// ops on `gpu`, and within calc_diff 1e-5 of the CPU's single-rank MoE.
fn check(got: &[half::bf16], cpu: &Problem, gpu: &Problem, mode: Mode, what: &str) {
    assert_eq!(
        bits(got),
        bits(&single_rank_in(gpu, mode)),
        "{what} {mode:?}"
    );
    let f = |v: &[half::bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let d = calc_diff(&f(got), &f(&single_rank(cpu)));
    assert!(
        d <= 1e-5,
        "{what} {mode:?}: calc_diff {d:e} against the CPU"
    );
}

fn configs(n_experts: usize, top_k: usize, d: usize, tokens: usize) -> Vec<EpConfig> {
    let mut out = Vec::new();
    for payload in [Payload::Bf16, Payload::Fp8] {
        for mode in [Mode::Normal, Mode::low_latency(tokens.max(1), 1)] {
            let p = Placement::uniform(n_experts, 1).unwrap();
            out.push(EpConfig::new(p, top_k, d, payload, mode).unwrap());
        }
    }
    out
}

#[test]
fn the_local_transport_on_the_gpu_equals_the_gpu_single_rank_moe_bitwise() {
    let mut rng = common::rng("cuda_ep_local");
    let dev = gpu();
    // V4.1's routing (384 experts, top-6) at a small width, and a tail shape.
    for &(tokens, n_experts, top_k, d, inter) in &[
        (67, 384, 6, 256, 128),
        (5, 16, 3, 64, 96),
        (0, 8, 2, 64, 64),
    ] {
        let cpu = problem(&mut rng, tokens, n_experts, top_k, d, inter);
        let p = cpu.to_device(&dev);
        for cfg in configs(n_experts, top_k, d, tokens) {
            let (got, overflow) = ep_rank(&Local, &cfg, &p, (0, tokens)).unwrap();
            assert_eq!(overflow, 0);
            check(
                &got,
                &cpu,
                &p,
                cfg.mode(),
                &format!("{tokens} tokens, {:?}", cfg.payload()),
            );
        }
    }
}

#[test]
fn a_one_rank_nccl_world_moves_tensors_and_runs_the_same_moe() {
    let dev = gpu();
    let Device::Cuda(cuda) = &dev else {
        unreachable!()
    };
    let ordinal = cuda.ordinal();
    if common::quick() {
        println!(
            "skipped under DEEPINFER_QUICK: libnccl's start-up probes are API errors to memcheck"
        );
        return;
    }
    let mut rng = common::rng("cuda_ep_nccl");
    let cpu = problem(&mut rng, 41, 32, 4, 128, 64);
    let res = ep::nccl_world(&[ordinal], |rank| {
        // The all-to-all returns what it was sent: dtype, shape and bytes.
        let dev = Device::Cuda(rank.device().clone());
        for (dtype, shape) in [
            (DType::BF16, vec![3usize, 5]),
            (DType::I32, vec![0, 2]),
            (DType::E8M0, vec![7]),
        ] {
            let bytes: Vec<u8> = (0..dtype.storage_bytes(shape.iter().product()))
                .map(|i| (i * 7 + 3) as u8)
                .collect();
            let x = Tensor::from_le_bytes(&dev, dtype, &shape, &bytes)?;
            let back = rank.all_to_all_v(vec![x])?;
            assert_eq!(
                (back[0].dtype(), back[0].shape()),
                (dtype, shape.as_slice())
            );
            assert_eq!(back[0].to_le_bytes()?, bytes);
        }
        let p = cpu.to_device(&dev);
        let mut outs = Vec::new();
        for cfg in configs(32, 4, 128, 41) {
            outs.push((cfg.mode(), ep_rank(rank, &cfg, &p, (0, 41))?.0));
        }
        Ok(outs)
    });
    match res {
        Ok(ranks) => {
            let p = cpu.to_device(&dev);
            for (mode, out) in &ranks[0] {
                check(out, &cpu, &p, *mode, "one-rank NCCL world");
            }
        }
        // A GPU machine without libnccl on the library path: say so, typed.
        Err(Error::DeviceUnavailable { device, why }) if device == "nccl" => {
            println!("skipped: {why}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn gather_rows_is_bitwise_the_cpu_for_every_dtype_and_width() {
    let mut rng = common::rng("cuda_gather_rows");
    let dev = gpu();
    // (dtype, trailing shape): 16-byte rows and odd ones, FP4 of rank 3.
    let cases: &[(DType, &[usize])] = &[
        (DType::BF16, &[5120]),
        (DType::BF16, &[7]),
        (DType::F8E4M3, &[5120]),
        (DType::F8E4M3, &[33]),
        (DType::E8M0, &[160]),
        (DType::F32, &[3]),
        (DType::I32, &[2]),
        (DType::F4E2M1x2, &[6, 64]),
    ];
    for &(dtype, tail) in cases {
        let rows = rng.random_range(1..300usize);
        let shape: Vec<usize> = std::iter::once(rows).chain(tail.iter().copied()).collect();
        let n = dtype.storage_bytes(shape.iter().product());
        let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        let cpu = Tensor::from_le_bytes(&Device::Cpu, dtype, &shape, &bytes).unwrap();
        let x = Tensor::from_le_bytes(&dev, dtype, &shape, &bytes).unwrap();
        let runs: Vec<usize> = (3..rows.min(40)).chain(0..rows.min(5)).collect();
        let random: Vec<usize> = (0..rng.random_range(0..700))
            .map(|_| rng.random_range(0..rows))
            .collect();
        for idx in [runs, random, Vec::new(), vec![rows - 1; 9]] {
            let want = ops::gather_rows(&cpu, &idx).unwrap();
            let got = ops::gather_rows(&x, &idx).unwrap();
            assert!(matches!(got.device(), Device::Cuda(_)));
            assert_eq!(got.shape(), want.shape(), "{dtype} {shape:?}");
            assert_eq!(
                got.to_le_bytes().unwrap(),
                want.to_le_bytes().unwrap(),
                "{dtype} {shape:?} {} rows",
                idx.len()
            );
        }
        let e = ops::gather_rows(&x, &[0, rows]).unwrap_err();
        assert!(e.to_string().contains(&rows.to_string()), "{e}");
    }
}

/// Two or more GPUs: dispatch → grouped GEMMs → combine across an NCCL
/// world of every device equals the single-rank MoE of the same mode on
/// GPU 0 bitwise (and the CPU's within calc_diff), in both modes and with
/// both payloads (skipped, saying so, on one GPU or under DEEPINFER_QUICK).
#[test]
fn an_nccl_world_of_every_gpu_equals_the_gpu_single_rank_moe_bitwise() {
    let count = CudaDevice::count().unwrap();
    if common::quick() {
        println!(
            "skipped under DEEPINFER_QUICK: libnccl's start-up probes are API errors to memcheck"
        );
        return;
    }
    if count < 2 {
        println!("skipped: {count} GPU(s); the multi-rank NCCL run needs 2 or more");
        return;
    }
    let mut rng = common::rng("cuda_ep_nccl_world");
    let world = count.min(8);
    let (n_experts, top_k, d, inter, tokens) = (64, 6, 128, 64, 97);
    let cpu = problem(&mut rng, tokens, n_experts, top_k, d, inter);
    let p0 = cpu.to_device(&gpu());
    let shards = common::ep::shards(&mut rng, tokens, world);
    let max_tokens = shards.iter().map(|s| s.1).max().unwrap_or(1).max(1);
    let ordinals: Vec<usize> = (0..world).collect();
    for payload in [Payload::Bf16, Payload::Fp8] {
        for mode in [Mode::Normal, Mode::low_latency(max_tokens, world)] {
            let cfg = EpConfig::new(
                Placement::uniform(n_experts, world).unwrap(),
                top_k,
                d,
                payload,
                mode,
            )
            .unwrap();
            let per_rank = ep::nccl_world(&ordinals, |rank| {
                let p = cpu.to_device(&Device::Cuda(rank.device().clone()));
                ep_rank(rank, &cfg, &p, shards[rank.rank()])
            })
            .unwrap();
            let got: Vec<_> = per_rank.into_iter().flat_map(|r| r.0).collect();
            check(&got, &cpu, &p0, mode, &format!("{world} GPUs, {payload:?}"));
        }
    }
}

#[test]
fn copy_rows_into_is_bitwise_the_cpu_and_leaves_other_rows() {
    let mut rng = common::rng("cuda_copy_rows_into");
    let dev = gpu();
    for (dtype, width) in [
        (DType::BF16, 5120usize),
        (DType::BF16, 7),
        (DType::F8E4M3, 5120),
        (DType::E8M0, 160),
        (DType::F32, 3),
    ] {
        let n_src = rng.random_range(1..300usize);
        let (lead, cap) = (rng.random_range(1..9usize), rng.random_range(1..40usize));
        let bytes = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<u8> {
            (0..dtype.storage_bytes(n)).map(|_| rng.random()).collect()
        };
        let (sb, db) = (
            bytes(&mut rng, n_src * width),
            bytes(&mut rng, lead * cap * width),
        );
        let shape = [lead, cap, width];
        let src_cpu = Tensor::from_le_bytes(&Device::Cpu, dtype, &[n_src, width], &sb).unwrap();
        let mut want = Tensor::from_le_bytes(&Device::Cpu, dtype, &shape, &db).unwrap();
        let src = Tensor::from_le_bytes(&dev, dtype, &[n_src, width], &sb).unwrap();
        let mut got = Tensor::from_le_bytes(&dev, dtype, &shape, &db).unwrap();
        // Distinct destination rows, some of the buffer's, in random order.
        let mut dst: Vec<usize> = (0..lead * cap).collect();
        for i in (1..dst.len()).rev() {
            dst.swap(i, rng.random_range(0..=i));
        }
        dst.truncate(rng.random_range(0..=lead * cap));
        let from: Vec<usize> = dst.iter().map(|_| rng.random_range(0..n_src)).collect();
        ops::copy_rows_into(&mut want, &dst, &src_cpu, &from).unwrap();
        ops::copy_rows_into(&mut got, &dst, &src, &from).unwrap();
        assert_eq!(
            got.to_le_bytes().unwrap(),
            want.to_le_bytes().unwrap(),
            "{dtype} [{lead}, {cap}, {width}], {} rows",
            dst.len()
        );
        let e = ops::copy_rows_into(&mut got, &[0, 0], &src, &[0, 0]).unwrap_err();
        assert!(e.to_string().contains("dst_rows"), "{e}");
    }
}
