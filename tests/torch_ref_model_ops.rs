//! The model runner's new ops against torch, behind the `torch-ref`
//! feature: the grouped `wo_a` (torch's fp32 einsum per group, rounded to
//! BF16 once) and the MoE combine (torch's fp32 sum of the routed rows in
//! expert order plus the shared row). Both sides round an fp32 sum to BF16;
//! they may order the sum differently, so each value must agree within the
//! fp32 error bound of its terms plus both roundings (`bf16_pair_close`).
#![cfg(feature = "torch-ref")]

mod common;

use common::torch::{bf16_to_torch, from_torch_bf16};
use common::{bf16_pair_close, random_activations, random_bf16};
use deepinfer::{Tensor, ops};
use half::bf16;
use rand::Rng;
use tch::Kind;

#[test]
fn grouped_wo_a_matches_a_torch_einsum() {
    let mut rng = common::rng("torch_grouped_wo_a");
    let (t, g, k, n) = (5, 8, 64, 48);
    let x = random_activations(&mut rng, t * g * k, 2.0);
    let w = random_bf16(&mut rng, g * n * k);
    let ours = ops::grouped_bf16_linear(
        &Tensor::from_vec(x.clone(), &[t, g * k]).unwrap(),
        &Tensor::from_vec(w.clone(), &[g * n, k]).unwrap(),
        g,
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    let xt = bf16_to_torch(&x, &[t as i64, g as i64, k as i64]).to_kind(Kind::Float);
    let wt = bf16_to_torch(&w, &[g as i64, n as i64, k as i64]).to_kind(Kind::Float);
    let theirs = from_torch_bf16(
        &tch::Tensor::einsum("tgk,gnk->tgn", &[xt, wt], None::<&[i64]>).to_kind(Kind::BFloat16),
    );
    for r in 0..t {
        for gi in 0..g {
            for c in 0..n {
                let i = r * g * n + gi * n + c;
                let abs: f64 = (0..k)
                    .map(|j| {
                        (x[r * g * k + gi * k + j].to_f64() * w[(gi * n + c) * k + j].to_f64())
                            .abs()
                    })
                    .sum();
                assert!(
                    bf16_pair_close(ours[i], theirs[i], abs, k),
                    "[{r},{gi},{c}] {} vs {}",
                    ours[i],
                    theirs[i]
                );
            }
        }
    }
}

#[test]
fn moe_combine_matches_a_torch_sum_in_expert_order() {
    let mut rng = common::rng("torch_moe_combine");
    let (t, d, k) = (6, 40, 4);
    // Entry j = token·k + slot sits at permutation position perm⁻¹(j).
    let mut perm: Vec<i32> = (0..(t * k) as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.random_range(0..=i));
    }
    let routed = random_activations(&mut rng, t * k * d, 1.0);
    let shared = random_activations(&mut rng, t * d, 1.0);
    let ours = ops::moe_combine(
        &Tensor::from_vec(routed.clone(), &[t * k, d]).unwrap(),
        &Tensor::from_vec(perm.clone(), &[t * k]).unwrap(),
        &Tensor::from_vec(shared.clone(), &[t, d]).unwrap(),
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    let mut pos = vec![0usize; t * k];
    for (i, &j) in perm.iter().enumerate() {
        pos[j as usize] = i;
    }
    let by_entry: Vec<bf16> = (0..t * k)
        .flat_map(|j| routed[pos[j] * d..(pos[j] + 1) * d].to_vec())
        .collect();
    let r = bf16_to_torch(&by_entry, &[t as i64, k as i64, d as i64]).to_kind(Kind::Float);
    let s = bf16_to_torch(&shared, &[t as i64, d as i64]).to_kind(Kind::Float);
    let theirs =
        from_torch_bf16(&(r.sum_dim_intlist(1i64, false, Kind::Float) + s).to_kind(Kind::BFloat16));
    for tok in 0..t {
        for x in 0..d {
            let abs: f64 = (0..k)
                .map(|slot| by_entry[(tok * k + slot) * d + x].to_f64().abs())
                .sum::<f64>()
                + shared[tok * d + x].to_f64().abs();
            let i = tok * d + x;
            assert!(
                bf16_pair_close(ours[i], theirs[i], abs, k + 1),
                "[{tok},{x}] {} vs {}",
                ours[i],
                theirs[i]
            );
        }
    }
}
