// Masked FP4 MoE GEMM for decode, version 3: a memory-bound design for
// 1..16 tokens per expert (mxfp4_grouped_masked_v3_n{8,16}).
//
//   per expert e with c = clamp(counts[e], 0, max_m) > 0:
//   out[e, :c, N] = A[e, :c, K] (e4m3, 1x32 E8M0) x B[e, N, K]^T (packed e2m1,
//   one E8M0 per output row per 32 of K); rows >= c untouched.
//
// Self-contained: it uses only the shared headers (no definitions of
// gemm_skinny.cu). README.md, "Version 3", has the design and its prediction.
//
// sm_90a: persistent CTAs of 16 warps (one CTA per SM). A work unit is 16
// weight rows of one active expert over the whole of K: 16 x K/2 bytes of
// e2m1 plus 16 x K/32 scale bytes, contiguous in B, brought in by
// cp.async.bulk (one copy per row into a row-padded stage, so ldmatrix reads
// are free of bank conflicts, and one for the scales), S stages deep (the
// host sizes S from the shared memory left, at most 8; the kernel reads it
// back from %dynamic_smem_size). The 16 warps split the unit's K blocks
// (warp w takes block pairs w, w + 16, ...) and run mma.sync m16n8k32 e4m3
// with the weights as A (registers, decoded straight from the ldmatrix
// result) and the tokens as B (staged once per expert in shared memory), one
// fresh mma per 32-deep K block, folded as acc = fma(fresh, w_s * a_s, acc).
// The 16 warp partials are then added in warp order by one thread per
// output: a fixed, batch-independent split of K (the split depends on K only).
//
// Decode: e4m3 bits (s << 7) | (c << 2) for the e2m1 nibble (s, c) are the
// e2m1 value times 2^-6 exactly (both formats put their subnormal at the
// same place relative to the bias), so a nibble decodes with one shift and
// one mask, 7 instructions per 8 values; the 2^6 comes back as one exact
// multiply per output. The k order inside a block is permuted (even
// nibbles, then odd ones) identically for both operands, which the block
// sum does not see: activations are stored per 8-byte group as bytes
// 0 2 4 6 1 3 5 7 (e4m3), or as f16 in that order (the _f16 entry points,
// which issue the two HMMA.16816 that ptxas makes of the e4m3 mma.sync
// themselves, without the per-block token unpacks).
//
// Other architectures (compile-only here): a SIMT path in the CPU
// reference's order, one thread per output.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"

namespace skinny_v3 {

constexpr int kRows = 16;               // weight rows per row group (mma M)
constexpr int kWarps = 16;              // warps per CTA; the K split
constexpr int kThreads = kWarps * 32;   // 512
constexpr int kMaxStages = 8;

__host__ __device__ constexpr int align16(int v) { return (v + 15) & ~15; }

// Shared-memory carve-up, byte offsets (the host twin is `v3_layout` in
// src/cuda_backend/gemm_skinny.rs): barriers [kMaxStages] u64, the E8M0 ->
// f32 table [256], the active-expert list [experts] i32, the tokens
// [NT][K + 32] e4m3 (8-byte groups permuted) or [NT][2K + 64] f16, their
// fp32 scales [K/32][NT],
// two partial buffers [kWarps][16 rows][NT] f32, then S stages of
// 16 x (K/2 + 16) e2m1 bytes plus 16 x K/32 scale bytes (rounded to 16).
struct Layout {
    int lut, list, act, act_s, part, stages, stage_bytes, w_stride, ws_off;
    __device__ Layout(int nt, int g, int k, int experts, bool f16) {
        const int kb = k / 32;
        lut = 8 * kMaxStages;
        list = lut + 256 * 4;
        act = list + align16(experts * 4);
        act_s = act + nt * (f16 ? 2 * k + 64 : k + 32);
        part = act_s + align16(kb * nt * 4);
        stages = part + 2 * kWarps * kRows * g * nt * 4;
        w_stride = k / 2 + 16;
        ws_off = kRows * g * w_stride;
        stage_bytes = ws_off + align16(kRows * g * kb);
    }
};

}  // namespace skinny_v3

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace skinny_v3 {

using namespace deepinfer::sm90;

__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
    uint32_t r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// d = A (16 x 32 e4m3) . B (32 x 8 e4m3) from zero. sm_90 has no FP8
// mma.sync: ptxas lowers it to e4m3 -> f16 unpacks and two HMMA.16816, then
// adds C; with C = -0.0 that add is the identity (x + -0 == x for every x,
// -0 included), so ptxas drops it (with +0.0 it must keep 4 FADDs per mma).
__device__ __forceinline__ void mma_fresh(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(-0.0f));
}

