//! Launches of `kernels-cuda/embedding/`: the embedding gather (one CTA per
//! token), the greedy argmax (one CTA of `DI_ARGMAX_THREADS` per row,
//! a fixed tree: the result is numerics::argmax's, whatever the batch) and
//! each row's first non-finite index (the same launch).

use super::params::{DI_ARGMAX_THREADS, di_argmax_params, di_embedding_params};
use super::{BadSlots, grid_for, launch, read_ptr, row_launch, write_ptr};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::kernels::{self, KernelRef};
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// `out[t] = table[ids[t]]` for BF16 `table` `[vocab, d]`, I32 `ids`
/// `[tokens]`. The first position whose id is outside the table (its row
/// is not written) goes to slot `slot` of `bad` (nothing waits here).
pub fn embedding(
    dev: &CudaDevice,
    table: &Tensor,
    ids: &Tensor,
    out: &mut Tensor,
    (vocab, d): (usize, usize),
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    let tokens = ids.numel();
    if tokens == 0 {
        return Ok(());
    }
    {
        let (tp, _gt) = read_ptr(table.cuda()?, dev);
        let (ip, _gi) = read_ptr(ids.cuda()?, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev, slot)?;
        let p = di_embedding_params {
            table: tp,
            ids: ip.cast(),
            out: op,
            bad: bp,
            tokens: tokens as i64,
            vocab: vocab as i64,
            d: d as i64,
        };
        let per_thread = if d.is_multiple_of(8) { d / 8 } else { d };
        let cfg = row_launch(tokens, per_thread, 256)?;
        launch(dev, kernels::embedding::EMBEDDING_BF16, cfg, &p)?;
    }
    Ok(())
}

/// Each row's argmax of F32 `logits` `[rows, v]` into I32 `out` `[rows]`.
pub fn argmax(
    dev: &CudaDevice,
    logits: &Tensor,
    out: &mut Tensor,
    rows: usize,
    v: usize,
) -> Result<()> {
    row_scan(dev, kernels::embedding::ARGMAX_F32, logits, out, rows, v)
}

/// Each row's lowest index of a NaN or ±Inf in F32 `x` `[rows, v]` into
/// I32 `out` `[rows]` (−1 for a finite row).
pub fn first_non_finite(
    dev: &CudaDevice,
    x: &Tensor,
    out: &mut Tensor,
    rows: usize,
    v: usize,
) -> Result<()> {
    row_scan(
        dev,
        kernels::embedding::FIRST_NON_FINITE_F32,
        x,
        out,
        rows,
        v,
    )
}

/// One CTA of `DI_ARGMAX_THREADS` per row of F32 `x` `[rows, v]`, one I32
/// result a row: the launch `argmax_f32` and `first_non_finite_f32` share.
fn row_scan(
    dev: &CudaDevice,
    kernel: KernelRef,
    x: &Tensor,
    out: &mut Tensor,
    rows: usize,
    v: usize,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_argmax_params {
        x: xp.cast(),
        out: op.cast(),
        rows: rows as i64,
        v: super::i32_param("v", v)?,
    };
    let cfg = LaunchConfig {
        grid_dim: (grid_for(rows, 1), 1, 1),
        block_dim: (DI_ARGMAX_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernel, cfg, &p)
}
