// deepinfer's minimal stand-in for the TileLang CUDA runtime headers.
//
// tilelang/generate.py replaces the `#include <tl_templates/cuda/...>` lines
// of TileLang-emitted kernels with this one header, so the generated sources
// build with the CUDA toolkit alone (no TileLang wheel, no CUTLASS/CuTe).
// It defines only the types and device functions our generated kernels use;
// a kernel that needs more fails to compile and the missing name shows up in
// the nvcc error (add it here, written from its documented meaning).
//
// Numerics: every function is exact IEEE fp32 (no approximations). Compile
// the kernels WITHOUT --use_fast_math / -ftz=true: the E8M0 quantisers rely
// on fp32 subnormals surviving (2^-127 for +-inf inputs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// mbarriers and bulk copies (kernels-cuda/include): programs call them by
// their qualified names (deepinfer::sm90::...) through T.call_extern.
#include "deepinfer/async_copy.cuh"
// DI_PDL_ENTRY(), which generate.py makes every entry point's first
// statement (programmatic dependent launch, kernels-cuda/README.md).
#include "deepinfer/pdl.cuh"

#define DEEPINFER_TL_DEVICE __device__ __forceinline__

// ---- scalar and vector storage types named by the emitted code -----------

typedef unsigned char uchar;
typedef unsigned int uint;

typedef __nv_bfloat16 bfloat16_t;
typedef __nv_fp8_e4m3 fp8_e4_t;
typedef __nv_fp8_e5m2 fp8_e5_t;

// Packed fp8 vectors: plain byte storage with the alignment of their width.
// The emitted code only copies them whole and writes their bytes through
// __nv_fp8x2_storage_t pointers (element i at byte i).
struct alignas(2) fp8_e4_2_t { __nv_fp8_storage_t v[2]; };
struct alignas(4) fp8_e4_4_t { __nv_fp8_storage_t v[4]; };
struct alignas(8) fp8_e4_8_t { __nv_fp8_storage_t v[8]; };
struct alignas(16) fp8_e4_16_t { __nv_fp8_storage_t v[16]; };

static_assert(sizeof(fp8_e4_t) == 1, "fp8_e4_t must be one byte");
static_assert(sizeof(fp8_e4_4_t) == 4 && sizeof(fp8_e4_8_t) == 8 &&
                  sizeof(fp8_e4_16_t) == 16,
              "fp8 vector sizes");

// Two bf16 bit patterns packed into one 32-bit word, x in the low half.
DEEPINFER_TL_DEVICE unsigned __pack_nv_bfloat162(const bfloat16_t x, const bfloat16_t y) {
    const unsigned lo = __bfloat16_as_ushort(x);
    const unsigned hi = __bfloat16_as_ushort(y);
    return (hi << 16) | lo;
}

// Clamp of x to [lo, hi] that gives NaN for a NaN x (PTX max.NaN / min.NaN:
// the canonical NaN, not x's payload), in two instructions and no branch.
// For callers whose outputs do not depend on a NaN's payload (the SwiGLU's u:
// a NaN h becomes the e4m3 NaN code whatever its bits).
DEEPINFER_TL_DEVICE float deepinfer_clamp_nan(float x, float lo, float hi) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(lo));
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(r), "f"(hi));
    return r;
}

namespace tl {

// ---- element-wise helpers --------------------------------------------------

// Clamp that lets NaN through (x NaN -> x; NaN bounds -> that bound), so a
// following satfinite fp8 conversion maps NaN inputs to the NaN code.
DEEPINFER_TL_DEVICE float clamp(float x, float lo, float hi) {
    if (x != x) return x;
    if (lo != lo) return lo;
    if (hi != hi) return hi;
    return fminf(fmaxf(x, lo), hi);
}

// Packed fp32x2 forms used by TileLang's sm_100 vectoriser. Per-lane IEEE
// round-to-nearest, identical to the scalar ops.
DEEPINFER_TL_DEVICE float2 mul2(float2 a, float2 b) {
    return make_float2(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y));
}
DEEPINFER_TL_DEVICE float2 add2(float2 a, float2 b) {
    return make_float2(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y));
}
DEEPINFER_TL_DEVICE float2 max2(float2 a, float2 b) {
    return make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y));
}
DEEPINFER_TL_DEVICE float2 min2(float2 a, float2 b) {
    return make_float2(fminf(a.x, b.x), fminf(a.y, b.y));
}
DEEPINFER_TL_DEVICE float2 abs2(float2 a) { return make_float2(fabsf(a.x), fabsf(a.y)); }

