// FP4 MoE GEMM for decode, version 6: wgmma with the decoded weights as the
// A operand from registers (mxfp4_grouped_masked_v6_n{8,16},
// mxfp4_grouped_contiguous_v6).
//
//   masked: per expert e with c = clamp(counts[e], 0, max_m) > 0:
//   out[e, :c, N] = A[e, :c, K] (e4m3, 1x32 E8M0) x B[e, N, K]^T (packed e2m1,
//   one E8M0 per output row per 32 of K); rows >= c untouched.
//   contiguous: A [T, K] rows grouped by expert, offsets [E + 1] (clamped
//   to [0, T] and made monotone as the contiguous kernel does): out[r, N] =
//   A[r] x B[e]^T for the rows r of expert e; rows outside every group
//   untouched.
//
// Token windows (2026-12-04): an expert's rows go in windows of NT tokens,
// each a work item of its own (expert e, window j: rows NT j .. NT j + NT),
// so an expert may have any number of rows: the decode batches of an
// EP-8/16 rank (8-64 tokens an expert) stay on this kernel instead of the
// contiguous one's 128-row tiles. A window streams its expert's weights
// again; an empty one costs nothing (only the windows an expert's rows
// reach are ranked). A token's sums do not depend on its window, on the
// layout or on the other tokens: every output is its own dot product in
// the same K order, which is what the batch-invariant mode runs its routed
// experts on (src/cuda_backend/gemm_skinny.rs, `mxfp4_grouped_contiguous_v6`).
//
// Why (README, "Version 6"): V3 spends ~56 warp instructions per 16 x 32
// block, a third of them converting e4m3 to f16 for the two HMMA.16816 that
// ptxas makes of an e4m3 mma.sync (sm_90 has no FP8 mma.sync). wgmma does
// take e4m3 A from registers: the 7-instruction e2m1 -> e4m3 decode feeds it
// directly, one wgmma m64nNk32 per 32-deep block for the whole warpgroup.
//
// Shapes: N % 64 == 0, K % 256 == 0, the per-expert table, the tokens and
// two stages fitting shared memory (the host's `v6_layout`).
// Uses V3's helpers (same translation unit: the family compiles as one).
//
// sm_90a, one CTA of 17 warps per SM, persistent:
// - Unit = 64 weight rows of one work item (an expert's window) x all of K;
//   a CTA takes a contiguous range of units (items in order), one at a time.
// - Warp 16 is the producer: chunk c of a unit (16 K blocks = 256 bytes of
//   e2m1 per row, 8 at the tail) goes into stage q % S as two TMA boxes of
//   64 rows x 128 bytes (128-byte swizzle: ldmatrix without bank conflicts;
//   one at the tail) and the rows' 16 scale bytes by 8-byte cp.async, all
//   completing on full[s] (1 expect_tx arrival + 32 cp.async arrivals). It
//   waits on empty[s] (one arrival per consumer warp) before reusing a
//   stage. (Per-row bulk copies of 256 bytes, the first version, kept the
//   DRAM at 14 %: 116 us for w13 at 6 x 8 tokens.)
// - Warps 0-15 are 4 warpgroups. Every warpgroup covers the unit's 64 rows
//   (warp w % 4: rows 16 (w % 4) ..), warpgroup j on K blocks [4j, 4j + 4)
//   of each 16-block chunk ([2j, 2j + 2) of an 8-block one). A warp reads its
//   weights (ldmatrix) and scales into registers, releases the stage,
//   decodes, and the warpgroup issues one fresh wgmma per block, tokens as B
//   from shared memory (staged once per window, 128-byte swizzled K-major
//   tiles, each 32-deep block as its 16 even then 16 odd bytes to match the
//   decode's k order). Each fresh block result is folded as
//   acc = fma(fresh, w_s * a_s, acc) (per-32 promotion, as V1-V3).
// - At the end of a unit the 4 warpgroups' partials [64 rows][tokens] meet
//   in shared memory (double-buffered); after a barrier of the 512 consumer
//   threads each thread adds one output's 4 partials in warpgroup order.
//   The K split depends on K only: results do not depend on the batch.
//
// Other architectures (compile-only here): V3's SIMT path.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

