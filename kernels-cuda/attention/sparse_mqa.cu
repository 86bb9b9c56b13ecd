// Sparse MQA over V4.1's native cache rows (v41-flash.md 3.10, 11): one CTA
// per (query, 16, 32 or 64 heads), producer warps that gather and dequantise
// rows into shared memory, BF16 tensor cores. Versions 3 and 5 (mma.sync)
// give bitwise the same results; versions 8 and 9 (wgmma) sum in other
// orders. Versions 1, 2, 4, 6 and 7 and V3's 32/16-head CTAs lost in the
// H200 bench and left the build (the README keeps their designs and figures).
// Layouts, numerics and the design: kernels-cuda/attention/README.md.
//
// Rows (cpu_backend::kv_format): a window row is 512 e4m3 bytes then 16 E8M0
// scale bytes (one per 32 values, 528 bytes); a compressed row is 256 bytes of
// packed e2m1 (even element in the low nibble) then 32 e4m3 scale bytes (one
// per 16 values, 288 bytes). Query t attends to window_idx[t] || compressed_idx[t]
// in that order, in blocks of 64 entries; an entry < 0 or >= its pool's row
// count is no row: it is never read, its tile row is zero and its logit -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"
#include "deepinfer/sm90.cuh"
#include "deepinfer/wgmma_bf16.cuh"

namespace {

constexpr int kDim = 512;          // latent width (K = V)
constexpr int kBlock = 64;         // entries per online-softmax block
constexpr int kWindowRow = 528;    // bytes of a window row
constexpr int kCompressedRow = 288; // bytes of a compressed row
constexpr int kProducerWarps = 4;  // warpgroup 0: gather + dequantise
constexpr int kRowBytes = kDim * 2;             // one BF16 row in shared memory
constexpr int kTileBytes = kBlock * kRowBytes;  // 64 rows x 512 BF16 = 64 KiB
constexpr int kExchFloats = 32 * 32;            // per consumer warp: 32 partials x 32 lanes
constexpr int kProducerRegs = 96;
constexpr int kConsumerRegs = 200;
// setmaxnreg moves registers only within the CTA's launch allocation: 384
// threads get 168 registers each (65536 / 384 rounded down to a multiple
// of 8), and an increase past that pool waits forever.
constexpr int kRegPool384 = 168 * 384;
static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= kRegPool384, "register pool");
// Version 5 (8 producer warps, one consumer warpgroup).
constexpr int kProducerRegs8 = 120;
constexpr int kConsumerRegs8 = 248;
static_assert(kProducerRegs8 * 256 + kConsumerRegs8 * 128 <= kRegPool384, "register pool (version 5)");
// Versions 8 and 9 (one producer warpgroup, two wgmma consumer warpgroups
// holding a 64 x 256 fp32 accumulator each; the split of version 6, which
// left the build). At 200 consumer registers ptxas serialised version 6's
// wgmmas; 208 leaves the producers 88.
constexpr int kProducerRegs6 = 88;
constexpr int kConsumerRegs6 = 208;
static_assert(kProducerRegs6 * 128 + kConsumerRegs6 * 256 <= kRegPool384, "register pool (versions 8, 9)");
// Version 11: 512 threads (a launch pool of 128 registers a thread), 8
// producer warps and two consumer warpgroups whose P.V is two m64n128
// halves (one m64n256 instruction needs 158 registers, past the launch
// bound ptxas compiles each instruction against).
constexpr int kProducerWarps11 = 8;
constexpr int kProducerRegs11 = 56;
constexpr int kConsumerRegs11 = 200;
static_assert(kProducerRegs11 * 256 + kConsumerRegs11 * 256 <= 128 * DI_SPARSE_MQA_V11_THREADS,
              "register pool (version 11)");

// Shared memory carve-up (bytes): 4 mbarriers (full[2], empty[2]), the
// per-entry logit bias (0 or -inf) of each tile, the two BF16 row tiles
// (1024-aligned), then Q (16 rows per head group) and the partial-logit
// exchange (one slot per consumer warp). A CTA covers 16 * HG heads with
// 2 * HG consumer warps (HG head groups x 2 halves of the 512 dims).
constexpr int kOffBars = 0;
constexpr int kOffBias = 64;
constexpr int kOffTiles = 1024;
template <int HG> struct Layout {
    static constexpr int heads = 16 * HG;
    static constexpr int consumer_warps = 2 * HG;
    static constexpr int threads = (kProducerWarps + consumer_warps) * 32;
    static constexpr int q = kOffTiles + 2 * kTileBytes;
    static constexpr int exch = q + heads * kRowBytes;
    static constexpr int bytes = exch + consumer_warps * kExchFloats * 4;
};
static_assert(kOffBias + 2 * kBlock * 4 <= kOffTiles, "bias fits before the tiles");
static_assert(Layout<4>::bytes == DI_SPARSE_MQA_SMEM_BYTES && Layout<4>::threads == DI_SPARSE_MQA_THREADS,
              "params.h: 64 heads per CTA");
// Version 5: 32 and 16 heads with 8 producer warps and one consumer
// warpgroup (padded for 16 heads): 384 threads.
static_assert(Layout<2>::bytes == DI_SPARSE_MQA_H32_SMEM_BYTES, "params.h: 32 heads per CTA");
static_assert(Layout<1>::bytes == DI_SPARSE_MQA_H16_SMEM_BYTES, "params.h: 16 heads per CTA");
static_assert(12 * 32 == DI_SPARSE_MQA_THREADS, "version 5 threads");

// Byte offset of 16-byte chunk `chunk` (8 BF16 values) of row `row` in a
// 1024-byte-row tile: chunks are XOR-swizzled by the row's low 3 bits, so the
// 8 rows an ldmatrix reads at one logical chunk hit 8 different bank groups.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(uint64_t *bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}

// The tile pipeline's barriers (thread 0, before the CTA barrier): full[2]
// complete when the `producers` threads have stored a tile, empty[2] when
// the `consumers` threads have read it.
__device__ __forceinline__ void init_tile_bars(uint8_t *smem, uint32_t producers, uint32_t consumers) {
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + kOffBars);
    bar_init(&bars[0], producers);
    bar_init(&bars[1], producers);
    bar_init(&bars[2], consumers);
    bar_init(&bars[3], consumers);
}

__device__ __forceinline__ void bar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// Named barrier `id` over `threads` threads (the two warps of a head group).
__device__ __forceinline__ void pair_sync(int id) {
    asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x16 BF16, row) * b (16x8 BF16, col), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Two e4m3 codes (low byte first) times `s` -> packed BF16 pair. The f32
// product is exact (a 4-bit significand times a power of two) unless it
// leaves the f32 range, and rounds to BF16 as bf16::from_f32 does.
__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t pair, float s) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    return pack_bf16(f.x * s, f.y * s);
}

// The byte of two e2m1 codes (even element low) as an f16 pair holding
// e2m1 * 2^-14 exactly: the 3 magnitude bits land on the f16 exponent/mantissa
// boundary (code 1 is the subnormal 0.5 * 2^-14), the sign on bit 15.
__device__ __forceinline__ uint32_t e2m1x2_as_f16x2(uint32_t b) {
    return ((b & 0x7u) << 9) | ((b & 0x8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
}

// Two e2m1 codes times `s2` (the e4m3 scale x 2^14) -> packed BF16 pair; the
// f32 product e2m1 x e4m3 is exact, so this equals kv_format's decode (the
// compressed rows of a block that also holds window rows).
__device__ __forceinline__ uint32_t e2m1x2_scaled(uint32_t byte, float s2) {
    const uint32_t bits = e2m1x2_as_f16x2(byte);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&bits));
    return pack_bf16(f.x * s2, f.y * s2);
}

// The online softmax of one thread's two head rows over a block of 64
// logits in the m16n8 accumulator layout (consume's s[8][4] and
// consume_wgmma's m64n64 fragment hold the same 32 floats): s[4n], s[4n+1]
// are row g at columns 8n + 2c and 8n + 2c + 1, s[4n+2], s[4n+3] row g + 8.
// A block scales and biases the logits, takes the quad's row max, writes P
// as the BF16 A fragments of P.V and rescales the running sums and the
// accumulator (its fragments in the same row order, 4 floats per n).
struct OnlineSoftmax {
    float m0 = -1e30f, m1 = -1e30f, l0 = 0.0f, l1 = 0.0f;
    float a0 = 1.0f, a1 = 1.0f;  // the last step's rescale factors

    __device__ __forceinline__ void step(float (&s)[32], const float *bias, int c, float scale,
                                         uint32_t (&pa)[4][4], float (&acc)[128]) {
        constexpr float kLog2e = 1.4426950408889634f;
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const float2 bb = *reinterpret_cast<const float2 *>(&bias[8 * n + 2 * c]);
            s[4 * n] = s[4 * n] * scale + bb.x;
            s[4 * n + 1] = s[4 * n + 1] * scale + bb.y;
            s[4 * n + 2] = s[4 * n + 2] * scale + bb.x;
            s[4 * n + 3] = s[4 * n + 3] * scale + bb.y;
            mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 2));
        const float al0 = expf(m0 - mx0), al1 = expf(m1 - mx1);
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const float p00 = ex2((s[4 * n] - mx0) * kLog2e), p01 = ex2((s[4 * n + 1] - mx0) * kLog2e);
            const float p10 = ex2((s[4 * n + 2] - mx1) * kLog2e), p11 = ex2((s[4 * n + 3] - mx1) * kLog2e);
            ps0 += p00 + p01;
            ps1 += p10 + p11;
            pa[n / 2][(n & 1) * 2] = pack_bf16(p00, p01);
            pa[n / 2][(n & 1) * 2 + 1] = pack_bf16(p10, p11);
        }
        l0 = l0 * al0 + ps0;
        l1 = l1 * al1 + ps1;
        a0 = al0;
        a1 = al1;
        m0 = mx0;
        m1 = mx1;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            acc[4 * n] *= al0;
            acc[4 * n + 1] *= al0;
            acc[4 * n + 2] *= al1;
            acc[4 * n + 3] *= al1;
        }
    }

    // The quad's partial sums added, then the sinks of heads h_lo, h_lo + 8.
    __device__ __forceinline__ void finish(const float *sink, int h_lo) {
        l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 1);
        l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 2);
        l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 1);
        l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 2);
        l0 += expf(sink[h_lo] - m0);
        l1 += expf(sink[h_lo + 8] - m1);
    }

    // Both rows' log-sum-exp into lse[at] and lse[at + 8].
    __device__ __forceinline__ void store_lse(float *lse, int64_t at) const {
        lse[at] = logf(l0) + m0;
        lse[at + 8] = logf(l1) + m1;
    }

    // Split-KV: the quad's partial sums only (the sink joins in the combine).
    __device__ __forceinline__ void finish_split() {
        l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 1);
        l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 2);
        l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 1);
        l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 2);
    }
};

// Split-KV (p.split > 0): CTA z of a query takes entries [z split, (z + 1)
// split) of its list (split a multiple of kBlock, so only the last split
// reaches the list's end, past which every entry is no row).
__device__ __forceinline__ int64_t split_first(const di_sparse_mqa_params &p) {
    return p.split > 0 ? int64_t{blockIdx.z} * p.split : 0;
}

// Blocks of kBlock entries of this CTA's span.
__device__ __forceinline__ int split_blocks(const di_sparse_mqa_params &p) {
    const int64_t total = int64_t{p.kw} + p.kc, e0 = split_first(p);
    const int64_t n = p.split > 0 ? min(int64_t{p.split}, total - e0) : total;
    return static_cast<int>((n + kBlock - 1) / kBlock);
}

// Split-KV epilogue: this thread's fp32 accumulator (rows g and g + 8 of its
// 16 heads; acc[4n..4n+3] at dims dbase + 8n + 2c, + 1, the m16n8 layout of
// both consumers) divided by the partial sum, into part_out[t][z][head][dim],
// and the partial log-sum-exp (no sink; -inf for a span without rows, whose
// output is zeros) into part_lse[t][z][head] when `lse_writer`.
__device__ __forceinline__ void store_split(const di_sparse_mqa_params &p, const float (&acc)[128],
                                            const OnlineSoftmax &sm, int64_t t, int h_lo, int dbase, int c,
                                            bool lse_writer) {
    const int64_t slot = (t * gridDim.z + blockIdx.z) * p.h;
    const float i0 = sm.l0 > 0.0f ? 1.0f / sm.l0 : 0.0f, i1 = sm.l1 > 0.0f ? 1.0f / sm.l1 : 0.0f;
    float *o0 = p.part_out + (slot + h_lo) * kDim + dbase + 2 * c;
    float *o1 = o0 + 8 * kDim;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<float2 *>(o0 + 8 * n) = make_float2(acc[4 * n] * i0, acc[4 * n + 1] * i0);
        *reinterpret_cast<float2 *>(o1 + 8 * n) = make_float2(acc[4 * n + 2] * i1, acc[4 * n + 3] * i1);
    }
    if (lse_writer) {
        p.part_lse[slot + h_lo] = sm.l0 > 0.0f ? logf(sm.l0) + sm.m0 : -INFINITY;
        p.part_lse[slot + h_lo + 8] = sm.l1 > 0.0f ? logf(sm.l1) + sm.m1 : -INFINITY;
    }
}

