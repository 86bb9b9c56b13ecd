// Indexer kernels (v41-flash.md 3.5-3.7): the FP4 index-key row writer, the
// exact BF16 index scores, and the exact top-k with the lower-index tie rule.
// Layouts, numerics and the tie rule: kernels-cuda/indexer/README.md.
//
// An index-key row (keys and queries alike) is kv_format's row: dim/2 bytes of
// packed e2m1 (even element in the low nibble), then dim/32 E8M0 scale bytes.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

using namespace deepinfer;

namespace {

constexpr float kInvE2M1Max = 1.0f / 6.0f;
constexpr float kFp4E8M0AmaxFloor = 6.0f * 1.17549435e-38f; /* 6 * FLT_MIN */

/* E8M0 byte -> f32 (0xFF NaN; byte 0 is the subnormal 2^-127). */
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    if (b == 0xFFu) return __uint_as_float(0x7FC00000u);
    if (b == 0u) return __uint_as_float(0x00400000u);
    return __uint_as_float(b << 23);
}

/* e2m1 nibble -> f32 (exact). */
__device__ __forceinline__ float e2m1_to_f32(uint32_t n) {
    const uint32_t code = n & 7u;
    /* Codes 2..7 are normal: exponent (code >> 1) - 1, mantissa bit code & 1. */
    uint32_t bits = code >= 2u ? ((((code >> 1) + 126u) << 23) | ((code & 1u) << 22))
                               : (code == 1u ? 0x3F000000u : 0u);
    bits |= (n & 8u) << 28;
    return __uint_as_float(bits);
}

/* f32 -> e2m1 nibble, saturating, nearest with ties to the even code; NaN keeps
 * its sign bit and maps to magnitude 6 (numerics::f32_to_e2m1). */
__device__ __forceinline__ uint32_t f32_to_e2m1(float x) {
    const uint32_t sign = (__float_as_uint(x) >> 31) << 3;
    const float a = fabsf(x);
    uint32_t code;
    if (a != a) code = 7;
    else if (a <= 0.25f) code = 0;
    else if (a < 0.75f) code = 1;
    else if (a <= 1.25f) code = 2;
    else if (a < 1.75f) code = 3;
    else if (a <= 2.5f) code = 4;
    else if (a < 3.5f) code = 5;
    else if (a <= 5.0f) code = 6;
    else code = 7;
    return sign | code;
}

/* Rust's f32::clamp(-6, 6): NaN stays NaN. */
__device__ __forceinline__ float clamp6(float x) { return x < -6.0f ? -6.0f : (x > 6.0f ? 6.0f : x); }

/* Order-preserving 16-bit key of a BF16 bit pattern: ascending keys are
 * ascending values under f32::total_cmp (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN). */
__device__ __forceinline__ uint32_t bf16_key(uint16_t b) {
    return (b & 0x8000u) ? (~uint32_t(b) & 0xFFFFu) : (uint32_t(b) | 0x8000u);
}

}  // namespace

/* ---- index-key row writer ------------------------------------------------- *
 * One warp per 128 values of a row: lane l holds 4 values, 8 lanes form one
 * 32-block and share its amax by three xor shuffles; lane 0 of the 8 writes the
 * scale byte. Grid-stride over (row, 128-chunk). dim % 32 == 0; a last chunk
 * shorter than 128 idles the lanes past dim. */
extern "C" __global__ void __launch_bounds__(256)
    indexer_key_quant(const __grid_constant__ di_indexer_quant_params p) {
    const int lane = threadIdx.x & 31;
    const int chunks = (p.dim + 127) / 128;
    const int64_t work = p.rows * chunks;
    const int64_t warp0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
    const int64_t row_bytes = p.dim / 2 + p.dim / 32;
    for (int64_t w = warp0; w < work; w += warps) {
        const int64_t row = w / chunks;
        const int col = int(w % chunks) * 128 + 4 * lane;
        const bool live = col < p.dim; /* uniform per 8-lane block: dim % 32 == 0 */
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float amax = kFp4E8M0AmaxFloor;
        if (live) {
            const uint2 raw =
                *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(p.x) + row * p.dim + col);
            v[0] = __uint_as_float(raw.x << 16);
            v[1] = __uint_as_float(raw.x & 0xFFFF0000u);
            v[2] = __uint_as_float(raw.y << 16);
            v[3] = __uint_as_float(raw.y & 0xFFFF0000u);
#pragma unroll
            for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[i]));
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
        if (!live) continue;
        const int e = ceil_pow2_exponent(amax, kInvE2M1Max);
        const float s = e8m0_to_f32(uint32_t(e + 127));
        uint32_t packed = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) packed |= f32_to_e2m1(clamp6(__fdiv_rn(v[i], s))) << (4 * i);
        uint8_t *out = static_cast<uint8_t *>(p.out) + row * row_bytes;
        /* Byte stores: a row is dim/2 + dim/32 bytes, odd when dim/32 is odd
         * (dim = 32, 96, ...), so a 2-byte store would be misaligned there. */
        out[col / 2] = uint8_t(packed);
        out[col / 2 + 1] = uint8_t(packed >> 8);
        if ((lane & 7) == 0) out[p.dim / 2 + col / 32] = uint8_t(e + 127);
    }
}

