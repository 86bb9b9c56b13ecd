// Block-scaled GEMMs for large M (prefill): out[m, n] = sum over K blocks of
// 32 (in K order) of (fp32 block sum of a * b) * a_s * b_s, BF16 or F32 out.
//
//   mxfp8_gemm_{bf16,f32}: A [M, K] e4m3 with 1x32 E8M0 scales [M, ceil(K/32)],
//     B [N, K] e4m3 with 32x32 E8M0 scales [ceil(N/32), ceil(K/32)].
//   mxfp4_grouped_contiguous_{bf16,f32}: A [T, K] e4m3 rows grouped by expert
//     (offsets [E+1], clamped to [0, T] and made monotone on the device), B
//     [E, N, K] packed e2m1 with one E8M0 scale per output row and 32 of K
//     [E, N, ceil(K/32)]. A tile never straddles two experts.
//
// sm_90a (README.md has the design, the lab record of version 1 and the
// measurements): persistent CTAs of 3 warpgroups over 128 x 128 output
// tiles, walked in bands of 16 m-blocks (m-block fastest inside a band, then
// n-block) so that a wave of CTAs shares A and B panels in L2. Warpgroup 0
// produces: one thread issues the TMA loads of the A tile (128 rows x 128 B
// of K, 128-byte swizzle) and the B tile (dense: e4m3, same layout; FP4: the
// packed 128 x 64 B tile into a staging buffer); helper warps convert the
// E8M0 scales of the stage to fp32 in shared memory and, for FP4, decode
// e2m1 -> e4m3 (numerics.cuh's e2m1x8_to_e4m3x8) into the swizzled B tile.
// Warpgroups 1 and 2 each own 64 rows of the tile and split them into two
// n64 halves (wgmma units): unit u + 1 is issued before unit u is waited for
// and promoted (acc += fresh * (a_s[row] * b_s[col]) on the CUDA cores, one
// fresh fp32 tile per 32-deep scale block; E8M0 -> fp32 is exact), so the
// tensor core has this warpgroup's next unit while it promotes.
//
// Split tiles (dense, params.h): when the tiles leave the last wave of CTAs
// part-empty, the host asks for the last tiles in `splits` pieces of their K
// stages; each piece runs like a tile of fewer stages on its own CTA, writes
// its fp32 partial to a workspace, and the last piece to finish adds them in
// piece order (finish_split) and writes the output.
//
// Pipeline barriers per stage s: full[s] (TMA bytes landed), ready[s] (the
// helper warp's 32 lanes wrote the scales / decoded B), empty[s] (every one
// of the 256 consumer threads finished reading the stage). Every role walks
// the same tile sequence and the same stage counter, so parities agree by
// construction.
//
// Other architectures (sm_100a, compile-only here) run a plain SIMT path in
// the same entry points: one thread per output, K blocks in the CPU
// reference's order. It is a correct placeholder until the tcgen05
// block-scaled MMA path exists.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

namespace {

constexpr int kThreads = 384;

__device__ __forceinline__ int clamp_i(int v, int lo, int hi) { return min(max(v, lo), hi); }

}  // namespace

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace {
using namespace deepinfer::sm90;

constexpr int kBlockM = 128;  // rows of A per tile (two consumer warpgroups of 64)
constexpr int kBlockN = 128;  // rows of B (output columns) per tile
constexpr int kBlockK = 128;  // e4m3 values (bytes) of K per stage
constexpr int kSteps = kBlockK / 32;  // wgmma k32 steps (= scale blocks) per stage

// One work unit: output rows [row0, row0 + 128) of which rows < row_end are
// valid (row_end is the end of the tile's expert, or M), columns [n0, n0 +
// 128), expert e (0 for the dense GEMM), K stages [st_begin, st_end). piece
// is -1 for a whole tile (written to out); otherwise the unit is piece
// `piece` of split tile `split` (its partial goes to the workspace, see
// params.h).
struct Tile {
    int row0;
    int row_end;
    int n0;
    int e;
    int st_begin;
    int st_end;
    int piece;
    int split;
};

constexpr int kStagesFp8 = 6;
constexpr int kStagesFp4 = 5;
constexpr int kATileBytes = kBlockM * kBlockK;          // 16 KiB
constexpr int kBTileBytes = kBlockN * kBlockK;          // 16 KiB
constexpr int kPackedTileBytes = kBlockN * kBlockK / 2; // 8 KiB of packed e2m1
constexpr int kConsumerWarps = 8;
// Arrivals on a stage's empty barrier: every consumer thread arrives after
// its own last read of the stage (its scale reads and the wgmma operands it
// waited for), so each reader's accesses are ordered before the helper's and
// the producer's rewrite by that thread's own release (see README.md, "The
// FP4 race").
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kHelperWarps = 3;

template <bool kFp4> struct Layout {
    static constexpr int kStages = kFp4 ? kStagesFp4 : kStagesFp8;
    // fp32 scales per stage: A [kSteps][128 rows]; B [kSteps][128 rows] (FP4,
    // per output row) or [kSteps][4 n-blocks of 32] (dense 32x32 blocks).
    static constexpr int kSaFloats = kSteps * kBlockM;
    static constexpr int kSbFloats = kFp4 ? kSteps * kBlockN : kSteps * (kBlockN / 32);
    // Byte offsets from the 1024-aligned base.
    static constexpr int kA = 0;
    static constexpr int kB = kA + kStages * kATileBytes;
    static constexpr int kPacked = kB + kStages * kBTileBytes;
    static constexpr int kSa = kPacked + (kFp4 ? kStages * kPackedTileBytes : 0);
    static constexpr int kSb = kSa + kStages * kSaFloats * 4;
    static constexpr int kBars = kSb + kStages * kSbFloats * 4;
    // One word per stage: which warpgroups may chain the stage (see
    // chain_flags), written by the helper warp with the scales.
    static constexpr int kFlags = kBars + 3 * kStages * 8;
    static constexpr int kEnd = kFlags + kStages * 4;
    static constexpr int kSmemBytes = kEnd + 1024;  // slack for aligning the base
};
// src/cuda_backend/gemm.rs requests these dynamic shared-memory sizes.
static_assert(Layout<false>::kSmemBytes == 210472, "update SMEM_FP8 in src/cuda_backend/gemm.rs");
static_assert(Layout<true>::kSmemBytes == 226444, "update SMEM_FP4 in src/cuda_backend/gemm.rs");
static_assert(Layout<true>::kSmemBytes <= 232448, "over the sm_90 227 KiB opt-in limit");

// The 4 E8M0 scale bytes (K blocks 4 st .. 4 st + 3, byte j = block j) of row
// `row` of a [rows, kbt] scale matrix. Rows and K blocks out of range read
// nothing and give byte 0 (2^-127, finite): their fresh tile is exactly 0
// because TMA zero-filled the operands, so the product stays 0.
__device__ __forceinline__ uint32_t load_scale_quad(const uint8_t *base, int64_t row, int rows, int kbt,
                                                    int st) {
    const int kb0 = st * kSteps;
    if (row >= rows) return 0;
    const uint8_t *q = base + row * kbt + kb0;
    if ((kbt & 3) == 0 && kb0 + 4 <= kbt) {
        // Aligned: the allocation is 256-byte aligned and (row * kbt + kb0) % 4 == 0.
        return *reinterpret_cast<const uint32_t *>(q);
    }
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (kb0 + j < kbt) w |= uint32_t(q[j]) << (8 * j);
    }
    return w;
}

