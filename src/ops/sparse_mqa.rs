//! Sparse MQA over V4.1's native cache rows (`v41-flash.md` §3.3, §3.8,
//! §3.10, §11): every query head attends to one shared latent (K = V) chosen
//! per query from two flat row pools, the FP8 window rows and the FP4
//! compressed rows, with a per-head sink; on the CPU reference or the CUDA
//! kernel of `kernels-cuda/attention/`.
//!
//! Rows are [`crate::kv_format`]'s: a window row is `D` e4m3
//! bytes then `D/32` E8M0 scales ([`kv_format::window_row_bytes`], 528 at
//! D 512); a compressed row is `D/2` packed e2m1 bytes then `D/16` e4m3
//! scales ([`kv_format::compressed_row_bytes`], 288). Row numbers are
//! physical rows of the pools (a paged cache translates positions through its
//! block table before the call).
//!
//! Invariants a caller must know: query t attends to the list
//! `window_idx[t] ‖ compressed_idx[t]` in that order, walked in blocks of 64
//! with the reference's numerics ([`cpu_backend::sparse_attention::sparse_mqa`]);
//! an entry below 0 or at or beyond its pool's row count is "no row" and is
//! never read; duplicates are attended twice; the sink joins the denominator
//! only; a query with no valid row outputs zeros and lse = +∞. On the CPU the
//! result is bitwise the reference applied to the decoded rows
//! `[window rows ‖ compressed rows]` with the compressed indices offset by
//! `Nw`. One query's result never depends on the other queries or on `T`.

use super::{common_device, shape_error};
pub use crate::contract::{
    SPARSE_MQA_CUDA_DIM, SPARSE_MQA_CUDA_HEAD_GROUP, SPARSE_MQA_GENERIC_MAX_DIM,
    SPARSE_MQA_SPLIT_UNIT, SparseMqaKernel, SparseMqaShape, SparseMqaSplit,
};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::{cpu_backend, kv_format};
use half::bf16;

const OP: &str = "sparse_mqa";

/// Queries from which the CPU path spreads the queries over threads.
const PARALLEL_QUERIES: usize = 64;

/// Attention of BF16 `q` `[T, H, D]` (D a positive multiple of 64; on CUDA
/// D ≤ 4096 and H ≤ 65535, the tensor-core kernels at D 512 and H a
/// multiple of 64, the generic kernel elsewhere) over the window rows `window`
/// `[Nw, window_row_bytes(D)]` (U8) chosen by `window_idx` `[T, Kw]` (I32)
/// and, when given, the compressed rows `[Nc, compressed_row_bytes(D)]` (U8)
/// chosen by `[T, Kc]` (I32), Kw + Kc ≥ 1, with per-head sink logits `sink`
/// `[H]` (F32). Returns out `[T, H, D]` (BF16) and lse `[T, H]` (F32, natural
/// log, sink included).
pub fn sparse_mqa(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let s = validate(
        q,
        window,
        window_idx,
        compressed,
        sink,
        SparseMqaKernel::Auto,
    )?;
    let device = q.device();
    let mut out = Tensor::empty(&device, DType::BF16, &[s.t, s.h, s.d])?;
    let mut lse = Tensor::empty(&device, DType::F32, &[s.t, s.h])?;
    sparse_mqa_into(q, window, window_idx, compressed, sink, &mut out, &mut lse)?;
    Ok((out, lse))
}

/// [`sparse_mqa`] into a preallocated BF16 `out` `[T, H, D]` and F32 `lse`
/// `[T, H]` (the `Auto` kernel and split: on CUDA, few queries are split
/// over the SMs unless the handle is batch-invariant).
pub fn sparse_mqa_into(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    out: &mut Tensor,
    lse: &mut Tensor,
) -> Result<()> {
    sparse_mqa_into_split(
        q,
        window,
        window_idx,
        compressed,
        sink,
        out,
        lse,
        SparseMqaKernel::default(),
        SparseMqaSplit::default(),
    )
}

/// [`sparse_mqa_into`] with an explicit CUDA kernel version and no split
/// (tests and benches).
#[allow(clippy::too_many_arguments)]
pub fn sparse_mqa_into_with(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    out: &mut Tensor,
    lse: &mut Tensor,
    kernel: SparseMqaKernel,
) -> Result<()> {
    sparse_mqa_into_split(
        q,
        window,
        window_idx,
        compressed,
        sink,
        out,
        lse,
        kernel,
        SparseMqaSplit::None,
    )
}