// Consumer warp cw (0 .. 2*HG-1): heads 16*hg .. 16*hg+15 of the CTA (hg =
// cw % HG) and output dims 256*dh .. 256*dh+255 (dh = cw / HG). Per block it
// computes its partial logits over its 256 dims, adds its partner's (the
// warp of the same head group and the other dims) through shared memory,
// then the online softmax (identical in both warps) and P.V for its dims.
// No value depends on HG: a head's result is the same in any CTA shape.
template <int HG>
__device__ __forceinline__ void consume(const di_sparse_mqa_params &p, uint8_t *smem, int cw,
                                        int lane, int64_t t, int h0, int blocks) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    const float *bias = reinterpret_cast<const float *>(smem + kOffBias);
    float *exch = reinterpret_cast<float *>(smem + Layout<HG>::exch);
    float *mine = exch + cw * kExchFloats;
    const float *partner = exch + ((cw + HG) % (2 * HG)) * kExchFloats;
    const int hg = cw % HG, dh = cw / HG;
    const int g = lane >> 2, c = lane & 3;
    uint8_t *sq = smem + Layout<HG>::q;
    const uint32_t sq_addr = smem_addr(sq);

    // This warp's Q sub-tile (16 heads x 256 dims), 16-byte async copies.
    const uint8_t *qsrc = static_cast<const uint8_t *>(p.q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int r = hg * 16 + i, chunk = dh * 32 + lane;
        const uint8_t *src = qsrc + ((t * p.h + h0 + r) * kDim + chunk * 8) * 2;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sq_addr + swz(r, chunk)),
                     "l"(src)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    __syncwarp();

    float acc[32][4];
#pragma unroll
    for (int n = 0; n < 32; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    OnlineSoftmax sm;
    const float scale = p.scale;

    // Step-0 ldmatrix addresses: Q (A of Q.K^T), the tile as K (B, 8 keys x
    // 16 dims per pair of matrices) and as V (B transposed, 16 keys x 8 dims).
    const uint32_t qa0 = swz(hg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), dh * 32 + (lane >> 4));
    const uint32_t kb0 = swz((lane & 7) + 8 * (lane >> 4), dh * 32 + ((lane >> 3) & 1));
    const uint32_t vb0 = swz((lane & 7) + 8 * ((lane >> 3) & 1), dh * 32 + (lane >> 4));

    for (int j = 0; j < blocks; ++j) {
        const int b = j & 1;
        bar_wait(&full[b], (j >> 1) & 1);
        const uint32_t tile = smem_addr(smem + kOffTiles + b * kTileBytes);
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        // Chunk numbers are dh*32 | 2*ks | lane bit, disjoint bit fields, so the
        // swizzled address of step ks is the step-0 address XOR 32*ks bytes.
#pragma unroll 1
        for (int ks = 0; ks < 16; ++ks) {
            uint32_t a[4];
            ldsm_x4(sq_addr + (qa0 ^ (ks << 5)), a);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t bf[4];
                ldsm_x4(tile + (kb0 ^ (ks << 5)) + np * 16 * kRowBytes, bf);
                mma_bf16(s[2 * np], a, bf[0], bf[1]);
                mma_bf16(s[2 * np + 1], a, bf[2], bf[3]);
            }
        }
        // Full logits = this warp's partial + the partner's (a + b == b + a,
        // so both warps hold identical logits).
#pragma unroll
        for (int i = 0; i < 32; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
        pair_sync(1 + hg);
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i / 4][i % 4] += partner[i * 32 + lane];
        pair_sync(1 + hg);

        uint32_t pa[4][4];
        sm.step(reinterpret_cast<float(&)[32]>(s), bias + b * kBlock, c, scale, pa,
                reinterpret_cast<float(&)[128]>(acc));
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
            for (int np = 0; np < 16; ++np) {
                uint32_t bf[4];
                ldsm_x4_t(tile + (vb0 ^ (np << 5)) + ks * 16 * kRowBytes, bf);
                mma_bf16(acc[2 * np], pa[ks], bf[0], bf[1]);
                mma_bf16(acc[2 * np + 1], pa[ks], bf[2], bf[3]);
            }
        }
        bar_arrive(&empty[b]);
    }

    const int h_lo = h0 + hg * 16 + g;
    if (p.split > 0) {
        sm.finish_split();
        store_split(p, reinterpret_cast<const float(&)[128]>(acc), sm, t, h_lo, dh * 256, c, dh == 0 && c == 0);
        return;
    }
    sm.finish(p.sink, h_lo);
    const float l0 = sm.l0, l1 = sm.l1;
    // The output tile goes through this warp's own Q sub-tile (no other warp
    // reads it) so the global stores are whole 16-byte chunks.
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        const int chunk = dh * 32 + n, r = hg * 16 + g;
        *reinterpret_cast<uint32_t *>(sq + swz(r, chunk) + 4 * c) = pack_bf16(acc[n][0] / l0, acc[n][1] / l0);
        *reinterpret_cast<uint32_t *>(sq + swz(r + 8, chunk) + 4 * c) = pack_bf16(acc[n][2] / l1, acc[n][3] / l1);
    }
    __syncwarp();
    uint8_t *out = static_cast<uint8_t *>(p.out);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int r = hg * 16 + i, chunk = dh * 32 + lane;
        *reinterpret_cast<uint4 *>(out + ((t * p.h + h0 + r) * kDim + chunk * 8) * 2) =
            *reinterpret_cast<const uint4 *>(sq + swz(r, chunk));
    }
    if (dh == 0 && c == 0) sm.store_lse(p.lse, t * p.h + h_lo);
}

// ---- version 3: exact e2m1 -> BF16 by byte permutes -------------------------
// The BF16 of an e2m1 magnitude (3 bits) is one of 8 values; two prmt table
// lookups give its high and low bytes for four nibbles at once, two more
// interleave them into BF16 pairs, and a prmt in sign-replicate mode spreads
// the nibble signs. The pair is then multiplied by the BF16 scale: e2m1 x e4m3
// has at most 6 significant bits and lies in [2^-10, 2688], so the BF16
// product is exact and equals kv_format's f32 decode rounded to BF16.

// The BF16 bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as prmt
// tables (high: 00 3F 3F 3F 40 40 40 40, low: 00 00 80 C0 00 40 80 C0):
// constants() lets the compiler fold them into the prmts; in_registers()
// keeps them in registers across a loop (opaque_u32) instead of moving them
// from uniform registers before every prmt (version 11's producer).
struct E2m1Tables {
    uint32_t hi0, hi1, lo0, lo1;
    __device__ __forceinline__ static E2m1Tables constants() {
        return {0x3F3F3F00u, 0x40404040u, 0xC0800000u, 0xC0804000u};
    }
    __device__ __forceinline__ static E2m1Tables in_registers() {
        const E2m1Tables c = constants();
        return {deepinfer::opaque_u32(c.hi0), deepinfer::opaque_u32(c.hi1), deepinfer::opaque_u32(c.lo0),
                deepinfer::opaque_u32(c.lo1)};
    }
};

// Eight e2m1 codes (w, even element in the low nibble) times the BF16 scale
// pair `s2` -> four packed BF16 pairs in element order. (The tables travel
// by value: passed by reference, the constants() callers of versions 3 and 5
// compiled to a different register allocation.)
__device__ __forceinline__ void e2m1x8_scaled(uint32_t w, __nv_bfloat162 s2, E2m1Tables t,
                                              uint32_t (&o)[4]) {
    const uint32_t mag = w & 0x77777777u, z = w << 4;
    const uint32_t hi_a = deepinfer::prmt_b32(t.hi0, t.hi1, mag);
    const uint32_t lo_a = deepinfer::prmt_b32(t.lo0, t.lo1, mag);
    const uint32_t hi_b = deepinfer::prmt_b32(t.hi0, t.hi1, mag >> 16);
    const uint32_t lo_b = deepinfer::prmt_b32(t.lo0, t.lo1, mag >> 16);
    const uint32_t v[4] = {deepinfer::prmt_b32(lo_a, hi_a, 0x5140u), deepinfer::prmt_b32(lo_a, hi_a, 0x7362u),
                           deepinfer::prmt_b32(lo_b, hi_b, 0x5140u), deepinfer::prmt_b32(lo_b, hi_b, 0x7362u)};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        // Byte k of z has the even element's sign as its msb, byte k of w the
        // odd one's: replicate them into bytes 1 and 3, keep bits 15 and 31.
        const uint32_t sign = deepinfer::prmt_b32(z, w, ((12u + k) << 12) | ((8u + k) << 4)) & 0x80008000u;
        uint32_t x = v[k] | sign;
        __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&x), s2);
        o[k] = *reinterpret_cast<uint32_t *>(&r);
    }
}

// e4m3 scale byte -> BF16 pair (exact: e4m3 values are BF16 values).
__device__ __forceinline__ __nv_bfloat162 e4m3_bf16x2(uint32_t b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    const float f = __half2float(*reinterpret_cast<const __half *>(&h));
    return __floats2bfloat162_rn(f, f);
}

// ---- version 2: the producer hides the gather latency ----------------------
// Index entries are resolved three blocks ahead (their loads overlap a whole
// block of work), the rows of block j+2 are prefetched into L2 while block j
// is filled, and a warp whose 16 rows hold no window row loads all 16
// compressed rows at once (16 lanes per row, 16-byte loads) instead of in two
// batches of 8.

// The list value of entry e of query t (its load is left in flight), or -1
// past both lists.
__device__ __forceinline__ int load_entry(const di_sparse_mqa_params &p, int64_t t, int64_t e) {
    if (e < p.kw) return p.window_idx[t * p.kw + e];
    if (e < p.kw + p.kc) return p.compressed_idx[t * p.kc + (e - p.kw)];
    return -1;
}

// Kind (1 window, 2 compressed, 0 no row) and row of value v at entry e.
__device__ __forceinline__ void classify(const di_sparse_mqa_params &p, int64_t e, int v, int &kind, int &row) {
    kind = 0;
    row = 0;
    if (e < p.kw) {
        if (v >= 0 && v < p.nw) kind = 1, row = v;
    } else if (e < p.kw + p.kc) {
        if (v >= 0 && v < p.nc) kind = 2, row = v;
    }
}

// Entry e of query t: kind 1 (window row), 2 (compressed row) or 0 (no row):
// classify(load_entry(..)) with the compare right after the load (the
// single-branch form ptxas schedules best for versions 3-6).
__device__ __forceinline__ void resolve(const di_sparse_mqa_params &p, int64_t t, int64_t e, int &kind,
                                        int &row) {
    kind = 0;
    row = 0;
    if (e < p.kw) {
        const int i = p.window_idx[t * p.kw + e];
        if (i >= 0 && i < p.nw) kind = 1, row = i;
    } else if (e < p.kw + p.kc) {
        const int i = p.compressed_idx[t * p.kc + (e - p.kw)];
        if (i >= 0 && i < p.nc) kind = 2, row = i;
    }
}

__device__ __forceinline__ void prefetch_l2(const uint8_t *a) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// Lanes l and l + 16 touch every 128-byte line of their row (l & 15).
__device__ __forceinline__ void prefetch_row(const di_sparse_mqa_params &p, int kind, int64_t row,
                                             int lane) {
    const bool hi = lane >= 16;
    if (kind == 1) {
        const uint8_t *a = static_cast<const uint8_t *>(p.window) + row * kWindowRow;
        if (!hi) {
            prefetch_l2(a);
            prefetch_l2(a + 256);
            prefetch_l2(a + kWindowRow - 1);
        } else {
            prefetch_l2(a + 128);
            prefetch_l2(a + 384);
        }
    } else if (kind == 2) {
        const uint8_t *a = static_cast<const uint8_t *>(p.compressed) + row * kCompressedRow;
        prefetch_l2(hi ? a + 128 : a);
        if (!hi) prefetch_l2(a + kCompressedRow - 1);
    }
}