// d = A (16 x 16 f16) . B (16 x 8 f16) + c, fp32 accumulate (HMMA.16816).
__device__ __forceinline__ void hmma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                     uint32_t b0, uint32_t b1, const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

// Two e4m3 bytes (the low 16 bits of v) -> f16x2, exact (F2FP.F16.E4M3.UNPACK_B).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// One 32-deep block of one 16-row group: d = the fresh fp32 tile (times
// 2^-6). kF16: the tokens are staged as f16 (16 bytes per thread and block:
// phys k 0 2 4 6 1 3 5 7 of its 8), two HMMA.16816 written here; else as
// e4m3 (8 bytes: 0 2 4 6 | 1 3 5 7) through the e4m3 mma.sync that ptxas
// lowers to the same two HMMAs plus 4 token unpacks.
template <bool kF16>
__device__ __forceinline__ void block_mma(float (&d)[4], uint32_t wg, uint32_t wg8, const uint8_t *tok) {
    const uint32_t e0 = deepinfer::e2m1_even_to_e4m3_x2e6(wg), e1 = deepinfer::e2m1_even_to_e4m3_x2e6(wg8);
    const uint32_t o0 = deepinfer::e2m1_odd_to_e4m3_x2e6(wg), o1 = deepinfer::e2m1_odd_to_e4m3_x2e6(wg8);
    if constexpr (kF16) {
        const uint4 b = *reinterpret_cast<const uint4 *>(tok);
        const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float h[4];
        // Even phys k (0 2 | 4 6), then odd (1 3 | 5 7).
        hmma(h, e4m3x2_to_f16x2(e0), e4m3x2_to_f16x2(e1), e4m3x2_to_f16x2(e0 >> 16), e4m3x2_to_f16x2(e1 >> 16),
             b.x, b.y, zero);
        hmma(d, e4m3x2_to_f16x2(o0), e4m3x2_to_f16x2(o1), e4m3x2_to_f16x2(o0 >> 16), e4m3x2_to_f16x2(o1 >> 16),
             b.z, b.w, h);
    } else {
        const uint2 x = *reinterpret_cast<const uint2 *>(tok);
        mma_fresh(d, e0, e1, o0, o1, x.x, x.y);
    }
}

// The active experts (count > 0) in expert order into `list` (ballot +
// prefix, kT threads at a time; warp_active holds kT / 32); returns how
// many. Every thread of the CTA (kT of them) calls it.
template <int kT = kThreads>
__device__ __forceinline__ int rank_active(const di_gemm_skinny_params &p, int *list, int *warp_active) {
    constexpr int kW = kT / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n_active = 0;
    for (int e0 = 0; e0 < p.experts; e0 += kT) {
        const int e = e0 + tid;
        const int c = e < p.experts ? max(0, min(p.m, p.counts[e])) : 0;
        const unsigned act_mask = __ballot_sync(0xFFFFFFFFu, c > 0);
        if (lane == 0) warp_active[warp] = __popc(act_mask);
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < kW; ++w) {
            before += w < warp ? warp_active[w] : 0;
            total += warp_active[w];
        }
        if (c > 0) list[n_active + before + __popc(act_mask & ((1u << lane) - 1u))] = e;
        n_active += total;
        __syncthreads();
    }
    return n_active;
}

// A CTA's contiguous share of the n_active x groups units (experts in rank
// order, `groups` units each), walked as a (rank, group) cursor advanced one
// unit at a time (no 64-bit division per unit).
struct Units {
    int count, rank0, group0, groups;
    __device__ Units(int n_active, int groups_) : groups(groups_) {
        const int64_t units = int64_t(n_active) * groups;
        const int64_t u_begin = units * blockIdx.x / gridDim.x;
        const int64_t u_end = units * (blockIdx.x + 1) / gridDim.x;
        count = int(u_end - u_begin);
        rank0 = int(u_begin / groups);
        group0 = int(u_begin % groups);
    }
    __device__ void next(int &rank, int &group) const {
        if (++group == groups) {
            group = 0;
            ++rank;
        }
    }
};