namespace skinny_v6 {

constexpr int kRows = 64;                   // weight rows per unit (wgmma M)
constexpr int kConsumers = 16;              // consumer warps: 4 warpgroups
constexpr int kThreads = (kConsumers + 1) * 32;  // + the producer warp
constexpr int kChunk = 16;                  // K blocks per stage
constexpr int kHalf = kRows * 128;          // one TMA box: 64 rows x 128 bytes
constexpr int kMaxStages = 8;

__host__ __device__ constexpr int align16(int v) { return (v + 15) & ~15; }
__host__ __device__ constexpr int align1024(int v) { return (v + 1023) & ~1023; }

// Shared-memory carve-up from a 1024-byte aligned base (the host twin is
// `v6_layout` in src/cuda_backend/gemm_skinny.rs, which adds 1024 bytes of
// slack for the alignment): full [8] and empty [8] barriers, the E8M0 table
// [256] f32, the per-expert table (windows' inclusive prefix, first row and
// row count: 3 x experts i32, see `rank_windows`), the tokens (1024-aligned:
// K/128 tiles of NT rows x 128 bytes), their fp32 scales [K/32][NT], two
// partial buffers [4 warpgroups][64 rows][NT] f32, then S stages (1024-
// aligned) of two swizzled 64 x 128-byte e2m1 boxes plus 64 x 16 scale bytes.
struct Layout {
    int lut, table, act, act_s, part, stages, stage_bytes, ws_off;
    __host__ __device__ Layout(int nt, int k, int experts) {
        lut = 16 * kMaxStages;
        table = lut + 256 * 4;
        act = align1024(table + align16(3 * experts * 4));
        act_s = act + nt * k;
        part = act_s + align16(k / 32 * nt * 4);
        stages = align1024(part + 2 * 4 * kRows * nt * 4);
        ws_off = 2 * kHalf;
        stage_bytes = ws_off + kRows * kChunk;  // 17 KiB: stages stay 1024-aligned
    }
};

}  // namespace skinny_v6

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace skinny_v6 {

using namespace deepinfer::sm90;

// d = A (64 x 32 e4m3, this warp's 16 rows in a0..a3 as mma.m16n8k32's A
// fragment) . B (NT x 32 e4m3 K-major in shared memory, `desc_b`), fresh.
template <int NT> __device__ __forceinline__ void wgmma_rs_fresh(float (&d)[NT / 2], const uint32_t (&a)[4],
                                                                 uint64_t desc_b);
template <> __device__ __forceinline__ void wgmma_rs_fresh<8>(float (&d)[4], const uint32_t (&a)[4],
                                                              uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n"
        "}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}
template <> __device__ __forceinline__ void wgmma_rs_fresh<16>(float (&d)[8], const uint32_t (&a)[4],
                                                               uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n"
        "}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

__device__ __forceinline__ void named_sync_consumers() {
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
}

// Arrives on `bar` once this thread's earlier cp.async copies have landed
// (the arrival was counted in the barrier's initial count).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Stages the `cnt` tokens at row `row0` of a (rows cnt..NT-1 as zeros) as wgmma B
// tiles: tile c (K 128c..128c+127) holds NT rows of 128 bytes, rows 8..15
// 1024 bytes after rows 0..7, 16-byte piece j of row t at piece j ^ (t % 8);
// block b of the tile is pieces 2b (its even bytes) and 2b + 1 (odd bytes).
// Then the tokens' fp32 scales [K/32][NT]. The 512 consumer threads, no
// barrier.
template <int NT>
__device__ __forceinline__ void stage_tokens(const di_gemm_skinny_params &p, int row0, int cnt, uint8_t *act,
                                             float *act_s) {
    const int tid = threadIdx.x, k = p.k, kb_n = k / 32;
    const int64_t r0 = row0;
    const uint8_t *a = static_cast<const uint8_t *>(p.a) + r0 * k;
    const uint8_t *as = static_cast<const uint8_t *>(p.a_scale) + r0 * kb_n;
    for (int q = tid; q < NT * kb_n; q += kConsumers * 32) {
        const int t = q / kb_n, kb = q % kb_n;
        uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
        if (t < cnt) {
            const uint4 *src = reinterpret_cast<const uint4 *>(a + int64_t(t) * k + kb * 32);
            v0 = src[0];
            v1 = src[1];
        }
        uint4 ev, od;
        ev.x = __byte_perm(v0.x, v0.y, 0x6420);
        ev.y = __byte_perm(v0.z, v0.w, 0x6420);
        ev.z = __byte_perm(v1.x, v1.y, 0x6420);
        ev.w = __byte_perm(v1.z, v1.w, 0x6420);
        od.x = __byte_perm(v0.x, v0.y, 0x7531);
        od.y = __byte_perm(v0.z, v0.w, 0x7531);
        od.z = __byte_perm(v1.x, v1.y, 0x7531);
        od.w = __byte_perm(v1.z, v1.w, 0x7531);
        uint8_t *row = act + (kb / 4) * NT * 128 + (t / 8) * 1024 + (t % 8) * 128;
        const int j = 2 * (kb % 4);
        *reinterpret_cast<uint4 *>(row + ((j ^ (t % 8)) * 16)) = ev;
        *reinterpret_cast<uint4 *>(row + (((j + 1) ^ (t % 8)) * 16)) = od;
    }
    for (int q = tid; q < NT * kb_n; q += kConsumers * 32) {
        const int t = q % NT, kb = q / NT;
        act_s[q] = t < cnt ? deepinfer::e8m0_to_f32(as[int64_t(t) * kb_n + kb]) : 0.0f;
    }
}

// One warp's share of a chunk in stage `st`: PER blocks starting at block
// b0 of the chunk (K block kb0 of the row): weights (ldmatrix) and scales
// into registers, the stage released on `empty`, decoded, PER fresh wgmmas
// (the warpgroup's 64 rows against the staged tokens), then folded into acc
// with the weight and token scales.
template <int NT, int PER>
__device__ __forceinline__ void chunk(const uint8_t *st, int ws_off, const uint8_t *act, const float *act_s,
                                      int kb0, int b0, int lm_row, int lm_blk, const float *lut, uint64_t *empty,
                                      float (&acc)[NT / 2]) {
    const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) % 4, g = lane >> 2, tg = lane & 3;
    uint32_t w[PER / 2][4];
    uint32_t sc[PER][2];
#pragma unroll
    for (int h = 0; h < PER / 2; ++h) {
        // Block b of the chunk: box b / 8, 16-byte piece (b % 8) ^ (row % 8).
        const int b = b0 + 2 * h + lm_blk;
        skinny_v3::ldmatrix_x4(w[h], st + (b / 8) * kHalf + lm_row * 128 + (((b % 8) ^ (lm_row % 8)) * 16));
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const uint8_t *ws = st + ws_off + (wq * 16 + g) * kChunk + b0 + j;
        sc[j][0] = ws[0];
        sc[j][1] = ws[8 * kChunk];
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty);  // this warp is done with the stage
    uint32_t af[PER][4];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const uint32_t r0 = w[j / 2][2 * (j % 2)], r8 = w[j / 2][2 * (j % 2) + 1];
        af[j][0] = deepinfer::e2m1_even_to_e4m3_x2e6(r0);
        af[j][1] = deepinfer::e2m1_even_to_e4m3_x2e6(r8);
        af[j][2] = deepinfer::e2m1_odd_to_e4m3_x2e6(r0);
        af[j][3] = deepinfer::e2m1_odd_to_e4m3_x2e6(r8);
    }
    float d[PER][NT / 2];
    // kb0 is a multiple of PER (4 or 2), so the PER blocks share one token
    // tile; block j starts 32 j bytes (2 j in the descriptor's 16-byte
    // address units) into it.
    const uint64_t desc0 = smem_desc_k128(act + (kb0 / 4) * NT * 128 + 32 * (kb0 % 4));
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < PER; ++j) wgmma_rs_fresh<NT>(d[j], af[j], desc0 + uint64_t(2 * j));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        fence_operands(d[j]);
        const int kb = kb0 + j;
        const float s0 = lut[sc[j][0]], s8 = lut[sc[j][1]];
#pragma unroll
        for (int h = 0; h < NT / 8; ++h) {
            const float2 at = *reinterpret_cast<const float2 *>(act_s + kb * NT + 8 * h + 2 * tg);
            acc[4 * h + 0] = fmaf(d[j][4 * h + 0], s0 * at.x, acc[4 * h + 0]);
            acc[4 * h + 1] = fmaf(d[j][4 * h + 1], s0 * at.y, acc[4 * h + 1]);
            acc[4 * h + 2] = fmaf(d[j][4 * h + 2], s8 * at.x, acc[4 * h + 2]);
            acc[4 * h + 3] = fmaf(d[j][4 * h + 3], s8 * at.y, acc[4 * h + 3]);
        }
    }
}

