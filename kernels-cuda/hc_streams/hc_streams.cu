// The mHC residual streams outside a sublayer (ops/hc_streams.rs).
// Layout: x / out [tokens, d] BF16; streams [tokens, 4, d] BF16; pre
// [tokens, 4] fp32. One thread per output element, grid-stride over int64.
// Numerics: IEEE fp32, no contraction, the CPU's order; bitwise
// cpu_backend::mhc::hc_collapse and ops::hc_stream_mean.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"

namespace {

constexpr int kStreams = 4;

__device__ __forceinline__ int64_t first_index() {
    return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t stride() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace

extern "C" __global__ void hc_init_bf16(const __grid_constant__ di_hc_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t n = p.tokens * kStreams * p.d;
    for (int64_t i = first_index(); i < n; i += stride()) {
        const int64_t t = i / (kStreams * p.d), e = i % p.d;
        out[i] = x[t * p.d + e];
    }
}

extern "C" __global__ void hc_collapse_bf16(const __grid_constant__ di_hc_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *s = static_cast<const __nv_bfloat16 *>(p.x);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t n = p.tokens * p.d;
    for (int64_t i = first_index(); i < n; i += stride()) {
        const int64_t t = i / p.d, e = i % p.d;
        const __nv_bfloat16 *st = s + t * kStreams * p.d + e;
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < kStreams; ++c)
            acc = __fadd_rn(acc, __fmul_rn(p.pre[t * kStreams + c], __bfloat162float(st[c * p.d])));
        out[i] = __float2bfloat16_rn(acc);
    }
}

extern "C" __global__ void hc_stream_mean_bf16(const __grid_constant__ di_hc_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *s = static_cast<const __nv_bfloat16 *>(p.x);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t n = p.tokens * p.d;
    for (int64_t i = first_index(); i < n; i += stride()) {
        const int64_t t = i / p.d, e = i % p.d;
        const __nv_bfloat16 *st = s + t * kStreams * p.d + e;
        float acc = __bfloat162float(st[0]);
#pragma unroll
        for (int c = 1; c < kStreams; ++c) acc = __fadd_rn(acc, __bfloat162float(st[c * p.d]));
        out[i] = __float2bfloat16_rn(__fdiv_rn(acc, float(kStreams)));
    }
}