template <int NP>
__device__ __forceinline__ void produce_v2(const di_sparse_mqa_params &p, uint8_t *smem, int pw,
                                           int lane, int64_t t, int blocks) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    float *bias = reinterpret_cast<float *>(smem + kOffBias);
    const uint8_t *window = static_cast<const uint8_t *>(p.window);
    const uint8_t *comp = static_cast<const uint8_t *>(p.compressed);
    constexpr int RW = kBlock / NP;  // rows per producer warp (16 or 8)
    const int64_t mine = split_first(p) + pw * RW + (lane % RW);
    int k0, r0, k1, r1, k2, r2;
    resolve(p, t, mine, k0, r0);
    resolve(p, t, int64_t{kBlock} + mine, k1, r1);
    resolve(p, t, int64_t{2 * kBlock} + mine, k2, r2);
    prefetch_row(p, k1, r1, lane);
    for (int j = 0; j < blocks; ++j) {
        const int b = j & 1;
        prefetch_row(p, k2, r2, lane);
        int k3, r3;
        resolve(p, t, int64_t{j + 3} * kBlock + mine, k3, r3);
        if (j >= 2) bar_wait(&empty[b], ((j >> 1) - 1) & 1);
        uint8_t *tile = smem + kOffTiles + b * kTileBytes;
        if (__any_sync(0xFFFFFFFFu, k0 == 1)) {
            // Window rows present: one row per warp load, two batches of 8.
#pragma unroll 1
            for (int half = 0; half < RW / 8; ++half) {
                uint4 v[8];
                uint32_t sc[8];
                int kinds[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int r = half * 8 + i;
                    kinds[i] = __shfl_sync(0xFFFFFFFFu, k0, r);
                    const int64_t at = __shfl_sync(0xFFFFFFFFu, r0, r);
                    v[i] = make_uint4(0, 0, 0, 0);
                    sc[i] = 0;
                    if (kinds[i] == 1) {
                        const uint8_t *src = window + at * kWindowRow;
                        v[i] = __ldg(reinterpret_cast<const uint4 *>(src) + lane);
                        sc[i] = __ldg(src + kDim + lane / 2);
                    } else if (kinds[i] == 2) {
                        const uint8_t *src = comp + at * kCompressedRow;
                        const uint2 w = __ldg(reinterpret_cast<const uint2 *>(src) + lane);
                        v[i].x = w.x;
                        v[i].y = w.y;
                        sc[i] = __ldg(src + kDim / 2 + lane);
                    }
                }
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int r = pw * RW + half * 8 + i;
                    uint32_t o[8];
                    if (kinds[i] == 1) {
                        const float s = deepinfer::e8m0_to_f32(sc[i]);
                        const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            o[2 * k] = e4m3x2_scaled(w[k] & 0xFFFFu, s);
                            o[2 * k + 1] = e4m3x2_scaled(w[k] >> 16, s);
                        }
                    } else if (kinds[i] == 2) {
                        const __half_raw hs = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(sc[i]), __NV_E4M3);
                        const float s2 = __half2float(*reinterpret_cast<const __half *>(&hs)) * 16384.0f;
                        const uint32_t w[2] = {v[i].x, v[i].y};
#pragma unroll
                        for (int k = 0; k < 8; ++k) o[k] = e2m1x2_scaled((w[k / 4] >> (8 * (k % 4))) & 0xFFu, s2);
                    } else {
#pragma unroll
                        for (int k = 0; k < 8; ++k) o[k] = 0;
                    }
                    *reinterpret_cast<uint4 *>(tile + swz(r, 2 * lane)) = make_uint4(o[0], o[1], o[2], o[3]);
                    *reinterpret_cast<uint4 *>(tile + swz(r, 2 * lane + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
                    if (lane == 0) bias[b * kBlock + r] = kinds[i] != 0 ? 0.0f : -INFINITY;
                }
            }
        } else {
            // Compressed rows (or none) only: lanes 0-15 take even rows,
            // 16-31 odd rows; lane part (lane & 15) decodes values
            // 32*part .. 32*part+31 (16 bytes, two e4m3 scales).
            const int part = lane & 15;
            uint4 v[8];
            uint32_t sc[8];
            int kinds[8];
#pragma unroll
            for (int i = 0; i < RW / 2; ++i) {
                const int r = 2 * i + (lane >> 4);
                kinds[i] = __shfl_sync(0xFFFFFFFFu, k0, r);
                const int64_t at = __shfl_sync(0xFFFFFFFFu, r0, r);
                v[i] = make_uint4(0, 0, 0, 0);
                sc[i] = 0;
                if (kinds[i] == 2) {
                    const uint8_t *src = comp + at * kCompressedRow;
                    v[i] = __ldg(reinterpret_cast<const uint4 *>(src) + part);
                    sc[i] = __ldg(reinterpret_cast<const unsigned short *>(src + kDim / 2) + part);
                }
            }
#pragma unroll
            for (int i = 0; i < RW / 2; ++i) {
                const int r = pw * RW + 2 * i + (lane >> 4);
                uint32_t o[16];
                if (kinds[i] == 2) {
                    const __nv_bfloat162 s_lo = e4m3_bf16x2(sc[i] & 0xFFu), s_hi = e4m3_bf16x2(sc[i] >> 8);
                    const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        uint32_t q4[4];
                        e2m1x8_scaled(w[k], k < 2 ? s_lo : s_hi, E2m1Tables::constants(), q4);
#pragma unroll
                        for (int m = 0; m < 4; ++m) o[4 * k + m] = q4[m];
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 16; ++k) o[k] = 0;
                }
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    *reinterpret_cast<uint4 *>(tile + swz(r, 4 * part + q)) =
                        make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
                if (part == 0) bias[b * kBlock + r] = kinds[i] != 0 ? 0.0f : -INFINITY;
            }
        }
        bar_arrive(&full[b]);
        k0 = k1, r0 = r1;
        k1 = k2, r1 = r2;
        k2 = k3, r2 = r3;
    }
}


// The kernel body: grid (T, H / (16 * HG)) and Layout<HG>::bytes of dynamic
// shared memory. NP producer warps (4: warpgroup 0, 8: two warpgroups of 8
// rows each, version 5) fill BF16 row tiles (two buffers) with produce_v2;
// the 2 * HG consumer warps use them. 64 heads with 4 producers (version 3):
// 384 threads, the register file split by setmaxnreg (producers 96,
// consumers 200). Version 5 (NP 8, 32 or 16 heads): 384 threads, one
// consumer warpgroup (padding warps idle for 16 heads), producers 120 and
// consumers 248.
template <int HG, int NP = kProducerWarps>
__device__ __forceinline__ void sparse_mqa_body(const di_sparse_mqa_params &p) {
    static_assert((HG == 4 && NP == kProducerWarps) || NP == 8, "version 3 (64 heads) or version 5");
    extern __shared__ __align__(1024) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * Layout<HG>::heads;
    const int blocks = split_blocks(p);
    if (threadIdx.x == 0) {
        init_tile_bars(smem, NP * 32, Layout<HG>::consumer_warps * 32);
    }
    __syncthreads();
    if (warp < NP) {
        if constexpr (NP == 8) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs8));
        else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
        produce_v2<NP>(p, smem, warp, lane, t, blocks);
    } else {
        if constexpr (NP == 8) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs8));
        else asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
        // Padding warps of a version-5 consumer warpgroup have no work.
        if (warp - NP < Layout<HG>::consumer_warps) consume<HG>(p, smem, warp - NP, lane, t, h0, blocks);
    }
}

// ---- versions 8 and 9: wgmma consumers ------------------------------------
// Producers store the tile in the wgmma operand layout (v6_off); two
// consumer warpgroups, each all 64 heads, issue Q.K^T over all 512 dims as
// m64n64k16 (Q and K from shared memory) and P.V for one half of the dims
// as m64n256k16 (P from registers, V = the same tile read N-major). The
// tile is read once per warpgroup instruction instead of once per 16-head
// warp. (Version 6 split Q.K^T between the warpgroups and exchanged the
// partial logits; version 7 dropped the exchange: both lost to version 3
// and left the build, README.)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Byte offset of 16-byte chunk `chunk` (8 BF16 values) of row `row` in a
// wgmma tile or Q (the layout version 6 introduced): eight 64-column
// blocks of [64 rows][128 bytes], each the 128-byte-swizzled wgmma layout
// (chunk c of row r at c ^ (r % 8)).
// K-major (Q.K^T, rows = heads or entries): 8-row groups 1024 bytes apart.
// N-major (P.V, V's rows = K): the 64-column blocks are 8192 bytes apart
// (leading byte offset), 8-row groups 1024 (stride byte offset).
__device__ __forceinline__ uint32_t v6_off(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * 8192 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}


// Keeps a register fragment live (and unmoved) up to this point.
__device__ __forceinline__ void keep_alive(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[k][q])::"memory");
}

// Descriptor of the N-major V operand at `p` (a 64-column block, row 16 k).
__device__ __forceinline__ uint64_t v6_desc_n_major(const void *p) {
    const uint64_t addr = deepinfer::sm90::smem_u32(p);
    uint64_t desc = 0;
    desc |= (addr & 0x3FFFF) >> 4;          // start address
    desc |= uint64_t(8192 >> 4) << 16;      // leading byte offset: next 64 columns
    desc |= uint64_t(1024 >> 4) << 32;      // stride byte offset: next 8 rows
    desc |= uint64_t(1) << 62;              // 128-byte swizzle
    return desc;
}

// Q of the CTA's 64 heads, this warpgroup's 256 dims (column blocks 4 wg ..
// 4 wg + 3), copied by its 128 threads into `sq` (v6_off layout); then both
// consumer warpgroups wait for each other (named barrier 1), since each
// reads all of Q.
__device__ __forceinline__ void load_q_half(const di_sparse_mqa_params &p, uint8_t *sq, int wg, int tid, int64_t t,
                                            int h0) {
    const uint8_t *qsrc = static_cast<const uint8_t *>(p.q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int idx = i * 128 + tid, r = idx >> 5, chunk = wg * 32 + (idx & 31);
        const uint8_t *src = qsrc + ((t * p.h + h0 + r) * kDim + chunk * 8) * 2;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(sq + v6_off(r, chunk))), "l"(src)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    deepinfer::sm90::fence_proxy_async_smem();
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

// The epilogue of a wgmma consumer warpgroup once no wgmma reads Q any more:
// its accumulator (heads 16 w + g and + 8, dims 256 wg + 8 n + 2 c, + 1)
// divided by the sums l0, l1, as BF16 through its half of Q (warp w writes
// and then stores its own 16 heads, 16-byte global stores).
__device__ __forceinline__ void store_out_half(const di_sparse_mqa_params &p, uint8_t *sq, const float (&acc)[128],
                                               float l0, float l1, int wg, int tid, int64_t t, int h0) {
    const int w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    // The quotients acc / l, rounded as IEEE division rounds them. A
    // division is ~10 instructions behind a range check and a call to its
    // slow path, 128 of them a thread in the cold epilogue (ncu of
    // 40add28: over a quarter of version 14's stall samples, mostly
    // instruction fetch). Here: y = RN(1/l) once a row, q = RN(a y), the
    // remainder e = l q - a (exact by FMA) and RN(q - e y), which is
    // RN(a / l) by Markstein's theorem (y correctly rounded, q within an ulp
    // of a / l) unless a step underflows or overflows; for a = +-0 it is
    // the zero of a's sign (e = +0). No step leaves the normal range for
    // 1 <= l < 2^64 and |a| zero or in [2^-100, 2^64]; outside those ranges
    // (an empty list's l is +inf) the thread divides.
    const float y0 = __frcp_rn(l0), y1 = __frcp_rn(l1);
    // max |a| and min (2 |a|bits - 2) (zeros wrap to the top), 8 chains.
    float big[8];
    uint32_t small[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) big[k] = 0.0f, small[k] = 0xFFFFFFFFu;
#pragma unroll
    for (int i = 0; i < 128; ++i) {
        big[i % 8] = fmaxf(big[i % 8], fabsf(acc[i]));
        small[i % 8] = min(small[i % 8], __float_as_uint(acc[i]) * 2u - 2u);
    }
#pragma unroll
    for (int k = 1; k < 8; ++k) big[0] = fmaxf(big[0], big[k]), small[0] = min(small[0], small[k]);
    const bool fast = l0 >= 1.0f && l0 < 0x1p64f && l1 >= 1.0f && l1 < 0x1p64f && big[0] <= 0x1p64f &&
                      small[0] >= __float_as_uint(0x1p-100f) * 2u - 2u;
    auto quotient = [](float a, float l, float y) {
        const float q = __fmul_rn(a, y);
        return __fmaf_rn(-__fmaf_rn(l, q, -a), y, q);
    };
    // Two loops, not a choice per quotient: a per-element select compiled
    // both paths into the one that runs (the division's check and call
    // beside every quotient).
    if (__builtin_expect(fast, 1)) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            const int chunk = wg * 32 + n, r = w * 16 + g;
            *reinterpret_cast<uint32_t *>(sq + v6_off(r, chunk) + 4 * c) =
                pack_bf16(quotient(acc[4 * n], l0, y0), quotient(acc[4 * n + 1], l0, y0));
            *reinterpret_cast<uint32_t *>(sq + v6_off(r + 8, chunk) + 4 * c) =
                pack_bf16(quotient(acc[4 * n + 2], l1, y1), quotient(acc[4 * n + 3], l1, y1));
        }
    } else {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            const int chunk = wg * 32 + n, r = w * 16 + g;
            *reinterpret_cast<uint32_t *>(sq + v6_off(r, chunk) + 4 * c) =
                pack_bf16(acc[4 * n] / l0, acc[4 * n + 1] / l0);
            *reinterpret_cast<uint32_t *>(sq + v6_off(r + 8, chunk) + 4 * c) =
                pack_bf16(acc[4 * n + 2] / l1, acc[4 * n + 3] / l1);
        }
    }
    __syncwarp();
    uint8_t *out = static_cast<uint8_t *>(p.out);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int r = w * 16 + i, chunk = wg * 32 + lane;
        *reinterpret_cast<uint4 *>(out + ((t * p.h + h0 + r) * kDim + chunk * 8) * 2) =
            *reinterpret_cast<const uint4 *>(sq + v6_off(r, chunk));
    }
}

