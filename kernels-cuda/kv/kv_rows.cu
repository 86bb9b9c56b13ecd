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
// CTA = a tile of R rows (16 BF16 rows, or 8 pooled entries), DI_KV_THREADS
// threads, in three phases:
//   1. BF16 rows: the whole tile copied to shared memory by cp.async, the
//      tile's cos/sin table computed while it is in flight; pooled rows: the
//      groups' members resolved once per tile, then one chunk (kv and score
//      of both members, 8 values) per thread at a time, pooled; the values go
//      to shared memory as BF16, with the norm weight and each row's slot.
//      No runtime integer division anywhere (Div below);
//   2. thread i < R: the sum of squares of row i, sequentially (the CPU's
//      order), and its inverse RMS;
//   3. every thread: chunk -> norm -> latent store -> RoPE -> quantise (the
//      scale group's amax over 2 or 4 lanes by xor shuffles) -> row store.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

using namespace deepinfer;

namespace {

constexpr float kFp4E4M3AmaxFloor = 6.0f / 512.0f;

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

__device__ __forceinline__ uint32_t f32_to_bf16_bits(float x) {
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}

// (a, b) rounded to BF16 (nearest even) and back to f32, one conversion.
__device__ __forceinline__ void round_bf16x2(float a, float b, float &ra, float &rb) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const uint32_t u = *reinterpret_cast<const uint32_t *>(&h);
    ra = __uint_as_float(u << 16);
    rb = __uint_as_float(u & 0xFFFF0000u);
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

// Two f32 -> two saturating e4m3 bytes (a in the low byte), one
// instruction; the same rounding as f32_to_e4m3.
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
    return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// e^x as the correctly rounded fp32 (numerics::exp: double, rounded once).
__device__ __forceinline__ float exp_f32(float x) { return float(exp(double(x))); }

// a / b for a in [0, 1], b = RN(1 + a) and r = RN(1 / b): q0 = a * r, one
// FMA residual, one FMA correction (q0 when the residual is 0). Equal to the
// IEEE quotient for every such a (tests/kv_writers_cpu.rs checks all 2^30).
__device__ __forceinline__ float div_by_sum(float a, float b, float r) {
    const float q0 = __fmul_rn(a, r);
    const float rem = __fmaf_rn(-b, q0, a);
    return rem == 0.0f ? q0 : __fmaf_rn(rem, r, q0);
}

// One channel of pool_ratio2: softmax over the two tokens' scores, in fp32,
// exactly e0 / sum * k0 + e1 / sum * k1 with e_t = exp(s_t - max). One of
// the differences is 0 (its exp is 1) unless a score is NaN or infinite, so
// one exp per channel, 1 / sum as the reciprocal and the other quotient by
// div_by_sum; the rest takes the plain formula.
__device__ __forceinline__ float pool2(float k0, float k1, float s0, float s1) {
    const float m = fmaxf(s0, s1);
    const float d0 = __fsub_rn(s0, m), d1 = __fsub_rn(s1, m);
    const bool first = d0 == 0.0f;
    if (first || d1 == 0.0f) {
        const float e = exp_f32(first ? d1 : d0);  // the other token's weight, in [0, 1]
        const float sum = __fadd_rn(1.0f, e), r = __frcp_rn(sum), q = div_by_sum(e, sum, r);
        const float w0 = first ? r : q, w1 = first ? q : r;
        return __fadd_rn(__fmul_rn(w0, k0), __fmul_rn(w1, k1));
    }
    const float e0 = exp_f32(d0), e1 = exp_f32(d1);
    const float sum = __fadd_rn(e0, e1);
    return __fadd_rn(__fmul_rn(__fdiv_rn(e0, sum), k0), __fmul_rn(__fdiv_rn(e1, sum), k1));
}

__device__ __forceinline__ void load8(const float *p, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
    const float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// 16 bytes global -> shared without registers (cp.async, L2 only).
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src) : "memory");
}

// Waits for this thread's cp.async copies; the caller's barrier publishes them.
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// fp32(p) for a position (RN from int64; the int32 conversion, a faster
// instruction, gives the same value wherever p fits).
__device__ __forceinline__ float position_f32(int64_t p) {
    return p == int64_t(int32_t(p)) ? float(int32_t(p)) : float(p);
}

