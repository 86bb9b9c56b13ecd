// The random-weight generator on the device (ops/random.rs), bitwise
// weight_rng.rs: splitmix64 counters mixed per draw, Irwin-Hall normals in
// f64 with every operation rounded on its own (no contraction), the values
// rounded once to f32, then the stored format's quantiser.
// Layout: values [rows, cols] (F32, BF16, e4m3 bytes, or packed e2m1 pairs
// cols / 2 bytes a row); scales E8M0 bytes, [ceil(rows / br), ceil(cols / bc)]
// for the FP8 blocks, [rows, ceil(cols / 32)] for FP4.
#include <cuda_bf16.h>
#include "deepinfer/pdl.cuh"
#include "deepinfer/numerics.cuh"
#include "deepinfer/params.h"

namespace {

using namespace deepinfer;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
constexpr int kFp4Block = 32;
constexpr int kMaxThreads = 256;

__device__ __forceinline__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// weight_rng::values at flat element i.
__device__ __forceinline__ float value(const di_random_params &p, int64_t i) {
    const uint64_t base = p.key + uint64_t(i) * 4ull * kGamma;
    const double sqrt3 = __longlong_as_double(0x3ffbb67ae8584caall);
    double sum = 0.0;
#pragma unroll
    for (uint64_t j = 1; j <= 4; ++j) {
        const uint64_t u = mix(base + j * kGamma) >> 11;
        // Exact: a 53-bit integer times 2^-53.
        sum = __dadd_rn(sum, __dmul_rn(__ull2double_rn(u), 0x1p-53));
    }
    const double g = __dmul_rn(__dsub_rn(sum, 2.0), sqrt3);
    return __double2float_rn(__dadd_rn(p.mean, __dmul_rn(p.std_dev, g)));
}

__device__ __forceinline__ int64_t first_index() {
    return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t stride() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace

extern "C" __global__ void random_f32(const __grid_constant__ di_random_params p) {
    DI_PDL_ENTRY();
    float *out = static_cast<float *>(p.values);
    const int64_t n = p.rows * p.cols;
    for (int64_t i = first_index(); i < n; i += stride()) out[i] = value(p, i);
}

extern "C" __global__ void random_bf16(const __grid_constant__ di_random_params p) {
    DI_PDL_ENTRY();
    __nv_bfloat16 *out = static_cast<__nv_bfloat16 *>(p.values);
    const int64_t n = p.rows * p.cols;
    for (int64_t i = first_index(); i < n; i += stride()) out[i] = __float2bfloat16_rn(value(p, i));
}

// One CTA per scale block (grid-stride over the blocks): the block's amax
// over every cell (floored at 1e-4; max is exact in any order), then each
// cell again, e4m3(v / 2^e). blockDim.x is a multiple of 32, at most 256.
extern "C" __global__ void random_fp8_blocks(const __grid_constant__ di_random_params p) {
    DI_PDL_ENTRY();
    __shared__ float warp_max[kMaxThreads / 32];
    uint8_t *codes = static_cast<uint8_t *>(p.values);
    const int64_t grid_cols = (p.cols + p.block_cols - 1) / p.block_cols;
    const int64_t blocks = (p.rows + p.block_rows - 1) / p.block_rows * grid_cols;
    for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        const int64_t r0 = b / grid_cols * p.block_rows, c0 = b % grid_cols * p.block_cols;
        const int64_t h = min(p.block_rows, p.rows - r0), w = min(p.block_cols, p.cols - c0);
        float amax = kFp8AmaxFloor;
        for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x)
            amax = fmaxf(amax, fabsf(value(p, (r0 + k / w) * p.cols + c0 + k % w)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
        __syncthreads();
        amax = warp_max[0];
        for (int i = 1; i < int(blockDim.x / 32); ++i) amax = fmaxf(amax, warp_max[i]);
        // Every thread has read warp_max before the next block overwrites it.
        __syncthreads();
        const int e = ceil_pow2_exponent(amax, kInvE4M3Max);
        const float s = e8m0_to_f32(uint32_t(e + 127));
        for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
            const int64_t i = (r0 + k / w) * p.cols + c0 + k % w;
            codes[i] = f32_to_e4m3(__fdiv_rn(value(p, i), s));
        }
        if (threadIdx.x == 0) p.scales[b] = uint8_t(e + 127);
    }
}

// One thread per 32-block of a row (grid-stride): the values rounded to
// BF16, the amax as bit patterns from the 6 * FLT_MIN floor (NaN-keeping, as
// numerics::fp4_e8m0_quant_block), the scale 2^ceil(log2(amax / 6)), the
// e2m1 codes of the clamped quotients, packed even-low.
extern "C" __global__ void random_fp4(const __grid_constant__ di_random_params p) {
    DI_PDL_ENTRY();
    uint8_t *packed = static_cast<uint8_t *>(p.values);
    const int64_t nblk = (p.cols + kFp4Block - 1) / kFp4Block;
    const int64_t n = p.rows * nblk;
    for (int64_t t = first_index(); t < n; t += stride()) {
        const int64_t r = t / nblk, c0 = t % nblk * kFp4Block;
        const int len = int(min(int64_t(kFp4Block), p.cols - c0));
        float v[kFp4Block];
        float amax = kFp4E8M0AmaxFloor;
#pragma unroll
        for (int k = 0; k < kFp4Block; ++k) {
            v[k] = k < len ? __bfloat162float(__float2bfloat16_rn(value(p, r * p.cols + c0 + k))) : 0.0f;
            if (k < len) amax = amax_keep_nan(amax, fabsf(v[k]));
        }
        const bool finite = __float_as_uint(amax) < 0x7f800000u;
        const int e = finite ? ceil_pow2_exponent(amax, kInvE2M1Max) : 0;
        const float s = e8m0_to_f32(uint32_t(e + 127));
        uint8_t *row = packed + r * (p.cols / 2) + c0 / 2;
#pragma unroll
        for (int k = 0; k < kFp4Block; k += 2) {
            if (k < len) {
                const uint32_t lo = finite ? f32_to_e2m1(clamp6(__fdiv_rn(v[k], s))) : kFp4NanBlockCode;
                const uint32_t hi = finite ? f32_to_e2m1(clamp6(__fdiv_rn(v[k + 1], s))) : kFp4NanBlockCode;
                row[k / 2] = uint8_t((lo & 0xFu) | (hi << 4));
            }
        }
        p.scales[t] = finite ? uint8_t(e + 127) : uint8_t(kE8M0Nan);
    }
}
