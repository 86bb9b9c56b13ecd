/* Kernel parameter structs shared by the CUDA kernels and Rust (bindgen).
 * Kernels take one struct by value as a __grid_constant__ argument, so host
 * and device agree on its layout by construction. Plain C: no C++ types.
 * Pointers are device addresses; every tensor is dense and row-major. */
#ifndef DEEPINFER_PARAMS_H
#define DEEPINFER_PARAMS_H

#include <stdint.h>

/* RMSNorm over rows of `dim` BF16 values:
 * out[r, i] = bf16(weight[i] * (x[r, i] * 1 / sqrt(sum_i x[r, i]^2 / dim + eps))). */
typedef struct di_rms_norm_params {
    const void *x;      /* bf16 [rows, dim] */
    const void *weight; /* bf16 [dim] */
    void *out;          /* bf16 [rows, dim] */
    int64_t rows;
    int32_t dim;
    float eps;
} di_rms_norm_params;

/* FP8 1x32 activation quantisation with E8M0 scales (v41-flash.md 10.1). */
typedef struct di_act_quant_params {
    const void *x;  /* bf16 [rows, k] */
    void *q;        /* e4m3 [rows, k] */
    void *scale;    /* e8m0 [rows, ceil(k / 32)] */
    int64_t rows;
    int32_t k;
} di_act_quant_params;

/* act_quant_fp8_vec8_shared: the 1x32 quantisation, then exact scale sharing
 * inside every run of `per` blocks (numerics::share_mx_scales with one row
 * per scale), fused; k % (32 * per) == 0, per in {2, 4, 8}. */
typedef struct di_act_quant_shared_params {
    const void *x;  /* bf16 [rows, k] */
    void *q;        /* e4m3 [rows, k] */
    void *scale;    /* e8m0 [rows, k / 32] */
    int64_t rows;
    int32_t k;
    int32_t per;
} di_act_quant_shared_params;

/* mxfp8_dequant_bf16: out[r, c] = bf16_rn(e4m3(w[r, c]) * 2^(s[r / 32, c / 32]
 * - 127)), a NaN as 0x7FC0 (cpu_backend::mxfp8_dequantize). */
typedef struct di_dequant_params {
    const void *w;  /* e4m3 [n, k] */
    const void *s;  /* e8m0 [ceil(n / 32), ceil(k / 32)] */
    void *out;      /* bf16 [n, k] */
    int64_t n;
    int64_t k;
} di_dequant_params;

/* mx_share_scales: in place, every run of `per` 32-deep blocks of each scale
 * row shares its largest E8M0 scale where every shifted e4m3 code is exact
 * (numerics::share_mx_scales, bitwise). */
typedef struct di_share_scales_params {
    void *codes;         /* e4m3 [rows, k] */
    void *scales;        /* e8m0 [ceil(rows / rows_per_scale), ceil(k / 32)] */
    int64_t rows;
    int64_t k;
    int32_t rows_per_scale;
    int32_t per;         /* blocks per run, 1..8 */
} di_share_scales_params;

/* A CUDA tensor map (CUtensorMap) encoded on the host by cuTensorMapEncodeTiled
 * (src/cuda_backend/tma.rs): opaque, 128 bytes, 64-byte aligned. Kernels pass
 * its address in parameter space to the TMA instructions. */
typedef struct __attribute__((aligned(64))) di_tensor_map {
    uint64_t opaque[16];
} di_tensor_map;

/* ---- gemm/: block-scaled GEMMs for large M (helper "wgmma-large") --------- */