// Q.K^T of `tile` into s: kSteps k-steps of 16 over column blocks
// first .. first + kSteps / 4 - 1 of Q and the tile (all 512 dims: 32 from
// block 0), one commit group.
template <int kSteps>
__device__ __forceinline__ void issue_qk(float (&s)[32], const uint8_t *sq, const uint8_t *tile, int first) {
    namespace s9 = deepinfer::sm90;
    s9::fence_operands(s);
    s9::wgmma_fence();
    // Shared addresses stay below 2^18, so a descriptor's start-address
    // field (address >> 4) takes the step's offset without a carry: two
    // base descriptors and an add a step (not a descriptor built per step).
    const uint64_t dq = s9::smem_desc_k128(sq), dt = s9::smem_desc_k128(tile);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
        const int off = (first + ks / 4) * 8192 + (ks % 4) * 32;
        s9::WgmmaBf16SS<64>::mma(s, dq + (off >> 4), dt + (off >> 4), ks > 0);
    }
    s9::wgmma_commit();
    s9::fence_operands(s);
}

// After block j's P.V is issued: with a block j + 1, wait for its tile and
// issue its Q.K^T, retire block j's P.V (tile j & 1 released) and then the
// Q.K^T; else retire the P.V. P.V reads pa and writes acc asynchronously:
// both stay in their registers until the wait that retires it (pa is dead to
// the compiler after the issue). Each branch ends with nothing in flight, so
// ptxas sees every later read of s and acc after a full wait.
template <int kQkSteps>
__device__ __forceinline__ void retire_pv(int j, int blocks, uint64_t *full, uint64_t *empty, float (&s)[32],
                                          uint32_t (&pa)[4][4], float (&acc)[128], const uint8_t *sq,
                                          const uint8_t *tiles, int qk_first) {
    namespace s9 = deepinfer::sm90;
    const int b = j & 1;
    if (j + 1 < blocks) {
        bar_wait(&full[b ^ 1], ((j + 1) >> 1) & 1);
        issue_qk<kQkSteps>(s, sq, tiles + (b ^ 1) * kTileBytes, qk_first);
        s9::wgmma_wait<1>();
        keep_alive(pa);
        s9::fence_operands(acc);
        bar_arrive(&empty[b]);
        s9::wgmma_wait<0>();
        s9::fence_operands(s);
    } else {
        s9::wgmma_wait<0>();
        keep_alive(pa);
        s9::fence_operands(acc);
        bar_arrive(&empty[b]);
    }
}

// Consumer warpgroup wg (0, 1): heads 0..63 of the CTA, output dims
// 256 wg .. 256 wg + 255. Thread (warp w, lane g*4+c) holds heads 16w+g and
// 16w+g+8 (the wgmma accumulator layout). Per block: the logits over all
// 512 dims (32 k-steps; both warpgroups hold the same logits, coupled only
// through Q, which both read whole), the online softmax as in consume(),
// then P.V for its dims. The Q.K^T of block j+1 is issued before the
// warpgroup waits for the P.V of block j.
template <bool kHalfQk, bool kPvHalves>
__device__ __forceinline__ void consume_wgmma(const di_sparse_mqa_params &p, uint8_t *smem, int wg, int tid,
                                              int64_t t, int h0, int blocks) {
    namespace s9 = deepinfer::sm90;
    using Pv = s9::WgmmaBf16RS<256>;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    const float *bias = reinterpret_cast<const float *>(smem + kOffBias);
    const int w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    uint8_t *sq = smem + Layout<4>::q;
    const uint8_t *tiles = smem + kOffTiles;

    load_q_half(p, sq, wg, tid, t, h0);

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    float s[32];
    OnlineSoftmax sm;
    const float scale = p.scale;

    // Q.K^T of block j into s: 32 k-steps of 16 over all 512 dims, or with
    // kHalfQk 16 over this warpgroup's 256 (column blocks 4 wg .. 4 wg + 3).
    constexpr int kQkSteps = kHalfQk ? 16 : 32;
    const int qk_first = kHalfQk ? 4 * wg : 0;
    // kHalfQk: the partial logits go through the exchange (16 KiB a
    // warpgroup, thread-major: conflict-free); the partner arrives on
    // barrier 5 + wg once it has read this warpgroup's slot, so the next
    // block's write waits only if it has not yet; barrier 4 pairs the
    // writes with the reads. a + b == b + a: both hold the same logits.
    float *exch = reinterpret_cast<float *>(smem + Layout<4>::exch);
    auto exchange = [&](int j) {
        if constexpr (kHalfQk) {
            float *mine = exch + wg * 32 * 128;
            const float *partner = exch + (1 - wg) * 32 * 128;
            if (j > 0) asm volatile("bar.sync %0, 256;" ::"r"(5 + wg) : "memory");
#pragma unroll
            for (int i = 0; i < 32; ++i) mine[i * 128 + tid] = s[i];
            asm volatile("bar.sync 4, 256;" ::: "memory");
#pragma unroll
            for (int i = 0; i < 32; ++i) s[i] += partner[i * 128 + tid];
            if (j + 1 < blocks) asm volatile("bar.arrive %0, 256;" ::"r"(5 + (1 - wg)) : "memory");
        }
    };

    if (blocks > 0) {
        bar_wait(&full[0], 0);
        issue_qk<kQkSteps>(s, sq, tiles, qk_first);
        s9::wgmma_wait<0>();
        s9::fence_operands(s);
    }
    for (int j = 0; j < blocks; ++j) {
        const int b = j & 1;
        uint32_t pa[4][4];
        exchange(j);
        sm.step(s, bias + b * kBlock, c, scale, pa, acc);
        // P.V: V = the tile's 64 rows (K) x this half's 256 columns (N).
        const uint8_t *tile = tiles + b * kTileBytes;
        s9::fence_operands(acc);
        s9::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if constexpr (kPvHalves) {
                // acc[0..63] and acc[64..127] are the m64n128 accumulators of
                // this warpgroup's columns 0..127 and 128..255 (the same
                // register layout as the m64n256 one).
                using Pv128 = s9::WgmmaBf16RS<128>;
                Pv128::mma(*reinterpret_cast<float(*)[64]>(&acc[0]), pa[ks],
                           v6_desc_n_major(tile + 4 * wg * 8192 + ks * 2048), 1);
                Pv128::mma(*reinterpret_cast<float(*)[64]>(&acc[64]), pa[ks],
                           v6_desc_n_major(tile + (4 * wg + 2) * 8192 + ks * 2048), 1);
            } else {
                Pv::mma(acc, pa[ks], v6_desc_n_major(tile + 4 * wg * 8192 + ks * 2048), 1);
            }
        }
        s9::wgmma_commit();
        s9::fence_operands(acc);
        retire_pv<kQkSteps>(j, blocks, full, empty, s, pa, acc, sq, tiles, qk_first);
    }

    const int h_lo = h0 + w * 16 + g;
    if (p.split > 0) {
        sm.finish_split();
        store_split(p, acc, sm, t, h_lo, wg * 256, c, wg == 0 && c == 0);
        return;
    }
    sm.finish(p.sink, h_lo);
    const float l0 = sm.l0, l1 = sm.l1;
    // Every wgmma of both warpgroups has completed (their reads of Q too).
    asm volatile("bar.sync 1, 256;" ::: "memory");
    store_out_half(p, sq, acc, l0, l1, wg, tid, t, h0);
    if (wg == 0 && c == 0) sm.store_lse(p.lse, t * p.h + h_lo);
}

// ---- the raw stage of versions 8 and 9 -------------------------------------
// Producer warps copy the raw rows of block j+1 into a stage while block j
// is consumed, and decode them from shared memory (version 7's design, which
// the README describes; its per-row shuffles and branches lost to version 3
// and it left the build). Shared memory: Layout<4> up to Q, then the raw
// stage of 64 x 528 bytes (row r at 528 r whatever its format) in place of
// the partial-logit exchange the wgmma consumers do not use.
constexpr int kOffRaw7 = Layout<4>::exch;
constexpr int kSmem7 = kOffRaw7 + kBlock * kWindowRow;
static_assert(kSmem7 == DI_SPARSE_MQA_V7_SMEM_BYTES, "params.h: the raw-stage shared memory");

// ---- version 8: branch-free decode of one-format blocks --------------------
// Version 7's ncu (benches/results/2026-12-02-h200-attention-v7-ncu.txt):
// its producer warp runs ~2,420 instructions per block at ~5 cycles each,
// one warp per SM sub-partition, each row behind a shuffle and a three-way
// branch on its kind, so rows never overlap. Here a row without a row is
// zero-filled by its cp.async (zeros decode to zeros in both formats), so a
// block whose rows are all FP4-or-none (or FP8-or-none) decodes every row
// with one loop, no shuffle and no branch, rows interleaved by the
// compiler; a block mixing both formats (a list's window/compressed seam
// off a 64-entry boundary) takes the per-row branch. The odd lanes' swap
// of their two 16-byte chunks (spread stores, as version 7) moves to the
// loads' addresses; the bias is one store per entry lane.

// Warp w's 16 rows (lanes 0..15 hold their kind and row) into raw rows
// 16 w .. 16 w + 15: 33 (FP8, and zero-filled for no row: cp.async with
// source size 0 reads nothing) or 18 (FP4) 16-byte copies per row; one
// commit group.
__device__ __forceinline__ void issue_raw8(const di_sparse_mqa_params &p, uint8_t *raw, int w, int lane, int kind,
                                           int row) {
    const uint8_t *window = static_cast<const uint8_t *>(p.window);
    const uint8_t *comp = static_cast<const uint8_t *>(p.compressed);
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
        const int k = __shfl_sync(0xFFFFFFFFu, kind, i);
        const int64_t at = __shfl_sync(0xFFFFFFFFu, row, i);
        const uint32_t dst = smem_addr(raw + (16 * w + i) * kWindowRow);
        const uint8_t *src = k == 2 ? comp + at * kCompressedRow : window + at * kWindowRow;
        const int chunks = k == 2 ? kCompressedRow / 16 : kWindowRow / 16;
        const uint32_t bytes = k == 0 ? 0u : 16u;
        for (int c = lane; c < chunks; c += 32)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + 16 * c),
                         "l"(k == 0 ? window : src + 16 * c), "r"(bytes)
                         : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Lane `lane`'s values 16 lane .. 16 lane + 15 of raw row r decoded in
