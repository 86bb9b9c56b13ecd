// Lab (not in the production build: build.rs compiles only a family folder's
// own .cu files, not lab/): how fast can a consumer pipeline with per-32
// promotion run on the H200 once loads are out of the picture?
//
// Every CTA keeps two stages of operands resident in shared memory (random
// e4m3 bytes, no NaN patterns) and fp32 scales, and its consumer warpgroups
// loop over them: there are no TMA loads, no mbarriers, no helper warps, so
// the time is the consumer structure alone — wgmma issue, waits, the
// promotion's scale loads and FFMAs — at the register budget the real kernel
// would have (warpgroup 0 idles after setmaxnreg.dec, as a producer would).
//
// A variant is <consumer warpgroups, master columns, unit columns, ring
// depth, k32 steps per unit, mode>:
//   mode kChain:    every unit accumulates straight into the master (scale_d
//                   = 1, no promotion, one wait per body): the tensor-core
//                   ceiling of the tile shape.
//   mode kPromote:  v2's scheme: unit u goes into fresh ring slot u % ring,
//                   after each issue the unit ring - 1 older is waited for
//                   and promoted (acc += fresh * (a_s[row] * b_s[col32])).
//   mode kNoFfma:   kPromote with the promotion cut to one FFMA a unit
//                   (wrong numerics): the cost of the waits alone.
//   mode kLds:      kPromote with the scales read by LDS after the wait (the
//                   production kernel's code until 2026-12-04).
//   mode kLdsEarly: kLds with the scales read and multiplied before the wait.
//   mode kImm:      kPromote with the scale an immediate (wrong numerics):
//                   the FFMAs read two registers instead of three, so no
//                   register-bank conflict on the scale operand.
// k32 steps per unit > 1 chain that many k32 wgmmas into the fresh tile
// before one promotion (DeepGEMM's per-128 rate: the ceiling of a
// re-encoded 128-deep block).
//
// A body is 8 k32 steps (two 128-deep stages) and drains the ring at its end
// (as v2 does per stage pair: ptxas serialises wgmmas that stay in flight
// across a loop's back edge). FLOP = 2 * 64 * master * 256 * warpgroups *
// bodies * CTAs; the H200's dense FP8 peak is 1979 TFLOP/s.
//
// Build and run (README.md, "Lab: the consumer pipeline"):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ikernels-cuda/include -Xptxas -v \
//        kernels-cuda/gemm/lab/wgmma_pipe.cu -o wgmma_pipe && ./wgmma_pipe
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "deepinfer/sm90.cuh"

enum Mode { kChain = 0, kPromote = 1, kNoFfma = 2, kImm = 3, kLds = 4, kLdsEarly = 5 };

constexpr int kStageK = 128;  // bytes of K per stage (one 128-byte swizzled row)
[[maybe_unused]] constexpr int kBodySteps = 8; // k32 steps per body (two stages)

template <int kWg, int kMasterN> struct Smem {
    static constexpr int kA = kWg * 64 * kStageK;          // one stage of A
    static constexpr int kB = kMasterN * kStageK;          // one stage of B
    static constexpr int kSa = 4 * 64 * kWg;               // fp32 A scales a stage
    static constexpr int kSb = 4 * (kMasterN / 32);        // fp32 B scales a stage
    static constexpr int kBytes = 2 * (kA + kB) + 2 * (kSa + kSb) * 4 + 1024;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace deepinfer::sm90;

template <int N> __device__ __forceinline__ float (&slice(float *p))[N] {
    return *reinterpret_cast<float(*)[N]>(p);
}

// Shared-memory load as the production kernel compiles it (LDS). Rounds 1
// and 2 read the scales through generic pointers (LD, long scoreboard), which
// the production kernel does not; round 3 uses this.
__device__ __forceinline__ float lds(const float *p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_u32(p)));
    return v;
}