// Tiles: BF16 rows 32 per CTA of 256 threads, copied to shared memory by
// cp.async (the whole tile in flight without registers; one full warp for
// the row sums); pooled entries 8 per CTA of 128 threads.
template <bool kPool2> struct Tile;
template <> struct Tile<false> {
    static constexpr int kRows = DI_KV_ROWS_BF16;
    static constexpr int kThreads = DI_KV_THREADS_BF16;
};
template <> struct Tile<true> {
    static constexpr int kRows = DI_KV_ROWS_POOL2;
    static constexpr int kThreads = DI_KV_THREADS_POOL2;
};

// q / d for q * d < 2^32 by a multiply-high with m = floor((2^32 - 1) / d) + 1
// (exact there: the error of m is below 1 / d per unit of q / 2^32); d = 1,
// whose m would be 2^32, is q itself.
struct Div {
    uint32_t d, m;
    __device__ __forceinline__ explicit Div(uint32_t d_) : d(d_), m(0xFFFFFFFFu / d_ + 1u) {}
    __device__ __forceinline__ uint32_t div(uint32_t q) const { return d == 1 ? q : __umulhi(q, m); }
};

// Shared memory carve-up (DI_KV_* in params.h).
struct Smem {
    uint16_t *vals;     // [rows][dim + 8] BF16 bits (the pad spreads the row sums' banks)
    uint16_t *w;        // [dim] norm weight
    float2 *cs;         // [rows][rope_dim / 2] (cos, sin)
    const float **src;  // [rows][4] kv0, kv1, score0, score1 (pool2); NULL: no row
    float *inv;         // [rows] inverse RMS
    int *ok;            // [rows] the row exists
    int64_t *slot;      // [rows] its pool row
    int stride;         // BF16 per vals row
};

__device__ __forceinline__ Smem carve(unsigned char *smem, const di_kv_rows_params &p, int rows) {
    Smem s;
    s.stride = p.dim + 8;
    s.vals = reinterpret_cast<uint16_t *>(smem);
    unsigned char *at = smem + size_t(rows) * s.stride * 2;
    s.w = reinterpret_cast<uint16_t *>(at);
    at += size_t(p.dim) * 2;
    s.cs = reinterpret_cast<float2 *>(at);
    at += size_t(rows) * (p.rope_dim / 2) * sizeof(float2);
    s.src = reinterpret_cast<const float **>(at);
    at += size_t(rows) * 4 * sizeof(const float *);
    s.slot = reinterpret_cast<int64_t *>(at);
    at += size_t(rows) * sizeof(int64_t);
    s.inv = reinterpret_cast<float *>(at);
    at += size_t(rows) * sizeof(float);
    s.ok = reinterpret_cast<int *>(at);
    return s;
}

// Member r of a group (>= 0 a kv row, < 0 a pending row) as (kv, score)
// row pointers, or false if out of range.
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

// The tile's cos/sin table: fp32 angle, double cos/sin rounded once.
template <int kThreads>
__device__ __forceinline__ void rope_table(const di_kv_rows_params &p, const Smem &s, int64_t r0,
                                           int live_rows) {
    const uint32_t pairs = uint32_t(p.rope_dim) / 2;
    const Div by_pairs(pairs);
    for (uint32_t q = threadIdx.x; q < live_rows * pairs; q += kThreads) {
        const uint32_t i = by_pairs.div(q), k = q - i * pairs;
        const float angle = __fmul_rn(position_f32(p.positions[r0 + i]), p.freqs[k]);
        double sn, cn;
        sincos(double(angle), &sn, &cn);
        s.cs[q] = make_float2(float(cn), float(sn));
    }
}

// Phase 1, BF16 rows: every chunk of the tile into shared memory (in flight
// together), the RoPE table computed meanwhile.
__device__ __forceinline__ void load_bf16(const di_kv_rows_params &p, const Smem &s, int64_t r0,
                                          int live_rows, Div by_vecs) {
    constexpr int kThreads = Tile<false>::kThreads;
    const uint32_t tasks = live_rows * by_vecs.d;
    const uint4 *x = reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p.x) + r0 * p.dim);
    for (uint32_t q = threadIdx.x; q < tasks; q += kThreads) {
        const uint32_t i = by_vecs.div(q);
        cp_async16(s.vals + i * s.stride + (q - i * by_vecs.d) * 8, x + q); /* the tile's rows are contiguous */
    }
    if (threadIdx.x < live_rows) s.ok[threadIdx.x] = 1;
    if (p.positions != nullptr) rope_table<kThreads>(p, s, r0, live_rows);
    cp_async_wait_all();
}

