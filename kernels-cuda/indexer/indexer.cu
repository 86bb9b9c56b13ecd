// Indexer kernels (v41-flash.md 3.5-3.7): the FP4 index-key row writer, the
// exact BF16 index scores, and the exact top-k with the lower-index tie rule.
// Layouts, numerics and the tie rule: kernels-cuda/indexer/README.md.
//
// An index-key row (keys and queries alike) is kv_format's row: dim/2 bytes of
// packed e2m1 (even element in the low nibble), then dim/32 E8M0 scale bytes.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

using namespace deepinfer;

namespace {

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
    DI_PDL_ENTRY();
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
            for (int i = 0; i < 4; ++i) amax = amax_keep_nan(amax, fabsf(v[i]));
        }
        amax = amax_keep_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = amax_keep_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        amax = amax_keep_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
        if (!live) continue;
        /* A NaN or +-Inf in the block: the NaN scale and code 7 everywhere. */
        const bool nan_block = !isfinite(amax);
        const int e = ceil_pow2_exponent(amax, kInvE2M1Max);
        const uint32_t scale_byte = nan_block ? kE8M0Nan : uint32_t(e + 127);
        const float s = e8m0_to_f32(scale_byte);
        uint32_t packed = kFp4NanBlockCode * 0x1111u;
        if (!nan_block) {
            packed = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) packed |= f32_to_e2m1(clamp6(__fdiv_rn(v[i], s))) << (4 * i);
        }
        uint8_t *out = static_cast<uint8_t *>(p.out) + row * row_bytes;
        /* Byte stores: a row is dim/2 + dim/32 bytes, odd when dim/32 is odd
         * (dim = 32, 96, ...), so a 2-byte store would be misaligned there. */
        out[col / 2] = uint8_t(packed);
        out[col / 2 + 1] = uint8_t(packed >> 8);
        if ((lane & 7) == 0) out[p.dim / 2 + col / 32] = uint8_t(scale_byte);
    }
}

/* ---- index scores --------------------------------------------------------- *
 * s_t = bf16( sum_h bf16(w_h * relu(bf16(q_h . k_t))) ), h ascending in fp32;
 * every dot product in dimension order with separate fp32 multiply and add,
 * exactly as cpu_backend::indexer::index_scores, so the result is bitwise
 * equal to it for every input (no contraction: __fmul_rn / __fadd_rn).
 * Entries t >= visible[b] are -inf; visible is clamped to [0, n].
 *
 * Two entry points compute it:
 *   indexer_scores_exact: any heads x dim; CTA = one query row b and a stride
 *     of keys, one key per thread, the decoded query in shared memory as
 *     [dim][heads] fp32 (read as broadcasts). Heads run in chunks of
 *     kHeadChunk dots held in registers, the dimension loop inside; the head
 *     sum carries across chunks in head order.
 *   indexer_scores_fast: dim 128, heads <= 32 (the host checks): integer
 *     tensor-core dot products, bitwise equal as well (numerics below). */
namespace {
constexpr int kScoreThreads = 256;
constexpr int kHeadChunk = 16;
constexpr int kKeyRow = 68; /* bytes of an index-key row at dim 128 */

/* Value d of an index-key row of dim D (packed e2m1, then E8M0 scales per
 * 32): the one decoding of a query value, for the shared fp32 query and for
 * the tensor-core kernel's exact fallback, so both see the same bits. */
__device__ __forceinline__ float index_row_value(const uint8_t *r, int d, int D) {
    return __fmul_rn(e2m1_to_f32((r[d / 2] >> (4 * (d & 1))) & 0xFu), e8m0_to_f32(r[D / 2 + d / 32]));
}

/* Decodes the query row b into qs [dim][heads] fp32 and its weights into ws. */
__device__ void load_query_f32(const di_indexer_score_params &p, int b, float *qs, float *ws) {
    const int H = p.heads, D = p.dim;
    const int64_t row_bytes = D / 2 + D / 32;
    const uint8_t *q = static_cast<const uint8_t *>(p.q) + int64_t(b) * H * row_bytes;
    for (int i = threadIdx.x; i < H * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        qs[d * H + h] = index_row_value(q + h * row_bytes, d, D);
    }
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        ws[h] = __bfloat162float(static_cast<const __nv_bfloat16 *>(p.w)[int64_t(b) * H + h]);
}

/* The exact score of the key row kr (global or shared memory) for one thread. */
__device__ __forceinline__ __nv_bfloat16 exact_key_score(const uint8_t *kr, const float *qs,
                                                         const float *ws, int H, int D) {
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
    return __float2bfloat16_rn(acc);
}

/* Key t of row b (`row`: row b's contiguous keys when not paged), or NULL for
 * a key on a page outside the pool (it scores -inf). */
__device__ __forceinline__ const uint8_t *key_at(const di_indexer_score_params &p, const uint8_t *row, int b,
                                                 int64_t t, int64_t row_bytes) {
    if (p.pages == nullptr) return row + t * row_bytes;
    const int64_t pg = p.pages[int64_t(b) * p.pages_stride + t / p.page_rows];
    if (pg < 0 || pg >= p.pool_pages) return nullptr;
    return static_cast<const uint8_t *>(p.keys) + (pg * p.page_rows + t % p.page_rows) * row_bytes;
}

/* One thread per key over the CTA's stride of row b (both kernels' SIMT path). */
__device__ void exact_scores_simt(const di_indexer_score_params &p, int b, const float *qs,
                                  const float *ws) {
    const int64_t row_bytes = p.dim / 2 + p.dim / 32;
    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    const uint8_t *keys = static_cast<const uint8_t *>(p.keys) + int64_t(b) * p.key_batch_stride;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.scores) + int64_t(b) * p.n;
    for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.n;
         t += int64_t(gridDim.x) * blockDim.x) {
        const uint8_t *k = t < visible ? key_at(p, keys, b, t, row_bytes) : nullptr;
        out[t] = k == nullptr ? __ushort_as_bfloat16(0xFF80u) : exact_key_score(k, qs, ws, p.heads, p.dim);
    }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_exact(const __grid_constant__ di_indexer_score_params p) {
    DI_PDL_ENTRY();
    extern __shared__ float smem[];
    float *qs = smem;                   /* [D][H] */
    float *ws = smem + p.dim * p.heads; /* [H] */
    load_query_f32(p, blockIdx.y, qs, ws);
    __syncthreads();
    exact_scores_simt(p, blockIdx.y, qs, ws);
}