// This thread's scale products for a unit: rows wrow and wrow + 8 times the
// B scales of the unit's 32-column blocks.
template <int kUnitN, bool kShared> struct Scales {
    float p0[kUnitN / 32], p1[kUnitN / 32];
    __device__ __forceinline__ void load(const float *sa, const float *sb, int wrow, int h) {
        const float a0 = kShared ? lds(sa + wrow) : sa[wrow];
        const float a1 = kShared ? lds(sa + wrow + 8) : sa[wrow + 8];
#pragma unroll
        for (int c = 0; c < kUnitN / 32; ++c) {
            const float b = kShared ? lds(sb + (h * kUnitN) / 32 + c) : sb[(h * kUnitN) / 32 + c];
            p0[c] = a0 * b;
            p1[c] = a1 * b;
        }
    }
};

template <int kUnitN, bool kShared>
__device__ __forceinline__ void promote(float *acc, const float (&f)[kUnitN / 2], const Scales<kUnitN, kShared> &sc,
                                        int h) {
    float *d = acc + h * (kUnitN / 2);
#pragma unroll
    for (int i = 0; i < kUnitN / 8; ++i) {
        d[4 * i + 0] = fmaf(f[4 * i + 0], sc.p0[i / 4], d[4 * i + 0]);
        d[4 * i + 1] = fmaf(f[4 * i + 1], sc.p0[i / 4], d[4 * i + 1]);
        d[4 * i + 2] = fmaf(f[4 * i + 2], sc.p1[i / 4], d[4 * i + 2]);
        d[4 * i + 3] = fmaf(f[4 * i + 3], sc.p1[i / 4], d[4 * i + 3]);
    }
}

template <int kWg, int kMasterN, int kUnitN, int kRing, int kChainK, int kMode>
struct Consumer {
    static constexpr int kHalves = kMasterN / kUnitN;
    static constexpr int kUnits = kBodySteps / kChainK * kHalves;  // units a body
    static constexpr int kLook = kRing - 1;
    static constexpr int kFresh = kUnitN / 2;
    static_assert(kUnits % kRing == 0, "ring slots must be compile-time");

    const uint8_t *a;   // stage 0 of this warpgroup's 64 A rows
    const uint8_t *b;   // stage 0 of B
    const float *sa;    // stage 0 A scales [4][64 kWg]
    const float *sb;    // stage 0 B scales [4][kMasterN / 32]
    int wrow;           // this thread's first row inside the warpgroup's 64
    int wg;             // consumer warpgroup index

    // unit u: stage s, first k32 step j0, column half h
    __device__ __forceinline__ static int stage_of(int u) { return u / (kUnits / 2); }
    __device__ __forceinline__ static int step_of(int u) { return (u / kHalves) * kChainK % 4; }
    __device__ __forceinline__ static int half_of(int u) { return u % kHalves; }