// Phase 1, pooled entries: the groups' members (resolved once per tile),
// then each thread loads the four member chunks (8 values each) of one
// entry and pools them (the exp dominates; the loads of the other warps and
// CTAs overlap it).
__device__ __forceinline__ void load_pool2(const di_kv_rows_params &p, const Smem &s, int64_t r0,
                                           int live_rows, Div by_vecs) {
    constexpr int kThreads = Tile<true>::kThreads;
    if (threadIdx.x < live_rows) {
        const int64_t g = r0 + threadIdx.x;
        const int32_t a = p.groups ? p.groups[2 * g] : int32_t(2 * g);
        const int32_t b = p.groups ? p.groups[2 * g + 1] : int32_t(2 * g + 1);
        const float **src = s.src + 4 * threadIdx.x;
        const bool ok = source(p, a, &src[0], &src[2]) && source(p, b, &src[1], &src[3]);
        s.ok[threadIdx.x] = ok;
    }
    if (p.positions != nullptr) rope_table<kThreads>(p, s, r0, live_rows);
    __syncthreads();
    const uint32_t tasks = live_rows * by_vecs.d;
    for (uint32_t q = threadIdx.x; q < tasks; q += kThreads) {
        const uint32_t i = by_vecs.div(q), c = (q - i * by_vecs.d) * 8;
        if (!s.ok[i]) continue;
        const float *const *src = s.src + 4 * i;
        float k0[8], k1[8], s0[8], s1[8], v[8];
        load8(src[0] + c, k0);
        load8(src[1] + c, k1);
        load8(src[2] + c, s0);
        load8(src[3] + c, s1);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = pool2(k0[j], k1[j], s0[j], s1[j]);
        *reinterpret_cast<uint4 *>(s.vals + i * s.stride + c) = pack8(v);
    }
}

// Per format: values per scale, the amax floor, bytes of a row.
template <int kFormat> struct Format {
    static constexpr uint32_t kGroup = kFormat == DI_KV_FORMAT_COMPRESSED ? 16 : 32;
    static constexpr float kFloor = kFormat == DI_KV_FORMAT_WINDOW       ? kFp8AmaxFloor
                                    : kFormat == DI_KV_FORMAT_COMPRESSED ? kFp4E4M3AmaxFloor
                                                                         : kFp4E8M0AmaxFloor;
    // One step of the group amax: FP8 drops NaN (a NaN value keeps its own
    // e4m3 NaN code), FP4 keeps NaN and Inf for the NaN scale.
    __device__ __forceinline__ static float amax(float a, float b) {
        return kFormat == DI_KV_FORMAT_WINDOW ? fmaxf(a, b) : amax_keep_nan(a, b);
    }
    __device__ __forceinline__ static uint32_t row_bytes(uint32_t dim) {
        return kFormat == DI_KV_FORMAT_WINDOW ? dim + dim / 32 : dim / 2 + dim / kGroup;
    }
};

