// Engram on the GPU (ops/engram.rs, v41-flash.md section 8).
// engram_rows: one thread per (token, column): the rolling XOR hashes of
//   the token's four compressed ids (int64 wrapping products), reduced with
//   rem_euclid by the column's prime, plus the column's table offset;
//   bitwise cpu_backend::engram::{ngram_hashes, table_rows}.
// engram_lookup_bf16: one CTA per looked-up row (grid-stride), threads over
//   head_dim: e4m3 value times its 32-block's E8M0 scale, one BF16 rounding;
//   bitwise cpu_backend::engram::gather_rows. A row outside the table writes
//   nothing and lowers *bad to the entry's index.
// engram_gate_update_bf16: one CTA per (token, stream); the three sums of
//   the gate are fixed-shape block reductions (the tree depends on blockDim,
//   which the wrapper picks from d alone), so they differ from the CPU's
//   sequential sums by rounding only; the update is elementwise IEEE.
#include <cuda_bf16.h>
#include <math.h>
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/reduce.cuh"

using namespace deepinfer;

extern "C" __global__ void engram_rows(const __grid_constant__ di_engram_rows_params p) {
    const int64_t n = p.tokens * p.cols;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / p.cols;
        const int col = int(i % p.cols);
        const int order = 2 + col / p.heads;  // n-gram order 2..4
        const int64_t *ids = p.ids + t * 4;
        // Wrapping int64 arithmetic through uint64 (defined behaviour).
        uint64_t h = uint64_t(ids[0]) * uint64_t(p.multipliers[0]);
        for (int k = 1; k < order; ++k) h ^= uint64_t(ids[k]) * uint64_t(p.multipliers[k]);
        const int64_t prime = p.primes[col];
        int64_t r = int64_t(h) % prime;
        if (r < 0) r += prime;
        p.rows[i] = r + p.offsets[col];
    }
}

extern "C" __global__ void engram_lookup_bf16(const __grid_constant__ di_engram_lookup_params p) {
    const int64_t row_bytes = p.head_dim + p.head_dim / 32;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    for (int64_t e = blockIdx.x; e < p.entries; e += gridDim.x) {
        const int64_t r = p.rows[e];
        if (r < 0 || r >= p.table_rows) {
            if (threadIdx.x == 0) atomicMin(p.bad, (long long)e);
            continue;
        }
        const uint8_t *row = p.table + r * row_bytes;
        for (int i = threadIdx.x; i < p.head_dim; i += blockDim.x) {
            const float v = __fmul_rn(e4m3_to_f32(row[i]), e8m0_to_f32(row[p.head_dim + i / 32]));
            out[e * p.head_dim + i] = __float2bfloat16_rn(v);
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    engram_gate_update_bf16(const __grid_constant__ di_engram_gate_params p) {
    __shared__ float scratch[32];
    const __nv_bfloat16 *streams = static_cast<const __nv_bfloat16 *>(p.streams);
    const __nv_bfloat16 *kv = static_cast<const __nv_bfloat16 *>(p.kv);
    const __nv_bfloat16 *qw = static_cast<const __nv_bfloat16 *>(p.q_weight);
    const __nv_bfloat16 *kw = static_cast<const __nv_bfloat16 *>(p.k_weight);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t units = p.tokens * p.c;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t t = u / p.c;
        const int c = int(u % p.c);
        const __nv_bfloat16 *s = streams + u * p.d;
        const __nv_bfloat16 *key = kv + (t * (p.c + 1) + c) * p.d;
        const __nv_bfloat16 *value = kv + (t * (p.c + 1) + p.c) * p.d;
        float dot = 0.0f, ss = 0.0f, kk = 0.0f;
        for (int i = threadIdx.x; i < p.d; i += blockDim.x) {
            const float sv = __bfloat162float(s[i]), k = __bfloat162float(key[i]);
            const int64_t w = int64_t(c) * p.d + i;
            const float qk = __fmul_rn(__bfloat162float(qw[w]), __bfloat162float(kw[w]));
            dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(sv, qk), k));
            ss = __fadd_rn(ss, __fmul_rn(sv, sv));
            kk = __fadd_rn(kk, __fmul_rn(k, k));
        }
        dot = block_sum(dot, scratch);
        ss = block_sum(ss, scratch);
        kk = block_sum(kk, scratch);
        const float fd = float(p.d);
        float x = __fmul_rn(dot, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, fd), p.eps))));
        x = __fmul_rn(x, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(kk, fd), p.eps))));
        x = __fmul_rn(x, p.inv_sqrt_d);
        // sign(x) * sqrt(max(|x|, 1e-6)), NaN propagating as f32::signum does.
        const float g_in = isnan(x) ? x : copysignf(__fsqrt_rn(fmaxf(fabsf(x), 1e-6f)), x);
        // sigmoid with the CPU's exp: f64 exp rounded once to fp32.
        const float e = float(exp(double(-g_in)));
        const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
        for (int i = threadIdx.x; i < p.d; i += blockDim.x) {
            const float v = __fadd_rn(__bfloat162float(s[i]), __fmul_rn(g, __bfloat162float(value[i])));
            out[u * p.d + i] = __float2bfloat16_rn(v);
        }
    }
}