// kind `fp4`'s format into tile row r: the first store to chunk 2 lane + odd
// (its values 16 lane + 8 odd ..), the second to the other.
template <bool kFp4>
__device__ __forceinline__ void decode_row8(const uint8_t *raw, uint8_t *tile, int r, int lane, int odd) {
    const uint8_t *src = raw + r * kWindowRow;
    uint32_t a[4], b[4];
    if constexpr (kFp4) {
        const uint32_t w0 = *reinterpret_cast<const uint32_t *>(src + 8 * lane + 4 * odd);
        const uint32_t w1 = *reinterpret_cast<const uint32_t *>(src + 8 * lane + 4 * (1 - odd));
        const __nv_bfloat162 s2 = e4m3_bf16x2(src[kDim / 2 + lane]);
        e2m1x8_scaled(w0, s2, E2m1Tables::constants(), a);
        e2m1x8_scaled(w1, s2, E2m1Tables::constants(), b);
    } else {
        const uint2 v0 = *reinterpret_cast<const uint2 *>(src + 16 * lane + 8 * odd);
        const uint2 v1 = *reinterpret_cast<const uint2 *>(src + 16 * lane + 8 * (1 - odd));
        const float sc = deepinfer::e8m0_to_f32(src[kDim + lane / 2]);
        a[0] = e4m3x2_scaled(v0.x & 0xFFFFu, sc);
        a[1] = e4m3x2_scaled(v0.x >> 16, sc);
        a[2] = e4m3x2_scaled(v0.y & 0xFFFFu, sc);
        a[3] = e4m3x2_scaled(v0.y >> 16, sc);
        b[0] = e4m3x2_scaled(v1.x & 0xFFFFu, sc);
        b[1] = e4m3x2_scaled(v1.x >> 16, sc);
        b[2] = e4m3x2_scaled(v1.y & 0xFFFFu, sc);
        b[3] = e4m3x2_scaled(v1.y >> 16, sc);
    }
    *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane + odd)) = make_uint4(a[0], a[1], a[2], a[3]);
    *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane + 1 - odd)) = make_uint4(b[0], b[1], b[2], b[3]);
}

// Decodes warp w's 16 raw rows (lanes 0..15 hold their kinds) into tile
// rows 16 w .. 16 w + 15 and their logit bias.
__device__ __forceinline__ void decode_raw8(const uint8_t *raw, uint8_t *tile, float *bias, int w, int lane,
                                            int kind) {
    const int odd = (lane >> 2) & 1;
    const uint32_t fp8 = __ballot_sync(0xFFFFFFFFu, kind == 1) & 0xFFFFu;
    const uint32_t fp4 = __ballot_sync(0xFFFFFFFFu, kind == 2) & 0xFFFFu;
    if (fp8 == 0) {
#pragma unroll 4
        for (int i = 0; i < 16; ++i) decode_row8<true>(raw, tile, 16 * w + i, lane, odd);
    } else if (fp4 == 0) {
#pragma unroll 4
        for (int i = 0; i < 16; ++i) decode_row8<false>(raw, tile, 16 * w + i, lane, odd);
    } else {
#pragma unroll 1
        for (int i = 0; i < 16; ++i) {
            if ((fp4 >> i) & 1) decode_row8<true>(raw, tile, 16 * w + i, lane, odd);
            else decode_row8<false>(raw, tile, 16 * w + i, lane, odd);
        }
    }
    if (lane < 16) bias[16 * w + lane] = kind != 0 ? 0.0f : -INFINITY;
}

// ---- version 9: version 8 with one bulk copy per row ----------------------
// Version 8's ncu (benches/results/2026-12-02-h200-attention-v8-ncu.txt):
// ~2,140 producer instructions per block, of which issue_raw8's shuffles,
// address selects and chunk loops take ~50 per row. Here lane i < 16 of a
// producer warp copies its own row with one cp.async.bulk (528 or 288
// bytes), counted on the warp's raw barrier (16 arrivals a phase, with the
// row's bytes as expected transactions); a missing row is not copied and its
// tile row is stored as zeros by the decode (a stale raw row may hold NaN
// codes).
constexpr int kOffRawBars9 = 32;  // four mbarriers after full[2], empty[2]
static_assert(kOffRawBars9 + 4 * 8 <= kOffBias, "raw barriers fit before the bias");

// Lane i < 16 of warp w: raw row 16 w + i from its row (no copy for no row),
// arriving on the warp's raw barrier with its bytes expected.
__device__ __forceinline__ void issue_raw9(const di_sparse_mqa_params &p, uint8_t *raw, uint64_t *bar, int w,
                                           int lane, int kind, int row) {
    if (lane >= 16) return;
    uint8_t *dst = raw + (16 * w + lane) * kWindowRow;
    if (kind == 1) {
        deepinfer::sm90::mbar_arrive_expect_tx(bar, kWindowRow);
        deepinfer::sm90::bulk_load(dst, static_cast<const uint8_t *>(p.window) + int64_t{row} * kWindowRow,
                                   kWindowRow, bar);
    } else if (kind == 2) {
        deepinfer::sm90::mbar_arrive_expect_tx(bar, kCompressedRow);
        deepinfer::sm90::bulk_load(dst, static_cast<const uint8_t *>(p.compressed) + int64_t{row} * kCompressedRow,
                                   kCompressedRow, bar);
    } else {
        deepinfer::sm90::mbar_arrive(bar);
    }
}

// decode_raw8 with missing rows stored as zeros (their raw rows are stale).
__device__ __forceinline__ void decode_raw9(const uint8_t *raw, uint8_t *tile, float *bias, int w, int lane,
                                            int kind) {
    const int odd = (lane >> 2) & 1;
    const uint32_t fp8 = __ballot_sync(0xFFFFFFFFu, kind == 1) & 0xFFFFu;
    const uint32_t fp4 = __ballot_sync(0xFFFFFFFFu, kind == 2) & 0xFFFFu;
    const uint32_t none = ~(fp8 | fp4) & 0xFFFFu;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 1
    for (int i = 0; i < 16; ++i) {
        const int r = 16 * w + i;
        if ((none >> i) & 1) {
            *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane)) = zero;
            *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane + 1)) = zero;
        } else if ((fp4 >> i) & 1) {
            decode_row8<true>(raw, tile, r, lane, odd);
        } else {
            decode_row8<false>(raw, tile, r, lane, odd);
        }
    }
    if (lane < 16) bias[16 * w + lane] = kind != 0 ? 0.0f : -INFINITY;
}

// Producer warp w of versions 8 (kBulk false: issue_raw8, cp.async groups)
// and 9 (kBulk: issue_raw9, the raw rows of block j on raw barrier w in
// phase j). Per lane, entry 16 w + (lane % 16) of each block: block j+3's
// index is loaded at iteration j and classified at j+1 (for the L2 prefetch
// of its rows at j+1 and its raw copy at the end of j+2); block j is
// decoded at j from the raw stage filled since the end of j-1.
template <bool kBulk>
__device__ __forceinline__ void produce_staged(const di_sparse_mqa_params &p, uint8_t *smem, int w, int lane,
                                               int64_t t, int blocks) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    uint64_t *rawbar = reinterpret_cast<uint64_t *>(smem + kOffRawBars9) + w;
    float *bias = reinterpret_cast<float *>(smem + kOffBias);
    uint8_t *raw = smem + kOffRaw7;
    const int64_t mine = split_first(p) + 16 * w + (lane & 15);
    auto entry = [&](int j) { return int64_t{j} * kBlock + mine; };
    auto issue = [&](int kind, int row) {
        if constexpr (kBulk) issue_raw9(p, raw, rawbar, w, lane, kind, row);
        else issue_raw8(p, raw, w, lane, kind, row);
    };
    const int v0 = load_entry(p, t, entry(0)), v1 = load_entry(p, t, entry(1));
    int v2 = load_entry(p, t, entry(2));
    int k0, r0, k1, r1;
    classify(p, entry(0), v0, k0, r0);
    issue(k0, r0);
    classify(p, entry(1), v1, k1, r1);
    prefetch_row(p, k1, r1, lane);
    for (int j = 0; j < blocks; ++j) {
        const int b = j & 1;
        const int v3 = load_entry(p, t, entry(j + 3));
        int k2, r2;
        classify(p, entry(j + 2), v2, k2, r2);
        prefetch_row(p, k2, r2, lane);
        if (j >= 2) bar_wait(&empty[b], ((j >> 1) - 1) & 1);
        uint8_t *tile = smem + kOffTiles + b * kTileBytes;
        if constexpr (kBulk) {
            bar_wait(rawbar, j & 1);
            decode_raw9(raw, tile, bias + b * kBlock, w, lane, k0);
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp();
            decode_raw8(raw, tile, bias + b * kBlock, w, lane, k0);
        }
        // The tile goes to wgmma (and with kBulk the raw rows to the next
        // bulk copy), both through the async proxy: order this warp's
        // generic accesses first.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bar_arrive(&full[b]);
        __syncwarp();
        if (j + 1 < blocks) issue(k1, r1);
        k0 = k1, r0 = r1;
        k1 = k2, r1 = r2;
        v2 = v3;
    }
}

// Versions 8 and 9 (kBulk): grid (T, H / 64), 384 threads,
// DI_SPARSE_MQA_V7_SMEM_BYTES; one producer warpgroup (produce_staged) and
// two consumer warpgroups (consume_wgmma).
template <bool kBulk> __device__ __forceinline__ void sparse_mqa_wgmma_body(const di_sparse_mqa_params &p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * 64;
    const int blocks = split_blocks(p);
    if (threadIdx.x == 0) {
        init_tile_bars(smem, kProducerWarps * 32, 256);
        if constexpr (kBulk) {
            for (int w = 0; w < kProducerWarps; ++w)
                bar_init(reinterpret_cast<uint64_t *>(smem + kOffRawBars9) + w, 16);
            // The bulk copies arrive on these barriers through the async proxy.
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
    }
    __syncthreads();
    if (warp < kProducerWarps) {
        deepinfer::sm90::regs_dealloc<kProducerRegs6>();
        produce_staged<kBulk>(p, smem, warp, lane, t, blocks);
    } else {
        deepinfer::sm90::regs_alloc<kConsumerRegs6>();
        const int wg = (warp - kProducerWarps) / 4;
        consume_wgmma<false, false>(p, smem, wg, threadIdx.x - 128 * (1 + wg), t, h0, blocks);
    }
}

// ---- version 11: 8 producer warps loading rows into registers ------------
// Version 10 (commit bab9501; README) loaded rows straight into registers,
// four lanes a row, and split Q.K^T between the consumers again; it lost to
// version 9, and its labs showed why: the consumers alone take ~3.4 us a
// 64-entry block, the producer alone ~5.3 us, one producer warp per SM
// sub-partition at ~5 cycles an instruction. Version 11 keeps its units and
// consumers and doubles the producer warps (512 threads), which the m64n256
// P.V accumulator forbade (one instruction needs 158 registers, past the
// 128 a thread of a 512-thread launch) and two m64n128 halves allow.
//  - Producer warp w (0..7) decodes tile rows 8 w + rp of every block, lane
//    = rp + 8 q, four lanes a row. A unit is what one batch of loads covers:
//      FP4 (one unit): load i (0..3) = bytes 64 i + 16 q .. + 15 of the row
//        (values 128 i + 32 q ..), scales bytes 256 + 8 i + 2 q, + 1;
//      FP8 (two units, h = 0, 1): load i = bytes 256 h + 64 i + 16 q .. + 15,
//        scales bytes 512 + 8 h .. + 7 (value v's scale is byte v / 32).
//    Each load instruction reads 64 contiguous bytes of 8 rows; a 16-byte
//    store is served 8 lanes at a time, and lanes 8 q .. 8 q + 7 are the 8
//    rows (8 swizzles) at one chunk index: 4 wavefronts, the least.
//  - A row of the other format among a warp's 8 (a window/compressed seam
//    inside an 8-entry group) is not loaded by a unit and not stored by it;
//    missing rows load nothing (zeros, scale 0) and the first unit stores
//    them as zeros. Rows two blocks ahead are prefetched into L2.
//  - Consumers: consume_wgmma<true, true>, Q.K^T over each warpgroup's 256
//    dims with the partial logits exchanged (version 6's), P.V as two
//    m64n128 halves. The tile layout and barriers are version 9's.

// Raw registers of one unit: four 16-byte loads and the scale words (FP4:
// s[i] = the two scale bytes of load i; FP8: s[0..1] = the unit's 8 scales).
struct RawUnit {
    uint4 d[4];
    uint32_t s[4];
};

// Loads that read nothing (zeros) when `pred` is false: the address of a
// missing row is never formed into a load. Volatile, with a memory clobber,
// as version 11 was measured (version 10 needed that to keep its look-ahead
// loads ahead of the decode; version 11 issues a unit's loads right before
// decoding it, so it would need it less).
__device__ __forceinline__ uint4 ldg_v4_if(const uint8_t *a, bool pred) {
    uint4 v;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"
                 "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
                 "@p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(a), "r"(static_cast<uint32_t>(pred))
                 : "memory");
    return v;
}

