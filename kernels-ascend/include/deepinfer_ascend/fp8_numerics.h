// Integer-only helpers for the FP8 1x32 activation quantiser (v41-flash.md
// §10.1), shared by the AscendC kernel (quant/act_quant.cpp) and the host
// check (host_check/fp8_numerics_check.cc).
//
// Why integers: on the AI Core these run on the scalar unit, whose floating
// point behaviour (rounding, subnormals, NaN) we cannot confirm without
// hardware, and the e4m3 conversion must be bit-exact with the CPU reference
// (src/numerics.rs) and with CUDA `__nv_cvt_float_to_fp8(.., __NV_SATFINITE,
// __NV_E4M3)`. Every function below works on bit patterns only, so its result
// does not depend on any FP unit. The host check compares them exhaustively
// with float/double references on x86.
//
// Inputs are bf16 bit patterns held in uint32_t (upper 16 bits zero).
#ifndef DEEPINFER_ASCEND_FP8_NUMERICS_H
#define DEEPINFER_ASCEND_FP8_NUMERICS_H

#if defined(DEEPINFER_HOST_CHECK)
#include <cstdint>
#define DI_INLINE inline
#else
// Device build: kernel_operator.h (included first by the kernel) provides the
// fixed-width integer types and the __aicore__ qualifier.
#define DI_INLINE __aicore__ inline
#endif

namespace deepinfer_ascend {

// fp32(1e-4), the amax floor of §10.1.
constexpr uint32_t kAmaxFloorF32Bits = 0x38D1B717u;
// Scale exponent e of a floored block: ceil(log2(fp32(1e-4) * fp32(1/448)))
// on the bit pattern. The host check recomputes it in fp32.
constexpr int32_t kAmaxFloorExponent = -22;
// fp32(1/448) = kInvE4M3MaxSig * 2^-32, with a 24-bit significand
// (bit pattern 0x3B124925; checked on the host).
constexpr uint32_t kInvE4M3MaxSig = 0x924925u;

// |x| of a bf16 pattern for the block maximum, or 0 for NaN. The CPU reference
// folds with f32::max and CUDA with fmaxf; both ignore a NaN operand, and for
// non-NaN magnitudes the integer order of the bit patterns is the float order.
DI_INLINE uint32_t AbsBf16ForMax(uint32_t bits16)
{
    const uint32_t a = bits16 & 0x7FFFu;
    return a > 0x7F80u ? 0u : a;
}

// Scale exponent e (scale = 2^e, E8M0 byte = e + 127) of a block whose
// largest magnitude has the bf16 pattern `amax16` (from AbsBf16ForMax, so
// 0 ... 0x7F80). Computes, exactly as the fp32 reference does:
//   p = fp32(max(amax, fp32(1e-4)) * fp32(1/448))   (round to nearest even)
//   e = exponent(p) + (mantissa(p) != 0), clamped to [-127, 127].
DI_INLINE int32_t E8m0Exponent(uint32_t amax16)
{
    if ((amax16 << 16) < kAmaxFloorF32Bits) {
        return kAmaxFloorExponent;  // zero, subnormal or below 1e-4
    }
    if (amax16 >= 0x7F80u) {
        return 127;  // inf * (1/448) = inf: exponent 128, clamped
    }
    // amax = sig * 2^(ex - 134) with an 8-bit significand; the product with
    // the 24-bit significand fits in 32 bits: 128*M >= 2^30, 255*M < 2^32.
    const int32_t ex = static_cast<int32_t>(amax16 >> 7);
    const uint32_t sig = 0x80u | (amax16 & 0x7Fu);
    const uint32_t prod = sig * kInvE4M3MaxSig;
    const int32_t len = (prod >> 31) != 0u ? 32 : 31;  // bit length of prod
    const int32_t drop = len - 24;                      // 7 or 8 bits
    uint32_t m = prod >> drop;
    const uint32_t rem = prod & ((1u << drop) - 1u);
    const uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (m & 1u) != 0u)) {
        ++m;
    }
    int32_t msb = (ex - 166) + (len - 1);  // floor(log2(p)) before a carry
    if (m == (1u << 24)) {
        m = 1u << 23;
        ++msb;
    }
    int32_t e = msb + (m != (1u << 23) ? 1 : 0);
    if (e > 127) {
        e = 127;
    }
    if (e < -127) {
        e = -127;
    }
    return e;
}

// e4m3 ("fn": no inf, NaN = 0x7F/0xFF, max 448) code of x * 2^-e, where x is
// the bf16 pattern `x16`: saturating to +-448, round to nearest, ties to
// even; NaN gives 0x7F; the sign is kept, also for results that round to 0.
// Identical to f32_to_e4m3(bf16_to_f32(x) * 2^-e) of src/numerics.rs for
// every e in [-127, 127] (host check, exhaustive).
DI_INLINE uint32_t E4m3FromBf16Scaled(uint32_t x16, int32_t e)
{
    const uint32_t sign = (x16 >> 8) & 0x80u;
    const uint32_t a = x16 & 0x7FFFu;
    if (a > 0x7F80u) {
        return 0x7Fu;  // NaN
    }
    if (a == 0x7F80u) {
        return sign | 0x7Eu;  // inf saturates to 448
    }
    int32_t ex = static_cast<int32_t>(a >> 7);
    uint32_t sig = a & 0x7Fu;
    if (ex == 0) {
        if (sig == 0u) {
            return sign;  // +-0
        }
        ex = 1;  // bf16 subnormal: normalise the significand
        while ((sig & 0x80u) == 0u) {
            sig <<= 1;
            --ex;
        }
    } else {
        sig |= 0x80u;
    }
    // |v| = sig * 2^(t - 7) with sig in [128, 255], t = floor(log2 |v|).
    const int32_t t = ex - 127 - e;
    if (t > 8) {
        return sign | 0x7Eu;  // |v| >= 512 > 448
    }
    // Quantum 2^(max(t, -6) - 3): three mantissa bits, or the subnormal step
    // 2^-9 below 2^-6. n counts quanta after rounding.
    const int32_t tt = t < -6 ? -6 : t;
    const int32_t shift = 4 + (tt - t);  // >= 4
    uint32_t n = 0u;
    if (shift < 9) {  // shift >= 9: |v| < quantum / 2, rounds to 0
        n = sig >> shift;
        const uint32_t rem = sig & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (n & 1u) != 0u)) {
            ++n;
        }
    }
    // Exponent field and mantissa in one sum; n == 16 carries into the
    // exponent, and n == 8 from the subnormal range lands on 2^-6 (code 8).
    uint32_t code = static_cast<uint32_t>(8 * (tt + 6)) + n;
    if (code > 0x7Eu) {
        code = 0x7Eu;  // rounding past 448 (clamp-then-round gives 448 too)
    }
    return sign | code;
}

// fp32 bit pattern of 2^-e for e in [-126, 126] (always a normal number).
DI_INLINE uint32_t Exp2NegF32Bits(int32_t e)
{
    return static_cast<uint32_t>(127 - e) << 23;
}

}  // namespace deepinfer_ascend

#undef DI_INLINE

#endif  // DEEPINFER_ASCEND_FP8_NUMERICS_H
