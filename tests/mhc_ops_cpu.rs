//! The batched mHC ops on the CPU backend: `ops::mhc_pre` and
//! `ops::mhc_expand` are the `cpu_backend::mhc` functions looped per token
//! (collapse with the lagged pre, mixes, split + Sinkhorn; expand), over
//! V4.1's hidden size and odd shapes, bit for bit; `ops::mhc_expand_pre`
//! is the reference expand followed by the front half of the new streams;
//! and typed validation errors naming the offending tensor or argument.

mod common;

use deepinfer::cpu_backend::mhc;
use deepinfer::{DType, Device, Error, Tensor, ops};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

fn f32s(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

struct Inputs {
    s: Vec<bf16>,
    hc_fn: Vec<f32>,
    base: Vec<f32>,
    scale: Vec<f32>,
    lag: Vec<f32>,
}

fn inputs(rng: &mut StdRng, t: usize, d: usize) -> Inputs {
    Inputs {
        s: common::random_activations(rng, t * 4 * d, 1.0),
        hc_fn: f32s(rng, 24 * 4 * d, -0.05, 0.05),
        base: f32s(rng, 24, -1.0, 1.0),
        scale: f32s(rng, 3, 0.1, 2.0),
        lag: f32s(rng, t * 4, 0.0, 2.0),
    }
}

fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn mhc_pre_and_expand_are_the_reference_per_token() {
    let mut rng = common::rng("mhc_ops_cpu");
    let p = ops::MhcParams::default();
    for (t, d) in [(1, 5120), (3, 128), (5, 512), (2, 8), (4, 3)] {
        let x = inputs(&mut rng, t, d);
        let out = ops::mhc_pre(
            &Tensor::from_vec(x.s.clone(), &[t, 4, d]).unwrap(),
            &Tensor::from_vec(x.hc_fn.clone(), &[24, 4 * d]).unwrap(),
            &Tensor::from_vec(x.base.clone(), &[24]).unwrap(),
            &Tensor::from_vec(x.scale.clone(), &[3]).unwrap(),
            &Tensor::from_vec(x.lag.clone(), &[t, 4]).unwrap(),
            p,
        )
        .unwrap();
        let u = out.u.to_vec::<bf16>().unwrap();
        let (pre, post, comb) = (
            out.pre.to_vec::<f32>().unwrap(),
            out.post.to_vec::<f32>().unwrap(),
            out.comb.to_vec::<f32>().unwrap(),
        );
        let f = common::random_activations(&mut rng, t * d, 2.0);
        let expanded = ops::mhc_expand(
            &Tensor::from_vec(x.s.clone(), &[t, 4, d]).unwrap(),
            &Tensor::from_vec(f.clone(), &[t, d]).unwrap(),
            &out.post,
            &out.comb,
        )
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
        for tok in 0..t {
            let s = &x.s[tok * 4 * d..][..4 * d];
            let lag: [f32; 4] = x.lag[tok * 4..][..4].try_into().unwrap();
            let m = mhc::hc_mixes(s, &x.hc_fn, p.eps);
            let split = mhc::hc_split(
                &m,
                x.scale[..].try_into().unwrap(),
                x.base[..].try_into().unwrap(),
                p.hc_eps,
                p.iters,
            );
            let case = format!("T {t} D {d} token {tok}");
            let mixes = out.mixes.to_vec::<f32>().unwrap();
            assert_eq!(
                bits_f32(&mixes[tok * 24..][..24]),
                bits_f32(&m),
                "mixes {case}"
            );
            assert_eq!(
                &u[tok * d..][..d],
                &mhc::hc_collapse(s, &lag)[..],
                "u {case}"
            );
            assert_eq!(
                bits_f32(&pre[tok * 4..][..4]),
                bits_f32(&split.pre),
                "pre {case}"
            );
            assert_eq!(
                bits_f32(&post[tok * 4..][..4]),
                bits_f32(&split.post),
                "post {case}"
            );
            let flat: Vec<f32> = split.comb.iter().flatten().copied().collect();
            assert_eq!(
                bits_f32(&comb[tok * 16..][..16]),
                bits_f32(&flat),
                "comb {case}"
            );
            let want = mhc::hc_expand(s, &f[tok * d..][..d], &split);
            assert_eq!(
                &expanded[tok * 4 * d..][..4 * d],
                &want[..],
                "expand {case}"
            );
        }
    }
}

/// The fused step against the per-token reference functions: the expand
/// (`hc_expand`) of the streams, then the collapse, mixes and split of the
/// new streams with the next sublayer's weights.
#[test]
fn mhc_expand_pre_is_the_reference_expand_then_front_half() {
    let mut rng = common::rng("mhc_expand_pre_cpu");
    let p = ops::MhcParams::default();
    for (t, d) in [(1, 5120), (3, 128), (2, 8), (4, 3)] {
        let x = inputs(&mut rng, t, d);
        let f = common::random_activations(&mut rng, t * d, 2.0);
        let post = f32s(&mut rng, t * 4, 0.0, 2.0);
        let comb = f32s(&mut rng, t * 16, -1.5, 1.5);
        let w = [
            Tensor::from_vec(x.hc_fn.clone(), &[24, 4 * d]).unwrap(),
            Tensor::from_vec(x.base.clone(), &[24]).unwrap(),
            Tensor::from_vec(x.scale.clone(), &[3]).unwrap(),
        ];
        let (new_s, out) = ops::mhc_expand_pre(
            &Tensor::from_vec(x.s.clone(), &[t, 4, d]).unwrap(),
            &Tensor::from_vec(f.clone(), &[t, d]).unwrap(),
            &Tensor::from_vec(post.clone(), &[t, 4]).unwrap(),
            &Tensor::from_vec(comb.clone(), &[t, 16]).unwrap(),
            ops::MhcWeights {
                func: &w[0],
                base: &w[1],
                scale: &w[2],
            },
            &Tensor::from_vec(x.lag.clone(), &[t, 4]).unwrap(),
            p,
        )
        .unwrap();
        let new_s = new_s.to_vec::<bf16>().unwrap();
        let u = out.u.to_vec::<bf16>().unwrap();
        let mixes = out.mixes.to_vec::<f32>().unwrap();
        let (pre_out, post_out, comb_out) = (
            out.pre.to_vec::<f32>().unwrap(),
            out.post.to_vec::<f32>().unwrap(),
            out.comb.to_vec::<f32>().unwrap(),
        );
        for tok in 0..t {
            let mut split = mhc::HcSplit {
                pre: [0.0; 4],
                post: post[tok * 4..][..4].try_into().unwrap(),
                comb: [[0.0; 4]; 4],
            };
            for (j, row) in split.comb.iter_mut().enumerate() {
                row.copy_from_slice(&comb[tok * 16 + 4 * j..][..4]);
            }
            let want_s = mhc::hc_expand(&x.s[tok * 4 * d..][..4 * d], &f[tok * d..][..d], &split);
            let case = format!("T {t} D {d} token {tok}");
            assert_eq!(
                &new_s[tok * 4 * d..][..4 * d],
                &want_s[..],
                "{case}: new streams"
            );
            assert_ne!(
                want_s,
                x.s[tok * 4 * d..][..4 * d],
                "{case}: the expand changed nothing"
            );
            let lag: [f32; 4] = x.lag[tok * 4..][..4].try_into().unwrap();
            assert_eq!(
                &u[tok * d..][..d],
                &mhc::hc_collapse(&want_s, &lag)[..],
                "{case}: u"
            );
            let m = mhc::hc_mixes(&want_s, &x.hc_fn, p.eps);
            assert_eq!(
                bits_f32(&mixes[tok * 24..][..24]),
                bits_f32(&m),
                "{case}: mixes"
            );
            let next = mhc::hc_split(
                &m,
                x.scale[..].try_into().unwrap(),
                x.base[..].try_into().unwrap(),
                p.hc_eps,
                p.iters,
            );
            assert_eq!(
                bits_f32(&pre_out[tok * 4..][..4]),
                bits_f32(&next.pre),
                "{case}: pre"
            );
            assert_eq!(
                bits_f32(&post_out[tok * 4..][..4]),
                bits_f32(&next.post),
                "{case}: post"
            );
            let comb: Vec<f32> = next.comb.iter().flatten().copied().collect();
            assert_eq!(
                bits_f32(&comb_out[tok * 16..][..16]),
                bits_f32(&comb),
                "{case}: comb"
            );
        }
    }
}

#[test]
fn expand_uses_the_given_post_and_comb() {
    // Hand case: D = 1, comb the identity, post 2: S'_k = 2·F + S_k.
    let s: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0].map(bf16::from_f32).to_vec();
    let f = vec![bf16::from_f32(0.5)];
    let mut comb = vec![0.0f32; 16];
    for k in 0..4 {
        comb[5 * k] = 1.0;
    }
    let out = ops::mhc_expand(
        &Tensor::from_vec(s, &[1, 4, 1]).unwrap(),
        &Tensor::from_vec(f, &[1, 1]).unwrap(),
        &Tensor::from_vec(vec![2.0f32; 4], &[1, 4]).unwrap(),
        &Tensor::from_vec(comb, &[1, 16]).unwrap(),
    )
    .unwrap()
    .to_vec::<bf16>()
    .unwrap();
    assert_eq!(out, [2.0f32, 3.0, 4.0, 5.0].map(bf16::from_f32).to_vec());
}