__device__ __forceinline__ uint2 ldg_v2_if(const uint8_t *a, bool pred) {
    uint2 v;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\n"
                 "@p ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n}\n"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(a), "r"(static_cast<uint32_t>(pred))
                 : "memory");
    return v;
}

__device__ __forceinline__ uint32_t ldg_u16_if(const uint8_t *a, bool pred) {
    uint16_t v;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b16 %0, 0;\n"
                 "@p ld.global.nc.L1::no_allocate.u16 %0, [%1];\n}\n"
                 : "=h"(v)
                 : "l"(a), "r"(static_cast<uint32_t>(pred))
                 : "memory");
    return v;
}

// Unit u (0: FP4, 1 + h: FP8 half h) of a row, loaded only when `ok`.
__device__ __forceinline__ void load_unit(const di_sparse_mqa_params &p, int u, int row, bool ok, int q,
                                              RawUnit &r) {
    const int64_t at = ok ? row : 0;
    if (u == 0) {
        const uint8_t *a = static_cast<const uint8_t *>(p.compressed) + at * kCompressedRow;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.d[i] = ldg_v4_if(a + 64 * i + 16 * q, ok);
            r.s[i] = ldg_u16_if(a + kDim / 2 + 8 * i + 2 * q, ok);
        }
    } else {
        const uint8_t *a = static_cast<const uint8_t *>(p.window) + at * kWindowRow;
        const int h = u - 1;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.d[i] = ldg_v4_if(a + 256 * h + 64 * i + 16 * q, ok);
        const uint2 sc = ldg_v2_if(a + kDim + 8 * h, ok);
        r.s[0] = sc.x;
        r.s[1] = sc.y;
        r.s[2] = r.s[3] = 0;
    }
}

// Decodes unit u of tile row r into the tile (stores only when `st`).
__device__ __forceinline__ void store_unit(uint8_t *tile, int u, int r, int q, const RawUnit &raw, bool st,
                                               const E2m1Tables &tab) {
    if (u == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const __half2_raw hs =
                __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(raw.s[i] & 0xFFFFu), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&hs));
            const __nv_bfloat162 lo = __floats2bfloat162_rn(f.x, f.x), hi = __floats2bfloat162_rn(f.y, f.y);
            const uint32_t words[4] = {raw.d[i].x, raw.d[i].y, raw.d[i].z, raw.d[i].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                uint32_t o[4];
                e2m1x8_scaled(words[k], k < 2 ? lo : hi, tab, o);
                if (st)
                    *reinterpret_cast<uint4 *>(tile + v6_off(r, 16 * i + 4 * q + k)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
    } else {
        const int h = u - 1;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float sc = deepinfer::e8m0_to_f32((raw.s[i >> 1] >> (8 * (2 * (i & 1) + (q >> 1)))) & 0xFFu);
            const uint4 v = raw.d[i];
            const int c0 = 32 * h + 8 * i + 2 * q;
            if (st) {
                *reinterpret_cast<uint4 *>(tile + v6_off(r, c0)) =
                    make_uint4(e4m3x2_scaled(v.x & 0xFFFFu, sc), e4m3x2_scaled(v.x >> 16, sc),
                               e4m3x2_scaled(v.y & 0xFFFFu, sc), e4m3x2_scaled(v.y >> 16, sc));
                *reinterpret_cast<uint4 *>(tile + v6_off(r, c0 + 1)) =
                    make_uint4(e4m3x2_scaled(v.z & 0xFFFFu, sc), e4m3x2_scaled(v.z >> 16, sc),
                               e4m3x2_scaled(v.w & 0xFFFFu, sc), e4m3x2_scaled(v.w >> 16, sc));
            }
        }
    }
}

// One pass of one lane: its row (or -1), its kind (1 window, 2 compressed,
// 0 none) and which formats the warp's 8 rows hold.
struct PassRows {
    int row;
    int kind;
    bool has4;
    bool has8;
    __device__ __forceinline__ int first_unit() const { return has4 || !has8 ? 0 : 1; }
    // The unit after u in this pass, or -1.
    __device__ __forceinline__ int next_unit(int u) const { return u == 0 ? (has8 ? 1 : -1) : (u == 1 ? 2 : -1); }
    __device__ __forceinline__ bool loads(int u) const { return u == 0 ? kind == 2 : kind == 1; }
    __device__ __forceinline__ bool stores(int u) const { return u == 0 ? kind != 1 : (kind == 1 || (kind == 0 && !has4)); }
};

__device__ __forceinline__ PassRows pass_rows(const di_sparse_mqa_params &p, int64_t e, int row) {
    PassRows s;
    s.row = row;
    s.kind = row < 0 ? 0 : (e < p.kw ? 1 : 2);
    s.has4 = __any_sync(0xFFFFFFFFu, s.kind == 2);
    s.has8 = __any_sync(0xFFFFFFFFu, s.kind == 1);
    return s;
}

// The pool row of entry e holding list value v, or -1 (no row).
__device__ __forceinline__ int pool_row(const di_sparse_mqa_params &p, int64_t e, int v) {
    int kind, row;
    classify(p, e, v, kind, row);
    return kind == 0 ? -1 : row;
}

// L2 prefetch of this lane's part of its row (lines 128 bytes apart from the
// row's start, and its last byte).
__device__ __forceinline__ void prefetch_part(const di_sparse_mqa_params &p, int64_t e, int row, int q) {
    if (row < 0) return;
    if (e < p.kw) {
        const uint8_t *a = static_cast<const uint8_t *>(p.window) + int64_t{row} * kWindowRow;
        prefetch_l2(a + 128 * q);
        if (q == 3) prefetch_l2(a + kWindowRow - 1);
    } else {
        const uint8_t *a = static_cast<const uint8_t *>(p.compressed) + int64_t{row} * kCompressedRow;
        prefetch_l2(a + 64 * q);
        if (q == 3) prefetch_l2(a + kCompressedRow - 1);
    }
}

__device__ __forceinline__ void produce_v11(const di_sparse_mqa_params &p, uint8_t *smem, int w, int lane,
                                            int64_t t, int blocks) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    float *bias = reinterpret_cast<float *>(smem + kOffBias);
    const int rp = lane & 7, q = lane >> 3;
    const int r = 8 * w + rp;
    const int64_t mine = split_first(p) + r;
    const E2m1Tables tab = E2m1Tables::in_registers();
    auto entry = [&](int j) { return int64_t{j} * kBlock + mine; };
    // Rows of blocks j (ra) and j + 1 (rb), the list value of block j + 2 (vd).
    const int v0 = load_entry(p, t, entry(0)), v1 = load_entry(p, t, entry(1));
    int vd = load_entry(p, t, entry(2));
    int ra = pool_row(p, entry(0), v0);
    int rb = pool_row(p, entry(1), v1);
    prefetch_part(p, entry(1), rb, q);
    for (int j = 0; j < blocks; ++j) {
        const int b = j & 1;
        const int rc = pool_row(p, entry(j + 2), vd);
        vd = load_entry(p, t, entry(j + 3));
        prefetch_part(p, entry(j + 2), rc, q);
        const PassRows pass = pass_rows(p, entry(j), ra);
        RawUnit raw;
        int u = pass.first_unit();
        load_unit(p, u, pass.row, pass.loads(u), q, raw);
        if (j >= 2) bar_wait(&empty[b], ((j >> 1) - 1) & 1);
        uint8_t *tile = smem + kOffTiles + b * kTileBytes;
        for (;;) {
            store_unit(tile, u, r, q, raw, pass.stores(u), tab);
            u = pass.next_unit(u);
            if (u < 0) break;
            load_unit(p, u, pass.row, pass.loads(u), q, raw);
        }
        if (q == 0) bias[b * kBlock + r] = pass.kind != 0 ? 0.0f : -INFINITY;
        // The tile goes to wgmma through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bar_arrive(&full[b]);
        ra = rb;
        rb = rc;
    }
}

// Version 11: grid (T, H / 64), DI_SPARSE_MQA_V11_THREADS threads,
// DI_SPARSE_MQA_SMEM_BYTES (version 3's layout: tiles, Q, the exchange).
__device__ __forceinline__ void sparse_mqa_v11_body(const di_sparse_mqa_params &p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * 64;
    const int blocks = split_blocks(p);
    if (threadIdx.x == 0) {
        init_tile_bars(smem, kProducerWarps11 * 32, 256);
    }
    __syncthreads();
    if (warp < kProducerWarps11) {
        deepinfer::sm90::regs_dealloc<kProducerRegs11>();
        produce_v11(p, smem, warp, lane, t, blocks);
    } else {
        deepinfer::sm90::regs_alloc<kConsumerRegs11>();
        const int wg = (warp - kProducerWarps11) / 4;
        consume_wgmma<true, true>(p, smem, wg, threadIdx.x - 128 * (2 + wg), t, h0, blocks);
    }
}

// ---- version 12: one Q.K^T per block, an unrolled decode -------------------
// The clock64 timeline of version 9 (benches/results/2026-12-03-h200-attention-
// timeline.txt; lab build) per 64-entry block, in SM cycles: the producer warp
// waits ~340 for the empty tile, finds its raw rows landed, decodes its 16
// rows in ~5,200 (one row after another: unroll 1, a three-way branch per
// row) and spends ~1,700 issuing the next block's copies and prefetches:
// ~7,350 a block. The consumers: Q.K^T ~2,200 (both warpgroups compute the
// same 64 x 64 logits over all 512 dims: 256 KiB of operand reads, the
// shared-memory bandwidth of ~2,048 cycles), the softmax ~1,300, P.V
// overlapped with the next Q.K^T. Version 11's producer (8 warps, direct
// loads) spends ~3,750 in its first unit and ~1,150 waiting for the tile.
// Version 12 changes both sides of version 9:
//  - Consumers (FlashMLA SM90's split): warpgroup 0 alone computes Q.K^T
//    (half the operand reads), the softmax and P.V for dims 0..255, and
//    hands P (BF16, 8 KiB, the K-major operand layout) and the rescale
//    factors to warpgroup 1 through shared memory; warpgroup 1 rescales its
//    accumulator and runs P.V for dims 256..511 with both operands in
//    shared memory. Three mbarriers of 128 arrivals hand them over: P and
//    the factors ready (warpgroup 0 arrives), their slots free again
//    (warpgroup 1 arrives once its P.V is complete), the final sums ready.
//    (With named barriers, bar.arrive on one side, racecheck reported the
//    factors and sums as races: 2938ee5 and 59fa241.)
//    Same logits, same P, same rescale, same P.V shapes as version 9.
//  - Producer: the raw stage shrinks to 16 rows x 288 bytes a warp, which
//    holds a warp's 16 FP4 rows or 8 FP8 rows: a block with window rows is
//    copied and decoded in two rounds of 8. Rows of a round of one format
//    (and missing rows, decoded from zero words and a unit scale) are
//    decoded unrolled, without a branch per row.
// Shared memory: version 9's up to Q, then the raw stage (18 KiB), P (8 KiB),
// the statistics (rescale factors, the final sums and maxima: 768 B) and
// three mbarriers.
constexpr int kRawWarp12 = 16 * kCompressedRow;
constexpr int kOffRaw12 = Layout<4>::exch;
constexpr int kOffP12 = kOffRaw12 + 4 * kRawWarp12;
constexpr int kOffStats12 = kOffP12 + kBlock * kBlock * 2;
constexpr int kOffHand12 = kOffStats12 + 3 * 64 * 4;
constexpr int kSmem12 = kOffHand12 + 3 * 8;
// Version 14: four more raw barriers (warpgroup 1's warps) after the three.
constexpr int kSmem14 = kSmem12 + 4 * 8;
static_assert(8 * kWindowRow <= kRawWarp12, "a round of 8 window rows fits a warp's raw stage");
static_assert(kOffP12 % 1024 == 0, "P is a 128-byte-swizzled wgmma operand");
static_assert(kSmem14 <= DI_SPARSE_MQA_SMEM_BYTES, "versions 12 and 14 launch with version 3's shared memory");

