// Exact scale sharing of an MXFP8 operand in place (ops/mx_scales.rs; the
// contract is numerics::share_mx_scales, bitwise): inside every run of `per`
// 32-deep blocks of a scale row (1 row for 1 x 32 activation scales, 32 for
// 32 x 32 weight scales), each block below the run's largest scale 2^E moves
// to 2^E and its codes v to the e4m3 code of v * 2^(e - E), when every such
// code of the run is exact; a run holding a NaN scale or an inexact code is
// left as it is. Values code * scale never change.
//
// Layout: one warp per (scale row, run), grid-stride over those units. Pass
// 1 checks every shifted code (lanes stride the run's columns, rows in
// turn) and votes; pass 2 rewrites the codes, and lane 0 the scales after a
// warp barrier (the other lanes read them in both passes). Units touch
// disjoint bytes, so warps never share data.
#include <stdint.h>
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

namespace {

// The e4m3 code of v * 2^-d (d >= 1) in *out when that value is exactly an
// e4m3 value (zero keeps its code, so its sign); false otherwise, NaN
// included. Past d = 9 no nonzero e4m3 value survives (its smallest step is
// 2^-9), and 2^-d stays exact in fp32 below that.
__device__ __forceinline__ bool shifted(uint8_t v, int d, uint8_t *out) {
    const float x = deepinfer::e4m3_to_f32(v);
    if (x != x) return false;
    if (x == 0.0f) {
        *out = v;
        return true;
    }
    if (d > 9) return false;
    const float y = __fmul_rn(x, deepinfer::exp2_neg(d));
    const uint8_t c = deepinfer::f32_to_e4m3(y);
    *out = c;
    return __float_as_uint(deepinfer::e4m3_to_f32(c)) == __float_as_uint(y);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) mx_share_scales(const __grid_constant__ di_share_scales_params p) {
    uint8_t *codes = static_cast<uint8_t *>(p.codes);
    uint8_t *scales = static_cast<uint8_t *>(p.scales);
    const int lane = threadIdx.x & 31;
    const int64_t kb = (p.k + 31) / 32;
    const int64_t runs = (kb + p.per - 1) / p.per;
    const int64_t srows = (p.rows + p.rows_per_scale - 1) / p.rows_per_scale;
    const int64_t units = srows * runs;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    for (int64_t u = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; u < units; u += warps) {
        const int64_t sr = u / runs, b0 = (u - sr * runs) * p.per;
        const int nb = int(min(int64_t(p.per), kb - b0));
        uint8_t *s = scales + sr * kb + b0;
        uint32_t top = 0;
        bool nan = false;
        for (int j = 0; j < nb; ++j) {
            nan |= s[j] == 0xFF;
            top = max(top, uint32_t(s[j]));
        }
        bool uniform = true;
        for (int j = 0; j < nb; ++j) uniform &= s[j] == top;
        if (nan || uniform) continue;  // the same for every lane
        const int64_t r0 = sr * p.rows_per_scale, r1 = min(r0 + p.rows_per_scale, p.rows);
        const int64_t c0 = b0 * 32, c1 = min(c0 + int64_t(nb) * 32, p.k);
        bool exact = true;
        for (int64_t r = r0; r < r1 && exact; ++r) {
            for (int64_t c = c0 + lane; c < c1; c += 32) {
                const int d = int(top) - int(s[(c - c0) / 32]);
                uint8_t out;
                if (d > 0 && !shifted(codes[r * p.k + c], d, &out)) exact = false;
            }
        }
        if (!__all_sync(0xFFFFFFFFu, exact)) continue;
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0 + lane; c < c1; c += 32) {
                const int d = int(top) - int(s[(c - c0) / 32]);
                uint8_t out;
                if (d > 0 && shifted(codes[r * p.k + c], d, &out)) codes[r * p.k + c] = out;
            }
        }
        __syncwarp();
        if (lane == 0) {
            for (int j = 0; j < nb; ++j) s[j] = uint8_t(top);
        }
        __syncwarp();
    }
}