// Stores the 4 scales of `w` as fp32 at dst[j * stride].
__device__ __forceinline__ void store_quad(float *dst, int stride, uint32_t w) {
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j * stride] = deepinfer::e8m0_to_f32((w >> (8 * j)) & 0xFFu);
}

// One helper warp converts the E8M0 scales of stage `st` of `tile` to fp32 in
// shared memory: sa[j][r] for the 128 rows of A, and sb[j][r] for the 128
// output rows of FP4 B, or sb[j][nb] for the 4 32-row blocks of dense B.
//
// Returns the stage's chain flags (the chained dense kernels; 0 otherwise):
// bit w (w = 0, 1) when all four K blocks of the stage carry one scale byte
// in each of consumer warpgroup w's 64 rows of A, bit 2 when the same holds
// for each of the tile's four 32-row blocks of B. Rows and K blocks out of
// range read byte 0 (load_scale_quad): a row past M is uniform (its
// operands are zero-filled, so chaining it changes nothing), and a stage
// that ends past K chains only when its in-range bytes are 0 as well.
template <bool kFp4, bool kChain>
__device__ __forceinline__ uint32_t load_scales(const di_mx_gemm_params &p, const Tile &tile, int st,
                                                float *sa, float *sb, int lane) {
    const int kbt = (p.k + 31) / 32;
    const uint8_t *as = static_cast<const uint8_t *>(p.a_s);
    const uint8_t *bs = static_cast<const uint8_t *>(p.b_s);
    uint32_t va[4], vb[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = lane + 32 * i;
        va[i] = load_scale_quad(as, tile.row0 + r, p.m, kbt, st);
        if (kFp4) {
            const int n = tile.n0 + r;
            vb[i] = load_scale_quad(bs + int64_t(tile.e) * p.n * kbt, n, p.n, kbt, st);
        }
    }
    if (!kFp4 && lane < kBlockN / 32) {
        vb[0] = load_scale_quad(bs, tile.n0 / 32 + lane, (p.n + 31) / 32, kbt, st);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        store_quad(sa + lane + 32 * i, kBlockM, va[i]);
        if (kFp4) store_quad(sb + lane + 32 * i, kBlockN, vb[i]);
    }
    if (!kFp4 && lane < kBlockN / 32) store_quad(sb + lane, kBlockN / 32, vb[0]);
    if (kFp4 || !kChain) return 0u;
    const auto same = [](uint32_t w) { return w == (w & 0xFFu) * 0x01010101u; };
    const uint32_t a0 = __all_sync(0xFFFFFFFFu, same(va[0]) && same(va[1])) ? 1u : 0u;
    const uint32_t a1 = __all_sync(0xFFFFFFFFu, same(va[2]) && same(va[3])) ? 1u : 0u;
    const uint32_t b = __all_sync(0xFFFFFFFFu, lane >= kBlockN / 32 || same(vb[0])) ? 1u : 0u;
    return a0 | (a1 << 1) | (b << 2);
}

template <bool kF32>
__device__ __forceinline__ void store_pair(const di_mx_gemm_params &p, int row, int col, float x,
                                           float y) {
    const int64_t at = int64_t(row) * p.n + col;
    if (kF32) {
        float *out = static_cast<float *>(p.out);
        if ((p.n & 1) == 0 && col + 1 < p.n) {
            *reinterpret_cast<float2 *>(out + at) = make_float2(x, y);
        } else {
            if (col < p.n) out[at] = x;
            if (col + 1 < p.n) out[at + 1] = y;
        }
    } else {
        __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.out);
        if ((p.n & 1) == 0 && col + 1 < p.n) {
            *reinterpret_cast<__nv_bfloat162 *>(out + at) = __floats2bfloat162_rn(x, y);
        } else {
            if (col < p.n) out[at] = __float2bfloat16_rn(x);
            if (col + 1 < p.n) out[at + 1] = __float2bfloat16_rn(y);
        }
    }
}