// Quantises one chunk (8 values at column c, amax of its scale group) into
// its row.
template <int kFormat>
__device__ __forceinline__ void store_chunk(uint8_t *row, uint32_t dim, uint32_t c, const float (&v)[8],
                                            float amax, uint32_t row_bytes) {
    const bool lead = (c % Format<kFormat>::kGroup) == 0;
    if constexpr (kFormat == DI_KV_FORMAT_WINDOW) {
        const int e = ceil_pow2_exponent(amax, kInvE4M3Max);
        // 1 / 2^e as the CPU forms it (1 / e8m0): 2^-e, and the subnormal
        // 2^-127 for e = 127 (exact either way).
        const float inv = e == 127 ? __uint_as_float(0x00400000u) : exp2_neg(e);
        uint32_t b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            b[k] = e4m3x2(__fmul_rn(v[2 * k], inv), __fmul_rn(v[2 * k + 1], inv));
        const uint32_t lo = b[0] | (b[1] << 16), hi = b[2] | (b[3] << 16);
        if (row_bytes % 8 == 0) {
            *reinterpret_cast<uint2 *>(row + c) = make_uint2(lo, hi);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                row[c + j] = uint8_t(lo >> (8 * j));
                row[c + 4 + j] = uint8_t(hi >> (8 * j));
            }
        }
        if (lead) row[dim + c / 32] = uint8_t(e + 127);
    } else {
        // v / scale for every value of the chunk. Index keys: the scale is a
        // power of two, so the product with its exact reciprocal is the
        // quotient. Compressed rows: q0 = v * r with r = RN(1 / s), one FMA
        // residual and one FMA correction (q0 itself when the residual is 0,
        // which keeps -0); for every BF16 v and e4m3 s >= 2^-9 this gives the
        // IEEE quotient wherever it is finite and >= 1e-30 in magnitude, and
        // the same e2m1 code below that (tests/kv_writers_cpu.rs checks all
        // 8.2 million pairs).
        // A NaN or +-Inf in the group: the NaN scale and code 7 everywhere.
        const bool nan_block = !isfinite(amax);
        float q[8];
        uint8_t scale_byte;
        if constexpr (kFormat == DI_KV_FORMAT_COMPRESSED) {
            scale_byte = nan_block ? kE4M3Nan : f32_to_e4m3(__fdiv_rn(amax, 6.0f));
            const float sc = e4m3_to_f32(scale_byte), r = __frcp_rn(sc);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float q0 = __fmul_rn(v[j], r);
                const float rem = __fmaf_rn(-sc, q0, v[j]);
                q[j] = rem == 0.0f ? q0 : __fmaf_rn(rem, r, q0);
            }
        } else {
            const int e = ceil_pow2_exponent(amax, kInvE2M1Max);
            scale_byte = nan_block ? uint8_t(kE8M0Nan) : uint8_t(e + 127);
            const float r = e == 127 ? __uint_as_float(0x00400000u) : exp2_neg(e);
#pragma unroll
            for (int j = 0; j < 8; ++j) q[j] = __fmul_rn(v[j], r);
        }
        uint32_t packed = kFp4NanBlockCode * 0x11111111u;
        if (!nan_block) {
            packed = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) packed |= f32_to_e2m1(clamp6(q[j])) << (4 * j);
        }
        if (row_bytes % 4 == 0) {
            *reinterpret_cast<uint32_t *>(row + c / 2) = packed;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) row[c / 2 + j] = uint8_t(packed >> (8 * j));
        }
        if (lead) row[dim / 2 + c / Format<kFormat>::kGroup] = scale_byte;
    }
}

