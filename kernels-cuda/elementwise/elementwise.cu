// Elementwise scalar ops and the column copy of cat_cols (ops/elementwise.rs).
// Layout: every tensor dense, row-major; grid-stride over int64 counts.
// Numerics: one IEEE fp32 operation per element (no contraction, no fast
// math), rounded once to the input's dtype: bitwise the CPU reference.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"

namespace {

__device__ __forceinline__ int64_t first_index() {
    return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t stride() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace

extern "C" __global__ void scale_bf16(const __grid_constant__ di_elementwise_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.a);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    for (int64_t i = first_index(); i < p.n; i += stride())
        out[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(x[i]), p.s));
}

extern "C" __global__ void scale_f32(const __grid_constant__ di_elementwise_params p) {
    DI_PDL_ENTRY();
    const float *x = static_cast<const float *>(p.a);
    float *out = static_cast<float *>(p.out);
    for (int64_t i = first_index(); i < p.n; i += stride()) out[i] = __fmul_rn(x[i], p.s);
}

extern "C" __global__ void div_bf16(const __grid_constant__ di_elementwise_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.a);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    for (int64_t i = first_index(); i < p.n; i += stride())
        out[i] = __float2bfloat16_rn(__fdiv_rn(__bfloat162float(x[i]), p.s));
}

extern "C" __global__ void div_f32(const __grid_constant__ di_elementwise_params p) {
    DI_PDL_ENTRY();
    const float *x = static_cast<const float *>(p.a);
    float *out = static_cast<float *>(p.out);
    for (int64_t i = first_index(); i < p.n; i += stride()) out[i] = __fdiv_rn(x[i], p.s);
}

extern "C" __global__ void add_f32(const __grid_constant__ di_elementwise_params p) {
    DI_PDL_ENTRY();
    const float *a = static_cast<const float *>(p.a);
    const float *b = static_cast<const float *>(p.b);
    float *out = static_cast<float *>(p.out);
    for (int64_t i = first_index(); i < p.n; i += stride()) out[i] = __fadd_rn(a[i], b[i]);
}

// One CTA per row (grid-stride over rows), threads over the row's bytes.
extern "C" __global__ void copy_cols(const __grid_constant__ di_copy_cols_params p) {
    DI_PDL_ENTRY();
    const uint8_t *src = static_cast<const uint8_t *>(p.src);
    uint8_t *dst = static_cast<uint8_t *>(p.dst);
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const uint8_t *s = src + r * p.width;
        uint8_t *d = dst + r * p.dst_pitch + p.dst_col;
        for (int64_t i = threadIdx.x; i < p.width; i += blockDim.x) d[i] = s[i];
    }
}
