//! The op API's validation under fuzzed dtypes, shapes, values and scalar
//! arguments, on the CPU device: every call must return `Ok` or a typed
//! `Err`. Tensors are built mostly with the dtype and rank each argument
//! expects (so the fuzzer gets past the first check), otherwise at random.

use super::Bytes;
use super::bytes::MAX_NUMEL;
use deepinfer::contract::{RopeParams, Yarn};
use deepinfer::ops::{
    self, ActQuantImpl, GemmImpl, KvRowFormat, MhcParams, RowNorm, RowRope, RowsOut, ScoreKernel,
    SparseMqaKernel,
};
use deepinfer::{DType, Device, Tensor};

use DType::{BF16, E8M0, F4E2M1x2 as FP4, F8E4M3 as FP8, F32, I32, I64, U8};

/// Number of op families [`ops`] dispatches over.
pub const OPS: u8 = 30;

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
            let (g, u, w) = (t!(b, BF16, 2), t!(b, BF16, 2), t!(b, F32, 1));
            let _ = ops::swiglu_act_quant_fp8(&g, &u, &w, b.float());
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
                    SparseMqaKernel::V1,
                    SparseMqaKernel::V2,
                    SparseMqaKernel::V3,
                    SparseMqaKernel::V3Heads32,
                    SparseMqaKernel::V3Heads16,
                    SparseMqaKernel::V4,
                ]);
                let _ = ops::sparse_mqa_into_with(
                    &q, &window, &idx, compressed, &sink, &mut out, &mut lse, k,
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
                let imp = b.pick(&[GemmImpl::Auto, GemmImpl::Large, GemmImpl::Skinny]);
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
