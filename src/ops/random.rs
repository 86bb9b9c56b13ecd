//! [`random_param`]: the random-weight generator's stored tensors of one
//! parameter ([`crate::weight_rng`]), made on the device that will hold
//! them, so a GPU model of random weights needs no host bytes.
//!
//! Invariant: on either device, the tensors' bytes are
//! `weight_rng::encode_rows(format, rows, cols, values(p, 0..rows·cols))`,
//! bit for bit (the CUDA kernels repeat the same IEEE operations unfused).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::weight_rng::{self, Format, RandomParam};

/// The stored tensors of `p` on `device`: the values `[rows, cols]` (F32,
/// BF16, e4m3, or packed e2m1 pairs), then the E8M0 scale grid of a
/// quantised format ([`RandomParam::stored`]).
pub fn random_param(device: &Device, p: &RandomParam) -> Result<Vec<Tensor>> {
    const OP: &str = "random_param";
    let bad = |arg: &'static str, value: String, why: &'static str| Error::Argument {
        op: OP,
        arg,
        value,
        why,
    };
    if let Format::Fp8Block([br, bc]) = p.format
        && (br == 0 || bc == 0)
    {
        return Err(bad(
            "format",
            format!("{:?}", p.format),
            "FP8 blocks of at least one row and one column",
        ));
    }
    if p.format == Format::Fp4 && !p.cols.is_multiple_of(2) {
        return Err(bad(
            "cols",
            p.cols.to_string(),
            "packed FP4 rows hold an even count of values",
        ));
    }
    if !(p.mean.is_finite() && p.std.is_finite()) {
        return Err(bad(
            "mean, std",
            format!("{}, {}", p.mean, p.std),
            "a finite distribution",
        ));
    }
    let n = p
        .rows
        .checked_mul(p.cols)
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| {
            bad(
                "rows, cols",
                format!("{}, {}", p.rows, p.cols),
                "a parameter whose f32 values fit the address space",
            )
        })?;
    let stored = p.stored();
    let out = match device {
        Device::Cpu => {
            let bytes =
                weight_rng::encode_rows(p.format, p.rows, p.cols, &weight_rng::values(p, 0..n));
            stored
                .iter()
                .zip(&bytes)
                .map(|((dtype, shape), b)| Tensor::from_le_bytes(device, *dtype, shape, b))
                .collect::<Result<Vec<_>>>()?
        }
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let mut out = stored
                .iter()
                .map(|(dtype, shape)| Tensor::empty(device, *dtype, shape))
                .collect::<Result<Vec<_>>>()?;
            let (values, scales) = match out.split_first_mut() {
                Some((v, rest)) => (v, rest.first_mut()),
                None => return Err(bad("format", format!("{:?}", p.format), "no stored tensor")),
            };
            crate::cuda_backend::random_param(dev, p, values, scales)?;
            out
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, d)),
    };
    Ok(out)
}
