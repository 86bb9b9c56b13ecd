// Engram on the GPU (ops/engram.rs, v41-flash.md section 8).
// engram_rows: one thread per (token, column): the rolling XOR hashes of
//   the token's four compressed ids (int64 wrapping products), reduced with
//   rem_euclid by the column's prime, plus the column's table offset;
//   bitwise cpu_backend::engram::{ngram_hashes, table_rows}.
// engram_lookup_bf16x8 (rows of whole 8-byte words: head_dim % 8 == 0 and
//   (head_dim + head_dim / 32) % 8 == 0, as V4.1's 264-byte rows) and
//   engram_lookup_bf16 (any head_dim % 32 == 0): one warp per looked-up row,
//   8 a CTA (grid-stride); a lane takes 8 values at a time (one 8-byte load,
//   one 16-byte store) or one: e4m3 value times its 32-block's E8M0 scale,
//   one BF16 rounding; bitwise cpu_backend::engram::gather_rows. A row
//   outside the table writes nothing and lowers *bad to the entry's index.
// engram_gate_update_bf16x8 (d % 8 == 0) and engram_gate_update_bf16 (any
//   d): one CTA of GATE_THREADS per (token, stream), grid-stride over them;
//   thread i takes the vectors i, i + GATE_THREADS, ... of 8 elements
//   (16-byte loads and stores) or of one, adds each of the gate's three sums
//   in that order, then a warp butterfly, then the warps' sums in warp
//   order (every thread gets the same sums). The order depends on d alone,
//   not on the batch; it differs from the CPU's sequential sums by rounding
//   only. The update is elementwise IEEE, with each stream and the value
//   read again (the stream from L1) rather than held in registers.
#include <cuda_bf16.h>
#include <math.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/reduce.cuh"

using namespace deepinfer;

extern "C" __global__ void engram_rows(const __grid_constant__ di_engram_rows_params p) {
    DI_PDL_ENTRY();
    const int64_t n = p.tokens * p.cols;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / p.cols;
        const int col = int(i % p.cols);
        const int order = 2 + col / p.heads;  // n-gram order 2..4
        const int64_t *ids = p.ids + t * 4;
        // Wrapping int64 arithmetic through uint64 (defined behaviour).
        uint64_t h = uint64_t(ids[0]) * uint64_t(p.multipliers[0]);
        for (int k = 1; k < order; ++k) h ^= uint64_t(ids[k]) * uint64_t(p.multipliers[k]);
        const int64_t prime = p.primes[col];
        int64_t r = int64_t(h) % prime;
        if (r < 0) r += prime;
        p.rows[i] = r + p.offsets[col];
    }
}

// VEC consecutive BF16 values as fp32 (VEC = 8: one 16-byte load).
template <int VEC>
__device__ __forceinline__ void load_bf16(const __nv_bfloat16 *src, float (&out)[VEC]) {
    if constexpr (VEC == 8) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(src);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = __bfloat162float(src[i]);
    }
}

// VEC fp32 values rounded to BF16 one by one (RN), stored at dst.
template <int VEC>
__device__ __forceinline__ void store_bf16(__nv_bfloat16 *dst, const float (&v)[VEC]) {
    if constexpr (VEC == 8) {
        uint4 raw;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        *reinterpret_cast<uint4 *>(dst) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) dst[i] = __float2bfloat16_rn(v[i]);
    }
}

// Rows looked up per CTA of the lookup (a warp each; the launcher's
// LOOKUP_WARPS).
constexpr int LOOKUP_WARPS = 8;

