//! Cache-row writer launches (`kernels-cuda/kv/`): `kv_rows_bf16` (BF16 rows:
//! window rows, ratio-1 entries, index keys) and `kv_rows_pool2` (the ratio-2
//! compressor's pooled entries), each with the optional RMSNorm, latent
//! output, RoPE and the encoded row stored at a slot of a row pool. Callers
//! are the validated wrappers of [`crate::ops`] (dtypes, shapes and devices
//! checked there); this checks the kernel's own limits and sizes the grid.

use super::params::di_kv_rows_params;
use super::{i32_param, u32_param};
use super::{launch, read_ptr, write_ptr};
use crate::contract::{KV_ROWS_CUDA_MAX_DIM, KV_ROWS_CUDA_MAX_ROPE_DIM, KvRowFormat};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;
use std::ffi::c_void;

/// Rows and threads per CTA of the BF16 and the pooling kernel
/// (`DI_KV_ROWS_BF16`, `DI_KV_THREADS_BF16`, `DI_KV_ROWS_POOL2`,
/// `DI_KV_THREADS_POOL2`).
const ROWS_BF16: usize = 32;
const THREADS_BF16: u32 = 256;
const ROWS_POOL2: usize = 8;
const THREADS_POOL2: u32 = 128;

/// What a row writer reads.
pub(crate) enum KvInput<'a> {
    /// BF16 `[rows, dim]`.
    Bf16(&'a Tensor),
    /// The ratio-2 pooling of F32 `kv`/`score` rows (and the pending pair's):
    /// `groups` I32 `[rows, 2]`, or consecutive pairs when `None`.
    Pool2 {
        kv: &'a Tensor,
        score: &'a Tensor,
        pending: Option<(&'a Tensor, &'a Tensor)>,
        groups: Option<&'a Tensor>,
    },
}