// Stages expert e's first `cnt` tokens (rows cnt..NT-1 as zeros) and their
// fp32 scales: all threads, no barrier (the caller fences around it).
template <int NT, bool kF16>
__device__ __forceinline__ void stage_tokens(const di_gemm_skinny_params &p, int e, int cnt, uint8_t *act,
                                             float *act_s) {
    const int tid = threadIdx.x, k = p.k, kb_n = k / 32, ak = kF16 ? 2 * k + 64 : k + 32;
    const uint8_t *a = static_cast<const uint8_t *>(p.a) + int64_t(e) * p.m * k;
    const uint8_t *as = static_cast<const uint8_t *>(p.a_scale) + int64_t(e) * p.m * kb_n;
    if constexpr (kF16) {
        // 8 e4m3 values -> 8 f16 in phys order 0 2 4 6 1 3 5 7.
        const int q_row = k / 8;
        for (int q = tid; q < NT * q_row; q += kThreads) {
            const int t = q / q_row, c = q % q_row;
            uint2 v = make_uint2(0, 0);
            if (t < cnt) v = *reinterpret_cast<const uint2 *>(a + int64_t(t) * k + c * 8);
            uint4 o;
            o.x = e4m3x2_to_f16x2(__byte_perm(v.x, 0, 0x20));
            o.y = e4m3x2_to_f16x2(__byte_perm(v.y, 0, 0x20));
            o.z = e4m3x2_to_f16x2(__byte_perm(v.x, 0, 0x31));
            o.w = e4m3x2_to_f16x2(__byte_perm(v.y, 0, 0x31));
            *reinterpret_cast<uint4 *>(act + t * ak + c * 16) = o;
        }
    } else {
        const int q_row = k / 16;  // 16-byte pieces per token row
        for (int q = tid; q < NT * q_row; q += kThreads) {
            const int t = q / q_row, c = q % q_row;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (t < cnt) v = *reinterpret_cast<const uint4 *>(a + int64_t(t) * k + c * 16);
            uint4 o;
            o.x = __byte_perm(v.x, v.y, 0x6420);
            o.y = __byte_perm(v.x, v.y, 0x7531);
            o.z = __byte_perm(v.z, v.w, 0x6420);
            o.w = __byte_perm(v.z, v.w, 0x7531);
            *reinterpret_cast<uint4 *>(act + t * ak + c * 16) = o;
        }
    }
    for (int q = tid; q < NT * kb_n; q += kThreads) {
        const int t = q % NT, kb = q / NT;
        act_s[q] = t < cnt ? deepinfer::e8m0_to_f32(as[int64_t(t) * kb_n + kb]) : 0.0f;
    }
}

// One warp's share of a unit: K-block pairs first, first + 16, ... of the
// stage `st`, into acc0 (tokens 0-7) and acc1 (8-15, when `two`), then the
// partials [unit row][token] into `pw`.
template <int NT, int G, bool kF16>
__device__ __forceinline__ void unit_partials(const Layout &L, const uint8_t *st, const float *lut,
                                              const uint8_t *act, const float *act_s, int kb_n, int first,
                                              bool two, float *pw) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const int ak = kF16 ? 2 * kb_n * 32 + 64 : kb_n * 32 + 32;  // token row bytes
    constexpr int kTokBlock = kF16 ? 64 : 32;  // bytes of one token's 32-deep block
    constexpr int kTokThread = kF16 ? 16 : 8;  // bytes of it per thread
    const int pairs = (kb_n + 1) / 2;
    // ldmatrix.x4 row addresses: matrix lane / 8 is rows 0-7 or 8-15 of block
    // kb0 (matrices 0, 1) or kb0 + 1 (2, 3).
    const int lm_row = (lane & 7) + ((lane >> 3) & 1) * 8, lm_blk = lane >> 4;
    const uint8_t *ws = st + L.ws_off;
    float acc0[G][4], acc1[G][4];
#pragma unroll
    for (int rg = 0; rg < G; ++rg) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc0[rg][q] = acc1[rg][q] = 0.0f;
    }