/* out[m, n] = sum over K blocks of 32 of (fp32 block sum of a * b) * a_s * b_s,
 * BF16 or F32 (kernels-cuda/gemm/mx_gemm.cu). One struct serves both
 *   mxfp8_gemm_*: a [m, k] e4m3, a_s [m, ceil(k/32)] e8m0, b [n, k] e4m3,
 *     b_s [ceil(n/32), ceil(k/32)] e8m0; offsets unused (null), groups = 1;
 *   mxfp4_grouped_contiguous_*: a [m = T, k] e4m3 rows grouped by expert,
 *     a_s [T, ceil(k/32)], b [groups, n, k] packed e2m1 (k / 2 bytes a row),
 *     b_s [groups, n, ceil(k/32)], offsets [groups + 1] int32 on the device.
 * a_map: a as a 2D uint8 map (k, m), box 128 x 128, 128-byte swizzle.
 * b_map: dense b as a 2D uint8 map (k, n), box 128 x 128, 128-byte swizzle;
 *   FP4 b as a 3D uint8 map (k / 2, n, groups), box 64 x 128 x 1, no swizzle.
 * out [m, n] row-major.
 * Split tiles (dense only; splits = 1 and whole_tiles unused for FP4): tiles
 *   [0, whole_tiles) of the tile order run whole; each later tile runs as
 *   `splits` pieces of its K stages (piece i: stages [i S / splits,
 *   (i + 1) S / splits), or with stages_per_piece = P > 0 stages [i P,
 *   min((i + 1) P, S)): the skinny kernel's split, gemm_skinny's split_k,
 *   for the batch-invariant mode), work unit whole_tiles + (t - whole_tiles) * splits
 *   + i. A piece writes its fp32 partial tile to partials[(t - whole_tiles)
 *   * splits + i][128 * 128] (consumer-register layout); the last piece of a
 *   tile to finish (ticket tickets[t - whole_tiles], zero before and after a
 *   launch) adds the pieces in order 0, 1, ... from +0.0 and writes out. */
typedef struct di_mx_gemm_params {
    di_tensor_map a_map;
    di_tensor_map b_map;
    const void *a;
    const void *a_s;
    const void *b;
    const void *b_s;
    const int32_t *offsets;
    void *out;
    float *partials;
    uint32_t *tickets;
    int32_t m;
    int32_t n;
    int32_t k;
    int32_t groups;
    int32_t whole_tiles;
    int32_t splits;
    int32_t stages_per_piece;
} di_mx_gemm_params;

/* ---- indexer/: index-key rows, index scores, exact top-k (helper "indexer") */

/* An index-key row (keys and queries): dim / 2 bytes of packed e2m1 (even
 * element in the low nibble), then dim / 32 E8M0 scale bytes (kv_format). */

/* BF16 rows -> index-key rows, bitwise kv_format::encode_index_key_row. */
typedef struct di_indexer_quant_params {
    const void *x; /* bf16 [rows, dim] */
    void *out;     /* index-key rows [rows, dim / 2 + dim / 32] bytes */
    int64_t rows;
    int32_t dim; /* multiple of 32 */
} di_indexer_quant_params;

/* scores[b, t] = bf16(sum_h bf16(w[b, h] * relu(bf16(q[b, h] . keys[b, t])))),
 * -inf for t >= visible[b]; bitwise cpu_backend::indexer::index_scores. */
typedef struct di_indexer_score_params {
    const void *q;       /* index-key rows [batch, heads] */
    const void *w;       /* bf16 [batch, heads], already x 2^-6 */
    const void *keys;    /* index-key rows [n] per batch row, key_batch_stride bytes apart */
    const int32_t *visible; /* [batch] */
    void *scores;        /* bf16 [batch, n] */
    int64_t n;
    int64_t key_batch_stride; /* bytes; 0 = one key cache shared by every row */
    int32_t batch;
    int32_t heads;
    int32_t dim; /* multiple of 32 */
    /* Paged keys when pages != NULL (key_batch_stride unused): key t of row
     * b is row pages[b * pages_stride + t / page_rows] * page_rows +
     * t % page_rows of keys, a pool of pool_pages pages; a key on a page
     * outside [0, pool_pages) scores -inf (nothing is read for it). The
     * tensor-core kernel needs page_rows a multiple of its 32-key tile. */
    const int32_t *pages;
    int64_t pages_stride;
    int64_t page_rows;
    int64_t pool_pages;
} di_indexer_score_params;

/* indexer_scores_fast (same parameters): dim 128, heads <= 32, keys 4-byte
 * aligned; CTA = DI_INDEXER_FAST_THREADS threads (one key stream per warp,
 * DI_INDEXER_FAST_STAGES 32-key tiles in flight per warp) with
 * DI_INDEXER_FAST_SMEM_BYTES of dynamic shared memory; grid (any, batch). */
#define DI_INDEXER_FAST_THREADS 128
#define DI_INDEXER_FAST_STAGES 4
#define DI_INDEXER_FAST_SMEM_BYTES 46400

/* Most segments a top-k row is split into (every CTA sums its row's
 * per-segment histograms; the host's TOPK_MAX_SEGMENTS). */