/* ---- fast index scores (integer tensor cores), dim 128, heads <= 32 -------- *
 * Numerics. With e2m1 values x2 as integers A, B in [-12, 12] and a row's
 * block exponents shifted relative to its smallest one (shift sigma in 0..3),
 * every product q_d * k_d is (A_d << sq_d) * (B_d << sk_d) * u with
 * u = 2^(qmin_h + kmin - 2), |A << sq|, |B << sk| <= 96. The dot product is
 * D * u with D = sum_d (A<<sq)(B<<sk) an integer, |D| <= 128 * 96^2 < 2^21,
 * computed exactly by mma.sync m16n8k32 (u8 keys x s8 query, int32). The CPU
 * reference's sequential fp32 sum is then exact too (every partial sum is a
 * multiple of u below 2^21 u), so bf16(dot) = bf16(D) * 2^(qmin_h - 2) *
 * 2^kmin as long as everything stays in the normal range. The kernel folds
 * 2^(qmin_h - 2) into the head weight (w'' = w * 2^(qmin_h - 2), exact in
 * BF16) and 2^kmin out of the head sum (every term carries it; the fp32 sum
 * and both roundings commute with a power of two in the normal range), so per
 * (head, key) it computes t' = bf16(w'' * relu(bf16(D))) and per key
 * out = bf16(fl(sum_h t' in head order) * 2^kmin): bitwise the reference.
 *
 * Domain (checked per query row and per key; else the exact path below):
 * every E8M0 scale byte of the query row and of the key in [95, 159] (2^-32 ..
 * 2^32), each query head's and each key's four block scales within 2^3 of
 * their smallest, every head weight zero or a normal BF16 in 2^-32 .. 2^33.
 * With these bounds every nonzero intermediate lies in 2^-110 .. 2^115 on
 * both sides, so the scalings above are exact. Outside the domain a key (or
 * every key of an out-of-domain query row) is scored by the warp: lane h
 * computes head h's dot product in dimension order with separate fp32
 * multiplies and adds (the SIMT kernel's arithmetic), then the head sum runs
 * in head order through shuffles. Either way the result is bitwise the
 * reference's.
 *
 * Key operand: e2m1 nibble -> u8 (value + 128) with two prmt lookups into the
 * table of |value| << sigma (sign bit as prmt's sign-replicate bit: positive
 * codes read the magnitude, negative codes read 0, and the other way round
 * with the sign bit flipped), then P + 0x80808080 - Q in one add (bytes stay
 * in [32, 224], no borrows). The +128 bias becomes -128 * sum_d q_d per head,
 * folded into the accumulator's initial value together with the constant
 * 1.5 * 2^23, so the int32 result read as fp32 is 1.5 * 2^23 + D exactly and
 * one fp32 subtraction yields D.
 *
 * Layout: the MMA's M is 16 keys, N is 8 heads (4 n-tiles for 32 heads), K is
 * one lane's 32-block: lane (g, c) of an m-tile feeds block c of its keys, so
 * one lane's 8 values of a k-step are one 32-bit word of its block and share
 * one shift. K position 4c + i (i < 4) of k-step s is dimension 32c + 8s + i,
 * position 16 + 4c + i is 32c + 8s + 4 + i. Column n of n-tile j is head
 * 8 (n / 2) + 2 j + n % 2, so lane (g, c)'s accumulators hold heads
 * 8c .. 8c + 7 of two keys; they are written as BF16 to a per-warp
 * [32 keys][32 heads] tile (16-byte chunks XOR-swizzled) and lane L then sums
 * key L's 32 terms in head order.
 *
 * Memory: each warp streams its own 32-key tiles (2176 bytes, 16-byte aligned
 * whenever the row is) through a kFastStages ring filled by one bulk copy
 * (cp.async.bulk) per tile on the stage's mbarrier (one arrival a phase); the
 * at most 3 + 3 words outside a tile's aligned middle go by plain loads and
 * stores before that arrival (issue_tile). Key rows are read from shared
 * memory as 32-bit words; the m-tile row -> key map (rows g and g + 8 of
 * m-tile m are keys 8m + g%4 + 16(g/4) and that + 4) makes those reads
 * bank-conflict free. */
namespace {
constexpr int kFastWarps = DI_INDEXER_FAST_THREADS / 32;
constexpr int kFastStages = DI_INDEXER_FAST_STAGES;
constexpr int kTileKeys = 32;
constexpr int kTileBytes = kTileKeys * kKeyRow;   /* 2176 */
constexpr int kStageBytes = kTileBytes + 32;      /* 16 + up to 15 bytes of alignment slack */
constexpr int kScratchBytes = kTileKeys * 32 * 2; /* [32 keys][32 heads] bf16 */
/* Dynamic shared memory carve-up (offsets in bytes). */
constexpr int kOffRing = 0;
constexpr int kOffScratch = kOffRing + kFastWarps * kFastStages * kStageBytes;
constexpr int kOffWs = kOffScratch + kFastWarps * kScratchBytes;
constexpr int kOffQBytes = kOffWs + 32 * 4;
constexpr int kOffMeta = kOffQBytes + 32 * kKeyRow;
constexpr int kOffBar = kOffMeta + 3 * 32 * 4;
constexpr int kOffPre = kOffBar + kFastWarps * kFastStages * 8; /* per stage: its tile's byte offset, -1 none */
constexpr int kFastSmem = kOffPre + kFastWarps * kFastStages * 4;
static_assert(kFastSmem == DI_INDEXER_FAST_SMEM_BYTES, "params.h DI_INDEXER_FAST_SMEM_BYTES");
static_assert(kStageBytes % 16 == 0 && kOffScratch % 16 == 0 && kOffBar % 8 == 0, "alignment");
/* Other architectures run the SIMT path with the decoded query in the ring. */
static_assert(kFastWarps * kFastStages * kStageBytes >= 128 * 32 * 4, "the SIMT path's query fits the ring");
constexpr uint32_t kMagic = 0x4B400000u; /* 1.5 * 2^23 */
constexpr float kMagicF = 12582912.0f;
constexpr uint8_t kScaleLo = 95, kScaleHi = 159;
}  // namespace

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace {
using namespace deepinfer::sm90;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* 2 |e2m1| of a nibble's code (bits 0..2): 0, 1, 2, 3, 4, 6, 8, 12. */
__device__ __forceinline__ int e2m1_mag2(uint32_t nib) {
    const int m = int(nib & 7u);
    return m < 5 ? m : (m == 5 ? 6 : (m == 6 ? 8 : 12));
}

/* PTX shl: amounts >= 32 give 0 (garbage shifts of out-of-domain keys stay defined). */
__device__ __forceinline__ uint32_t shl(uint32_t a, uint32_t s) {
    uint32_t d;
    asm("shl.b32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(s));
    return d;
}

/* 8 nibbles (element i in bits 4i..4i+3) -> u8 value + 128 of elements 0..3
 * (lo) and 4..7 (hi); tlo/thi hold |e2m1| x 2 << sigma for codes 0..7. */
__device__ __forceinline__ void decode_u8(uint32_t w, uint32_t tlo, uint32_t thi, uint32_t &lo,
                                          uint32_t &hi) {
    const uint32_t wx = w ^ 0x88888888u;
    /* x >> 16 as the high word of x * 2^16: IMAD.HI on the FMA pipe instead
     * of a shift on the ALU pipe, which the decode and epilogue keep busiest. */
    const uint32_t p_lo = prmt(tlo, thi, w), p_hi = prmt(tlo, thi, __umulhi(w, 0x10000u));
    const uint32_t q_lo = prmt(tlo, thi, wx), q_hi = prmt(tlo, thi, __umulhi(wx, 0x10000u));
    lo = p_lo + 0x80808080u - q_lo;
    hi = p_hi + 0x80808080u - q_hi;
}

__device__ __forceinline__ void mma_u8s8(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The first k-step: d = a x b + (seed0, seed1, seed0, seed1), no copies of the seeds. */
__device__ __forceinline__ void mma_u8s8_seed(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1, int32_t seed0, int32_t seed1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%10,%11};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(seed0), "r"(seed1));
}

/* relu(bf16(x)) of two fp32 values packed (lo = a, hi = b), then x w'' (bf16x2, RN). */
__device__ __forceinline__ uint32_t head_terms(float a, float b, uint32_t w2) {
    uint32_t r, t;
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(t) : "r"(r), "r"(w2), "r"(0x80008000u));
    return t;
}