#pragma unroll 2
    for (int pp = first; pp < pairs; pp += kWarps) {
        const int kb0 = 2 * pp;
#pragma unroll
        for (int rg = 0; rg < G; ++rg) {
            uint32_t w[4];
            // Block kb0 + 1 == kb_n (odd K/32) reads the row padding; it
            // is never used.
            ldmatrix_x4(w, st + (rg * kRows + lm_row) * L.w_stride + (kb0 + lm_blk) * 16);
            const uint8_t *wsr = ws + rg * kRows * kb_n;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int kb = kb0 + j;
                if (kb >= kb_n) break;
                float d[4];
                block_mma<kF16>(d, w[2 * j], w[2 * j + 1], act + g * ak + kb * kTokBlock + tg * kTokThread);
                const float sg = lut[wsr[g * kb_n + kb]], sg8 = lut[wsr[(g + 8) * kb_n + kb]];
                const float2 at = *reinterpret_cast<const float2 *>(act_s + kb * NT + 2 * tg);
                acc0[rg][0] = fmaf(d[0], sg * at.x, acc0[rg][0]);
                acc0[rg][1] = fmaf(d[1], sg * at.y, acc0[rg][1]);
                acc0[rg][2] = fmaf(d[2], sg8 * at.x, acc0[rg][2]);
                acc0[rg][3] = fmaf(d[3], sg8 * at.y, acc0[rg][3]);
                if (two) {
                    float d1[4];
                    block_mma<kF16>(d1, w[2 * j], w[2 * j + 1],
                                    act + (g + 8) * ak + kb * kTokBlock + tg * kTokThread);
                    const float2 at1 = *reinterpret_cast<const float2 *>(act_s + kb * NT + 8 + 2 * tg);
                    acc1[rg][0] = fmaf(d1[0], sg * at1.x, acc1[rg][0]);
                    acc1[rg][1] = fmaf(d1[1], sg * at1.y, acc1[rg][1]);
                    acc1[rg][2] = fmaf(d1[2], sg8 * at1.x, acc1[rg][2]);
                    acc1[rg][3] = fmaf(d1[3], sg8 * at1.y, acc1[rg][3]);
                }
            }
        }
    }
#pragma unroll
    for (int rg = 0; rg < G; ++rg) {
        float *pr = pw + rg * kRows * NT;
        pr[g * NT + 2 * tg] = acc0[rg][0];
        pr[g * NT + 2 * tg + 1] = acc0[rg][1];
        pr[(g + 8) * NT + 2 * tg] = acc0[rg][2];
        pr[(g + 8) * NT + 2 * tg + 1] = acc0[rg][3];
        if (NT == 16) {
            pr[g * NT + 8 + 2 * tg] = acc1[rg][0];
            pr[g * NT + 8 + 2 * tg + 1] = acc1[rg][1];
            pr[(g + 8) * NT + 8 + 2 * tg] = acc1[rg][2];
            pr[(g + 8) * NT + 8 + 2 * tg + 1] = acc1[rg][3];
        }
    }
}

// out[e, t, col] = sum x 2^6 (the decode's 2^-6, exactly), BF16 or F32.
__device__ __forceinline__ void write_output(const di_gemm_skinny_params &p, int e, int t, int64_t col,
                                             float sum) {
    sum *= 64.0f;
    const int64_t at = (int64_t(e) * p.m + t) * p.n + col;
    if (p.out_f32) {
        static_cast<float *>(p.out)[at] = sum;
    } else {
        static_cast<__nv_bfloat16 *>(p.out)[at] = __float2bfloat16_rn(sum);
    }
}

// out[e, t, r0 + row] = the 16 warp partials of (row, t) in `pb` (buffer of
// one unit, [warp][unit row][token]) added in warp order, times 2^6.
template <int NT, int G>
__device__ __forceinline__ void store_output(const di_gemm_skinny_params &p, const float *pb, int e, int r0,
                                             int row, int t) {
    constexpr int kUnitRows = kRows * G;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += pb[w * kUnitRows * NT + row * NT + t];
    write_output(p, e, t, r0 + row, sum);
}