#define DI_INDEXER_TOPK_MAX_SEGMENTS 128

/* out[b, :k] = cpu_backend::indexer::select(scores[b], k, visible[b], offset):
 * the k largest (ties to the lower index), ascending, picks >= visible as -1. */
typedef struct di_indexer_topk_params {
    const void *scores;     /* bf16 [batch, n] */
    const int32_t *visible; /* [batch] */
    uint32_t *hist_hi;      /* workspace [batch, segments, 256] */
    uint32_t *hist_lo;      /* workspace [batch, segments, 256] */
    uint16_t *chunk_max;    /* workspace [batch, chunks]: each chunk's largest key */
    int32_t *out;           /* [batch, k] */
    int64_t n;
    int64_t seg_len; /* a multiple of 4096 (the kernel's chunk) */
    int64_t chunks;  /* ceil(n / 4096) */
    int32_t batch;
    int32_t k; /* 1 <= k <= n */
    int32_t segments; /* ceil(n / seg_len) <= DI_INDEXER_TOPK_MAX_SEGMENTS */
    int32_t offset;
} di_indexer_topk_params;

/* Candidate-block path (v41-flash.md 3.6-3.7; kernels-cuda/indexer/README.md):
 *   indexer_block_scores: grid (any, batch), 256 threads; writes block_scores.
 *   indexer_candidates_compact: grid (batch), 512 threads; cand_in -> cand_out
 *     (may alias) [batch, k]: picks whose block score is -inf dropped, -1 tail.
 *   indexer_mask_scores: grid (ceil(blocks / span), batch), 256 threads;
 *     out[b, t] = scores[b, t] if block t / block is listed in cand_in[b]
 *     (k entries, any order; entries outside [0, blocks) ignored) else -inf. */
#define DI_INDEXER_MASK_MAX_SPAN 2048
typedef struct di_indexer_block_params {
    const void *scores;     /* bf16 [batch, n] */
    const int32_t *visible; /* [batch], clamped to [0, n] */
    void *block_scores;     /* bf16 [batch, blocks] */
    const int32_t *cand_in; /* [batch, k] */
    int32_t *cand_out;      /* [batch, k] */
    void *out;              /* bf16 [batch, n] masked scores */
    int64_t n;
    int64_t blocks; /* ceil(n / block) */
    int32_t batch;
    int32_t block; /* entries per block, 1 .. 4096 */
    int32_t k;     /* candidate list width */
    int32_t span;  /* mask: blocks per CTA, 1 .. DI_INDEXER_MASK_MAX_SPAN */
} di_indexer_block_params;

/* ---- gemm_skinny/: block-scaled GEMMs for decode, M <= 64 (helper "wgmma-skinny") */

/* out[m, n] = sum over K blocks of 32 of (fp32 block sum of a * b) * a_s * b_s,
 * BF16 or F32 (kernels-cuda/gemm_skinny/gemm_skinny.cu). k % 16 == 0.
 *   gemm_skinny_fp8: a [m, k] e4m3 (m in 1..64), a_scale [m, ceil(k/32)] e8m0,
 *     b [n, k] e4m3, b_scale [ceil(n/32), ceil(k/32)] e8m0; counts null,
 *     experts 1. Grid (ceil(n/64), splits); with splits > 1, out is an f32
 *     workspace [splits, m, n] (out_f32 = 1) summed by mxfp8_gemm_skinny_reduce.
 *   gemm_skinny_fp4_masked: a [experts, m = max_m, k] e4m3, a_scale
 *     [experts, max_m, ceil(k/32)], b [experts, n, k] packed e2m1 (k/2 bytes a
 *     row), b_scale [experts, n, ceil(k/32)], counts [experts] int32 (clamped
 *     to [0, max_m]); out [experts, max_m, n], rows >= count untouched.
 *     Grid (ceil(n/64), groups); chunks_per_split unused.
 * Entry points _n8/_n16/_n32/_n64 name the launch's largest token tile, which
 * sets the dynamic shared memory size (src/cuda_backend/gemm_skinny.rs).
 * Version 2 (gemm_skinny_v2_*) also reads the members after out_f32 (version 1
 * ignores them):
 *   gemm_skinny_v2_fp8: out is the real output; grid (ceil(n/64) *
 *     token_halves, splits); token_halves (1 or 2) splits m > 32 into two
 *     32-row halves; with splits > 1, workspace is f32 [splits, m, n] and
 *     tickets u32 [ceil(n/64) * token_halves], all zero before the launch and
 *     left zero after it (the last CTA of a tile sums the splits and resets).
 *   gemm_skinny_v2_fp4_masked: 1-D persistent grid; workspace, tickets unused. */
