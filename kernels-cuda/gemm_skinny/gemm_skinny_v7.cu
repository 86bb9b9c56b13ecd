// Dense skinny GEMM for decode, version 7: the weights streamed by TMA
// (mxfp8_gemm_skinny_v7_n{8,16}).
//
//   out[M, N] = A[M, K] (e4m3, 1x32 E8M0) x B[N, K]^T (e4m3, 32x32 E8M0),
//   M <= 16 (token tile 8 or 16), K % 16 == 0 (the tensor map's row pitch).
//
// Why (README, "The dense V2 at decode, read by ncu"): V2 spends its issue
// slots on 16-byte cp.async copies and their addresses (about 220
// instructions a warp per 8 KiB chunk); at wo_b M = 1 its warps issue every
// 6-8 cycles and DRAM runs at half speed. Here one thread moves a chunk's
// 8 KiB of weights with one TMA instruction and the consumer warpgroup only
// waits, multiplies and folds.
//
// Numerics: V2's exactly. Work item = (64-row output tile, K split) of V2's
// grid, the split from the host's split_k (N and K only); each 32-deep K
// block of the item is one fresh wgmma m64n{8,16}k32 (weights as A, tokens as B,
// both from shared memory, as V2), folded as acc = fma(fresh, w_s * a_s,
// acc) in K order, the 4 blocks of every chunk unconditionally (a block past
// K is zero data with scale 0, adding +0, as V2). With splits > 1 each item
// writes fp32 partials [split][M][N]; the last item of a tile to finish (a
// ticket per tile) adds them in split order from +0.0 and writes the output.
// So V7's bits are V2's and V1's at the same token tile (the GPU test
// asserts it).
//
// sm_90a, a persistent CTA of 5 warps, 2 to 4 per SM (the host takes the
// fewest that hold every item in one round, else 2, and sizes the stages
// to that share of an SM's shared memory, the grid to the resident CTAs):
// - Items i = blockIdx.x, + gridDim.x, ...: tile i % tiles, split i / tiles.
// - Warp 4 (one lane) is the producer: chunk c of an item (128 of K, the
//   tile's 64 rows) goes into stage q % S as one TMA box of 64 rows x 128
//   bytes (128-byte swizzle, the K-major layout wgmma's descriptor reads;
//   rows past N and bytes past K are zero-filled), completing on full[s]; it
//   waits on empty[s] (one arrival per consumer warp) before reusing a stage.
//   The pipeline runs on across items.
// - Warps 0-3 (one warpgroup) consume. Per item they stage its tokens (the
//   item's K range, NT rows of 128-byte swizzled tiles, rows past M zero) and
//   their fp32 scales once; per chunk they load the next chunk's weight
//   scales (two rows a thread, from L2) while waiting on full[s], issue the
//   4 wgmmas, release the stage and fold.
//
// Other architectures: not launched (the host refuses V7 off sm_90; the
// entry traps). Before the PDL wait each CTA asks L2 for the first chunks
// of its first item's weight rows, as V2's dense kernels do.
#include <cuda_bf16.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

namespace skinny_v7 {

constexpr int kConsumers = 4;                   // consumer warps: one warpgroup
constexpr int kThreads = (kConsumers + 1) * 32;  // + the producer warp
constexpr int kBox = 64 * 128;                  // one stage: 64 rows x 128 bytes
constexpr int kMaxStages = 16;

// Shared-memory carve-up from a 1024-byte aligned base (the host twin is
// `v7_layout` in src/cuda_backend/gemm_skinny.rs, which adds 1024 bytes of
// slack for the alignment): full [16] and empty [16] barriers, the tokens
// (cps chunks of NT rows x 128 bytes, 1024-aligned), their fp32 scales
// [4 cps][NT], then the stages (1024-aligned, 8 KiB each).
struct Layout {
    int tok, tok_s, stages;
    __host__ __device__ Layout(int nt, int cps) {
        tok = 1024;
        tok_s = tok + cps * nt * 128;
        stages = (tok_s + cps * 4 * nt * 4 + 1023) & ~1023;
    }
};

}  // namespace skinny_v7

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace skinny_v7 {

using namespace deepinfer::sm90;

__device__ __forceinline__ void consumer_sync(uint32_t id) { bar_sync(id, kConsumers * 32); }

// sum_tile_splits (gemm_skinny.cu) strides over V2's CTA: the consumers.
static_assert(kConsumers * 32 == ::kThreads, "the consumers are one V2 CTA's threads");

// This thread's weight scales of chunk c for its two rows (f0, f0 + 8 of the
// tile): byte j of each word is K block 4c + j, 0 past K or N (and then the
// fold multiplies by scale 0, as V2's store_scales).
struct RowScales {
    uint32_t r0, r8;
};

__device__ __forceinline__ RowScales row_scales(const di_gemm_skinny_params &p, int n0, int f0, int c, int kbs) {
    RowScales s{0u, 0u};
    const uint8_t *ws = static_cast<const uint8_t *>(p.b_scale);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int f = n0 + f0 + 8 * h;
        if (f >= p.n) continue;
        const uint8_t *row = ws + int64_t(f / 32) * kbs;
        uint32_t v = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int kb = 4 * c + j;
            if (kb < kbs) v |= uint32_t(__ldg(row + kb)) << (8 * j);
        }
        (h == 0 ? s.r0 : s.r8) = v;
    }
    return s;
}

