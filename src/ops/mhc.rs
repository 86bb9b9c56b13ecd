//! Manifold-constrained hyper-connections (`v41-flash.md` §6) over a batch
//! of tokens: [`mhc_pre`] computes, per token, the collapse of its 4 × D
//! BF16 residual streams with the (lagged) pre, the 24 mixes, and their
//! split into pre/post/comb with Sinkhorn; [`mhc_expand`] writes the new
//! streams `S'_k = BF16(post_k · F + Σ_j comb[j][k] · S_j)`;
//! [`mhc_expand_pre`] is the two in a row between sublayers, one pass over
//! the streams on CUDA.
//!
//! Numerics: the CPU path loops the [`cpu_backend::mhc`] functions per token
//! (fp32, fixed order, e^x correctly rounded via f64). The CUDA path of
//! [`mhc_expand`] is the TileLang program `tilelang/mhc.py`, bit-exact with
//! [`cpu_backend::mhc::hc_expand`]. The CUDA path of [`mhc_pre`] is
//! `tilelang/mhc_pre.py` then `tilelang/mhc_split.py`: the collapse is
//! bit-exact; the mixes are an fp32 GEMV summed in chunks of 128 positions
//! and then over the chunks, an order fixed by D alone (batch invariant) but
//! not the CPU's sequential sums (close, not bitwise); the split and
//! Sinkhorn follow the CPU's operation order exactly on the GPU's own mixes
//! (returned in [`MhcPre::mixes`]).
//!
//! [`cpu_backend::mhc`]: crate::cpu_backend::mhc

use super::{common_device, shape_error};
pub use crate::contract::MhcPre;
use crate::cpu_backend::mhc::{self, HC_MIXES, HC_STREAMS, HcSplit};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const OP_PRE: &str = "mhc_pre";
const OP_EXPAND: &str = "mhc_expand";
const OP_FUSED: &str = "mhc_expand_pre";

/// Scalars of [`mhc_pre`]: `eps` of the RMS (1e-20 in V4.1), `hc_eps` of
/// the split and Sinkhorn (1e-6) and the Sinkhorn iteration count (20).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcParams {
    pub eps: f32,
    pub hc_eps: f32,
    pub iters: usize,
}

impl Default for MhcParams {
    fn default() -> Self {
        Self {
            eps: 1e-20,
            hc_eps: 1e-6,
            iters: 20,
        }
    }
}

/// One sublayer's mHC front half for `streams` BF16 `[T, 4, D]`, with
/// `hc_fn` F32 `[24, 4·D]`, `hc_base` F32 `[24]`, `hc_scale` F32 `[3]` and
/// the lagged `pre_in` F32 `[T, 4]` used for the collapse. Returns new
/// tensors on the streams' device.
pub fn mhc_pre(
    streams: &Tensor,
    hc_fn: &Tensor,
    hc_base: &Tensor,
    hc_scale: &Tensor,
    pre_in: &Tensor,
    params: MhcParams,
) -> Result<MhcPre> {
    let (device, t, d) = validate_pre(OP_PRE, streams, hc_fn, hc_base, hc_scale, pre_in, params)?;
    let mut out = empty_pre(&device, t, d)?;
    mhc_pre_into(streams, hc_fn, hc_base, hc_scale, pre_in, params, &mut out)?;
    Ok(out)
}