typedef struct di_gemm_skinny_params {
    const void *a;
    const void *a_scale;
    const void *b;
    const void *b_scale;
    const int32_t *counts;
    void *out;
    int32_t m;
    int32_t n;
    int32_t k;
    int32_t experts;
    int32_t chunks_per_split;
    int32_t out_f32;
    float *workspace;
    uint32_t *tickets;
    int32_t token_halves;
} di_gemm_skinny_params;

/* Masked FP4 MoE version 6 (gemm_skinny/gemm_skinny_v6.cu): the skinny
 * parameters plus b_map, b as a 2D uint8 map (k / 2, experts * n), box 128
 * bytes x 64 rows, 128-byte swizzle. */
typedef struct di_masked_v6_params {
    di_tensor_map b_map;
    di_gemm_skinny_params p;
} di_masked_v6_params;

/* out[i] = sum over s in order of partials[s * count + i], BF16 or F32. */
typedef struct di_gemm_skinny_reduce_params {
    const float *partials;
    void *out;
    int64_t count;
    int32_t splits;
    int32_t out_f32;
} di_gemm_skinny_reduce_params;

/* ---- attention/: sparse MQA over the V4.1 cache rows ---------------------- */

/* out[t, h] = softmax over window_idx[t] || compressed_idx[t] (blocks of 64,
 * sink in the denominator) of (q[t, h] . row) * scale, times the rows (K = V);
 * lse[t, h] natural log. Rows: window [nw, 528] (512 e4m3 + 16 E8M0), compressed
 * [nc, 288] (256 B packed e2m1 + 32 e4m3); an index < 0 or >= its pool's row
 * count is no row (never read). D = 512, h a multiple of 64. */
typedef struct di_sparse_mqa_params {
    const void *q;                 /* bf16 [t, h, 512] */
    const void *window;            /* u8 [nw, 528] */
    const int32_t *window_idx;     /* [t, kw] */
    const void *compressed;        /* u8 [nc, 288] (unused when kc == 0) */
    const int32_t *compressed_idx; /* [t, kc] */
    const float *sink;             /* [h] */
    void *out;                     /* bf16 [t, h, 512] */
    float *lse;                    /* [t, h] */
    int64_t nw;                    /* window rows (indices >= nw are no row) */
    int64_t nc;                    /* compressed rows */
    int32_t h;
    int32_t kw;
    int32_t kc;
    int32_t d;                     /* latent width: 512 for v1-v5 (which ignore it);
                                      sparse_mqa_generic takes any multiple of 64
                                      up to DI_SPARSE_MQA_GENERIC_MAX_DIM */
    float scale;                   /* d^-0.5 */
    int32_t split;                 /* split-KV: entries per CTA (a multiple of 64, grid z =
                                      ceil((kw + kc) / split)), writing part_out and
                                      part_lse instead of out and lse; 0: one CTA per
                                      query (versions 3, 5, 6, 7; generic takes 0 only) */
    float *part_out;               /* f32 [t, splits, h, 512] (split > 0) */
    float *part_lse;               /* f32 [t, splits, h]: partial lse without the sink,
                                      -inf for a span without rows */
} di_sparse_mqa_params;

/* sparse_mqa_combine: grid (t, h), DI_SPARSE_MQA_COMBINE_THREADS threads:
 * out and lse of each (query, head) from its splits' part_out and part_lse
 * and the sink; a query whose splits hold no row gets zeros and lse = +inf,
 * as one CTA gives. */
typedef struct di_sparse_mqa_combine_params {
    const float *part_out;         /* f32 [t, splits, h, 512] */
    const float *part_lse;         /* f32 [t, splits, h] */
    const float *sink;             /* [h] */
    void *out;                     /* bf16 [t, h, 512] */
    float *lse;                    /* [t, h] */
    int32_t h;
    int32_t splits;
} di_sparse_mqa_combine_params;
#define DI_SPARSE_MQA_COMBINE_THREADS 128

