// Fixed-order block reductions. The tree shape depends only on blockDim, never
// on the data or the grid, so a row reduces the same way at every batch size
// (batch invariance).
#pragma once

namespace deepinfer {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one
// float per warp. blockDim.x must be a multiple of 32 and at most 1024.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

}  // namespace deepinfer