/// [`mhc_pre`] into preallocated outputs of the shapes [`MhcPre`] documents.
pub fn mhc_pre_into(
    streams: &Tensor,
    hc_fn: &Tensor,
    hc_base: &Tensor,
    hc_scale: &Tensor,
    pre_in: &Tensor,
    params: MhcParams,
    out: &mut MhcPre,
) -> Result<()> {
    let (_, t, d) = validate_pre(OP_PRE, streams, hc_fn, hc_base, hc_scale, pre_in, params)?;
    let device = check_pre_outputs(OP_PRE, ("streams", streams), out, t, d)?;
    match device {
        Device::Cpu => {
            let s = streams.as_slice::<bf16>()?;
            let w = hc_fn.as_slice::<f32>()?;
            let base: [f32; HC_MIXES] =
                super::array(OP_PRE, "hc_base", hc_base.as_slice::<f32>()?)?;
            let scale: [f32; 3] = super::array(OP_PRE, "hc_scale", hc_scale.as_slice::<f32>()?)?;
            let lag = pre_in.as_slice::<f32>()?;
            let mut u = Vec::with_capacity(t * d);
            let mut mixes = Vec::with_capacity(t * HC_MIXES);
            let mut pre = Vec::with_capacity(t * HC_STREAMS);
            let mut post = Vec::with_capacity(t * HC_STREAMS);
            let mut comb = Vec::with_capacity(t * HC_STREAMS * HC_STREAMS);
            for (tok, lag) in s
                .chunks_exact(HC_STREAMS * d)
                .zip(lag.chunks_exact(HC_STREAMS))
            {
                let lag: [f32; HC_STREAMS] = super::array(OP_PRE, "pre_in", lag)?;
                u.extend(mhc::hc_collapse(tok, &lag));
                let m = mhc::hc_mixes(tok, w, params.eps);
                mixes.extend(m);
                let split = mhc::hc_split(&m, &scale, &base, params.hc_eps, params.iters);
                pre.extend(split.pre);
                post.extend(split.post);
                comb.extend(split.comb.iter().flatten());
            }
            out.u.as_mut_slice::<bf16>()?.copy_from_slice(&u);
            out.mixes.as_mut_slice::<f32>()?.copy_from_slice(&mixes);
            out.pre.as_mut_slice::<f32>()?.copy_from_slice(&pre);
            out.post.as_mut_slice::<f32>()?.copy_from_slice(&post);
            out.comb.as_mut_slice::<f32>()?.copy_from_slice(&comb);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::mhc_pre(
            &dev,
            streams,
            hc_fn,
            hc_base,
            hc_scale,
            pre_in,
            params.eps,
            params.hc_eps,
            params.iters,
            out,
            t,
            d,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP_PRE, &d)),
    }
}

/// The new residual streams BF16 `[T, 4, D]` from `streams` BF16
/// `[T, 4, D]`, the sublayer output `f_out` BF16 `[T, D]`, `post` F32
/// `[T, 4]` and `comb` F32 `[T, 16]` (as [`mhc_pre`] returns them).
pub fn mhc_expand(
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
) -> Result<Tensor> {
    let device = validate_expand(OP_EXPAND, streams, f_out, post, comb)?;
    let mut out = Tensor::empty(&device, DType::BF16, streams.shape())?;
    mhc_expand_into(streams, f_out, post, comb, &mut out)?;
    Ok(out)
}

/// [`mhc_expand`] into a preallocated `out` BF16 of the streams' shape
/// (distinct from `streams`: the borrow rules forbid in place).
pub fn mhc_expand_into(
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    validate_expand(OP_EXPAND, streams, f_out, post, comb)?;
    out.expect_output(OP_EXPAND, "out", DType::BF16, streams.shape())?;
    let device = common_device(OP_EXPAND, &[("streams", streams), ("out", out)])?;
    let (t, d) = (streams.shape()[0], streams.shape()[2]);
    match device {
        Device::Cpu => {
            let s = streams.as_slice::<bf16>()?;
            let f = f_out.as_slice::<bf16>()?;
            let po = post.as_slice::<f32>()?;
            let co = comb.as_slice::<f32>()?;
            let mut res = Vec::with_capacity(t * HC_STREAMS * d);
            for tok in 0..t {
                let mut split = HcSplit {
                    pre: [0.0; HC_STREAMS],
                    post: super::array(OP_EXPAND, "post", &po[tok * HC_STREAMS..])?,
                    comb: [[0.0; HC_STREAMS]; HC_STREAMS],
                };
                for (j, row) in split.comb.iter_mut().enumerate() {
                    row.copy_from_slice(&co[(tok * HC_STREAMS + j) * HC_STREAMS..][..HC_STREAMS]);
                }
                res.extend(mhc::hc_expand(
                    &s[tok * HC_STREAMS * d..][..HC_STREAMS * d],
                    &f[tok * d..][..d],
                    &split,
                ));
            }
            out.as_mut_slice::<bf16>()?.copy_from_slice(&res);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            crate::cuda_backend::mhc_expand(&dev, streams, f_out, post, comb, out, t, d)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP_EXPAND, &d)),
    }
}

/// One sublayer's mHC weights: `func` (hc_fn) F32 `[24, 4·D]`, `base` F32
/// `[24]`, `scale` F32 `[3]`.
#[derive(Clone, Copy, Debug)]
pub struct MhcWeights<'a> {
    pub func: &'a Tensor,
    pub base: &'a Tensor,
    pub scale: &'a Tensor,
}

