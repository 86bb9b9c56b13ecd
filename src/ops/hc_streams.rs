//! The mHC residual streams outside a sublayer (`v41-flash.md` §6, §9.1):
//! [`hc_init`] copies each token's embedding into the 4 streams,
//! [`hc_collapse`] mixes them with a pre vector (the final collapse before
//! the head), [`hc_stream_mean`] averages them (the DSpark target features).
//!
//! Invariant: bitwise [`cpu_backend::mhc::hc_collapse`] and the fp32 stream
//! sum divided by 4 per element, on either device (the CUDA kernels use the
//! same IEEE operations in the same order).
//!
//! [`cpu_backend::mhc::hc_collapse`]: crate::cpu_backend::mhc::hc_collapse

use super::{common_device, shape_error};
use crate::cpu_backend::mhc::{HC_STREAMS, hc_collapse as collapse};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use half::bf16;

fn streams_dims(op: &'static str, s: &Tensor) -> Result<(usize, usize)> {
    s.expect_dtype(op, "streams", DType::BF16)?;
    match *s.shape() {
        [t, HC_STREAMS, d] => Ok((t, d)),
        _ => Err(shape_error(
            op,
            "streams",
            s,
            format!("[T, {HC_STREAMS}, D]"),
        )),
    }
}

/// The CUDA path of the three ops, or `None` on the CPU.
fn on_cuda(
    op: &'static str,
    which: StreamOp,
    x: &Tensor,
    pre: Option<&Tensor>,
    out_shape: &[usize],
) -> Result<Option<Tensor>> {
    match x.device() {
        Device::Cpu => Ok(None),
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let _ = op; // named by the no-kernel error of a CPU-only build
            let mut out = Tensor::empty(&x.device(), DType::BF16, out_shape)?;
            let (t, d) = (x.rows(), x.shape().last().copied().unwrap_or(0));
            crate::cuda_backend::hc_streams(&dev, which.into(), x, pre, &mut out, t, d)?;
            Ok(Some(out))
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = (which, pre, out_shape);
            Err(super::kernels_not_built(op, &d))
        }
    }
}

#[derive(Clone, Copy)]
enum StreamOp {
    Init,
    Collapse,
    Mean,
}

#[cfg(deepinfer_cuda)]
impl From<StreamOp> for crate::cuda_backend::HcOp {
    fn from(op: StreamOp) -> Self {
        use crate::cuda_backend::HcOp;
        match op {
            StreamOp::Init => HcOp::Init,
            StreamOp::Collapse => HcOp::Collapse,
            StreamOp::Mean => HcOp::Mean,
        }
    }
}

/// BF16 `x` `[T, D]` → streams `[T, 4, D]`, each stream a copy of x.
pub fn hc_init(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "hc_init";
    x.expect_dtype(OP, "x", DType::BF16)?;
    let &[t, d] = x.shape() else {
        return Err(shape_error(OP, "x", x, "[T, D]".into()));
    };
    if let Some(out) = on_cuda(OP, StreamOp::Init, x, None, &[t, HC_STREAMS, d])? {
        return Ok(out);
    }
    let out: Vec<bf16> = x
        .as_slice::<bf16>()?
        .chunks_exact(d.max(1))
        .flat_map(|r| r.repeat(HC_STREAMS))
        .collect();
    Tensor::from_vec(out, &[t, HC_STREAMS, d])
}

/// u = BF16(Σ_i pre_i · S_i) per token, for F32 `pre` `[T, 4]`: BF16 `[T, D]`.
pub fn hc_collapse(streams: &Tensor, pre: &Tensor) -> Result<Tensor> {
    const OP: &str = "hc_collapse";
    let (t, d) = streams_dims(OP, streams)?;
    pre.expect_dtype(OP, "pre", DType::F32)?;
    if pre.shape() != [t, HC_STREAMS] {
        return Err(shape_error(OP, "pre", pre, format!("[{t}, {HC_STREAMS}]")));
    }
    common_device(OP, &[("streams", streams), ("pre", pre)])?;
    if let Some(out) = on_cuda(OP, StreamOp::Collapse, streams, Some(pre), &[t, d])? {
        return Ok(out);
    }
    if d == 0 {
        // No row to sum (and no zero-width chunks to walk).
        return Tensor::from_vec(Vec::<bf16>::new(), &[t, 0]);
    }
    let (s, p) = (streams.as_slice::<bf16>()?, pre.as_slice::<f32>()?);
    let mut out: Vec<bf16> = Vec::with_capacity(t * d);
    for (st, pre) in s
        .chunks_exact(HC_STREAMS * d)
        .zip(p.chunks_exact(HC_STREAMS))
    {
        out.extend(collapse(st, &super::array(OP, "pre", pre)?));
    }
    Tensor::from_vec(out, &[t, d])
}

/// BF16(Σ_i S_i / 4) per element (fp32 sum in stream order): BF16 `[T, D]`.
pub fn hc_stream_mean(streams: &Tensor) -> Result<Tensor> {
    const OP: &str = "hc_stream_mean";
    let (t, d) = streams_dims(OP, streams)?;
    if let Some(out) = on_cuda(OP, StreamOp::Mean, streams, None, &[t, d])? {
        return Ok(out);
    }
    if d == 0 {
        // No loop over T empty rows (T may be 2^62 for 0 elements).
        return Tensor::from_vec(Vec::<bf16>::new(), &[t, 0]);
    }
    let s = streams.as_slice::<bf16>()?;
    let out: Vec<bf16> = (0..t)
        .flat_map(|i| {
            let st = &s[i * HC_STREAMS * d..(i + 1) * HC_STREAMS * d];
            (0..d).map(move |x| {
                let sum: f32 = (0..HC_STREAMS).map(|c| st[c * d + x].to_f32()).sum();
                bf16::from_f32(sum / HC_STREAMS as f32)
            })
        })
        .collect();
    Tensor::from_vec(out, &[t, d])
}