// Lane i < 16: when `mine`, its row into `dst` (no copy for no row), arriving
// on the warp's raw barrier with the row's bytes expected; otherwise a plain
// arrival (16 a phase).
__device__ __forceinline__ void issue_raw12(const di_sparse_mqa_params &p, uint8_t *dst, uint64_t *bar, int lane,
                                            bool mine, int kind, int row) {
    if (lane >= 16) return;
    if (mine && kind == 1) {
        deepinfer::sm90::mbar_arrive_expect_tx(bar, kWindowRow);
        deepinfer::sm90::bulk_load(dst, static_cast<const uint8_t *>(p.window) + int64_t{row} * kWindowRow,
                                   kWindowRow, bar);
    } else if (mine && kind == 2) {
        deepinfer::sm90::mbar_arrive_expect_tx(bar, kCompressedRow);
        deepinfer::sm90::bulk_load(dst, static_cast<const uint8_t *>(p.compressed) + int64_t{row} * kCompressedRow,
                                   kCompressedRow, bar);
    } else {
        deepinfer::sm90::mbar_arrive(bar);
    }
}

// decode_row8 from the raw row at `src`, as zeros when `none` (its raw bytes
// are stale: zero codes and a unit scale decode to +0 in both formats).
template <bool kFp4>
__device__ __forceinline__ void decode_row12(const uint8_t *src, uint8_t *tile, int r, int lane, int odd, bool none) {
    uint32_t a[4], b[4];
    if constexpr (kFp4) {
        uint32_t w0 = *reinterpret_cast<const uint32_t *>(src + 8 * lane + 4 * odd);
        uint32_t w1 = *reinterpret_cast<const uint32_t *>(src + 8 * lane + 4 * (1 - odd));
        uint32_t sb = src[kDim / 2 + lane];
        if (none) w0 = 0, w1 = 0, sb = 0x38;  // e4m3 1.0
        const __nv_bfloat162 s2 = e4m3_bf16x2(sb);
        e2m1x8_scaled(w0, s2, E2m1Tables::constants(), a);
        e2m1x8_scaled(w1, s2, E2m1Tables::constants(), b);
    } else {
        uint2 v0 = *reinterpret_cast<const uint2 *>(src + 16 * lane + 8 * odd);
        uint2 v1 = *reinterpret_cast<const uint2 *>(src + 16 * lane + 8 * (1 - odd));
        uint32_t sb = src[kDim + lane / 2];
        if (none) v0 = make_uint2(0, 0), v1 = make_uint2(0, 0), sb = 127;  // E8M0 2^0
        const float sc = deepinfer::e8m0_to_f32(sb);
        a[0] = e4m3x2_scaled(v0.x & 0xFFFFu, sc);
        a[1] = e4m3x2_scaled(v0.x >> 16, sc);
        a[2] = e4m3x2_scaled(v0.y & 0xFFFFu, sc);
        a[3] = e4m3x2_scaled(v0.y >> 16, sc);
        b[0] = e4m3x2_scaled(v1.x & 0xFFFFu, sc);
        b[1] = e4m3x2_scaled(v1.x >> 16, sc);
        b[2] = e4m3x2_scaled(v1.y & 0xFFFFu, sc);
        b[3] = e4m3x2_scaled(v1.y >> 16, sc);
    }
    *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane + odd)) = make_uint4(a[0], a[1], a[2], a[3]);
    *reinterpret_cast<uint4 *>(tile + v6_off(r, 2 * lane + 1 - odd)) = make_uint4(b[0], b[1], b[2], b[3]);
}

// Warp w's rows i0 .. i0 + N - 1 (tile rows 16 w + i) from raw slots
// (i - i0) * stride, kUnroll rows at a time; fp8 / fp4 / none: the warp's
// 16-bit row masks.
template <int N, int kUnroll>
__device__ __forceinline__ void decode_rows12(const uint8_t *raw, int stride, uint8_t *tile, int w, int lane, int i0,
                                              uint32_t fp8, uint32_t fp4, uint32_t none) {
    const int odd = (lane >> 2) & 1;
    const uint32_t span = ((1u << N) - 1) << i0;
    if ((fp8 & span) == 0) {
#pragma unroll kUnroll
        for (int i = 0; i < N; ++i)
            decode_row12<true>(raw + i * stride, tile, 16 * w + i0 + i, lane, odd, (none >> (i0 + i)) & 1);
    } else if ((fp4 & span) == 0) {
#pragma unroll kUnroll
        for (int i = 0; i < N; ++i)
            decode_row12<false>(raw + i * stride, tile, 16 * w + i0 + i, lane, odd, (none >> (i0 + i)) & 1);
    } else {
#pragma unroll 1
        for (int i = 0; i < N; ++i) {
            if ((fp4 >> (i0 + i)) & 1) decode_row12<true>(raw + i * stride, tile, 16 * w + i0 + i, lane, odd, false);
            else decode_row12<false>(raw + i * stride, tile, 16 * w + i0 + i, lane, odd, ((none >> (i0 + i)) & 1) != 0);
        }
    }
}

// The rows kF .. kF + kN - 1 of warp w's 16 rows of every block, fed into
// the tile on produce_staged<true>'s schedule (entries three blocks ahead,
// L2 prefetch two ahead, block j+1's first copies issued once block j is
// decoded) through version 12's raw stage: `raw` holds kN slots of 288
// bytes; a block whose rows kF.. hold no window row is one round of kN
// slots, any other block two rounds of kN / 2 slots of 528 bytes, the second
// copied once the first is decoded. Each round is one phase of `rawbar`
// (kN arrivals). Version 12's producer warp w feeds all 16 rows (kF 0);
// version 14 splits them between the producer warp (rows 0 .. kF - 1) and
// warp w of consumer warpgroup 1 (rows kF .. 15), each with its own slots
// and barrier. Lanes l and l + 16 hold row l & 15.
template <int kF, int kN>
struct RowFeed {
    static_assert(kF >= 0 && kN >= 2 && kN % 2 == 0 && kF + kN <= 16, "a warp's 16 rows");
    static_assert((kN / 2) * kWindowRow <= kN * kCompressedRow, "a round of window rows fits the slots");
    static constexpr uint32_t kSpan = ((1u << kN) - 1) << kF;
    const di_sparse_mqa_params &p;
    uint8_t *raw;
    uint64_t *rawbar;
    int w, lane;
    int64_t t, mine;
    // Kinds and rows of blocks j (k0, r0), j+1, j+2 (resolved during block
    // j's fill); list values of blocks j+2 and j+3 (loaded, not yet resolved).
    int k0, r0, k1, r1, k2, r2, v2, v3;
    uint32_t phase = 0;

    __device__ __forceinline__ RowFeed(const di_sparse_mqa_params &p_, uint8_t *raw_, uint64_t *rawbar_, int w_,
                                       int lane_, int64_t t_)
        : p(p_), raw(raw_), rawbar(rawbar_), w(w_), lane(lane_), t(t_),
          mine(split_first(p_) + 16 * w_ + (lane_ & 15)) {}

    __device__ __forceinline__ int64_t entry(int j) const { return int64_t{j} * kBlock + mine; }
    __device__ __forceinline__ bool owned() const { return (lane & 15) >= kF && (lane & 15) < kF + kN; }
    // Round `round` of a block (two: kN / 2-row rounds) from this lane's row.
    __device__ __forceinline__ void issue(int kind, int row, bool two, int round) {
        if (lane >= 16 || !owned()) return;
        const int i = lane - kF;
        const bool in_round = !two || i / (kN / 2) == round;
        uint8_t *dst = raw + (two ? (i % (kN / 2)) * kWindowRow : i * kCompressedRow);
        issue_raw12(p, dst, rawbar, lane, in_round, kind, row);
    }
    __device__ __forceinline__ bool two_rounds(int kind) const {
        return (__ballot_sync(0xFFFFFFFFu, kind == 1) & kSpan) != 0;
    }
    __device__ __forceinline__ void prefetch(int kind, int row) const {
        if (owned()) prefetch_row(p, kind, row, lane);
    }
    // Entries of blocks 0..2 resolved, block 0 copied, block 1 prefetched.
    __device__ __forceinline__ void start() {
        const int v0 = load_entry(p, t, entry(0)), v1 = load_entry(p, t, entry(1));
        v2 = load_entry(p, t, entry(2));
        classify(p, entry(0), v0, k0, r0);
        const bool two = two_rounds(k0);
        issue(k0, r0, two, 0);
        // Block 0's second round is copied once its first is decoded: from
        // L2, not DRAM.
        if (two) prefetch(k0, r0);
        classify(p, entry(1), v1, k1, r1);
        prefetch(k1, r1);
    }
    // Block j's rows into `tile` (slot b, empty), its bias entries written.
    // Block j+2 is resolved and prefetched first.
    __device__ __forceinline__ void fill(int j, uint8_t *tile, float *bias, uint64_t *empty) {
        const int b = j & 1;
        v3 = load_entry(p, t, entry(j + 3));
        classify(p, entry(j + 2), v2, k2, r2);
        prefetch(k2, r2);
        if (j >= 2) bar_wait(&empty[b], ((j >> 1) - 1) & 1);
        const uint32_t fp8 = __ballot_sync(0xFFFFFFFFu, k0 == 1) & 0xFFFFu;
        const uint32_t fp4 = __ballot_sync(0xFFFFFFFFu, k0 == 2) & 0xFFFFu;
        const uint32_t none = ~(fp8 | fp4) & 0xFFFFu;
        bar_wait(rawbar, phase++ & 1);
        if ((fp8 & kSpan) == 0) {
            decode_rows12<kN, 4>(raw, kCompressedRow, tile, w, lane, kF, fp8, fp4, none);
        } else {
            // Two rounds through one copy of the (cold: two blocks of ten at
            // V4.1's lists) window code.
#pragma unroll 1
            for (int round = 0;; ++round) {
                decode_rows12<kN / 2, 2>(raw, kWindowRow, tile, w, lane, kF + round * (kN / 2), fp8, fp4, none);
                if (round == 1) break;
                // The second round overwrites the slots just read (generic
                // reads, then async-proxy writes).
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncwarp();
                issue(k0, r0, true, 1);
                bar_wait(rawbar, phase++ & 1);
            }
        }
        if (lane < 16 && owned()) bias[b * kBlock + 16 * w + lane] = k0 != 0 ? 0.0f : -INFINITY;
    }
    // After the tile's full arrival: block j+1's first copies, the entries
    // moved on.
    __device__ __forceinline__ void advance(int j, int blocks) {
        __syncwarp();
        if (j + 1 < blocks) issue(k1, r1, two_rounds(k1), 0);
        k0 = k1, r0 = r1;
        k1 = k2, r1 = r2;
        v2 = v3;
    }
};

// Feeds one block of `feed` into tile slot j & 1 and arrives on its full
// barrier: the tile goes to wgmma and the raw slots to the next copies,
// both through the async proxy.
template <class Feed>
__device__ __forceinline__ void feed_block(Feed &feed, uint8_t *smem, int j, int blocks) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    const int b = j & 1;
    feed.fill(j, smem + kOffTiles + b * kTileBytes, reinterpret_cast<float *>(smem + kOffBias), full + 2);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    bar_arrive(&full[b]);
    feed.advance(j, blocks);
}

// Producer warp w of versions 12 and 14: rows 0 .. kRows - 1 of its 16.
template <int kRows>
__device__ __forceinline__ void produce_v12(const di_sparse_mqa_params &p, uint8_t *smem, int w, int lane, int64_t t,
                                            int blocks) {
    RowFeed<0, kRows> feed(p, smem + kOffRaw12 + w * kRawWarp12,
                           reinterpret_cast<uint64_t *>(smem + kOffRawBars9) + w, w, lane, t);
    feed.start();
    for (int j = 0; j < blocks; ++j) feed_block(feed, smem, j, blocks);
}