__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

/* Lane 0 arrives on a stage barrier once per tile, with the bulk bytes. */
constexpr uint32_t kBarArrivals = 1;

/* Where row b's tiles live: contiguous from `row`, or paged (a page holds
 * tpp whole tiles; tpp_shift = log2 tpp when a power of two, else -1). */
struct TileMap {
    const uint8_t *row;
    const uint8_t *keys;
    const int32_t *pages; /* row b's page list, NULL when not paged */
    int64_t pool_pages;
    uint32_t tpp;
    int tpp_shift;
};

__device__ __forceinline__ TileMap tile_map(const di_indexer_score_params &p, int b) {
    TileMap m;
    m.keys = static_cast<const uint8_t *>(p.keys);
    m.row = m.keys + int64_t(b) * p.key_batch_stride;
    m.pages = p.pages == nullptr ? nullptr : p.pages + int64_t(b) * p.pages_stride;
    m.pool_pages = p.pool_pages;
    m.tpp = uint32_t(p.page_rows / kTileKeys);
    m.tpp_shift = (m.tpp & (m.tpp - 1)) == 0 ? __ffs(int(m.tpp)) - 1 : -1;
    return m;
}

/* The first key of tile i (its keys follow it contiguously), or NULL for a
 * tile on a page outside the pool. 32-bit tile arithmetic: n < 2^31 keys. */
__device__ __forceinline__ const uint8_t *tile_at(const TileMap &m, uint32_t i) {
    if (m.pages == nullptr) return m.row + int64_t(i) * kTileBytes;
    const uint32_t pi = m.tpp_shift >= 0 ? i >> m.tpp_shift : i / m.tpp;
    const int64_t pg = m.pages[pi];
    if (pg < 0 || pg >= m.pool_pages) return nullptr;
    return m.keys + (pg * m.tpp + (i - pi * m.tpp)) * int64_t(kTileBytes);
}

/* Starts loading keys [32 i, min(32 i + 32, visible)) of tile i (first key at
 * `tile`; NULL: none, the barrier still completes) into `stage`, and records
 * the tile's byte offset in the stage (-1: none) in *pre for the consumer.
 * The 16-byte aligned middle goes by one bulk copy on the stage's barrier;
 * the at most 3 + 3 words outside it (a row of a per-row cache that is not
 * 16-byte aligned, a short last tile) are copied by lanes 1..8 with plain
 * loads and stores before the arrival (rare: the paged pool and aligned rows
 * have none but in a row's last tile). */
__device__ __forceinline__ void issue_tile(const uint8_t *tile, int64_t i, int64_t visible,
                                           uint8_t *stage, uint64_t *bar, int *pre, int lane) {
    const int64_t t0 = i * kTileKeys;
    /* The common case (a whole, 16-byte aligned tile): one bulk copy. */
    if (tile != nullptr && t0 + kTileKeys <= visible && (reinterpret_cast<uintptr_t>(tile) & 15u) == 0) {
        if (lane == 0) {
            *pre = 0;
            mbar_arrive_expect_tx(bar, uint32_t(kTileBytes));
            bulk_copy(stage + 16, tile, uint32_t(kTileBytes), bar);
        }
        return;
    }
    const int64_t t1 = tile == nullptr ? t0 : min(t0 + kTileKeys, visible);
    const uintptr_t s = reinterpret_cast<uintptr_t>(tile);
    const uintptr_t e = s + uintptr_t((t1 - t0) * kKeyRow);
    const uintptr_t a = (s + 15) & ~uintptr_t(15), z = e & ~uintptr_t(15);
    uint8_t *base = stage + 16 + (s & 15); /* key data; 16-aligned from a */
    const bool bulk = a < z;
    if ((bulk ? a != s || z != e : s != e) && lane >= 1 && lane <= 8) {
        const int k = lane - 1;
        uintptr_t src = 0;
        if (bulk) {
            const int np = int((a - s) / 4), ns = int((e - z) / 4);
            if (k < np) src = s + 4 * k;
            else if (k < np + ns) src = z + 4 * (k - np);
        } else if (k < int((e - s) / 4)) {
            src = s + 4 * k;
        }
        if (src != 0)
            *reinterpret_cast<uint32_t *>(base + (src - s)) = __ldg(reinterpret_cast<const uint32_t *>(src));
    }
    __syncwarp();
    if (lane == 0) {
        *pre = tile == nullptr ? -1 : int(s & 15);
        mbar_arrive_expect_tx(bar, bulk ? uint32_t(z - a) : 0u);
        if (bulk) bulk_copy(base + (a - s), reinterpret_cast<const void *>(a), uint32_t(z - a), bar);
    }
}

/* The exact score of the key row kr (shared memory) computed by the warp: lane
 * h holds head h's dot product (dimension order, separate fp32 multiply and
 * add); the head sum runs in head order through shuffles. kf: 128 floats of
 * scratch. Returns the same value in every lane. */
