//! The MoE problems of the expert-parallel tests: random tokens routed by
//! `ops::moe_route`, random FP4 experts, the single-rank MoE of
//! `model::layers::moe` as the reference, and one rank's MoE through
//! `ep::dispatch` → grouped FP4 GEMMs → `ep::combine`, on any device.

use super::{GEMM_SCALES, gate_up, random_activations, random_e8m0, random_fp4};
use deepinfer::ep::{self, EpConfig, Mode, Transport};
use deepinfer::{DType, Device, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

const LIMIT: f32 = 10.0;

pub fn t<T: deepinfer::dtype::Element>(v: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

/// Routed experts: w1, w3 `[E, I, D]`, w2 `[E, D, I]`, with scales.
pub struct Experts {
    w: [(Tensor, Tensor); 3],
}

fn fp4_weights(rng: &mut StdRng, e: usize, n: usize, k: usize) -> (Tensor, Tensor) {
    (
        t(random_fp4(rng, e * n * k / 2), &[e, n, k]),
        t(
            random_e8m0(rng, e * n * (k / 32), GEMM_SCALES),
            &[e, n, k / 32],
        ),
    )
}

impl Experts {
    pub fn random(rng: &mut StdRng, e: usize, d: usize, i: usize) -> Experts {
        Experts {
            w: [
                fp4_weights(rng, e, i, d),
                fp4_weights(rng, e, i, d),
                fp4_weights(rng, e, d, i),
            ],
        }
    }

    fn map(&self, f: impl Fn(&Tensor) -> Tensor) -> Experts {
        let g = |(w, s): &(Tensor, Tensor)| (f(w), f(s));
        Experts {
            w: [g(&self.w[0]), g(&self.w[1]), g(&self.w[2])],
        }
    }

    /// The experts of `ids`, in that order (a rank's local experts).
    pub fn select(&self, ids: &[usize]) -> Experts {
        self.map(|w| ops::gather_rows(w, ids).unwrap())
    }

    /// The routed FFN in the contiguous layout: FP8 rows grouped by
    /// `offsets`, per-row routing weights → BF16 W2 outputs.
    pub fn contiguous(&self, q: &Tensor, s: &Tensor, weights: &Tensor, offsets: &Tensor) -> Tensor {
        let gemm = |(w, ws): &(Tensor, Tensor), q: &Tensor, s: &Tensor| {
            ops::mxfp4_grouped_contiguous(q, s, w, ws, offsets, DType::BF16).unwrap()
        };
        let (g, u) = (gemm(&self.w[0], q, s), gemm(&self.w[1], q, s));
        let (hq, hs) = ops::swiglu_act_quant_fp8(&gate_up(&g, &u), weights, LIMIT).unwrap();
        gemm(&self.w[2], &hq, &hs)
    }

    /// The same in the masked layout `[L, capacity, ·]` with `counts`.
    pub fn masked(&self, q: &Tensor, s: &Tensor, weights: &Tensor, counts: &Tensor) -> Tensor {
        let gemm = |(w, ws): &(Tensor, Tensor), q: &Tensor, s: &Tensor| {
            ops::mxfp4_grouped_masked(q, s, w, ws, counts, DType::BF16).unwrap()
        };
        let (g, u) = (gemm(&self.w[0], q, s), gemm(&self.w[1], q, s));
        let rows = weights.numel();
        let w = weights.clone().reshape(&[rows]).unwrap();
        let (hq, hs) = ops::swiglu_act_quant_fp8(&gate_up(&g, &u), &w, LIMIT).unwrap();
        gemm(&self.w[2], &hq, &hs)
    }
}

/// One MoE problem: tokens, their routing, the experts and a shared output.
pub struct Problem {
    pub x: Tensor,
    pub ids: Tensor,
    pub weights: Tensor,
    pub shared: Tensor,
    pub experts: Experts,
    pub n_experts: usize,
}

pub fn problem(
    rng: &mut StdRng,
    tokens: usize,
    n_experts: usize,
    top_k: usize,
    d: usize,
    i: usize,
) -> Problem {
    let x = t(random_activations(rng, tokens * d, 1.0), &[tokens, d]);
    let logits: Vec<f32> = (0..tokens * n_experts)
        .map(|_| rng.random_range(-4.0..4.0))
        .collect();
    let bias: Vec<f32> = (0..n_experts)
        .map(|_| rng.random_range(-0.5..0.5))
        .collect();
    let (ids, weights) = ops::moe_route(
        &t(logits, &[tokens, n_experts]),
        &t(bias, &[n_experts]),
        top_k,
        1.5,
    )
    .unwrap();
    Problem {
        x,
        ids,
        weights,
        shared: t(random_activations(rng, tokens * d, 0.5), &[tokens, d]),
        experts: Experts::random(rng, n_experts, d, i),
        n_experts,
    }
}

impl Problem {
    /// The same problem with every tensor on `device`.
    pub fn to_device(&self, device: &Device) -> Problem {
        let up = |x: &Tensor| x.to_device(device).unwrap();
        Problem {
            x: up(&self.x),
            ids: up(&self.ids),
            weights: up(&self.weights),
            shared: up(&self.shared),
            experts: self.experts.map(up),
            n_experts: self.n_experts,
        }
    }
}

/// The single-rank MoE of `model::layers::moe` (routed part and combine).
pub fn single_rank(p: &Problem) -> Vec<bf16> {
    let (_, offsets, perm) = ops::moe_layout(&p.ids, p.n_experts).unwrap();
    let (xg, wg) = ops::moe_permute(&p.x, &p.weights, &perm).unwrap();
    let (q, s) = ops::act_quant_fp8(&xg).unwrap();
    let routed = p.experts.contiguous(&q, &s, &wg, &offsets);
    ops::moe_combine(&routed, &perm, &p.shared)
        .unwrap()
        .to_vec()
        .unwrap()
}

/// The single-rank MoE with its routed FFN in the masked layout
/// `[E, capacity, D]` (capacity at least every expert's count), the layout
/// and grouped GEMMs of the low-latency mode: on the GPU the masked kernel
/// sums in another order than the contiguous one, so this is the bitwise
/// reference of that mode. The masked rows are placed on the host from
/// `ops::moe_layout`'s offsets (expert-major, ascending entry within one).
pub fn single_rank_masked(p: &Problem, capacity: usize) -> Vec<bf16> {
    let dev = p.x.device();
    let (counts, offsets, perm) = ops::moe_layout(&p.ids, p.n_experts).unwrap();
    let (xg, wg) = ops::moe_permute(&p.x, &p.weights, &perm).unwrap();
    let offs: Vec<i32> = offsets.to_vec().unwrap();
    let (e, d, n) = (p.n_experts, p.x.shape()[1], xg.rows());
    // slot[e·capacity + c] = the grouped row there (n: a zero row).
    let mut slot = vec![n; e * capacity];
    let mut back = vec![0usize; n];
    for x in 0..e {
        for (c, i) in (offs[x] as usize..offs[x + 1] as usize).enumerate() {
            assert!(c < capacity, "expert {x} holds more than {capacity} rows");
            slot[x * capacity + c] = i;
            back[i] = x * capacity + c;
        }
    }
    let zero = Tensor::zeros(&dev, DType::BF16, &[1, d]).unwrap();
    let padded = Tensor::cat_rows(&[&xg, &zero]).unwrap();
    let xm = ops::gather_rows(&padded, &slot).unwrap();
    let (q, s) = ops::act_quant_fp8(&xm).unwrap();
    let wh: Vec<f32> = wg.to_vec().unwrap();
    let wm: Vec<f32> = slot
        .iter()
        .map(|&i| wh.get(i).copied().unwrap_or(0.0))
        .collect();
    let wm = t(wm, &[e, capacity]).to_device(&dev).unwrap();
    let out = p.experts.masked(
        &q.reshape(&[e, capacity, d]).unwrap(),
        &s.reshape(&[e, capacity, d / 32]).unwrap(),
        &wm,
        &counts,
    );
    let routed = ops::gather_rows(&out.reshape(&[e * capacity, d]).unwrap(), &back).unwrap();
    ops::moe_combine(&routed, &perm, &p.shared)
        .unwrap()
        .to_vec()
        .unwrap()
}

/// The single-rank reference of `mode` on `p`'s device: [`single_rank`]
/// for the normal mode, [`single_rank_masked`] for the low-latency one.
pub fn single_rank_in(p: &Problem, mode: Mode) -> Vec<bf16> {
    match mode {
        Mode::Normal => single_rank(p),
        Mode::LowLatency { capacity, .. } => single_rank_masked(p, capacity.max(1)),
    }
}

/// Contiguous token shards of `tokens` over `world` ranks, some empty.
pub fn shards(rng: &mut StdRng, tokens: usize, world: usize) -> Vec<(usize, usize)> {
    let mut cuts: Vec<usize> = (0..world - 1)
        .map(|_| rng.random_range(0..=tokens))
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(world);
    let mut at = 0;
    for c in cuts.into_iter().chain([tokens]) {
        out.push((at, c - at));
        at = c;
    }
    out
}

/// One rank's MoE through EP on the problem's device; returns (its tokens'
/// outputs, overflow).
pub fn ep_rank(
    rank: &dyn Transport,
    cfg: &EpConfig,
    p: &Problem,
    shard: (usize, usize),
) -> deepinfer::Result<(Vec<bf16>, usize)> {
    let (a, n) = shard;
    let x = p.x.narrow_rows(a, n)?;
    let ids = p.ids.narrow_rows(a, n)?;
    let w = p.weights.narrow_rows(a, n)?;
    let shared = p.shared.narrow_rows(a, n)?;
    let got = ep::dispatch(rank, cfg, &x, &ids, &w)?;
    let (q, s) = match got.scales {
        Some(s) => (got.x, s),
        None => ops::act_quant_fp8(&got.x)?,
    };
    let local = p.experts.select(cfg.placement().local_experts(rank.rank()));
    let out = match cfg.mode() {
        Mode::Normal => local.contiguous(&q, &s, &got.weights, &got.layout),
        Mode::LowLatency { .. } => local.masked(&q, &s, &got.weights, &got.layout),
    };
    let y = ep::combine(rank, &got.handle, &out, &shared)?;
    Ok((y.to_vec()?, got.overflow))
}

pub fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One rank's MoE through a reused [`ep::LowLatencyBuffer`] on the problem's
/// device (every token of `p`): dispatch, the masked grouped GEMMs on the
/// buffer, combine; returns (the outputs, the overflow read afterwards).
pub fn masked_rank(
    buf: &mut ep::LowLatencyBuffer,
    cfg: &EpConfig,
    p: &Problem,
) -> deepinfer::Result<(Vec<bf16>, usize)> {
    buf.dispatch(&p.x, &p.ids, &p.weights)?;
    let (q, s) = match buf.scales() {
        Some(s) => (buf.x().clone(), s.clone()),
        None => {
            let x = buf.x();
            let (l, c, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
            let (q, s) = ops::act_quant_fp8(&x.clone().reshape(&[l * c, d])?)?;
            (q.reshape(&[l, c, d])?, s.reshape(&[l, c, d / 32])?)
        }
    };
    let local = p.experts.select(cfg.placement().local_experts(0));
    let out = local.masked(&q, &s, buf.weights(), buf.counts());
    let mut y = Tensor::empty(&p.x.device(), DType::BF16, p.shared.shape())?;
    buf.combine_into(&out, &p.shared, &mut y)?;
    let overflow = buf.overflow()?;
    Ok((y.to_vec()?, overflow))
}