// ---- cross-lane reduction ----------------------------------------------------

// Max that ignores NaN operands (fmaxf), like the CPU reference's f32::max.
struct MaxOp {
    DEEPINFER_TL_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    DEEPINFER_TL_DEVICE float operator()(float a, float b) const { return a + b; }
};

// Barrier over the first kThreads threads of the block (PTX `bar.sync id, n`;
// kThreads a multiple of 32). Reductions wider than a warp use ids 1 and 2;
// __syncthreads() keeps id 0.
template <int kThreads> struct NamedBarrier {
    static_assert(kThreads % 32 == 0 && kThreads <= 1024, "bar.sync counts whole warps");
    template <int kId = 1> static DEEPINFER_TL_DEVICE void sync() {
        asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
    }
};

// AllReduce<Op, kThreads, kScale, kOffset, Barrier>::run(v, red_buf): combine
// v over the kThreads / kScale threads whose index t = threadIdx.x - kOffset
// differs only in the bits from kScale up to kThreads; every one of them gets
// the same result. The order is fixed by the template arguments alone:
//   1. inside a warp, xor butterfly from offset min(kThreads, 32)/2 down to kScale;
//   2. when kThreads > 32, each thread writes its value to red_buf[t] (shared,
//      at least kThreads elements per group) and then folds the values of the
//      group's kThreads / max(kScale, 32) participants in increasing t order.
// Every thread of the group must call it (the barriers count them all).
template <class Op, int kThreads, int kScale, int kOffset, class Barrier>
struct AllReduce {
    static_assert((kThreads & (kThreads - 1)) == 0 && (kScale & (kScale - 1)) == 0 &&
                      kScale >= 1 && kScale <= kThreads,
                  "AllReduce widths must be powers of two");
    static constexpr int kWarpSpan = kThreads < 32 ? kThreads : 32;
    static constexpr int kStride = kScale > 32 ? kScale : 32;

    template <class V> static DEEPINFER_TL_DEVICE V run(V v, V* red_buf = nullptr) {
#pragma unroll
        for (int off = kWarpSpan / 2; off >= kScale; off /= 2) {
            v = Op()(v, __shfl_xor_sync(0xffffffffu, v, off));
        }
        if constexpr (kThreads > 32) {
            const int t = int(threadIdx.x) - kOffset;
            const V* group = red_buf + (t & ~(kThreads - 1)) + (t & (kStride - 1));
            Barrier::template sync<1>();  // red_buf may still be read by a previous call
            red_buf[t] = v;
            Barrier::template sync<2>();
            v = group[0];
#pragma unroll
            for (int k = 1; k < kThreads / kStride; ++k) {
                v = Op()(v, group[k * kStride]);
            }
        }
        return v;
    }
};

}  // namespace tl

// ---- tensor cores through T.call_extern (mma.sync m16n8k16, BF16 -> fp32) --
//
// Fragment layouts as the PTX ISA gives them for mma.m16n8k16 with .bf16
// ("Matrix fragments for mma.m16n8k16"): lane = 4 g + t. A (16 x 16, row
// major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1], a[2] = A[g][2t+8..],
// a[3] = A[g+8][2t+8..]. B (16 x 8, column major: B[k][n] stored as row n of
// k): b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]. C/D (16 x 8): d[0..1] =
// D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].

// The A fragment from shared memory: r0 points at A[g][2t], r8 at A[g+8][2t]
// (4-byte aligned; the row-major tile's rows may be padded).
DEEPINFER_TL_DEVICE void deepinfer_ldfrag_a_16816(unsigned* a, const bfloat16_t* r0,
                                                  const bfloat16_t* r8) {
    a[0] = *reinterpret_cast<const unsigned*>(r0);
    a[1] = *reinterpret_cast<const unsigned*>(r8);
    a[2] = *reinterpret_cast<const unsigned*>(r0 + 8);
    a[3] = *reinterpret_cast<const unsigned*>(r8 + 8);
}

// d += A * B for the A fragment a and the B fragment read from shared memory
// at b, which points at B[2t][g] = row g, column 2t of the [n][k] tile
// (4-byte aligned). The products of BF16 values are exact in fp32; the sums
// are the tensor core's fp32 accumulation.
DEEPINFER_TL_DEVICE void deepinfer_mma_bf16_16816(float* d, const unsigned* a,
                                                  const bfloat16_t* b) {
    const unsigned b0 = *reinterpret_cast<const unsigned*>(b);
    const unsigned b1 = *reinterpret_cast<const unsigned*>(b + 8);
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