// Registers after setmaxnreg: the FP4 helper warps (decode) need 72, the
// dense ones fit 56, which gives the dense consumers 224 (at 216 the paired
// stage loop spills one register). setmaxnreg.inc waits for registers the
// other warpgroups released, so the totals must fit what the launch gave the
// CTA (168 per thread of 384).
template <bool kFp4> struct Regs {
    static constexpr uint32_t kProducer = kFp4 ? 72 : 56;
    static constexpr uint32_t kConsumer = kFp4 ? 216 : 224;
    static_assert(128 * kProducer + 256 * kConsumer <= 168 * 384,
                  "setmaxnreg totals must fit the registers of the launch");
};

constexpr int kUnitN = 64;                   // columns of one wgmma unit
constexpr int kHalves = kBlockN / kUnitN;    // units per k32 step
constexpr int kUnits = kSteps * kHalves;     // units per stage
constexpr int kRing = 2;                     // fresh tiles per warpgroup (ring slots)
constexpr int kLook = kRing - 1;             // units in flight while one is promoted
constexpr int kFreshRegs = kUnitN / 2;       // fp32 registers per thread of a fresh tile
static_assert(kUnits % kRing == 0, "a stage must hold whole rings (slots are compile-time)");
constexpr int kBandM = 16;                   // m-blocks per band of the tile order

// Maps tile `local` of an mb x nb grid to (m-block, n-block): bands of kBandM
// m-blocks, m-block fastest inside a band, then n-block.
__device__ __forceinline__ void band_tile(int local, int mb, int nb, int &m, int &n) {
    const int band_tiles = kBandM * nb;
    const int band = local / band_tiles;
    const int in_band = local - band * band_tiles;
    const int rows = min(kBandM, mb - band * kBandM);  // m-blocks of this band
    m = band * kBandM + in_band % rows;
    n = in_band / rows;
}

// Version 1's scheduler with the banded order (same expert cursor, same
// clamping of the offsets: group e covers [start_e, end_e) with end_{-1} =
// clamp(offsets[0], 0, T), start_e = end_{e-1}, end_e = clamp(offsets[e+1],
// start_e, T)), and for the dense GEMM the split tiles of params.h: work
// units [0, whole) are tiles [0, whole), unit whole + u is piece u % splits
// of tile whole + u / splits.
struct Scheduler {
    const int32_t *offsets;
    int rows;
    int groups;
    int n_blocks;
    int m_blocks;
    int num_st;
    int whole;
    int splits;
    int per_piece;
    int e;
    int start;
    int end;
    int first;
    int count;

    __device__ Scheduler(const di_mx_gemm_params &p, bool grouped) {
        offsets = p.offsets;
        rows = p.m;
        groups = p.groups;
        n_blocks = (p.n + kBlockN - 1) / kBlockN;
        m_blocks = (p.m + kBlockM - 1) / kBlockM;
        num_st = (p.k + kBlockK - 1) / kBlockK;
        splits = grouped ? 1 : max(p.splits, 1);
        whole = splits == 1 ? m_blocks * n_blocks : clamp_i(p.whole_tiles, 0, m_blocks * n_blocks);
        per_piece = p.stages_per_piece;
        e = -1;
        start = 0;
        end = grouped ? clamp_i(offsets[0], 0, rows) : 0;
        first = 0;
        count = 0;
    }

    __device__ bool dense(int w, Tile &tile) const {
        int t = w, piece = -1;
        if (w >= whole) {
            const int u = w - whole;
            t = whole + u / splits;
            piece = u % splits;
        }
        if (t >= m_blocks * n_blocks) return false;
        int m, n;
        band_tile(t, m_blocks, n_blocks, m, n);
        tile.row0 = m * kBlockM;
        tile.row_end = rows;
        tile.n0 = n * kBlockN;
        tile.e = 0;
        tile.piece = piece;
        tile.split = t - whole;
        if (piece < 0) {
            tile.st_begin = 0;
            tile.st_end = num_st;
        } else if (per_piece > 0) {
            // The skinny kernel's split: pieces of per_piece stages, the
            // last one shorter (the host makes every piece non-empty).
            tile.st_begin = min(piece * per_piece, num_st);
            tile.st_end = min((piece + 1) * per_piece, num_st);
        } else {
            tile.st_begin = piece * num_st / splits;
            tile.st_end = (piece + 1) * num_st / splits;
        }
        return true;
    }

    __device__ bool grouped(int t, Tile &tile) {
        while (t >= first + count) {
            if (e + 1 >= groups) return false;
            first += count;
            ++e;
            start = end;
            end = clamp_i(offsets[e + 1], start, rows);
            count = ((end - start + kBlockM - 1) / kBlockM) * n_blocks;
        }
        const int mb = (end - start + kBlockM - 1) / kBlockM;
        int m, n;
        band_tile(t - first, mb, n_blocks, m, n);
        tile.row0 = start + m * kBlockM;
        tile.row_end = end;
        tile.n0 = n * kBlockN;
        tile.e = e;
        tile.st_begin = 0;
        tile.st_end = num_st;
        tile.piece = -1;
        tile.split = -1;
        return true;
    }
};

