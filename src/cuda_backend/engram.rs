//! Launches of `kernels-cuda/engram/`: the n-gram table rows (the layer's
//! multipliers, primes and offsets travel by value in the parameter
//! struct), the FP8 row lookup, and the gate and update (one CTA per token
//! and stream, the block size chosen from D alone).

use super::params::{
    DI_ENGRAM_MAX_COLS, di_engram_gate_params, di_engram_lookup_params, di_engram_rows_params,
};
use super::{BadSlots, flat_launch, grid_for, i32_param, launch, read_ptr, write_ptr};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// A layer's hash constants, as the kernel takes them.
pub struct EngramHash<'a> {
    pub multipliers: &'a [i64; 4],
    /// Column order; positive, their sum below 2^63 (checked by the op).
    pub primes: &'a [u64],
}

/// Table rows I64 `[tokens, cols]` of the n-gram ids I64 `[tokens, 4]`.
pub fn engram_rows(
    dev: &CudaDevice,
    ids: &Tensor,
    hash: &EngramHash<'_>,
    out: &mut Tensor,
    tokens: usize,
) -> Result<()> {
    let cols = hash.primes.len();
    if cols > DI_ENGRAM_MAX_COLS as usize {
        return Err(Error::Unsupported {
            op: "engram_rows",
            device: "cuda".into(),
            why: "more than 64 table columns (V4.1 has 24)",
        });
    }
    if tokens == 0 {
        return Ok(());
    }
    let mut primes = [0i64; DI_ENGRAM_MAX_COLS as usize];
    let mut offsets = [0i64; DI_ENGRAM_MAX_COLS as usize];
    let mut offset = 0i64;
    for ((p, o), &prime) in primes.iter_mut().zip(&mut offsets).zip(hash.primes) {
        // The op checked that the primes' sum fits i64.
        *p = i64::try_from(prime).unwrap_or(i64::MAX);
        *o = offset;
        offset = offset.saturating_add(*p);
    }
    let (ip, _gi) = read_ptr(ids.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_engram_rows_params {
        ids: ip.cast(),
        rows: op.cast(),
        tokens: tokens as i64,
        multipliers: *hash.multipliers,
        primes,
        offsets,
        cols: i32_param("cols", cols)?,
        heads: i32_param("heads", cols / 3)?,
    };
    let cfg = flat_launch(tokens.saturating_mul(cols));
    launch(dev, kernels::engram::ENGRAM_ROWS, cfg, &p)
}

/// BF16 `out` `[entries, head_dim]` from the FP8 table rows `rows` I64
/// `[entries]`. The first entry whose row is outside the table (skipped)
/// goes to slot `slot` of `bad` (nothing waits here).
pub fn engram_lookup(
    dev: &CudaDevice,
    table: &Tensor,
    rows: &Tensor,
    out: &mut Tensor,
    (table_rows, head_dim): (usize, usize),
    (bad, slot): (&mut BadSlots, usize),
) -> Result<()> {
    let entries = rows.numel();
    if entries == 0 {
        return Ok(());
    }
    {
        let (tp, _gt) = read_ptr(table.cuda()?, dev);
        let (rp, _gr) = read_ptr(rows.cuda()?, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        let (bp, _gb) = bad.ptr(dev, slot)?;
        let p = di_engram_lookup_params {
            table: tp.cast(),
            rows: rp.cast(),
            out: op,
            bad: bp,
            entries: entries as i64,
            table_rows: table_rows as i64,
            head_dim: i32_param("head_dim", head_dim)?,
        };
        // A warp per looked-up row. 8-byte words when every row starts on
        // one (V4.1's 264-byte rows); the values are the same either way.
        let words = head_dim.is_multiple_of(8)
            && (head_dim + head_dim / 32).is_multiple_of(8)
            && (tp as usize).is_multiple_of(8)
            && (op as usize).is_multiple_of(16);
        let kernel = if words {
            kernels::engram::ENGRAM_LOOKUP_BF16X8
        } else {
            kernels::engram::ENGRAM_LOOKUP_BF16
        };
        let cfg = LaunchConfig {
            grid_dim: (grid_for(entries, LOOKUP_WARPS as usize), 1, 1),
            block_dim: (32 * LOOKUP_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(dev, kernel, cfg, &p)?;
    }
    Ok(())
}

/// The gated update of `c` streams of width `d` per token (see the op).
#[allow(clippy::too_many_arguments)]
pub fn engram_gate_update(
    dev: &CudaDevice,
    streams: &Tensor,
    kv: &Tensor,
    q_weight: &Tensor,
    k_weight: &Tensor,
    out: &mut Tensor,
    (tokens, c, d): (usize, usize, usize),
    eps: f32,
) -> Result<()> {
    let units = tokens.saturating_mul(c);
    if units == 0 || d == 0 {
        return Ok(());
    }
    let (sp, _gs) = read_ptr(streams.cuda()?, dev);
    let (kp, _gk) = read_ptr(kv.cuda()?, dev);
    let (qp, _gq) = read_ptr(q_weight.cuda()?, dev);
    let (wp, _gw) = read_ptr(k_weight.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let p = di_engram_gate_params {
        streams: sp,
        kv: kp,
        q_weight: qp,
        k_weight: wp,
        out: op,
        tokens: tokens as i64,
        c: i32_param("streams", c)?,
        d: i32_param("d", d)?,
        eps,
        inv_sqrt_d: crate::numerics::round_f32((d as f64).powf(-0.5)),
    };
    // A CTA per (token, stream). The two kernels sum in different
    // orders; the choice depends on D and the buffers' alignment, and every
    // buffer is a whole allocation (256-byte aligned), so in effect on D
    // alone: the order is the same at every batch. The alignment check only
    // keeps a misaligned buffer off the 16-byte path.
    let aligned = [sp, kp, qp, wp, op.cast_const()]
        .iter()
        .all(|&a| (a as usize).is_multiple_of(16));
    let kernel = if d.is_multiple_of(8) && aligned {
        kernels::engram::ENGRAM_GATE_UPDATE_BF16X8
    } else {
        kernels::engram::ENGRAM_GATE_UPDATE_BF16
    };
    let cfg = LaunchConfig {
        grid_dim: (grid_for(units, 1), 1, 1),
        block_dim: (GATE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(dev, kernel, cfg, &p)
}

/// Threads per CTA of the gate update (`GATE_THREADS` in engram.cu).
const GATE_THREADS: u32 = 256;
/// Rows looked up per CTA (`LOOKUP_WARPS` in engram.cu), a warp each.
const LOOKUP_WARPS: u32 = 8;