// The shared-memory pointers of a V3 CTA and its stage count.
struct Smem {
    uint64_t *full;
    float *lut;
    int *list;
    uint8_t *act;
    float *act_s;
    float *part;
    uint8_t *stage0;
    int stages;
    __device__ Smem(uint8_t *smem, const Layout &L) {
        full = reinterpret_cast<uint64_t *>(smem);
        lut = reinterpret_cast<float *>(smem + L.lut);
        list = reinterpret_cast<int *>(smem + L.list);
        act = smem + L.act;
        act_s = reinterpret_cast<float *>(smem + L.act_s);
        part = reinterpret_cast<float *>(smem + L.part);
        stage0 = smem + L.stages;
        stages = min(kMaxStages, int((dynamic_smem_bytes() - uint32_t(L.stages)) / uint32_t(L.stage_bytes)));
    }
};

// Warp-wide: bulk-copies unit (rank, group) into stage i % S and announces
// its bytes on full[i % S] (lanes 0..rows-1 copy one row each, lane 0 the
// scales).
template <int G>
__device__ __forceinline__ void issue_unit(const di_gemm_skinny_params &p, const Layout &L, const Smem &sm,
                                           int i, int rank, int group) {
    constexpr int kUnitRows = kRows * G;
    const int lane = threadIdx.x & 31, kb_n = p.k / 32;
    const uint32_t row_bytes = uint32_t(p.k / 2), ws_bytes = uint32_t(kUnitRows * kb_n);
    const int64_t row0 = int64_t(sm.list[rank]) * p.n + group * kUnitRows;
    uint8_t *st = sm.stage0 + (i % sm.stages) * L.stage_bytes;
    uint64_t *bar = &sm.full[i % sm.stages];
    if (lane == 0) mbar_arrive_expect_tx(bar, kUnitRows * row_bytes + ws_bytes);
    __syncwarp();
    const uint8_t *bw = static_cast<const uint8_t *>(p.b);
    const uint8_t *bs = static_cast<const uint8_t *>(p.b_scale);
    if (lane < kUnitRows) bulk_copy(st + lane * L.w_stride, bw + (row0 + lane) * row_bytes, row_bytes, bar);
    if (lane == 0) bulk_copy(st + L.ws_off, bs + row0 * kb_n, ws_bytes, bar);
}

