//! Interleaved rotary position embedding and its inverse (`v41-flash.md`
//! §3.2, §3.1 step 5) on BF16 `x` `[T, H, hd]` (or `[T, H·hd]`) with one
//! I64 position per token: the last `rope_dim` dims of every head rotate by
//! the angles of the token's position, pair i being elements (2i, 2i+1) of
//! that slice; the first `hd − rope_dim` dims pass through unchanged.
//! [`rope`] is the forward rotation (q, window KV), [`inverse_rope`] the
//! conjugate one (−sin) that returns the attention output to a position-free
//! frame.
//!
//! The layer's θ and YaRN ([`RopeParams`]) stay on the host: the frequency
//! table is [`cpu_backend::rope_freqs`] on every backend (the CUDA path
//! uploads its `rope_dim / 2` fp32 values with each call), so both backends
//! rotate by the same fp32 angles `fp32(p) · freq_i`.
//!
//! Numerics: the CUDA kernel (the TileLang program `tilelang/rope.py`)
//! evaluates the CPU reference's formula operation for operation (separate
//! fp32 products, no FMA, BF16 round to nearest even), with cos and sin in
//! double precision rounded once to fp32; only when the exact cos or sin lies
//! within a few fp64 ulps of an fp32 rounding midpoint (none of 12.8 million
//! sampled (p, i) lies within 16) may they differ from the CPU's in the last
//! fp32 ulp, which the spec allows. The pass-through dims are copied bit for
//! bit.
//!
//! Outputs are new tensors (or preallocated ones, `_into`) distinct from x:
//! the ops never work in place.
//!
//! CUDA limits (typed errors from the launcher): `hd` and `rope_dim`
//! multiples of 8, `rope_dim` ≤ 256, `H·hd` ≤ 536,862,720, `T` < 2^31.

use super::common_device;
use crate::cpu_backend::{self, RopeParams};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

/// Rotates the last `rope_dim` dims of every head of `x` (BF16 `[T, H, hd]`
/// with H = `heads`, or `[T, heads·hd]`) by the angles of the token
/// positions (`positions`: I64 `[T]`) for the layer's `params`. `rope_dim`
/// is even, positive and at most hd. Returns a new tensor of x's shape on
/// x's device.
pub fn rope(
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
) -> Result<Tensor> {
    run_new("rope", x, positions, heads, rope_dim, params, false)
}

/// [`rope`] into a preallocated BF16 `out` of x's shape on x's device.
pub fn rope_into(
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
    out: &mut Tensor,
) -> Result<()> {
    run_into("rope", x, positions, heads, rope_dim, params, false, out)
}

/// The inverse of [`rope`] (rotation by −angle), applied to the attention
/// output at the query positions. Same layout and arguments.
pub fn inverse_rope(
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
) -> Result<Tensor> {
    run_new("inverse_rope", x, positions, heads, rope_dim, params, true)
}

/// [`inverse_rope`] into a preallocated BF16 `out` of x's shape on x's device.
pub fn inverse_rope_into(
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
    out: &mut Tensor,
) -> Result<()> {
    run_into(
        "inverse_rope",
        x,
        positions,
        heads,
        rope_dim,
        params,
        true,
        out,
    )
}

