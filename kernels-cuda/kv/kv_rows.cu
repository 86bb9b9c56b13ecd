// Cache-row writers (v41-flash.md 3.1 step 2, 3.4, 3.5; layouts and numerics
// in kernels-cuda/kv/README.md): the window ring row (RMSNorm, RoPE, FP8), the
// compressed entry (ratio-2 pooling or a ratio-1 row, RMSNorm, RoPE, FP4 with
// E4M3 scales) and the index key (RMSNorm, RoPE, FP4 with E8M0 scales), in one
// pass from the projection output to the row in the paged pool.
//
// Bitwise the CPU composition (cpu_backend::compressor::pool_ratio2,
// rms_norm, rope, kv_format::encode_*_row): every product and sum is a
// separate IEEE fp32 operation (__fmul_rn / __fadd_rn, no contraction), the
// RMSNorm sum of squares runs in index order in one thread per row, exp, cos
// and sin are evaluated in double precision and rounded once to fp32 as the
// CPU does (they can differ only where the double result lies within an ulp
// of an fp32 rounding midpoint).
//
// CTA = DI_KV_ROWS_PER_CTA rows, DI_KV_THREADS threads:
//   1. every thread: 16-byte chunks (8 values) of the rows into shared memory
//      as BF16 (a row of x, or the pooled value), and the rows' cos/sin table;
//   2. thread i < 16: the sum of squares of row i, sequentially (the CPU's
//      order), and its inverse RMS;
//   3. every thread: chunk -> norm -> latent store -> RoPE -> quantise (the
//      scale group's amax over 2 or 4 lanes by xor shuffles) -> row store.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

using namespace deepinfer;