__device__ __forceinline__ float scale_of(uint32_t word, int j) {
    // Rows past N and blocks past K carry byte 0 but must fold with scale
    // 0.0, not 2^-127: the caller passes `valid`.
    return deepinfer::e8m0_to_f32((word >> (8 * j)) & 0xFFu);
}

// Stages the item's tokens (chunks [c0, c1)) as wgmma B tiles: tile q (K
// 128 (c0 + q) ..) holds NT rows of 128 bytes (rows 8.. 1024 bytes after
// rows 0..7), 16-byte piece j of row t at piece j ^ (t % 8); rows past M
// and bytes past K zero. Then the fp32 scales [4 q + j][t] (0 past M or
// past K). The 128 consumer threads.
template <int NT>
__device__ __forceinline__ void stage_tokens(const di_gemm_skinny_params &p, int c0, int c1, uint8_t *tok,
                                             float *tok_s) {
    const int tid = threadIdx.x, kbs = (p.k + 31) / 32;
    const uint8_t *a = static_cast<const uint8_t *>(p.a);
    const uint8_t *as = static_cast<const uint8_t *>(p.a_scale);
    const int pieces = (c1 - c0) * NT * 8;
    for (int q = tid; q < pieces; q += kConsumers * 32) {
        const int j = q % 8, t = (q / 8) % NT, tile = q / (8 * NT);
        const int k0 = 128 * (c0 + tile) + 16 * j;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < p.m && k0 < p.k) v = *reinterpret_cast<const uint4 *>(a + int64_t(t) * p.k + k0);
        *reinterpret_cast<uint4 *>(tok + tile * NT * 128 + t * 128 + ((j ^ (t & 7)) * 16)) = v;
    }
    const int blocks = (c1 - c0) * 4;
    for (int q = tid; q < blocks * NT; q += kConsumers * 32) {
        const int t = q % NT, b = q / NT, kb = 4 * c0 + b;
        tok_s[q] = t < p.m && kb < kbs ? deepinfer::e8m0_to_f32(as[int64_t(t) * kbs + kb]) : 0.0f;
    }
}

template <int NT> __device__ void dense_v7_sm90(const di_skinny_v7_params &pm) {
    const di_gemm_skinny_params &p = pm.p;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const int cps = p.chunks_per_split, nch = (p.k + 127) / 128, kbs = (p.k + 31) / 32;
    const int tiles = (p.n + 63) / 64, splits = (nch + cps - 1) / cps, items = tiles * splits;
    const Layout L(NT, cps);
    const int S = min(kMaxStages, int((skinny_v3::dynamic_smem_bytes() - 1024 - uint32_t(L.stages)) / kBox));
    uint64_t *full = reinterpret_cast<uint64_t *>(smem);
    uint64_t *empty = full + kMaxStages;
    uint8_t *tok = smem + L.tok;
    float *tok_s = reinterpret_cast<float *>(smem + L.tok_s);
    uint8_t *stage0 = smem + L.stages;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kConsumers);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warp == kConsumers) {
        if (lane != 0) return;
        tma_prefetch_map(&pm.b_map);
        int s = 0;
        uint32_t round = 0;
        for (int i = blockIdx.x; i < items; i += gridDim.x) {
            const int n0 = (i % tiles) * 64, c0 = (i / tiles) * cps, c1 = min(nch, c0 + cps);
            for (int c = c0; c < c1; ++c) {
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1u);
                mbar_arrive_expect_tx(&full[s], uint32_t(kBox));
                tma_load_2d(stage0 + s * kBox, &pm.b_map, &full[s], c * 128, n0);
                if (++s == S) {
                    s = 0;
                    ++round;
                }
            }
        }
        return;
    }

    // Consumers: thread (warp w, lane) holds tile rows f0 = 16 w + lane / 4
    // and f0 + 8, tokens 8 h + 2 (lane % 4) + {0, 1} (h < NT / 8).
    using Mma = WgmmaE4M3<NT>;
    const int f0 = 16 * warp + (lane >> 2), t0 = 2 * (lane & 3);
    int s = 0;
    uint32_t phase = 0;
    for (int i = blockIdx.x; i < items; i += gridDim.x) {
        const int tile = i % tiles, split = i / tiles, n0 = tile * 64;
        const int c0 = split * cps, c1 = min(nch, c0 + cps);
        consumer_sync(1);  // the previous item's wgmmas have read the tokens
        stage_tokens<NT>(p, c0, c1, tok, tok_s);
        fence_proxy_async_smem();  // the tokens are read by wgmma
        consumer_sync(1);
        float acc[NT / 2];
#pragma unroll
        for (int x = 0; x < NT / 2; ++x) acc[x] = 0.0f;
        RowScales next = row_scales(p, n0, f0, c0, kbs);
        const bool v0 = n0 + f0 < p.n, v8 = n0 + f0 + 8 < p.n;
        for (int c = c0; c < c1; ++c) {
            const RowScales cur = next;
            if (c + 1 < c1) next = row_scales(p, n0, f0, c + 1, kbs);
            mbar_wait(&full[s], phase);
            const uint64_t da = smem_desc_k128(stage0 + s * kBox);
            const uint64_t db = smem_desc_k128(tok + (c - c0) * NT * 128);
            float d[4][NT / 2];
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j) Mma::mma_fresh(d[j], da + 2 * j, db + 2 * j);
            wgmma_commit();
            wgmma_wait<0>();
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with the stage
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                fence_operands(d[j]);
                const int kb = 4 * c + j;
                const bool kin = kb < kbs;
                const float sw0 = v0 && kin ? scale_of(cur.r0, j) : 0.0f;
                const float sw8 = v8 && kin ? scale_of(cur.r8, j) : 0.0f;
#pragma unroll
                for (int h = 0; h < NT / 8; ++h) {
                    const float2 sx =
                        *reinterpret_cast<const float2 *>(tok_s + (4 * (c - c0) + j) * NT + 8 * h + t0);
                    acc[4 * h + 0] = fmaf(d[j][4 * h + 0], sw0 * sx.x, acc[4 * h + 0]);
                    acc[4 * h + 1] = fmaf(d[j][4 * h + 1], sw0 * sx.y, acc[4 * h + 1]);
                    acc[4 * h + 2] = fmaf(d[j][4 * h + 2], sw8 * sx.x, acc[4 * h + 2]);
                    acc[4 * h + 3] = fmaf(d[j][4 * h + 3], sw8 * sx.y, acc[4 * h + 3]);
                }
            }
            if (++s == S) {
                s = 0;
                phase ^= 1u;
            }
        }

        // Out: the tile directly (one split), else this split's fp32 partials
        // and the ticket; the last split of the tile sums them in order.
        const bool direct = splits == 1;
