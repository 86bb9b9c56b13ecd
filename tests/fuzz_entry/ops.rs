//! The op API's validation under fuzzed dtypes, shapes, values and scalar
//! arguments, on the CPU device: every call must return `Ok` or a typed
//! `Err`. Covered: every op and its `_into` variant (outputs of fuzzed
//! dtype and shape), `gather_rows`, the expert-parallel placement tables
//! (`Placement::from_table`/`uniform`, `ExpertLoad`) and `ep::dispatch` /
//! `ep::combine` on the one-rank `Local` transport. Tensors are built mostly with the dtype and rank each argument
//! expects (so the fuzzer gets past the first check), otherwise at random.

use super::Bytes;
use super::bytes::MAX_NUMEL;
use deepinfer::contract::{MhcPre, RopeParams, Yarn};
use deepinfer::ep::{self, EpConfig, ExpertLoad, Local, Mode, Payload, Placement};
use deepinfer::ops::{
    self, ActQuantImpl, GemmImpl, KvRowFormat, MhcParams, RowNorm, RowRope, RowsOut, ScoreKernel,
    SparseMqaKernel, SparseMqaSplit,
};
use deepinfer::{DType, Device, Tensor};

use DType::{BF16, E8M0, F4E2M1x2 as FP4, F8E4M3 as FP8, F32, I32, I64, U8};

/// Number of op families [`ops`] dispatches over.
pub const OPS: u8 = 41;

/// One op call: the first byte picks the op, the rest its arguments.
pub fn ops(data: &[u8]) {
    let mut b = Bytes::new(data);
    let op = b.u8() % OPS;
    let _ = call(op, &mut b);
}

macro_rules! t {
    ($b:expr, $dtype:expr, $rank:expr) => {
        match $b.tensor($dtype, $rank) {
            Some(t) => t,
            None => return None,
        }
    };
}

/// A tensor of `dtype` and `shape` with fuzzed values (1 in 8: a fuzzed
/// dtype and shape of the same rank instead), so a case mostly gets past
/// the shape checks into the op.
macro_rules! s {
    ($b:expr, $dtype:expr, [$($d:expr),*]) => {{
        let shape = [$($d),*];
        let t = if $b.u8() < 224 {
            $b.tensor_of($dtype, &shape)
        } else {
            $b.tensor($dtype, shape.len())
        };
        match t {
            Some(t) => t,
            None => return None,
        }
    }};
}

/// A size argument: mostly one of `usual`, else a fuzzed count.
fn arg(b: &mut Bytes, usual: &[usize]) -> usize {
    if b.u8() < 224 {
        b.pick(usual)
    } else {
        b.count()
    }
}

/// An output for an `_into` call: mostly a tensor of `like`'s dtype and
/// shape (what the allocating op returned, so the call runs), else a
/// fuzzed one of its rank.
fn out_like(b: &mut Bytes, like: &Tensor) -> Option<Tensor> {
    if b.u8() < 192 {
        Tensor::empty(&Device::Cpu, like.dtype(), like.shape()).ok()
    } else {
        b.tensor(like.dtype(), like.shape().len())
    }
}

fn rope_params(b: &mut Bytes) -> RopeParams {
    let theta = f64::from(b.float());
    let yarn = b.bool().then(|| Yarn {
        factor: f64::from(b.float()),
        original_seq_len: b.count() as u64,
        beta_fast: f64::from(b.float()),
        beta_slow: f64::from(b.float()),
    });
    RopeParams { theta, yarn }
}

fn format(b: &mut Bytes) -> KvRowFormat {
    b.pick(&[
        KvRowFormat::Window,
        KvRowFormat::Compressed,
        KvRowFormat::IndexKey,
    ])
}

fn out_dtype(b: &mut Bytes) -> DType {
    b.pick(&[BF16, F32, I32, FP8])
}