__device__ __nv_bfloat16 exact_key_score_warp(const uint8_t *kr, const uint8_t *qb, const float *ws,
                                              int H, float *kf, int lane) {
    const float s = e8m0_to_f32(kr[64 + lane / 8]);
    const uint32_t half = uint32_t(kr[2 * lane]) | (uint32_t(kr[2 * lane + 1]) << 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) kf[4 * lane + i] = __fmul_rn(e2m1_to_f32((half >> (4 * i)) & 0xFu), s);
    __syncwarp();
    float term = 0.0f;
    if (lane < H) {
        const uint8_t *qr = qb + lane * kKeyRow;
        float dot = -0.0f;
#pragma unroll 8
        for (int d = 0; d < 128; ++d) dot = __fadd_rn(dot, __fmul_rn(index_row_value(qr, d, 128), kf[d]));
        const float relu = fmaxf(__bfloat162float(__float2bfloat16_rn(dot)), 0.0f);
        term = __bfloat162float(__float2bfloat16_rn(__fmul_rn(ws[lane], relu)));
    }
    float acc = 0.0f;
    for (int h = 0; h < H; ++h) acc = __fadd_rn(acc, __shfl_sync(0xffffffffu, term, h));
    __syncwarp();
    return __float2bfloat16_rn(acc);
}
}  // namespace
#endif