/* sparse_mqa_v3: grid (t, h / 64), DI_SPARSE_MQA_THREADS threads and
 * DI_SPARSE_MQA_SMEM_BYTES of dynamic shared memory; sparse_mqa_v5_h32 and
 * _h16: grid (t, h / 32) and (t, h / 16), DI_SPARSE_MQA_THREADS threads and
 * the _H32 / _H16 bytes (the kernel static-asserts its carve-up). */
#define DI_SPARSE_MQA_THREADS 384
#define DI_SPARSE_MQA_SMEM_BYTES 230400
#define DI_SPARSE_MQA_H32_SMEM_BYTES 181248
#define DI_SPARSE_MQA_H16_SMEM_BYTES 156672
/* sparse_mqa_v8 and _v9 (the layout of the former version 7): grid
 * (t, h / 64), DI_SPARSE_MQA_THREADS threads; its
 * shared memory holds a raw-row stage of 64 x 528 bytes in place of the
 * partial-logit exchange. */
#define DI_SPARSE_MQA_V7_SMEM_BYTES 231424
/* sparse_mqa_v11: grid (t, h / 64), DI_SPARSE_MQA_V11_THREADS threads (8
 * producer warps, two consumer warpgroups), DI_SPARSE_MQA_SMEM_BYTES. */
#define DI_SPARSE_MQA_V11_THREADS 512
/* sparse_mqa_v12 and sparse_mqa_v14: grid (t, h / 64),
 * DI_SPARSE_MQA_THREADS threads (a producer warpgroup, two consumer
 * warpgroups), DI_SPARSE_MQA_SMEM_BYTES. */
/* sparse_mqa_generic: grid (t, h), DI_SPARSE_MQA_GENERIC_THREADS threads and
 * (2 d + 192) * 4 bytes of dynamic shared memory (under 48 KiB up to the
 * largest d). */
#define DI_SPARSE_MQA_GENERIC_THREADS 128
#define DI_SPARSE_MQA_GENERIC_MAX_DIM 4096

/* Cache-row writers (kernels-cuda/kv/README.md): per row, an input value
 * (kv_rows_bf16: a BF16 row of x; kv_rows_pool2: the ratio-2 compressor's
 * two-way softmax pooling of two fp32 kv/score rows, rounded to BF16), then
 * the optional RMSNorm (latent = its BF16 output, written when latent is
 * set), the optional RoPE on the last rope_dim values, then the cache row of
 * `format` (DI_KV_FORMAT_*) written to out row slots[i] (row i when slots is
 * NULL; a slot outside [0, out_rows) is not written). A pool2 group whose
 * source row is out of range writes nothing. Bitwise the CPU composition of
 * cpu_backend::{compressor, rms_norm, rope} and kv_format. */
typedef struct di_kv_rows_params {
    const void *x;               /* bf16 [rows, dim] (kv_rows_bf16) */
    const float *kv;             /* f32 [kv_rows, dim] (kv_rows_pool2) */
    const float *score;          /* f32 [kv_rows, dim] */
    const float *pending_kv;     /* f32 [pending_rows, dim] or NULL */
    const float *pending_score;  /* f32 [pending_rows, dim] or NULL */
    const int32_t *groups;       /* [rows, 2]: r >= 0 kv row r, r < 0 pending row -1 - r;
                                    NULL: group i is kv rows 2i, 2i + 1 */
    const void *norm;            /* bf16 [dim] RMSNorm weight, or NULL (no norm) */
    const int64_t *positions;    /* [rows], or NULL (no RoPE) */
    void *latent;                /* bf16 [rows, dim] or NULL */
    void *out;                   /* bytes [out_rows, row_bytes] or NULL */
    const int32_t *slots;        /* [rows] or NULL */
    int64_t rows;
    int64_t kv_rows;
    int64_t pending_rows;
    int64_t out_rows;
    int32_t dim;                 /* multiple of 32 (16 for the compressed format), <= DI_KV_MAX_DIM */
    int32_t rope_dim;            /* multiple of 8, <= DI_KV_MAX_ROPE_DIM (256) and dim */
    int32_t format;
    float eps;
    float freqs[128];            /* [rope_dim / 2] fp32 (cpu_backend::rope_freqs), by value */
} di_kv_rows_params;

/* Row formats (kv_format): 528-byte FP8 window row, 288-byte FP4 compressed
 * row (E4M3 scales per 16), FP4 index-key row (E8M0 scales per 32). */
