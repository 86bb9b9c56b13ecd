// Lab (not in the production build: build.rs compiles only a family folder's
// own .cu files, not lab/): which of V6's differences from the contiguous
// kernel changes the tensor core's sum of one 32-deep block? (Issue 12,
// docs/wide-ep.md "The experiment".)
//
// One warpgroup computes a 64-row x 8-token block, K = 32, of random e2m1
// weights (as e4m3) and random e4m3 tokens, fresh (scale-d 0), seven ways:
//   0 SS: weights as A, tokens as B, k in order, scale 1 (the dense skinny
//        kernels' roles)
//   1 SS: tokens as A (64 rows, 8 used), weights as B (N = 64), k in order,
//        scale 1 (the contiguous FP4 kernel's roles)
//   2 RS: weights as register A, k in order, scale 1
//   3 RS: weights as register A, k as 16 even then 16 odd (tokens alike),
//        scale 1
//   4 RS: as 3 at scale 2^-6 (V6 as it runs), result times 64
//   5 RS: as 2 at scale 2^-6, result times 64
//   6 SS: as 0 at scale 2^-6, result times 64
// and prints, for each way, how many of the outputs differ in bits from
// way 1 and from way 0 over all trials. The products are exact in every
// way (and the scaled ones exactly 2^-6 times the others), so any
// difference is the order or grouping of the tensor core's sum.
//
// Build here, run on the device machine (it needs no library but the CUDA
// runtime):
//   $DEEPINFER_CUDA_ROOT/bin/nvcc -O3 -std=c++17 -arch=sm_90a \
//       -Ikernels-cuda/include -L$DEEPINFER_CUDA_ROOT/lib \
//       kernels-cuda/gemm_skinny/lab/wgmma_block_order.cu -o wgmma_block_order
//   ./wgmma_block_order [trials]        (on the device machine; default 2000)
// (ptxas: 98 registers, 30 KiB of static shared memory, 7 GMMA in the SASS.)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "deepinfer/sm90.cuh"
#include "deepinfer/wgmma_e4m3.cuh"

constexpr int kWays = 7;
constexpr int kRows = 64, kTok = 8, kK = 32;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace deepinfer::sm90;

__device__ __forceinline__ void wgmma_rs_m64n8k32(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n"
        "}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// Row r's 32 bytes into a 128-byte-swizzled K-major tile (pieces 0 and 1 of
// the row; the other pieces stay zero).
__device__ __forceinline__ void put_row(uint8_t *tile, int r, const uint8_t *src) {
    for (int j = 0; j < 2; ++j) memcpy(tile + r * 128 + ((j ^ (r & 7)) * 16), src + 16 * j, 16);
}

// 4 bytes of row `r` of `w` ([64][32]) at k positions `k[0..3]`.
__device__ __forceinline__ uint32_t gather4(const uint8_t *w, int r, int k0, int step) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(w[r * kK + k0 + i * step]) << (8 * i);
    return v;
}

