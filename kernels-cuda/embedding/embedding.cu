// Token embedding gather and greedy argmax (ops/embedding.rs).
// embedding_bf16: one CTA per token (grid-stride), threads over the row in
//   16-byte groups when d % 8 == 0, else BF16 by BF16. An id outside
//   [0, vocab) writes nothing and lowers *bad to its position.
// argmax_f32: one CTA of DI_ARGMAX_THREADS per row. Each thread scans its
//   strided elements in increasing index, then a fixed tree merges the
//   candidates under one total order: a number beats NaN, a larger number
//   beats a smaller, and on equality (or NaN against NaN) the lower index
//   wins: exactly numerics::argmax's sequential rule, whatever the split.
#include <cuda_bf16.h>
#include <math.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"

namespace {

// (value, index) b beats a under argmax's order.
__device__ __forceinline__ bool beats(float bv, int32_t bi, float av, int32_t ai) {
    const bool an = isnan(av), bn = isnan(bv);
    if (an != bn) return an;  // a number beats NaN
    if (!an && bv != av) return bv > av;
    return bi < ai;
}

}  // namespace

extern "C" __global__ void embedding_bf16(const __grid_constant__ di_embedding_params p) {
    DI_PDL_ENTRY();
    for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
        const int32_t id = p.ids[t];
        if (id < 0 || int64_t(id) >= p.vocab) {
            if (threadIdx.x == 0) atomicMin(p.bad, (long long)t);
            continue;
        }
        if (p.d % 8 == 0) {
            const uint4 *src = static_cast<const uint4 *>(p.table) + int64_t(id) * (p.d / 8);
            uint4 *dst = static_cast<uint4 *>(p.out) + t * (p.d / 8);
            for (int64_t i = threadIdx.x; i < p.d / 8; i += blockDim.x) dst[i] = src[i];
        } else {
            const __nv_bfloat16 *src = static_cast<const __nv_bfloat16 *>(p.table) + int64_t(id) * p.d;
            __nv_bfloat16 *dst = static_cast<__nv_bfloat16 *>(p.out) + t * p.d;
            for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) dst[i] = src[i];
        }
    }
}

extern "C" __global__ void __launch_bounds__(DI_ARGMAX_THREADS)
    argmax_f32(const __grid_constant__ di_argmax_params p) {
    DI_PDL_ENTRY();
    __shared__ float sv[DI_ARGMAX_THREADS];
    __shared__ int32_t si[DI_ARGMAX_THREADS];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *x = p.x + r * p.v;
        // Thread 0 always has element 0 (v >= 1); an idle thread holds NaN at
        // an index past every real one, which never beats a real candidate.
        float bv = __uint_as_float(0x7FC00000u);
        int32_t bi = 0x7FFFFFFF;
        // int64 counter: v may approach 2^31 - 1, past which i + 512 wraps.
        for (int64_t i = threadIdx.x; i < p.v; i += DI_ARGMAX_THREADS) {
            const float v = x[i];
            if (bi == 0x7FFFFFFF || beats(v, int32_t(i), bv, bi)) {
                bv = v;
                bi = int32_t(i);
            }
        }
        sv[threadIdx.x] = bv;
        si[threadIdx.x] = bi;
        __syncthreads();
        for (int s = DI_ARGMAX_THREADS / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s && beats(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
                sv[threadIdx.x] = sv[threadIdx.x + s];
                si[threadIdx.x] = si[threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) p.out[r] = si[0];
        __syncthreads();  // the next row reuses sv / si
    }
}

// first_non_finite_f32 (ops::first_non_finite): one CTA of
// DI_ARGMAX_THREADS per row; each thread keeps the lowest index of a NaN or
// +-Inf among its strided elements, a tree takes the minimum, and thread 0
// writes it (-1 for a finite row). The minimum is order-free: exact.
extern "C" __global__ void __launch_bounds__(DI_ARGMAX_THREADS)
    first_non_finite_f32(const __grid_constant__ di_argmax_params p) {
    DI_PDL_ENTRY();
    __shared__ int32_t sm[DI_ARGMAX_THREADS];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *x = p.x + r * p.v;
        int32_t first = 0x7FFFFFFF;
        for (int64_t i = threadIdx.x; i < p.v && first == 0x7FFFFFFF; i += DI_ARGMAX_THREADS)
            if (!isfinite(x[i])) first = int32_t(i);
        sm[threadIdx.x] = first;
        __syncthreads();
        for (int o = DI_ARGMAX_THREADS / 2; o > 0; o >>= 1) {
            if (threadIdx.x < o) sm[threadIdx.x] = min(sm[threadIdx.x], sm[threadIdx.x + o]);
            __syncthreads();
        }
        if (threadIdx.x == 0) p.out[r] = sm[0] == 0x7FFFFFFF ? -1 : sm[0];
        // Every thread has read sm[0] before the next row overwrites it.
        __syncthreads();
    }
}
