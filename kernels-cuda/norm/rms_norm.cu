// RMSNorm, BF16 in/out, fp32 math. One CTA per row (grid-stride over rows).
// Layout: x, out [rows, dim] row-major; weight [dim].
//
// rms_norm_bf16_vec8: dim % 8 == 0 and dim <= 8 * kCache * blockDim.x. Each
//   thread loads up to kCache 16-byte groups of its row once, keeps them in
//   registers across the block reduction, and writes the output from them:
//   x is read from HBM exactly once. The wrapper picks blockDim from dim only,
//   so the reduction tree, and hence the result, does not depend on the batch.
// rms_norm_bf16_scalar: any dim; reads x twice (the second read mostly hits L2).
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"
#include "deepinfer/reduce.cuh"

using namespace deepinfer;

namespace {

constexpr int kCache = 4;

__device__ __forceinline__ __nv_bfloat16 scale_one(__nv_bfloat16 x, __nv_bfloat16 w, float inv_rms) {
    // IEEE multiplies, no contraction: bf16(w * (x * inv_rms)) as the CPU does.
    return __float2bfloat16_rn(__fmul_rn(__bfloat162float(w), __fmul_rn(__bfloat162float(x), inv_rms)));
}

// 1 / sqrt(mean + eps) with IEEE sqrt and division, as the CPU reference.
__device__ __forceinline__ float inv_rms_of(float sum_sq, const di_rms_norm_params &p) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(sum_sq, float(p.dim)) + p.eps));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_bf16_vec8(const __grid_constant__ di_rms_norm_params p) {
    DI_PDL_ENTRY();
    __shared__ float scratch[32];
    const int groups = p.dim / 8;
    const uint4 *w = static_cast<const uint4 *>(p.weight);
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const uint4 *x = static_cast<const uint4 *>(p.x) + r * groups;
        uint4 *out = static_cast<uint4 *>(p.out) + r * groups;
        uint4 v[kCache];
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < kCache; ++c) {
            const int g = threadIdx.x + c * blockDim.x;
            if (g < groups) {
                v[c] = x[g];
                const __nv_bfloat16 *e = reinterpret_cast<const __nv_bfloat16 *>(&v[c]);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float f = __bfloat162float(e[i]);
                    ss = __fmaf_rn(f, f, ss);
                }
            }
        }
        const float inv_rms = inv_rms_of(block_sum(ss, scratch), p);
#pragma unroll
        for (int c = 0; c < kCache; ++c) {
            const int g = threadIdx.x + c * blockDim.x;
            if (g < groups) {
                const uint4 wv = w[g];
                const __nv_bfloat16 *e = reinterpret_cast<const __nv_bfloat16 *>(&v[c]);
                const __nv_bfloat16 *we = reinterpret_cast<const __nv_bfloat16 *>(&wv);
                uint4 o;
                __nv_bfloat16 *oe = reinterpret_cast<__nv_bfloat16 *>(&o);
#pragma unroll
                for (int i = 0; i < 8; ++i) oe[i] = scale_one(e[i], we[i], inv_rms);
                out[g] = o;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_bf16_scalar(const __grid_constant__ di_rms_norm_params p) {
    DI_PDL_ENTRY();
    __shared__ float scratch[32];
    const __nv_bfloat16 *w = static_cast<const __nv_bfloat16 *>(p.weight);
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x) + r * p.dim;
        __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out) + r * p.dim;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
            const float f = __bfloat162float(x[i]);
            ss = __fmaf_rn(f, f, ss);
        }
        const float inv_rms = inv_rms_of(block_sum(ss, scratch), p);
        for (int i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = scale_one(x[i], w[i], inv_rms);
    }
}