// One trial per CTA of 128 threads. w_nat / w_sc: [trials][64][32] e4m3 of
// the weights at scale 1 and 2^-6; x: [trials][8][32] e4m3 tokens.
// out: [trials][ways][64][8] fp32.
__global__ void __launch_bounds__(128) block_order(const uint8_t *w_nat_g, const uint8_t *w_sc_g,
                                                  const uint8_t *x_g, float *out_g) {
    __shared__ __align__(1024) uint8_t wa[kRows * 128];     // weights, scale 1
    __shared__ __align__(1024) uint8_t wa_sc[kRows * 128];  // weights, scale 2^-6
    __shared__ __align__(1024) uint8_t xa[kRows * 128];     // tokens as A (rows 8.. zero)
    __shared__ __align__(1024) uint8_t xb[8 * 128];         // tokens as B, k in order
    __shared__ __align__(1024) uint8_t xbp[8 * 128];        // tokens as B, even then odd
    __shared__ uint8_t w_nat[kRows * kK], w_sc[kRows * kK];
    const int tid = threadIdx.x, trial = blockIdx.x;
    const uint8_t *wn = w_nat_g + size_t(trial) * kRows * kK, *ws = w_sc_g + size_t(trial) * kRows * kK;
    const uint8_t *x = x_g + size_t(trial) * kTok * kK;
    for (int i = tid; i < kRows * 128; i += 128) wa[i] = wa_sc[i] = xa[i] = 0;
    for (int i = tid; i < 8 * 128; i += 128) xb[i] = xbp[i] = 0;
    for (int i = tid; i < kRows * kK; i += 128) {
        w_nat[i] = wn[i];
        w_sc[i] = ws[i];
    }
    __syncthreads();
    if (tid < kRows) {
        put_row(wa, tid, wn + tid * kK);
        put_row(wa_sc, tid, ws + tid * kK);
    }
    if (tid < kTok) {
        put_row(xa, tid, x + tid * kK);
        put_row(xb, tid, x + tid * kK);
        uint8_t perm[kK];
        for (int p = 0; p < 16; ++p) {
            perm[p] = x[tid * kK + 2 * p];
            perm[16 + p] = x[tid * kK + 2 * p + 1];
        }
        put_row(xbp, tid, perm);
    }
    __syncthreads();
    fence_proxy_async_smem();
    __syncthreads();

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int r0 = 16 * warp + g;
    float d[kWays][4];
    float d1[32];  // way 1: 64 tokens x 64 rows, this thread's part
    using M8 = WgmmaE4M3<8>;
    using M64 = WgmmaE4M3<64>;
    // Register A fragments: natural k (4 tg .. 4 tg + 3, 16 + 4 tg ..) and
    // even/odd (position 4 tg + i holds k 8 tg + 2 i, position 16 + 4 tg + i
    // holds k 8 tg + 2 i + 1).
    uint32_t an[4], ap[4], an_sc[4], ap_sc[4];
    for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        an[h] = gather4(w_nat, r, 4 * tg, 1);
        an[2 + h] = gather4(w_nat, r, 16 + 4 * tg, 1);
        ap[h] = gather4(w_nat, r, 8 * tg, 2);
        ap[2 + h] = gather4(w_nat, r, 8 * tg + 1, 2);
        an_sc[h] = gather4(w_sc, r, 4 * tg, 1);
        an_sc[2 + h] = gather4(w_sc, r, 16 + 4 * tg, 1);
        ap_sc[h] = gather4(w_sc, r, 8 * tg, 2);
        ap_sc[2 + h] = gather4(w_sc, r, 8 * tg + 1, 2);
    }
    const uint64_t dwa = smem_desc_k128(wa), dwa_sc = smem_desc_k128(wa_sc), dxa = smem_desc_k128(xa);
    const uint64_t dxb = smem_desc_k128(xb), dxbp = smem_desc_k128(xbp);
    wgmma_fence();
    M8::mma_fresh(d[0], dwa, dxb);
    M64::mma_fresh(d1, dxa, dwa);
    wgmma_rs_m64n8k32(d[2], an, dxb);
    wgmma_rs_m64n8k32(d[3], ap, dxbp);
    wgmma_rs_m64n8k32(d[4], ap_sc, dxbp);
    wgmma_rs_m64n8k32(d[5], an_sc, dxb);
    M8::mma_fresh(d[6], dwa_sc, dxb);
    wgmma_commit();
    wgmma_wait<0>();
    for (int v = 0; v < kWays; ++v) fence_operands(d[v]);
    fence_operands(d1);

    float *out = out_g + size_t(trial) * kWays * kRows * kTok;
    for (int v = 0; v < kWays; ++v) {
        if (v == 1) continue;
        const float s = v >= 4 ? 64.0f : 1.0f;
        // Accumulator: rows r0, r0 + 8; tokens 2 tg, 2 tg + 1.
        out[(v * kRows + r0) * kTok + 2 * tg] = d[v][0] * s;
        out[(v * kRows + r0) * kTok + 2 * tg + 1] = d[v][1] * s;
        out[(v * kRows + r0 + 8) * kTok + 2 * tg] = d[v][2] * s;
        out[(v * kRows + r0 + 8) * kTok + 2 * tg + 1] = d[v][3] * s;
    }
    // Way 1: D[token][weight row]; this thread holds tokens r0, r0 + 8 and
    // weight rows 8 i + 2 tg + {0, 1}. Only tokens < 8 (warp 0, g < 8) exist.
    if (warp == 0) {
        for (int i = 0; i < 8; ++i) {
            for (int c = 0; c < 2; ++c) {
                const int row = 8 * i + 2 * tg + c;
                out[(1 * kRows + row) * kTok + g] = d1[4 * i + c];
            }
        }
    }
}
#else
__global__ void block_order(const uint8_t *, const uint8_t *, const uint8_t *, float *) {}
#endif