/// [`sparse_mqa_into`] with an explicit CUDA kernel version and split-KV
/// ([`SparseMqaSplit`]; `Entries(n)` needs n a positive multiple of
/// [`SPARSE_MQA_SPLIT_UNIT`] below 2^31). The CPU and the generic kernel
/// compute the whole list at once whatever the split. A split changes the
/// order of the sums and rounds each span's probabilities to BF16 against
/// that span's own running maximum, so it agrees with the unsplit result
/// within one BF16 rounding of the probabilities (`tests/cuda_sparse_mqa.rs`
/// states the bound), not within the unsplit one.
#[allow(clippy::too_many_arguments)]
pub fn sparse_mqa_into_split(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    out: &mut Tensor,
    lse: &mut Tensor,
    kernel: SparseMqaKernel,
    split: SparseMqaSplit,
) -> Result<()> {
    if let SparseMqaSplit::Entries(n) = split
        && (n == 0 || !n.is_multiple_of(SPARSE_MQA_SPLIT_UNIT) || n > i32::MAX as usize)
    {
        return Err(Error::Argument {
            op: OP,
            arg: "split",
            value: n.to_string(),
            why: "entries per split must be a positive multiple of 64 below 2^31",
        });
    }
    let s = validate(q, window, window_idx, compressed, sink, kernel)?;
    out.expect_output(OP, "out", DType::BF16, &[s.t, s.h, s.d])?;
    lse.expect_output(OP, "lse", DType::F32, &[s.t, s.h])?;
    match common_device(OP, &[("q", q), ("out", out), ("lse", lse)])? {
        Device::Cpu => cpu(q, window, window_idx, compressed, sink, out, lse, s),
        #[cfg(deepinfer_cuda)]
        Device::Cuda(dev) => crate::cuda_backend::sparse_mqa::sparse_mqa(
            &dev, q, window, window_idx, compressed, sink, out, lse, s, kernel, split,
        ),
        #[cfg(not(deepinfer_cuda))]
        d @ Device::Cuda(_) => {
            let _ = (kernel, split);
            Err(super::kernels_not_built(OP, &d))
        }
    }
}

fn validate(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    kernel: SparseMqaKernel,
) -> Result<SparseMqaShape> {
    q.expect_dtype(OP, "q", DType::BF16)?;
    window.expect_dtype(OP, "window", DType::U8)?;
    window_idx.expect_dtype(OP, "window_idx", DType::I32)?;
    sink.expect_dtype(OP, "sink", DType::F32)?;
    let mut named = vec![
        ("q", q),
        ("window", window),
        ("window_idx", window_idx),
        ("sink", sink),
    ];
    if let Some((rows, idx)) = compressed {
        rows.expect_dtype(OP, "compressed", DType::U8)?;
        idx.expect_dtype(OP, "compressed_idx", DType::I32)?;
        named.extend([("compressed", rows), ("compressed_idx", idx)]);
    }
    let device = common_device(OP, &named)?;
    let (t, h, d) = match *q.shape() {
        [t, h, d] if h > 0 && d > 0 && d.is_multiple_of(64) => (t, h, d),
        _ => {
            return Err(shape_error(
                OP,
                "q",
                q,
                "[T, H > 0, D] with D a positive multiple of 64".into(),
            ));
        }
    };
    let rows = |name: &'static str, pool: &Tensor, bytes: usize| match *pool.shape() {
        [n, b] if b == bytes => Ok(n),
        _ => Err(shape_error(
            OP,
            name,
            pool,
            format!("[rows, {bytes}] (one encoded row of D = {d} per row)"),
        )),
    };
    let list = |name: &'static str, idx: &Tensor| match *idx.shape() {
        [tt, k] if tt == t && k <= i32::MAX as usize => Ok(k),
        _ => Err(shape_error(OP, name, idx, format!("[{t}, K] (q's T)"))),
    };
    let nw = rows("window", window, kv_format::window_row_bytes(d))?;
    let kw = list("window_idx", window_idx)?;
    let (nc, kc) = match compressed {
        Some((pool, idx)) => (
            rows("compressed", pool, kv_format::compressed_row_bytes(d))?,
            list("compressed_idx", idx)?,
        ),
        None => (0, 0),
    };
    if kw + kc == 0 {
        return Err(shape_error(
            OP,
            "window_idx",
            window_idx,
            format!("[{t}, Kw] with Kw + Kc ≥ 1 (Kc = 0 here): every query needs a list"),
        ));
    }
    if kw + kc > i32::MAX as usize {
        return Err(shape_error(
            OP,
            "window_idx",
            window_idx,
            format!("[{t}, Kw] with Kw + Kc < 2^31 (Kc = {kc})"),
        ));
    }
    if sink.shape() != [h] {
        return Err(shape_error(OP, "sink", sink, format!("[{h}] (q's heads)")));
    }
    let s = SparseMqaShape {
        t,
        h,
        d,
        nw,
        kw,
        nc,
        kc,
    };
    if matches!(device, Device::Cuda(_)) {
        let flexible = matches!(kernel, SparseMqaKernel::Auto | SparseMqaKernel::Generic);
        let tensor_cores = kernel != SparseMqaKernel::Generic && s.fits_tensor_cores();
        let fits = tensor_cores || (flexible && s.fits_generic());
        if t > i32::MAX as usize || !fits {
            let expected = if flexible {
                format!(
                    "[T < 2^31, H ≤ 65535, D ≤ {SPARSE_MQA_GENERIC_MAX_DIM}] (the CUDA kernels' shapes)"
                )
            } else {
                format!(
                    "[T < 2^31, H, {SPARSE_MQA_CUDA_DIM}] with H a multiple of \
                     {SPARSE_MQA_CUDA_HEAD_GROUP} below 2^20 (the tensor-core kernel's shape)"
                )
            };
            return Err(shape_error(OP, "q", q, expected));
        }
    }
    Ok(s)
}

