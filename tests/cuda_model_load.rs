//! Loading a checkpoint straight onto the GPU (`load_weights_on`): the tiny
//! model's every weight, read back from the device, is bitwise the CPU
//! load's (dtype, shape and bytes), and lives on the device. The stored
//! tensors are uploaded from the memory-mapped shards with no host tensor
//! between; the converted ones (wo_a, stacked experts, Engram rows, mHC
//! vectors) are built on the host and moved. Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use common::weights::{drafter_tensors, tensors};
use deepinfer::Device;
use deepinfer::device::CudaDevice;
use deepinfer::model::load::{load_weights_on, modulo_token_map};

#[test]
fn weights_loaded_onto_the_gpu_equal_the_cpu_load_bitwise() {
    let gpu = Device::Cuda(CudaDevice::new(0).expect("the CUDA tests need a GPU"));
    let (cfg, _dir, ck) = common::tiny::tiny_checkpoint(11);
    let (cpu, cpu_ds) = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &Device::Cpu).unwrap();
    let (dev, dev_ds) = load_weights_on(&ck, &cfg, modulo_token_map(&cfg), &gpu).unwrap();
    let (want, got) = (tensors(&cpu), tensors(&dev));
    assert_eq!(want.len(), got.len());
    assert!(want.len() > 40, "{} tensors", want.len());
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
    // The drafter too.
    let (cd, dd) = (cpu_ds.unwrap(), dev_ds.unwrap());
    let (want, got) = (drafter_tensors(&cd), drafter_tensors(&dd));
    assert_eq!(want.len(), got.len());
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert!(
            matches!(g.device(), Device::Cuda(_)),
            "{name} is not on the GPU"
        );
        assert!(
            w.to_le_bytes().unwrap() == g.to_le_bytes().unwrap(),
            "{name} differs"
        );
    }
}
