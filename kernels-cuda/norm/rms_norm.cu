// RMSNorm, BF16 in/out, fp32 math. One CTA per row (grid-stride over rows).
// Layout: x, out [rows, dim] row-major; weight [dim]. The vector kernel needs
// dim % 8 == 0 and 16-byte aligned rows (the wrapper checks); the scalar
// kernel takes any dim.
#include <cuda_bf16.h>
#include "deepinfer/params.h"
#include "deepinfer/reduce.cuh"

using namespace deepinfer;

namespace {

template <int VEC>
__device__ __forceinline__ void rms_norm_row(const di_rms_norm_params &p, int64_t r,
                                             float *scratch) {
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x) + r * p.dim;
    const __nv_bfloat16 *w = static_cast<const __nv_bfloat16 *>(p.weight);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out) + r * p.dim;
    const int groups = p.dim / VEC;

    float ss = 0.0f;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        __nv_bfloat16 v[VEC];
        if constexpr (VEC == 8) {
            *reinterpret_cast<uint4 *>(v) = reinterpret_cast<const uint4 *>(x)[g];
        } else {
            v[0] = x[g];
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const float f = __bfloat162float(v[i]);
            ss += f * f;
        }
    }
    const float total = block_sum(ss, scratch);
    // IEEE sqrt and division (nvcc default -prec-sqrt/-prec-div): matches the CPU.
    const float inv_rms = 1.0f / sqrtf(total / float(p.dim) + p.eps);

    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        __nv_bfloat16 v[VEC], wv[VEC], o[VEC];
        if constexpr (VEC == 8) {
            *reinterpret_cast<uint4 *>(v) = reinterpret_cast<const uint4 *>(x)[g];
            *reinterpret_cast<uint4 *>(wv) = reinterpret_cast<const uint4 *>(w)[g];
        } else {
            v[0] = x[g];
            wv[0] = w[g];
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const float y = __bfloat162float(v[i]) * inv_rms;
            o[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(wv[i]), y));
        }
        if constexpr (VEC == 8) {
            reinterpret_cast<uint4 *>(out)[g] = *reinterpret_cast<uint4 *>(o);
        } else {
            out[g] = o[0];
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_bf16_vec8(const __grid_constant__ di_rms_norm_params p) {
    __shared__ float scratch[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) rms_norm_row<8>(p, r, scratch);
}

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_bf16_scalar(const __grid_constant__ di_rms_norm_params p) {
    __shared__ float scratch[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) rms_norm_row<1>(p, r, scratch);
}