    __device__ __forceinline__ void issue(float (&f)[kFresh], int u) const {
        const int s = stage_of(u), j0 = step_of(u), h = half_of(u);
        const uint64_t da = smem_desc_k128(a + s * Smem<kWg, kMasterN>::kA);
        const uint64_t db = smem_desc_k128(b + s * Smem<kWg, kMasterN>::kB + h * kUnitN * kStageK);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kChainK; ++j) {
            const uint64_t off = uint64_t(((j0 + j) * 32) >> 4);
            if (j == 0)
                WgmmaE4M3<kUnitN>::mma_fresh(f, da + off, db + off);
            else
                WgmmaE4M3<kUnitN>::mma(f, da + off, db + off, 1);
        }
        wgmma_commit();
    }

    template <int kPending>
    __device__ __forceinline__ void retire(float *acc, float (&f)[kFresh], int u) const {
        const int s = stage_of(u), j = step_of(u), h = half_of(u);
        const float *sas = sa + s * Smem<kWg, kMasterN>::kSa + j * 64 * kWg + wg * 64;
        const float *sbs = sb + s * Smem<kWg, kMasterN>::kSb + j * (kMasterN / 32);
        Scales<kUnitN, true> early;
        if (kMode == kLdsEarly) early.load(sas, sbs, wrow, h);
        wgmma_wait<kPending>();
        fence_operands(f);
        if (kMode == kPromote) {
            Scales<kUnitN, false> sc;
            sc.load(sas, sbs, wrow, h);
            promote<kUnitN, false>(acc, f, sc, h);
        } else if (kMode == kLds) {
            Scales<kUnitN, true> sc;
            sc.load(sas, sbs, wrow, h);
            promote<kUnitN, true>(acc, f, sc, h);
        } else if (kMode == kLdsEarly) {
            promote<kUnitN, true>(acc, f, early, h);
        } else if (kMode == kImm) {
            float *d = acc + h * kFresh;
#pragma unroll
            for (int i = 0; i < kFresh; ++i) d[i] = fmaf(f[i], 0.75f, d[i]);
        } else {
            acc[h * kFresh] = fmaf(f[0], sas[wrow] * sbs[0], acc[h * kFresh]);
        }
    }

    template <int kI> __device__ __forceinline__ void drain(float *acc, float (&ring)[kRing][kFresh]) const {
        if constexpr (kI < kLook) {
            constexpr int u = kUnits - kLook + kI;
            retire<kLook - 1 - kI>(acc, ring[u % kRing], u);
            drain<kI + 1>(acc, ring);
        }
    }

    __device__ __forceinline__ void body(float *acc, float (&ring)[kRing][kFresh]) const {
        if constexpr (kMode == kChain) {
#pragma unroll
            for (int u = 0; u < kUnits; ++u) {
                const int s = stage_of(u), j0 = step_of(u), h = half_of(u);
                const uint64_t da = smem_desc_k128(a + s * Smem<kWg, kMasterN>::kA);
                const uint64_t db = smem_desc_k128(b + s * Smem<kWg, kMasterN>::kB + h * kUnitN * kStageK);
                wgmma_fence();
#pragma unroll
                for (int j = 0; j < kChainK; ++j) {
                    const uint64_t off = uint64_t(((j0 + j) * 32) >> 4);
                    WgmmaE4M3<kUnitN>::mma(slice<kFresh>(acc + h * kFresh), da + off, db + off, 1);
                }
                wgmma_commit();
            }
            wgmma_wait<0>();
            fence_operands(slice<kMasterN / 2>(acc));
        } else {
#pragma unroll
            for (int u = 0; u < kUnits; ++u) {
                issue(ring[u % kRing], u);
                if (u >= kLook) retire<kLook>(acc, ring[(u - kLook) % kRing], u - kLook);
            }
            drain<0>(acc, ring);
        }
    }
};

template <int kWg, int kMasterN, int kUnitN, int kRing, int kChainK, int kMode, int kRegs>
__global__ void __launch_bounds__((kWg + 1) * 128, 1) pipe(float *out, int bodies) {
    using S = Smem<kWg, kMasterN>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *base = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint8_t *a = base;
    uint8_t *b = a + 2 * S::kA;
    float *sa = reinterpret_cast<float *>(b + 2 * S::kB);
    float *sb = sa + 2 * S::kSa;
    // Random e4m3 bytes without NaN patterns (mask 0x77 keeps exponent <= 14),
    // scales powers of two in [2^-3, 2^3].
    for (int i = threadIdx.x; i < 2 * (S::kA + S::kB); i += blockDim.x) {
        uint32_t x = uint32_t(i) * 2654435761u + blockIdx.x * 97u;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        a[i] = uint8_t((x >> 8) & 0x77);
    }
    for (int i = threadIdx.x; i < 2 * (S::kSa + S::kSb); i += blockDim.x) sa[i] = exp2f(float(int(i % 7) - 3));
    fence_proxy_async_smem();
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        regs_dealloc<(kRegs > 232 ? 24 : 40)>();
        return;
    }
    regs_alloc<kRegs>();
    const int t = threadIdx.x - 128;
    const int cw = t / 128, lane = t % 32, warp = (t % 128) / 32;
    Consumer<kWg, kMasterN, kUnitN, kRing, kChainK, kMode> c;
    c.a = a + cw * 64 * kStageK;
    c.b = b;
    c.sa = sa;
    c.sb = sb;
    c.wrow = warp * 16 + lane / 4;
    c.wg = cw;
    float acc[kMasterN / 2];
