// Skinny block-scaled GEMMs for decode (M <= 64 tokens): memory-bound, so the
// design streams the weights once at full bandwidth and keeps every SM busy.
//
//   mxfp8_gemm_skinny_*:   out[M, N] = A[M, K] (e4m3, 1x32 E8M0 scales)
//                          x B[N, K]^T (e4m3, 32x32 E8M0 scales); M in 1..64.
//   mxfp4_grouped_masked_*: per expert e, out[e, :count_e, N] = A[e, :count_e, K]
//                          x B[e, N, K]^T (packed e2m1, E8M0 per row per 32).
//   mxfp8_gemm_skinny_reduce: out = sum over splits of f32 partials, in split order.
//
// Numerics (src/cpu_backend/gemm.rs): each 32-deep K block is one wgmma k-step
// whose fp32 tile is folded into the master accumulator as
// acc = fma(tile, a_s * b_s, acc), blocks in increasing K order. With split-K
// (dense only) each split accumulates its own K range that way and the reduce
// kernel adds the splits in order 0, 1, ...; the split count depends on N and K
// only, so results do not depend on M.
//
// sm_90a (Hopper): operands are swapped so the weights fill wgmma's M = 64 side
// (64 output features per CTA) and the tokens its N side (8, 16, 32 or 64,
// from the row count). One warpgroup per CTA. K is streamed in chunks of 128
// through kStages shared-memory stages filled by cp.async (16-byte copies into
// the 128-byte-swizzled K-major layout of sm90.cuh; zero-filled outside the
// matrix). FP4 weights land raw (8-byte copies) and are decoded e2m1 -> e4m3
// into one swizzled tile just before their wgmmas. Scales are prefetched a
// stage ahead into registers and written to shared memory as fp32.
//
// Other architectures (sm_100a until tcgen05 block-scaled MMA is written): the
// same entry points run a SIMT path, one thread per output, that follows the
// CPU reference order exactly (fp32 products summed in k order per block).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

