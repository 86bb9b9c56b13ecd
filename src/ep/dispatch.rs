//! The dispatch and combine of one rank (module doc of [`super`]).
//!
//! Wire format of a dispatch, per destination rank d (four all-to-alls):
//! the rows of the tokens with at least one entry on d, each token once and
//! in ascending token order (BF16 `[n, D]`, or e4m3 `[n, D]` and E8M0
//! `[n, D/32]`); then one I32 pair per entry, (row among those, local
//! slot), in token then slot order; then the entries' F32 routing weights.
//! The receiver expands the rows to entries ordered by (local slot, source
//! rank, source order): expert-major, and within an expert by source rank
//! and token. Combine sends every entry's output row back to its source in
//! the source's order, and the source sums them with `ops::moe_combine`.

use super::{EpConfig, Mode, Payload, Transport};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::Tensor;

/// What one rank received from a dispatch.
#[derive(Debug)]
pub struct Dispatched {
    /// Normal: `[N, D]` rows grouped by local expert; low-latency
    /// `[L, capacity, D]`, rows past an expert's count never written (the
    /// masked GEMMs and combine read none of them, as DeepEP's low-latency
    /// buffers). BF16, or e4m3
    /// with the FP8 payload.
    pub x: Tensor,
    /// The FP8 payload's E8M0 scales (`[N, D/32]` or `[L, capacity, D/32]`).
    pub scales: Option<Tensor>,
    /// F32 routing weight of each row (`[N]` or `[L, capacity]`, 0 past a
    /// count).
    pub weights: Tensor,
    /// I32: normal, offsets `[L + 1]` (0 = offsets[0] ≤ … ≤ offsets[L] = N);
    /// low-latency, counts `[L]` (each ≤ capacity).
    pub layout: Tensor,
    /// Entries dropped past an expert's capacity (low-latency only; their
    /// tokens' combine lacks them).
    pub overflow: usize,
    /// What combine needs.
    pub handle: EpHandle,
}

/// A dispatch's routing, kept by its rank for the matching combine.
#[derive(Clone, Debug)]
pub struct EpHandle {
    world: usize,
    tokens: usize,
    hidden: usize,
    mode: Mode,
    /// Rows of the expert-major output (N, or L · capacity).
    out_rows: usize,
    /// Per destination: the entries (token · top_k + slot) sent there, in
    /// the order they come back.
    sent: Vec<Vec<usize>>,
    /// Per source: each of its entries' row in the expert-major output, in
    /// its order; `None` when dropped.
    received: Vec<Vec<Option<usize>>>,
    /// The one-rank path's device permutation (`ops::moe_layout`'s), which
    /// combine hands to `ops::moe_combine` as it is.
    local: Option<Tensor>,
    /// The one-rank low-latency path's rows of each entry (I32 `[M, top_k]`,
    /// the [`super::LowLatencyBuffer`]'s), which combine hands to
    /// `ops::moe_masked_combine_into`.
    masked: Option<Tensor>,
}

impl EpHandle {
    /// Tokens this rank dispatched.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Rows of the expert-major output combine expects.
    pub fn out_rows(&self) -> usize {
        self.out_rows
    }
}

/// A transport that notes whether a collective of this call failed, so that
/// a rank failing on its own (bad input, before or between collectives its
/// peers wait in) takes part in the next one as a failure
/// ([`Transport::abort`]) instead of leaving them blocked. A failure of the
/// collective itself reached every rank already.
struct Counted<'a> {
    inner: &'a dyn Transport,
    failed: std::cell::Cell<bool>,
}

impl<'a> Counted<'a> {
    fn new(inner: &'a dyn Transport) -> Self {
        Counted {
            inner,
            failed: std::cell::Cell::new(false),
        }
    }

    /// After an error: unless a collective itself failed, tells the peers
    /// through the next collective.
    fn fail(&self, e: &Error) {
        if !self.failed.get() {
            self.inner.abort(&e.to_string());
        }
    }

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world(&self) -> usize {
        self.inner.world()
    }