/// The CPU reference: per query, the listed rows decoded into a local row
/// table (out-of-range entries become −1) and
/// [`cpu_backend::sparse_attention::sparse_mqa`] over it. The queries run on
/// the machine's threads; each query's result is computed by one thread
/// alone, so it does not depend on the split.
#[allow(clippy::too_many_arguments)]
fn cpu(
    q: &Tensor,
    window: &Tensor,
    window_idx: &Tensor,
    compressed: Option<(&Tensor, &Tensor)>,
    sink: &Tensor,
    out: &mut Tensor,
    lse: &mut Tensor,
    s: SparseMqaShape,
) -> Result<()> {
    let (qv, sinkv) = (q.as_slice::<bf16>()?, sink.as_slice::<f32>()?);
    let (wrows, widx) = (window.as_slice::<u8>()?, window_idx.as_slice::<i32>()?);
    let (crows, cidx): (&[u8], &[i32]) = match compressed {
        Some((rows, idx)) => (rows.as_slice::<u8>()?, idx.as_slice::<i32>()?),
        None => (&[], &[]),
    };
    let (wbytes, cbytes) = (
        kv_format::window_row_bytes(s.d),
        kv_format::compressed_row_bytes(s.d),
    );
    let (o, l) = (out.as_mut_slice::<bf16>()?, lse.as_mut_slice::<f32>()?);
    let query = |t: usize, o: &mut [bf16], l: &mut [f32]| {
        let mut rows: Vec<bf16> = Vec::with_capacity((s.kw + s.kc) * s.d);
        let mut local = Vec::with_capacity(s.kw + s.kc);
        let lists = [
            (&widx[t * s.kw..(t + 1) * s.kw], s.nw, wrows, wbytes, true),
            (&cidx[t * s.kc..(t + 1) * s.kc], s.nc, crows, cbytes, false),
        ];
        for (list, n, pool, bytes, is_window) in lists {
            for &i in list {
                match usize::try_from(i).ok().filter(|&i| i < n) {
                    Some(i) => {
                        let row = &pool[i * bytes..(i + 1) * bytes];
                        local.push(super::i32_sat(rows.len() / s.d));
                        rows.extend(if is_window {
                            kv_format::decode_window_row(row, s.d)
                        } else {
                            kv_format::decode_compressed_row(row, s.d)
                        });
                    }
                    None => local.push(-1),
                }
            }
        }
        let qt = &qv[t * s.h * s.d..(t + 1) * s.h * s.d];
        let r = cpu_backend::sparse_attention::sparse_mqa(qt, &rows, &local, sinkv, s.d);
        o.copy_from_slice(&r.out);
        l.copy_from_slice(&r.lse);
    };
    // Queries are independent, so threads change nothing in the result;
    // they pay off only for prefill-sized batches.
    let threads = match s.t {
        t if t < PARALLEL_QUERIES => 1,
        _ => crate::parallel::available_threads(),
    };
    let per = s.t.div_ceil(threads * 4).max(1);
    let blocks: Vec<_> = o
        .chunks_mut(per * s.h * s.d)
        .zip(l.chunks_mut(per * s.h))
        .enumerate()
        .collect();
    crate::parallel::try_for_each(
        blocks,
        threads,
        |(chunk, (oc, lc))| {
            for (j, (ot, lt)) in oc.chunks_mut(s.h * s.d).zip(lc.chunks_mut(s.h)).enumerate() {
                query(chunk * per + j, ot, lt);
            }
            Ok(())
        },
        || Error::Argument {
            op: "sparse_mqa",
            arg: "threads",
            value: threads.to_string(),
            why: "a CPU attention thread panicked",
        },
    )
}
