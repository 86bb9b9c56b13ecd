//! Row gather: `out[i] = x[rows[i]]` for a tensor of any dtype and rank ≥ 1
//! (rank ≥ 2 for packed FP4, whose rows are whole bytes), by a host index
//! list. The expert-parallel dispatch and combine move their rows with it.
//!
//! Invariant: every index is checked against x's rows before anything is
//! copied (a typed error names the first bad one); the CPU copies each run
//! of consecutive indices at once, CUDA gathers the whole list in one
//! launch (`kernels-cuda/gather/`), bitwise the same rows.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const OP: &str = "gather_rows";

/// Rows `rows[0], rows[1], …` of `x` as a new tensor on x's device
/// (`[rows.len(), …]`); an index may repeat.
pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let Some(&n_rows) = x.shape().first() else {
        return Err(super::shape_error(OP, "x", x, "rank >= 1".into()));
    };
    if x.dtype() == DType::F4E2M1x2 && x.shape().len() == 1 {
        return Err(super::shape_error(
            OP,
            "x",
            x,
            "rank >= 2 (a packed FP4 row of rank 1 is half a byte)".into(),
        ));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= n_rows) {
        return Err(Error::Argument {
            op: OP,
            arg: "rows",
            value: bad.to_string(),
            why: "a row index at or past x's rows",
        });
    }
    let shape: Vec<usize> = std::iter::once(rows.len())
        .chain(x.shape().iter().skip(1).copied())
        .collect();
    let mut out = Tensor::empty(&x.device(), x.dtype(), &shape)?;
    match x.device() {
        Device::Cpu => {}
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => {
            let row_bytes = x.dtype().storage_bytes(x.shape().iter().skip(1).product());
            crate::cuda_backend::gather_rows(&dev, x, rows, &mut out, row_bytes)?;
            return Ok(out);
        }
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => return Err(super::kernels_not_built(OP, &d)),
    }
    let mut at = 0;
    while let Some(rest @ [start, ..]) = rows.get(at..) {
        let start = *start;
        let run = rest
            .iter()
            .zip(start..)
            .take_while(|&(&r, want)| r == want)
            .count();
        out.copy_rows_from(at, x, start, run)?;
        at += run;
    }
    Ok(out)
}
