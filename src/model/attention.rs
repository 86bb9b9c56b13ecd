//! One layer's attention over a call's tokens (`v41-flash.md` §3): the query
//! and window-KV paths, the KV source's compressor and index keys, the
//! indexer (with candidate blocks and reindexing) or the reused selection,
//! the sparse MQA with sink, the inverse RoPE and the grouped output LoRA.
//!
//! Two call shapes follow the reference exactly. A prefill (start 0, any
//! length S) attends over [the call's own window rows ‖ compressed entries]
//! with per-query causal windows (window offset S); a decode step (one token
//! at p > 0) writes ring slot p mod window and attends over [ring ‖
//! compressed entries] (window offset = window). Every per-row computation
//! is identical in both, which is what makes decode match prefill.

use super::config::{AttentionPlan, LayerPlan, ModelConfig, Selection};
use super::state::{LayerState, SourceCaches};
use super::weights::{AttentionWeights, CompressorWeights, IndexerWeights};
use crate::cpu_backend::kv_format::{decode_index_key_row, decode_window_row};
use crate::cpu_backend::kv_format::{
    encode_compressed_row, encode_index_key_row, encode_window_row,
};
use crate::cpu_backend::sparse_attention::{
    sparse_mqa, window_indices_decode, window_indices_prefill,
};
use crate::cpu_backend::{RopeParams, Yarn, bf16_gemm, indexer, inverse_rope, rms_norm, rope};
use half::bf16;
use std::collections::HashMap;

/// Selections published by earlier layers of the same call.
#[derive(Default)]
pub struct Published {
    /// Index source → one compressed index list per query.
    pub topk: HashMap<usize, Vec<Vec<i32>>>,
    /// Candidate source → one mask over its entries per query.
    pub candidates: HashMap<usize, Vec<Vec<bool>>>,
}

/// The call being run: its first position and token count.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub start: usize,
    pub len: usize,
}

impl Call {
    fn positions(&self) -> Vec<i64> {
        (self.start..self.start + self.len)
            .map(|p| p as i64)
            .collect()
    }

    fn is_prefill(&self) -> bool {
        self.start == 0
    }
}

fn rope_params(plan: &LayerPlan) -> RopeParams {
    RopeParams {
        theta: plan.rope.theta,
        yarn: plan.rope.yarn.map(|y| Yarn {
            factor: y.factor,
            original_seq_len: y.original_seq_len as u64,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
        }),
    }
}

/// Runs the compressor of a KV source over the call's tokens, appending the
/// entries (and index keys) of every group completed in this call.
fn compress(
    cfg: &ModelConfig,
    plan: &LayerPlan,
    w: &AttentionWeights,
    cw: &CompressorWeights,
    x: &[bf16],
    call: Call,
    caches: &mut SourceCaches,
) {
    let (hd, rd) = (cfg.attention.head_dim, cfg.attention.rope_head_dim);
    let eps = cfg.norm_eps as f32;
    let rope_p = rope_params(plan);
    let mut latents = Vec::new();
    match &cw.wgate {
        Some(wgate) => {
            let kv = cw.wkv.forward_f32(x, call.len);
            let score = wgate.forward_f32(x, call.len);
            for t in 0..call.len {
                let (k, s) = (
                    kv[t * hd..(t + 1) * hd].to_vec(),
                    score[t * hd..(t + 1) * hd].to_vec(),
                );
                if let Some(pooled) = caches.pending.push(k, s) {
                    latents.push(rms_norm(&pooled, &cw.norm, 1, hd, eps));
                }
            }
        }
        None => {
            let kv = cw.wkv.forward(x, call.len);
            latents.extend(kv.chunks(hd).map(|k| rms_norm(k, &cw.norm, 1, hd, eps)));
        }
    }
    for latent in latents {
        let pos = [(caches.entries.len() * plan.ratio) as i64];
        if let Some(keys) = w.indexer.as_ref().and_then(|i| i.keys.as_ref()) {
            let id = cfg.indexer.head_dim;
            let k = rms_norm(&keys.wk.forward(&latent, 1), &keys.k_norm, 1, id, eps);
            caches
                .keys
                .push(encode_index_key_row(&rope(&k, &pos, 1, id, rd, &rope_p)));
        }
        caches.entries.push(encode_compressed_row(&rope(
            &latent, &pos, 1, hd, rd, &rope_p,
        )));
    }
}

/// The indexer of an index source: one compressed index list per query.
#[allow(clippy::too_many_arguments)]
fn index(
    cfg: &ModelConfig,
    plan: &LayerPlan,
    iw: &IndexerWeights,
    x: &[bf16],
    qr: &[bf16],
    call: Call,
    keys_from: &SourceCaches,
    offset: usize,
    published: &mut Published,
) -> Vec<Vec<i32>> {
    let (ih, id, rd) = (
        cfg.indexer.n_heads,
        cfg.indexer.head_dim,
        cfg.attention.rope_head_dim,
    );
    let end = call.start + call.len;
    let k = cfg.indexer.topk.min(end / plan.ratio);
    if k == 0 {
        return vec![Vec::new(); call.len];
    }
    let q = rope(
        &iw.wq_b.forward(qr, call.len),
        &call.positions(),
        ih,
        id,
        rd,
        &rope_params(plan),
    );
    let q: Vec<bf16> = q
        .chunks(id)
        .flat_map(|h| decode_index_key_row(&encode_index_key_row(h), id))
        .collect();
    let c = ((id * ih) as f64).powf(-0.5) as f32;
    let weights: Vec<bf16> = iw
        .weights_proj
        .forward(x, call.len)
        .iter()
        .map(|w| bf16::from_f32(w.to_f32() * c))
        .collect();
    let keys = keys_from.key_rows(id);
    let mut masks = Vec::new();
    let lists = (0..call.len)
        .map(|i| {
            let visible = (call.start + i + 1) / plan.ratio;
            let mut scores = indexer::index_scores(
                &q[i * ih * id..(i + 1) * ih * id],
                &keys,
                &weights[i * ih..(i + 1) * ih],
                id,
                visible,
            );
            if plan.candidate_source {
                let cand = cfg
                    .candidate
                    .expect("validated: a candidate source has candidate settings");
                masks.push(indexer::candidate_mask(
                    &scores,
                    visible,
                    cand.block_size,
                    cand.topk_blocks,
                ));
            }
            if let Some(c) = plan.candidates_from() {
                scores = indexer::mask_scores(&scores, &published.candidates[&c][i]);
            }
            indexer::select(&scores, k, visible, offset)
        })
        .collect();
    if plan.candidate_source {
        published.candidates.insert(plan.layer, masks);
    }
    lists
}