// V3: every unit ends with a CTA barrier, after which thread t < rows x NT
// writes one output and warp 0 issues the unit S ahead.
template <int NT, int G, bool kF16>
__device__ __forceinline__ void masked_v3_sm90(const di_gemm_skinny_params &p) {
    static_assert(NT == 8 || NT == 16, "token tile 8 or 16");
    static_assert(G == 1 || G == 2, "one or two 16-row groups per unit");
    constexpr int kUnitRows = kRows * G;
    extern __shared__ __align__(16) uint8_t smem[];
    const Layout L(NT, G, p.k, p.experts, kF16);
    const Smem sm(smem, L);
    const int S = sm.stages;
    __shared__ int warp_active[kWarps];

    const int tid = threadIdx.x, warp = tid >> 5;
    const int kb_n = p.k / 32;
    const int groups = p.n / kUnitRows;  // units per expert

    const int n_active = rank_active(p, sm.list, warp_active);
    if (tid < 256) sm.lut[tid] = deepinfer::e8m0_to_f32(uint32_t(tid));
    if (tid == 0) {
        for (int s = 0; s < S; ++s) mbar_init(&sm.full[s], 1);
        fence_barrier_init();
    }
    __syncthreads();

    const Units U(n_active, groups);
    const int n_units = U.count, rank0 = U.rank0, group0 = U.group0;
    if (n_units <= 0) return;
    int is_rank = rank0, is_group = group0;  // warp 0: the next unit to issue
    if (warp == 0) {
        for (int i = 0; i < min(S, n_units); ++i, U.next(is_rank, is_group)) issue_unit<G>(p, L, sm, i, is_rank, is_group);
    }

    int cur_e = -1, cnt = 0;
    int rank = rank0, group = group0;
    for (int i = 0; i < n_units; ++i, U.next(rank, group)) {
        const int e = sm.list[rank];
        if (e != cur_e) {
            // The previous unit's readers are past the barrier that ended it.
            cur_e = e;
            cnt = max(0, min(p.m, p.counts[e]));
            stage_tokens<NT, kF16>(p, e, cnt, sm.act, sm.act_s);
            __syncthreads();
        }
        const int s = i % S;
        mbar_wait(&sm.full[s], uint32_t(i / S) & 1u);
        float *pbuf = sm.part + (i & 1) * kWarps * kUnitRows * NT;
        unit_partials<NT, G, kF16>(L, sm.stage0 + s * L.stage_bytes, sm.lut, sm.act, sm.act_s, kb_n, warp,
                                   NT == 16 && cnt > 8, pbuf + warp * kUnitRows * NT);
        // Every warp is done with stage s, the tokens and its partials.
        __syncthreads();
        if (warp == 0 && i + S < n_units) {
            issue_unit<G>(p, L, sm, i + S, is_rank, is_group);
            U.next(is_rank, is_group);
        }
        if (tid < kUnitRows * NT) {
            const int row = tid % kUnitRows, t = tid / kUnitRows;
            if (t < cnt) store_output<NT, G>(p, pbuf, e, group * kUnitRows, row, t);
        }
    }
}

}  // namespace skinny_v3
#else
namespace skinny_v3 {

// SIMT path: one thread per (expert, token, output row), K blocks in order,
// each block summed in fp32 in k order, exactly as cpu_backend::gemm.
template <int NT> __device__ void masked_v3_simt(const di_gemm_skinny_params &p) {
    const int kb_n = (p.k + 31) / 32;
    const uint8_t *a = static_cast<const uint8_t *>(p.a);
    const uint8_t *as = static_cast<const uint8_t *>(p.a_scale);
    const uint8_t *b = static_cast<const uint8_t *>(p.b);
    const uint8_t *bs = static_cast<const uint8_t *>(p.b_scale);
    const int64_t total = int64_t(p.experts) * p.m * p.n;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int n = int(i % p.n);
        const int t = int(i / p.n % p.m);
        const int e = int(i / (int64_t(p.n) * p.m));
        if (t >= max(0, min(p.m, p.counts[e]))) continue;
        const int64_t ar = int64_t(e) * p.m + t, br = int64_t(e) * p.n + n;
        float acc = 0.0f;
        for (int kb = 0; kb < kb_n; ++kb) {
            float sum = 0.0f;
            for (int kk = kb * 32; kk < min(p.k, kb * 32 + 32); ++kk) {
                const uint8_t byte = b[br * (p.k / 2) + kk / 2];
                const float bv = deepinfer::e2m1_to_f32((kk & 1) ? byte >> 4 : byte & 0xF);
                sum = __fadd_rn(sum, __fmul_rn(deepinfer::e4m3_to_f32(a[ar * p.k + kk]), bv));
            }
            const float sc = __fmul_rn(deepinfer::e8m0_to_f32(as[ar * kb_n + kb]),
                                       deepinfer::e8m0_to_f32(bs[br * kb_n + kb]));
            acc = __fadd_rn(acc, __fmul_rn(sum, sc));
        }
        if (p.out_f32) {
            static_cast<float *>(p.out)[i] = acc;
        } else {
            static_cast<__nv_bfloat16 *>(p.out)[i] = __float2bfloat16_rn(acc);
        }
    }
}

}  // namespace skinny_v3
#endif

template <int NT, int G, bool kF16 = false>
__device__ __forceinline__ void masked_v3(const di_gemm_skinny_params &p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    skinny_v3::masked_v3_sm90<NT, G, kF16>(p);
#else
    skinny_v3::masked_v3_simt<NT>(p);  // G only shapes the sm_90a units
#endif
}

// max_m <= 8 and <= 16, units of 16 (_n8, _n16) or 32 weight rows (_g2, for
// short K); one CTA per SM (the host sizes the stages to the shared memory).
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n8(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<8, 1>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<16, 1>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n8_g2(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<8, 2>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n16_g2(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<16, 2>(p);
}
// The same with the tokens staged as f16 and the two HMMA.16816 per block
// written directly (no per-block token unpacks; twice the token bytes in
// shared memory, so fewer stages). The host takes these wherever they fit
// (measured 1.4-2.4 % faster than the e4m3 staging, README).
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n8_f16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<8, 1, true>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n16_f16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<16, 1, true>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n8_g2_f16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<8, 2, true>(p);
}
extern "C" __global__ void __launch_bounds__(skinny_v3::kThreads, 1)
    mxfp4_grouped_masked_v3_n16_g2_f16(const __grid_constant__ di_gemm_skinny_params p) {
    DI_PDL_ENTRY();
    masked_v3<16, 2, true>(p);
}