    fn all_to_all_v(&self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.inner
            .all_to_all_v(send)
            .inspect_err(|_| self.failed.set(true))
    }
}

fn arg_error(
    op: &'static str,
    arg: &'static str,
    value: impl ToString,
    why: &'static str,
) -> Error {
    Error::Argument {
        op,
        arg,
        value: value.to_string(),
        why,
    }
}

fn shape(op: &'static str, tensor: &'static str, t: &Tensor, expected: String) -> Error {
    Error::Shape {
        op,
        tensor,
        got: t.shape().to_vec(),
        expected,
    }
}

/// `data` as an I32 or F32 tensor of `shape` on `device`.
fn upload<T: crate::dtype::Element>(
    data: Vec<T>,
    shape: &[usize],
    device: &Device,
) -> Result<Tensor> {
    Tensor::from_vec(data, shape)?.to_device(device)
}

/// (output row, source row) pairs of the entries a dispatch places.
type Placed = Vec<(usize, usize)>;

/// A `[rows.len(), width]` tensor whose row i is row `rows[i]` of `src`'s
/// matrix view (every dimension but the last flattened, so a `[L, C, D]`
/// buffer needs no reshaping copy), or zeros for `None` (the whole tensor
/// is zeroed first only when some row is `None`).
fn rows_or_zero(src: &Tensor, rows: &[Option<usize>]) -> Result<Tensor> {
    let width = src.shape().last().copied().unwrap_or(0);
    let shape = [rows.len(), width];
    let mut out = if rows.iter().all(Option::is_some) {
        Tensor::empty(&src.device(), src.dtype(), &shape)?
    } else {
        Tensor::zeros(&src.device(), src.dtype(), &shape)?
    };
    let (dst, from): (Vec<usize>, Vec<usize>) = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|r| (i, r)))
        .unzip();
    ops::copy_rows_into(&mut out, &dst, src, &from)?;
    Ok(out)
}