/// The single-pass mHC step between two sublayers (`v41-flash.md` §6.2):
/// the expand of sublayer i ([`mhc_expand`] of `streams`, its output
/// `f_out`, `post` and `comb`) and the front half of sublayer i+1
/// ([`mhc_pre`] of the new streams with `next`'s weights and the lagged
/// `pre_in`, sublayer i's pre). Returns the new streams BF16 `[T, 4, D]`
/// and the front half's outputs.
///
/// Results are those of the two ops in a row, bitwise, on each device: on
/// the CPU it is their composition; on CUDA one kernel
/// (`tilelang/mhc_expand_pre.py`) reads the streams and F once and writes
/// the new streams, u and the mixes' partial sums, with the expand's and
/// pass 1's code (so the same sums as [`mhc_pre`]'s kernels), then pass 2.
pub fn mhc_expand_pre(
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
    next: MhcWeights<'_>,
    pre_in: &Tensor,
    params: MhcParams,
) -> Result<(Tensor, MhcPre)> {
    validate_expand(OP_FUSED, streams, f_out, post, comb)?;
    let (device, t, d) = validate_pre(
        OP_FUSED, streams, next.func, next.base, next.scale, pre_in, params,
    )?;
    let mut new_streams = Tensor::empty(&device, DType::BF16, streams.shape())?;
    let mut out = empty_pre(&device, t, d)?;
    mhc_expand_pre_into(
        streams,
        f_out,
        post,
        comb,
        next,
        pre_in,
        params,
        &mut new_streams,
        &mut out,
    )?;
    Ok((new_streams, out))
}

