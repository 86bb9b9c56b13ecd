//! Loading a checkpoint straight onto the GPU (`load_weights_on`): the tiny
//! model's every weight, read back from the device, is bitwise the CPU
//! load's (dtype, shape and bytes), and lives on the device. The stored
//! tensors are uploaded from the memory-mapped shards with no host tensor
//! between; the converted ones (wo_a, stacked experts, Engram rows, mHC
//! vectors) are built on the host and moved. Built only for
//! DEEPINFER_ACCELERATOR=nvidia; needs a GPU (run it through the GPU bundle).
#![cfg(deepinfer_cuda)]

mod common;

use deepinfer::device::CudaDevice;
use deepinfer::model::forward::ModelWeights;
use deepinfer::model::layers::linear::Fp8Linear;
use deepinfer::model::load::{load_weights_on, modulo_token_map};
use deepinfer::{Device, Tensor};

/// Every weight tensor of `w`, named, in a fixed order.
fn tensors(w: &ModelWeights) -> Vec<(String, &Tensor)> {
    let mut out: Vec<(String, &Tensor)> = vec![
        ("embed".into(), &w.embed),
        ("head".into(), &w.head.weight),
        ("norm".into(), &w.norm),
    ];
    let mut all: Vec<(String, &Tensor)> = Vec::new();
    for (i, b) in w.blocks.iter().enumerate() {
        let p = format!("layers.{i}");
        all.push((format!("{p}.attn_norm"), &b.attn_norm));
        all.push((format!("{p}.ffn_norm"), &b.ffn_norm));
        for (which, hc) in [("attn", &b.hc_attn), ("ffn", &b.hc_ffn)] {
            all.push((format!("{p}.hc_{which}.fn"), &hc.func));
            all.push((format!("{p}.hc_{which}.base"), &hc.base));
            all.push((format!("{p}.hc_{which}.scale"), &hc.scale));
        }
        let a = &b.attn;
        fp8(&mut all, format!("{p}.wq_a"), &a.wq_a);
        fp8(&mut all, format!("{p}.wq_b"), &a.wq_b);
        fp8(&mut all, format!("{p}.wkv"), &a.wkv);
        fp8(&mut all, format!("{p}.wo_b"), &a.wo_b);
        all.push((format!("{p}.wo_a"), &a.wo_a));
        all.push((format!("{p}.q_norm"), &a.q_norm));
        all.push((format!("{p}.kv_norm"), &a.kv_norm));
        all.push((format!("{p}.sink"), &a.sink));
        let f = &b.ffn;
        all.push((format!("{p}.gate"), &f.gate.weight));
        all.push((format!("{p}.bias"), &f.bias));
        for (which, e) in [("w1", &f.w1), ("w2", &f.w2), ("w3", &f.w3)] {
            all.push((format!("{p}.experts.{which}.weight"), &e.weight));
            all.push((format!("{p}.experts.{which}.scale"), &e.scale));
        }
        fp8(&mut all, format!("{p}.shared.w1"), &f.shared.w1);
        fp8(&mut all, format!("{p}.shared.w2"), &f.shared.w2);
        fp8(&mut all, format!("{p}.shared.w3"), &f.shared.w3);
        if let Some(e) = &b.engram {
            all.push((format!("{p}.engram.table"), &e.table));
            fp8(&mut all, format!("{p}.engram.wkv"), &e.wkv);
            all.push((format!("{p}.engram.q_weight"), &e.q_weight));
            all.push((format!("{p}.engram.k_weight"), &e.k_weight));
        }
    }
    out.extend(all);
    out
}

fn fp8<'a>(out: &mut Vec<(String, &'a Tensor)>, name: String, l: &'a Fp8Linear) {
    out.push((format!("{name}.weight"), &l.weight));
    out.push((format!("{name}.scale"), &l.scale));
}

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
    for (name, w, g) in [
        ("markov_embed", &cd.markov_embed, &dd.markov_embed),
        ("main_norm", &cd.main_norm, &dd.main_norm),
        ("main_proj", &cd.main_proj.weight, &dd.main_proj.weight),
    ] {
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