template <int VEC>
__device__ __forceinline__ void engram_lookup(const di_engram_lookup_params &p) {
    const int64_t row_bytes = p.head_dim + p.head_dim / 32;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int lane = threadIdx.x & 31;
    const int64_t warps = int64_t(gridDim.x) * LOOKUP_WARPS;
    for (int64_t e = int64_t(blockIdx.x) * LOOKUP_WARPS + (threadIdx.x >> 5); e < p.entries;
         e += warps) {
        const int64_t r = p.rows[e];
        if (r < 0 || r >= p.table_rows) {
            if (lane == 0) atomicMin(p.bad, (long long)e);
            continue;
        }
        const uint8_t *row = p.table + r * row_bytes;
        __nv_bfloat16 *dst = out + e * p.head_dim;
        // Not unrolled: nvcc split the unrolled copies' 16-byte stores in four.
#pragma unroll 1
        for (int i = lane * VEC; i < p.head_dim; i += 32 * VEC) {
            const float scale = e8m0_to_f32(row[p.head_dim + i / 32]);
            if constexpr (VEC == 8) {
                const uint2 raw = *reinterpret_cast<const uint2 *>(row + i);
                const uint32_t words[2] = {raw.x, raw.y};
                float v[8];
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    v[j] = __fmul_rn(e4m3_to_f32(uint8_t(words[j / 4] >> (8 * (j % 4)))), scale);
                store_bf16<8>(dst + i, v);
            } else {
                dst[i] = __float2bfloat16_rn(__fmul_rn(e4m3_to_f32(row[i]), scale));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * LOOKUP_WARPS)
    engram_lookup_bf16x8(const __grid_constant__ di_engram_lookup_params p) {
    DI_PDL_ENTRY();
    engram_lookup<8>(p);
}

extern "C" __global__ void __launch_bounds__(32 * LOOKUP_WARPS)
    engram_lookup_bf16(const __grid_constant__ di_engram_lookup_params p) {
    DI_PDL_ENTRY();
    engram_lookup<1>(p);
}

// Threads per CTA of the gate update (the launcher's GATE_THREADS).
constexpr int GATE_THREADS = 256;
constexpr int GATE_WARPS = GATE_THREADS / 32;

template <int VEC>
__device__ __forceinline__ void engram_gate_update(const di_engram_gate_params &p) {
    __shared__ float sums[2][3][GATE_WARPS];
    const __nv_bfloat16 *streams = static_cast<const __nv_bfloat16 *>(p.streams);
    const __nv_bfloat16 *kv = static_cast<const __nv_bfloat16 *>(p.kv);
    const __nv_bfloat16 *qw = static_cast<const __nv_bfloat16 *>(p.q_weight);
    const __nv_bfloat16 *kw = static_cast<const __nv_bfloat16 *>(p.k_weight);
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t units = p.tokens * p.c;
    const int n_vec = p.d / VEC;
    int parity = 0;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x, parity ^= 1) {
        const int64_t t = u / p.c;
        const int c = int(u % p.c);
        const __nv_bfloat16 *s = streams + u * p.d;
        const __nv_bfloat16 *key = kv + (t * (p.c + 1) + c) * p.d;
        const __nv_bfloat16 *value = kv + (t * (p.c + 1) + p.c) * p.d;
        const __nv_bfloat16 *q_row = qw + int64_t(c) * p.d;
        const __nv_bfloat16 *k_row = kw + int64_t(c) * p.d;
        float dot = 0.0f, ss = 0.0f, kk = 0.0f;
#pragma unroll 2
        for (int v = threadIdx.x; v < n_vec; v += GATE_THREADS) {
            float sv[VEC], k[VEC], q[VEC], w[VEC];
            load_bf16<VEC>(s + v * VEC, sv);
            load_bf16<VEC>(key + v * VEC, k);
            load_bf16<VEC>(q_row + v * VEC, q);
            load_bf16<VEC>(k_row + v * VEC, w);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const float qk = __fmul_rn(q[e], w[e]);
                dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(sv[e], qk), k[e]));
                ss = __fadd_rn(ss, __fmul_rn(sv[e], sv[e]));
                kk = __fadd_rn(kk, __fmul_rn(k[e], k[e]));
            }
        }
        // Two buffers by unit parity: a buffer is written again only after
        // the next unit's barrier, which every thread reaches after reading it.
        dot = warp_sum(dot);
        ss = warp_sum(ss);
        kk = warp_sum(kk);
        if (lane == 0) {
            sums[parity][0][warp] = dot;
            sums[parity][1][warp] = ss;
            sums[parity][2][warp] = kk;
        }
        __syncthreads();
        dot = sums[parity][0][0];
        ss = sums[parity][1][0];
        kk = sums[parity][2][0];
#pragma unroll
        for (int i = 1; i < GATE_WARPS; ++i) {
            dot = __fadd_rn(dot, sums[parity][0][i]);
            ss = __fadd_rn(ss, sums[parity][1][i]);
            kk = __fadd_rn(kk, sums[parity][2][i]);
        }
        const float fd = float(p.d);
        float x = __fmul_rn(dot, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, fd), p.eps))));
        x = __fmul_rn(x, __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(kk, fd), p.eps))));
        x = __fmul_rn(x, p.inv_sqrt_d);
        // sign(x) * sqrt(max(|x|, 1e-6)), NaN propagating as f32::signum does.
        const float g_in = isnan(x) ? x : copysignf(__fsqrt_rn(fmaxf(fabsf(x), 1e-6f)), x);
        // sigmoid with the CPU's exp: f64 exp rounded once to fp32.
        const float ex = float(exp(double(-g_in)));
        const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, ex));
#pragma unroll 2
        for (int v = threadIdx.x; v < n_vec; v += GATE_THREADS) {
            float sv[VEC], val[VEC], o[VEC];
            load_bf16<VEC>(s + v * VEC, sv);
            load_bf16<VEC>(value + v * VEC, val);
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] = __fadd_rn(sv[e], __fmul_rn(g, val[e]));
            store_bf16<VEC>(out + u * p.d + v * VEC, o);
        }
    }
}

extern "C" __global__ void __launch_bounds__(GATE_THREADS)
    engram_gate_update_bf16x8(const __grid_constant__ di_engram_gate_params p) {
    DI_PDL_ENTRY();
    engram_gate_update<8>(p);
}

extern "C" __global__ void __launch_bounds__(GATE_THREADS)
    engram_gate_update_bf16(const __grid_constant__ di_engram_gate_params p) {
    DI_PDL_ENTRY();
    engram_gate_update<1>(p);
}