extern "C" __global__ void __launch_bounds__(DI_INDEXER_FAST_THREADS, 4)
    indexer_scores_fast(const __grid_constant__ di_indexer_score_params p) {
    DI_PDL_ENTRY();
    extern __shared__ __align__(128) uint8_t fsm[];
    float *ws = reinterpret_cast<float *>(fsm + kOffWs);
    const int b = blockIdx.y;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int H = p.heads; /* <= 32, dim == 128 */
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        ws[h] = __bfloat162float(static_cast<const __nv_bfloat16 *>(p.w)[int64_t(b) * H + h]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    uint8_t *qb = fsm + kOffQBytes;
    int32_t *m_qmin = reinterpret_cast<int32_t *>(fsm + kOffMeta);
    int32_t *m_qsum = m_qmin + 32;
    uint32_t *m_w2 = reinterpret_cast<uint32_t *>(m_qsum + 32);
    const uint8_t *qg = static_cast<const uint8_t *>(p.q) + int64_t(b) * H * kKeyRow;
    for (int i = threadIdx.x; i < H * kKeyRow; i += blockDim.x) qb[i] = qg[i];
    uint64_t *bars = reinterpret_cast<uint64_t *>(fsm + kOffBar) + warp * kFastStages;
    if (lane == 0)
        for (int st = 0; st < kFastStages; ++st) mbar_init(&bars[st], kBarArrivals);
    fence_barrier_init();
    __syncthreads();
    /* Per-head domain check, shift base, int8 sum and folded weight. */
    bool ok = true;
    if (threadIdx.x < 32) {
        const int h = threadIdx.x;
        int qmin = 127, qsum = 0;
        uint32_t w2 = 0;
        if (h < H) {
            const uint8_t *r = qb + h * kKeyRow;
            int qmax = 0;
            qmin = 255;
            for (int blk = 0; blk < 4; ++blk) {
                qmin = min(qmin, int(r[64 + blk]));
                qmax = max(qmax, int(r[64 + blk]));
            }
            const uint16_t wb = __bfloat16_as_ushort(static_cast<const __nv_bfloat16 *>(p.w)[int64_t(b) * H + h]);
            const int wexp = (wb >> 7) & 0xFF;
            ok = qmin >= kScaleLo && qmax <= kScaleHi && qmax - qmin <= 3 &&
                 ((wb & 0x7FFFu) == 0 || (wexp >= kScaleLo && wexp <= kScaleHi + 1));
            if (ok) {
                for (int d = 0; d < 128; ++d) {
                    const uint32_t nib = (r[d / 2] >> (4 * (d & 1))) & 0xFu;
                    const int v = e2m1_mag2(nib) << (r[64 + d / 32] - qmin);
                    qsum += (nib & 8u) ? -v : v;
                }
                const float wf = __uint_as_float(uint32_t(wb) << 16);
                w2 = __bfloat16_as_ushort(
                    __float2bfloat16_rn(__fmul_rn(wf, __uint_as_float(uint32_t(qmin - 2) << 23))));
            }
        }
        m_qmin[h] = qmin;
        m_qsum[h] = qsum;
        m_w2[h] = w2;
    }
    const bool row_ok = __syncthreads_and(ok);

    /* Stationary operands: query fragments (B), accumulator seeds, weight pairs. */
    uint32_t qf[4][4][2];
    int32_t seed[4][2];
    uint32_t w2p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int hd = 8 * (g >> 1) + 2 * j + (g & 1);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            uint32_t bytes[2] = {0u, 0u};
            if (row_ok && hd < H) {
                const uint8_t *r = qb + hd * kKeyRow;
                const int sh = r[64 + c] - m_qmin[hd];
                const uint8_t *wp = r + 16 * c + 4 * s;
                const uint32_t word = uint32_t(wp[0]) | (uint32_t(wp[1]) << 8) | (uint32_t(wp[2]) << 16) |
                                      (uint32_t(wp[3]) << 24);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t nib = (word >> (4 * i)) & 0xFu;
                    const int v = (nib & 8u) ? -(e2m1_mag2(nib) << sh) : (e2m1_mag2(nib) << sh);
                    bytes[i / 4] |= (uint32_t(v) & 0xFFu) << (8 * (i % 4));
                }
            }
            qf[j][s][0] = bytes[0];
            qf[j][s][1] = bytes[1];
        }
        seed[j][0] = int32_t(kMagic) - 128 * m_qsum[8 * c + 2 * j];
        seed[j][1] = int32_t(kMagic) - 128 * m_qsum[8 * c + 2 * j + 1];
        w2p[j] = m_w2[8 * c + 2 * j] | (m_w2[8 * c + 2 * j + 1] << 16);
    }

    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    const TileMap map = tile_map(p, b);
    int *pres = reinterpret_cast<int *>(fsm + kOffPre) + warp * kFastStages;
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.scores) + int64_t(b) * p.n;
    for (int64_t t = visible + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.n;
         t += int64_t(gridDim.x) * blockDim.x)
        out[t] = __ushort_as_bfloat16(0xFF80u);

    uint8_t *ring = fsm + kOffRing + warp * kFastStages * kStageBytes;
    uint8_t *scratch = fsm + kOffScratch + warp * kScratchBytes;
    const int64_t tiles = (visible + kTileKeys - 1) / kTileKeys;
    const int64_t first = int64_t(blockIdx.x) * kFastWarps + warp, stride = int64_t(gridDim.x) * kFastWarps;
    for (int k = 0; k < kFastStages; ++k)
        if (first + k * stride < tiles)
            issue_tile(tile_at(map, uint32_t(first + k * stride)), first + k * stride, visible,
                       ring + k * kStageBytes, &bars[k], &pres[k], lane);

    for (int64_t k = 0; first + k * stride < tiles; ++k) {
        const int64_t i = first + k * stride;
        const int st = int(k % kFastStages);
        uint8_t *stage = ring + st * kStageBytes;
        mbar_wait(&bars[st], uint32_t(k / kFastStages) & 1u);
        const int pre = pres[st];
        const uint8_t *tile = stage + 16 + max(pre, 0);
        const int64_t t0 = i * kTileKeys;
        const bool live = t0 + lane < visible;

        /* Key metadata, one key per lane: smallest block scale, shifts, domain. */
        const uint32_t sw = *reinterpret_cast<const uint32_t *>(tile + lane * kKeyRow + 64);
        const uint32_t s0 = sw & 0xFFu, s1 = (sw >> 8) & 0xFFu, s2 = (sw >> 16) & 0xFFu, s3 = sw >> 24;
        const uint32_t kmin = min(min(s0, s1), min(s2, s3)), kmax = max(max(s0, s1), max(s2, s3));
        const bool key_ok = kmin >= kScaleLo && kmax <= kScaleHi && kmax - kmin <= 3;
        const uint32_t shifts = sw - kmin * 0x01010101u;
        const float kscale = __uint_as_float(kmin << 23);

        float score = 0.0f;
        if (row_ok) {
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                const int key0 = 8 * m + (g & 3) + 16 * (g >> 2), key1 = key0 + 4;
                const uint32_t sh0 = prmt(__shfl_sync(0xffffffffu, shifts, key0), 0u, 0x4440u | c);
                const uint32_t sh1 = prmt(__shfl_sync(0xffffffffu, shifts, key1), 0u, 0x4440u | c);
                const uint32_t t0lo = shl(0x03020100u, sh0), t0hi = shl(0x0C080604u, sh0);
                const uint32_t t1lo = shl(0x03020100u, sh1), t1hi = shl(0x0C080604u, sh1);
                int32_t acc[4][4];
                const uint8_t *k0 = tile + key0 * kKeyRow + 16 * c, *k1 = tile + key1 * kKeyRow + 16 * c;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    uint32_t a[4];
                    decode_u8(*reinterpret_cast<const uint32_t *>(k0 + 4 * s), t0lo, t0hi, a[0], a[2]);
                    decode_u8(*reinterpret_cast<const uint32_t *>(k1 + 4 * s), t1lo, t1hi, a[1], a[3]);
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        if (s == 0) mma_u8s8_seed(acc[j], a, qf[j][0][0], qf[j][0][1], seed[j][0], seed[j][1]);
                        else mma_u8s8(acc[j], a, qf[j][s][0], qf[j][s][1]);
                    }
                }
                uint4 r0, r1;
                uint32_t *r0p = &r0.x, *r1p = &r1.x;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    r0p[j] = head_terms(__int_as_float(acc[j][0]) - kMagicF, __int_as_float(acc[j][1]) - kMagicF,
                                        w2p[j]);
                    r1p[j] = head_terms(__int_as_float(acc[j][2]) - kMagicF, __int_as_float(acc[j][3]) - kMagicF,
                                        w2p[j]);
                }
                *reinterpret_cast<uint4 *>(scratch + key0 * 64 + 16 * (c ^ ((key0 >> 1) & 3))) = r0;
                *reinterpret_cast<uint4 *>(scratch + key1 * 64 + 16 * (c ^ ((key1 >> 1) & 3))) = r1;
            }
            __syncwarp();
            float sum = 0.0f;
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const uint4 v =
                    *reinterpret_cast<const uint4 *>(scratch + lane * 64 + 16 * (cc ^ ((lane >> 1) & 3)));
                const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    sum = __fadd_rn(sum, __uint_as_float(vv[j] << 16));
                    sum = __fadd_rn(sum, __uint_as_float(vv[j] & 0xFFFF0000u));
                }
            }
            score = __fmul_rn(sum, kscale);
        }
        __nv_bfloat16 result = __float2bfloat16_rn(score);
        uint32_t flagged = __ballot_sync(0xffffffffu, live && !(row_ok && key_ok));
        if (flagged) {
            __syncwarp();
            float *kf = reinterpret_cast<float *>(scratch);
            for (; flagged; flagged &= flagged - 1) {
                const int r = __ffs(flagged) - 1;
                const __nv_bfloat16 e = exact_key_score_warp(tile + r * kKeyRow, qb, ws, H, kf, lane);
                if (lane == r) result = e;
            }
        }
        /* A tile on a page outside the pool loaded nothing: -inf. */
        if (live) out[t0 + lane] = pre < 0 ? __ushort_as_bfloat16(0xFF80u) : result;
        /* Every lane's reads of the stage (and edge stores) before the next
         * bulk copy into it: proxy fence by each lane, then the warp sync. */
        fence_proxy_async_smem();
        __syncwarp();
        const int64_t next = i + kFastStages * stride;
        if (next < tiles) {
            issue_tile(tile_at(map, uint32_t(next)), next, visible, stage, &bars[st], &pres[st], lane);
        }
    }
#else
    /* Other architectures: the exact SIMT path (same launch shape and results). */
    float *qs = reinterpret_cast<float *>(fsm + kOffRing);
    load_query_f32(p, b, qs, ws);
    __syncthreads();
    exact_scores_simt(p, b, qs, ws);
#endif
}

