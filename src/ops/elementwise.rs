//! Elementwise scalar ops on BF16 or F32 tensors: [`scale`] (x · s) and
//! [`div_scalar`] (x / s), each computed in fp32 and rounded once to the
//! input's dtype (the indexer's 2^−6 head-weight factor, the gate
//! temperature); and [`cat_cols`], the concatenation of `[T, D_i]` tensors
//! along their last dimension (the DSpark target features).
//!
//! Invariant: one fp32 operation per element, the result in x's dtype, on
//! either device (the CUDA kernels use the same IEEE operation: bitwise).

use super::{common_device, shape_error};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

#[derive(Clone, Copy)]
enum Scalar {
    Mul(f32),
    Div(f32),
}

impl Scalar {
    fn apply(self, v: f32) -> f32 {
        match self {
            Scalar::Mul(s) => v * s,
            Scalar::Div(s) => v / s,
        }
    }
}

fn map(op: &'static str, x: &Tensor, f: Scalar) -> Result<Tensor> {
    if !matches!(x.dtype(), DType::F32 | DType::BF16) {
        return Err(Error::DType {
            op,
            tensor: "x",
            got: x.dtype(),
            expected: DType::F32,
        });
    }
    match x.device() {
        Device::Cpu => map_cpu(op, x, f),
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            use crate::cuda_backend::ScalarOp;
            let mut out = Tensor::empty(&x.device(), x.dtype(), x.shape())?;
            let (kind, s) = match f {
                Scalar::Mul(s) => (ScalarOp::Mul, s),
                Scalar::Div(s) => (ScalarOp::Div, s),
            };
            crate::cuda_backend::scalar(&dev, x, s, kind, &mut out)?;
            Ok(out)
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => Err(super::kernels_not_built(op, &d)),
    }
}

fn map_cpu(op: &'static str, x: &Tensor, f: Scalar) -> Result<Tensor> {
    let f = |v: f32| f.apply(v);
    match x.dtype() {
        DType::F32 => Tensor::from_vec(
            x.as_slice::<f32>()?.iter().map(|&v| f(v)).collect(),
            x.shape(),
        ),
        DType::BF16 => Tensor::from_vec(
            x.as_slice::<bf16>()?
                .iter()
                .map(|v| bf16::from_f32(f(v.to_f32())))
                .collect(),
            x.shape(),
        ),
        got => Err(Error::DType {
            op,
            tensor: "x",
            got,
            expected: DType::F32,
        }),
    }
}

/// x · s elementwise (BF16 or F32 x, fp32 product, rounded to x's dtype).
pub fn scale(x: &Tensor, s: f32) -> Result<Tensor> {
    map("scale", x, Scalar::Mul(s))
}

/// x / s elementwise (BF16 or F32 x, fp32 quotient, rounded to x's dtype).
pub fn div_scalar(x: &Tensor, s: f32) -> Result<Tensor> {
    map("div_scalar", x, Scalar::Div(s))
}

/// The `[T, D_i]` parts (same dtype, same T, one device) side by side:
/// `[T, Σ D_i]`. Packed FP4 parts need even widths (whole bytes).
pub fn cat_cols(parts: &[&Tensor]) -> Result<Tensor> {
    const OP: &str = "cat_cols";
    let Some(first) = parts.first() else {
        return Err(Error::Argument {
            op: OP,
            arg: "parts",
            value: "[]".into(),
            why: "needs at least one tensor",
        });
    };
    let t = first.rows();
    let mut widths = Vec::with_capacity(parts.len());
    // Packed FP4 parts join on whole bytes: even widths.
    let packed = first.dtype() == DType::F4E2M1x2;
    for p in parts {
        p.expect_dtype(OP, "parts", first.dtype())?;
        match *p.shape() {
            [pt, w] if pt == t && (!packed || w.is_multiple_of(2)) => widths.push(w),
            _ => {
                return Err(shape_error(
                    OP,
                    "parts",
                    p,
                    format!("[{t}, D], D even for fp4"),
                ));
            }
        }
    }
    let named: Vec<(&'static str, &Tensor)> = parts.iter().map(|p| ("parts", *p)).collect();
    let device = common_device(OP, &named)?;
    let total = widths
        .iter()
        .try_fold(0usize, |n, &w| n.checked_add(w))
        .ok_or_else(|| shape_error(OP, "parts", first, "widths whose sum fits usize".into()))?;
    let mut out = Tensor::empty(&device, first.dtype(), &[t, total])?;
    let mut col = 0;
    // An empty part copies nothing (its T may be huge: no loop over it).
    for (p, &w) in parts.iter().zip(&widths).filter(|&(_, &w)| w > 0) {
        match &device {
            Device::Cpu => {
                // In range: the output of [t, total] elements was allocated.
                for r in 0..t {
                    out.copy_elems_from(r * total + col, p, r * w, w)?;
                }
            }
            #[cfg(deepinfer_cuda)]
            Device::Cuda(dev) => {
                let bytes = |n: usize| first.dtype().storage_bytes(n);
                let (width, pitch, at) = (bytes(w), bytes(total), bytes(col));
                crate::cuda_backend::copy_cols(dev, p, &mut out, t, width, pitch, at)?;
            }
            #[cfg(not(deepinfer_cuda))]
            d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, d)),
        }
        col += w;
    }
    Ok(out)
}

/// a + b elementwise for F32 tensors of one shape (the DSpark Markov bias).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "add";
    a.expect_dtype(OP, "a", DType::F32)?;
    b.expect_dtype(OP, "b", DType::F32)?;
    if a.shape() != b.shape() {
        return Err(shape_error(
            OP,
            "b",
            b,
            format!("{:?} (a's shape)", a.shape()),
        ));
    }
    let device = common_device(OP, &[("a", a), ("b", b)])?;
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = Tensor::empty(&a.device(), DType::F32, a.shape())?;
            crate::cuda_backend::add_f32(&dev, a, b, &mut out)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let out = a
        .as_slice::<f32>()?
        .iter()
        .zip(b.as_slice::<f32>()?)
        .map(|(x, y)| x + y)
        .collect();
    Tensor::from_vec(out, a.shape())
}