/* ---- index scores --------------------------------------------------------- *
 * s_t = bf16( sum_h bf16(w_h * relu(bf16(q_h . k_t))) ), h ascending in fp32;
 * every dot product in dimension order with separate fp32 multiply and add,
 * exactly as cpu_backend::indexer::index_scores, so the result is bitwise
 * equal to it for every input (no contraction: __fmul_rn / __fadd_rn).
 * Entries t >= visible[b] are -inf; visible is clamped to [0, n].
 *
 * CTA = one query row b and a stride of keys; one thread per key. The decoded
 * query sits in shared memory as [dim][heads] fp32 (read as broadcasts), the
 * head weights as fp32. Heads are processed in chunks of kHeadChunk dots held
 * in registers, the dimension loop inside; the head sum carries across chunks
 * in head order. */
namespace {
constexpr int kScoreThreads = 256;
constexpr int kHeadChunk = 16;
}  // namespace

extern "C" __global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_exact(const __grid_constant__ di_indexer_score_params p) {
    extern __shared__ float smem[];
    const int H = p.heads, D = p.dim;
    float *qs = smem;         /* [D][H] */
    float *ws = smem + D * H; /* [H] */
    const int b = blockIdx.y;
    const int64_t row_bytes = D / 2 + D / 32;
    const uint8_t *q = static_cast<const uint8_t *>(p.q) + int64_t(b) * H * row_bytes;
    for (int i = threadIdx.x; i < H * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        const uint8_t *qr = q + h * row_bytes;
        const uint32_t nib = (qr[d / 2] >> (4 * (d & 1))) & 0xFu;
        qs[d * H + h] = __fmul_rn(e2m1_to_f32(nib), e8m0_to_f32(qr[D / 2 + d / 32]));
    }
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        ws[h] = __bfloat162float(static_cast<const __nv_bfloat16 *>(p.w)[int64_t(b) * H + h]);
    __syncthreads();

    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    const uint8_t *keys = static_cast<const uint8_t *>(p.keys) + int64_t(b) * p.key_batch_stride;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.scores) + int64_t(b) * p.n;
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.n;
         t += int64_t(gridDim.x) * blockDim.x) {
        if (t >= visible) {
            out[t] = __ushort_as_bfloat16(0xFF80u);
            continue;
        }
        const uint8_t *kr = keys + t * row_bytes;
        float acc = 0.0f;
        for (int h0 = 0; h0 < H; h0 += kHeadChunk) {
            float dot[kHeadChunk];
#pragma unroll
            for (int j = 0; j < kHeadChunk; ++j) dot[j] = -0.0f;
            for (int d0 = 0; d0 < D; d0 += 32) {
                const float s = e8m0_to_f32(kr[D / 2 + d0 / 32]);
#pragma unroll
                for (int d = d0; d < d0 + 32; d += 8) {
                    /* Byte loads: rows of 17 * dim / 32 bytes are not 4-byte aligned for every dim. */
                    const uint32_t word = uint32_t(kr[d / 2]) | (uint32_t(kr[d / 2 + 1]) << 8) |
                                          (uint32_t(kr[d / 2 + 2]) << 16) | (uint32_t(kr[d / 2 + 3]) << 24);
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        const float kv = __fmul_rn(e2m1_to_f32((word >> (4 * i)) & 0xFu), s);
                        const float *qd = qs + (d + i) * H + h0;
#pragma unroll
                        for (int j = 0; j < kHeadChunk; ++j)
                            if (h0 + j < H) dot[j] = __fadd_rn(dot[j], __fmul_rn(qd[j], kv));
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < kHeadChunk; ++j) {
                if (h0 + j < H) {
                    const float relu = fmaxf(__bfloat162float(__float2bfloat16_rn(dot[j])), 0.0f);
                    acc = __fadd_rn(acc, __bfloat162float(__float2bfloat16_rn(__fmul_rn(ws[h0 + j], relu))));
                }
            }
        }
        out[t] = __float2bfloat16_rn(acc);
    }
}

