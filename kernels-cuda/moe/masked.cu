// The masked (fixed-capacity) layout of the EP low-latency mode
// (ops::moe_masked_*, reference cpu_backend/moe_masked.rs). Layout: ids and
// weights [n] (n = tokens * top_k, entry j = token * top_k + slot), pos [n]
// int32, counts [E], dropped [E + 1], w_out [E * C] fp32; x [tokens, d] bf16;
// the expert-major buffers [E * C, d] (row e * C + c) bf16 or e4m3 with
// e8m0 scales [E * C, d / 32]; shared and out [tokens, d] bf16.
//
// moe_masked_layout: one CTA per expert e (grid-stride over experts), its
//   threads over the entries in tiles of blockDim ascending j. A warp ballot
//   flags ids[j] == e, the per-warp totals in shared memory give each flagged
//   entry its rank r = #{j' < j : ids[j'] == e}: no atomics, every output
//   element has exactly one writer, so the layout is deterministic and
//   depends on the ids alone. r < C: pos[j] = e * C + r and w_out there the
//   weight; else pos[j] = -1. Then counts[e] = min(seen, C), dropped[e] =
//   seen - counts[e], w_out zeroed past counts[e]. CTA 0 also gives every id
//   outside [0, E) pos -1 and writes their number to dropped[E].
// moe_masked_scatter_fp8: one CTA per token; each thread quantises 8 values
//   (16 B) of the token's row exactly as act_quant_fp8_vec8
//   (deepinfer::act_quant8_lanes: four lanes per 32-block share the amax) and writes them, and lane 0
//   of the four the scale, to every row pos[token * top_k + slot] in range.
// moe_masked_scatter_bf16: one CTA per token, the row copied to each of its
//   rows in 16-byte words when d % 8 == 0, else element by element.
// moe_masked_combine_bf16: one thread per 8 outputs (d % 8 == 0) or per
//   output: the slots' rows summed from 0.0 in fp32 in slot order, 0.0 for a
//   dropped slot, then the shared row, one bf16 rounding: bitwise
//   moe_combine_bf16 over the same rows with zero rows for the dropped.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

namespace masked {
constexpr int kMaxWarps = 32;

__device__ __forceinline__ bool in_rows(int32_t row, int64_t rows) {
    return row >= 0 && int64_t(row) < rows;
}

template <int V>
__device__ __forceinline__ void combine_span(const di_moe_masked_params &p, int64_t t, int64_t c,
                                             int64_t rows) {
    const __nv_bfloat16 *rows_in = static_cast<const __nv_bfloat16 *>(p.x);
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int32_t s = 0; s < p.top_k; ++s) {
        const int32_t row = p.pos[t * p.top_k + s];
        const bool ok = in_rows(row, rows);
        __nv_bfloat16 v[V];
        if (ok) {
            const __nv_bfloat16 *src = rows_in + int64_t(row) * p.d + c;
            if constexpr (V == 8) {
                *reinterpret_cast<uint4 *>(v) = *reinterpret_cast<const uint4 *>(src);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[i] = src[i];
            }
        }
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = __fadd_rn(acc[i], ok ? __bfloat162float(v[i]) : 0.0f);
    }
    const __nv_bfloat16 *sh = static_cast<const __nv_bfloat16 *>(p.shared) + t * p.d + c;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out) + t * p.d + c;
    __nv_bfloat16 o[V];
#pragma unroll
    for (int i = 0; i < V; ++i) o[i] = __float2bfloat16_rn(__fadd_rn(acc[i], __bfloat162float(sh[i])));
    if constexpr (V == 8) {
        *reinterpret_cast<uint4 *>(out) = *reinterpret_cast<const uint4 *>(o);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = o[i];
    }
}
}  // namespace masked