/// One validated row-writer call.
pub(crate) struct KvRowsCall<'a> {
    pub input: KvInput<'a>,
    pub rows: usize,
    pub dim: usize,
    pub format: KvRowFormat,
    /// BF16 weight `[dim]` and eps.
    pub norm: Option<(&'a Tensor, f32)>,
    /// I64 positions `[rows]` and the layer's frequency table.
    pub rope: Option<(&'a Tensor, Vec<f32>)>,
    /// BF16 `[rows, dim]`.
    pub latent: Option<&'a mut Tensor>,
    /// The row pool and the I32 slot per row (row i → pool row i if `None`).
    pub out: Option<(&'a mut Tensor, Option<&'a Tensor>)>,
}

fn limit(op: &'static str, arg: &'static str, value: usize, why: &'static str) -> Error {
    Error::Argument {
        op,
        arg,
        value: value.to_string(),
        why,
    }
}

/// Launches the row writer for `c` (nothing for zero rows).
pub(crate) fn kv_rows<'a>(dev: &'a CudaDevice, op: &'static str, c: KvRowsCall<'a>) -> Result<()> {
    if c.dim > KV_ROWS_CUDA_MAX_DIM || !c.dim.is_multiple_of(8) {
        return Err(limit(
            op,
            "dim",
            c.dim,
            "the CUDA row writer takes rows of a multiple of 8 values, at most 4096",
        ));
    }
    if let KvInput::Pool2 { kv, .. } = c.input
        && kv.rows() > i32::MAX as usize
    {
        return Err(limit(
            op,
            "kv",
            kv.rows(),
            "the CUDA compressor addresses kv rows with 32-bit group members",
        ));
    }
    let freqs = c.rope.as_ref().map(|(_, f)| f.as_slice()).unwrap_or(&[]);
    let rope_dim = 2 * freqs.len();
    if !rope_dim.is_multiple_of(8) || rope_dim > KV_ROWS_CUDA_MAX_ROPE_DIM {
        return Err(limit(
            op,
            "rope_dim",
            rope_dim,
            "the CUDA row writer needs a multiple of 8, at most 256",
        ));
    }
    if c.rows == 0 {
        return Ok(());
    }
    let (tile, threads) = match c.input {
        KvInput::Bf16(_) => (ROWS_BF16, THREADS_BF16),
        KvInput::Pool2 { .. } => (ROWS_POOL2, THREADS_POOL2),
    };
    let ctas = u32::try_from(c.rows.div_ceil(tile))
        .map_err(|_| limit(op, "rows", c.rows, "more rows than the CUDA grid takes"))?;
    let null = std::ptr::null::<c_void>();
    let ptr = |t: &'a Tensor| -> Result<_> { Ok(read_ptr(t.cuda()?, dev)) };
    let mut table = [0.0f32; KV_ROWS_CUDA_MAX_ROPE_DIM / 2];
    for (t, &f) in table.iter_mut().zip(freqs) {
        *t = f;
    }
    let (kernel, x_p, kv_p, score_p, pend_p, groups_p, kv_rows, pending_rows) = match c.input {
        KvInput::Bf16(x) => (
            kernels::kv::KV_ROWS_BF16,
            Some(ptr(x)?),
            None,
            None,
            None,
            None,
            0,
            0,
        ),
        KvInput::Pool2 {
            kv,
            score,
            pending,
            groups,
        } => (
            kernels::kv::KV_ROWS_POOL2,
            None,
            Some(ptr(kv)?),
            Some(ptr(score)?),
            pending.map(|(k, s)| Ok((ptr(k)?, ptr(s)?))).transpose()?,
            groups.map(ptr).transpose()?,
            kv.rows(),
            pending.map_or(0, |(k, _)| k.rows()),
        ),
    };
    let norm_p = c.norm.map(|(w, _)| ptr(w)).transpose()?;
    let pos_p = c.rope.as_ref().map(|(p, _)| ptr(p)).transpose()?;
    let slots_p = c.out.as_ref().and_then(|(_, s)| s.map(ptr)).transpose()?;
    let out_rows = c.out.as_ref().map_or(0, |(pool, _)| pool.rows());
    let out_p = match c.out {
        Some((pool, _)) => Some(write_ptr(pool.cuda_mut()?, dev)),
        None => None,
    };
    let latent_p = match c.latent {
        Some(l) => Some(write_ptr(l.cuda_mut()?, dev)),
        None => None,
    };
    let r = |p: &Option<(*const c_void, _)>| p.as_ref().map_or(null, |(p, _)| *p);
    let p = di_kv_rows_params {
        x: r(&x_p),
        kv: r(&kv_p).cast(),
        score: r(&score_p).cast(),
        pending_kv: pend_p.as_ref().map_or(null, |(k, _)| k.0).cast(),
        pending_score: pend_p.as_ref().map_or(null, |(_, s)| s.0).cast(),
        groups: r(&groups_p).cast(),
        norm: r(&norm_p),
        positions: r(&pos_p).cast(),
        latent: latent_p.as_ref().map_or(std::ptr::null_mut(), |(p, _)| *p),
        out: out_p.as_ref().map_or(std::ptr::null_mut(), |(p, _)| *p),
        slots: r(&slots_p).cast(),
        rows: c.rows as i64,
        kv_rows: kv_rows as i64,
        pending_rows: pending_rows as i64,
        out_rows: out_rows as i64,
        dim: i32_param("dim", c.dim)?,
        rope_dim: i32_param("rope_dim", rope_dim)?,
        // DI_KV_FORMAT_WINDOW, _COMPRESSED, _INDEX_KEY (params.h).
        format: match c.format {
            KvRowFormat::Window => 0,
            KvRowFormat::Compressed => 1,
            KvRowFormat::IndexKey => 2,
        },
        eps: c.norm.map_or(0.0, |(_, e)| e),
        freqs: table,
    };
    let smem = u32_param(
        "shared memory",
        tile * (2 * c.dim + 16 + 4 * rope_dim + 48) + 2 * c.dim,
    )?;
    if smem > 48 << 10 {
        dev.allow_dynamic_smem(kernel, smem)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (ctas, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    };
    // What `launch` relies on: every address comes from a live buffer whose
    // guard (x_p … latent_p) is held until after the launch; the frequency
    // table travels by value in the struct; the caller validated
    // x/kv/score/pending [.., dim], groups [rows, 2], norm [dim], positions,
    // slots [rows], latent [rows, dim] and the pool [out_rows, row bytes of
    // the format], which bound everything the kernel touches; the kernel
    // checks group members and slots against kv_rows, pending_rows and
    // out_rows; the pool and latent are written only and are distinct from
    // every input (&mut borrows).
    launch(dev, kernel, cfg, &p)
}