// The per-expert table, experts entries each: `wend` the inclusive prefix
// of the windows ceil(rows / NT) (the work items (expert e, window j) are
// ranked in expert then window order: item wend[e - 1] + j), `first` the
// expert's first row of a and out, `rows` its row count. Masked (kContig
// false): first = e * max_m, rows = clamp(counts[e], 0, max_m). Contiguous
// (kContig true; p.counts holds offsets [E + 1] over p.m = T rows): expert e
// on [P_e, P_{e+1}) with P_e the running maximum of clamp(offsets[j], 0, T)
// over j <= e, as the contiguous kernel clamps them, so the experts' rows
// are disjoint and inside [0, T) whatever the offsets hold. Block-wide
// scans (warp shuffles, then the warp totals in `warp_total`, kThreads /
// 32 of them); returns the item count. Every thread of the CTA calls it.
template <int NT, bool kContig>
__device__ __forceinline__ int rank_windows(const di_gemm_skinny_params &p, int *wend, int *first, int *rows,
                                            int *warp_total) {
    constexpr int kW = kThreads / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n_items = 0, carry = 0;  // carry: the running maximum before e0 (kContig)
    for (int e0 = 0; e0 < p.experts; e0 += kThreads) {
        const int e = e0 + tid;
        const bool in = e < p.experts;
        int f = 0, c = 0;
        if constexpr (kContig) {
            const int lo = in ? min(max(p.counts[e], 0), p.m) : 0;
            const int hi = in ? min(max(p.counts[e + 1], 0), p.m) : 0;
            int x = lo;  // inclusive max-scan over the warp
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const int y = __shfl_up_sync(0xFFFFFFFFu, x, off);
                if (lane >= off) x = max(x, y);
            }
            if (lane == 31) warp_total[warp] = x;
            __syncthreads();
            int before = carry, all = carry;
#pragma unroll
            for (int v = 0; v < kW; ++v) {
                before = v < warp ? max(before, warp_total[v]) : before;
                all = max(all, warp_total[v]);
            }
            __syncthreads();  // warp_total is the sum-scan's below
            f = max(before, x);
            c = max(f, hi) - f;
            carry = all;
        } else if (in) {
            f = e * p.m;  // < 2^31: the host's v6_layout checks experts * max_m
            c = min(max(p.counts[e], 0), p.m);
        }
        const int w = (c + NT - 1) / NT;
        int x = w;  // inclusive scan over the warp
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xFFFFFFFFu, x, off);
            if (lane >= off) x += y;
        }
        if (lane == 31) warp_total[warp] = x;
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int v = 0; v < kW; ++v) {
            before += v < warp ? warp_total[v] : 0;
            total += warp_total[v];
        }
        if (in) {
            wend[e] = n_items + before + x;
            first[e] = f;
            rows[e] = c;
        }
        n_items += total;
        __syncthreads();
    }
    return n_items;
}