/* ---- exact top-k ------------------------------------------------------------ *
 * Three passes over a row of BF16 scores split into `segments` contiguous
 * segments of seg_len entries (grid = segments x batch, every CTA one segment;
 * seg_len a multiple of the 4096-entry chunk, so chunk c of a row covers
 * entries [4096 c, 4096 c + 4096) whatever the segmentation):
 *   1. hist_hi[b][s][256]: histogram of the high byte of the 16-bit key.
 *   2. every CTA sums the row's high-byte histograms (two threads a column),
 *      finds the high byte hT of the k-th largest key, then hist_lo[b][s][256]:
 *      histogram of the low byte of its keys whose high byte is hT, and
 *      chunk_max[b][c]: the largest key of chunk c.
 *   3. every CTA finds T = (hT, lT), the k-th largest key, and need = k - #keys
 *      > T (ties at T to take, by lowest index); from the earlier segments'
 *      histograms (a warp per segment) the picks and ties before its segment
 *      (picks = keys > T + min(ties, need)); then it walks its segment in
 *      index order in rounds of 4 chunks, 32 consecutive entries a thread and
 *      one pair of block scans a round, skipping a round whose chunks' largest
 *      keys are all below T (it holds no pick and no tie). The picks come out
 *      in ascending index order: entries < visible as index + offset, the
 *      rest as -1 (they are at the end).
 * In the histogram passes each thread takes 8 consecutive entries of a chunk
 * (one 16-byte load when the row is aligned) and issues the next chunk's load
 * before the current one is counted. The histograms and chunk maxima are
 * written fully by every CTA (no atomics on global memory, no memset); every
 * count is an integer, so the result never depends on scheduling, nor on the
 * segmentation (the host picks it from n and the batch). */
namespace {
constexpr int kTopkThreads = 512;
constexpr int kTopkPer = 8;
constexpr int kTopkChunk = kTopkThreads * kTopkPer;
/* The collect pass: 32 consecutive entries a thread, 4 chunks a round. */
constexpr int kCollectPer = 32;
constexpr int kCollectRound = kTopkThreads * kCollectPer;

/* The raw BF16 bits of entries [i, i + 8) of row, entries >= hi as 0. */
__device__ __forceinline__ uint4 load8(const uint16_t *row, int64_t i, int64_t hi, bool vec) {
    if (vec && i + kTopkPer <= hi) return __ldg(reinterpret_cast<const uint4 *>(row + i));
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < kTopkPer; ++j)
        if (i + j < hi) w[j >> 1] |= uint32_t(__ldg(row + i + j)) << (16 * (j & 1));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint32_t key_of(const uint4 &r, int j) {
    const uint32_t w = j < 2 ? r.x : j < 4 ? r.y : j < 6 ? r.z : r.w;
    return bf16_key(uint16_t(w >> (16 * (j & 1))));
}

/* Whether a launch's rows take 16-byte loads (uniform over the grid). */
__device__ __forceinline__ bool rows_vec(const di_indexer_topk_params &p) {
    return ((reinterpret_cast<uintptr_t>(p.scores) | uintptr_t(p.n * 2) | uintptr_t(p.seg_len * 2)) & 15u) == 0;
}

/* Histogram of `bin(key)` (a bin, or -1 for none) over entries [lo, hi) of
 * row, written to dst[256] (global). Each warp counts into its own copy in
 * shared memory (`wh`: 16 x 256) with plain shared atomics, so lanes that
 * share a bin conflict only within their warp (no match_any: it bounded the
 * first version). With kMax, chunk_max[c] = the largest key of the segment's
 * chunk c (0 for none; wmax: 2 x 16 words of scratch). */
template <bool kMax, typename F>
__device__ void segment_histogram(uint32_t *wh, uint32_t *dst, const uint16_t *row, int64_t lo, int64_t hi,
                                  bool vec, F bin, uint16_t *chunk_max, uint32_t *wmax) {
    for (int i = threadIdx.x; i < 16 * 256; i += blockDim.x) wh[i] = 0;
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    uint32_t *mine = wh + warp * 256;
    int64_t i = lo + int64_t(kTopkPer) * threadIdx.x;
    uint4 cur = load8(row, i, hi, vec);
    int par = 0;
    for (int64_t base = lo; base < hi; base += kTopkChunk, i += kTopkChunk) {
        const uint4 nxt = i + kTopkChunk < hi ? load8(row, i + kTopkChunk, hi, vec) : make_uint4(0u, 0u, 0u, 0u);
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < kTopkPer; ++j) {
            const uint32_t key = key_of(cur, j);
            const int v = i + j < hi ? bin(key) : -1;
            if (v >= 0) atomicAdd(&mine[v], 1u);
            if (kMax && i + j < hi) m = max(m, key);
        }
        if (kMax) {
            /* Two scratch halves by chunk parity: thread 0 reads one while the
             * next chunk's warps write the other; the barrier after that
             * chunk orders the reuse. */
            m = __reduce_max_sync(0xffffffffu, m);
            if ((threadIdx.x & 31) == 0) wmax[par * 16 + warp] = m;
            __syncthreads();
            if (threadIdx.x == 0) {
                uint32_t c = 0;
#pragma unroll
                for (int w = 0; w < 16; ++w) c = max(c, wmax[par * 16 + w]);
                chunk_max[(base - lo) / kTopkChunk] = uint16_t(c);
            }
            par ^= 1;
        }
        cur = nxt;
    }
    __syncthreads();
    for (int v = threadIdx.x; v < 256; v += blockDim.x) {
        uint32_t t = 0;
#pragma unroll
        for (int w = 0; w < 16; ++w) t += wh[w * 256 + v];
        dst[v] = t;
    }
}

/* total[v] = sum over the row's segments of h[s][v] (smem; every thread of
 * the block takes part, two per column). */
__device__ void column_totals(const uint32_t *h, int segments, uint32_t *total, uint32_t *part) {
    const int v = threadIdx.x & 255, half = threadIdx.x >> 8;
    uint32_t t = 0;
#pragma unroll 4
    for (int s = half; s < segments; s += 2) t += h[int64_t(s) * 256 + v];
    if (half) part[v] = t;
    __syncthreads();
    if (!half) total[v] = t + part[v];
    __syncthreads();
}

/* Finds the bin holding the k-th largest element given per-bin totals
 * (bins ascending by key) and the count already above all bins; returns the
 * bin and sets *above to the count of elements in higher bins (plus base). */
