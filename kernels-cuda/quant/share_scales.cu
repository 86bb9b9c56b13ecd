// Exact scale sharing of an MXFP8 operand in place (ops/mx_scales.rs; the
// contract is numerics::share_mx_scales, bitwise): inside every run of `per`
// 32-deep blocks of a scale row (1 row for 1 x 32 activation scales, 32 for
// 32 x 32 weight scales), each block below the run's largest scale 2^E moves
// to 2^E and its codes v to the e4m3 code of v * 2^(e - E), when every such
// code of the run is exact; a run holding a NaN scale or an inexact code is
// left as it is. Values code * scale never change.
//
// Layouts (grid-stride; units touch disjoint bytes, so warps never share
// data):
// - Stripes (activations: rows_per_scale 1, per 2, 4 or 8, K a multiple of
//   16): one warp per 512 codes of a row (16 blocks, 16 / per whole runs).
//   Lane l loads codes 16 l .. 16 l + 15 as one uint4 and, for l < 16, the
//   scale of block l; each run's largest scale, NaN and uniformity come
//   from shuffles inside its `per` scale lanes, each code lane checks its 16
//   shifted codes, one ballot decides every run of the stripe, and each
//   lane writes its own bytes (codes of a shifted block, one scale). One
//   pass over the bytes: the unit-per-warp layout below reached 26 % of
//   the copy bandwidth at M >= 4096 (2026-12-04).
// - Units (every other case): one warp per (scale row, run). Pass 1 checks
//   every shifted code (lanes stride the run's columns, rows in turn) and
//   votes; pass 2 rewrites the codes, and lane 0 the scales after a warp
//   barrier (the other lanes read them in both passes).
#include <stdint.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

using deepinfer::e4m3_shift_exact;
using deepinfer::lane_group_mask;

// Whether the stripe layout serves these parameters (uint4 code loads need
// 16-byte rows and base). The launcher's grid, sized for the unit layout,
// covers the stripes too: a stripe holds at least one run.
__device__ __forceinline__ bool striped(const di_share_scales_params &p) {
    return p.rows_per_scale == 1 && (p.per == 2 || p.per == 4 || p.per == 8) && p.k % 16 == 0 &&
           (reinterpret_cast<uintptr_t>(p.codes) & 15) == 0;
}

__device__ void share_stripes(const di_share_scales_params &p) {
    uint8_t *codes = static_cast<uint8_t *>(p.codes);
    uint8_t *scales = static_cast<uint8_t *>(p.scales);
    const int lane = threadIdx.x & 31;
    const int per = p.per;
    const int64_t kb = (p.k + 31) / 32;
    const int64_t stripes_per_row = (p.k + 511) / 512;
    const int64_t units = p.rows * stripes_per_row;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    for (int64_t u = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; u < units; u += warps) {
        const int64_t r = u / stripes_per_row;
        const int64_t c0 = (u - r * stripes_per_row) * 512;
        const int64_t b0 = c0 / 32;
        // Scale lanes: block b0 + lane (lanes 16..31 and blocks past K are
        // absent: they count as equal to the top and never as NaN).
        const bool present = lane < 16 && b0 + lane < kb;
        const uint32_t sc = present ? scales[r * kb + b0 + lane] : 0u;
        uint32_t top = sc, nan = present && sc == 0xFFu, lo = present ? sc : 0xFFFFu;
        for (int o = 1; o < per; o <<= 1) {
            top = max(top, __shfl_xor_sync(0xFFFFFFFFu, top, o));
            nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, o);
            lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
        }
        // A run needs a rewrite when it holds no NaN and its present scales
        // differ (lo < top; a run of absent blocks only has lo = 0xFFFF).
        const bool rewrite_run = !nan && lo < top;
        // Code lanes: codes c0 + 16 lane .. + 15, all inside K or all past it.
        const int blk = lane / 2;
        const uint32_t s_b = __shfl_sync(0xFFFFFFFFu, sc, blk);
        const uint32_t t_b = __shfl_sync(0xFFFFFFFFu, top, blk);
        const bool w_b = __shfl_sync(0xFFFFFFFFu, rewrite_run, blk);
        const int64_t c = c0 + 16 * lane;
        const bool in = c < p.k;
        const int d = int(t_b) - int(s_b);
        uint32_t out[4] = {0u, 0u, 0u, 0u};
        bool ok = true;
        if (in && w_b && d > 0) {
            const uint4 v = *reinterpret_cast<const uint4 *>(codes + r * p.k + c);
            const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    uint8_t o = 0;
                    ok &= e4m3_shift_exact(uint8_t(words[w] >> (8 * i)), d, &o);
                    out[w] |= uint32_t(o) << (8 * i);
                }
            }
        }
        // Run q of the stripe is lanes 2 per q .. 2 per (q + 1) - 1.
        const uint32_t bad = __ballot_sync(0xFFFFFFFFu, !ok);
        const int span = 2 * per;
        const bool exact = (bad & lane_group_mask(span, lane)) == 0;
        if (in && w_b && d > 0 && exact)
            *reinterpret_cast<uint4 *>(codes + r * p.k + c) = make_uint4(out[0], out[1], out[2], out[3]);
        // The scale lane of block `lane` follows its run's verdict (the run
        // of scale lane l holds code lanes 2 l / span * span ..).
        if (present && rewrite_run && sc < top && (bad & lane_group_mask(span, 2 * lane)) == 0)
            scales[r * kb + b0 + lane] = uint8_t(top);
    }
}

// (256, 2): without a second bound ptxas capped the kernel at 64 registers
// and spilled the stripe layout's shifted words.
extern "C" __global__ void __launch_bounds__(256, 2) mx_share_scales(const __grid_constant__ di_share_scales_params p) {
    DI_PDL_ENTRY();
    if (striped(p)) {
        share_stripes(p);
        return;
    }
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
                if (d > 0 && !e4m3_shift_exact(codes[r * p.k + c], d, &out)) exact = false;
            }
        }
        if (!__all_sync(0xFFFFFFFFu, exact)) continue;
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0 + lane; c < c1; c += 32) {
                const int d = int(top) - int(s[(c - c0) / 32]);
                uint8_t out;
                if (d > 0 && e4m3_shift_exact(codes[r * p.k + c], d, &out)) codes[r * p.k + c] = out;
            }
        }
        __syncwarp();
        if (lane == 0) {
            for (int j = 0; j < nb; ++j) s[j] = uint8_t(top);
        }
        __syncwarp();
    }
}