// e2m1 magnitude code (0..7) as e4m3 at scale 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
static const uint8_t kE4m3OfE2m1[8] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return uint32_t(rng_state >> 16);
}

int main(int argc, char **argv) {
    const int trials = argc > 1 ? atoi(argv[1]) : 2000;
    const size_t wn = size_t(trials) * kRows * kK, xn = size_t(trials) * kTok * kK;
    std::vector<uint8_t> w_nat(wn), w_sc(wn), x(xn);
    for (size_t i = 0; i < wn; ++i) {
        const uint32_t code = next_u32() & 15u, sign = code >> 3, mag = code & 7u;
        w_nat[i] = uint8_t((sign << 7) | kE4m3OfE2m1[mag]);
        w_sc[i] = uint8_t((sign << 7) | (mag << 2));  // V6's decode: 2^-6 times the value
    }
    for (size_t i = 0; i < xn; ++i) {
        uint8_t b;
        do {
            b = uint8_t(next_u32());
        } while ((b & 0x7F) == 0x7F);  // no NaN
        x[i] = b;
    }
    uint8_t *dw, *dws, *dx;
    float *dout;
    const size_t on = size_t(trials) * kWays * kRows * kTok;
    cudaMalloc(&dw, wn);
    cudaMalloc(&dws, wn);
    cudaMalloc(&dx, xn);
    cudaMalloc(&dout, on * sizeof(float));
    cudaMemcpy(dw, w_nat.data(), wn, cudaMemcpyHostToDevice);
    cudaMemcpy(dws, w_sc.data(), wn, cudaMemcpyHostToDevice);
    cudaMemcpy(dx, x.data(), xn, cudaMemcpyHostToDevice);
    cudaMemset(dout, 0xFF, on * sizeof(float));  // NaN poison
    block_order<<<trials, 128>>>(dw, dws, dx, dout);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("kernel failed: %s\n", cudaGetErrorString(e));
        return 1;
    }
    std::vector<float> out(on);
    cudaMemcpy(out.data(), dout, on * sizeof(float), cudaMemcpyDeviceToHost);
    const char *names[kWays] = {"0 SS w=A scale 1",        "1 SS w=B scale 1 (contiguous)",
                                "2 RS nat scale 1",        "3 RS even/odd scale 1",
                                "4 RS even/odd 2^-6 (V6)", "5 RS nat 2^-6",
                                "6 SS w=A 2^-6"};
    long nan = 0;
    for (float v : out) nan += v != v;
    printf("%d trials x %d outputs; NaN (unwritten) outputs: %ld\n", trials, kRows * kTok, nan);
    for (int v = 0; v < kWays; ++v) {
        long vs1 = 0, vs0 = 0;
        for (int t = 0; t < trials; ++t) {
            for (int i = 0; i < kRows * kTok; ++i) {
                const size_t base = size_t(t) * kWays * kRows * kTok;
                uint32_t a, b, c;
                memcpy(&a, &out[base + size_t(v) * kRows * kTok + i], 4);
                memcpy(&b, &out[base + size_t(1) * kRows * kTok + i], 4);
                memcpy(&c, &out[base + i], 4);
                vs1 += a != b;
                vs0 += a != c;
            }
        }
        printf("way %-32s differs from way 1 in %8ld, from way 0 in %8ld of %ld\n", names[v], vs1, vs0,
               long(trials) * kRows * kTok);
    }
    return 0;
}