// Decodes the packed 128 x 64 B e2m1 tile into the 128 x 128 B e4m3 tile in
// the 128-byte-swizzled layout (16-byte chunk c of row r at chunk c ^ (r % 8)).
// Lane-iteration q reads packed bytes [16 (q % 4), +16) of row q / 4 (32
// values) and writes output chunks 2 (q % 4) and 2 (q % 4) + 1.
__device__ __forceinline__ void decode_fp4_tile(const uint8_t *packed, uint8_t *dst, int lane,
                                                uint32_t lo_tab, uint32_t hi_tab, uint32_t sign_tab) {
#pragma unroll 4
    for (int q = lane; q < kBlockN * 4; q += 32) {
        const int r = q >> 2, c = (q & 3) * 2;
        const uint4 in = *reinterpret_cast<const uint4 *>(packed + r * 64 + (q & 3) * 16);
        const uint2 d0 = deepinfer::e2m1x8_to_e4m3x8(in.x, lo_tab, hi_tab, sign_tab);
        const uint2 d1 = deepinfer::e2m1x8_to_e4m3x8(in.y, lo_tab, hi_tab, sign_tab);
        const uint2 d2 = deepinfer::e2m1x8_to_e4m3x8(in.z, lo_tab, hi_tab, sign_tab);
        const uint2 d3 = deepinfer::e2m1x8_to_e4m3x8(in.w, lo_tab, hi_tab, sign_tab);
        *reinterpret_cast<uint4 *>(dst + r * 128 + ((c ^ (r & 7)) << 4)) = make_uint4(d0.x, d0.y, d1.x, d1.y);
        *reinterpret_cast<uint4 *>(dst + r * 128 + (((c + 1) ^ (r & 7)) << 4)) =
            make_uint4(d2.x, d2.y, d3.x, d3.y);
    }
}

// The shared-memory view of one pipeline stage, as a consumer reads it.
struct StageView {
    const uint8_t *a;   // this warpgroup's 64 rows of the A tile
    const uint8_t *b;   // the 128-row B tile
    const float *sa;    // fp32 A scales [kSteps][128]
    const float *sb;    // fp32 B scales [kSteps][128] (FP4) or [kSteps][4] (dense)
    uint64_t *empty;    // the stage's empty barrier
    uint64_t da;        // smem_desc_k128(a)
    uint64_t db;        // smem_desc_k128(b)
};

// Issues wgmma unit u of stage v into fresh tile f: k32 step u / kHalves,
// columns (u % kHalves) * 64 .. + 64 of the tile (B rows 64 apart: 8 KiB).
// The descriptors are the stage's plus the offset in 16-byte units: the
// start-address field is (address mod 2^18) / 16 in 14 bits, and every
// operand address stays below the 227 KiB of shared memory, so the sum never
// carries out of the field (one 64-bit add a unit instead of rebuilding the
// descriptor: about 10 fewer instructions a unit in the SASS). The add is on
// the low word alone (desc_advance), so the high word stays one register.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t units16) {
    return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + units16);
}

__device__ __forceinline__ void issue_unit(float (&f)[kFreshRegs], const StageView &v, int u) {
    const int j = u / kHalves, h = u % kHalves;
    wgmma_fence();
    WgmmaE4M3<kUnitN>::mma_fresh(f, desc_advance(v.da, (j * 32) >> 4),
                                 desc_advance(v.db, (h * kUnitN * kBlockK + j * 32) >> 4));
    wgmma_commit();
}

// This thread's scale factors for unit u of stage v: the A scales of rows
// r0 = wrow and r0 + 8 and, dense, their products with the B scales of the
// unit's two 32-column blocks (E8M0 -> fp32 is exact, so a product is the
// reference's a_s * b_s).
struct UnitScale {
    float a0, a1;
    float p0[2], p1[2];
};

// Read before the unit's wgmma is waited for: the wait's memory clobber keeps
// later shared-memory loads behind it, so reading the scales after the wait
// put a load's latency and the products on the path of every promotion.
template <bool kFp4> __device__ __forceinline__ UnitScale unit_scale(const StageView &v, int u, int wrow) {
    const int j = u / kHalves, h = u % kHalves;
    UnitScale sc;
    sc.a0 = v.sa[j * kBlockM + wrow];
    sc.a1 = v.sa[j * kBlockM + wrow + 8];
    if (!kFp4) {
        const float2 b = *reinterpret_cast<const float2 *>(v.sb + j * (kBlockN / 32) + h * 2);
        sc.p0[0] = sc.a0 * b.x;
        sc.p0[1] = sc.a0 * b.y;
        sc.p1[0] = sc.a1 * b.x;
        sc.p1[1] = sc.a1 * b.y;
    }
    return sc;
}