extern "C" __global__ void __launch_bounds__(1024)
    moe_masked_layout(const __grid_constant__ di_moe_masked_params p) {
    DI_PDL_ENTRY();
    __shared__ int warp_total[masked::kMaxWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t cap = p.capacity;
    for (int64_t e = blockIdx.x; e < p.experts; e += gridDim.x) {
        int64_t seen = 0;  // the same in every thread
        for (int64_t base = 0; base < p.n; base += blockDim.x) {
            const int64_t j = base + threadIdx.x;
            const bool hit = j < p.n && int64_t(p.ids[j]) == e;
            const unsigned ballot = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) warp_total[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, tile = 0;
            for (int w = 0; w < warps; ++w) {
                const int c = warp_total[w];
                before += w < warp ? c : 0;
                tile += c;
            }
            if (hit) {
                const int64_t r = seen + before + __popc(ballot & ((1u << lane) - 1u));
                if (r < cap) {
                    const int64_t row = e * cap + r;
                    p.pos[j] = int32_t(row);  // rows = E * C < 2^31 (checked by the host)
                    p.w_out[row] = p.weights[j];
                } else {
                    p.pos[j] = -1;
                }
            }
            seen += tile;
            __syncthreads();  // warp_total is rewritten by the next tile
        }
        const int64_t kept = seen < cap ? seen : cap;
        if (threadIdx.x == 0) {
            p.counts[e] = int32_t(kept);
            p.dropped[e] = int32_t(seen - kept);
        }
        for (int64_t c = kept + threadIdx.x; c < cap; c += blockDim.x) p.w_out[e * cap + c] = 0.0f;
    }
    if (blockIdx.x == 0) {
        int bad = 0;
        for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
            const int32_t id = p.ids[j];
            if (id < 0 || id >= p.experts) {
                p.pos[j] = -1;
                ++bad;
            }
        }
        bad = __reduce_add_sync(0xffffffffu, bad);
        __syncthreads();  // the last tile's reads of warp_total are done
        if (lane == 0) warp_total[warp] = bad;
        __syncthreads();
        if (threadIdx.x == 0) {
            int total = 0;
            for (int w = 0; w < warps; ++w) total += warp_total[w];
            p.dropped[p.experts] = total;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_masked_scatter_fp8(const __grid_constant__ di_moe_masked_params p) {
    DI_PDL_ENTRY();
    const int64_t groups = p.d / 8;  // d % 32 == 0: whole 32-blocks of four groups
    const int64_t rows = int64_t(p.experts) * p.capacity;
    uint8_t *out = static_cast<uint8_t *>(p.out);
    uint8_t *scale = static_cast<uint8_t *>(p.scale);
    for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
        const uint4 *xr =
            reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p.x) + t * p.d);
        // All lanes of a warp iterate together so the 4-lane shuffles stay in step.
        for (int64_t g0 = 0; g0 < groups; g0 += blockDim.x) {
            const int64_t g = g0 + threadIdx.x;
            const bool live = g < groups;
            __nv_bfloat16 v[8];
            if (live) *reinterpret_cast<uint4 *>(v) = xr[g];
            uint8_t q[8];
            const int e = deepinfer::act_quant8_lanes(v, live, q);
            if (!live) continue;
            const uint2 word = *reinterpret_cast<const uint2 *>(q);
            for (int32_t s = 0; s < p.top_k; ++s) {
                const int32_t row = p.pos[t * p.top_k + s];
                if (!masked::in_rows(row, rows)) continue;
                reinterpret_cast<uint2 *>(out + int64_t(row) * p.d)[g] = word;
                if ((g & 3) == 0) scale[int64_t(row) * (p.d / 32) + (g >> 2)] = uint8_t(e + 127);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_masked_scatter_bf16(const __grid_constant__ di_moe_masked_params p) {
    DI_PDL_ENTRY();
    const int64_t rows = int64_t(p.experts) * p.capacity;
    const bool words = p.d % 8 == 0;
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
        for (int32_t s = 0; s < p.top_k; ++s) {
            const int32_t row = p.pos[t * p.top_k + s];
            if (!masked::in_rows(row, rows)) continue;
            const __nv_bfloat16 *src = x + t * p.d;
            __nv_bfloat16 *dst = out + int64_t(row) * p.d;
            if (words) {
                const uint4 *sw = reinterpret_cast<const uint4 *>(src);
                uint4 *dw = reinterpret_cast<uint4 *>(dst);
                for (int64_t w = threadIdx.x; w < p.d / 8; w += blockDim.x) dw[w] = sw[w];
            } else {
                for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) dst[i] = src[i];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_masked_combine_bf16(const __grid_constant__ di_moe_masked_params p) {
    DI_PDL_ENTRY();
    const int64_t rows = int64_t(p.experts) * p.capacity;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    if (p.d % 8 == 0) {
        const int64_t spans = p.d / 8;
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.tokens * spans;
             i += stride)
            masked::combine_span<8>(p, i / spans, (i % spans) * 8, rows);
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.tokens * p.d;
             i += stride)
            masked::combine_span<1>(p, i / p.d, i % p.d, rows);
    }
}