__device__ __forceinline__ int find_bin(const uint32_t *total, uint32_t k, uint32_t base, uint32_t *above) {
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

/* The high byte of the row's k-th key (every thread), *above = #keys in
 * higher high-byte bins; total/part: 256-entry smem scratch. */
__device__ __forceinline__ uint32_t high_threshold(const di_indexer_topk_params &p, int b, uint32_t *total, uint32_t *part,
                                   uint32_t *above) {
    column_totals(p.hist_hi + int64_t(b) * p.segments * 256, p.segments, total, part);
    return uint32_t(find_bin(total, uint32_t(p.k), 0u, above));
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_hist_hi(const __grid_constant__ di_indexer_topk_params p) {
    DI_PDL_ENTRY();
    __shared__ uint32_t wh[16 * 256];
    const int s = blockIdx.x, b = blockIdx.y;
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    segment_histogram<false>(wh, p.hist_hi + (int64_t(b) * p.segments + s) * 256, row, lo, hi, rows_vec(p),
                             [](uint32_t key) { return int(key >> 8); }, nullptr, nullptr);
}

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_hist_lo(const __grid_constant__ di_indexer_topk_params p) {
    DI_PDL_ENTRY();
    __shared__ uint32_t total[256], part[256];
    __shared__ uint32_t wh[16 * 256], wmax[2 * 16];
    const int s = blockIdx.x, b = blockIdx.y;
    uint32_t above;
    const uint32_t hT = high_threshold(p, b, total, part, &above);
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    /* A chunk whose largest key is below T holds no pick and no tie: the
     * collect pass skips it unread. */
    segment_histogram<true>(wh, p.hist_lo + (int64_t(b) * p.segments + s) * 256, row, lo, hi, rows_vec(p),
                            [hT](uint32_t key) { return (key >> 8) == hT ? int(key & 0xFFu) : -1; },
                            p.chunk_max + int64_t(b) * p.chunks + lo / kTopkChunk, wmax);
}

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_collect(const __grid_constant__ di_indexer_topk_params p) {
    DI_PDL_ENTRY();
    __shared__ uint32_t total[256], part[256];
    __shared__ uint32_t warp_sums[kTopkThreads / 32];
    __shared__ uint32_t warp_above[kTopkThreads / 32], warp_ties[kTopkThreads / 32];
    __shared__ uint32_t scan_total;
    const int s = blockIdx.x, b = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t above_hi;
    const uint32_t hT = high_threshold(p, b, total, part, &above_hi);
    const uint32_t *hlo = p.hist_lo + int64_t(b) * p.segments * 256;
    const uint32_t *hhi = p.hist_hi + int64_t(b) * p.segments * 256;
    column_totals(hlo, p.segments, total, part);
    uint32_t above_t;
    const uint32_t lT = uint32_t(find_bin(total, uint32_t(p.k), above_hi, &above_t));
    const uint32_t T = (hT << 8) | lT, need = uint32_t(p.k) - above_t;
    /* Keys > T and ties at T in the earlier segments: a warp per segment. */
    {
        uint32_t a = 0, t = 0;
        for (int j = warp; j < s; j += kTopkThreads / 32) {
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const uint32_t v = uint32_t(lane + 32 * q);
                const uint32_t xh = hhi[int64_t(j) * 256 + v], xl = hlo[int64_t(j) * 256 + v];
                a += (v > hT ? xh : 0u) + (v > lT ? xl : 0u);
                t += v == lT ? xl : 0u;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, o);
            t += __shfl_xor_sync(0xffffffffu, t, o);
        }
        if (lane == 0) {
            warp_above[warp] = a;
            warp_ties[warp] = t;
        }
    }
    __syncthreads();
    uint32_t picks = 0, ties = 0;
#pragma unroll
    for (int w = 0; w < kTopkThreads / 32; ++w) {
        picks += warp_above[w];
        ties += warp_ties[w];
    }
    picks += min(ties, need);
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    int32_t *out = p.out + int64_t(b) * p.k;
    const int64_t lo = int64_t(s) * p.seg_len, hi = min(lo + p.seg_len, p.n);
    const bool vec = rows_vec(p);
    /* Rounds of kCollectRound entries: thread t owns the 32 consecutive
     * entries [base + 32 t, base + 32 t + 32), so one pair of block scans
     * serves 4 chunks (the scans bound this pass: picks are spread over
     * nearly every chunk). A round whose chunks' largest keys are all below
     * T holds no pick and no tie and is not read. */
    const uint16_t *cmax = p.chunk_max + int64_t(b) * p.chunks + lo / kTopkChunk;
    const int seg_chunks = int((hi - lo + kTopkChunk - 1) / kTopkChunk);
    for (int64_t base = lo; base < hi; base += kCollectRound) {
        const int c0 = int((base - lo) / kTopkChunk);
        uint32_t top = 0;
#pragma unroll
        for (int c = 0; c < kCollectRound / kTopkChunk; ++c)
            if (c0 + c < seg_chunks) top = max(top, uint32_t(cmax[c0 + c]));
        if (top < T) continue;
        const int64_t i = base + int64_t(kCollectPer) * threadIdx.x;
        /* The thread's 32 entries as two masks (bit j: entry i + j). */
        uint32_t gt = 0, eq = 0;
#pragma unroll
        for (int q = 0; q < kCollectPer / kTopkPer; ++q) {
            const uint4 raw = load8(row, i + kTopkPer * q, hi, vec);
#pragma unroll
            for (int j = 0; j < kTopkPer; ++j) {
                const uint32_t key = key_of(raw, j);
                const bool in = i + kTopkPer * q + j < hi;
                gt |= uint32_t(in && key > T) << (kTopkPer * q + j);
                eq |= uint32_t(in && key == T) << (kTopkPer * q + j);
            }
        }
        const uint32_t nt = __popc(eq), ng = __popc(gt);
        /* Nothing to take: no key above T, and no tie while ties are still
         * taken (once ties >= need, later ties are never taken). */
        if (!__syncthreads_or(ng + (ties < need ? nt : 0u))) continue;
        const uint32_t r = ties + block_exclusive_scan(nt, warp_sums, &scan_total);
        const uint32_t tie_count = scan_total;
        /* The thread's ties taken: its first min(nt, need - r) in index order. */
        uint32_t sel = gt;
        for (uint32_t take = r < need ? min(nt, need - r) : 0u, e = eq; take > 0; --take) {
            sel |= e & (0u - e);
            e &= e - 1;
        }
        uint32_t pos = picks + block_exclusive_scan(__popc(sel), warp_sums, &scan_total);
        for (; sel != 0; sel &= sel - 1) {
            const int64_t e = i + (__ffs(int(sel)) - 1);
            out[pos++] = e < visible ? int32_t(e + p.offset) : -1;
        }
        picks += scan_total;
        ties += tie_count;
    }
}

/* ---- candidate blocks and reindex (v41-flash.md 3.6-3.7) -------------------- *
 * cpu_backend::indexer::candidate_mask / mask_scores on BF16 rows:
 *   indexer_block_scores: block_scores[b, j] = the largest non-NaN score of
 *     block j's entries t < visible[b] (f32::total_cmp order, so +0 > -0),
 *     -inf when there is none, +inf for the pinned block (visible - 1) / block.
 *     One thread per block; 16-byte loads for full aligned blocks of 8.
 *   (the exact top-k above then picks min(keep, blocks) blocks, in place into
 *     the candidate list, ascending)
 *   indexer_candidates_compact: one CTA per row drops the picks whose block
 *     score is -inf (and -1 picks), keeps the rest ascending, pads with -1.
 *   indexer_mask_scores: out[b, t] = scores[b, t] if block t / block is listed
 *     in candidates[b] (entries outside [0, blocks) ignored), else -inf; a CTA
 *     covers `span` blocks, marks its listed blocks in a shared bitmap from the
 *     whole list (any order, duplicates harmless), then copies its entries
 *     (16-byte loads/stores per block when block == 8 and both rows are
 *     16-byte aligned: n % 8 == 0). */
namespace {
constexpr int kBlockThreads = 256;
constexpr uint32_t kKeyNegInf = 0x007Fu; /* bf16_key(0xFF80) */
constexpr uint32_t kKeyPosInf = 0xFF80u; /* bf16_key(0x7F80) */
constexpr uint16_t kBf16NegInf = 0xFF80u;

/* Inverse of bf16_key. */
__device__ __forceinline__ uint16_t bf16_of_key(uint32_t key) {
    return (key & 0x8000u) ? uint16_t(key & 0x7FFFu) : uint16_t(~key & 0xFFFFu);
}

/* Larger of `best` and a score's key; NaN keys lie outside [-inf, +inf] and
 * are skipped (f32::max returns the non-NaN operand). */
__device__ __forceinline__ uint32_t max_non_nan(uint32_t best, uint32_t bits) {
    const uint32_t key = bf16_key(uint16_t(bits));
    return (key >= kKeyNegInf && key <= kKeyPosInf && key > best) ? key : best;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    indexer_block_scores(const __grid_constant__ di_indexer_block_params p) {
    DI_PDL_ENTRY();
    const int b = blockIdx.y;
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    uint16_t *dst = static_cast<uint16_t *>(p.block_scores) + int64_t(b) * p.blocks;
    const int64_t visible = min(int64_t(max(p.visible[b], 0)), p.n);
    const int64_t pinned = visible > 0 ? (visible - 1) / p.block : -1;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < p.blocks; j += stride) {
        const int64_t t0 = j * p.block;
        const int64_t t1 = min(t0 + p.block, visible);
        uint32_t best = kKeyNegInf;
        if (j == pinned) {
            best = kKeyPosInf;
        } else if (p.block == 8 && t1 - t0 == 8 && (reinterpret_cast<uintptr_t>(row + t0) & 15u) == 0) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(row + t0));
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                best = max_non_nan(best, w[i] & 0xFFFFu);
                best = max_non_nan(best, w[i] >> 16);
            }
        } else {
            for (int64_t t = t0; t < t1; ++t) best = max_non_nan(best, row[t]);
        }
        dst[j] = bf16_of_key(best);
    }
}