namespace {

constexpr int kRows = DI_KV_ROWS_PER_CTA;
constexpr int kThreads = DI_KV_THREADS;
constexpr float kInvE4M3Max = 1.0f / 448.0f;
constexpr float kFp8AmaxFloor = 1e-4f;
constexpr float kFp4E4M3AmaxFloor = 6.0f / 512.0f;

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

__device__ __forceinline__ uint32_t f32_to_bf16_bits(float x) {
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}

// Eight BF16 (one 16-byte chunk) -> f32.
__device__ __forceinline__ void unpack8(uint4 w, float (&v)[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = bf16_bits_to_f32(u[k] & 0xFFFFu);
        v[2 * k + 1] = bf16_bits_to_f32(u[k] >> 16);
    }
}

// Eight f32 -> BF16 (round to nearest even) in one 16-byte chunk.
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
    uint32_t u[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = f32_to_bf16_bits(v[2 * k]) | (f32_to_bf16_bits(v[2 * k + 1]) << 16);
    return make_uint4(u[0], u[1], u[2], u[3]);
}

// e^x as the correctly rounded fp32 (numerics::exp: double, rounded once).
// exp(+-0) is exactly 1 in double, so the shortcut changes nothing.
__device__ __forceinline__ float exp_f32(float x) { return x == 0.0f ? 1.0f : float(exp(double(x))); }

// One channel of pool_ratio2: softmax over the two tokens' scores, in fp32.
__device__ __forceinline__ float pool2(float k0, float k1, float s0, float s1) {
    const float m = fmaxf(s0, s1);
    const float e0 = exp_f32(__fsub_rn(s0, m));
    const float e1 = exp_f32(__fsub_rn(s1, m));
    const float sum = __fadd_rn(e0, e1);
    return __fadd_rn(__fmul_rn(__fdiv_rn(e0, sum), k0), __fmul_rn(__fdiv_rn(e1, sum), k1));
}

__device__ __forceinline__ void load8(const float *p, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
    const float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Shared memory carve-up (see DI_KV_ROWS_PER_CTA in params.h).
struct Smem {
    uint16_t *vals;    // [kRows][dim + 8] BF16 bits
    float2 *cs;        // [kRows][rope_dim / 2] (cos, sin)
    const float **src; // [kRows][4] kv0, kv1, score0, score1 (pool2); NULL row: skip
    float *inv;        // [kRows] inverse RMS
    int stride;        // BF16 per vals row
};

__device__ __forceinline__ Smem carve(unsigned char *smem, const di_kv_rows_params &p) {
    Smem s;
    s.stride = p.dim + 8;
    s.vals = reinterpret_cast<uint16_t *>(smem);
    unsigned char *at = smem + size_t(kRows) * s.stride * 2;
    s.cs = reinterpret_cast<float2 *>(at);
    at += size_t(kRows) * (p.rope_dim / 2) * sizeof(float2);
    s.src = reinterpret_cast<const float **>(at);
    at += size_t(kRows) * 4 * sizeof(const float *);
    s.inv = reinterpret_cast<float *>(at);
    return s;
}

// The f32 row of group source r (>= 0 kv, < 0 pending), or NULL if out of range.
__device__ __forceinline__ bool source(const di_kv_rows_params &p, int32_t r, const float **kv,
                                       const float **score) {
    if (r >= 0) {
        if (r >= p.kv_rows) return false;
        *kv = p.kv + int64_t(r) * p.dim;
        *score = p.score + int64_t(r) * p.dim;
        return true;
    }
    const int64_t q = -1 - int64_t(r);
    if (p.pending_kv == nullptr || q >= p.pending_rows) return false;
    *kv = p.pending_kv + q * p.dim;
    *score = p.pending_score + q * p.dim;
    return true;
}

template <bool kPool2>
__device__ __forceinline__ void kv_rows_body(const di_kv_rows_params &p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const Smem s = carve(smem, p);
    const int tid = threadIdx.x;
    const int vecs = p.dim / 8;
    const int total = kRows * vecs;
    const int pairs = p.rope_dim / 2;
    const int64_t r0 = int64_t(blockIdx.x) * kRows;
    const int live_rows = int(min(int64_t(kRows), p.rows - r0));

    // Row sources: a pool2 group's two rows, or x's row (src[i][0] marks live).
    if (tid < kRows) {
        const float **src = s.src + 4 * tid;
        src[0] = src[1] = src[2] = src[3] = nullptr;
        const int64_t g = r0 + tid;
        if (tid < live_rows) {
            if constexpr (kPool2) {
                const int32_t a = p.groups ? p.groups[2 * g] : int32_t(2 * g);
                const int32_t b = p.groups ? p.groups[2 * g + 1] : int32_t(2 * g + 1);
                const float *k0, *k1, *s0, *s1;
                if (source(p, a, &k0, &s0) && source(p, b, &k1, &s1)) {
                    src[0] = k0; src[1] = k1; src[2] = s0; src[3] = s1;
                }
            } else {
                src[0] = static_cast<const float *>(p.x); /* any non-NULL mark */
            }
        }
    }
    // cos/sin of every (row, pair): fp32 angle, double cos/sin rounded once.
    if (p.positions != nullptr) {
        for (int q = tid; q < live_rows * pairs; q += kThreads) {
            const int i = q / pairs, k = q % pairs;
            const float angle = __fmul_rn(float(p.positions[r0 + i]), p.freqs[k]);
            double sn, cn;
            sincos(double(angle), &sn, &cn);
            s.cs[i * pairs + k] = make_float2(float(cn), float(sn));
        }
    }
    __syncthreads();

    // 1. Values into shared memory as BF16.
    for (int q = tid; q < live_rows * vecs; q += kThreads) {
        const int i = q / vecs, c = (q % vecs) * 8;
        const float **src = s.src + 4 * i;
        if (src[0] == nullptr) continue;
        uint4 w;
        if constexpr (kPool2) {
            float k0[8], k1[8], s0[8], s1[8], v[8];
            load8(src[0] + c, k0);
            load8(src[1] + c, k1);
            load8(src[2] + c, s0);
            load8(src[3] + c, s1);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = pool2(k0[j], k1[j], s0[j], s1[j]);
            w = pack8(v);
        } else {
            w = __ldg(reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p.x) +
                                                       (r0 + i) * p.dim + c));
        }
        *reinterpret_cast<uint4 *>(s.vals + i * s.stride + c) = w;
    }
    __syncthreads();