// Version 12's consumers (see above). Thread (warp w, lane g*4+c) of either
// warpgroup holds heads 16w+g and 16w+g+8 (the wgmma accumulator layout) and
// 128 accumulators of its warpgroup's 256 dims.
// kWg1Rows > 0 (version 14): warp w of warpgroup 1 also feeds rows
// 16 - kWg1Rows .. 15 of its producer partner's 16 into every tile, block j
// before the P.V of block j - 1.
template <int kWg1Rows>
__device__ __forceinline__ void consume_v12(const di_sparse_mqa_params &p, uint8_t *smem, int wg, int tid, int64_t t,
                                            int h0, int blocks) {
    namespace s9 = deepinfer::sm90;
    using Pv = s9::WgmmaBf16RS<256>;
    using PvS = s9::WgmmaBf16SSNb<256>;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + kOffBars);
    uint64_t *empty = full + 2;
    const float *bias = reinterpret_cast<const float *>(smem + kOffBias);
    const int w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int row = w * 16 + g;
    uint8_t *sq = smem + Layout<4>::q;
    uint8_t *sp = smem + kOffP12;
    float *alpha = reinterpret_cast<float *>(smem + kOffStats12);
    float *lfin = alpha + 64, *mfin = alpha + 128;
    uint64_t *pready = reinterpret_cast<uint64_t *>(smem + kOffHand12), *pfree = pready + 1, *stats = pready + 2;
    const uint8_t *tiles = smem + kOffTiles;

    load_q_half(p, sq, wg, tid, t, h0);

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    OnlineSoftmax sm;
    if (wg == 0) {
        float s[32];
        const float scale = p.scale;
        if (blocks > 0) {
            bar_wait(&full[0], 0);
            issue_qk<32>(s, sq, tiles, 0);
            s9::wgmma_wait<0>();
            s9::fence_operands(s);
        }
        for (int j = 0; j < blocks; ++j) {
            const int b = j & 1;
            uint32_t pa[4][4];
            sm.step(s, bias + b * kBlock, c, scale, pa, acc);
            // P's slot is free once warpgroup 1's P.V of block j-1 is done.
            if (j > 0) bar_wait(pfree, (j - 1) & 1);
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                *reinterpret_cast<uint32_t *>(sp + v6_off(row, n) + 4 * c) = pa[n / 2][(n & 1) * 2];
                *reinterpret_cast<uint32_t *>(sp + v6_off(row + 8, n) + 4 * c) = pa[n / 2][(n & 1) * 2 + 1];
            }
            if (c == 0) alpha[row] = sm.a0, alpha[row + 8] = sm.a1;
            s9::fence_proxy_async_smem();
            bar_arrive(pready);
            const uint8_t *tile = tiles + b * kTileBytes;
            s9::fence_operands(acc);
            s9::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) Pv::mma(acc, pa[ks], v6_desc_n_major(tile) + ks * (2048 >> 4), 1);
            s9::wgmma_commit();
            s9::fence_operands(acc);
            retire_pv<32>(j, blocks, full, empty, s, pa, acc, sq, tiles, 0);
        }
        if (p.split > 0) sm.finish_split();
        else sm.finish(p.sink, h0 + row);
        if (c == 0) {
            lfin[row] = sm.l0, lfin[row + 8] = sm.l1;
            mfin[row] = sm.m0, mfin[row + 8] = sm.m1;
        }
        bar_arrive(stats);
    } else {
        // Warpgroup 1's P.V of block j: its accumulator rescaled by
        // warpgroup 0's factors, P from shared memory.
        auto pv = [&](int j) {
            const int b = j & 1;
            bar_wait(pready, j & 1);
            const float al0 = alpha[row], al1 = alpha[row + 8];
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                acc[4 * n] *= al0;
                acc[4 * n + 1] *= al0;
                acc[4 * n + 2] *= al1;
                acc[4 * n + 3] *= al1;
            }
            const uint8_t *tile = tiles + b * kTileBytes;
            s9::fence_operands(acc);
            s9::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
                PvS::mma(acc, s9::smem_desc_k128(sp) + ks * (32 >> 4),
                         v6_desc_n_major(tile + 4 * 8192) + ks * (2048 >> 4), 1);
            s9::wgmma_commit();
            s9::wgmma_wait<0>();
            s9::fence_operands(acc);
            bar_arrive(&empty[b]);
            if (j + 1 < blocks) bar_arrive(pfree);
        };
        if constexpr (kWg1Rows == 0) {
            for (int j = 0; j < blocks; ++j) pv(j);
        } else {
            constexpr int kF = 16 - kWg1Rows;
            RowFeed<kF, kWg1Rows> feed(p, smem + kOffRaw12 + w * kRawWarp12 + kF * kCompressedRow,
                                       reinterpret_cast<uint64_t *>(smem + kOffHand12) + 3 + w, w, lane, t);
            feed.start();
            for (int j = 0; j < blocks; ++j) {
                feed_block(feed, smem, j, blocks);
                if (j > 0) pv(j - 1);
            }
            if (blocks > 0) pv(blocks - 1);
        }
    }
    // Every wgmma of both warpgroups (and warpgroup 0's reads of all of Q)
    // is complete; warpgroup 0's sums and maxima go to warpgroup 1.
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (wg == 1) {
        bar_wait(stats, 0);
        sm.l0 = lfin[row], sm.l1 = lfin[row + 8];
        sm.m0 = mfin[row], sm.m1 = mfin[row + 8];
    }
    const int h_lo = h0 + row;
    if (p.split > 0) {
        store_split(p, acc, sm, t, h_lo, wg * 256, c, wg == 0 && c == 0);
        return;
    }
    store_out_half(p, sq, acc, sm.l0, sm.l1, wg, tid, t, h0);
    if (wg == 0 && c == 0) sm.store_lse(p.lse, t * p.h + h_lo);
}

// Versions 12 (kWg1Rows 0) and 14: grid (T, H / 64), DI_SPARSE_MQA_THREADS
// threads, DI_SPARSE_MQA_SMEM_BYTES (version 3's, so that the fallback off
// sm_90a runs in it).
template <int kWg1Rows>
__device__ __forceinline__ void sparse_mqa_v12_body(const di_sparse_mqa_params &p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    constexpr int kProducerRows = 16 - kWg1Rows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * 64;
    const int blocks = split_blocks(p);
    if (threadIdx.x == 0) {
        uint64_t *hand = reinterpret_cast<uint64_t *>(smem + kOffHand12);
        init_tile_bars(smem, (kWg1Rows > 0 ? 2 : 1) * kProducerWarps * 32, 256);
        for (int w = 0; w < kProducerWarps; ++w)
            bar_init(reinterpret_cast<uint64_t *>(smem + kOffRawBars9) + w, kProducerRows);
        for (int i = 0; i < 3; ++i) bar_init(hand + i, 128);
        if constexpr (kWg1Rows > 0) {
            for (int w = 0; w < kProducerWarps; ++w) bar_init(hand + 3 + w, kWg1Rows);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp < kProducerWarps) {
        deepinfer::sm90::regs_dealloc<kProducerRegs6>();
        produce_v12<kProducerRows>(p, smem, warp, lane, t, blocks);
    } else {
        deepinfer::sm90::regs_alloc<kConsumerRegs6>();
        const int wg = (warp - kProducerWarps) / 4;
        consume_v12<kWg1Rows>(p, smem, wg, threadIdx.x - 128 * (1 + wg), t, h0, blocks);
    }
}

#endif

}  // namespace

// Version 3: 64 heads per CTA (grid (T, H / 64)), DI_SPARSE_MQA_THREADS
// threads and DI_SPARSE_MQA_SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v3(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
    sparse_mqa_body<4>(p);
}

// Version 5: version 3's 32- and 16-head CTAs with 8 producer warps (two
// warpgroups, 8 rows each) and one consumer warpgroup (for 16 heads, two of
// its warps idle): DI_SPARSE_MQA_THREADS threads, the _H32 / _H16 shared memory.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v5_h32(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
    sparse_mqa_body<2, 8>(p);
}

extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v5_h16(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
    sparse_mqa_body<1, 8>(p);
}

// Version 8: raw rows by cp.async, decoded branch-free in blocks of one
// format, wgmma consumers (grid (T, H / 64), DI_SPARSE_MQA_THREADS threads,
// DI_SPARSE_MQA_V7_SMEM_BYTES). Outside sm_90a (no wgmma) it runs version 3.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v8(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sparse_mqa_wgmma_body<false>(p);
#else
    sparse_mqa_body<4>(p);
#endif
}

// Split-KV combine: one CTA per (query, head), thread i dims 4 i .. 4 i + 3.
// With M the largest partial lse, out = sum_z e^(lse_z - M) O_z / L and
// lse = ln L + M, L = sum_z e^(lse_z - M) + e^(sink - M); splits in order,
// so the result depends on the split size only, never on the batch.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_COMBINE_THREADS)
    sparse_mqa_combine(const __grid_constant__ di_sparse_mqa_combine_params p) {
    DI_PDL_ENTRY();
    static_assert(DI_SPARSE_MQA_COMBINE_THREADS * 4 == kDim, "four dims per thread");
    const int64_t t = blockIdx.x;
    const int head = blockIdx.y;
    const float *lse = p.part_lse + t * p.splits * p.h + head;
    float m = -INFINITY;
    for (int z = 0; z < p.splits; ++z) m = fmaxf(m, lse[int64_t{z} * p.h]);
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __nv_bfloat162 *out =
        reinterpret_cast<__nv_bfloat162 *>(static_cast<uint8_t *>(p.out) + ((t * p.h + head) * kDim + 4 * threadIdx.x) * 2);
    if (m == -INFINITY) {
        out[0] = __floats2bfloat162_rn(0.0f, 0.0f);
        out[1] = __floats2bfloat162_rn(0.0f, 0.0f);
        if (threadIdx.x == 0) p.lse[t * p.h + head] = INFINITY;
        return;
    }
    float l = 0.0f;
    for (int z = 0; z < p.splits; ++z) {
        const float w = expf(lse[int64_t{z} * p.h] - m);
        const float4 v = *reinterpret_cast<const float4 *>(
            p.part_out + ((t * p.splits + z) * p.h + head) * kDim + 4 * threadIdx.x);
        l += w;
        o.x += w * v.x;
        o.y += w * v.y;
        o.z += w * v.z;
        o.w += w * v.w;
    }
    l += expf(p.sink[head] - m);
    const float inv = 1.0f / l;
    out[0] = __floats2bfloat162_rn(o.x * inv, o.y * inv);
    out[1] = __floats2bfloat162_rn(o.z * inv, o.w * inv);
    if (threadIdx.x == 0) p.lse[t * p.h + head] = logf(l) + m;
}

// Version 9: version 8 with one bulk copy per row (grid, threads and shared
// memory as version 8). Outside sm_90a (no wgmma) it runs version 3.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v9(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sparse_mqa_wgmma_body<true>(p);
#else
    sparse_mqa_body<4>(p);
#endif
}

// Version 11: 8 producer warps (two per SM sub-partition) decoding version
// 10's units, one pass of 8 rows a warp per block, and the consumers' Q.K^T
// split by dims with P.V as two m64n128 halves (grid (T, H / 64),
// DI_SPARSE_MQA_V11_THREADS threads, DI_SPARSE_MQA_SMEM_BYTES). Outside
// sm_90a (no wgmma) its first 384 threads run version 3.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_V11_THREADS, 1)
    sparse_mqa_v11(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sparse_mqa_v11_body(p);
#else
    if (threadIdx.x < DI_SPARSE_MQA_THREADS) sparse_mqa_body<4>(p);
#endif
}

// Version 12: version 9's producer with a raw stage of 18 KiB (window rows
// in two rounds) and an unrolled decode; Q.K^T once per block (warpgroup 0)
// with P handed to warpgroup 1 through shared memory (grid (T, H / 64),
// DI_SPARSE_MQA_THREADS threads, DI_SPARSE_MQA_SMEM_BYTES). Outside sm_90a
// (no wgmma) it runs version 3.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v12(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sparse_mqa_v12_body<0>(p);
#else
    sparse_mqa_body<4>(p);
#endif
}

// Version 14: version 12 with warpgroup 1 feeding 6 of every 16 rows of a
// producer warp (its own raw slots, copies and barrier), block j before the
// P.V of block j - 1 (grid, threads and shared memory as version 12).
// Outside sm_90a (no wgmma) it runs version 3.
extern "C" __global__ void __launch_bounds__(DI_SPARSE_MQA_THREADS, 1)
    sparse_mqa_v14(const __grid_constant__ di_sparse_mqa_params p) {
    DI_PDL_ENTRY();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sparse_mqa_v12_body<6>(p);
#else
    sparse_mqa_body<4>(p);
#endif
}
