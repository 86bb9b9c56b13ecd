// FP8 1x32 activation quantisation with E8M0 scales (v41-flash.md 10.1).
// Layout: x [rows, k] bf16; q [rows, k] e4m3; scale [rows, ceil(k/32)] e8m0.
//
// act_quant_fp8_vec8: k % 32 == 0. Each thread loads 8 consecutive values
// (16 B), four lanes cover one 32-block and share the amax by two xor
// shuffles; lane 0 of the four writes the scale. Grid-stride over 8-groups.
// act_quant_fp8_tail: any k. One warp per 32-block, one value per lane.
// act_quant_fp8_vec8_shared: vec8's quantisation, then exact scale sharing
// over runs of `per` blocks (ops::act_quant_fp8_shared; bitwise
// act_quant_fp8 followed by numerics::share_mx_scales): k % (32 per) == 0,
// so a run is 4 per consecutive lanes of one warp, aligned. The run's
// largest exponent comes from xor shuffles over its blocks, each lane
// checks its 8 codes shifted to it, and one ballot decides the run; no
// extra pass over memory.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

using namespace deepinfer;

extern "C" __global__ void __launch_bounds__(256)
    act_quant_fp8_vec8(const __grid_constant__ di_act_quant_params p) {
    DI_PDL_ENTRY();
    const int64_t groups = p.rows * int64_t(p.k / 8);
    // All lanes of a warp iterate together so the 4-lane shuffles stay in step.
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < groups; base += stride) {
        const int64_t g = base + threadIdx.x;
        const bool live = g < groups;
        __nv_bfloat16 v[8];
        if (live) *reinterpret_cast<uint4 *>(v) = reinterpret_cast<const uint4 *>(p.x)[g];
        uint8_t q[8];
        const int e = act_quant8_lanes(v, live, q);
        if (!live) continue;
        reinterpret_cast<uint2 *>(p.q)[g] = *reinterpret_cast<uint2 *>(q);
        if ((g & 3) == 0) static_cast<uint8_t *>(p.scale)[g >> 2] = uint8_t(e + 127);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    act_quant_fp8_tail(const __grid_constant__ di_act_quant_params p) {
    DI_PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const int64_t blocks_per_row = (p.k + 31) / 32;
    const int64_t blocks = p.rows * blocks_per_row;
    const int64_t warp0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
    for (int64_t b = warp0; b < blocks; b += warps) {
        const int64_t row = b / blocks_per_row;
        const int col = int(b % blocks_per_row) * 32 + lane;
        const bool live = col < p.k;
        const int64_t at = row * p.k + col;
        const float x =
            live ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p.x)[at]) : 0.0f;
        float amax = fmaxf(kFp8AmaxFloor, fabsf(x));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const int e = ceil_pow2_exponent(amax, kInvE4M3Max);
        if (live) static_cast<uint8_t *>(p.q)[at] = f32_to_e4m3(x * exp2_neg(e));
        if (lane == 0) static_cast<uint8_t *>(p.scale)[b] = uint8_t(e + 127);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    act_quant_fp8_vec8_shared(const __grid_constant__ di_act_quant_shared_params p) {
    DI_PDL_ENTRY();
    const int64_t groups = p.rows * int64_t(p.k / 8);
    const int lane = threadIdx.x & 31;
    const int span = 4 * p.per;  // lanes a run: 8, 16 or 32
    const uint32_t run_mask = lane_group_mask(span, lane);
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < groups; base += stride) {
        const int64_t g = base + threadIdx.x;
        const bool live = g < groups;  // the same for every lane of a run
        __nv_bfloat16 v[8];
        if (live) *reinterpret_cast<uint4 *>(v) = reinterpret_cast<const uint4 *>(p.x)[g];
        uint8_t q[8];
        const int e = act_quant8_lanes(v, live, q);
        // The run's largest exponent, whether it holds a NaN scale (byte
        // 0xFF, e = 128) and whether its blocks differ.
        int top = e, lo = e;
        for (int o = 4; o < span; o <<= 1) {
            top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        }
        const bool rewrite = live && top + 127 != int(kE8M0Nan) && lo < top;
        const int d = top - e;
        uint8_t out[8];
        bool ok = true;
        if (rewrite && d > 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) ok &= e4m3_shift_exact(q[i], d, &out[i]);
        }
        const bool exact = (__ballot_sync(0xffffffffu, !ok) & run_mask) == 0;
        if (!live) continue;
        const bool shift = rewrite && exact && d > 0;
        reinterpret_cast<uint2 *>(p.q)[g] = shift ? *reinterpret_cast<uint2 *>(out) : *reinterpret_cast<uint2 *>(q);
        if ((g & 3) == 0) static_cast<uint8_t *>(p.scale)[g >> 2] = uint8_t((rewrite && exact ? top : e) + 127);
    }
}