#pragma unroll
    for (int i = 0; i < kMasterN / 2; ++i) acc[i] = 0.0f;
    float ring[kRing][kUnitN / 2];
    for (int it = 0; it < bodies; ++it) c.body(acc, ring);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMasterN / 2; ++i) sum += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
#else
template <int kWg, int kMasterN, int kUnitN, int kRing, int kChainK, int kMode, int kRegs>
__global__ void pipe(float *out, int bodies) {}
#endif

struct Variant {
    const char *name;
    void (*kernel)(float *, int);
    int wg;
    int master_n;
    int smem;
};

#define V(name, WG, MN, UN, RING, CK, MODE, REGS)                                              \
    Variant {                                                                                  \
        name, pipe<WG, MN, UN, RING, CK, MODE, REGS>, WG, MN, Smem<WG, MN>::kBytes             \
    }

// Registers: 2 consumer warpgroups get 232 (the idle producer 40: 128 * 40 +
// 256 * 232 = 168 * 384) or 240 (producer 24, below what a real producer
// with helper warps needs), 3 get 152 (128 * 40 + 384 * 152 <= 128 * 512).
// Round 1 (default), 2 and 3 (-DDEEPINFER_LAB_ROUND=2 or 3) are the runs of
// README.md's lab section.
static const Variant kVariants[] = {
#if DEEPINFER_LAB_ROUND >= 3
    V("v2-lds       wg2 m128 u64 r2", 2, 128, 64, 2, 1, kLds, 232),
    V("v2-early     wg2 m128 u64 r2", 2, 128, 64, 2, 1, kLdsEarly, 232),
    V("v2-imm       wg2 m128 u64 r2", 2, 128, 64, 2, 1, kImm, 232),
    V("early        wg2 m128 u128 r2 240", 2, 128, 128, 2, 1, kLdsEarly, 240),
    V("early        wg2 m128 u128 r1", 2, 128, 128, 1, 1, kLdsEarly, 232),
    V("per64-early  wg2 m128 u128 r1", 2, 128, 128, 1, 2, kLdsEarly, 232),
    V("per64-early  wg2 m128 u128 r2 240", 2, 128, 128, 2, 2, kLdsEarly, 240),
    V("per128-early wg2 m128 u128 r1", 2, 128, 128, 1, 4, kLdsEarly, 232),
    V("per128-early wg2 m192 u192 r1", 2, 192, 192, 1, 4, kLdsEarly, 232),
#elif DEEPINFER_LAB_ROUND >= 2
    V("v2      wg2 m128 u64 r2", 2, 128, 64, 2, 1, kPromote, 232),
    V("v2-imm  wg2 m128 u64 r2", 2, 128, 64, 2, 1, kImm, 232),
    V("prom    wg2 m128 u128 r2 240", 2, 128, 128, 2, 1, kPromote, 240),
    V("imm     wg2 m128 u128 r2 240", 2, 128, 128, 2, 1, kImm, 240),
    V("per64   wg2 m128 u128 r1", 2, 128, 128, 1, 2, kPromote, 232),
    V("per64   wg2 m128 u64 r2", 2, 128, 64, 2, 2, kPromote, 232),
    V("per64   wg2 m128 u128 r2 240", 2, 128, 128, 2, 2, kPromote, 240),
    V("per128  wg2 m128 u128 r1", 2, 128, 128, 1, 4, kPromote, 232),
    V("per128  wg2 m256 u128 r1", 2, 256, 128, 1, 4, kPromote, 232),
    V("per128  wg2 m192 u192 r1", 2, 192, 192, 1, 4, kPromote, 232),
#else
    V("chain   wg2 m128 u64", 2, 128, 64, 1, 1, kChain, 232),
    V("chain   wg2 m128 u128", 2, 128, 128, 1, 1, kChain, 232),
    V("chain   wg2 m256 u256", 2, 256, 256, 1, 1, kChain, 232),
    V("chain   wg3 m128 u128", 3, 128, 128, 1, 1, kChain, 152),
    V("v2      wg2 m128 u64 r2", 2, 128, 64, 2, 1, kPromote, 232),
    V("v2-noff wg2 m128 u64 r2", 2, 128, 64, 2, 1, kNoFfma, 232),
    V("v1      wg2 m128 u128 r1", 2, 128, 128, 1, 1, kPromote, 232),
    V("prom    wg2 m128 u64 r4", 2, 128, 64, 4, 1, kPromote, 232),
    V("prom    wg2 m128 u128 r2", 2, 128, 128, 2, 1, kPromote, 232),
    V("prom    wg2 m256 u64 r2", 2, 256, 64, 2, 1, kPromote, 232),
    V("prom    wg2 m256 u128 r1", 2, 256, 128, 1, 1, kPromote, 232),
    V("prom    wg2 m192 u96 r2", 2, 192, 96, 2, 1, kPromote, 232),
    V("prom    wg3 m128 u64 r2", 3, 128, 64, 2, 1, kPromote, 152),
    V("prom    wg3 m128 u128 r1", 3, 128, 128, 1, 1, kPromote, 152),
    V("noff    wg3 m128 u64 r2", 3, 128, 64, 2, 1, kNoFfma, 152),
    V("per128  wg2 m128 u128 r1", 2, 128, 128, 1, 4, kPromote, 232),
    V("per128  wg2 m256 u256 r1", 2, 256, 256, 1, 4, kPromote, 232),
    V("per128  wg2 m128 u64 r2", 2, 128, 64, 2, 4, kPromote, 232),
#endif
};

