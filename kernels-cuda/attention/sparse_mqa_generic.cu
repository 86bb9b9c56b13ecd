// sparse_mqa_generic: the portable sparse MQA for every shape the op takes
// (D a multiple of 64 up to DI_SPARSE_MQA_GENERIC_MAX_DIM, any H), bitwise
// cpu_backend::sparse_attention::sparse_mqa over kv_format's decoded rows
// except lse, whose log is float(log(double)) where the CPU calls logf (at
// most one ulp apart). It serves shapes the tensor-core versions of
// sparse_mqa.cu do not take (the tiny config's H 4, D 64; other models' head
// counts); it is a correctness path, not a fast one.
//
// One CTA per (query, head), DI_SPARSE_MQA_GENERIC_THREADS threads. Per block
// of 64 list entries: thread j < 64 resolves entry j (no row when < 0 or >=
// its pool's rows) and forms its logit with the CPU's sequential fp32 sum
// over d (no FMA contraction); every thread folds the block's maximum in the
// same order, so m, alpha and the probabilities agree across threads; thread
// 0 sums the probabilities in list order; thread x owns acc[x], acc[x + n],
// ... (shared memory, touched by its owner alone) and adds BF16(p_j) * v_j[x]
// in list order. Row values are decoded where they are read: window
// BF16(e4m3 * E8M0), compressed BF16(e2m1 * e4m3), even element in the low
// nibble.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

namespace {

constexpr int kGenericBlock = 64;  // entries per online-softmax block (the CPU's ATTN_BLOCK)

// Value x of a decoded row: window (e4m3, one E8M0 per 32) or compressed
// (packed e2m1, one e4m3 per 16), as kv_format::decode_*_row rounds it.
__device__ __forceinline__ float generic_row_value(const uint8_t *row, bool window, int d, int x) {
    float v;
    if (window) {
        v = __fmul_rn(deepinfer::e4m3_to_f32(row[x]), deepinfer::e8m0_to_f32(row[d + x / 32]));
    } else {
        const uint32_t b = row[x / 2];
        const uint32_t nibble = (x & 1) ? (b >> 4) : (b & 15u);
        v = __fmul_rn(deepinfer::e2m1_to_f32(nibble), deepinfer::e4m3_to_f32(row[d / 2 + x / 16]));
    }
    return __bfloat162float(__float2bfloat16_rn(v));
}

// The CPU's exp (numerics::exp): f64 exp rounded once to f32.
__device__ __forceinline__ float generic_exp(float x) { return float(exp(double(x))); }

}  // namespace

extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_GENERIC_THREADS)
    sparse_mqa_generic(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
    extern __shared__ float smem[];
    const int d = p.d;
    float *qf = smem;               // [d] the query head in f32
    float *acc = smem + d;          // [d] the running P.V
    float *logit = acc + d;         // [64]
    float *prob = logit + kGenericBlock;   // [64] fp32 probabilities
    float *prob_bf = prob + kGenericBlock; // [64] BF16-rounded, 0 for no row
    __shared__ const uint8_t *rows[kGenericBlock];
    __shared__ bool is_window[kGenericBlock];
    __shared__ float denom;

    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const int tid = threadIdx.x;
    const __nv_bfloat16 *q = static_cast<const __nv_bfloat16 *>(p.q) + (t * p.h + h) * d;
    for (int x = tid; x < d; x += blockDim.x) {
        qf[x] = __bfloat162float(q[x]);
        acc[x] = 0.0f;
    }
    const int64_t wbytes = int64_t(d) + d / 32, cbytes = int64_t(d) / 2 + d / 16;
    const uint8_t *window = static_cast<const uint8_t *>(p.window);
    const uint8_t *compressed = static_cast<const uint8_t *>(p.compressed);
    const int k = p.kw + p.kc;
    float m = -1e30f, l = 0.0f;
    __syncthreads();
    for (int b0 = 0; b0 < k; b0 += kGenericBlock) {
        const int n = min(kGenericBlock, k - b0);
        if (tid < n) {
            const int e = b0 + tid;
            const bool w = e < p.kw;
            const int64_t i = w ? p.window_idx[t * p.kw + e] : p.compressed_idx[t * p.kc + (e - p.kw)];
            const int64_t pool = w ? p.nw : p.nc;
            const uint8_t *row = nullptr;
            float s = -INFINITY;
            if (i >= 0 && i < pool) {
                row = w ? window + i * wbytes : compressed + i * cbytes;
                float dot = 0.0f;
                for (int x = 0; x < d; ++x) dot = __fadd_rn(dot, __fmul_rn(qf[x], generic_row_value(row, w, d, x)));
                s = __fmul_rn(dot, p.scale);
            }
            rows[tid] = row;
            is_window[tid] = w;
            logit[tid] = s;
        }
        __syncthreads();
        float m_new = m;
        for (int j = 0; j < n; ++j) m_new = fmaxf(m_new, logit[j]);
        const float alpha = generic_exp(m - m_new);
        if (tid < n) {
            const float pj = generic_exp(logit[tid] - m_new);
            prob[tid] = pj;
            prob_bf[tid] = __bfloat162float(__float2bfloat16_rn(pj));
        }
        __syncthreads();
        if (tid == 0) {
            float sum = 0.0f;
            for (int j = 0; j < n; ++j) sum = __fadd_rn(sum, prob[j]);
            l = __fadd_rn(__fmul_rn(l, alpha), sum);
        }
        for (int x = tid; x < d; x += blockDim.x) {
            float pv = 0.0f;
            for (int j = 0; j < n; ++j)
                if (rows[j] != nullptr)
                    pv = __fadd_rn(pv, __fmul_rn(prob_bf[j], generic_row_value(rows[j], is_window[j], d, x)));
            acc[x] = __fadd_rn(__fmul_rn(acc[x], alpha), pv);
        }
        m = m_new;
        __syncthreads();  // the next block overwrites rows, logits and probabilities
    }
    if (tid == 0) {
        l = __fadd_rn(l, generic_exp(__fadd_rn(p.sink[h], -m)));
        denom = l;
        p.lse[t * p.h + h] = __fadd_rn(float(log(double(l))), m);
    }
    __syncthreads();
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out) + (t * p.h + h) * d;
    for (int x = tid; x < d; x += blockDim.x) out[x] = __float2bfloat16_rn(__fdiv_rn(acc[x], denom));
}
