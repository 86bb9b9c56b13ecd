// The MoE glue around the grouped expert GEMMs (ops/moe.rs).
// Layout: x [tokens, d] BF16, weights [tokens * top_k] fp32, perm [n] int32
// (n = tokens * top_k; entry j = token * top_k + slot), routed [n, d] BF16
// in expert order, shared and out [tokens, d] BF16.
// moe_permute_bf16: one CTA per output row, threads over d.
// moe_permute_fp8: the same for e4m3 rows and their E8M0 scale rows.
// moe_combine_invert: pos[perm[i]] = the largest such i (atomicMax over a
//   zeroed pos: the CPU's sequential inverse, last writer wins).
// moe_combine_bf16: one thread per output element: the slots' rows summed
//   from 0.0 in slot order, then the shared expert, one BF16 rounding;
//   bitwise the CPU reference.
// An entry of perm outside [0, n) writes nothing and lowers *bad to i.
#include <cuda_bf16.h>
#include <stdint.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"

extern "C" __global__ void moe_permute_bf16(const __grid_constant__ di_moe_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(p.x);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
        const int32_t j = p.perm[i];
        if (j < 0 || int64_t(j) >= p.n) {
            if (threadIdx.x == 0) atomicMin(p.bad, (long long)i);
            continue;
        }
        const __nv_bfloat16 *src = x + int64_t(j / p.top_k) * p.d;
        for (int64_t e = threadIdx.x; e < p.d; e += blockDim.x) out[i * p.d + e] = src[e];
        if (threadIdx.x == 0) p.w_out[i] = p.weights[j];
    }
}

// moe_permute_fp8: as moe_permute_bf16 for e4m3 rows and their E8M0 scale
// rows (the activations' own quantisation, permuted instead of requantised):
// one CTA per output row, 16 bytes a thread and step when d % 16 == 0.
extern "C" __global__ void moe_permute_fp8(const __grid_constant__ di_moe_permute_fp8_params p) {
    DI_PDL_ENTRY();
    const uint8_t *q = static_cast<const uint8_t *>(p.q);
    const uint8_t *s = static_cast<const uint8_t *>(p.s);
    uint8_t *q_out = static_cast<uint8_t *>(p.q_out);
    uint8_t *s_out = static_cast<uint8_t *>(p.s_out);
    for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
        const int32_t j = p.perm[i];
        if (j < 0 || int64_t(j) >= p.n) {
            if (threadIdx.x == 0) atomicMin(p.bad, (long long)i);
            continue;
        }
        const int64_t t = j / p.top_k;
        if ((p.d & 15) == 0) {
            // Rows start 16-byte aligned: allocations are, and d is a multiple of 16.
            const uint4 *src = reinterpret_cast<const uint4 *>(q + t * p.d);
            uint4 *dst = reinterpret_cast<uint4 *>(q_out + i * p.d);
            for (int64_t e = threadIdx.x; e < p.d / 16; e += blockDim.x) dst[e] = src[e];
        } else {
            for (int64_t e = threadIdx.x; e < p.d; e += blockDim.x) q_out[i * p.d + e] = q[t * p.d + e];
        }
        for (int64_t e = threadIdx.x; e < p.sd; e += blockDim.x) s_out[i * p.sd + e] = s[t * p.sd + e];
        if (threadIdx.x == 0) p.w_out[i] = p.weights[j];
    }
}

extern "C" __global__ void moe_combine_invert(const __grid_constant__ di_moe_params p) {
    DI_PDL_ENTRY();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t j = p.perm[i];
        if (j < 0 || int64_t(j) >= p.n)
            atomicMin(p.bad, (long long)i);
        else
            atomicMax(p.pos + j, int32_t(i));  // i < n <= 2^31 - 1 (checked by the host)
    }
}

extern "C" __global__ void moe_combine_bf16(const __grid_constant__ di_moe_params p) {
    DI_PDL_ENTRY();
    const __nv_bfloat16 *routed = static_cast<const __nv_bfloat16 *>(p.x);
    const __nv_bfloat16 *shared = static_cast<const __nv_bfloat16 *>(p.shared);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int64_t total = p.tokens * p.d;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / p.d, e = i % p.d;
        float acc = 0.0f;
        for (int32_t slot = 0; slot < p.top_k; ++slot)
            acc = __fadd_rn(acc, __bfloat162float(routed[int64_t(p.pos[t * p.top_k + slot]) * p.d + e]));
        out[i] = __float2bfloat16_rn(__fadd_rn(acc, __bfloat162float(shared[i])));
    }
}

// Range check of routed expert ids (ops::check_ids): one thread per id,
// grid-stride; an id outside [0, bound) lowers *bad to its position.
extern "C" __global__ void check_ids(const __grid_constant__ di_check_ids_params p) {
    DI_PDL_ENTRY();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t v = p.ids[i];
        if (v < 0 || v >= p.bound) atomicMin(p.bad, (long long)i);
    }
}
