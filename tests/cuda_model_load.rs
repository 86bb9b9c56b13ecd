//! Loading a checkpoint straight onto the GPU (`load_weights_on`): the tiny
//! model's every weight, read back from the device, is bitwise the CPU
//! load's (dtype, shape and bytes), and lives on the device. The stored
//! tensors are uploaded from the memory-mapped shards with no host tensor
//! between; wo_a is dequantised and the Engram rows joined on the device,
//! the stacked experts and mHC vectors are built on the host and moved. Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through the GPU bundle).
//! Random weights made on the GPU (`ops::random_param`, what
//! `random_weights_on` uses there) are bitwise the CPU generator's, for
//! every stored format and tail shapes, and so is the model built from them.
#![cfg(deepinfer_cuda)]

mod common;

use common::weights::{drafter_tensors, tensors};
use deepinfer::device::CudaDevice;
use deepinfer::model::dspark::DsparkWeights;
use deepinfer::model::forward::ModelWeights;
use deepinfer::model::load::{load_weights_on, modulo_token_map, random_weights_on};
use deepinfer::weight_rng::{Format, RandomParam};
use deepinfer::{Device, Tensor, ops};
use rand::Rng;

fn gpu() -> Device {
    Device::Cuda(CudaDevice::new(0).expect("the CUDA tests need a GPU"))
}

/// Every weight of `dev` (backbone, then drafter) lives on the GPU and is
/// bitwise the CPU's.
fn assert_same_weights(
    (cpu, cpu_ds): (ModelWeights, Option<DsparkWeights>),
    (dev, dev_ds): (ModelWeights, Option<DsparkWeights>),
) {
    let (cpu_ds, dev_ds) = (cpu_ds.unwrap(), dev_ds.unwrap());
    let mut want = tensors(&cpu);
    let mut got = tensors(&dev);
    assert!(want.len() > 40, "{} tensors", want.len());
    want.extend(drafter_tensors(&cpu_ds));
    got.extend(drafter_tensors(&dev_ds));
    assert_eq!(want.len(), got.len());
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert!(
            matches!(g.device(), Device::Cuda(_)),
            "{name} is not on the GPU"
        );
        assert_eq!((w.dtype(), w.shape()), (g.dtype(), g.shape()), "{name}");
        assert!(
            w.to_le_bytes().unwrap() == g.to_le_bytes().unwrap(),
            "{name} differs"
        );
    }
}

#[test]
fn weights_loaded_onto_the_gpu_equal_the_cpu_load_bitwise() {
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(11);
    let cpu = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &Device::Cpu).unwrap();
    let dev = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &gpu()).unwrap();
    assert_same_weights(cpu, dev);
}

#[test]
fn random_weights_made_on_the_gpu_equal_the_cpu_generator_bitwise() {
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny");
    let cfg = deepinfer::model::config::ModelConfig::from_dir(&tiny).unwrap();
    let seed = common::rng("gpu-random-weights").random();
    let cpu = random_weights_on(&cfg, seed, &Device::Cpu, true).unwrap();
    let dev = random_weights_on(&cfg, seed, &gpu(), true).unwrap();
    assert_same_weights(cpu, dev);
}

/// Each format at tail shapes (partial FP8 blocks and FP4 32-blocks, one
/// row, one column), spreads that saturate nothing and spreads under the
/// FP8 amax floor, fresh keys, into NaN-poisoned outputs.
#[test]
fn random_param_on_the_gpu_is_the_cpu_generators_bytes() {
    let poisoned = match gpu() {
        Device::Cuda(d) => Device::Cuda(d.with_poisoned_allocations()),
        Device::Cpu => unreachable!(),
    };
    let mut rng = common::rng("gpu-random-param");
    let shapes = [(1, 2), (7, 34), (33, 64), (129, 200), (300, 130)];
    let formats = [
        Format::F32,
        Format::Bf16,
        Format::Fp8Block([128, 128]),
        Format::Fp8Block([32, 32]),
        Format::Fp8Block([1, 7]),
        Format::Fp8Row,
        Format::Fp4,
    ];
    let mut cases = 0;
    for format in formats {
        for &(rows, cols) in &shapes {
            for (mean, std) in [(0.0, 1.0), (1.0, 0.05), (0.0, 3e-7), (-2.0, 40.0)] {
                let p = RandomParam {
                    key: rng.random(),
                    mean,
                    std,
                    rows,
                    cols,
                    format,
                };
                let want = ops::random_param(&Device::Cpu, &p).unwrap();
                let got = ops::random_param(&poisoned, &p).unwrap();
                assert_eq!(want.len(), got.len());
                for (w, g) in want.iter().zip(&got) {
                    assert!(matches!(g.device(), Device::Cuda(_)));
                    assert_eq!((w.dtype(), w.shape()), (g.dtype(), g.shape()), "{p:?}");
                    assert!(
                        w.to_le_bytes().unwrap() == g.to_le_bytes().unwrap(),
                        "{p:?}: {:?}",
                        first_difference(w, g)
                    );
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 140);
}

/// The first differing byte of two tensors and both values there.
fn first_difference(a: &Tensor, b: &Tensor) -> Option<(usize, u8, u8)> {
    let (a, b) = (a.to_le_bytes().unwrap(), b.to_le_bytes().unwrap());
    a.iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .map(|i| (i, a[i], b[i]))
}
