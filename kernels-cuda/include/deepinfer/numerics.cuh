// Device-side twins of src/numerics.rs. Every function here must stay
// bit-identical to its Rust counterpart; the CUDA tests check it bitwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace deepinfer {

// Power-of-two scale 2^ceil(log2(amax * inv_max)), ceiling on the bit pattern.
// Returns the E8M0 exponent e (scale = 2^e).
__device__ __forceinline__ int ceil_pow2_exponent(float amax, float inv_max) {
    const uint32_t bits = __float_as_uint(amax * inv_max);
    const int e = int((bits >> 23) & 0xFF) - 127 + int((bits & 0x7FFFFF) != 0);
    return max(-127, min(127, e));
}

// 2^-e as an fp32 (normal for every exponent the quantisers produce).
__device__ __forceinline__ float exp2_neg(int e) {
    return __uint_as_float(uint32_t(127 - e) << 23);
}

// Saturating round-to-nearest-even f32 -> e4m3 byte (NaN -> 0x7F).
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
    return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace deepinfer