/// Attention of layer `plan.layer` for the call's inputs `x` (`[len, D]`,
/// the `attn_norm` output); returns `[len, D]` and each query's compressed
/// index list (window offset included; empty for window-only layers).
pub fn attention(
    cfg: &ModelConfig,
    plan: &LayerPlan,
    w: &AttentionWeights,
    x: &[bf16],
    call: Call,
    states: &mut [LayerState],
    published: &mut Published,
) -> (Vec<bf16>, Vec<Vec<i32>>) {
    let a = cfg.attention;
    let (h, hd, rd) = (a.n_heads, a.head_dim, a.rope_head_dim);
    let eps = cfg.norm_eps as f32;
    let rope_p = rope_params(plan);
    let positions = call.positions();

    let qr = rms_norm(
        &w.wq_a.forward(x, call.len),
        &w.q_norm,
        call.len,
        a.q_lora_rank,
        eps,
    );
    let q = rope(
        &w.wq_b.forward(&qr, call.len),
        &positions,
        h,
        hd,
        rd,
        &rope_p,
    );
    let kv = rms_norm(&w.wkv.forward(x, call.len), &w.kv_norm, call.len, hd, eps);
    let kv_rows: Vec<Vec<u8>> = rope(&kv, &positions, 1, hd, rd, &rope_p)
        .chunks(hd)
        .map(encode_window_row)
        .collect();
    let state = &mut states[plan.layer];
    for (i, row) in kv_rows.iter().enumerate() {
        state.ring.write(call.start + i, row.clone());
    }
    let (window_rows, offset) = if call.is_prefill() {
        (
            kv_rows
                .iter()
                .flat_map(|r| decode_window_row(r, hd))
                .collect::<Vec<_>>(),
            call.len,
        )
    } else {
        (state.ring.rows(), a.window)
    };

    if let (Some(cw), Some(caches)) = (&w.compressor, state.source.as_mut()) {
        compress(cfg, plan, w, cw, x, call, caches);
    }
    let (compressed_lists, compressed_rows) = match plan.attention {
        AttentionPlan::WindowOnly => (vec![Vec::new(); call.len], Vec::new()),
        AttentionPlan::Sparse {
            kv_source,
            selection,
        } => {
            let src = states[kv_source]
                .source
                .as_ref()
                .expect("validated: the KV source owns caches");
            let lists = match selection {
                Selection::Indexer { .. } => {
                    let iw = w
                        .indexer
                        .as_ref()
                        .expect("validated: an index source has indexer weights");
                    let lists = index(cfg, plan, iw, x, &qr, call, src, offset, published);
                    published.topk.insert(plan.layer, lists.clone());
                    lists
                }
                Selection::Reuse { index_source } => published.topk[&index_source].clone(),
            };
            (lists, src.entry_rows(hd))
        }
    };
    let mut rows = window_rows;
    rows.extend(compressed_rows);

    let mut o = Vec::with_capacity(call.len * h * hd);
    for (i, &p) in positions.iter().enumerate() {
        let p = p as usize;
        let mut list = if call.is_prefill() {
            window_indices_prefill(p, call.len, a.window)
        } else {
            window_indices_decode(p, a.window)
        };
        list.extend(&compressed_lists[i]);
        o.extend(sparse_mqa(&q[i * h * hd..(i + 1) * h * hd], &rows, &list, &w.sink, hd).out);
    }
    let o = inverse_rope(&o, &positions, h, hd, rd, &rope_p);
    (output_projection(cfg, w, &o, call.len), compressed_lists)
}

/// Grouped `wo_a` (block-diagonal BF16 × BF16 per group) then `wo_b`:
/// `o` is `[len, heads · head_dim]`, the result `[len, D]`.
pub(super) fn output_projection(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    o: &[bf16],
    len: usize,
) -> Vec<bf16> {
    let a = cfg.attention;
    let (g, rank) = (a.o_groups, a.o_lora_rank);
    let width = a.n_heads / g * a.head_dim;
    let mut y = vec![bf16::ZERO; len * g * rank];
    for gi in 0..g {
        let og: Vec<bf16> = o
            .chunks(a.n_heads * a.head_dim)
            .flat_map(|r| r[gi * width..(gi + 1) * width].to_vec())
            .collect();
        let yg = bf16_gemm(
            &og,
            &w.wo_a[gi * rank * width..(gi + 1) * rank * width],
            len,
            rank,
            width,
        );
        for t in 0..len {
            y[t * g * rank + gi * rank..t * g * rank + (gi + 1) * rank]
                .copy_from_slice(&yg[t * rank..(t + 1) * rank]);
        }
    }
    w.wo_b.forward(&y, len)
}