#define CHECK(x)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (x);                                                    \
        if (e_ != cudaSuccess) {                                                 \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                      \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    // ./wgmma_pipe [i]: only variant i, timed once (for ncu: skip the warm-up launch).
    const int only = argc > 1 ? atoi(argv[1]) : -1;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *out = nullptr;
    CHECK(cudaMalloc(&out, size_t(sms) * 512 * sizeof(float)));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const int bodies = 4096;
    printf("{\"sms\": %d, \"bodies\": %d, \"variants\": [\n", sms, bodies);
    const int n = int(sizeof(kVariants) / sizeof(kVariants[0]));
    bool first = true;
    for (int i = 0; i < n; ++i) {
        if (only >= 0 && i != only) continue;
        const Variant &v = kVariants[i];
        CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        const int threads = (v.wg + 1) * 128;
        v.kernel<<<sms, threads, v.smem>>>(out, 16);  // warm-up
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        float best = 1e30f;
        for (int rep = 0; rep < (only >= 0 ? 1 : 5); ++rep) {
            CHECK(cudaEventRecord(e0));
            v.kernel<<<sms, threads, v.smem>>>(out, bodies);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (ms < best) best = ms;
        }
        const double flop = 2.0 * 64 * v.master_n * 256 * v.wg * double(bodies) * sms;
        const double tflops = flop / (best * 1e-3) / 1e12;
        printf("%s  {\"variant\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f, \"of_peak\": %.3f}", first ? "" : ",\n",
               v.name, best, tflops, tflops / 1979.0);
        first = false;
    }
    printf("\n]}\n");
    return 0;
}
