//! Launches of `kernels-cuda/elementwise/`: x · s, x / s, a + b and one
//! part of `cat_cols` (a strided byte copy). Grid-stride kernels, 256
//! threads; the caller ([`crate::ops`]) has validated dtypes and shapes.

use super::params::{di_copy_cols_params, di_elementwise_params};
use super::{flat_launch, launch, read_ptr, row_launch, write_ptr};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels;
use crate::tensor::Tensor;

/// The scalar ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarOp {
    Mul,
    Div,
}

/// `out = x · s` or `x / s` for BF16 or F32 `x` (out of x's dtype and shape).
pub fn scalar(dev: &CudaDevice, x: &Tensor, s: f32, op: ScalarOp, out: &mut Tensor) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let kernel = match (op, x.dtype()) {
        (ScalarOp::Mul, DType::BF16) => kernels::elementwise::SCALE_BF16,
        (ScalarOp::Mul, _) => kernels::elementwise::SCALE_F32,
        (ScalarOp::Div, DType::BF16) => kernels::elementwise::DIV_BF16,
        (ScalarOp::Div, _) => kernels::elementwise::DIV_F32,
    };
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (op_, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_elementwise_params {
        a: xp,
        b: std::ptr::null(),
        out: op_,
        n: n as i64,
        s,
    };
    launch(dev, kernel, flat_launch(n), &p)
}

/// `out = a + b` for F32 tensors of one shape.
pub fn add_f32(dev: &CudaDevice, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<()> {
    let n = a.numel();
    if n == 0 {
        return Ok(());
    }
    let (ap, _ga) = read_ptr(a.cuda()?, dev);
    let (bp, _gb) = read_ptr(b.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_elementwise_params {
        a: ap,
        b: bp,
        out: op,
        n: n as i64,
        s: 0.0,
    };
    launch(dev, kernels::elementwise::ADD_F32, flat_launch(n), &p)
}

/// Bytes `[rows, width]` of `src` into columns `col .. col + width` of the
/// rows of `dst` (`dst_pitch` bytes a row): one part of `cat_cols`.
pub fn copy_cols(
    dev: &CudaDevice,
    src: &Tensor,
    dst: &mut Tensor,
    rows: usize,
    width: usize,
    dst_pitch: usize,
    col: usize,
) -> Result<()> {
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let (sp, _gs) = read_ptr(src.cuda()?, dev);
    let (dp, _gd) = write_ptr(dst.cuda_mut()?, dev);
    let p = di_copy_cols_params {
        src: sp,
        dst: dp,
        rows: rows as i64,
        width: width as i64,
        dst_pitch: dst_pitch as i64,
        dst_col: col as i64,
    };
    launch(
        dev,
        kernels::elementwise::COPY_COLS,
        row_launch(rows, width, 256)?,
        &p,
    )
}
