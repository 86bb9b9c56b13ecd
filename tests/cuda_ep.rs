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
//! The one-rank low-latency path's ops (`ops::moe_masked_*`) are bitwise
//! their CPU reference (overflow, bad ids, tails, untouched rows); the
//! preallocated `ep::LowLatencyBuffer` equals the single-rank masked MoE
//! bitwise across reused calls and counts overflow exactly; and its
//! dispatch and combine are captured in a CUDA graph (no synchronisation,
//! no host copy) that replays new inputs bitwise as an eager call.
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

/// The one-rank normal mode checks its ids on the device (one kernel, no
/// copy of the ids to the host unless one is bad): an id past the experts
/// or negative, anywhere in the batch, is a typed error naming it, and
/// `ops::check_ids` passes every valid id.
#[test]
fn the_one_rank_normal_mode_checks_ids_on_the_device() {
    let mut rng = common::rng("cuda_ep_ids");
    let dev = gpu();
    let (tokens, n_experts, top_k, d) = (300, 16, 3, 64);
    let p = problem(&mut rng, tokens, n_experts, top_k, d, 64).to_device(&dev);
    let cfg = EpConfig::new(
        Placement::uniform(n_experts, 1).unwrap(),
        top_k,
        d,
        Payload::Fp8,
        Mode::Normal,
    )
    .unwrap();
    ops::check_ids("test", &p.ids, n_experts).unwrap();
    let host: Vec<i32> = p.ids.to_vec().unwrap();
    for (at, bad) in [(0usize, 16i32), (tokens * top_k - 1, -1), (457, i32::MAX)] {
        let mut ids = host.clone();
        ids[at] = bad;
        let ids = Tensor::from_vec(ids, &[tokens, top_k])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let e = ep::dispatch(&Local, &cfg, &p.x, &ids, &p.weights).unwrap_err();
        assert!(
            matches!(&e, Error::Argument { arg: "ids", value, .. } if *value == bad.to_string()),
            "{e}"
        );
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

/// `gather_row_blocks` on the GPU (one gather launch of whole blocks, one
/// copy of the partial last block) is bitwise the CPU's, for 16-byte and odd
/// rows; so is `gather_blocks` (its list on the device), with zero rows for
/// blocks outside x.
#[test]
fn gather_row_blocks_is_bitwise_the_cpu() {
    let mut rng = common::rng("cuda_gather_row_blocks");
    let dev = gpu();
    for &(dtype, width, block) in &[(DType::U8, 136usize, 256usize), (DType::BF16, 7, 3)] {
        let whole = rng.random_range(2..40usize);
        let rows = whole * block + rng.random_range(0..block);
        let n = dtype.storage_bytes(rows * width);
        let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        let cpu = Tensor::from_le_bytes(&Device::Cpu, dtype, &[rows, width], &bytes).unwrap();
        let x = Tensor::from_le_bytes(&dev, dtype, &[rows, width], &bytes).unwrap();
        let blocks: Vec<usize> = (0..rng.random_range(1..20))
            .map(|_| rng.random_range(0..whole))
            .collect();
        for n in [blocks.len() * block, blocks.len() * block - 1, 1] {
            let want = ops::gather_row_blocks(&cpu, block, &blocks, n).unwrap();
            let got = ops::gather_row_blocks(&x, block, &blocks, n).unwrap();
            assert!(matches!(got.device(), Device::Cuda(_)));
            assert_eq!(
                got.to_le_bytes().unwrap(),
                want.to_le_bytes().unwrap(),
                "{dtype} block {block} n {n}"
            );
        }
        // The device-list gather (`gather_blocks`): whole blocks, the same
        // rows as `gather_row_blocks`, and zero rows for a block outside x
        // (past its whole blocks, or negative), on both devices.
        let want = ops::gather_row_blocks(&cpu, block, &blocks, blocks.len() * block).unwrap();
        let mut list: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        let listed = |l: &[i32], d: &Device| {
            Tensor::from_vec(l.to_vec(), &[l.len()])
                .unwrap()
                .to_device(d)
                .unwrap()
        };
        for d in [&Device::Cpu, &dev] {
            let src = if matches!(d, Device::Cpu) { &cpu } else { &x };
            let got = ops::gather_blocks(src, block, &listed(&list, d)).unwrap();
            assert_eq!(
                got.to_le_bytes().unwrap(),
                want.to_le_bytes().unwrap(),
                "gather_blocks {dtype} block {block} on {d}"
            );
        }
        list.extend([whole as i32, -1]);
        let row_bytes = dtype.storage_bytes(width) * block;
        let mut padded = want.to_le_bytes().unwrap();
        padded.extend(std::iter::repeat_n(0u8, 2 * row_bytes));
        for d in [&Device::Cpu, &dev] {
            let src = if matches!(d, Device::Cpu) { &cpu } else { &x };
            let got = ops::gather_blocks(src, block, &listed(&list, d)).unwrap();
            assert_eq!(
                got.to_le_bytes().unwrap(),
                padded,
                "gather_blocks {dtype} block {block} on {d}, blocks outside x"
            );
        }
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

/// `copy_rows_where` on the device (lists uploaded as I32 tensors, −1 and
/// rows past either tensor skipped) is bitwise the CPU op; under
/// compute-sanitizer memcheck the void pairs show that nothing outside
/// either tensor is read or written.
#[test]
fn copy_rows_where_is_bitwise_the_cpu() {
    let mut rng = common::rng("cuda_copy_rows_where");
    let dev = gpu();
    for (dtype, width) in [
        (DType::BF16, 5120usize),
        (DType::F32, 3),
        (DType::F8E4M3, 160),
    ] {
        let n_src = rng.random_range(1..300usize);
        let n_dst = rng.random_range(1..200usize);
        let bytes = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<u8> {
            (0..dtype.storage_bytes(n)).map(|_| rng.random()).collect()
        };
        let (sb, db) = (
            bytes(&mut rng, n_src * width),
            bytes(&mut rng, n_dst * width),
        );
        let mut dst: Vec<i32> = (0..n_dst as i32).collect();
        for i in (1..dst.len()).rev() {
            dst.swap(i, rng.random_range(0..=i));
        }
        dst.truncate(rng.random_range(1..=n_dst));
        let void = [-1, i32::MIN, n_dst as i32, i32::MAX];
        let mut from: Vec<i32> = dst
            .iter()
            .map(|_| rng.random_range(0..n_src as i32))
            .collect();
        for i in 0..dst.len() {
            match rng.random_range(0..4) {
                0 => dst[i] = void[rng.random_range(0..4)],
                1 => from[i] = [-1, n_src as i32, i32::MAX][rng.random_range(0..3)],
                _ => {}
            }
        }
        let n = dst.len();
        let run = |d: &Device| {
            let src = Tensor::from_le_bytes(d, dtype, &[n_src, width], &sb).unwrap();
            let mut out = Tensor::from_le_bytes(d, dtype, &[n_dst, width], &db).unwrap();
            let dl = Tensor::from_vec(dst.clone(), &[n])
                .unwrap()
                .to_device(d)
                .unwrap();
            let fl = Tensor::from_vec(from.clone(), &[n])
                .unwrap()
                .to_device(d)
                .unwrap();
            ops::copy_rows_where(&mut out, &dl, &src, &fl).unwrap();
            out.to_le_bytes().unwrap()
        };
        assert_eq!(
            run(&dev),
            run(&Device::Cpu),
            "{dtype} [{n_dst}, {width}], {n} pairs"
        );
    }
}

/// Random routing of `tokens` tokens over `experts` with distinct ids per
/// token, a few of them out of range when `bad`.
fn random_ids(
    rng: &mut rand::rngs::StdRng,
    tokens: usize,
    experts: usize,
    k: usize,
    bad: bool,
) -> Vec<i32> {
    let mut ids = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut pick: Vec<i32> = Vec::new();
        while pick.len() < k {
            let e = rng.random_range(0..experts as i32);
            if !pick.contains(&e) {
                pick.push(e);
            }
        }
        pick.sort_unstable();
        ids.extend(pick);
    }
    if bad && ids.len() >= 4 {
        // Four distinct entries.
        let mut at: Vec<usize> = Vec::new();
        while at.len() < 4 {
            let j = rng.random_range(0..ids.len());
            if !at.contains(&j) {
                at.push(j);
            }
        }
        for (j, v) in at.into_iter().zip([-1, experts as i32, i32::MIN, i32::MAX]) {
            ids[j] = v;
        }
    }
    ids
}

/// The masked-layout ops on the GPU (outputs NaN-poisoned) are bitwise
/// their CPU reference: the layout (rows, counts, weights zeroed past the
/// counts, dropped per expert and for bad ids) with overflow, bad ids and a
/// `pos` buffer taller than the tokens; the scatter (BF16 with 16-byte and
/// odd row widths, FP8) on the placed rows, every other row left as it
/// was; the combine with dropped entries.
#[test]
fn the_masked_ops_are_bitwise_their_cpu_reference() {
    use deepinfer::dtype::{E4M3, E8M0};
    let mut rng = common::rng("cuda_masked_ops");
    let dev = gpu();
    // (tokens, experts, top_k, capacity, d, fp8, bad ids)
    for &(tokens, experts, k, cap, d, fp8, bad) in &[
        (67usize, 384usize, 6usize, 3usize, 256usize, true, true),
        (256, 384, 6, 256, 128, true, false),
        (5, 16, 3, 1, 64, false, true),
        (9, 8, 2, 4, 7, false, false),
        (1, 4, 4, 2, 40, false, false),
        (700, 4, 2, 300, 32, true, false),
        (0, 8, 2, 2, 64, true, false),
    ] {
        let what = format!("T {tokens} E {experts} k {k} C {cap} D {d} fp8 {fp8}");
        let ids = random_ids(&mut rng, tokens, experts, k, bad);
        let w: Vec<f32> = (0..tokens * k)
            .map(|_| rng.random_range(0.0..1.0))
            .collect();
        let m = tokens + 3;
        let on = |dev: &Device| {
            let ids = Tensor::from_vec(ids.clone(), &[tokens, k])
                .unwrap()
                .to_device(dev)
                .unwrap();
            let w = Tensor::from_vec(w.clone(), &[tokens, k])
                .unwrap()
                .to_device(dev)
                .unwrap();
            let mut pos = Tensor::empty(dev, DType::I32, &[m, k]).unwrap();
            let mut counts = Tensor::empty(dev, DType::I32, &[experts]).unwrap();
            let mut w_out = Tensor::empty(dev, DType::F32, &[experts, cap]).unwrap();
            let mut dropped = Tensor::empty(dev, DType::I32, &[experts + 1]).unwrap();
            ops::moe_masked_layout_into(&ids, &w, &mut pos, &mut counts, &mut w_out, &mut dropped)
                .unwrap();
            (pos, counts, w_out, dropped)
        };
        let (pc, cc, wc, dc) = on(&Device::Cpu);
        let (pg, cg, wg, dg) = on(&dev);
        let pos_c: Vec<i32> = pc.to_vec().unwrap();
        let pos_g: Vec<i32> = pg.to_vec().unwrap();
        assert_eq!(pos_g[..tokens * k], pos_c[..tokens * k], "{what}: pos");
        assert!(
            pos_g[tokens * k..].iter().all(|&p| p == -1),
            "{what}: rows past T of pos written"
        );
        assert_eq!(
            cg.to_vec::<i32>().unwrap(),
            cc.to_vec::<i32>().unwrap(),
            "{what}: counts"
        );
        assert_eq!(
            wg.to_le_bytes().unwrap(),
            wc.to_le_bytes().unwrap(),
            "{what}: w_out"
        );
        let dropped: Vec<i32> = dg.to_vec().unwrap();
        assert_eq!(dropped, dc.to_vec::<i32>().unwrap(), "{what}: dropped");
        assert_eq!(
            dropped[experts],
            if bad && tokens > 0 { 4 } else { 0 },
            "{what}"
        );
        // Scatter into a poisoned [E, C, D] (the CPU's filled with 0xFF too).
        let x = common::random_activations(&mut rng, tokens * d, 1.0);
        let xc = Tensor::from_vec(x, &[tokens, d]).unwrap();
        let xg = xc.to_device(&dev).unwrap();
        let placed: Vec<usize> = pos_c[..tokens * k]
            .iter()
            .filter_map(|&p| usize::try_from(p).ok())
            .collect();
        let ff = |dtype: DType, width: usize| {
            Tensor::filled_bytes(dtype, &[experts, cap, width], 0xFF).unwrap()
        };
        let (dtype, sw) = if fp8 {
            (DType::F8E4M3, d / 32)
        } else {
            (DType::BF16, 0)
        };
        let (mut oc, mut sc) = (ff(dtype, d), ff(DType::E8M0, sw));
        let (mut og, mut sg) = (
            ff(dtype, d).to_device(&dev).unwrap(),
            ff(DType::E8M0, sw).to_device(&dev).unwrap(),
        );
        ops::moe_masked_scatter_into(&xc, &pc, &mut oc, fp8.then_some(&mut sc)).unwrap();
        ops::moe_masked_scatter_into(&xg, &pg, &mut og, fp8.then_some(&mut sg)).unwrap();
        assert_eq!(
            og.to_le_bytes().unwrap(),
            oc.to_le_bytes().unwrap(),
            "{what}: rows"
        );
        assert_eq!(
            sg.to_le_bytes().unwrap(),
            sc.to_le_bytes().unwrap(),
            "{what}: scales"
        );
        if fp8 && tokens > 0 {
            // Placed rows are act_quant_fp8 of their token's row.
            let (q, s) = ops::act_quant_fp8(&xc).unwrap();
            let (q, s): (Vec<E4M3>, Vec<E8M0>) = (q.to_vec().unwrap(), s.to_vec().unwrap());
            let (got_q, got_s): (Vec<E4M3>, Vec<E8M0>) =
                (oc.to_vec().unwrap(), sc.to_vec().unwrap());
            for (j, &p) in pos_c[..tokens * k].iter().enumerate() {
                let Ok(p) = usize::try_from(p) else { continue };
                let t = j / k;
                assert_eq!(got_q[p * d..(p + 1) * d], q[t * d..(t + 1) * d], "{what}");
                assert_eq!(
                    got_s[p * sw..(p + 1) * sw],
                    s[t * sw..(t + 1) * sw],
                    "{what}"
                );
            }
        }
        let bytes = og.to_le_bytes().unwrap();
        let rb = bytes.len() / (experts * cap);
        for r in (0..experts * cap).filter(|r| !placed.contains(r)) {
            assert!(
                bytes[r * rb..(r + 1) * rb].iter().all(|&b| b == 0xFF),
                "{what}: row {r} written"
            );
        }
        // Combine over random expert rows (NaN-poisoned outputs).
        let rows = common::random_activations(&mut rng, experts * cap * d, 1.0);
        let shared = common::random_activations(&mut rng, tokens * d, 0.5);
        let rc = Tensor::from_vec(rows, &[experts, cap, d]).unwrap();
        let shc = Tensor::from_vec(shared, &[tokens, d]).unwrap();
        let mut yc = Tensor::empty(&Device::Cpu, DType::BF16, &[tokens, d]).unwrap();
        let mut yg = Tensor::empty(&dev, DType::BF16, &[tokens, d]).unwrap();
        ops::moe_masked_combine_into(&rc, &pc, &shc, &mut yc).unwrap();
        ops::moe_masked_combine_into(
            &rc.to_device(&dev).unwrap(),
            &pg,
            &shc.to_device(&dev).unwrap(),
            &mut yg,
        )
        .unwrap();
        assert_eq!(
            yg.to_le_bytes().unwrap(),
            yc.to_le_bytes().unwrap(),
            "{what}: combine"
        );
    }
}

/// The preallocated low-latency path on the GPU (buffers NaN-poisoned),
/// reused across token counts: bitwise the GPU single-rank masked MoE; with
/// a small capacity the overflow is counted exactly and the intact tokens
/// keep their single-rank outputs; bad ids are reported when the overflow
/// is read.
#[test]
fn the_low_latency_buffer_on_the_gpu_equals_the_single_rank_masked_moe() {
    use common::ep::masked_rank;
    use deepinfer::ep::LowLatencyBuffer;
    let mut rng = common::rng("cuda_ep_ll_buffer");
    let dev = gpu();
    let (n_experts, top_k, d, inter, max_tokens) = (384, 6, 256, 128, 80);
    for payload in [Payload::Bf16, Payload::Fp8] {
        let cfg = EpConfig::new(
            Placement::uniform(n_experts, 1).unwrap(),
            top_k,
            d,
            payload,
            Mode::low_latency(max_tokens, 1),
        )
        .unwrap();
        let mut buf = LowLatencyBuffer::new(&cfg, &dev).unwrap();
        for tokens in [67, 1, 80, 0, 13] {
            let cpu = problem(&mut rng, tokens, n_experts, top_k, d, inter);
            let p = cpu.to_device(&dev);
            let (got, overflow) = masked_rank(&mut buf, &cfg, &p).unwrap();
            assert_eq!(overflow, 0);
            check(
                &got,
                &cpu,
                &p,
                cfg.mode(),
                &format!("buffer, {tokens} tokens, {payload:?}"),
            );
        }
    }
    // Overflow: 16 experts of capacity 12 for 96 tokens of top-3 (above 8
    // rows, so the masked GEMM runs the same version as the reference's).
    let (n_experts, tokens, top_k, capacity) = (16, 96, 3, 12);
    let cpu = problem(&mut rng, tokens, n_experts, top_k, d, inter);
    let p = cpu.to_device(&dev);
    let cfg = EpConfig::new(
        Placement::uniform(n_experts, 1).unwrap(),
        top_k,
        d,
        Payload::Fp8,
        Mode::LowLatency {
            max_tokens: tokens,
            capacity,
        },
    )
    .unwrap();
    let mut buf = LowLatencyBuffer::new(&cfg, &dev).unwrap();
    let (got, overflow) = masked_rank(&mut buf, &cfg, &p).unwrap();
    let ids: Vec<i32> = cpu.ids.to_vec().unwrap();
    let mut seen = vec![0usize; n_experts];
    let mut intact = vec![true; tokens];
    let mut dropped = 0;
    for (j, &e) in ids.iter().enumerate() {
        if seen[e as usize] >= capacity {
            intact[j / top_k] = false;
            dropped += 1;
        }
        seen[e as usize] += 1;
    }
    assert!(
        dropped > 0 && intact.iter().any(|&i| i),
        "the case must overflow in part"
    );
    assert_eq!(overflow, dropped);
    // The masked GEMMs compute each row alone (and V1/V2, taken past 8 rows
    // an expert, are bitwise one another), so an intact token's rows equal
    // those of the single-rank masked MoE at a capacity holding all.
    let want = single_rank_in(&p, Mode::low_latency(tokens, 1));
    for tok in (0..tokens).filter(|&t| intact[t]) {
        assert_eq!(
            bits(&got[tok * d..(tok + 1) * d]),
            bits(&want[tok * d..(tok + 1) * d]),
            "token {tok}"
        );
    }
    let mut bad: Vec<i32> = ids.clone();
    bad[7] = n_experts as i32;
    let bad = Tensor::from_vec(bad, &[tokens, top_k])
        .unwrap()
        .to_device(&dev)
        .unwrap();
    buf.dispatch(&p.x, &bad, &p.weights).unwrap();
    let e = buf.overflow().unwrap_err().to_string();
    assert!(e.contains("ids") && e.contains("1 entries"), "{e}");
}

/// The low-latency dispatch and combine issue device work only: captured in
/// a CUDA graph (a capture fails on any synchronisation or copy to the
/// host), they allocate nothing (the graph replays into the buffers and
/// tensors captured), and a replay after new tokens, ids and weights are
/// copied into the captured input tensors gives bitwise what an eager call
/// on those inputs gives.
#[test]
fn the_low_latency_path_is_captured_in_a_cuda_graph_and_replays_new_inputs() {
    use deepinfer::ep::LowLatencyBuffer;
    let mut rng = common::rng("cuda_ep_ll_graph");
    // A handle of its own: no other test's work may join its capture.
    let Device::Cuda(cuda) = gpu() else {
        unreachable!()
    };
    let dev = Device::Cuda(cuda.clone());
    let (n_experts, top_k, d, tokens) = (384, 6, 512, 48);
    for payload in [Payload::Fp8, Payload::Bf16] {
        let cfg = EpConfig::new(
            Placement::uniform(n_experts, 1).unwrap(),
            top_k,
            d,
            payload,
            Mode::LowLatency {
                max_tokens: tokens,
                capacity: 2,
            },
        )
        .unwrap();
        let make = |rng: &mut rand::rngs::StdRng| problem(rng, tokens, n_experts, top_k, d, 64);
        let (first, second) = (make(&mut rng), make(&mut rng));
        let up = |t: &Tensor| t.to_device(&dev).unwrap();
        let (mut x, mut ids, mut w, mut shared) = (
            up(&first.x),
            up(&first.ids),
            up(&first.weights),
            up(&first.shared),
        );
        let rows = common::random_activations(&mut rng, n_experts * 2 * d, 1.0);
        let expert_out = up(&Tensor::from_vec(rows, &[n_experts, 2, d]).unwrap());
        let mut graphed = LowLatencyBuffer::new(&cfg, &dev).unwrap();
        let mut y = Tensor::empty(&dev, DType::BF16, &[tokens, d]).unwrap();
        // Warm-up (loads the kernels), then the capture.
        graphed.dispatch(&x, &ids, &w).unwrap();
        graphed.combine_into(&expert_out, &shared, &mut y).unwrap();
        // SAFETY: this test's handle has one stream, and every tensor the
        // capture touches lives until after the last launch.
        let graph = unsafe {
            cuda.capture(|| {
                graphed.dispatch(&x, &ids, &w)?;
                graphed.combine_into(&expert_out, &shared, &mut y)
            })
        }
        .unwrap();
        // New inputs, copied into the captured tensors, then a replay.
        x.copy_rows_from(0, &up(&second.x), 0, tokens).unwrap();
        ids.copy_rows_from(0, &up(&second.ids), 0, tokens).unwrap();
        w.copy_rows_from(0, &up(&second.weights), 0, tokens)
            .unwrap();
        shared
            .copy_rows_from(0, &up(&second.shared), 0, tokens)
            .unwrap();
        graph.launch().unwrap();
        let mut eager = LowLatencyBuffer::new(&cfg, &dev).unwrap();
        let mut want = Tensor::empty(&dev, DType::BF16, &[tokens, d]).unwrap();
        eager
            .dispatch(&up(&second.x), &up(&second.ids), &up(&second.weights))
            .unwrap();
        eager
            .combine_into(&expert_out, &up(&second.shared), &mut want)
            .unwrap();
        let what = format!("{payload:?}");
        assert_eq!(
            y.to_le_bytes().unwrap(),
            want.to_le_bytes().unwrap(),
            "{what}: combine"
        );
        assert_eq!(
            graphed.counts().to_vec::<i32>().unwrap(),
            eager.counts().to_vec::<i32>().unwrap(),
            "{what}"
        );
        assert_eq!(
            graphed.weights().to_le_bytes().unwrap(),
            eager.weights().to_le_bytes().unwrap(),
            "{what}"
        );
        assert_eq!(
            graphed.overflow().unwrap(),
            eager.overflow().unwrap(),
            "{what}"
        );
        assert!(
            eager.overflow().unwrap() > 0,
            "{what}: capacity 2 overflows"
        );
        let counts: Vec<i32> = eager.counts().to_vec().unwrap();
        let rb = eager.x().storage_bytes() / (n_experts * 2);
        let (gx, ex) = (
            graphed.x().to_le_bytes().unwrap(),
            eager.x().to_le_bytes().unwrap(),
        );
        for (e, &c) in counts.iter().enumerate() {
            let span = e * 2 * rb..(e * 2 + c as usize) * rb;
            assert_eq!(gx[span.clone()], ex[span], "{what}: expert {e}'s rows");
        }
        // A synchronisation inside a capture is refused, typed.
        // SAFETY: as above.
        let refused = unsafe { cuda.capture(|| graphed.overflow().map(|_| ())) };
        assert!(refused.is_err(), "{what}: a read-back was captured");
    }
}
