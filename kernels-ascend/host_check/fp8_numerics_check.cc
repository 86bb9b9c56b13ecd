// Host check of include/deepinfer_ascend/fp8_numerics.h (no CANN needed).
//
// Compares the integer-only helpers used by quant/act_quant.cpp with float /
// double references that follow src/numerics.rs (v41-flash.md §10.1):
//   * E8m0Exponent: every non-NaN bf16 magnitude, against the fp32 product.
//   * E4m3FromBf16Scaled: every bf16 pattern x every e in [-127, 127],
//     against a double-precision rounding reference, and for a few e against a
//     brute-force nearest-value search over the e4m3 table.
//   * A block quantiser built from the helpers, against an fp32 reference, on
//     random and special blocks.
//
// The file is *.cc on purpose: build.rs compiles kernels-ascend/<family>/*.cpp
// for the device, and this must never be one of them.
//
//   g++ -O2 -std=c++17 -DDEEPINFER_HOST_CHECK -I kernels-ascend/include
//       kernels-ascend/host_check/fp8_numerics_check.cc -o /tmp/fp8_check
//   /tmp/fp8_check
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "deepinfer_ascend/fp8_numerics.h"

namespace {

using namespace deepinfer_ascend;

int g_failures = 0;

void Fail(const char *what, uint32_t a, int32_t b, uint32_t got, uint32_t want)
{
    if (++g_failures <= 20) {
        std::printf("FAIL %s: in=0x%04x e=%d got=0x%02x want=0x%02x\n", what, a, b, got, want);
    }
}

float F32FromBits(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint32_t BitsFromF32(float f)
{
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

float Bf16ToF32(uint32_t x16) { return F32FromBits(x16 << 16); }

// ceil_pow2_scale of src/numerics.rs, returning e (byte - 127).
int32_t RefExponent(float amax)
{
    const float p = amax * (1.0f / 448.0f);
    const uint32_t bits = BitsFromF32(p);
    int32_t e = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0 ? 1 : 0);
    if (e > 127) e = 127;
    if (e < -127) e = -127;
    return e;
}

// Saturating nearest-even e4m3 of a double (the value is exact in double).
uint32_t RefE4m3(double v)
{
    if (std::isnan(v)) return 0x7F;
    const uint32_t sign = std::signbit(v) ? 0x80u : 0u;
    double a = std::fabs(v);
    if (a > 448.0) a = 448.0;  // the clamp precedes the rounding
    uint32_t code;
    if (a < std::ldexp(1.0, -6)) {
        code = static_cast<uint32_t>(std::nearbyint(a * 512.0));  // quanta of 2^-9
    } else {
        int ex2;
        std::frexp(a, &ex2);  // a = f * 2^ex2, f in [0.5, 1)
        const int t = ex2 - 1;
        const double n = std::nearbyint(std::ldexp(a, 3 - t));  // in [8, 16]
        code = static_cast<uint32_t>((t + 7) * 8) + static_cast<uint32_t>(n) - 8u;
    }
    return sign | code;
}

double E4m3Value(uint32_t code)  // magnitude of a finite code 0..0x7E
{
    const uint32_t ex = (code >> 3) & 0xF, m = code & 7;
    return ex == 0 ? std::ldexp(static_cast<double>(m), -9) : std::ldexp(1.0 + m / 8.0, static_cast<int>(ex) - 7);
}

// Brute force: nearest finite e4m3 magnitude, ties to the even code.
uint32_t BruteE4m3(double v)
{
    if (std::isnan(v)) return 0x7F;
    const uint32_t sign = std::signbit(v) ? 0x80u : 0u;
    double a = std::fabs(v);
    if (a > 448.0) a = 448.0;
    uint32_t best = 0;
    double best_d = INFINITY;
    for (uint32_t c = 0; c <= 0x7E; ++c) {
        const double d = std::fabs(E4m3Value(c) - a);
        if (d < best_d || (d == best_d && (c & 1u) == 0u)) {
            best = c;
            best_d = d;
        }
    }
    return sign | best;
}

void CheckConstants()
{
    if (BitsFromF32(1e-4f) != kAmaxFloorF32Bits) Fail("floor bits", 0, 0, BitsFromF32(1e-4f), kAmaxFloorF32Bits);
    const uint32_t inv = BitsFromF32(1.0f / 448.0f);
    const uint32_t want_inv = ((127u - 9u) << 23) | (kInvE4M3MaxSig & 0x7FFFFFu);
    if (inv != want_inv || (kInvE4M3MaxSig >> 23) != 1u) Fail("1/448 bits", 0, 0, inv, want_inv);
    if (RefExponent(1e-4f) != kAmaxFloorExponent) Fail("floor exponent", 0, 0, RefExponent(1e-4f), kAmaxFloorExponent);
}

void CheckExponent()
{
    for (uint32_t a = 0; a <= 0x7F80u; ++a) {
        const float amax = std::fmax(Bf16ToF32(a), 1e-4f);
        const int32_t want = RefExponent(amax);
        const int32_t got = E8m0Exponent(a);
        if (got != want) Fail("E8m0Exponent", a, 0, static_cast<uint32_t>(got), static_cast<uint32_t>(want));
    }
    for (uint32_t x = 0; x <= 0xFFFFu; ++x) {  // NaN patterns are skipped by the max
        const uint32_t a = AbsBf16ForMax(x);
        const bool nan = (x & 0x7FFFu) > 0x7F80u;
        if (a != (nan ? 0u : (x & 0x7FFFu))) Fail("AbsBf16ForMax", x, 0, a, x & 0x7FFFu);
    }
}

void CheckEncoder()
{
    for (int32_t e = -127; e <= 127; ++e) {
        for (uint32_t x = 0; x <= 0xFFFFu; ++x) {
            const double v = std::ldexp(static_cast<double>(Bf16ToF32(x)), -e);
            const uint32_t want = RefE4m3(v);
            const uint32_t got = E4m3FromBf16Scaled(x, e);
            if (got != want) Fail("E4m3FromBf16Scaled", x, e, got, want);
        }
    }
    const int32_t brute_e[] = {-22, -9, -1, 0, 1, 7, 20, 120};
    for (int32_t e : brute_e) {
        for (uint32_t x = 0; x <= 0xFFFFu; ++x) {
            const double v = std::ldexp(static_cast<double>(Bf16ToF32(x)), -e);
            const uint32_t want = BruteE4m3(v);
            if (RefE4m3(v) != want) Fail("RefE4m3 vs brute force", x, e, RefE4m3(v), want);
        }
    }
}

// The kernel's per-block flow (quant/act_quant.cpp, scalar path) on the host,
// against the fp32 flow of act_quant_block in src/numerics.rs.
void CheckBlocks()
{
    std::mt19937 rng(12345);
    std::uniform_int_distribution<uint32_t> any16(0, 0xFFFF);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_int_distribution<int> mag(-40, 40);
    for (int iter = 0; iter < 200000; ++iter) {
        uint32_t blk[32];
        const int kind = iter % 4;
        const float s = std::ldexp(1.0f, mag(rng));
        for (uint32_t &b : blk) {
            if (kind == 0) {
                b = any16(rng);
                if ((b & 0x7FFFu) >= 0x7F80u) b &= 0x3FFFu;  // finite only (as the model)
            } else {
                b = BitsFromF32(gauss(rng) * s) >> 16;  // truncation is fine: any bf16
            }
        }
        if (kind == 3) blk[iter % 32] = 0;
        // Device-side logic.
        uint32_t amax = 0;
        for (uint32_t b : blk) {
            const uint32_t a = AbsBf16ForMax(b);
            if (a > amax) amax = a;
        }
        const int32_t e = E8m0Exponent(amax);
        // Reference logic.
        float ref_amax = 1e-4f;
        for (uint32_t b : blk) ref_amax = std::fmax(ref_amax, std::fabs(Bf16ToF32(b)));
        const int32_t ref_e = RefExponent(ref_amax);
        if (e != ref_e) Fail("block exponent", amax, e, static_cast<uint32_t>(e), static_cast<uint32_t>(ref_e));
        const float inv = std::ldexp(1.0f, -ref_e);  // 1 / 2^e, exact
        for (uint32_t b : blk) {
            const float v = Bf16ToF32(b) * inv;  // fp32, as the references do
            const uint32_t want = RefE4m3(static_cast<double>(v));
            const uint32_t got = E4m3FromBf16Scaled(b, e);
            if (got != want) Fail("block code", b, e, got, want);
        }
    }
}

}  // namespace

int main()
{
    std::fesetround(FE_TONEAREST);
    CheckConstants();
    CheckExponent();
    CheckEncoder();
    CheckBlocks();
    if (g_failures != 0) {
        std::printf("%d failures\n", g_failures);
        return 1;
    }
    std::printf("fp8_numerics: all checks passed\n");
    return 0;
}