namespace {

using deepinfer::e2m1x8_to_e4m3x8;
using deepinfer::e8m0_to_f32;

constexpr int kThreads = 128;     // one warpgroup
constexpr int kTileN = 64;        // output features per CTA (wgmma M)
constexpr int kChunkK = 128;      // K per pipeline stage (one 128-byte e4m3 row)
constexpr int kBlocksPerChunk = kChunkK / 32;
constexpr int kStages = 5;        // cp.async stages (kStages - 1 chunks in flight)

// Shared-memory layout of one launch, a function of the FP4 flag and the
// launch's largest token tile only. Host twin: src/cuda_backend/gemm_skinny.rs
// (smem_bytes). Per stage: weights (FP8: 64 x 128 B swizzled; FP4: 64 x 64 B
// raw), tokens (nt_max x 128 B swizzled), weight scales f32 [4][64], token
// scales f32 [4][nt_max]; stages 1024-byte aligned. FP4 adds one decoded
// 64 x 128 B weight tile after the stages.
// Version 2 (V2) packs tighter: the stages hold only weights and tokens
// (already multiples of 1024 bytes), the fp32 scales of all stages follow
// in a dense ring (1024 + 16 nt_max bytes a stage, no 1 KiB padding), and
// the dense 16- and 32-token tiles run 4 stages, so that 4 CTAs fit an SM:
// dense n8/n16/n32 52/46/55 KiB, FP4 n8/n16/n32 40/46/57 KiB (+1 KiB slack).
template <bool FP4, int NT_MAX, bool V2 = false> struct Layout {
    static constexpr int stages = V2 && !FP4 && NT_MAX >= 16 ? 4 : kStages;
    static constexpr int nt_max = NT_MAX;
    static constexpr uint32_t x_off = FP4 ? 4096u : 8192u;
    static constexpr uint32_t data_bytes = x_off + uint32_t(NT_MAX) * 128u;
    static constexpr uint32_t scale_bytes = 4u * kTileN * 4u + 16u * uint32_t(NT_MAX);
    static constexpr uint32_t stage_bytes =
        V2 ? data_bytes : (data_bytes + scale_bytes + 1023u) & ~1023u;
    // Stage s's weight scales at scw0 + s * sc_stride, its token scales
    // scx_rel bytes after them.
    static constexpr uint32_t scw0 = V2 ? stages * stage_bytes : data_bytes;
    static constexpr uint32_t sc_stride = V2 ? scale_bytes : stage_bytes;
    static constexpr uint32_t scx_rel = 4u * kTileN * 4u;
    static constexpr uint32_t dec_off =
        ((V2 ? scw0 + stages * scale_bytes : stages * stage_bytes) + 1023u) & ~1023u;
    static constexpr uint32_t bytes = 1024u + dec_off + (FP4 ? 8192u : 0u);
    static_assert(data_bytes % 1024u == 0u, "swizzled tiles need 1024-byte alignment");
};

// One 64-feature x (up to 64)-token output tile over a range of K chunks.
struct Tile {
    const uint8_t *w;   // weight row r at w + r * w_row (e4m3: k bytes, FP4: k / 2)
    const uint8_t *ws;  // weight scales (dense: [ceil(n/32)][kbs], FP4: [n][kbs])
    const uint8_t *x;   // token t at x + t * k
    const uint8_t *xs;  // token t's scales at xs + t * kbs
    void *out;          // element (t, f) at out[t * n + f]
    int n0, n, k, kbs;  // first feature, features, K, ceil(K / 32)
    int rows;           // valid tokens, 1..64
    int chunk_begin, chunk_end;
    bool out_f32;
};

__device__ __forceinline__ void store_out(const Tile &t, int tok, int f, float v) {
    if (tok < t.rows && f < t.n) {
        const int64_t at = int64_t(tok) * t.n + f;
        if (t.out_f32) {
            static_cast<float *>(t.out)[at] = v;
        } else {
            static_cast<__nv_bfloat16 *>(t.out)[at] = __float2bfloat16_rn(v);
        }
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace deepinfer::sm90;

// The host twin (smem_bytes in src/cuda_backend/gemm_skinny.rs) computes the
// same sizes; these pin both to the same numbers.
static_assert(Layout<false, 8>::bytes == 57344u && Layout<false, 16>::bytes == 62464u &&
                  Layout<false, 32>::bytes == 72704u && Layout<false, 64>::bytes == 93184u,
              "V1 dense layout sizes");
static_assert(Layout<true, 8>::bytes == 45056u && Layout<true, 16>::bytes == 50176u &&
                  Layout<true, 32>::bytes == 60416u && Layout<true, 64>::bytes == 80896u,
              "V1 FP4 layout sizes");
static_assert(Layout<false, 8, true>::bytes == 53248u && Layout<false, 16, true>::bytes == 47104u &&
                  Layout<false, 32, true>::bytes == 56320u,
              "V2 dense layout sizes");
static_assert(Layout<true, 8, true>::bytes == 40960u && Layout<true, 16, true>::bytes == 47104u &&
                  Layout<true, 32, true>::bytes == 58368u,
              "V2 FP4 layout sizes");

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 8 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4);
}

// Per-thread copy plan of a tile, computed once so that a chunk's copies
// cost a few adds each. Thread tid copies the 16-byte (FP4: 8-byte) piece
// j = tid % 8 of weight rows tid / 8 + 16 i (i < 4) and of token rows
// tid / 8 + 16 i (i < XI); the swizzle term j ^ (row % 8) is the same for all
// i. Pieces outside the matrix are zero-filled from a valid address.
// It also owns one scale row: weight row tid (tid < 64) or token tid - 64.
template <bool FP4, int NT, class L> struct Loader {
    static constexpr int kXI = (NT * 8 + kThreads - 1) / kThreads;  // token pieces per thread
    static constexpr int kRowBytesShift = FP4 ? 1 : 0;             // K elements -> bytes
    const uint8_t *w_src, *x_src, *s_src, *w_base, *x_base;
    int64_t w_step, x_step;
    uint32_t w_dst, x_dst;
    uint32_t w_valid, x_valid;  // bit i: row i exists
    int kpiece;                 // K offset of this thread's piece in a chunk
    int kbs;
    float *s_dst;
    int s_stride;
    bool s_valid;

    __device__ Loader(const Tile &t, uint8_t *smem0) {
        const int tid = threadIdx.x, r0 = tid >> 3, j = tid & 7;
        const int64_t row_bytes = int64_t(t.k) >> kRowBytesShift;
        kpiece = 16 * j;
        kbs = t.kbs;
        w_base = t.w;
        x_base = t.x;
        w_valid = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) w_valid |= uint32_t(t.n0 + r0 + 16 * i < t.n) << i;
        w_src = t.w + int64_t(min(t.n0 + r0, t.n - 1)) * row_bytes + (kpiece >> kRowBytesShift);
        w_step = 16 * row_bytes;
        w_dst = FP4 ? uint32_t(r0 * 64 + j * 8) : swz(r0, j);
        x_valid = 0;
#pragma unroll
        for (int i = 0; i < kXI; ++i) {
            const int r = r0 + 16 * i;
            x_valid |= uint32_t(tid + kThreads * i < NT * 8 && r < t.rows) << i;
        }
        x_src = t.x + int64_t(min(r0, t.rows - 1)) * t.k + kpiece;
        x_step = 16 * int64_t(t.k);
        x_dst = L::x_off + swz(r0, j);
        if (tid < kTileN) {
            const int f = t.n0 + tid;
            s_valid = f < t.n;
            s_src = t.ws + (FP4 ? int64_t(min(f, t.n - 1)) : int64_t(min(f, t.n - 1) / 32)) * t.kbs;
            s_dst = reinterpret_cast<float *>(smem0 + L::scw0) + tid;
            s_stride = kTileN;
        } else {
            const int tok = tid - kTileN;
            s_valid = tok < NT && tok < t.rows;
            s_src = t.xs + int64_t(min(tok, t.rows - 1)) * t.kbs;
            s_dst = reinterpret_cast<float *>(smem0 + L::scw0 + L::scx_rel) + tok;
            s_stride = L::nt_max;
        }
    }