#define DI_KV_FORMAT_WINDOW 0
#define DI_KV_FORMAT_COMPRESSED 1
#define DI_KV_FORMAT_INDEX_KEY 2
/* Grid ceil(rows / R) of T threads: R, T = DI_KV_ROWS_BF16, DI_KV_THREADS_BF16
 * (kv_rows_bf16) or DI_KV_ROWS_POOL2, DI_KV_THREADS_POOL2 (kv_rows_pool2);
 * dynamic shared memory R * (2 * dim + 16 + 4 * rope_dim + 48) + 2 * dim
 * bytes. */
#define DI_KV_ROWS_BF16 32
#define DI_KV_THREADS_BF16 256
#define DI_KV_ROWS_POOL2 8
#define DI_KV_THREADS_POOL2 128
#define DI_KV_MAX_DIM 4096
#define DI_KV_MAX_ROPE_DIM 256

/* ---- The forward's glue (elementwise/, embedding/, hc_streams/, engram/,
 * moe/): one fp32 operation per element, or a gather; grid-stride kernels
 * over int64 element counts. A `bad` slot is an int64 on the device that
 * the host sets to INT64_MAX; a kernel lowers it (atomicMin) to the first
 * position whose index input is out of range, skips that position's
 * writes, and the host turns it into a typed error after the launch. ---- */

/* scale_{bf16,f32}: out = x * s; div_{bf16,f32}: out = x / s; add_f32:
 * out = a + b. fp32 math (IEEE, no contraction), one rounding to x's dtype. */
typedef struct di_elementwise_params {
    const void *a;  /* [n] */
    const void *b;  /* [n] (add_f32) or NULL */
    void *out;      /* [n], a's dtype */
    int64_t n;
    float s;
} di_elementwise_params;

/* copy_cols: dst[r, dst_col .. dst_col + width) = src[r, 0 .. width), in
 * bytes (one part of cat_cols). */
typedef struct di_copy_cols_params {
    const void *src;    /* bytes [rows, width] */
    void *dst;          /* bytes [rows, dst_pitch] */
    int64_t rows;
    int64_t width;
    int64_t dst_pitch;
    int64_t dst_col;
} di_copy_cols_params;

/* embedding_bf16: out[t] = table[ids[t]] (d BF16 values); an id outside
 * [0, vocab) lowers *bad to t. */
typedef struct di_embedding_params {
    const void *table;    /* bf16 [vocab, d] */
    const int32_t *ids;   /* [tokens] */
    void *out;            /* bf16 [tokens, d] */
    long long *bad;
    int64_t tokens;
    int64_t vocab;
    int64_t d;
} di_embedding_params;

/* argmax_f32: out[r] = the index of row r's largest value; ties to the
 * lowest index, a NaN never beats a number, an all-NaN row gives 0
 * (numerics::argmax). One CTA of DI_ARGMAX_THREADS per row.
 * first_non_finite_f32 (same struct): out[r] = the lowest index of a NaN or
 * +-Inf in row r, -1 when the row is finite. */
typedef struct di_argmax_params {
    const float *x;  /* [rows, v] */
    int32_t *out;    /* [rows] */
    int64_t rows;
    int32_t v;
} di_argmax_params;
#define DI_ARGMAX_THREADS 512

/* hc_init_bf16: out[t, c, :] = x[t, :] for c < 4; hc_collapse_bf16:
 * out[t, :] = bf16(sum_c pre[t, c] * S[t, c, :]) from 0.0, c ascending;
 * hc_stream_mean_bf16: out[t, :] = bf16((((S0 + S1) + S2) + S3) / 4). */
typedef struct di_hc_params {
    const void *x;      /* hc_init: bf16 [tokens, d]; else streams bf16 [tokens, 4, d] */
    const float *pre;   /* hc_collapse: [tokens, 4]; else NULL */
    void *out;          /* hc_init: bf16 [tokens, 4, d]; else bf16 [tokens, d] */
    int64_t tokens;
    int64_t d;
} di_hc_params;

/* engram_rows: rows[t, col] = rem_euclid(h_n, primes[col]) + offsets[col]
 * with n = 2 + col / heads and h the rolling XOR hashes of ids[t, 0..4]
 * (cpu_backend::engram::{ngram_hashes, table_rows}). */
