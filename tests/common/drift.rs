//! How far two runs of the model drift apart, step by step: the logits'
//! calc_diff, the share of equal routing decisions (expert sets per token
//! and layer), of equal compressed index lists (per entry row and layer)
//! and of equal greedy tokens. Used by the CUDA model tests, which compare
//! the GPU and a nudged CPU model against the CPU model.

use deepinfer::model::forward::StepOutput;
use deepinfer::numerics::calc_diff;
use deepinfer::ops;

#[derive(Default)]
pub struct Agreement {
    pub equal: usize,
    pub total: usize,
}

impl Agreement {
    pub fn add(&mut self, a: &[i32], b: &[i32], width: usize) {
        for (x, y) in a.chunks(width.max(1)).zip(b.chunks(width.max(1))) {
            self.total += 1;
            self.equal += usize::from(x == y);
        }
    }

    pub fn share(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.equal as f64 / self.total as f64
        }
    }
}

#[derive(Default)]
pub struct Report {
    pub diffs: Vec<f64>,
    pub routing: Agreement,
    pub lists: Agreement,
    pub argmax: Agreement,
}

pub fn compare(report: &mut Report, step: usize, cpu: &StepOutput, gpu: &StepOutput) {
    let (c, g) = (
        cpu.logits.to_vec::<f32>().unwrap(),
        gpu.logits.to_vec::<f32>().unwrap(),
    );
    assert_eq!(c.len(), g.len(), "step {step}: logits size");
    if let Some(i) = g.iter().position(|x| !x.is_finite()) {
        panic!("step {step}: GPU logit {i} is {}", g[i]);
    }
    let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    report.diffs.push(calc_diff(&f64s(&g), &f64s(&c)));
    let am = |o: &StepOutput| ops::argmax(&o.logits).unwrap().to_vec::<i32>().unwrap();
    report.argmax.add(&am(cpu), &am(gpu), 1);
    assert_eq!(cpu.layers.len(), gpu.layers.len());
    for (lc, lg) in cpu.layers.iter().zip(&gpu.layers) {
        if let (Some(rc), Some(rg)) = (&lc.routing, &lg.routing) {
            let k = rc.shape().last().copied().unwrap_or(1);
            report.routing.add(
                &rc.to_vec::<i32>().unwrap(),
                &rg.to_vec::<i32>().unwrap(),
                k,
            );
        }
        if let (Some(ic), Some(ig)) = (&lc.index_lists, &lg.index_lists) {
            for (a, b) in ic.iter().zip(ig) {
                let k = a.shape().last().copied().unwrap_or(1);
                report
                    .lists
                    .add(&a.to_vec::<i32>().unwrap(), &b.to_vec::<i32>().unwrap(), k);
            }
        }
    }
}