// acc += f * (a_s[row] * b_s[col]) for unit u of stage v. This thread holds
// rows r0 = wrow and r0 + 8 of the warpgroup's 64 and, inside the unit's 64
// columns, 8 i + 2 (lane % 4) + {0, 1} for i < 8 (fresh register 4i + {0, 1}
// for r0, 4i + {2, 3} for r0 + 8; the master holds half h at 32 h + ...).
// Dense: one product per row and 32-column block (sc's, then 1 FFMA per
// element); FP4: the B scale is per column (1 FMUL + 1 FFMA per element).
template <bool kFp4>
__device__ __forceinline__ void promote_unit(float (&acc)[64], const float (&f)[kFreshRegs], const UnitScale &sc,
                                             const StageView &v, int u, int lane) {
    const int j = u / kHalves, h = u % kHalves;
    float *d = acc + h * kFreshRegs;
    if (kFp4) {
#pragma unroll
        for (int i = 0; i < kUnitN / 8; ++i) {
            const float2 b = *reinterpret_cast<const float2 *>(v.sb + j * kBlockN + h * kUnitN + 8 * i +
                                                               2 * (lane & 3));
            d[4 * i + 0] = fmaf(f[4 * i + 0], sc.a0 * b.x, d[4 * i + 0]);
            d[4 * i + 1] = fmaf(f[4 * i + 1], sc.a0 * b.y, d[4 * i + 1]);
            d[4 * i + 2] = fmaf(f[4 * i + 2], sc.a1 * b.x, d[4 * i + 2]);
            d[4 * i + 3] = fmaf(f[4 * i + 3], sc.a1 * b.y, d[4 * i + 3]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kUnitN / 8; ++i) {
            d[4 * i + 0] = fmaf(f[4 * i + 0], sc.p0[i / 4], d[4 * i + 0]);
            d[4 * i + 1] = fmaf(f[4 * i + 1], sc.p0[i / 4], d[4 * i + 1]);
            d[4 * i + 2] = fmaf(f[4 * i + 2], sc.p1[i / 4], d[4 * i + 2]);
            d[4 * i + 3] = fmaf(f[4 * i + 3], sc.p1[i / 4], d[4 * i + 3]);
        }
    }
}

// Waits for the oldest in-flight unit (kLook newer ones may stay in flight)
// and promotes it from ring slot `slot`; its scales are read before the wait.
template <bool kFp4, int kPending>
__device__ __forceinline__ void retire(float (&acc)[64], float (&ring)[kRing][kFreshRegs], int slot,
                                       const StageView &v, int u, int wrow, int lane) {
    const UnitScale sc = unit_scale<kFp4>(v, u, wrow);
    wgmma_wait<kPending>();
    fence_operands(ring[slot]);
    promote_unit<kFp4>(acc, ring[slot], sc, v, u, lane);
}

// Every consumer thread arrives on the stage's empty barrier after its last
// read of the stage (kConsumerThreads arrivals, see mx_gemm.cu).
__device__ __forceinline__ void release(const StageView &v, int lane) {
    (void)lane;
    mbar_arrive(v.empty);
}

// Retires the last kLook units of a stage (kLook - 1 - kI newer units still
// in flight when unit kUnits - kLook + kI is retired).
template <bool kFp4, int kI>
__device__ __forceinline__ void drain(float (&acc)[64], float (&ring)[kRing][kFreshRegs],
                                      const StageView &v, int wrow, int lane) {
    if constexpr (kI < kLook) {
        constexpr int u = kUnits - kLook + kI;
        retire<kFp4, kLook - 1 - kI>(acc, ring, u % kRing, v, u, wrow, lane);
        drain<kFp4, kI + 1>(acc, ring, v, wrow, lane);
    }
}

// The consumer pipeline over one stage: issues the stage's kUnits units (unit
// u into ring slot u % kRing) and, after each issue, retires the unit kLook
// older, so kLook units stay queued on the tensor core while one is
// promoted. The first kLook retirements are the previous stage's last units
// (kPrev: still in flight from stage_body<.., false> just before; that stage
// is released after its last unit) or nothing (the first stage of a run).
// Slot u % kRing is free when unit u is issued: its previous unit was
// retired one issue earlier. The stage's own last kLook units stay in flight.
//
// No wgmma may stay in flight across the runtime stage loop's back edge:
// then ptxas serialises every wgmma of the kernel (C7514, "non wgmma
// instructions reading accumulator registers of a wgmma between start and
// end of the pipeline stage"). So the loop body covers two stages, the
// pipeline runs through the boundary between them (the mbarrier spin there
// is fine for ptxas), and drains once per 256 of K. The other consumer
// warpgroup keeps the tensor core busy during the drain.
template <bool kFp4, bool kPrev>
__device__ __forceinline__ void stage_body(float (&acc)[64], float (&ring)[kRing][kFreshRegs],
                                           const StageView &prev, const StageView &cur, int wrow,
                                           int lane) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
        issue_unit(ring[u % kRing], cur, u);
        const int old = u - kLook;
        if (old >= 0) {
            retire<kFp4, kLook>(acc, ring, old % kRing, cur, old, wrow, lane);
        } else if (kPrev) {
            retire<kFp4, kLook>(acc, ring, (old + kUnits) % kRing, prev, old + kUnits, wrow, lane);
            if (old + kUnits == kUnits - 1) release(prev, lane);
        }
    }
}

// A stage whose four K blocks carry one scale in each of this warpgroup's
// rows and in each 32-row block of B (load_scales' flags) is chained: its
// four k32 steps run in the tensor core as one m64n128 wgmma group
// (scale_d = 1 after the first) into a fresh fragment, and each n64 half is
// promoted once with the step-0 scales: the same products as four
// promotions by equal factors, summed in the tensor core's order. The n128
// fragment's registers 32 h .. 32 h + 31 are an n64 unit of half h (column
// 64 h + 8 i + ...), so promote_unit is the per-32 path's. One n128 group
// instead of two n64 halves halves the QGMMA and descriptor instructions
// (ncu, 2026-12-04: the n64 version spent ~80 of its ~170 instructions a
// stage on descriptors).
struct ChainScale {
    UnitScale h0, h1;
};

// Read before the group is issued, so the loads' latency hides under it.
template <bool kFp4> __device__ __forceinline__ ChainScale chain_scale(const StageView &v, int wrow) {
    return ChainScale{unit_scale<kFp4>(v, 0, wrow), unit_scale<kFp4>(v, 1, wrow)};
}

__device__ __forceinline__ void issue_chain(float (&f)[kBlockN / 2], const StageView &v) {
    wgmma_fence();
    WgmmaE4M3<kBlockN>::mma_fresh(f, v.da, v.db);
#pragma unroll
    for (int j = 1; j < kSteps; ++j) {
        WgmmaE4M3<kBlockN>::mma(f, desc_advance(v.da, (j * 32) >> 4), desc_advance(v.db, (j * 32) >> 4), 1);
    }
    wgmma_commit();
}