#define DI_ENGRAM_MAX_COLS 64
typedef struct di_engram_rows_params {
    const int64_t *ids;  /* [tokens, 4] */
    int64_t *rows;       /* [tokens, cols] */
    int64_t tokens;
    int64_t multipliers[4];
    int64_t primes[DI_ENGRAM_MAX_COLS];
    int64_t offsets[DI_ENGRAM_MAX_COLS];  /* the sum of the primes before each column */
    int32_t cols;
    int32_t heads;       /* cols / 3 */
} di_engram_rows_params;

/* engram_lookup_bf16: out[e, :] = bf16(e4m3(table[rows[e], i]) * e8m0(scale
 * of i's 32-block)) for entry e of rows; a row outside the table lowers
 * *bad to e. */
typedef struct di_engram_lookup_params {
    const uint8_t *table;  /* [table_rows, head_dim + head_dim / 32] */
    const int64_t *rows;   /* [entries] */
    void *out;             /* bf16 [entries, head_dim] */
    long long *bad;
    int64_t entries;
    int64_t table_rows;
    int32_t head_dim;      /* a multiple of 32 */
} di_engram_lookup_params;

/* engram_gate_update_bf16: one CTA per (token, stream c): the gate
 * g = sigmoid(sign(dot) sqrt(max(|dot|, 1e-6))), dot = sum_i S[i] qk[i] key[i]
 * * 1/sqrt(mean S^2 + eps) * 1/sqrt(mean key^2 + eps) * inv_sqrt_d, then
 * out = bf16(S + g * value) (cpu_backend::engram::{gate, update}; the sums
 * are fixed-shape block reductions). */
typedef struct di_engram_gate_params {
    const void *streams;   /* bf16 [tokens, c, d] */
    const void *kv;        /* bf16 [tokens, c + 1, d]: c keys, then the value */
    const void *q_weight;  /* bf16 [c, d] */
    const void *k_weight;  /* bf16 [c, d] */
    void *out;             /* bf16 [tokens, c, d] */
    int64_t tokens;
    int32_t c;
    int32_t d;
    float eps;
    float inv_sqrt_d;      /* fp32(d^-1/2), rounded once from f64 as the CPU does */
} di_engram_gate_params;

/* moe_permute_bf16: x_out[i] = x[perm[i] / top_k], w_out[i] = weights[perm[i]].
 * moe_combine_invert: pos[perm[i]] = max such i (pos zeroed by the host).
 * moe_combine_bf16: out[t, :] = bf16(sum_slot routed[pos[t top_k + slot], :]
 *   from 0.0, slot ascending, + shared[t, :]).
 * An entry of perm outside [0, n) lowers *bad to its index. */
typedef struct di_moe_params {
    const void *x;          /* permute: bf16 [tokens, d]; combine: routed bf16 [n, d] */
    const float *weights;   /* permute: [n] */
    const void *shared;     /* combine: bf16 [tokens, d] */
    const int32_t *perm;    /* [n] */
    int32_t *pos;           /* combine: [n] */
    void *out;              /* permute: bf16 [n, d]; combine: bf16 [tokens, d] */
    float *w_out;           /* permute: [n] */
    long long *bad;
    int64_t tokens;
    int64_t n;              /* tokens * top_k */
    int64_t d;
    int32_t top_k;
} di_moe_params;

/* moe_permute_fp8: the e4m3 rows q [tokens, d] and their E8M0 scale rows s
 * [tokens, sd] in the order of perm, as moe_permute_bf16 orders BF16 rows
 * (the same range check of perm), and the routing weights. */
typedef struct di_moe_permute_fp8_params {
    const void *q;          /* e4m3 [tokens, d] */
    const void *s;          /* e8m0 [tokens, sd] */
    const float *weights;   /* [n] */
    const int32_t *perm;    /* [n] */
    void *q_out;            /* e4m3 [n, d] */
    void *s_out;            /* e8m0 [n, sd] */
    float *w_out;           /* [n] */
    long long *bad;
    int64_t n;              /* tokens * top_k */
    int64_t d;
    int64_t sd;
    int32_t top_k;
} di_moe_permute_fp8_params;

/* The masked (fixed-capacity) layout of the EP low-latency mode
 * (kernels-cuda/moe/masked.cu, cpu_backend/moe_masked.rs): experts E of
 * capacity C rows, row e * C + c of the [E, C, .] buffers; entry
 * j = token * top_k + slot. A pos entry outside [0, E * C) is a dropped
 * entry (the layout writes -1): scatter writes nothing for it and combine
 * adds 0.0. No kernel reads an index it has not range-checked. */