/* ---- exact top-k ------------------------------------------------------------ *
 * Three passes over a row of BF16 scores split into `segments` contiguous
 * segments of seg_len entries (grid = segments x batch, every CTA one segment):
 *   1. hist_hi[b][s][256]: histogram of the high byte of the 16-bit key.
 *   2. every CTA finds the high byte hT of the k-th largest key from the
 *      row's total, then hist_lo[b][s][256]: histogram of the low byte of the
 *      keys whose high byte is hT.
 *   3. every CTA finds T = (hT, lT), the k-th largest key, above = #keys > T
 *      and need = k - above (ties at T to take, by lowest index); from the
 *      per-segment histograms it knows how many picks and ties precede its
 *      segment, then walks its segment in index order with block scans. The
 *      picks come out in ascending index order: entries < visible as
 *      index + offset, the rest as -1 (they are at the end).
 * The histograms are written fully by every CTA (no atomics on global memory,
 * no memset), so the result never depends on scheduling. */
namespace {
constexpr int kTopkThreads = 512;

__device__ __forceinline__ uint32_t load_key(const uint16_t *row, int64_t i) { return bf16_key(row[i]); }

/* Histogram of `bin(i)` over the flagged entries of [lo, hi) into smem. */
template <typename F>
__device__ void block_histogram(uint32_t *hist, int64_t lo, int64_t hi, F bin) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t base = lo; base < hi; base += blockDim.x) {
        const int64_t i = base + threadIdx.x;
        const int v = i < hi ? bin(i) : -1;
        /* Warp aggregation: one atomic per distinct bin in the warp. */
        const uint32_t peers = __match_any_sync(0xffffffffu, v);
        if (v >= 0 && (__ffs(peers) - 1) == int(threadIdx.x & 31)) atomicAdd(&hist[v], __popc(peers));
    }
    __syncthreads();
}

/* Finds the bin holding the k-th largest element given per-bin totals
 * (bins ascending by key) and the count already above all bins; returns the
 * bin and sets *above to the count of elements in higher bins (plus base). */
__device__ int find_bin(const uint32_t *total, uint32_t k, uint32_t base, uint32_t *above) {
    uint32_t cum = base;
    for (int v = 255; v >= 0; --v) {
        if (cum + total[v] >= k) {
            *above = cum;
            return v;
        }
        cum += total[v];
    }
    *above = cum;
    return 0;
}

/* Exclusive block scan of one int per thread; returns the thread's prefix and
 * writes the block total. blockDim == kTopkThreads. */
__device__ uint32_t block_exclusive_scan(uint32_t x, uint32_t *warp_sums, uint32_t *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t incl = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const uint32_t s = lane < kTopkThreads / 32 ? warp_sums[lane] : 0u;
        uint32_t si = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, si, o);
            if (lane >= o) si += y;
        }
        if (lane < kTopkThreads / 32) warp_sums[lane] = si - s;
        if (lane == 31) *total = si;
    }
    __syncthreads();
    const uint32_t r = warp_sums[warp] + incl - x;
    __syncthreads();
    return r;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_hist_hi(const __grid_constant__ di_indexer_topk_params p) {
    __shared__ uint32_t hist[256];
    const int s = blockIdx.x, b = blockIdx.y;
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    block_histogram(hist, lo, hi, [&](int64_t i) { return int(load_key(row, i) >> 8); });
    uint32_t *dst = p.hist_hi + (int64_t(b) * p.segments + s) * 256;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) dst[i] = hist[i];
}