template <bool kPool2, int kFormat>
__device__ __forceinline__ void kv_rows_body(const di_kv_rows_params &p) {
    constexpr int kRowsT = Tile<kPool2>::kRows, kThreads = Tile<kPool2>::kThreads;
    using F = Format<kFormat>;
    extern __shared__ __align__(16) unsigned char smem[];
    const Smem s = carve(smem, p, kRowsT);
    const uint32_t tid = threadIdx.x;
    const uint32_t dim = uint32_t(p.dim);
    const Div by_vecs(dim / 8);
    const uint32_t pairs = uint32_t(p.rope_dim) / 2;
    const int64_t r0 = int64_t(blockIdx.x) * kRowsT;
    const int live_rows = int(min(int64_t(kRowsT), p.rows - r0));

    // 1. The norm weight, then the tile's values (and the RoPE table, while
    //    the BF16 loads are in flight) into shared memory as BF16.
    if (p.norm != nullptr) {
        const uint4 *w = static_cast<const uint4 *>(p.norm);
        for (uint32_t q = tid; q < by_vecs.d; q += kThreads) reinterpret_cast<uint4 *>(s.w)[q] = __ldg(w + q);
    }
    if (int(tid) < live_rows) {
        const int64_t g = r0 + tid;
        s.slot[tid] = p.slots != nullptr ? int64_t(p.slots[g]) : g;
    }
    if constexpr (kPool2) {
        load_pool2(p, s, r0, live_rows, by_vecs);
    } else {
        load_bf16(p, s, r0, live_rows, by_vecs);
    }
    __syncthreads();

    // 2. Inverse RMS, the sum of squares in index order (one thread per row).
    if (p.norm != nullptr && int(tid) < live_rows && s.ok[tid]) {
        const uint16_t *row = s.vals + tid * s.stride;
        float sum = 0.0f;
        for (uint32_t c = 0; c < dim; c += 8) {
            float v[8];
            unpack8(*reinterpret_cast<const uint4 *>(row + c), v);
#pragma unroll
            for (int j = 0; j < 8; ++j) sum = __fadd_rn(sum, __fmul_rn(v[j], v[j]));
        }
        s.inv[tid] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, float(dim)), p.eps)));
    }
    __syncthreads();

    // 3. Norm, latent, RoPE, quantiser, row store. Every lane runs every
    //    iteration (the group shuffles need the whole warp).
    const uint32_t total = kRowsT * by_vecs.d, live_total = live_rows * by_vecs.d;
    const uint32_t rope_from = dim - uint32_t(p.rope_dim);
    const uint32_t row_bytes = F::row_bytes(dim);
    for (uint32_t base = 0; base < total; base += kThreads) {
        const uint32_t q = base + tid;
        const uint32_t i = by_vecs.div(q), c = (q - i * by_vecs.d) * 8;
        const bool live = q < live_total && s.ok[i];
        const int64_t g = r0 + i;
        float v[8];
        float amax = F::kFloor;
        int64_t slot = -1;
        if (live) {
            unpack8(*reinterpret_cast<const uint4 *>(s.vals + i * s.stride + c), v);
            if (p.norm != nullptr) {
                float w[8];
                unpack8(*reinterpret_cast<const uint4 *>(s.w + c), w);
                const float inv = s.inv[i];
#pragma unroll
                for (int j = 0; j < 8; j += 2)
                    round_bf16x2(__fmul_rn(w[j], __fmul_rn(v[j], inv)), __fmul_rn(w[j + 1], __fmul_rn(v[j + 1], inv)),
                                 v[j], v[j + 1]);
            }
            if (p.latent != nullptr) {
                *reinterpret_cast<uint4 *>(static_cast<__nv_bfloat16 *>(p.latent) + g * dim + c) = pack8(v);
            }
            if (p.positions != nullptr && c >= rope_from) {
                const float2 *cs = s.cs + i * pairs + (c - rope_from) / 2;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float x0 = v[2 * k], x1 = v[2 * k + 1];
                    const float cn = cs[k].x, sn = cs[k].y;
                    round_bf16x2(__fsub_rn(__fmul_rn(x0, cn), __fmul_rn(x1, sn)),
                                 __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cn)), v[2 * k], v[2 * k + 1]);
                }
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) amax = F::amax(amax, fabsf(v[j]));
            slot = s.slot[i];
        }
#pragma unroll
        for (uint32_t o = 1; o < F::kGroup / 8; o <<= 1) amax = F::amax(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (!live || p.out == nullptr || slot < 0 || slot >= p.out_rows) continue;
        store_chunk<kFormat>(static_cast<uint8_t *>(p.out) + slot * row_bytes, dim, c, v, amax, row_bytes);
    }
}

template <bool kPool2>
__device__ __forceinline__ void kv_rows_dispatch(const di_kv_rows_params &p) {
    switch (p.format) {
        case DI_KV_FORMAT_WINDOW: kv_rows_body<kPool2, DI_KV_FORMAT_WINDOW>(p); break;
        case DI_KV_FORMAT_COMPRESSED: kv_rows_body<kPool2, DI_KV_FORMAT_COMPRESSED>(p); break;
        default: kv_rows_body<kPool2, DI_KV_FORMAT_INDEX_KEY>(p); break;
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(DI_KV_THREADS_BF16, 4)
    kv_rows_bf16(const __grid_constant__ di_kv_rows_params p) {
    DI_PDL_ENTRY();
    kv_rows_dispatch<false>(p);
}

extern "C" __global__ void __launch_bounds__(DI_KV_THREADS_POOL2, 8)
    kv_rows_pool2(const __grid_constant__ di_kv_rows_params p) {
    DI_PDL_ENTRY();
    kv_rows_dispatch<true>(p);
}