// The expert of work item `item` (< the item count): the first e with
// wend[e] > item, by binary search over the table.
__device__ __forceinline__ int expert_of(const int *wend, int experts, int item) {
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (wend[mid] > item) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

template <int NT, bool kContig>
__device__ __forceinline__ void masked_v6_sm90(const di_masked_v6_params &pm) {
    const di_gemm_skinny_params &p = pm.p;
    static_assert(NT == 8 || NT == 16, "token tile 8 or 16");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    // A 1024-byte aligned base (the swizzled token tiles need it).
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const Layout L(NT, p.k, p.experts);
    const int S = min(kMaxStages, int((skinny_v3::dynamic_smem_bytes() - 1024 - uint32_t(L.stages)) /
                                      uint32_t(L.stage_bytes)));
    uint64_t *full = reinterpret_cast<uint64_t *>(smem);
    uint64_t *empty = full + kMaxStages;
    float *lut = reinterpret_cast<float *>(smem + L.lut);
    int *wend = reinterpret_cast<int *>(smem + L.table);
    int *first = wend + p.experts;
    int *rows = first + p.experts;
    uint8_t *act = smem + L.act;
    float *act_s = reinterpret_cast<float *>(smem + L.act_s);
    float *part = reinterpret_cast<float *>(smem + L.part);
    uint8_t *stage0 = smem + L.stages;
    __shared__ int warp_active[kThreads / 32];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int k = p.k, kb_n = k / 32, n_chunks = (kb_n + kChunk - 1) / kChunk;
    const int groups = p.n / kRows;  // units per expert

    const int n_active = rank_windows<NT, kContig>(p, wend, first, rows, warp_active);
    if (tid < 256) lut[tid] = deepinfer::e8m0_to_f32(uint32_t(tid));
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(&full[s], 1 + 32);
            mbar_init(&empty[s], kConsumers);
        }
        fence_barrier_init();
    }
    __syncthreads();

    const skinny_v3::Units U(n_active, groups);
    const int n_units = U.count, rank0 = U.rank0, group0 = U.group0;
    if (n_units <= 0) return;

    if (warp == kConsumers) {
        // Producer: every chunk of every unit, in order, into the stages in
        // turn; from the second round on, a stage is refilled once the
        // consumers have left it (round r waits for empty[s]'s phase r - 1).
        const uint8_t *bs = static_cast<const uint8_t *>(p.b_scale);
        if (lane == 0) tma_prefetch_map(&pm.b_map);
        int s = 0;
        uint32_t round = 0;
        int rank = rank0, group = group0;
        for (int i = 0; i < n_units; ++i, U.next(rank, group)) {
            const int64_t row0 = int64_t(expert_of(wend, p.experts, rank)) * p.n + int64_t(group) * kRows;
            for (int c = 0; c < n_chunks; ++c) {
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1u);
                const int nb = min(kChunk, kb_n - c * kChunk);
                uint8_t *st = stage0 + s * L.stage_bytes;
                if (lane == 0) {
                    mbar_arrive_expect_tx(&full[s], uint32_t(kRows * nb * 16));
                    for (int h = 0; h < nb / 8; ++h) {
                        tma_load_2d(st + h * kHalf, &pm.b_map, &full[s], (c * kChunk + 8 * h) * 16, int32_t(row0));
                    }
                }
#pragma unroll
                for (int r = lane; r < kRows; r += 32) {
                    const uint8_t *src = bs + (row0 + r) * kb_n + c * kChunk;
                    for (int j = 0; j < nb; j += 8) cp_async8(smem_u32(st + L.ws_off + r * kChunk + j), src + j, true);
                }
                cp_async_arrive_noinc(&full[s]);
                if (++s == S) {
                    s = 0;
                    ++round;
                }
            }
        }
        return;
    }

    // Consumers.
    const int wg = warp / 4, wq = warp % 4, g = lane >> 2, tg = lane & 3;
    const int lm_row = wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, lm_blk = lane >> 4;
    int s = 0, cur = -1, row0 = 0, cnt = 0;
    uint32_t phase = 0;
    int rank = rank0, group = group0;
    for (int i = 0; i < n_units; ++i, U.next(rank, group)) {
        if (rank != cur) {
            // Every consumer is past the previous unit's barrier, so its
            // wgmmas (the readers of the tokens) have completed. Item `rank`
            // is window j of expert e: rows row0 .. row0 + cnt of a and out.
            cur = rank;
            const int e = expert_of(wend, p.experts, rank);
            const int j = rank - (e > 0 ? wend[e - 1] : 0);
            row0 = first[e] + j * NT;
            cnt = min(NT, rows[e] - j * NT);
            stage_tokens<NT>(p, row0, cnt, act, act_s);
            fence_proxy_async_smem();  // the tokens are read by wgmma
            named_sync_consumers();
        }
        float acc[NT / 2];
#pragma unroll
        for (int x = 0; x < NT / 2; ++x) acc[x] = 0.0f;
        for (int c = 0; c < n_chunks; ++c) {
            mbar_wait(&full[s], phase);
            const uint8_t *st = stage0 + s * L.stage_bytes;
            // Branch-free wgmma issue per chunk size (a wgmma under a
            // condition makes ptxas wait for each one before the next).
            if (kb_n - c * kChunk >= kChunk) {
                chunk<NT, 4>(st, L.ws_off, act, act_s, c * kChunk + wg * 4, wg * 4, lm_row, lm_blk, lut, &empty[s],
                             acc);
            } else {
                chunk<NT, 2>(st, L.ws_off, act, act_s, c * kChunk + wg * 2, wg * 2, lm_row, lm_blk, lut, &empty[s],
                             acc);
            }
            if (++s == S) {
                s = 0;
                phase ^= 1u;
            }
        }
        // Partials [warpgroup][row][token] of buffer i % 2.
        float *pb = part + (i & 1) * 4 * kRows * NT;
        float *pw = pb + wg * kRows * NT;
        const int row = wq * 16 + g;
#pragma unroll
        for (int h = 0; h < NT / 8; ++h) {
            pw[row * NT + 8 * h + 2 * tg] = acc[4 * h + 0];
            pw[row * NT + 8 * h + 2 * tg + 1] = acc[4 * h + 1];
            pw[(row + 8) * NT + 8 * h + 2 * tg] = acc[4 * h + 2];
            pw[(row + 8) * NT + 8 * h + 2 * tg + 1] = acc[4 * h + 3];
        }
        named_sync_consumers();
        for (int o = tid; o < kRows * NT; o += kConsumers * 32) {
            const int r = o % kRows, t = o / kRows;
            if (t < cnt) {
                float sum = 0.0f;
#pragma unroll
                for (int x = 0; x < 4; ++x) sum += pb[x * kRows * NT + r * NT + t];
                skinny_v3::write_output(p, 0, row0 + t, int64_t(group) * kRows + r, sum);
            }
        }
    }
}

}  // namespace skinny_v6
#endif