/// [`mhc_expand_pre`] into preallocated outputs: `new_streams` BF16 of the
/// streams' shape (distinct from `streams`) and `out` of the shapes
/// [`MhcPre`] documents.
#[allow(clippy::too_many_arguments)]
pub fn mhc_expand_pre_into(
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
    next: MhcWeights<'_>,
    pre_in: &Tensor,
    params: MhcParams,
    new_streams: &mut Tensor,
    out: &mut MhcPre,
) -> Result<()> {
    validate_expand(OP_FUSED, streams, f_out, post, comb)?;
    let (_, t, d) = validate_pre(
        OP_FUSED, streams, next.func, next.base, next.scale, pre_in, params,
    )?;
    new_streams.expect_output(OP_FUSED, "new_streams", DType::BF16, streams.shape())?;
    common_device(
        OP_FUSED,
        &[("streams", streams), ("new_streams", new_streams)],
    )?;
    let device = check_pre_outputs(OP_FUSED, ("new_streams", new_streams), out, t, d)?;
    match device {
        Device::Cpu => {
            mhc_expand_into(streams, f_out, post, comb, new_streams)?;
            mhc_pre_into(
                new_streams,
                next.func,
                next.base,
                next.scale,
                pre_in,
                params,
                out,
            )
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::mhc_expand_pre(
            &dev,
            [streams, f_out, post, comb],
            [next.func, next.base, next.scale],
            pre_in,
            params.eps,
            params.hc_eps,
            params.iters,
            new_streams,
            out,
            t,
            d,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(OP_FUSED, &d)),
    }
}

/// Uninitialised outputs of a front half for `t` tokens of width `d`, of
/// the shapes [`MhcPre`] documents.
fn empty_pre(device: &Device, t: usize, d: usize) -> Result<MhcPre> {
    Ok(MhcPre {
        u: Tensor::empty(device, DType::BF16, &[t, d])?,
        mixes: Tensor::empty(device, DType::F32, &[t, HC_MIXES])?,
        pre: Tensor::empty(device, DType::F32, &[t, HC_STREAMS])?,
        post: Tensor::empty(device, DType::F32, &[t, HC_STREAMS])?,
        comb: Tensor::empty(device, DType::F32, &[t, HC_STREAMS * HC_STREAMS])?,
    })
}

/// Checks the outputs of a front half for `t` tokens of width `d` against
/// those shapes; their common device with `streams`.
fn check_pre_outputs(
    op: &'static str,
    streams: (&'static str, &Tensor),
    out: &MhcPre,
    t: usize,
    d: usize,
) -> Result<Device> {
    out.u.expect_output(op, "u", DType::BF16, &[t, d])?;
    out.mixes
        .expect_output(op, "mixes", DType::F32, &[t, HC_MIXES])?;
    out.pre
        .expect_output(op, "pre", DType::F32, &[t, HC_STREAMS])?;
    out.post
        .expect_output(op, "post", DType::F32, &[t, HC_STREAMS])?;
    out.comb
        .expect_output(op, "comb", DType::F32, &[t, HC_STREAMS * HC_STREAMS])?;
    common_device(
        op,
        &[
            streams,
            ("u", &out.u),
            ("mixes", &out.mixes),
            ("pre", &out.pre),
            ("post", &out.post),
            ("comb", &out.comb),
        ],
    )
}

/// `streams` BF16 `[T, 4, D]` with D ≥ 1 and T·4·D below 2^31: (T, D).
fn streams_shape(op: &'static str, streams: &Tensor) -> Result<(usize, usize)> {
    streams.expect_dtype(op, "streams", DType::BF16)?;
    match *streams.shape() {
        [t, HC_STREAMS, d]
            if d > 0
                && HC_STREAMS
                    .checked_mul(d)
                    .and_then(|row| t.checked_mul(row))
                    .is_some_and(|n| i32::try_from(n).is_ok()) =>
        {
            Ok((t, d))
        }
        _ => Err(shape_error(
            op,
            "streams",
            streams,
            "[T, 4, D] with D > 0 and T·4·D below 2^31".into(),
        )),
    }
}

fn validate_pre(
    op: &'static str,
    streams: &Tensor,
    hc_fn: &Tensor,
    hc_base: &Tensor,
    hc_scale: &Tensor,
    pre_in: &Tensor,
    params: MhcParams,
) -> Result<(Device, usize, usize)> {
    let (t, d) = streams_shape(op, streams)?;
    for (name, x) in [
        ("hc_fn", hc_fn),
        ("hc_base", hc_base),
        ("hc_scale", hc_scale),
        ("pre_in", pre_in),
    ] {
        x.expect_dtype(op, name, DType::F32)?;
    }
    if hc_fn.shape() != [HC_MIXES, HC_STREAMS * d] {
        return Err(shape_error(
            op,
            "hc_fn",
            hc_fn,
            format!("[24, {}] (24 × 4·D)", HC_STREAMS * d),
        ));
    }
    if hc_base.shape() != [HC_MIXES] {
        return Err(shape_error(op, "hc_base", hc_base, "[24]".into()));
    }
    if hc_scale.shape() != [3] {
        return Err(shape_error(op, "hc_scale", hc_scale, "[3]".into()));
    }
    if pre_in.shape() != [t, HC_STREAMS] {
        return Err(shape_error(
            op,
            "pre_in",
            pre_in,
            format!("[{t}, 4] (one pre per token and stream)"),
        ));
    }
    if !(params.eps.is_finite() && params.eps >= 0.0) {
        return Err(Error::Argument {
            op,
            arg: "eps",
            value: params.eps.to_string(),
            why: "must be finite and non-negative",
        });
    }
    if !(params.hc_eps.is_finite() && params.hc_eps >= 0.0) {
        return Err(Error::Argument {
            op,
            arg: "hc_eps",
            value: params.hc_eps.to_string(),
            why: "must be finite and non-negative",
        });
    }
    if params.iters == 0 || params.iters > crate::contract::MHC_MAX_SINKHORN_ITERS {
        return Err(Error::Argument {
            op,
            arg: "iters",
            value: params.iters.to_string(),
            why: "Sinkhorn needs at least one iteration and at most MHC_MAX_SINKHORN_ITERS (1000)",
        });
    }
    let device = common_device(
        op,
        &[
            ("streams", streams),
            ("hc_fn", hc_fn),
            ("hc_base", hc_base),
            ("hc_scale", hc_scale),
            ("pre_in", pre_in),
        ],
    )?;
    Ok((device, t, d))
}

fn validate_expand(
    op: &'static str,
    streams: &Tensor,
    f_out: &Tensor,
    post: &Tensor,
    comb: &Tensor,
) -> Result<Device> {
    let (t, d) = streams_shape(op, streams)?;
    f_out.expect_dtype(op, "f_out", DType::BF16)?;
    post.expect_dtype(op, "post", DType::F32)?;
    comb.expect_dtype(op, "comb", DType::F32)?;
    if f_out.shape() != [t, d] {
        return Err(shape_error(
            op,
            "f_out",
            f_out,
            format!("[{t}, {d}] (T × D of streams)"),
        ));
    }
    if post.shape() != [t, HC_STREAMS] {
        return Err(shape_error(op, "post", post, format!("[{t}, 4]")));
    }
    if comb.shape() != [t, HC_STREAMS * HC_STREAMS] {
        return Err(shape_error(op, "comb", comb, format!("[{t}, 16]")));
    }
    common_device(
        op,
        &[
            ("streams", streams),
            ("f_out", f_out),
            ("post", post),
            ("comb", comb),
        ],
    )
}