fn call(op: u8, b: &mut Bytes) -> Option<()> {
    let cpu = Device::Cpu;
    match op {
        0 => {
            let (x, w) = (t!(b, BF16, 2), t!(b, BF16, 1));
            let _ = ops::rms_norm(&x, &w, b.float());
        }
        1 => {
            let (x, w, mut out) = (t!(b, BF16, 2), t!(b, BF16, 1), t!(b, BF16, 2));
            let _ = ops::rms_norm_into(&x, &w, b.float(), &mut out);
        }
        2 => {
            let x = t!(b, BF16, 2);
            let imp = b.pick(&[ActQuantImpl::Cuda, ActQuantImpl::TileLang]);
            let _ = ops::act_quant_fp8_with(&x, imp);
            let (mut q, mut s) = (t!(b, FP8, 2), t!(b, E8M0, 2));
            let _ = ops::act_quant_fp8_into(&x, &mut q, &mut s, imp);
        }
        3 => {
            let (x, w) = (t!(b, BF16, 2), t!(b, BF16, 1));
            let _ = ops::rms_norm_act_quant_fp8(&x, &w, b.float());
        }
        4 => {
            let (gu, w) = (t!(b, BF16, 2), t!(b, F32, 1));
            let _ = ops::swiglu_act_quant_fp8(&gu, &w, b.float());
        }
        5 => {
            let (x, pos) = (t!(b, BF16, 2), t!(b, I64, 1));
            let (heads, dim, p) = (b.count(), b.count(), rope_params(b));
            if b.bool() {
                let _ = ops::rope(&x, &pos, heads, dim, &p);
            } else {
                let _ = ops::inverse_rope(&x, &pos, heads, dim, &p);
            }
        }
        6 => {
            let (table, ids) = (t!(b, BF16, 2), t!(b, I32, 1));
            let _ = ops::embedding(&table, &ids);
        }
        7 => {
            let logits = t!(b, F32, 2);
            let _ = ops::argmax(&logits);
        }
        8 => {
            let (a, c) = (t!(b, F32, 2), t!(b, F32, 2));
            let _ = ops::add(&a, &c);
            let _ = ops::scale(&a, b.float());
            let _ = ops::div_scalar(&a, b.float());
            let hint = a.dtype();
            let parts = [a, c, t!(b, hint, 2)];
            let n = usize::from(b.u8()) % 4;
            let refs: Vec<&Tensor> = parts.iter().take(n).collect();
            let _ = ops::cat_cols(&refs);
        }
        9 => {
            let ids = t!(b, I64, 1);
            let mult = [
                b.u64() as i64,
                b.u64() as i64,
                b.u64() as i64,
                b.u64() as i64,
            ];
            let primes: Vec<u64> = (0..usize::from(b.u8() % 9))
                .map(|_| if b.bool() { b.u64() } else { u64::from(b.u8()) })
                .collect();
            let _ = ops::engram_rows(&ids, &mult, &primes);
        }
        10 => {
            let (table, rows) = (t!(b, U8, 2), t!(b, I64, 2));
            let _ = ops::engram_lookup(&table, &rows, b.count());
        }
        11 => {
            let (s, kv, q, k) = (
                t!(b, BF16, 3),
                t!(b, BF16, 2),
                t!(b, BF16, 2),
                t!(b, BF16, 2),
            );
            let _ = ops::engram_gate_update(&s, &kv, &q, &k, b.float());
        }
        12 => {
            let (x, w) = (t!(b, BF16, 3), t!(b, BF16, 3));
            let _ = ops::grouped_bf16_linear(&x, &w, b.count());
        }
        13 => {
            let x = t!(b, BF16, 2);
            let _ = ops::hc_init(&x);
            let (s, pre) = (t!(b, BF16, 3), t!(b, F32, 2));
            let _ = ops::hc_collapse(&s, &pre);
            let _ = ops::hc_stream_mean(&s);
        }
        14 => {
            let x = t!(b, BF16, 2);
            let fmt = format(b);
            let w = t!(b, BF16, 1);
            let pos = t!(b, I64, 1);
            let p = rope_params(b);
            let norm = b.bool().then_some(RowNorm {
                weight: &w,
                eps: 1e-6,
            });
            let rope = b.bool().then(|| RowRope {
                positions: &pos,
                rope_dim: b.count(),
                params: &p,
            });
            let _ = ops::kv_rows(&x, fmt, norm, rope);
            let _ = ops::window_rows(&x);
            let _ = ops::compressed_rows(&x);
            let (mut pool, slots) = (t!(b, U8, 2), t!(b, I32, 1));
            let mut latent = t!(b, BF16, 2);
            let out = RowsOut {
                pool: &mut pool,
                slots: &slots,
                latent: b.bool().then_some(&mut latent),
            };
            let _ = ops::kv_rows_into(&x, fmt, norm, rope, out);
        }
        15 => {
            let (kv, score) = (t!(b, F32, 2), t!(b, F32, 2));
            let _ = ops::compress_ratio2(&kv, &score);
            let (pk, ps, groups) = (t!(b, F32, 2), t!(b, F32, 2), t!(b, I32, 2));
            let (w, pos) = (t!(b, BF16, 1), t!(b, I64, 1));
            let p = rope_params(b);
            let (mut pool, slots, mut latent) = (t!(b, U8, 2), t!(b, I32, 1), t!(b, BF16, 2));
            let _ = ops::compressor_rows_into(
                &kv,
                &score,
                b.bool().then_some((&pk, &ps)),
                &groups,
                RowNorm {
                    weight: &w,
                    eps: b.float(),
                },
                RowRope {
                    positions: &pos,
                    rope_dim: b.count(),
                    params: &p,
                },
                RowsOut {
                    pool: &mut pool,
                    slots: &slots,
                    latent: b.bool().then_some(&mut latent),
                },
            );
        }
        16 => {
            let s = t!(b, BF16, 3);
            let (f, base, scale, pre) =
                (t!(b, F32, 2), t!(b, F32, 1), t!(b, F32, 1), t!(b, F32, 2));
            let params = MhcParams {
                eps: b.float(),
                hc_eps: b.float(),
                // Every count: the op bounds the iterations itself.
                iters: b.count(),
            };
            let _ = ops::mhc_pre(&s, &f, &base, &scale, &pre, params);
        }
        17 => {
            let (s, f, post, comb) = (t!(b, BF16, 3), t!(b, BF16, 2), t!(b, F32, 2), t!(b, F32, 2));
            let _ = ops::mhc_expand(&s, &f, &post, &comb);
        }
        18 => {
            let (x, w, perm) = (t!(b, BF16, 2), t!(b, F32, 2), t!(b, I32, 1));
            let _ = ops::moe_permute(&x, &w, &perm);
            let (q, s) = (t!(b, FP8, 2), t!(b, E8M0, 2));
            let _ = ops::moe_permute_fp8(&q, &s, &w, &perm);
            let (routed, shared) = (t!(b, BF16, 2), t!(b, BF16, 2));
            let _ = ops::moe_combine(&routed, &perm, &shared);
        }
        19 => {
            let (logits, bias) = (t!(b, F32, 2), t!(b, F32, 1));
            let _ = ops::moe_route(&logits, &bias, b.count(), b.float());
        }
        20 => {
            let ids = t!(b, I32, 2);
            // Every count: the op bounds n_experts itself (MOE_MAX_EXPERTS).
            let _ = ops::moe_layout(&ids, b.count());
        }
        21 => {
            let (q, window, idx) = (t!(b, BF16, 3), t!(b, U8, 2), t!(b, I32, 2));
            let (comp, cidx, sink) = (t!(b, U8, 2), t!(b, I32, 2), t!(b, F32, 1));
            let compressed = b.bool().then_some((&comp, &cidx));
            if b.bool() {
                let _ = ops::sparse_mqa(&q, &window, &idx, compressed, &sink);
            } else {
                let (mut out, mut lse) = (t!(b, BF16, 3), t!(b, F32, 2));
                let k = b.pick(&[
                    SparseMqaKernel::V3,
                    SparseMqaKernel::V5Heads32,
                    SparseMqaKernel::V5Heads16,
                    SparseMqaKernel::V8,
                    SparseMqaKernel::V9,
                    SparseMqaKernel::V11,
                    SparseMqaKernel::V12,
                    SparseMqaKernel::Generic,
                ]);
                let split = b.pick(&[
                    SparseMqaSplit::None,
                    SparseMqaSplit::Auto,
                    SparseMqaSplit::Entries(64),
                    SparseMqaSplit::Entries(100),
                    SparseMqaSplit::Entries(0),
                ]);
                let _ = ops::sparse_mqa_into_split(
                    &q, &window, &idx, compressed, &sink, &mut out, &mut lse, k, split,
                );
            }
        }
        22 => {
            let (a, w) = (t!(b, BF16, 2), t!(b, BF16, 2));
            let _ = ops::bf16_linear(&a, &w, out_dtype(b));
        }
        23 => {
            let (a, a_s, w, w_s) = (t!(b, FP8, 2), t!(b, E8M0, 2), t!(b, FP8, 2), t!(b, E8M0, 2));
            if b.bool() {
                let _ = ops::mxfp8_linear(&a, &a_s, &w, &w_s, out_dtype(b));
            } else {
                let mut out = t!(b, BF16, 2);
                let imp = b.pick(&[
                    GemmImpl::Auto,
                    GemmImpl::Large,
                    GemmImpl::LargeSplit,
                    GemmImpl::Skinny,
                    GemmImpl::SkinnyWholeK,
                    GemmImpl::LargeSkinnySplit,
                ]);
                let _ = ops::mxfp8_linear_into(&a, &a_s, &w, &w_s, &mut out, imp);
            }
        }
        24 => {
            let (a, a_s, w, w_s) = (t!(b, FP8, 2), t!(b, E8M0, 2), t!(b, FP4, 3), t!(b, E8M0, 3));
            let offsets = t!(b, I32, 1);
            let _ = ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &offsets, out_dtype(b));
        }
        25 => {
            let (a, a_s, w, w_s) = (t!(b, FP8, 3), t!(b, E8M0, 3), t!(b, FP4, 3), t!(b, E8M0, 3));
            let counts = t!(b, I32, 1);
            let _ = ops::mxfp4_grouped_masked(&a, &a_s, &w, &w_s, &counts, out_dtype(b));
        }
        26 => {
            let x = t!(b, BF16, 2);
            let _ = ops::index_key_quant(&x);
            let (q, w, keys, visible) =
                (t!(b, FP4, 3), t!(b, BF16, 2), t!(b, FP4, 2), t!(b, I32, 1));
            let _ = ops::index_scores(&q, &w, &keys, &visible);
            let mut out = t!(b, BF16, 2);
            let k = b.pick(&[ScoreKernel::Auto, ScoreKernel::Exact, ScoreKernel::Tensor]);
            let _ = ops::index_scores_into_with(&q, &w, &keys, &visible, &mut out, k);
        }
        27 => {
            let (scores, visible) = (t!(b, BF16, 2), t!(b, I32, 1));
            let _ = ops::index_topk(&scores, &visible, b.count(), b.count());
        }
        28 => {
            let (scores, visible) = (t!(b, BF16, 2), t!(b, I32, 1));
            let (block, keep) = (b.count(), b.count());
            let _ = ops::index_candidate_width(b.count(), block, keep);
            let _ = ops::index_candidates(&scores, &visible, block, keep);
            let cands = t!(b, I32, 2);
            let _ = ops::index_mask_scores(&scores, &cands, block);
            let _ = ops::index_reindex_topk(&scores, &cands, block, &visible, b.count(), b.count());
        }
        29 => {
            let (n, d) = (b.pick(&[0, 1, 3, 8, 17]), b.pick(&[1, 4, 32]));
            let dtype = b.dtype(BF16);
            let x = s!(b, dtype, [n, d]);
            let rows: Vec<usize> = (0..usize::from(b.u8() % 24))
                .map(|_| match b.u8() {
                    0..=239 => usize::from(b.u8()) % (n + 2),
                    _ => b.count(),
                })
                .collect();
            let _ = ops::gather_rows(&x, &rows);
            // The same lists scattered into a tensor of another shape.
            let m = b.pick(&[0, 1, 5, 24]);
            let (dst_dtype, dst_width) = (b.dtype(dtype), b.pick(&[d, 1, 32]));
            let mut dst = s!(b, dst_dtype, [m, dst_width]);
            let dst_rows: Vec<usize> = rows.iter().map(|&r| r % (m + 2)).collect();
            let _ = ops::copy_rows_into(&mut dst, &dst_rows, &x, &rows);
        }
        30 => {
            let (t, heads) = (b.pick(&[0, 1, 3, 8]), b.pick(&[1, 2, 4]));
            let hd = b.pick(&[64, 16, 8, 6]);
            let x = s!(b, BF16, [t, heads * hd]);
            let pos = s!(b, I64, [t]);
            let rope_dim = arg(b, &[16, 8, 64, 6, 0]);
            let p = rope_params(b);
            let inverse = b.bool();
            let like = if inverse {
                ops::inverse_rope(&x, &pos, heads, rope_dim, &p)
            } else {
                ops::rope(&x, &pos, heads, rope_dim, &p)
            };
            let mut out = out_like(b, like.as_ref().unwrap_or(&x))?;
            if inverse {
                let _ = ops::inverse_rope_into(&x, &pos, heads, rope_dim, &p, &mut out);
            } else {
                let _ = ops::rope_into(&x, &pos, heads, rope_dim, &p, &mut out);
            }
        }
        31 => {
            let (t, d) = (b.pick(&[0, 1, 3, 8]), b.pick(&[32, 64, 16, 128]));
            let (x, w) = (s!(b, BF16, [t, d]), s!(b, BF16, [d]));
            let eps = b.float();
            let like = ops::rms_norm_act_quant_fp8(&x, &w, eps);
            let (ly, lq, ls) = match &like {
                Ok((y, q, s)) => (y, q, s),
                Err(_) => (&x, &x, &x),
            };
            let (mut y, mut q, mut sc) = (out_like(b, ly)?, out_like(b, lq)?, out_like(b, ls)?);
            let _ = ops::rms_norm_act_quant_fp8_into(&x, &w, eps, &mut y, &mut q, &mut sc);
            let (gu, rw) = (s!(b, BF16, [t, 2 * d]), s!(b, F32, [t]));
            let limit = b.float();
            let like = ops::swiglu_act_quant_fp8(&gu, &rw, limit);
            let (lq, ls) = match &like {
                Ok((q, s)) => (q, s),
                Err(_) => (&gu, &gu),
            };
            let (mut q, mut sc) = (out_like(b, lq)?, out_like(b, ls)?);
            let _ = ops::swiglu_act_quant_fp8_into(&gu, &rw, limit, &mut q, &mut sc);
        }
        32 => {
            let (t, d) = (b.pick(&[0, 1, 2, 5]), b.pick(&[8, 32, 4]));
            let s = s!(b, BF16, [t, 4, d]);
            let (f, base, scale, pre) = (
                s!(b, F32, [24, 4 * d]),
                s!(b, F32, [24]),
                s!(b, F32, [3]),
                s!(b, F32, [t, 4]),
            );
            let params = MhcParams {
                eps: b.float(),
                hc_eps: b.float(),
                iters: arg(b, &[20, 1, 0, 3]),
            };
            let like = ops::mhc_pre(&s, &f, &base, &scale, &pre, params);
            let mut out = match &like {
                Ok(l) => MhcPre {
                    u: out_like(b, &l.u)?,
                    mixes: out_like(b, &l.mixes)?,
                    pre: out_like(b, &l.pre)?,
                    post: out_like(b, &l.post)?,
                    comb: out_like(b, &l.comb)?,
                },
                Err(_) => MhcPre {
                    u: t!(b, BF16, 2),
                    mixes: t!(b, F32, 2),
                    pre: t!(b, F32, 2),
                    post: t!(b, F32, 2),
                    comb: t!(b, F32, 3),
                },
            };
            let _ = ops::mhc_pre_into(&s, &f, &base, &scale, &pre, params, &mut out);
            let (fo, post, comb) = (s!(b, BF16, [t, d]), s!(b, F32, [t, 4]), s!(b, F32, [t, 16]));
            let mut streams = out_like(b, &s)?;
            let _ = ops::mhc_expand_into(&s, &fo, &post, &comb, &mut streams);
            let w = ops::MhcWeights {
                func: &f,
                base: &base,
                scale: &scale,
            };
            let _ = ops::mhc_expand_pre_into(
                &s,
                &fo,
                &post,
                &comb,
                w,
                &pre,
                params,
                &mut streams,
                &mut out,
            );
        }
        33 => {
            let (t, e) = (b.pick(&[0, 1, 3, 8]), b.pick(&[1, 4, 8, 16]));
            let (logits, bias) = (s!(b, F32, [t, e]), s!(b, F32, [e]));
            let (top_k, route_scale) = (arg(b, &[1, 2, 4, 0]), b.float());
            let like = ops::moe_route(&logits, &bias, top_k, route_scale);
            let (li, lw) = match &like {
                Ok((i, w)) => (i, w),
                Err(_) => (&logits, &logits),
            };
            let (mut ids, mut weights) = (out_like(b, li)?, out_like(b, lw)?);
            let _ = ops::moe_route_into(&logits, &bias, top_k, route_scale, &mut ids, &mut weights);
            let ids = if b.bool() {
                ids
            } else {
                s!(b, I32, [t, top_k])
            };
            let n_experts = arg(b, &[e, 1, 16]);
            let like = ops::moe_layout(&ids, n_experts);
            let (lc, lo, lp) = match &like {
                Ok((c, o, p)) => (c, o, p),
                Err(_) => (&ids, &ids, &ids),
            };
            let (mut counts, mut offsets, mut perm) =
                (out_like(b, lc)?, out_like(b, lo)?, out_like(b, lp)?);
            let _ = ops::moe_layout_into(&ids, n_experts, &mut counts, &mut offsets, &mut perm);
        }
        34 => {
            let (batch, n) = (b.pick(&[0, 1, 3]), b.pick(&[1, 8, 16, 64]));
            let (scores, visible) = (s!(b, BF16, [batch, n]), s!(b, I32, [batch]));
            let (k, offset) = (arg(b, &[1, 4, 8, n]), arg(b, &[0, 3]));
            let like = ops::index_topk(&scores, &visible, k, offset);
            let mut out = out_like(b, like.as_ref().unwrap_or(&visible))?;
            let _ = ops::index_topk_into(&scores, &visible, k, offset, &mut out);
            let (block, keep) = (arg(b, &[4, 8, 1]), arg(b, &[1, 2, 4]));
            let like = ops::index_candidates(&scores, &visible, block, keep);
            let mut cands = out_like(b, like.as_ref().unwrap_or(&visible))?;
            let _ = ops::index_candidates_into(&scores, &visible, block, keep, &mut cands);
            let like = ops::index_mask_scores(&scores, &cands, block);
            let mut masked = out_like(b, like.as_ref().unwrap_or(&scores))?;
            let _ = ops::index_mask_scores_into(&scores, &cands, block, &mut masked);
            let like = ops::index_reindex_topk(&scores, &cands, block, &visible, k, offset);
            let mut out = out_like(b, like.as_ref().unwrap_or(&visible))?;
            let _ =
                ops::index_reindex_topk_into(&scores, &cands, block, &visible, k, offset, &mut out);
            let x = s!(b, BF16, [batch, arg(b, &[32, 64, 16])]);
            let like = ops::index_key_quant(&x);
            let mut keys = out_like(b, like.as_ref().unwrap_or(&x))?;
            let _ = ops::index_key_quant_into(&x, &mut keys);
        }
        35 => {
            let (m, n, k) = (
                b.pick(&[0, 1, 3]),
                b.pick(&[1, 8, 32]),
                b.pick(&[32, 64, 8]),
            );
            let (a, w) = (s!(b, BF16, [m, k]), s!(b, BF16, [n, k]));
            let dtype = out_dtype(b);
            let like = ops::bf16_linear(&a, &w, dtype);
            let mut out = out_like(b, like.as_ref().unwrap_or(&a))?;
            let _ = ops::bf16_linear_into(&a, &w, &mut out);
            let g = b.pick(&[1, 2, 4]);
            let (a, a_s) = (s!(b, FP8, [m, k]), s!(b, E8M0, [m, k / 32]));
            let (w, w_s) = (s!(b, FP4, [g, n, k]), s!(b, E8M0, [g, n, k / 32]));
            // Offsets: mostly exclusive prefix sums ending at m.
            let offsets = if b.u8() < 192 {
                let mut cuts: Vec<i32> = (0..g.saturating_sub(1))
                    .map(|_| i32::from(b.u8()) % (m as i32 + 1))
                    .collect();
                cuts.sort_unstable();
                let all: Vec<i32> = [0].into_iter().chain(cuts).chain([m as i32]).collect();
                Tensor::from_vec(all, &[g + 1]).ok()?
            } else {
                s!(b, I32, [g + 1])
            };
            let like = ops::mxfp4_grouped_contiguous(&a, &a_s, &w, &w_s, &offsets, BF16);
            let mut out = out_like(b, like.as_ref().unwrap_or(&a))?;
            let _ = ops::mxfp4_grouped_contiguous_into(&a, &a_s, &w, &w_s, &offsets, &mut out);
            let (a, a_s) = (s!(b, FP8, [g, m, k]), s!(b, E8M0, [g, m, k / 32]));
            let counts = s!(b, I32, [g]);
            let like = ops::mxfp4_grouped_masked(&a, &a_s, &w, &w_s, &counts, BF16);
            let mut out = out_like(b, like.as_ref().unwrap_or(&a))?;
            let _ = ops::mxfp4_grouped_masked_into(&a, &a_s, &w, &w_s, &counts, &mut out);
        }
        36 => {
            // Placement tables: mostly small and near-valid (each rank's
            // slots ascending, every expert present), else at random (the
            // constructor bounds every size itself).
            let (n_experts, ranks) = (arg(b, &[1, 2, 4, 8, 0]), arg(b, &[1, 2, 4, 3]));
            let per_rank = usize::from(b.u8() % 5);
            let table: Vec<usize> = if b.u8() < 160 {
                (0..ranks.min(8))
                    .flat_map(|r| (0..per_rank).map(move |i| (r * per_rank + i) % n_experts.max(1)))
                    .map(|e| if b.u8() < 240 { e } else { b.count() })
                    .collect()
            } else {
                (0..usize::from(b.u8() % 40))
                    .map(|_| {
                        if b.bool() {
                            b.count()
                        } else {
                            usize::from(b.u8() % 16)
                        }
                    })
                    .collect()
            };
            if let Ok(p) = Placement::from_table(n_experts, ranks, table) {
                let len = arg(b, &[n_experts, 3]).min(64);
                let load: Vec<u64> = (0..len).map(|_| b.u64() >> 8).collect();
                let _ = p.rank_loads(&load);
                let _ = p.imbalance(&load);
                let e = arg(b, &[0, n_experts.saturating_sub(1), n_experts]);
                let r = arg(b, &[0, ranks.saturating_sub(1), ranks]);
                let _ = p.physical(e, r, b.count());
                let _ = p.replicas(e);
                let _ = p.local_experts(r);
            }
            let _ = Placement::uniform(arg(b, &[4, 8, 0]), arg(b, &[1, 2, 3, 0]));
            if let Ok(mut load) = ExpertLoad::new(arg(b, &[4, 8, 0])) {
                let ids = t!(b, I32, 1);
                let _ = load.observe(ids.as_slice::<i32>().unwrap_or_default());
            }
        }
        37 => {
            // Expert-parallel dispatch and combine on the one-rank
            // transport: a small placement (uniform or a table), a mode and
            // routing of mostly consistent shapes with fuzzed values.
            let n_experts = b.pick(&[1, 2, 4, 8, 16]);
            let placement = if b.u8() < 192 {
                Placement::uniform(n_experts, 1)
            } else {
                let table: Vec<usize> = (0..usize::from(b.u8() % 20))
                    .map(|_| usize::from(b.u8() % 18))
                    .collect();
                Placement::from_table(n_experts, 1, table)
            };
            let mode = match b.u8() % 3 {
                0 => Mode::Normal,
                1 => Mode::low_latency(arg(b, &[1, 4, 8, 0]), 1),
                _ => Mode::LowLatency {
                    max_tokens: arg(b, &[1, 4, 8]),
                    capacity: arg(b, &[1, 2, 4, 16]),
                },
            };
            let (top_k, hidden) = (arg(b, &[1, 2, 4]), arg(b, &[32, 64, 8]));
            let payload = b.pick(&[Payload::Bf16, Payload::Fp8]);
            let Ok(cfg) = placement.and_then(|p| EpConfig::new(p, top_k, hidden, payload, mode))
            else {
                return None;
            };
            // A legal low-latency config allocates its whole buffer: only
            // the small ones are run (a large one is a config the caller
            // asked for, not a validation gap).
            if let Mode::LowLatency { capacity, .. } = mode
                && cfg
                    .placement()
                    .slots_per_rank()
                    .saturating_mul(capacity)
                    .saturating_mul(hidden)
                    > 1 << 22
            {
                return None;
            }
            let t = b.pick(&[0, 1, 3, 8]);
            let x = s!(b, BF16, [t, hidden]);
            // Routed ids: mostly ascending distinct experts, as moe_route
            // returns them.
            let mut ids: Vec<i32> = Vec::new();
            for _ in 0..t {
                let first = usize::from(b.u8()) % n_experts;
                ids.extend((0..top_k).map(|j| ((first + j) % n_experts) as i32));
                if let Some(row) = ids.rchunks_mut(top_k).next() {
                    row.sort_unstable();
                }
            }
            let ids = if b.u8() < 224 {
                Tensor::from_vec(ids, &[t, top_k]).ok()?
            } else {
                t!(b, I32, 2)
            };
            let weights = s!(b, F32, [t, top_k]);
            let d = ep::dispatch(&Local, &cfg, &x, &ids, &weights);
            let shared = s!(b, BF16, [t, hidden]);
            if let Ok(d) = d {
                let expert_out = match (b.u8() % 4, d.x.dtype()) {
                    (0 | 1, BF16) => d.x,
                    (0 | 1, _) => Tensor::empty(&cpu, BF16, d.x.shape()).ok()?,
                    (2, _) => b.tensor_of(BF16, d.x.shape())?,
                    _ => t!(b, BF16, d.x.shape().len()),
                };
                let _ = ep::combine(&Local, &d.handle, &expert_out, &shared);
            }
        }
        38 => {
            // Exact scale sharing in place: fuzzed codes and scales (shapes
            // that mostly agree), rows per scale and run length.
            let mut codes = t!(b, FP8, 2);
            let (r, k) = match *codes.shape() {
                [r, k] => (r, k),
                _ => (b.count(), b.count()),
            };
            let mut scales = s!(b, E8M0, [r, k.div_ceil(32)]);
            let rps = arg(b, &[1, 32]);
            let group = arg(b, &[64, 128, 256]);
            let _ = ops::mx_share_scales(&mut codes, &mut scales, rps, group);
        }
        39 => {
            // The quantiser with sharing fused: fuzzed activations of any
            // rank and dtype, and run lengths legal or not.
            let x = if b.u8() < 192 {
                let ndim = 1 + usize::from(b.u8() % 3);
                t!(b, BF16, ndim)
            } else {
                let dtype = b.dtype(BF16);
                t!(b, dtype, 2)
            };
            let group = arg(b, &[0, 32, 48, 64, 128, 256, 288]);
            let _ = ops::act_quant_fp8_shared(&x, group);
        }
        _ => {
            // Tensor constructors and row copies.
            let dtype = b.dtype(F32);
            let shape = b.shape(2);
            // A legal shape is allocated as asked: only small ones, and
            // ones beyond any host's memory (2^45 bytes: a typed
            // OutOfMemory), or whose size overflows (a shape error).
            let bytes = shape
                .iter()
                .try_fold(dtype.storage_bytes(1), |n, &d| n.checked_mul(d));
            if bytes.is_none_or(|n| n <= MAX_NUMEL * 8 || n >= 1 << 45) {
                let _ = Tensor::filled_bytes(dtype, &shape, b.u8())
                    .and_then(|t| t.reshape(&b.shape(2)));
                let _ = Tensor::empty(&cpu, dtype, &shape).map(|t| t.storage_bytes());
            }
            let _ = Tensor::from_vec(vec![0f32; usize::from(b.u8())], &shape);
            let mut dst = t!(b, dtype, 2);
            let src = t!(b, dtype, 2);
            let _ = dst.narrow_rows(b.count(), b.count());
            let _ = Tensor::cat_rows(&[&dst, &src]);
            let (d0, s0, n) = (b.count(), b.count(), b.count());
            let _ = dst.copy_rows_from(d0, &src, s0, n);
            let _ = ops::index_key_row_nibbles(b.count() % (1 << 20));
            let _ = ops::kv_row_layout(format(b), b.count() % (1 << 20));
        }
    }
    Some(())
}