extern "C" __global__ void __launch_bounds__(kTopkThreads)
    indexer_candidates_compact(const __grid_constant__ di_indexer_block_params p) {
    DI_PDL_ENTRY();
    __shared__ uint32_t warp_sums[kTopkThreads / 32];
    __shared__ uint32_t scan_total;
    const int b = blockIdx.x;
    const uint16_t *bs = static_cast<const uint16_t *>(p.block_scores) + int64_t(b) * p.blocks;
    const int32_t *in = p.cand_in + int64_t(b) * p.k;
    int32_t *out = p.cand_out + int64_t(b) * p.k;
    /* In place (in == out) is safe: a chunk's picks are read before the scan's
     * first barrier and written at positions <= their own index. */
    uint32_t kept = 0;
    for (int base = 0; base < p.k; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const int32_t v = i < p.k ? in[i] : -1;
        const bool keep = v >= 0 && v < p.blocks && bs[v] != kBf16NegInf;
        const uint32_t pos = kept + block_exclusive_scan(keep ? 1u : 0u, warp_sums, &scan_total);
        if (keep) out[pos] = v;
        kept += scan_total;
    }
    for (int i = int(kept) + threadIdx.x; i < p.k; i += blockDim.x) out[i] = -1;
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    indexer_mask_scores(const __grid_constant__ di_indexer_block_params p) {
    DI_PDL_ENTRY();
    /* One bit per block of the span; atomicOr, so duplicates do not race. */
    __shared__ uint32_t listed[DI_INDEXER_MASK_MAX_SPAN / 32];
    const int b = blockIdx.y;
    const int64_t j0 = int64_t(blockIdx.x) * p.span;
    const int64_t j1 = min(j0 + p.span, p.blocks);
    for (int i = threadIdx.x; i < DI_INDEXER_MASK_MAX_SPAN / 32; i += blockDim.x) listed[i] = 0;
    __syncthreads();
    const int32_t *cand = p.cand_in + int64_t(b) * p.k;
    for (int i = threadIdx.x; i < p.k; i += blockDim.x) {
        const int32_t v = cand[i];
        if (v >= j0 && v < j1) {
            const int j = int(v - j0);
            atomicOr(&listed[j >> 5], 1u << (j & 31));
        }
    }
    __syncthreads();
    const uint16_t *row = static_cast<const uint16_t *>(p.scores) + int64_t(b) * p.n;
    uint16_t *out = static_cast<uint16_t *>(p.out) + int64_t(b) * p.n;
    const int64_t lo = j0 * p.block;
    const int len = int(min(j1 * p.block, p.n) - lo); /* <= span * block <= 2^23 */
    if (p.block == 8 && ((reinterpret_cast<uintptr_t>(row + lo) | reinterpret_cast<uintptr_t>(out + lo)) & 15u) == 0) {
        /* One 16-byte block per thread; a partial last block of the row goes
         * through the scalar loop below. */
        const int full = len / 8;
        const uint4 ninf = make_uint4(0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u);
#pragma unroll 4
        for (int j = threadIdx.x; j < full; j += blockDim.x) {
            uint4 *dst = reinterpret_cast<uint4 *>(out + lo) + j;
            if ((listed[j >> 5] >> (j & 31)) & 1u) {
                *dst = __ldg(reinterpret_cast<const uint4 *>(row + lo) + j);
            } else {
                *dst = ninf; /* unlisted blocks are never read */
            }
        }
        for (int r = full * 8 + threadIdx.x; r < len; r += blockDim.x) {
            const int j = r / 8;
            out[lo + r] = (listed[j >> 5] >> (j & 31)) & 1u ? row[lo + r] : kBf16NegInf;
        }
        return;
    }
#pragma unroll 4
    for (int r = threadIdx.x; r < len; r += blockDim.x) {
        const int j = r / p.block;
        out[lo + r] = (listed[j >> 5] >> (j & 31)) & 1u ? row[lo + r] : kBf16NegInf;
    }
}