template <int NT> __device__ __forceinline__ void masked_v6(const di_masked_v6_params &p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    skinny_v6::masked_v6_sm90<NT, false>(p);
#else
    skinny_v3::masked_v3_simt<NT>(p.p);
#endif
}

// The masked layout, token tile 8 (max_m <= 8) or 16 (windows of 16 past
// it); one CTA per SM (the host sizes the stages).
extern "C" __global__ void __launch_bounds__(skinny_v6::kThreads, 1)
    mxfp4_grouped_masked_v6_n8(const __grid_constant__ di_masked_v6_params p) {
    DI_PDL_ENTRY();
    masked_v6<8>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v6::kThreads, 1)
    mxfp4_grouped_masked_v6_n16(const __grid_constant__ di_masked_v6_params p) {
    DI_PDL_ENTRY();
    masked_v6<16>(p);
}

// The contiguous layout: a [T, K] with its rows grouped by expert, p.counts
// the offsets [E + 1], p.m = T, out [T, N]; windows of 16. sm_90a only (the
// host runs the contiguous kernel elsewhere; this entry traps there).
extern "C" __global__ void __launch_bounds__(skinny_v6::kThreads, 1)
    mxfp4_grouped_contiguous_v6(const __grid_constant__ di_masked_v6_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    skinny_v6::masked_v6_sm90<16, true>(p);
#else
    __trap();
#endif
}