// After the group's wait.
template <bool kFp4>
__device__ __forceinline__ void promote_chain(float (&acc)[64], float (&f)[kBlockN / 2], const ChainScale &sc,
                                              const StageView &v, int lane) {
    static_assert(kHalves == 2 && 2 * kFreshRegs == kBlockN / 2, "an n128 fragment is two n64 units");
    fence_operands(f);
    promote_unit<kFp4>(acc, *reinterpret_cast<const float(*)[kFreshRegs]>(f), sc.h0, v, 0, lane);
    promote_unit<kFp4>(acc, *reinterpret_cast<const float(*)[kFreshRegs]>(f + kFreshRegs), sc.h1, v, 1, lane);
}

// One chained stage alone: the group is waited for before it returns.
template <bool kFp4>
__device__ __forceinline__ void chained_stage(float (&acc)[64], const StageView &v, int wrow, int lane) {
    const ChainScale sc = chain_scale<kFp4>(v, wrow);
    float f[kBlockN / 2];
    issue_chain(f, v);
    wgmma_wait<0>();
    promote_chain<kFp4>(acc, f, sc, v, lane);
}

// A piece of a split tile (params.h): consumer thread ct (0..255) writes its
// 64 accumulators to the piece's partial (float4 q of thread ct at q * 256 +
// ct, coalesced), and the consumers take the tile's ticket. The last piece to
// finish gets true with acc = the pieces' partials added in piece order from
// +0.0 (whichever CTA finishes last, the same bits) and resets the ticket;
// the others get false. Release: each thread's stores are fenced before the
// ticket is taken; acquire: fence after it, partials read past L1 (__ldcg).
__device__ __forceinline__ bool finish_split(const di_mx_gemm_params &p, const Tile &tile, float (&acc)[64],
                                          int ct) {
    constexpr int kQuads = kBlockM * kBlockN / 4;  // float4s per partial tile
    float4 *own = reinterpret_cast<float4 *>(p.partials) + (int64_t(tile.split) * p.splits + tile.piece) * kQuads;
#pragma unroll
    for (int q = 0; q < 16; ++q) {
        own[q * kConsumerThreads + ct] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    }
    // Every consumer's partial is written before thread 0's release (the
    // barrier orders them, the release is cumulative); the last piece's
    // acquire orders the other pieces' partials before its reads (its
    // threads follow thread 0 through bar_or).
    bar_sync(1, kConsumerThreads);
    const bool last = ct == 0 && atom_add_acq_rel_gpu(p.tickets + tile.split, 1u) == uint32_t(p.splits - 1);
    if (!bar_or(1, kConsumerThreads, last)) return false;
    const float4 *first = reinterpret_cast<const float4 *>(p.partials) + int64_t(tile.split) * p.splits * kQuads;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int piece = 0; piece < p.splits; ++piece) {
        float4 v[16];
#pragma unroll
        for (int q = 0; q < 16; ++q) v[q] = __ldcg(first + int64_t(piece) * kQuads + q * kConsumerThreads + ct);
#pragma unroll
        for (int q = 0; q < 16; ++q) {
            acc[4 * q] += v[q].x;
            acc[4 * q + 1] += v[q].y;
            acc[4 * q + 2] += v[q].z;
            acc[4 * q + 3] += v[q].w;
        }
    }
    if (ct == 0) p.tickets[tile.split] = 0u;  // ready for the next launch
    return true;
}