#[test]
fn validation_errors_name_the_tensor() {
    let (t, d) = (2, 16);
    let s = Tensor::from_vec(vec![bf16::ONE; t * 4 * d], &[t, 4, d]).unwrap();
    let hc_fn = Tensor::from_vec(vec![0.0f32; 24 * 4 * d], &[24, 4 * d]).unwrap();
    let base = Tensor::from_vec(vec![0.0f32; 24], &[24]).unwrap();
    let scale = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
    let lag = Tensor::from_vec(vec![0.25f32; t * 4], &[t, 4]).unwrap();
    let p = ops::MhcParams::default();
    let shape_of = |e: Error| match e {
        Error::Shape { tensor, .. } => tensor,
        Error::DType { tensor, .. } => tensor,
        other => panic!("unexpected error {other}"),
    };
    let bad_s = Tensor::from_vec(vec![bf16::ONE; t * 3 * d], &[t, 3, d]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_pre(&bad_s, &hc_fn, &base, &scale, &lag, p).unwrap_err()),
        "streams"
    );
    let bad_fn = Tensor::from_vec(vec![0.0f32; 24 * d], &[24, d]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_pre(&s, &bad_fn, &base, &scale, &lag, p).unwrap_err()),
        "hc_fn"
    );
    assert_eq!(
        shape_of(ops::mhc_pre(&s, &hc_fn, &scale, &scale, &lag, p).unwrap_err()),
        "hc_base"
    );
    assert_eq!(
        shape_of(ops::mhc_pre(&s, &hc_fn, &base, &base, &lag, p).unwrap_err()),
        "hc_scale"
    );
    let bad_lag = Tensor::from_vec(vec![0.0f32; 4], &[1, 4]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_pre(&s, &hc_fn, &base, &scale, &bad_lag, p).unwrap_err()),
        "pre_in"
    );
    let s32 = Tensor::from_vec(vec![1.0f32; t * 4 * d], &[t, 4, d]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_pre(&s32, &hc_fn, &base, &scale, &lag, p).unwrap_err()),
        "streams"
    );
    let zero_iters = ops::MhcParams { iters: 0, ..p };
    assert!(matches!(
        ops::mhc_pre(&s, &hc_fn, &base, &scale, &lag, zero_iters).unwrap_err(),
        Error::Argument { arg: "iters", .. }
    ));
    let bad_eps = ops::MhcParams { eps: f32::NAN, ..p };
    assert!(matches!(
        ops::mhc_pre(&s, &hc_fn, &base, &scale, &lag, bad_eps).unwrap_err(),
        Error::Argument { arg: "eps", .. }
    ));

    let f = Tensor::from_vec(vec![bf16::ONE; t * d], &[t, d]).unwrap();
    let post = Tensor::from_vec(vec![1.0f32; t * 4], &[t, 4]).unwrap();
    let comb = Tensor::from_vec(vec![0.25f32; t * 16], &[t, 16]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_expand(&s, &post, &post, &comb).unwrap_err()),
        "f_out"
    );
    assert_eq!(
        shape_of(ops::mhc_expand(&s, &f, &comb, &comb).unwrap_err()),
        "post"
    );
    assert_eq!(
        shape_of(ops::mhc_expand(&s, &f, &post, &post).unwrap_err()),
        "comb"
    );
    let mut wrong = Tensor::empty(&Device::Cpu, DType::BF16, &[t, d]).unwrap();
    assert_eq!(
        shape_of(ops::mhc_expand_into(&s, &f, &post, &comb, &mut wrong).unwrap_err()),
        "out"
    );

    // The fused step checks both halves' inputs and its outputs under its
    // own name.
    let w = ops::MhcWeights {
        func: &hc_fn,
        base: &base,
        scale: &scale,
    };
    let fused_err = |e: Error| match e {
        Error::Shape { op, tensor, .. } | Error::DType { op, tensor, .. } => (op, tensor),
        other => panic!("unexpected error {other}"),
    };
    assert_eq!(
        fused_err(ops::mhc_expand_pre(&s, &post, &post, &comb, w, &lag, p).unwrap_err()),
        ("mhc_expand_pre", "f_out")
    );
    assert_eq!(
        fused_err(ops::mhc_expand_pre(&s, &f, &post, &post, w, &lag, p).unwrap_err()),
        ("mhc_expand_pre", "comb")
    );
    let bad_w = ops::MhcWeights { func: &bad_fn, ..w };
    assert_eq!(
        fused_err(ops::mhc_expand_pre(&s, &f, &post, &comb, bad_w, &lag, p).unwrap_err()),
        ("mhc_expand_pre", "hc_fn")
    );
    assert_eq!(
        fused_err(ops::mhc_expand_pre(&s, &f, &post, &comb, w, &bad_lag, p).unwrap_err()),
        ("mhc_expand_pre", "pre_in")
    );
    assert!(matches!(
        ops::mhc_expand_pre(&s, &f, &post, &comb, w, &lag, zero_iters).unwrap_err(),
        Error::Argument { arg: "iters", .. }
    ));
    let (mut new_s, mut out) = ops::mhc_expand_pre(&s, &f, &post, &comb, w, &lag, p).unwrap();
    assert_eq!(
        fused_err(
            ops::mhc_expand_pre_into(&s, &f, &post, &comb, w, &lag, p, &mut wrong, &mut out)
                .unwrap_err()
        ),
        ("mhc_expand_pre", "new_streams")
    );
    out.mixes = Tensor::empty(&Device::Cpu, DType::F32, &[t, 23]).unwrap();
    assert_eq!(
        fused_err(
            ops::mhc_expand_pre_into(&s, &f, &post, &comb, w, &lag, p, &mut new_s, &mut out)
                .unwrap_err()
        ),
        ("mhc_expand_pre", "mixes")
    );
}