    // cp.async copies of chunk c into the stage at shared address `st`.
    __device__ __forceinline__ void issue(uint32_t st, int c, int k) const {
        const bool kin = c * kChunkK + kpiece < k;
        const uint8_t *row = w_src + int64_t(c) * (kChunkK >> kRowBytesShift);
#pragma unroll
        for (int i = 0; i < 4; ++i, row += w_step) {
            const bool v = kin && ((w_valid >> i) & 1u);
            const uint8_t *src = v ? row : w_base;
            if (FP4) {
                cp_async8(st + w_dst + 1024u * i, src, v);
            } else {
                cp_async16(st + w_dst + 2048u * i, src, v);
            }
        }
        const uint8_t *tok = x_src + int64_t(c) * kChunkK;
#pragma unroll
        for (int i = 0; i < kXI; ++i, tok += x_step) {
            if (NT * 8 >= kThreads * (i + 1) || threadIdx.x + kThreads * i < NT * 8) {
                const bool v = kin && ((x_valid >> i) & 1u);
                const uint8_t *src = v ? tok : x_base;
                cp_async16(st + x_dst + 2048u * i, src, v);
            }
        }
    }

    // This thread's four scale bytes of chunk c, byte j = K block 4c + j
    // (0 past the last block).
    __device__ __forceinline__ uint32_t load_scales(int c) const {
        uint32_t v = 0;
        if (s_valid) {
#pragma unroll
            for (int j = 0; j < kBlocksPerChunk; ++j) {
                const int kb = c * kBlocksPerChunk + j;
                if (kb < kbs) v |= uint32_t(__ldg(s_src + kb)) << (8 * j);
            }
        }
        return v;
    }

    // Writes them as fp32 into the stage whose scales lie `stage_off` bytes
    // after stage 0's (a multiple of L::sc_stride); K blocks past the end (and missing rows) get scale 0, so their
    // zero tiles add exactly +0.
    __device__ __forceinline__ void store_scales(uint32_t stage_off, uint32_t v, int c) const {
        if (threadIdx.x >= kTileN + NT) return;
        float *dst = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(s_dst) + stage_off);
        const int blocks = kbs - c * kBlocksPerChunk;
#pragma unroll
        for (int j = 0; j < kBlocksPerChunk; ++j) {
            dst[j * s_stride] = s_valid && j < blocks ? e8m0_to_f32((v >> (8 * j)) & 0xFFu) : 0.0f;
        }
    }
};

// Decodes the raw FP4 weights of `stage` (64 rows x 64 B) into the swizzled
// e4m3 tile `dec` (64 rows x 128 B).
struct DecodeTables {
    uint32_t lo, hi, sign;
};

__device__ __forceinline__ void decode_fp4(const uint8_t *stage, uint8_t *dec,
                                           const DecodeTables &tb) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int q = tid + kThreads * i;
        const int r = q >> 3, j = q & 7;
        const uint2 raw = *reinterpret_cast<const uint2 *>(stage + r * 64 + j * 8);
        const uint2 a = e2m1x8_to_e4m3x8(raw.x, tb.lo, tb.hi, tb.sign);
        const uint2 b = e2m1x8_to_e4m3x8(raw.y, tb.lo, tb.hi, tb.sign);
        *reinterpret_cast<uint4 *>(dec + swz(r, j)) = make_uint4(a.x, a.y, b.x, b.y);
    }
}