template <bool kFp4, bool kF32, bool kChain>
__device__ __forceinline__ void mx_gemm_sm90(const di_mx_gemm_params &p) {
    using L = Layout<kFp4>;
    constexpr int S = L::kStages;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *a_tiles = base + L::kA;
    uint8_t *b_tiles = base + L::kB;
    uint8_t *packed_tiles = base + L::kPacked;
    float *sa_all = reinterpret_cast<float *>(base + L::kSa);
    float *sb_all = reinterpret_cast<float *>(base + L::kSb);
    uint64_t *full = reinterpret_cast<uint64_t *>(base + L::kBars);
    uint64_t *ready = full + S;
    uint64_t *empty = ready + S;
    uint32_t *flags = reinterpret_cast<uint32_t *>(base + L::kFlags);

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&ready[s], 32);
            mbar_init(&empty[s], kConsumerThreads);
        }
        fence_barrier_init();
        tma_prefetch_map(&p.a_map);
        tma_prefetch_map(&p.b_map);
    }
    __syncthreads();

    // Per-role state is built after setmaxnreg (values live across it would
    // have to fit the producer's registers).
    constexpr bool grouped = kFp4;
    if (warp < 4) {
        regs_dealloc<Regs<kFp4>::kProducer>();
        Scheduler sched(p, grouped);
        Tile tile;
        if (warp == 0) {
            if (lane != 0) return;
            constexpr uint32_t bytes = kATileBytes + (kFp4 ? kPackedTileBytes : kBTileBytes);
            int it = 0;
            for (int t = blockIdx.x; grouped ? sched.grouped(t, tile) : sched.dense(t, tile);
                 t += gridDim.x) {
                for (int st = tile.st_begin; st < tile.st_end; ++st, ++it) {
                    const int s = it % S;
                    const uint32_t ph = (it / S) & 1;
                    mbar_wait(&empty[s], ph ^ 1);
                    mbar_arrive_expect_tx(&full[s], bytes);
                    tma_load_2d(a_tiles + s * kATileBytes, &p.a_map, &full[s], st * kBlockK, tile.row0);
                    if (kFp4) {
                        tma_load_3d(packed_tiles + s * kPackedTileBytes, &p.b_map, &full[s],
                                    st * (kBlockK / 2), tile.n0, tile.e);
                    } else {
                        tma_load_2d(b_tiles + s * kBTileBytes, &p.b_map, &full[s], st * kBlockK, tile.n0);
                    }
                }
            }
        } else {
            // Helper warps 1..3 take the stages in turn (stage `it` goes to
            // warp 1 + it % 3): scales to fp32, FP4 decode.
            const int hw = warp - 1;
            const uint32_t lo_tab = deepinfer::opaque_u32(0x3C383000u), hi_tab = deepinfer::opaque_u32(0x4C484440u),
                           sign_tab = deepinfer::opaque_u32(0x80808080u);
            int it = 0;
            for (int t = blockIdx.x; grouped ? sched.grouped(t, tile) : sched.dense(t, tile);
                 t += gridDim.x) {
                for (int st = tile.st_begin; st < tile.st_end; ++st, ++it) {
                    if (it % kHelperWarps != hw) continue;
                    const int s = it % S;
                    const uint32_t ph = (it / S) & 1;
                    mbar_wait(&empty[s], ph ^ 1);
                    const uint32_t f = load_scales<kFp4, kChain>(p, tile, st, sa_all + s * L::kSaFloats,
                                                                 sb_all + s * L::kSbFloats, lane);
                    if (kChain && lane == 0) flags[s] = f;
                    if (kFp4) {
                        mbar_wait(&full[s], ph);
                        decode_fp4_tile(packed_tiles + s * kPackedTileBytes, b_tiles + s * kBTileBytes, lane,
                                        lo_tab, hi_tab, sign_tab);
                        fence_proxy_async_smem();
                    }
                    __syncwarp();
                    mbar_arrive(&ready[s]);
                }
            }
        }
        return;
    }

    regs_alloc<Regs<kFp4>::kConsumer>();
    Scheduler sched(p, grouped);
    Tile tile;
    const int wg = warp / 4 - 1;                            // consumer warpgroup: rows 64 * wg
    const int wrow = wg * 64 + (warp % 4) * 16 + lane / 4;  // this thread's first row in the tile
    const auto view = [&](int s) {
        const uint8_t *a = a_tiles + s * kATileBytes + wg * 64 * kBlockK;
        const uint8_t *b = b_tiles + s * kBTileBytes;
        return StageView{a, b, sa_all + s * L::kSaFloats, sb_all + s * L::kSbFloats, &empty[s],
                         smem_desc_k128(a), smem_desc_k128(b)};
    };
    float acc[64];
    float ring[kRing][kFreshRegs];
    int it = 0;
    for (int t = blockIdx.x; grouped ? sched.grouped(t, tile) : sched.dense(t, tile); t += gridDim.x) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
        // Stages in pairs (see stage_body), then an odd last stage alone.
        int st = tile.st_begin;
        // Whether this warpgroup chains stage s (the chained dense kernels:
        // load_scales' flags; a compile-time false elsewhere, so the other
        // kernels compile to the per-32 loop alone). Its
        // rows' and B's scales are equal across the stage, chain_flags).
        const auto chains = [&](int s) {
            const uint32_t f = flags[s];
            return kChain && !kFp4 && ((f >> wg) & (f >> 2) & 1u) != 0;
        };
        for (; st + 2 <= tile.st_end; st += 2, it += 2) {
            const int s0 = it % S, s1 = (it + 1) % S;
            const uint32_t ph0 = (it / S) & 1, ph1 = ((it + 1) / S) & 1;
            mbar_wait(&full[s0], ph0);
            mbar_wait(&ready[s0], ph0);
            const bool c0 = chains(s0);
            if (c0) {
                // Stage s0's group runs while s1's barriers and flag are
                // read and, when s1 chains too, while s0 is promoted (s1's
                // group queued behind it): the warpgroup keeps the tensor
                // core fed across its own promotion. ncu of the one-stage
                // form (2026-12-04): both consumer warpgroups waited on
                // their group in step, 19 % of their samples.
                const StageView v0 = view(s0);
                const ChainScale sc0 = chain_scale<kFp4>(v0, wrow);
                float f0[kBlockN / 2];
                issue_chain(f0, v0);
                mbar_wait(&full[s1], ph1);
                mbar_wait(&ready[s1], ph1);
                if (chains(s1)) {
                    const StageView v1 = view(s1);
                    const ChainScale sc1 = chain_scale<kFp4>(v1, wrow);
                    float f1[kBlockN / 2];
                    issue_chain(f1, v1);
                    wgmma_wait<1>();
                    promote_chain<kFp4>(acc, f0, sc0, v0, lane);
                    release(v0, lane);
                    wgmma_wait<0>();
                    promote_chain<kFp4>(acc, f1, sc1, v1, lane);
                } else {
                    wgmma_wait<0>();
                    promote_chain<kFp4>(acc, f0, sc0, v0, lane);
                    release(v0, lane);
                    stage_body<kFp4, false>(acc, ring, view(s1), view(s1), wrow, lane);
                    drain<kFp4, 0>(acc, ring, view(s1), wrow, lane);
                }
            } else {
                stage_body<kFp4, false>(acc, ring, view(s0), view(s0), wrow, lane);
                mbar_wait(&full[s1], ph1);
                mbar_wait(&ready[s1], ph1);
                if (!chains(s1)) {
                    stage_body<kFp4, true>(acc, ring, view(s0), view(s1), wrow, lane);
                    drain<kFp4, 0>(acc, ring, view(s1), wrow, lane);
                } else {
                    drain<kFp4, 0>(acc, ring, view(s0), wrow, lane);
                    release(view(s0), lane);
                    chained_stage<kFp4>(acc, view(s1), wrow, lane);
                }
            }
            release(view(s1), lane);
        }
        if (st < tile.st_end) {
            // The odd last stage alone, waited for before the epilogue.
            const int s = it % S;
            const uint32_t ph = (it / S) & 1;
            mbar_wait(&full[s], ph);
            mbar_wait(&ready[s], ph);
            if (chains(s)) {
                chained_stage<kFp4>(acc, view(s), wrow, lane);
            } else {
                stage_body<kFp4, false>(acc, ring, view(s), view(s), wrow, lane);
                drain<kFp4, 0>(acc, ring, view(s), wrow, lane);
            }
            release(view(s), lane);
            ++it;
        }
        if (tile.piece >= 0 && !finish_split(p, tile, acc, tid - 128)) continue;
        const int r0 = tile.row0 + wrow;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            // Master register 32 h + 4 i' + {0..3} is column 64 h + 8 i' + ...,
            // i.e. column 8 i + 2 (lane % 4) for i = 8 h + i'.
            const int col = tile.n0 + 8 * i + 2 * (lane & 3);
            if (r0 < tile.row_end) store_pair<kF32>(p, r0, col, acc[4 * i], acc[4 * i + 1]);
            if (r0 + 8 < tile.row_end) store_pair<kF32>(p, r0 + 8, col, acc[4 * i + 2], acc[4 * i + 3]);
        }
    }
}

}  // namespace
#else
namespace {

// SIMT path (every target but sm_90a): one thread per output, grid-stride,
// K blocks of 32 in increasing order exactly as the CPU reference (fp32 block
// sum from +0.0 in increasing k, times a_s * b_s, added to an fp32 sum). A
// dense launch with stages_per_piece = P > 0 sums each piece of 4 P blocks
// that way from +0.0 and adds the pieces in order from +0.0, as the skinny
// kernel's SIMT path adds its K splits (the batch-invariant mode).
template <bool kFp4, bool kF32> __device__ void mx_gemm_simt(const di_mx_gemm_params &p) {
    const int kbt = (p.k + 31) / 32;
    const uint8_t *a = static_cast<const uint8_t *>(p.a);
    const uint8_t *as = static_cast<const uint8_t *>(p.a_s);
    const uint8_t *b = static_cast<const uint8_t *>(p.b);
    const uint8_t *bs = static_cast<const uint8_t *>(p.b_s);
    const int64_t total = int64_t(p.m) * p.n;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int row = int(i / p.n), col = int(i % p.n);
        int e = 0;
        if (kFp4) {
            // The expert whose clamped, monotone range holds `row` (see Scheduler).
            int end = clamp_i(p.offsets[0], 0, p.m);
            if (row < end) continue;
            e = -1;
            for (int g = 0; g < p.groups; ++g) {
                const int start = end;
                end = clamp_i(p.offsets[g + 1], start, p.m);
                if (row < end) {
                    e = g;
                    break;
                }
            }
            if (e < 0) continue;
        }
        const int per_piece = !kFp4 && p.splits > 1 && p.stages_per_piece > 0 ? 4 * p.stages_per_piece : kbt;
        float total = 0.0f;
        for (int kb0 = 0; kb0 < kbt; kb0 += per_piece) {
            float acc = 0.0f;
            for (int kb = kb0; kb < min(kbt, kb0 + per_piece); ++kb) {
                float sum = 0.0f;
                for (int k = kb * 32; k < min(p.k, kb * 32 + 32); ++k) {
                    __nv_fp8_e4m3 av;
                    av.__x = a[int64_t(row) * p.k + k];
                    float bv;
                    if (kFp4) {
                        const uint8_t byte = b[(int64_t(e) * p.n + col) * (p.k / 2) + k / 2];
                        bv = deepinfer::e2m1_to_f32((k & 1) ? byte >> 4 : byte & 0xF);
                    } else {
                        __nv_fp8_e4m3 q;
                        q.__x = b[int64_t(col) * p.k + k];
                        bv = float(q);
                    }
                    sum = __fadd_rn(sum, __fmul_rn(deepinfer::e4m3_to_f32(av.__x), bv));
                }
                const float sb = kFp4 ? deepinfer::e8m0_to_f32(bs[(int64_t(e) * p.n + col) * kbt + kb])
                                      : deepinfer::e8m0_to_f32(bs[int64_t(col / 32) * kbt + kb]);
                const float sa = deepinfer::e8m0_to_f32(as[int64_t(row) * kbt + kb]);
                acc = __fadd_rn(acc, __fmul_rn(sum, __fmul_rn(sa, sb)));
            }
            total = __fadd_rn(total, acc);
        }
        if (kF32) {
            static_cast<float *>(p.out)[i] = total;
        } else {
            static_cast<__nv_bfloat16 *>(p.out)[i] = __float2bfloat16_rn(total);
        }
    }
}

}  // namespace
#endif

// kChain: the dense kernel that chains uniform stages (GemmImpl::LargeShared,
// README.md "Chained stages"); the SIMT path keeps the reference's order.
template <bool kFp4, bool kF32, bool kChain = false>
__device__ __forceinline__ void mx_gemm(const di_mx_gemm_params &p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mx_gemm_sm90<kFp4, kF32, kChain>(p);
#else
    mx_gemm_simt<kFp4, kF32>(p);
#endif
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp8_gemm_bf16(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<false, false>(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp8_gemm_f32(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<false, true>(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp8_gemm_chained_bf16(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<false, false, true>(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp8_gemm_chained_f32(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<false, true, true>(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp4_grouped_contiguous_bf16(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<true, false>(p);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    mxfp4_grouped_contiguous_f32(const __grid_constant__ di_mx_gemm_params p) {
    DI_PDL_ENTRY();
    mx_gemm<true, true>(p);
}
