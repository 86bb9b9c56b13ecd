// FP8 weight dequantisation (ops/dequant.rs): e4m3 [n, k] with 32 x 32 E8M0
// block scales -> BF16 [n, k]. Layout: dense row-major; grid-stride over the
// n * k elements, one per thread and step (byte loads, coalesced). Numerics:
// the exact fp32 product rounded once to nearest even, a NaN written as the
// canonical 0x7FC0: bitwise cpu_backend::mxfp8_dequantize.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

extern "C" __global__ void mxfp8_dequant_bf16(const __grid_constant__ di_dequant_params p) {
    DI_PDL_ENTRY();
    const uint8_t *w = static_cast<const uint8_t *>(p.w);
    const uint8_t *s = static_cast<const uint8_t *>(p.s);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t kb = (p.k + 31) / 32, total = p.n * p.k;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t r = i / p.k, c = i - r * p.k;
        const float v = __fmul_rn(deepinfer::e4m3_to_f32(w[i]),
                                  deepinfer::e8m0_to_f32(s[(r / 32) * kb + c / 32]));
        out[i] = v != v ? __ushort_as_bfloat16(0x7FC0u) : __float2bfloat16_rn(v);
    }
}