// Folds one k32 tile into the master accumulator: acc += tile * (w_s * x_s).
// Thread layout of the 64 x NT wgmma accumulator: feature 16 * warp + lane / 4
// (+ 8 for registers 2, 3 of each quad), token 8 * i + 2 * (lane % 4) (+ 1).
template <int NT>
__device__ __forceinline__ void promote(float (&acc)[NT / 2], float (&tile)[NT / 2],
                                        const float *scw, const float *scx) {
    const int lane = threadIdx.x & 31, f0 = 16 * (threadIdx.x >> 5) + (lane >> 2);
    const float sw0 = scw[f0], sw1 = scw[f0 + 8];
#pragma unroll
    for (int i = 0; i < NT / 8; ++i) {
        const float2 sx = *reinterpret_cast<const float2 *>(scx + 8 * i + 2 * (lane & 3));
        acc[4 * i + 0] = fmaf(tile[4 * i + 0], sw0 * sx.x, acc[4 * i + 0]);
        acc[4 * i + 1] = fmaf(tile[4 * i + 1], sw0 * sx.y, acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(tile[4 * i + 2], sw1 * sx.x, acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(tile[4 * i + 3], sw1 * sx.y, acc[4 * i + 3]);
    }
}

// DEFER (version 2): a prefetched chunk's scales are stored two iterations
// after the one that loads them (a two-deep register queue), so the global
// load (DRAM for the FP4 experts' scales, which nothing else prefetches) has
// three rounds of wgmmas to land instead of one; version 1 stores them in
// the iteration that loads them.
template <bool FP4, int NT, int NT_MAX, bool DEFER>
__device__ void tile_mma(const Tile &t, uint8_t *smem) {
    using L = Layout<FP4, NT_MAX, DEFER>;
    constexpr int kSt = L::stages;
    using Mma = WgmmaE4M3<NT>;
    static_assert(L::bytes <= 227u * 1024u, "the layout exceeds the shared memory of an SM");
    // The previous tile of this CTA may still be reading its last stage.
    __syncthreads();
    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    const int nch = t.chunk_end - t.chunk_begin;
    const Loader<FP4, NT, L> ld(t, smem);
    const uint32_t s0 = smem_u32(smem);

#pragma unroll
    for (int s = 0; s < kSt - 1; ++s) {
        if (s < nch) {
            const int c = t.chunk_begin + s;
            ld.issue(s0 + s * L::stage_bytes, c, t.k);
            ld.store_scales(s * L::sc_stride, ld.load_scales(c), c);
        }
        cp_async_commit();
    }

    uint8_t *dec = smem + L::dec_off;
    float tile[2][NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) tile[0][i] = tile[1][i] = 0.0f;
    const DecodeTables tables{deepinfer::opaque_u32(0x3C383000u), deepinfer::opaque_u32(0x4C484440u), deepinfer::opaque_u32(0x80808080u)};
    uint32_t slot = 0, pslot = (kSt - 1) * L::stage_bytes;  // byte offsets
    // The same stages' scales (V2; in V1 they equal slot, pslot).
    uint32_t sslot = 0, psslot = (kSt - 1) * L::sc_stride;
    // DEFER: scales loaded one (h0) and two (h1) iterations ago: value, stage
    // offset, chunk (< 0: none).
    uint32_t hv0 = 0, hslot0 = 0, hv1 = 0, hslot1 = 0;
    int hc0 = -1, hc1 = -1;
    for (int i = 0; i < nch; ++i) {
        uint8_t *st = smem + slot;
        cp_async_wait<kSt - 2>();      // this thread's copies of chunk i landed
        fence_proxy_async_smem();      // ... and are visible to wgmma
        __syncthreads();               // everyone's copies; chunk i - 1 fully consumed

        const int pf = i + kSt - 1, pc = t.chunk_begin + pf;
        if (pf < nch) ld.issue(s0 + pslot, pc, t.k);
        cp_async_commit();

        const uint8_t *wt = st;
        if (FP4) {
            decode_fp4(st, dec, tables);
            fence_proxy_async_smem();
            __syncthreads();
            wt = dec;
        }
        // The prefetched chunk's scales: loaded after the last proxy fence of
        // this iteration (a fence never waits on them), stored after the
        // wgmmas, read kSt - 1 iterations later.
        const uint32_t pv = pf < nch ? ld.load_scales(pc) : 0u;
        const uint64_t da = smem_desc_k128(wt), db = smem_desc_k128(st + L::x_off);
        // (V1: the scales sit inside the stage, at st + scw0.)
        const uint8_t *sc = DEFER ? smem + L::scw0 + sslot : st + L::scw0;
        const float *scw = reinterpret_cast<const float *>(sc);
        const float *scx = reinterpret_cast<const float *>(sc + L::scx_rel);

        // Two fresh tiles alternate: the wgmma of k-step j runs while k-step
        // j - 1 is promoted. Every chunk runs its 4 k-steps (a K block past
        // the end is zero data with zero scales, adding exactly +0), so no
        // wgmma sits on a data-dependent branch. Descriptor addresses count
        // 16-byte units: one k-step is 32 bytes.
#pragma unroll
        for (int j = 0; j < kBlocksPerChunk; ++j) {
            fence_operands(tile[j & 1]);
            wgmma_fence();
            Mma::mma(tile[j & 1], da + 2 * j, db + 2 * j, 0);
            wgmma_commit();
            if (j >= 1) {
                wgmma_wait<1>();
                fence_operands(tile[(j - 1) & 1]);
                promote<NT>(acc, tile[(j - 1) & 1], scw + (j - 1) * kTileN,
                            scx + (j - 1) * NT_MAX);
            }
        }
        wgmma_wait<0>();
        fence_operands(tile[(kBlocksPerChunk - 1) & 1]);
        promote<NT>(acc, tile[(kBlocksPerChunk - 1) & 1], scw + (kBlocksPerChunk - 1) * kTileN,
                    scx + (kBlocksPerChunk - 1) * NT_MAX);
        if constexpr (DEFER) {
            // Chunk hc1 (= this chunk + 2) is read two iterations from now,
            // after barriers; its stage is neither this chunk's, nor the next
            // one's, nor the one the copies just issued target.
            static_assert(kSt >= 4, "the deferred scales need two stages of lead");
            if (hc1 >= 0) ld.store_scales(hslot1, hv1, hc1);
            hv1 = hv0;
            hslot1 = hslot0;
            hc1 = hc0;
            hv0 = pv;
            hslot0 = psslot;
            hc0 = pf < nch ? pc : -1;
        } else {
            if (pf < nch) ld.store_scales(pslot, pv, pc);
        }
        slot = slot == (kSt - 1) * L::stage_bytes ? 0 : slot + L::stage_bytes;
        pslot = pslot == (kSt - 1) * L::stage_bytes ? 0 : pslot + L::stage_bytes;
        sslot = sslot == (kSt - 1) * L::sc_stride ? 0 : sslot + L::sc_stride;
        psslot = psslot == (kSt - 1) * L::sc_stride ? 0 : psslot + L::sc_stride;
    }

    const int lane = threadIdx.x & 31, f0 = 16 * (threadIdx.x >> 5) + (lane >> 2);
#pragma unroll
    for (int i = 0; i < NT / 8; ++i) {
        const int tok = 8 * i + 2 * (lane & 3);
        store_out(t, tok, t.n0 + f0, acc[4 * i + 0]);
        store_out(t, tok + 1, t.n0 + f0, acc[4 * i + 1]);
        store_out(t, tok, t.n0 + f0 + 8, acc[4 * i + 2]);
        store_out(t, tok + 1, t.n0 + f0 + 8, acc[4 * i + 3]);
    }
}

// 1024-byte-aligned start of the dynamic shared memory (the launch adds 1024
// bytes of slack).
__device__ __forceinline__ uint8_t *aligned_smem() {
    extern __shared__ __align__(1024) uint8_t dyn_smem[];
    const uint32_t a = smem_u32(dyn_smem);
    return dyn_smem + (((a + 1023u) & ~1023u) - a);
}

__device__ __forceinline__ int token_tile(int rows) {
    return rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
}

// Runs a tile with the smallest token tile (8, 16, 32, 64; at most NT_MAX)
// that holds its rows, in the shared-memory layout of NT_MAX.
template <bool FP4, int NT_MAX, bool V2 = false> __device__ void run_tile(const Tile &t) {
    uint8_t *smem = aligned_smem();
    const int nt = token_tile(t.rows);
    if constexpr (NT_MAX >= 64) {
        if (nt == 64) return tile_mma<FP4, 64, NT_MAX, V2>(t, smem);
    }
    if constexpr (NT_MAX >= 32) {
        if (nt == 32) return tile_mma<FP4, 32, NT_MAX, V2>(t, smem);
    }
    if constexpr (NT_MAX >= 16) {
        if (nt == 16) return tile_mma<FP4, 16, NT_MAX, V2>(t, smem);
    }
    tile_mma<FP4, 8, NT_MAX, V2>(t, smem);
}

#else  // SIMT path: one thread per output, the CPU reference's order.

// numerics.cuh's exact conversions (nibble `hi` of a packed e2m1 byte).
__device__ __forceinline__ float e4m3_to_f32(uint8_t v) { return deepinfer::e4m3_to_f32(v); }
__device__ __forceinline__ float e2m1_to_f32(uint8_t packed, int hi) {
    return deepinfer::e2m1_to_f32(hi ? packed >> 4 : packed & 0xFu);
}

template <bool FP4, int NT_MAX, bool V2 = false> __device__ void run_tile(const Tile &t) {
    const int kb_end = min(t.kbs, t.chunk_end * kBlocksPerChunk);
    for (int idx = threadIdx.x; idx < kTileN * t.rows; idx += kThreads) {
        const int f = t.n0 + idx % kTileN, tok = idx / kTileN;
        if (f >= t.n) continue;
        const uint8_t *xr = t.x + int64_t(tok) * t.k;
        const uint8_t *ws = t.ws + (FP4 ? int64_t(f) : int64_t(f / 32)) * t.kbs;
        float acc = 0.0f;
        for (int kb = t.chunk_begin * kBlocksPerChunk; kb < kb_end; ++kb) {
            float dot = 0.0f;
            for (int kk = kb * 32; kk < min(kb * 32 + 32, t.k); ++kk) {
                const float w = FP4 ? e2m1_to_f32(t.w[int64_t(f) * (t.k / 2) + kk / 2], kk & 1)
                                    : e4m3_to_f32(t.w[int64_t(f) * t.k + kk]);
                dot = __fadd_rn(dot, __fmul_rn(e4m3_to_f32(xr[kk]), w));
            }
            const float s = __fmul_rn(e8m0_to_f32(t.xs[int64_t(tok) * t.kbs + kb]),
                                      e8m0_to_f32(ws[kb]));
            acc = __fadd_rn(acc, __fmul_rn(dot, s));
        }
        store_out(t, tok, f, acc);
    }
}

#endif

// Before the PDL wait (DI_PDL_PREFETCH_ENTRY, pdl.cuh): the dense GEMM's
// weights are constants of the model, so a CTA asks L2 for the first whole
// chunks of its own share (rows n0..n0+63, its split's K chunks) while the
// kernel before it still runs: a launch asks for about kPrefetchBudget
// bytes in all, each CTA for at least one chunk a row (so more past 1,024
// CTAs). One thread a weight
// row, one bulk prefetch each; of a tile's token halves (V2, M 33..64) the
// first asks. Rows are 16-byte aligned (K % 16 == 0, as the loads need).
constexpr int64_t kPrefetchBudget = 8 << 20;

__device__ __forceinline__ void dense_prefetch(const di_gemm_skinny_params &p, int halves) {
    if (int(blockIdx.x) % halves != 0 || int(threadIdx.x) >= kTileN) return;
    const int row = (int(blockIdx.x) / halves) * kTileN + int(threadIdx.x);
    if (row >= p.n) return;
    const int nch = (p.k + kChunkK - 1) / kChunkK;
    const int c0 = min(nch, int(blockIdx.y) * p.chunks_per_split);
    const int c1 = min(nch, c0 + p.chunks_per_split);
    const int64_t ctas = int64_t(gridDim.x / halves) * gridDim.y;
    const int chunks = max(1, int(kPrefetchBudget / (ctas * kTileN * kChunkK)));
    const int64_t begin = int64_t(c0) * kChunkK;
    const int64_t end = min(int64_t(p.k), int64_t(min(c1, c0 + chunks)) * kChunkK);
    if (end <= begin) return;
    deepinfer::pdl_prefetch_l2(static_cast<const uint8_t *>(p.b) + int64_t(row) * p.k + begin,
                               uint32_t(end - begin));
}

// Dense: grid (ceil(n / 64), splits). Split y covers K chunks
// [y * chunks_per_split, min((y + 1) * chunks_per_split, ceil(k / 128))) and,
// when there are several splits, writes f32 partials to out + y * m * n.
template <int NT_MAX> __device__ void dense(const di_gemm_skinny_params &p) {
    const int nch = (p.k + kChunkK - 1) / kChunkK;
    Tile t;
    t.w = static_cast<const uint8_t *>(p.b);
    t.ws = static_cast<const uint8_t *>(p.b_scale);
    t.x = static_cast<const uint8_t *>(p.a);
    t.xs = static_cast<const uint8_t *>(p.a_scale);
    t.n0 = blockIdx.x * kTileN;
    t.n = p.n;
    t.k = p.k;
    t.kbs = (p.k + 31) / 32;
    t.rows = min(p.m, NT_MAX);
    t.chunk_begin = min(nch, int(blockIdx.y) * p.chunks_per_split);
    t.chunk_end = min(nch, t.chunk_begin + p.chunks_per_split);
    t.out_f32 = p.out_f32 != 0;
    t.out = p.out_f32 ? static_cast<void *>(static_cast<float *>(p.out) +
                                            int64_t(blockIdx.y) * p.m * p.n)
                      : p.out;
    run_tile<false, NT_MAX>(t);
}

// Masked FP4 experts: grid (ceil(n / 64), groups). The experts with a nonzero
// count (clamped to [0, m]) are ranked in expert order; CTA (x, g) takes those
// of rank g, g + groups, ..., so empty experts cost one count read per CTA.
// Each expert's rows are done in blocks of 64 with the token tile sized to
// the block.
template <int NT_MAX> __device__ void masked(const di_gemm_skinny_params &p) {
    __shared__ int list_e[kThreads];
    __shared__ int list_c[kThreads];
    __shared__ int warp_active[kThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int groups = gridDim.y, g = blockIdx.y;
    const int kbs = (p.k + 31) / 32;
    // Members of this CTA's residue class among ranks [0, r).
    auto below = [&](int r) { return r > g ? (r - g + groups - 1) / groups : 0; };
    int seen = 0;
    for (int e0 = 0; e0 < p.experts; e0 += kThreads) {
        const int e = e0 + tid;
        const int c = e < p.experts ? max(0, min(p.m, p.counts[e])) : 0;
        const unsigned act = __ballot_sync(0xFFFFFFFFu, c > 0);
        if (lane == 0) warp_active[warp] = __popc(act);
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) {
            before += w < warp ? warp_active[w] : 0;
            total += warp_active[w];
        }
        const int rank = seen + before + __popc(act & ((1u << lane) - 1u));
        if (c > 0 && rank >= g && (rank - g) % groups == 0) {
            const int pos = below(rank) - below(seen);
            list_e[pos] = e;
            list_c[pos] = c;
        }
        const int len = below(seen + total) - below(seen);
        __syncthreads();
        for (int i = 0; i < len; ++i) {
            const int ex = list_e[i], cnt = list_c[i];
            for (int r0 = 0; r0 < cnt; r0 += 64) {
                const int64_t row0 = int64_t(ex) * p.m + r0;
                Tile t;
                t.w = static_cast<const uint8_t *>(p.b) + int64_t(ex) * p.n * (p.k / 2);
                t.ws = static_cast<const uint8_t *>(p.b_scale) + int64_t(ex) * p.n * kbs;
                t.x = static_cast<const uint8_t *>(p.a) + row0 * p.k;
                t.xs = static_cast<const uint8_t *>(p.a_scale) + row0 * kbs;
                t.n0 = blockIdx.x * kTileN;
                t.n = p.n;
                t.k = p.k;
                t.kbs = kbs;
                t.rows = min(min(64, NT_MAX), cnt - r0);
                t.chunk_begin = 0;
                t.chunk_end = (p.k + kChunkK - 1) / kChunkK;
                t.out_f32 = p.out_f32 != 0;
                t.out = p.out_f32
                            ? static_cast<void *>(static_cast<float *>(p.out) + row0 * p.n)
                            : static_cast<void *>(static_cast<__nv_bfloat16 *>(p.out) + row0 * p.n);
                run_tile<true, NT_MAX>(t);
            }
        }
        seen += total;
        __syncthreads();  // list and warp counts are rewritten next round
    }
}

// ---- Version 2 -------------------------------------------------------------
// Same tiles and numerics as version 1; what changes is the work around them.

// Dense v2: grid (ceil(n / 64) * halves, splits). CTA x covers feature tile
// x / halves and token rows [32 * (x % halves), +32) (halves = 2 for m > 32,
// so the 33..64 range runs the 32-token tile at three CTAs per SM instead of
// the 64-token tile at two). With splits > 1 each CTA writes its f32 partials
// to workspace[y][m][n]; the last CTA of an output tile to finish (atomic
// ticket per tile) adds the splits in order 0, 1, ... from +0.0 -- the
// reduce kernel's exact sum -- writes the output and resets the ticket to 0.
template <int NT_MAX> __device__ void dense_v2(const di_gemm_skinny_params &p) {
    const int nch = (p.k + kChunkK - 1) / kChunkK;
    const int halves = p.token_halves;
    const int tile_x = int(blockIdx.x) / halves, row0 = (int(blockIdx.x) % halves) * NT_MAX;
    const int kbs = (p.k + 31) / 32;
    const int splits = int(gridDim.y);
    Tile t;
    t.w = static_cast<const uint8_t *>(p.b);
    t.ws = static_cast<const uint8_t *>(p.b_scale);
    t.x = static_cast<const uint8_t *>(p.a) + int64_t(row0) * p.k;
    t.xs = static_cast<const uint8_t *>(p.a_scale) + int64_t(row0) * kbs;
    t.n0 = tile_x * kTileN;
    t.n = p.n;
    t.k = p.k;
    t.kbs = kbs;
    t.rows = min(p.m - row0, NT_MAX);
    t.chunk_begin = min(nch, int(blockIdx.y) * p.chunks_per_split);
    t.chunk_end = min(nch, t.chunk_begin + p.chunks_per_split);
    t.out_f32 = splits > 1 || p.out_f32 != 0;
    t.out = splits > 1 ? static_cast<void *>(p.workspace + (int64_t(blockIdx.y) * p.m + row0) * p.n)
            : p.out_f32 ? static_cast<void *>(static_cast<float *>(p.out) + int64_t(row0) * p.n)
                        : static_cast<void *>(static_cast<__nv_bfloat16 *>(p.out) +
                                              int64_t(row0) * p.n);
    run_tile<false, NT_MAX, true>(t);
    if (splits == 1) return;

    // Release: every thread's partial stores are visible device-wide before
    // the ticket is taken. (No static shared memory: it would be padded to
    // 1 KiB by the 1024-aligned dynamic array and cost the n8 tile its 4th
    // CTA per SM.)
    __threadfence();
    __syncthreads();
    const bool mine = threadIdx.x == 0 &&
                      atomicAdd(p.tickets + blockIdx.x, 1u) == uint32_t(splits - 1);
    if (!__syncthreads_or(mine)) return;
    __threadfence();  // acquire: the other splits' partials are read after the ticket
    const int feats = min(kTileN, p.n - t.n0);
    for (int idx = threadIdx.x; idx < t.rows * kTileN; idx += kThreads) {
        const int tok = idx / kTileN, f = idx % kTileN;
        if (f >= feats) continue;
        const int64_t at = int64_t(row0 + tok) * p.n + t.n0 + f;
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) acc += __ldcg(p.workspace + int64_t(s) * p.m * p.n + at);
        if (p.out_f32) {
            static_cast<float *>(p.out)[at] = acc;
        } else {
            static_cast<__nv_bfloat16 *>(p.out)[at] = __float2bfloat16_rn(acc);
        }
    }
    if (threadIdx.x == 0) p.tickets[blockIdx.x] = 0u;  // ready for the next launch
}

// Masked v2: a persistent 1-D grid sized by the host to the resident CTAs
// (occupancy x SMs), so no CTA waits for a second wave. The work units are
// u = (rank * tiles + tile) * rblocks + rb over the experts with a nonzero
// (clamped) count, ranked in expert order, rb the expert's rb-th block of
// NT_MAX <= 32 rows (rblocks = ceil(max_m / NT_MAX); a block at or beyond
// the count is skipped); CTA c takes u = c, c + G, c + 2G, ... Consecutive
// CTAs thus share an expert (its token rows come once from DRAM) and the row
// blocks of one weight tile run side by side (its second read hits L2).
template <int NT_MAX> __device__ void masked_v2(const di_gemm_skinny_params &p) {
    static_assert(NT_MAX <= 32, "v2 runs at most 32-token tiles");
    __shared__ int list_e[kThreads];
    __shared__ int list_c[kThreads];
    __shared__ int warp_active[kThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t grid = gridDim.x, cta = blockIdx.x;
    const int64_t tiles = (p.n + kTileN - 1) / kTileN;
    const int64_t rblocks = (int64_t(p.m) + NT_MAX - 1) / NT_MAX;
    const int kbs = (p.k + 31) / 32;
    int64_t seen = 0;
    for (int e0 = 0; e0 < p.experts; e0 += kThreads) {
        const int e = e0 + tid;
        const int c = e < p.experts ? max(0, min(p.m, p.counts[e])) : 0;
        const unsigned act = __ballot_sync(0xFFFFFFFFu, c > 0);
        if (lane == 0) warp_active[warp] = __popc(act);
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) {
            before += w < warp ? warp_active[w] : 0;
            total += warp_active[w];
        }
        if (c > 0) {
            const int r = before + __popc(act & ((1u << lane) - 1u));
            list_e[r] = e;
            list_c[r] = c;
        }
        __syncthreads();
        const int64_t per = tiles * rblocks;
        const int64_t u_begin = seen * per, u_end = (seen + total) * per;
        for (int64_t u = u_begin + ((cta - u_begin % grid) + grid) % grid; u < u_end; u += grid) {
            const int r = int(u / per - seen), tile = int(u % per / rblocks);
            const int ex = list_e[r], cnt = list_c[r], r0 = int(u % rblocks) * NT_MAX;
            if (r0 < cnt) {
                const int64_t row0 = int64_t(ex) * p.m + r0;
                Tile t;
                t.w = static_cast<const uint8_t *>(p.b) + int64_t(ex) * p.n * (p.k / 2);
                t.ws = static_cast<const uint8_t *>(p.b_scale) + int64_t(ex) * p.n * kbs;
                t.x = static_cast<const uint8_t *>(p.a) + row0 * p.k;
                t.xs = static_cast<const uint8_t *>(p.a_scale) + row0 * kbs;
                t.n0 = tile * kTileN;
                t.n = p.n;
                t.k = p.k;
                t.kbs = kbs;
                t.rows = min(NT_MAX, cnt - r0);
                t.chunk_begin = 0;
                t.chunk_end = (p.k + kChunkK - 1) / kChunkK;
                t.out_f32 = p.out_f32 != 0;
                t.out = p.out_f32
                            ? static_cast<void *>(static_cast<float *>(p.out) + row0 * p.n)
                            : static_cast<void *>(static_cast<__nv_bfloat16 *>(p.out) + row0 * p.n);
                run_tile<true, NT_MAX, true>(t);
            }
        }
        seen += total;
        __syncthreads();  // list and warp counts are rewritten next round
    }
}

}  // namespace

