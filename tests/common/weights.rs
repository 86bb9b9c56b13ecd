//! Every weight tensor of a loaded model, named, in a fixed order: for
//! tests that compare two loads of the same weights tensor by tensor.

use deepinfer::Tensor;
use deepinfer::model::dspark::DsparkWeights;
use deepinfer::model::forward::ModelWeights;
use deepinfer::model::layers::Block;
use deepinfer::model::layers::linear::Fp8Linear;

/// The backbone's tensors: embedding, head, norm, then each block's.
pub fn tensors(w: &ModelWeights) -> Vec<(String, &Tensor)> {
    let mut out: Vec<(String, &Tensor)> = vec![
        ("embed".into(), &w.embed),
        ("head".into(), &w.head.weight),
        ("norm".into(), &w.norm),
    ];
    for (i, b) in w.blocks.iter().enumerate() {
        block(&mut out, &format!("layers.{i}"), b);
    }
    out
}

/// The drafter's tensors: its projections and heads, then each stage's.
pub fn drafter_tensors(d: &DsparkWeights) -> Vec<(String, &Tensor)> {
    let mut out: Vec<(String, &Tensor)> = Vec::new();
    fp8(&mut out, "mtp.main_proj".into(), &d.main_proj);
    out.push(("mtp.main_norm".into(), &d.main_norm));
    out.push(("mtp.norm".into(), &d.norm));
    out.push(("mtp.markov_embed".into(), &d.markov_embed));
    out.push(("mtp.markov_head".into(), &d.markov_head.weight));
    out.push(("mtp.confidence".into(), &d.confidence.weight));
    for (i, b) in d.stages.iter().enumerate() {
        block(&mut out, &format!("mtp.{i}"), b);
    }
    out
}

fn block<'a>(all: &mut Vec<(String, &'a Tensor)>, p: &str, b: &'a Block) {
    all.push((format!("{p}.attn_norm"), &b.attn_norm));
    all.push((format!("{p}.ffn_norm"), &b.ffn_norm));
    for (which, hc) in [("attn", &b.hc_attn), ("ffn", &b.hc_ffn)] {
        all.push((format!("{p}.hc_{which}.fn"), &hc.func));
        all.push((format!("{p}.hc_{which}.base"), &hc.base));
        all.push((format!("{p}.hc_{which}.scale"), &hc.scale));
    }
    let a = &b.attn;
    fp8(all, format!("{p}.wq_a"), &a.wq_a);
    fp8(all, format!("{p}.wq_b"), &a.wq_b);
    fp8(all, format!("{p}.wkv"), &a.wkv);
    fp8(all, format!("{p}.wo_b"), &a.wo_b);
    all.push((format!("{p}.wo_a"), &a.wo_a));
    all.push((format!("{p}.q_norm"), &a.q_norm));
    all.push((format!("{p}.kv_norm"), &a.kv_norm));
    all.push((format!("{p}.sink"), &a.sink));
    if let Some(c) = &a.compressor {
        all.push((format!("{p}.compressor.wkv"), &c.wkv.weight));
        if let Some(g) = &c.wgate {
            all.push((format!("{p}.compressor.wgate"), &g.weight));
        }
        all.push((format!("{p}.compressor.norm"), &c.norm));
    }
    if let Some(i) = &a.indexer {
        fp8(all, format!("{p}.indexer.wq_b"), &i.wq_b);
        all.push((format!("{p}.indexer.weights_proj"), &i.weights_proj.weight));
        if let Some(k) = &i.keys {
            all.push((format!("{p}.indexer.wk"), &k.wk.weight));
            all.push((format!("{p}.indexer.k_norm"), &k.k_norm));
        }
    }
    let f = &b.ffn;
    all.push((format!("{p}.gate"), &f.gate.weight));
    all.push((format!("{p}.bias"), &f.bias));
    for (which, e) in [("w13", &f.w13), ("w2", &f.w2)] {
        all.push((format!("{p}.experts.{which}.weight"), &e.weight));
        all.push((format!("{p}.experts.{which}.scale"), &e.scale));
    }
    fp8(all, format!("{p}.shared.w13"), &f.shared.w13);
    fp8(all, format!("{p}.shared.w2"), &f.shared.w2);
    if let Some(e) = &b.engram {
        all.push((format!("{p}.engram.table"), &e.table));
        fp8(all, format!("{p}.engram.wkv"), &e.wkv);
        all.push((format!("{p}.engram.q_weight"), &e.q_weight));
        all.push((format!("{p}.engram.k_weight"), &e.k_weight));
    }
}

fn fp8<'a>(out: &mut Vec<(String, &'a Tensor)>, name: String, l: &'a Fp8Linear) {
    out.push((format!("{name}.weight"), &l.weight));
    out.push((format!("{name}.scale"), &l.scale));
}