/// Sends this rank's tokens to the ranks of their experts: `x` BF16
/// `[T, D]`, `ids` I32 `[T, top_k]` logical expert ids (ascending per token,
/// as [`ops::moe_route`] returns them) and `weights` F32 `[T, top_k]`, on
/// one device. Every rank of `transport` calls it with the same `cfg`. The
/// ids and the received entry lists are read on the host, so the call
/// waits for the device (DeepEP's normal mode also syncs on the counts);
/// the normal mode of a one-rank group holding every expert in id order
/// checks the ids on the device instead (`ops::check_ids`: one kernel and
/// one sync, the ids copied back only when one is bad).
/// On a one-rank group the low-latency layout itself is built on the
/// device ([`super::LowLatencyBuffer`], in buffers allocated for the call);
/// a decode step keeps a [`super::LowLatencyBuffer`] instead, which neither
/// allocates nor waits.
pub fn dispatch(
    transport: &dyn Transport,
    cfg: &EpConfig,
    x: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<Dispatched> {
    let t = Counted::new(transport);
    dispatch_on(&t, cfg, x, ids, weights).inspect_err(|e| t.fail(e))
}

fn dispatch_on(
    transport: &Counted,
    cfg: &EpConfig,
    x: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<Dispatched> {
    const OP: &str = "ep::dispatch";
    let placement = cfg.placement();
    let (world, rank, k, d) = (
        transport.world(),
        transport.rank(),
        cfg.top_k(),
        cfg.hidden(),
    );
    if world != placement.ranks() {
        return Err(arg_error(
            OP,
            "transport",
            format!("world {world}"),
            "the placement is for another world size",
        ));
    }
    x.expect_dtype(OP, "x", DType::BF16)?;
    ids.expect_dtype(OP, "ids", DType::I32)?;
    weights.expect_dtype(OP, "weights", DType::F32)?;
    let &[t, xd] = x.shape() else {
        return Err(shape(OP, "x", x, format!("[T, {d}]")));
    };
    if xd != d {
        return Err(shape(OP, "x", x, format!("[T, {d}]")));
    }
    if ids.shape() != [t, k] {
        return Err(shape(OP, "ids", ids, format!("[{t}, {k}]")));
    }
    if weights.shape() != [t, k] {
        return Err(shape(OP, "weights", weights, format!("[{t}, {k}]")));
    }
    let device = ops::common_device(OP, &[("x", x), ("ids", ids), ("weights", weights)])?;
    if let Mode::LowLatency { max_tokens, .. } = cfg.mode()
        && t > max_tokens
    {
        return Err(arg_error(
            OP,
            "x",
            format!("{t} tokens"),
            "more tokens than the low-latency mode's max_tokens",
        ));
    }
    let n_experts = placement.n_experts();
    if world == 1
        && cfg.mode() == Mode::Normal
        && n_experts <= crate::contract::MOE_MAX_EXPERTS
        && placement.table().iter().enumerate().all(|(p, &e)| p == e)
    {
        // The ids checked where they are (the layout kernel cannot check
        // them): on a GPU one kernel and one sync, no copy to the host.
        ops::check_ids(OP, ids, n_experts)?;
        return one_rank(cfg, x, ids, weights, t);
    }
    let host_ids = ids.to_vec::<i32>()?;
    let slots = placement.slots_per_rank();
    // Each entry's physical slot, checked here for every other path.
    let mut phys = Vec::with_capacity(t * k);
    for (j, &e) in host_ids.iter().enumerate() {
        let p = usize::try_from(e)
            .ok()
            .filter(|&e| e < n_experts)
            .and_then(|e| placement.physical(e, rank, j / k));
        match p {
            Some(p) => phys.push(p),
            None => return Err(ops::bad_expert_id(OP, Some(e))),
        }
    }
    if world == 1 && matches!(cfg.mode(), Mode::LowLatency { .. }) {
        return one_rank_masked(cfg, x, ids, weights, &device);
    }
    let host_w = weights.to_vec::<f32>()?;

    // The payload, quantised once per token.
    let fp8 = quantised(cfg.payload(), x)?;
    let (rows, scales) = match &fp8 {
        Some((q, s)) => (q, Some(s)),
        None => (x, None),
    };

    // Per destination: its tokens, and its entries (token row, local slot,
    // weight); `sent` keeps the entries' ids for combine.
    let mut tok: Vec<Vec<usize>> = vec![Vec::new(); world];
    let mut meta: Vec<Vec<i32>> = vec![Vec::new(); world];
    let mut wts: Vec<Vec<f32>> = vec![Vec::new(); world];
    let mut sent: Vec<Vec<usize>> = vec![Vec::new(); world];
    for token in 0..t {
        for slot in 0..k {
            let j = token * k + slot;
            let (dst, local) = (phys[j] / slots, phys[j] % slots);
            if tok[dst].last() != Some(&token) {
                tok[dst].push(token);
            }
            let row = i32::try_from(tok[dst].len() - 1).map_err(|_| too_many(OP))?;
            let local = i32::try_from(local).map_err(|_| too_many(OP))?;
            meta[dst].extend([row, local]);
            wts[dst].push(host_w[j]);
            sent[dst].push(j);
        }
    }

    let send_rows = tok
        .iter()
        .map(|r| ops::gather_rows(rows, r))
        .collect::<Result<Vec<_>>>()?;
    let recv_rows = transport.all_to_all_v(send_rows)?;
    let recv_scales = match &scales {
        Some(s) => Some(
            transport.all_to_all_v(
                tok.iter()
                    .map(|r| ops::gather_rows(s, r))
                    .collect::<Result<Vec<_>>>()?,
            )?,
        ),
        None => None,
    };
    let send_meta = meta
        .into_iter()
        .map(|m| {
            let n = m.len() / 2;
            upload(m, &[n, 2], &device)
        })
        .collect::<Result<Vec<_>>>()?;
    let recv_meta = transport.all_to_all_v(send_meta)?;
    let send_w = wts
        .into_iter()
        .map(|w| {
            let n = w.len();
            upload(w, &[n], &device)
        })
        .collect::<Result<Vec<_>>>()?;
    let recv_w = transport.all_to_all_v(send_w)?;

    // Expert-major order of the received entries: (local slot, source,
    // source order); `src_row` indexes the concatenated received rows.
    let mut entries = Vec::new(); // (local, source, index, src_row, weight)
    let mut base = 0usize;
    let mut per_source = Vec::with_capacity(world);
    for (s, ((r, m), w)) in recv_rows.iter().zip(&recv_meta).zip(&recv_w).enumerate() {
        check_received(OP, r, m, w, d, slots)?;
        let (m, w) = (m.to_vec::<i32>()?, w.to_vec::<f32>()?);
        per_source.push(w.len());
        for (i, (pair, &wt)) in m.chunks_exact(2).zip(&w).enumerate() {
            // check_received bounded both entries.
            let (row, local) = (pair[0] as usize, pair[1] as usize);
            entries.push((local, s, i, base + row, wt));
        }
        base += r.rows();
    }
    entries.sort_by_key(|&(local, s, i, _, _)| (local, s, i));
    let all_rows = Tensor::cat_rows(&recv_rows.iter().collect::<Vec<_>>())?;
    let all_scales = match &recv_scales {
        Some(v) => Some(Tensor::cat_rows(&v.iter().collect::<Vec<_>>())?),
        None => None,
    };

    let mut received: Vec<Vec<Option<usize>>> = per_source.iter().map(|&n| vec![None; n]).collect();
    let mut overflow = 0usize;
    // (output row, received row) of every entry placed; the other output
    // rows (past a low-latency expert's count) are never written.
    let (placed, w_out, layout, out_rows, shape_lead): (
        Placed,
        Vec<f32>,
        Tensor,
        usize,
        Vec<usize>,
    ) = match cfg.mode() {
        Mode::Normal => {
            let mut offsets = vec![0i32; slots + 1];
            for &(local, _, _, _, _) in &entries {
                offsets[local + 1] += 1;
            }
            for l in 0..slots {
                offsets[l + 1] += offsets[l];
            }
            for (pos, &(_, s, i, _, _)) in entries.iter().enumerate() {
                received[s][i] = Some(pos);
            }
            let n = entries.len();
            (
                entries.iter().enumerate().map(|(i, e)| (i, e.3)).collect(),
                entries.iter().map(|e| e.4).collect(),
                upload(offsets, &[slots + 1], &device)?,
                n,
                vec![n],
            )
        }
        Mode::LowLatency { capacity, .. } => {
            let n = slots * capacity;
            let mut placed = Vec::with_capacity(entries.len().min(n));
            let mut w_out = vec![0.0f32; n];
            let mut counts = vec![0usize; slots];
            for &(local, s, i, src, wt) in &entries {
                let c = &mut counts[local];
                if *c < capacity {
                    let pos = local * capacity + *c;
                    placed.push((pos, src));
                    w_out[pos] = wt;
                    received[s][i] = Some(pos);
                    *c += 1;
                } else {
                    overflow += 1;
                }
            }
            let counts = counts
                .into_iter()
                .map(|c| i32::try_from(c).map_err(|_| too_many(OP)))
                .collect::<Result<Vec<_>>>()?;
            (
                placed,
                w_out,
                upload(counts, &[slots], &device)?,
                n,
                vec![slots, capacity],
            )
        }
    };
    let (dst, src): (Vec<usize>, Vec<usize>) = placed.into_iter().unzip();
    let place = |from: &Tensor, tail: usize| -> Result<Tensor> {
        let s: Vec<usize> = shape_lead.iter().copied().chain([tail]).collect();
        let mut out = Tensor::empty(&device, from.dtype(), &s)?;
        ops::copy_rows_into(&mut out, &dst, from, &src)?;
        Ok(out)
    };
    let x_out = place(&all_rows, d)?;
    let scales_out = match &all_scales {
        Some(s) => Some(place(s, d / 32)?),
        None => None,
    };
    let weights_out = upload(w_out, &shape_lead, &device)?;
    Ok(Dispatched {
        x: x_out,
        scales: scales_out,
        weights: weights_out,
        layout,
        overflow,
        handle: EpHandle {
            world,
            tokens: t,
            hidden: d,
            mode: cfg.mode(),
            out_rows,
            sent,
            received,
            local: None,
            masked: None,
        },
    })
}

/// The normal mode on one rank holding every expert in id order: the
/// single-GPU MoE's own device ops (layout, permute, quantise), no host
/// round trip past the ids' check. The same rows, in the same order, as the
/// general path: grouped by expert, ascending entry within one.
fn one_rank(
    cfg: &EpConfig,
    x: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    t: usize,
) -> Result<Dispatched> {
    let (k, d) = (cfg.top_k(), cfg.hidden());
    let (_, offsets, perm) = ops::moe_layout(ids, cfg.placement().n_experts())?;
    let (rows, w) = ops::moe_permute(x, weights, &perm)?;
    let (x_out, scales) = match quantised(cfg.payload(), &rows)? {
        Some((q, s)) => (q, Some(s)),
        None => (rows, None),
    };
    Ok(Dispatched {
        x: x_out,
        scales,
        weights: w,
        layout: offsets,
        overflow: 0,
        handle: EpHandle {
            world: 1,
            tokens: t,
            hidden: d,
            mode: Mode::Normal,
            out_rows: t * k,
            sent: Vec::new(),
            received: Vec::new(),
            local: Some(perm),
            masked: None,
        },
    })
}

/// The low-latency mode on one rank (whose placement is the identity: a
/// rank holds each expert once): the [`super::LowLatencyBuffer`] path in
/// buffers allocated for this call (its entry table sized for the call's T,
/// not the mode's max_tokens), its overflow read back. The same rows
/// as the general path: expert-major, ascending entry within an expert.
fn one_rank_masked(
    cfg: &EpConfig,
    x: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    device: &Device,
) -> Result<Dispatched> {
    let t = x.rows();
    let mut buf = super::LowLatencyBuffer::sized(cfg, device, Some(t))?;
    buf.dispatch(x, ids, weights)?;
    let overflow = buf.overflow()?;
    let (l, capacity) = (cfg.placement().slots_per_rank(), buf.weights.shape()[1]);
    Ok(Dispatched {
        x: buf.x,
        scales: buf.scales,
        weights: buf.weights,
        layout: buf.counts,
        overflow,
        handle: EpHandle {
            world: 1,
            tokens: t,
            hidden: cfg.hidden(),
            mode: cfg.mode(),
            out_rows: l * capacity,
            sent: Vec::new(),
            received: Vec::new(),
            local: None,
            masked: Some(buf.pos),
        },
    })
}

/// The FP8 payload of BF16 `rows` `[n, D]` (e4m3 values and E8M0 scales);
/// `None` for the BF16 payload, which sends the rows as they are.
fn quantised(payload: Payload, rows: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    match (payload, rows.shape()) {
        (Payload::Bf16, _) => Ok(None),
        (Payload::Fp8, &[0, d]) => Ok(Some((
            Tensor::empty(&rows.device(), DType::F8E4M3, &[0, d])?,
            Tensor::empty(&rows.device(), DType::E8M0, &[0, d / 32])?,
        ))),
        (Payload::Fp8, _) => ops::act_quant_fp8(rows).map(Some),
    }
}

fn too_many(op: &'static str) -> Error {
    arg_error(
        op,
        "x",
        "more than 2^31 - 1 rows",
        "an EP buffer is I32-indexed",
    )
}

/// A source's received rows `[n, D]`, entries I32 `[m, 2]` (row < n, local
/// slot < slots) and weights F32 `[m]`: checked, so a malformed peer is a
/// typed error here rather than an index out of range later.
fn check_received(
    op: &'static str,
    rows: &Tensor,
    meta: &Tensor,
    w: &Tensor,
    d: usize,
    slots: usize,
) -> Result<()> {
    if rows.shape().len() != 2 || rows.shape().get(1) != Some(&d) {
        return Err(shape(op, "received rows", rows, format!("[n, {d}]")));
    }
    meta.expect_dtype(op, "received entries", DType::I32)?;
    w.expect_dtype(op, "received weights", DType::F32)?;
    let m = w.numel();
    if meta.shape() != [m, 2] || w.shape() != [m] {
        return Err(shape(op, "received entries", meta, format!("[{m}, 2]")));
    }
    let n = rows.rows();
    let v = meta.to_vec::<i32>()?;
    for pair in v.chunks_exact(2) {
        let ok = usize::try_from(pair[0]).is_ok_and(|r| r < n)
            && usize::try_from(pair[1]).is_ok_and(|l| l < slots);
        if !ok {
            return Err(arg_error(
                op,
                "received entries",
                format!("({}, {})", pair[0], pair[1]),
                "a row or local slot out of range",
            ));
        }
    }
    Ok(())
}

/// Brings the expert outputs of a dispatch home and sums them: `expert_out`
/// BF16 in the dispatch's layout (`[N, D]`, or `[L, capacity, D]` whose
/// rows past the counts are ignored), `shared` BF16 `[T, D]` (this rank's
/// shared-expert output); returns BF16 `[T, D]`, bitwise
/// [`ops::moe_combine`] of the single-rank MoE. Every rank calls it.
pub fn combine(
    transport: &dyn Transport,
    handle: &EpHandle,
    expert_out: &Tensor,
    shared: &Tensor,
) -> Result<Tensor> {
    let t = Counted::new(transport);
    combine_on(&t, handle, expert_out, shared).inspect_err(|e| t.fail(e))
}

fn combine_on(
    transport: &Counted,
    handle: &EpHandle,
    expert_out: &Tensor,
    shared: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "ep::combine";
    let h = handle;
    if transport.world() != h.world {
        return Err(arg_error(
            OP,
            "transport",
            format!("world {}", transport.world()),
            "the dispatch ran on another world size",
        ));
    }
    expert_out.expect_dtype(OP, "expert_out", DType::BF16)?;
    shared.expect_dtype(OP, "shared", DType::BF16)?;
    let want: Vec<usize> = match h.mode {
        Mode::Normal => vec![h.out_rows, h.hidden],
        Mode::LowLatency { capacity, .. } => {
            vec![h.out_rows / capacity.max(1), capacity, h.hidden]
        }
    };
    if expert_out.shape() != want.as_slice() {
        return Err(shape(OP, "expert_out", expert_out, format!("{want:?}")));
    }
    if shared.shape() != [h.tokens, h.hidden] {
        return Err(shape(
            OP,
            "shared",
            shared,
            format!("[{}, {}]", h.tokens, h.hidden),
        ));
    }
    let device = ops::common_device(OP, &[("expert_out", expert_out), ("shared", shared)])?;
    if let Some(perm) = &h.local {
        return ops::moe_combine(expert_out, perm, shared);
    }
    if let Some(pos) = &h.masked {
        let mut out = Tensor::empty(&device, DType::BF16, &[h.tokens, h.hidden])?;
        ops::moe_masked_combine_into(expert_out, pos, shared, &mut out)?;
        return Ok(out);
    }
    // Rows of the expert-major output (the masked layout's [L, C, D] read as
    // L·C rows, no copy), zeros for entries dropped past a capacity.
    let back = h
        .received
        .iter()
        .map(|rows| rows_or_zero(expert_out, rows))
        .collect::<Result<Vec<_>>>()?;
    let recv = transport.all_to_all_v(back)?;
    for (r, sent) in recv.iter().zip(&h.sent) {
        if r.shape() != [sent.len(), h.hidden] {
            return Err(shape(
                OP,
                "returned rows",
                r,
                format!("[{}, {}]", sent.len(), h.hidden),
            ));
        }
    }
    let routed = Tensor::cat_rows(&recv.iter().collect::<Vec<_>>())?;
    let perm = h
        .sent
        .iter()
        .flatten()
        .map(|&j| i32::try_from(j).map_err(|_| too_many(OP)))
        .collect::<Result<Vec<_>>>()?;
    let n = perm.len();
    let perm = upload(perm, &[n], &device)?;
    ops::moe_combine(&routed, &perm, shared)
}