// One entry per token tile: the suffix is the largest tile (and the shared-
// memory layout) of the launch; __launch_bounds__ follows the CTAs per SM
// that layout allows. Dense: m in (suffix / 2, suffix] (1..8 for _n8).
// Masked: min(max_m, 64) in that range; rows beyond 64 go in further blocks.
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp8_gemm_skinny_n8(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, 1));
    dense<8>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 3)
    mxfp8_gemm_skinny_n16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, 1));
    dense<16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 3)
    mxfp8_gemm_skinny_n32(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, 1));
    dense<32>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
    mxfp8_gemm_skinny_n64(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, 1));
    dense<64>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp4_grouped_masked_n8(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked<8>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 3)
    mxfp4_grouped_masked_n16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked<16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
    mxfp4_grouped_masked_n32(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked<32>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2)
    mxfp4_grouped_masked_n64(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked<64>(p);
}

// out[i] = partials[0][i] + partials[1][i] + ... in split order, from +0.0.
extern "C" __global__ void __launch_bounds__(256)
    mxfp8_gemm_skinny_reduce(const __grid_constant__ di_gemm_skinny_reduce_params p) {
    DI_PDL_ENTRY();
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
        float acc = 0.0f;
        for (int s = 0; s < p.splits; ++s) acc += p.partials[int64_t(s) * p.count + i];
        if (p.out_f32) {
            static_cast<float *>(p.out)[i] = acc;
        } else {
            static_cast<__nv_bfloat16 *>(p.out)[i] = __float2bfloat16_rn(acc);
        }
    }
}


// Version 2 entry points (see dense_v2 / masked_v2): the 32-token tile is the
// largest; dense m in 33..64 runs _n32 with token_halves = 2. With the V2
// layout (Layout<.., true>) every entry fits more CTAs per SM than in
// version 1: dense n8/n16/n32 4/4/4 (V1 4/3/3), masked n8/n16/n32 5/4/3
// (V1 4/3/2), within the registers ptxas reports.
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp8_gemm_skinny_v2_n8(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, p.token_halves));
    dense_v2<8>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp8_gemm_skinny_v2_n16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, p.token_halves));
    dense_v2<16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp8_gemm_skinny_v2_n32(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_PREFETCH_ENTRY(dense_prefetch(p, p.token_halves));
    dense_v2<32>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 5)
    mxfp4_grouped_masked_v2_n8(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v2<8>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    mxfp4_grouped_masked_v2_n16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v2<16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 3)
    mxfp4_grouped_masked_v2_n32(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v2<32>(p);
}