#pragma unroll
        for (int h = 0; h < NT / 2; ++h) {
            const int t = 8 * (h / 4) + t0 + (h & 1), f = n0 + f0 + 8 * ((h >> 1) & 1);
            if (t >= p.m || f >= p.n) continue;
            const int64_t at = int64_t(t) * p.n + f;
            if (!direct) {
                p.workspace[int64_t(split) * p.m * p.n + at] = acc[h];
            } else if (p.out_f32) {
                static_cast<float *>(p.out)[at] = acc[h];
            } else {
                static_cast<__nv_bfloat16 *>(p.out)[at] = __float2bfloat16_rn(acc[h]);
            }
        }
        if (direct) continue;
        __threadfence();  // release: the partials are visible before the ticket
        consumer_sync(1);
        const bool mine = tid == 0 && atomicAdd(p.tickets + tile, 1u) == uint32_t(splits - 1);
        if (!bar_or(2, kConsumers * 32, mine)) continue;
        __threadfence();  // acquire: the other splits' partials are read after it
        sum_tile_splits(p, 0, p.m, n0, splits);  // V2's sum; the consumers are threads 0..127
        if (tid == 0) p.tickets[tile] = 0u;      // ready for the next launch
    }
}

}  // namespace skinny_v7
#endif

// The L2 prefetch before the PDL wait (as V2's dense_prefetch): the weight
// rows of this CTA's first item, its first chunks, about kPrefetchBudget
// bytes a launch in all (at least one chunk a row). One thread a row.
__device__ __forceinline__ void v7_prefetch(const di_skinny_v7_params &pm) {
    const int tiles = (pm.p.n + 63) / 64;
    prefetch_tile_rows(pm.p, (int(blockIdx.x) % tiles) * 64, int(blockIdx.x) / tiles, gridDim.x);
}

// M <= 8 (2 to 4 CTAs an SM) and M <= 16 (2 or 3): the host sizes the
// stages and the grid. The host launches them on sm_90 only: other
// architectures trap.
extern "C" __global__ void __launch_bounds__(skinny_v7::kThreads, 4)
    mxfp8_gemm_skinny_v7_n8(const __grid_constant__ di_skinny_v7_params p) {
    DI_PDL_PREFETCH_ENTRY(v7_prefetch(p));
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    skinny_v7::dense_v7_sm90<8>(p);
#else
    __trap();
#endif
}
extern "C" __global__ void __launch_bounds__(skinny_v7::kThreads, 3)
    mxfp8_gemm_skinny_v7_n16(const __grid_constant__ di_skinny_v7_params p) {
    DI_PDL_PREFETCH_ENTRY(v7_prefetch(p));
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    skinny_v7::dense_v7_sm90<16>(p);
#else
    __trap();
#endif
}