typedef struct di_moe_masked_params {
    const int32_t *ids;     /* layout: [n] expert ids, any value */
    const float *weights;   /* layout: [n] routing weights */
    const void *x;          /* scatter: bf16 [tokens, d]; combine: expert rows bf16 [E * C, d] */
    const void *shared;     /* combine: bf16 [tokens, d] */
    int32_t *pos;           /* layout writes, scatter and combine read: [n] */
    int32_t *counts;        /* layout: [E], min(entries, C) */
    int32_t *dropped;       /* layout: [E + 1], past capacity per expert, then bad ids */
    float *w_out;           /* layout: [E * C], 0 past a count */
    void *out;              /* scatter: bf16 or e4m3 [E * C, d]; combine: bf16 [tokens, d] */
    void *scale;            /* scatter, fp8 payload: e8m0 [E * C, d / 32]; else NULL */
    int64_t tokens;
    int64_t n;              /* tokens * top_k */
    int64_t d;
    int32_t top_k;
    int32_t experts;
    int32_t capacity;
} di_moe_masked_params;

/* Row copies (kernels-cuda/gather/): out[dst_idx[i]] = src[src_idx[i]],
   rows of row_bytes bytes; a pair whose source row lies outside
   [0, src_rows) or whose destination row lies outside [0, dst_rows) is
   skipped (host lists are checked before the launch; device lists may hold
   -1 for "no copy"). */
typedef struct di_gather_params {
    const void *src;
    const int32_t *src_idx; /* [n] source rows, or null: row i */
    void *out;
    const int32_t *dst_idx; /* [n] distinct destination rows, or null: row i */
    int64_t n;
    int64_t row_bytes;
    int64_t src_rows; /* rows of src */
    int64_t dst_rows; /* rows of out */
} di_gather_params;

/* Logical rows -> physical rows of a paged row pool (kernels-cuda/gather/,
   ops::paged_rows). Row r of entry e lives at physical row
   pages[e, r / page_rows - bounds[e, 0]] * page_rows + r % page_rows when
   bounds[e, 1] <= r < bounds[e, 2], the table column lies in
   [0, table_pages) and its page is >= 0; every other r (negative ones, an
   owner outside [0, entries), a row past int32) maps to -1.
   out[t, j] = that row of r = idx[t, j] with e = owner[t]; with idx null
   (the window lists), r = max(0, positions[t] + 1 - width) + j, -1 past
   positions[t]. */
typedef struct di_paged_rows_params {
    const int32_t *idx;       /* [tokens, width] logical rows, or null */
    const int64_t *positions; /* [tokens], read when idx is null */
    const int32_t *owner;     /* [tokens] entry of each token */
    const int32_t *pages;     /* [entries, table_pages] */
    const int32_t *bounds;    /* [entries, 3]: first page, lo row, hi row */
    int32_t *out;             /* [tokens, width] */
    int64_t tokens;
    int32_t width;
    int32_t entries;
    int32_t table_pages;
    int32_t page_rows; /* > 0 */
} di_paged_rows_params;

/* random_* (weight_rng.rs): the random-weight generator's [rows, cols]
   parameter of stream `key`: value i = f32(mean + std * g_i), g_i the
   Irwin-Hall unit normal of element i (f64, unfused), stored as
   random_f32 / random_bf16: values only (scales null);
   random_fp8_blocks: e4m3 values and one E8M0 scale per
     [block_rows, block_cols] block, the grid row-major;
   random_fp4: each value rounded to BF16, per 32 along a row one E8M0
     scale and e2m1 codes, packed even-low (cols even). */
typedef struct di_random_params {
    void *values;
    uint8_t *scales;
    uint64_t key;
    double mean;
    double std_dev;
    int64_t rows;
    int64_t cols;
    int64_t block_rows; /* > 0 for the FP8 blocks */
    int64_t block_cols; /* > 0 for the FP8 blocks */
} di_random_params;

/* check_ids: lowers *bad to each position i whose ids[i] lies outside
   [0, bound) (atomicMin: the first such position remains); reads nothing
   else and writes nothing else. */
typedef struct di_check_ids_params {
    const int32_t *ids; /* [n] */
    long long *bad;
    int64_t n;
    int32_t bound;
} di_check_ids_params;

#endif
