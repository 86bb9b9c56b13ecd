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

// The FP4 quantisers' group amax step, max(a, b) of two magnitudes (fabsf
// results or the floor) keeping NaN and +Inf: the bit patterns compared as
// integers. For non-negative f32 that order is the numeric one and every NaN
// pattern lies above +Inf, so a group holding a NaN has a NaN amax, where
// fmaxf would drop it (numerics::fp4_block_amax). The FP8 quantisers keep
// fmaxf: a NaN value there keeps its own e4m3 NaN code.
__device__ __forceinline__ float amax_keep_nan(float a, float b) {
    return __uint_as_float(max(__float_as_uint(a), __float_as_uint(b)));
}

// A FP4 group holding a NaN or +-Inf (its amax is not finite) is stored with
// the NaN scale (E8M0 0xFF, or e4m3 0x7F for the E4M3-scaled rows) and every
// e2m1 code 7 (numerics::{E8M0_NAN, E4M3_NAN, FP4_NAN_BLOCK_CODE}).
constexpr uint32_t kE8M0Nan = 0xFFu;
constexpr uint8_t kE4M3Nan = 0x7Fu;
constexpr uint32_t kFp4NanBlockCode = 7u;

// 2^-e as an fp32 for e <= 127: normal below 127; e = 127 (a block whose
// amax is +Inf, clamped there) is the subnormal 2^-127, as the CPU's
// 1 / 2^127, so an Inf value saturates like the reference's instead of
// becoming Inf * 0 = NaN (found by act_quant_fp8_shared's GPU test).
__device__ __forceinline__ float exp2_neg(int e) {
    return __uint_as_float(e < 127 ? uint32_t(127 - e) << 23 : 0x00400000u);
}

// The FP8 quantisers' 1 / 448 (the e4m3 maximum) and amax floor (§10.1).
constexpr float kInvE4M3Max = 1.0f / 448.0f;
constexpr float kFp8AmaxFloor = 1e-4f;

// Saturating round-to-nearest-even f32 -> e4m3 byte (NaN -> 0x7F).
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
    return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The FP8 1 x 32 quantiser (numerics::act_quant_block) over one 32-block
// held by four consecutive lanes, 8 values each (lanes 4i .. 4i+3 hold the
// block's groups in order): the amax is shared by two xor shuffles, so every
// lane of the warp must call it; a lane with `live` false holds no values
// and contributes the floor. Returns the E8M0 exponent e (scale 2^e, byte
// e + 127) and writes the 8 e4m3 codes of a live lane into `q`.
__device__ __forceinline__ int act_quant8_lanes(const __nv_bfloat16 (&v)[8], bool live, uint8_t (&q)[8]) {
    float amax = kFp8AmaxFloor;
    if (live) {
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(__bfloat162float(v[i])));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const int e = ceil_pow2_exponent(amax, kInvE4M3Max);
    if (live) {
        const float inv = exp2_neg(e);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = f32_to_e4m3(__bfloat162float(v[i]) * inv);
    }
    return e;
}

// 1 / 6 (the e2m1 maximum) and the E8M0 FP4 quantiser's amax floor, 6 * FLT_MIN.
constexpr float kInvE2M1Max = 1.0f / 6.0f;
constexpr float kFp4E8M0AmaxFloor = 6.0f * 1.17549435e-38f;

// E8M0 byte -> f32 (0xFF NaN; byte 0 is the subnormal 2^-127).
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    // Selects, not branches: a per-lane branch here kept the sparse MQA
    // producers from overlapping rows.
    const uint32_t bits = b == 0xFFu ? 0x7FC00000u : (b == 0u ? 0x00400000u : b << 23);
    return __uint_as_float(bits);
}