fn run_new(
    op: &'static str,
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
    inverse: bool,
) -> Result<Tensor> {
    let shape = validate(op, x, positions, heads, rope_dim, params)?;
    let device = common_device(op, &[("x", x), ("positions", positions)])?;
    let mut out = Tensor::empty(&device, DType::BF16, x.shape())?;
    run(
        op, x, positions, &shape, rope_dim, params, inverse, &mut out,
    )?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn run_into(
    op: &'static str,
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
    inverse: bool,
    out: &mut Tensor,
) -> Result<()> {
    let shape = validate(op, x, positions, heads, rope_dim, params)?;
    out.expect_output(op, "out", DType::BF16, x.shape())?;
    run(op, x, positions, &shape, rope_dim, params, inverse, out)
}

/// Tokens, heads and head dimension of a validated x.
struct Layout {
    tokens: usize,
    heads: usize,
    head_dim: usize,
}

#[allow(clippy::too_many_arguments)]
fn run(
    op: &'static str,
    x: &Tensor,
    positions: &Tensor,
    l: &Layout,
    rope_dim: usize,
    params: &RopeParams,
    inverse: bool,
    out: &mut Tensor,
) -> Result<()> {
    let device = common_device(op, &[("x", x), ("positions", positions), ("out", out)])?;
    // No token, nothing to rotate: a zero-token x may still name a head
    // dimension (and so a rope_dim) far past anything that fits in memory.
    if l.tokens == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {
            let f = if inverse {
                cpu_backend::inverse_rope
            } else {
                cpu_backend::rope
            };
            let y = f(
                x.as_slice::<bf16>()?,
                positions.as_slice::<i64>()?,
                l.heads,
                l.head_dim,
                rope_dim,
                params,
            );
            out.as_mut_slice::<bf16>()?.copy_from_slice(&y);
            Ok(())
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::rope(
            &dev,
            op,
            x,
            positions,
            &cpu_backend::rope_freqs(params, rope_dim),
            out,
            l.tokens,
            l.heads,
            l.head_dim,
            inverse,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(op, &d)),
    }
}

/// Checks dtypes, shapes and arguments; returns x's (tokens, heads, hd).
fn validate(
    op: &'static str,
    x: &Tensor,
    positions: &Tensor,
    heads: usize,
    rope_dim: usize,
    params: &RopeParams,
) -> Result<Layout> {
    x.expect_dtype(op, "x", DType::BF16)?;
    positions.expect_dtype(op, "positions", DType::I64)?;
    if heads == 0 {
        return Err(Error::Argument {
            op,
            arg: "heads",
            value: "0".into(),
            why: "must be positive",
        });
    }
    let shape_error = || Error::Shape {
        op,
        tensor: "x",
        got: x.shape().to_vec(),
        expected: format!("[T, {heads}, head_dim] or [T, {heads} * head_dim] with head_dim > 0"),
    };
    let (tokens, head_dim) = match *x.shape() {
        [t, h, hd] if h == heads && hd > 0 => (t, hd),
        [t, w] if w > 0 && w.is_multiple_of(heads) => (t, w / heads),
        _ => return Err(shape_error()),
    };
    if positions.shape() != [tokens] {
        return Err(Error::Shape {
            op,
            tensor: "positions",
            got: positions.shape().to_vec(),
            expected: format!("[{tokens}] (one position per token of x)"),
        });
    }
    check_rope_args(op, rope_dim, head_dim, params)?;
    Ok(Layout {
        tokens,
        heads,
        head_dim,
    })
}

/// The checks of `rope_dim` (even, positive, at most `head_dim`) and of the
/// layer's parameters, shared with the row writers that rotate in place.
pub(super) fn check_rope_args(
    op: &'static str,
    rope_dim: usize,
    head_dim: usize,
    params: &RopeParams,
) -> Result<()> {
    if rope_dim == 0 || !rope_dim.is_multiple_of(2) || rope_dim > head_dim {
        return Err(Error::Argument {
            op,
            arg: "rope_dim",
            value: rope_dim.to_string(),
            why: "must be even, positive and at most the head dimension",
        });
    }
    if !(params.theta.is_finite() && params.theta > 0.0) {
        return Err(Error::Argument {
            op,
            arg: "params.theta",
            value: params.theta.to_string(),
            why: "must be finite and positive",
        });
    }
    if let Some(y) = params.yarn.filter(|y| y.original_seq_len > 0) {
        let ok = y.factor.is_finite()
            && y.factor > 0.0
            && y.beta_fast.is_finite()
            && y.beta_fast > 0.0
            && y.beta_slow.is_finite()
            && y.beta_slow > 0.0;
        if !ok {
            return Err(Error::Argument {
                op,
                arg: "params.yarn",
                value: format!("{y:?}"),
                why: "factor, beta_fast and beta_slow must be finite and positive",
            });
        }
    }
    Ok(())
}