    // 2. Inverse RMS, the sum of squares in index order (one thread per row).
    if (p.norm != nullptr && tid < live_rows) {
        const uint16_t *row = s.vals + tid * s.stride;
        float sum = 0.0f;
        for (int c = 0; c < p.dim; c += 8) {
            float v[8];
            unpack8(*reinterpret_cast<const uint4 *>(row + c), v);
#pragma unroll
            for (int j = 0; j < 8; ++j) sum = __fadd_rn(sum, __fmul_rn(v[j], v[j]));
        }
        s.inv[tid] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, float(p.dim)), p.eps)));
    }
    __syncthreads();

    // 3. Norm, latent, RoPE, quantiser, row store. Every lane runs every
    //    iteration (the group shuffles need the whole warp).
    const int group = p.format == DI_KV_FORMAT_COMPRESSED ? 16 : 32;
    const int lanes = group / 8;
    const int rope_from = p.dim - p.rope_dim;
    const int64_t row_bytes = p.format == DI_KV_FORMAT_WINDOW ? p.dim + p.dim / 32
                              : p.format == DI_KV_FORMAT_COMPRESSED ? p.dim / 2 + p.dim / 16
                                                                    : p.dim / 2 + p.dim / 32;
    for (int base = 0; base < total; base += kThreads) {
        const int q = base + tid;
        const int i = q / vecs, c = (q % vecs) * 8;
        const bool live = q < live_rows * vecs && s.src[4 * i] != nullptr;
        const int64_t g = r0 + i;
        float v[8];
        float amax = p.format == DI_KV_FORMAT_WINDOW       ? kFp8AmaxFloor
                     : p.format == DI_KV_FORMAT_COMPRESSED ? kFp4E4M3AmaxFloor
                                                           : kFp4E8M0AmaxFloor;
        int64_t slot = -1;
        if (live) {
            unpack8(*reinterpret_cast<const uint4 *>(s.vals + i * s.stride + c), v);
            if (p.norm != nullptr) {
                float w[8];
                unpack8(__ldg(reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p.norm) + c)), w);
                const float inv = s.inv[i];
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    v[j] = bf16_bits_to_f32(f32_to_bf16_bits(__fmul_rn(w[j], __fmul_rn(v[j], inv))));
            }
            if (p.latent != nullptr) {
                *reinterpret_cast<uint4 *>(static_cast<__nv_bfloat16 *>(p.latent) + g * p.dim + c) = pack8(v);
            }
            if (p.positions != nullptr && c >= rope_from) {
                const float2 *cs = s.cs + i * pairs + (c - rope_from) / 2;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float x0 = v[2 * k], x1 = v[2 * k + 1];
                    const float cn = cs[k].x, sn = cs[k].y;
                    v[2 * k] = bf16_bits_to_f32(f32_to_bf16_bits(__fsub_rn(__fmul_rn(x0, cn), __fmul_rn(x1, sn))));
                    v[2 * k + 1] = bf16_bits_to_f32(f32_to_bf16_bits(__fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cn))));
                }
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
            slot = p.slots != nullptr ? int64_t(p.slots[g]) : g;
        }
        for (int o = 1; o < lanes; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (!live || p.out == nullptr || slot < 0 || slot >= p.out_rows) continue;
        uint8_t *row = static_cast<uint8_t *>(p.out) + slot * row_bytes;
        const bool lead = (c % group) == 0;
        if (p.format == DI_KV_FORMAT_WINDOW) {
            const int e = ceil_pow2_exponent(amax, kInvE4M3Max);
            // 1 / 2^e as the CPU forms it (exact; e = 127 gives the subnormal 2^-127).
            const float inv = __fdiv_rn(1.0f, e8m0_to_f32(uint32_t(e + 127)));
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                lo |= uint32_t(f32_to_e4m3(__fmul_rn(v[j], inv))) << (8 * j);
                hi |= uint32_t(f32_to_e4m3(__fmul_rn(v[j + 4], inv))) << (8 * j);
            }
            if (row_bytes % 8 == 0) {
                *reinterpret_cast<uint2 *>(row + c) = make_uint2(lo, hi);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    row[c + j] = uint8_t(lo >> (8 * j));
                    row[c + 4 + j] = uint8_t(hi >> (8 * j));
                }
            }
            if (lead) row[p.dim + c / 32] = uint8_t(e + 127);
        } else {
            float sc;
            uint8_t scale_byte;
            if (p.format == DI_KV_FORMAT_COMPRESSED) {
                scale_byte = f32_to_e4m3(__fdiv_rn(amax, 6.0f));
                sc = e4m3_to_f32(scale_byte);
            } else {
                const int e = ceil_pow2_exponent(amax, kInvE2M1Max);
                scale_byte = uint8_t(e + 127);
                sc = e8m0_to_f32(uint32_t(scale_byte));
            }
            uint32_t packed = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) packed |= f32_to_e2m1(clamp6(__fdiv_rn(v[j], sc))) << (4 * j);
            if (row_bytes % 4 == 0) {
                *reinterpret_cast<uint32_t *>(row + c / 2) = packed;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) row[c / 2 + j] = uint8_t(packed >> (8 * j));
            }
            if (lead) row[p.dim / 2 + c / group] = scale_byte;
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(DI_KV_THREADS)
    kv_rows_bf16(const __grid_constant__ di_kv_rows_params p) {
    kv_rows_body<false>(p);
}

extern "C" __global__ void __launch_bounds__(DI_KV_THREADS)
    kv_rows_pool2(const __grid_constant__ di_kv_rows_params p) {
    kv_rows_body<true>(p);
}
