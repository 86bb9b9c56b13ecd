// Device-side twins of src/numerics.rs. Every function here must stay
// bit-identical to its Rust counterpart; the CUDA tests check it bitwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

// 1 / 6 (the e2m1 maximum) and the E8M0 FP4 quantiser's amax floor, 6 * FLT_MIN.
constexpr float kInvE2M1Max = 1.0f / 6.0f;
constexpr float kFp4E8M0AmaxFloor = 6.0f * 1.17549435e-38f;

// E8M0 byte -> f32 (0xFF NaN; byte 0 is the subnormal 2^-127).
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    if (b == 0xFFu) return __uint_as_float(0x7FC00000u);
    if (b == 0u) return __uint_as_float(0x00400000u);
    return __uint_as_float(b << 23);
}

// e4m3 byte -> f32 (exact: every e4m3 value is an f16 value; 0x7F/0xFF NaN).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// e2m1 nibble -> f32 (exact).
__device__ __forceinline__ float e2m1_to_f32(uint32_t n) {
    const uint32_t code = n & 7u;
    // Codes 2..7 are normal: exponent (code >> 1) - 1, mantissa bit code & 1.
    uint32_t bits = code >= 2u ? ((((code >> 1) + 126u) << 23) | ((code & 1u) << 22))
                               : (code == 1u ? 0x3F000000u : 0u);
    bits |= (n & 8u) << 28;
    return __uint_as_float(bits);
}

// f32 -> e2m1 nibble, saturating, nearest with ties to the even code; NaN keeps
// its sign bit and maps to magnitude 6 (numerics::f32_to_e2m1).
__device__ __forceinline__ uint32_t f32_to_e2m1(float x) {
    const uint32_t sign = (__float_as_uint(x) >> 31) << 3;
    const float a = fabsf(x);
    uint32_t code;
    if (a != a) code = 7;
    else if (a <= 0.25f) code = 0;
    else if (a < 0.75f) code = 1;
    else if (a <= 1.25f) code = 2;
    else if (a < 1.75f) code = 3;
    else if (a <= 2.5f) code = 4;
    else if (a < 3.5f) code = 5;
    else if (a <= 5.0f) code = 6;
    else code = 7;
    return sign | code;
}

// Rust's f32::clamp(-6, 6): NaN stays NaN.
__device__ __forceinline__ float clamp6(float x) { return x < -6.0f ? -6.0f : (x > 6.0f ? 6.0f : x); }

}  // namespace deepinfer