namespace {
/* The row's total high-byte histogram and the high byte of the k-th key. */
__device__ int high_threshold(const di_indexer_topk_params &p, int b, uint32_t *total, uint32_t *above) {
    const uint32_t *h = p.hist_hi + int64_t(b) * p.segments * 256;
    for (int v = threadIdx.x; v < 256; v += blockDim.x) {
        uint32_t t = 0;
        for (int s = 0; s < p.segments; ++s) t += h[int64_t(s) * 256 + v];
        total[v] = t;
    }
    __syncthreads();
    return find_bin(total, uint32_t(p.k), 0u, above);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_hist_lo(const __grid_constant__ di_indexer_topk_params p) {
    __shared__ uint32_t total[256];
    __shared__ uint32_t hist[256];
    const int s = blockIdx.x, b = blockIdx.y;
    uint32_t above;
    const uint32_t hT = uint32_t(high_threshold(p, b, total, &above));
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    block_histogram(hist, lo, hi, [&](int64_t i) {
        const uint32_t key = load_key(row, i);
        return (key >> 8) == hT ? int(key & 0xFFu) : -1;
    });
    uint32_t *dst = p.hist_lo + (int64_t(b) * p.segments + s) * 256;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) dst[i] = hist[i];
}

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_collect(const __grid_constant__ di_indexer_topk_params p) {
    __shared__ uint32_t total[256];
    __shared__ uint32_t warp_sums[kTopkThreads / 32];
    __shared__ uint32_t scan_total;
    __shared__ uint32_t seg_picks, seg_ties; /* picks / ties at T before this segment */
    __shared__ int threshold;
    __shared__ uint32_t need_s;
    __shared__ uint32_t seg_above[DI_INDEXER_TOPK_MAX_SEGMENTS], seg_tie[DI_INDEXER_TOPK_MAX_SEGMENTS];
    const int s = blockIdx.x, b = blockIdx.y;
    uint32_t above_hi;
    const uint32_t hT = uint32_t(high_threshold(p, b, total, &above_hi));
    __syncthreads();
    const uint32_t *hlo = p.hist_lo + int64_t(b) * p.segments * 256;
    const uint32_t *hhi = p.hist_hi + int64_t(b) * p.segments * 256;
    for (int v = threadIdx.x; v < 256; v += blockDim.x) {
        uint32_t t = 0;
        for (int j = 0; j < p.segments; ++j) t += hlo[int64_t(j) * 256 + v];
        total[v] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t above;
        const uint32_t lT = uint32_t(find_bin(total, uint32_t(p.k), above_hi, &above));
        threshold = int((hT << 8) | lT);
        need_s = uint32_t(p.k) - above;
    }
    __syncthreads();
    /* Per earlier segment: keys > T and ties at T, one segment per thread. */
    {
        const uint32_t lT = uint32_t(threshold) & 0xFFu;
        for (int j = threadIdx.x; j < s; j += blockDim.x) {
            uint32_t a = 0;
            for (uint32_t v = hT + 1; v < 256; ++v) a += hhi[int64_t(j) * 256 + v];
            for (uint32_t v = lT + 1; v < 256; ++v) a += hlo[int64_t(j) * 256 + v];
            seg_above[j] = a;
            seg_tie[j] = hlo[int64_t(j) * 256 + lT];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint32_t need = need_s;
        uint32_t picks = 0, ties = 0;
        for (int j = 0; j < s; ++j) {
            const uint32_t taken = ties >= need ? 0u : min(seg_tie[j], need - ties);
            picks += seg_above[j] + taken;
            ties += seg_tie[j];
        }
        seg_picks = picks;
        seg_ties = ties;
    }
    __syncthreads();
    const uint32_t T = uint32_t(threshold), need = need_s;
    uint32_t picks = seg_picks, ties = seg_ties;
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    int32_t *out = p.out + int64_t(b) * p.k;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    for (int64_t base = lo; base < hi; base += blockDim.x) {
        const int64_t i = base + threadIdx.x;
        const uint32_t key = i < hi ? load_key(row, i) : 0u;
        const bool cand = i < hi && (key > T || (key == T && ties < need));
        if (!__syncthreads_or(cand)) continue;
        const bool tie = i < hi && key == T;
        const uint32_t tie_rank = ties + block_exclusive_scan(tie ? 1u : 0u, warp_sums, &scan_total);
        const uint32_t tie_count = scan_total;
        const bool sel = i < hi && (key > T || (tie && tie_rank < need));
        const uint32_t pos = picks + block_exclusive_scan(sel ? 1u : 0u, warp_sums, &scan_total);
        if (sel) out[pos] = i < visible ? int32_t(i + p.offset) : -1;
        picks += scan_total;
        ties += tie_count;
    }
}
