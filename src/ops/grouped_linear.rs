//! The grouped output LoRA `wo_a` (`v41-flash.md` §3.1 step 6): the
//! attention output `[T, G·K]` is cut into G column groups, group g is
//! multiplied by its own BF16 block `w[g·N .. (g+1)·N]` (`[N, K]`) with
//! fp32 accumulation and one BF16 rounding, and the G results are laid side
//! by side, `[T, G·N]` (a block-diagonal BF16 linear).
//!
//! Invariant: on the CPU, bitwise [`cpu_backend::bf16_gemm`] per group
//! (products summed in increasing k); on CUDA, one cuBLAS strided batched
//! GEMM with FP32 compute (the order of its sums is cuBLAS's, like
//! [`super::bf16_linear`]; on a batch-invariant device, the same pinned
//! cuBLASLt algorithm, so a row does not depend on T).
//!
//! [`cpu_backend::bf16_gemm`]: crate::cpu_backend::bf16_gemm

use super::{common_device, shape_error};
use crate::cpu_backend::bf16_gemm;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use half::bf16;

const OP: &str = "grouped_bf16_linear";

/// BF16 `x` `[T, G·K]` times the G blocks of BF16 `w` `[G·N, K]`:
/// a new BF16 `[T, G·N]`.
pub fn grouped_bf16_linear(x: &Tensor, w: &Tensor, groups: usize) -> Result<Tensor> {
    let (device, (t, gn, _, _)) = validate(x, w, groups)?;
    let mut out = Tensor::empty(&device, DType::BF16, &[t, gn])?;
    grouped_bf16_linear_into(x, w, groups, &mut out)?;
    Ok(out)
}

/// [`grouped_bf16_linear`] into a preallocated BF16 `out` `[T, G·N]` on the
/// inputs' device.
pub fn grouped_bf16_linear_into(
    x: &Tensor,
    w: &Tensor,
    groups: usize,
    out: &mut Tensor,
) -> Result<()> {
    let (_, (t, gn, n, k)) = validate(x, w, groups)?;
    out.expect_output(OP, "out", DType::BF16, &[t, gn])?;
    let device = common_device(OP, &[("x", x), ("w", w), ("out", out)])?;
    if t == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let dims = (t, groups, n, k);
            return if dev.batch_invariant() {
                crate::cuda_backend::blas::pinned_bf16_linear(&dev, x, w, out, dims)
            } else {
                crate::cuda_backend::blas::grouped_bf16_linear(&dev, x, w, out, dims)
            };
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let gk = groups * k;
    let (xs, ws) = (x.as_slice::<bf16>()?, w.as_slice::<bf16>()?);
    let ys = out.as_mut_slice::<bf16>()?;
    for g in 0..groups {
        let xg: Vec<bf16> = xs
            .chunks_exact(gk)
            .flat_map(|r| r[g * k..(g + 1) * k].iter().copied())
            .collect();
        let yg = bf16_gemm(&xg, &ws[g * n * k..(g + 1) * n * k], t, n, k);
        for (r, y) in yg.chunks_exact(n).enumerate() {
            ys[r * gn + g * n..r * gn + (g + 1) * n].copy_from_slice(y);
        }
    }
    Ok(())
}

/// Checks dtypes and shapes: the common device and (T, G·N, N, K).
fn validate(
    x: &Tensor,
    w: &Tensor,
    groups: usize,
) -> Result<(Device, (usize, usize, usize, usize))> {
    x.expect_dtype(OP, "x", DType::BF16)?;
    w.expect_dtype(OP, "w", DType::BF16)?;
    if groups == 0 {
        return Err(Error::Argument {
            op: OP,
            arg: "groups",
            value: "0".into(),
            why: "at least one group",
        });
    }
    let &[t, gk] = x.shape() else {
        return Err(shape_error(OP, "x", x, "[T, G·K]".into()));
    };
    let &[gn, k] = w.shape() else {
        return Err(shape_error(OP, "w", w, "[G·N, K]".into()));
    };
    if k == 0 || groups.checked_mul(k) != Some(gk) {
        return Err(shape_error(
            OP,
            "x",
            x,
            format!("[T, {groups} × {k}] (groups × w's K)"),
        ));
    }
    if gn == 0 || !gn.is_multiple_of(groups) {
        return Err(shape_error(
            OP,
            "w",
            w,
            format!("[G·N, {k}] with G = {groups} dividing the rows"),
        ));
    }
    if t.checked_mul(gn).is_none() {
        return Err(shape_error(
            OP,
            "w",
            w,
            format!("[G·N, {k}] with T × G·N in usize"),
        ));
    }
    let device = common_device(OP, &[("x", x), ("w", w)])?;
    Ok((device, (t, gn, gn / groups, k)))
}