// e4m3 byte -> f32 (exact: every e4m3 value is an f16 value; 0x7F/0xFF NaN).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// The e4m3 code of e4m3_to_f32(v) * 2^-d (d >= 1) in *out when that value
// is exactly an e4m3 value (zero keeps its code, so its sign); false
// otherwise, NaN included (numerics::share_mx_scales' exactness), in
// integer arithmetic: the value is S * 2^(x - 10) with significand S (8 + m
// for exponent field E >= 1, m for E = 0) and x = max(E, 1). If x - d >= 1
// the code keeps m with exponent field x - d; otherwise the result is
// subnormal, S >> (1 - x + d), exact when those low bits of S are zero (a
// shift past 3 loses S's leading bit, so never).
__device__ __forceinline__ bool e4m3_shift_exact(uint8_t v, int d, uint8_t *out) {
    const uint32_t sign = v & 0x80u, e = (v >> 3) & 15u, m = v & 7u;
    if (e == 15u && m == 7u) return false;  // NaN
    if (e == 0u && m == 0u) {
        *out = v;
        return true;
    }
    const int x = e ? int(e) : 1;
    const uint32_t s = e ? 8u + m : m;
    if (x - d >= 1) {
        *out = uint8_t(sign | (uint32_t(x - d) << 3) | m);
        return true;
    }
    const int sh = 1 - x + d;
    if (sh > 3 || (s & ((1u << sh) - 1u)) != 0u) return false;
    *out = uint8_t(sign | (s >> sh));
    return true;
}

// The warp lanes of the aligned group of `span` lanes (a power of two up to
// 32) that holds lane `lane`: the ballot mask of one run in the share
// kernels (act_quant_fp8_vec8_shared, mx_share_scales' stripes).
__device__ __forceinline__ uint32_t lane_group_mask(int span, int lane) {
    return (span == 32 ? 0xFFFFFFFFu : ((1u << span) - 1u)) << (lane / span * span);
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

// ---- e2m1 -> e4m3 decodes for the tensor-core GEMMs (exact) -----------------

// prmt.b32: byte i of the result is byte sel[4i..4i+3] of {b, a} (bit 3 of a
// selector nibble replicates that byte's sign bit instead).
__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// A constant the compiler cannot rematerialise, so decode tables stay in
// registers across a loop instead of being rebuilt before every prmt.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t v) {
    uint32_t r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
    return r;
}

// Eight e2m1 nibbles (element i in bits 4i..4i+3, even element in the low
// nibble as the checkpoint stores them) -> eight e4m3 bytes (element i in
// byte i of the pair). Every e2m1 value is an e4m3 value: magnitudes {0, 0.5,
// 1, 1.5, 2, 3, 4, 6} are the e4m3 codes {00, 30, 38, 3C, 40, 44, 48, 4C}.
// The magnitude is a prmt lookup in lo_tab = 0x3C383000 / hi_tab =
// 0x4C484440 selected by the nibbles' low 3 bits; the sign comes from a prmt
// in sign-replicate mode (selector bit 3 = the e2m1 sign) over sign_tab =
// 0x80808080: 0x80 for +, 0xFF for -, and minus 1 leaves bit 7 set exactly
// for -. Pass the tables through opaque_u32 once per loop.
__device__ __forceinline__ uint2 e2m1x8_to_e4m3x8(uint32_t p, uint32_t lo_tab, uint32_t hi_tab,
                                                 uint32_t sign_tab) {
    const uint32_t mag = p & 0x77777777u;
    const uint32_t lo = prmt_b32(lo_tab, hi_tab, mag), hi = prmt_b32(lo_tab, hi_tab, mag >> 16);
    const uint32_t slo = prmt_b32(sign_tab, sign_tab, p), shi = prmt_b32(sign_tab, sign_tab, p >> 16);
    return make_uint2(lo | ((slo - 0x01010101u) & 0x80808080u),
                      hi | ((shi - 0x01010101u) & 0x80808080u));
}

// The scaled decode: the e4m3 code (s << 7) | (c << 2) of the e2m1 nibble
// (sign s, magnitude code c) is the e2m1 value times 2^-6, exactly (e2m1 has
// bias 1 and e4m3 bias 7, and both keep their subnormal one exponent below
// the smallest normal, so shifting the code shifts the value by 2^-6
// everywhere, subnormal 0.5 included). Even nibbles (the low nibble of each
// byte of w) -> 4 e4m3 bytes, odd nibbles likewise: 3-4 instructions per 4
// values; multiply the GEMM's result by 64 (exact) to undo the scale.
__device__ __forceinline__ uint32_t e2m1_even_to_e4m3_x2e6(uint32_t w) {
    return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t e2m1_odd_to_e4m3_x2e6(uint32_t w) {
    return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

// Rust's f32::clamp(-6, 6): NaN stays NaN.
__device__ __forceinline__ float clamp6(float x) { return x < -6.0f ? -6.0f : (x > 6.0f ? 6.0f : x); }

}  // namespace deepinfer
