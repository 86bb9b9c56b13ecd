/* Hopper (sm_90a) building blocks shared by the tensor-core kernels: shared
 * memory addresses, mbarriers, TMA tile loads, wgmma fences and shared-memory
 * matrix descriptors and register reallocation (the e2m1 decodes live in
 * numerics.cuh).
 *
 * Everything here exists only in the sm_90a device pass
 * (__CUDA_ARCH_FEAT_SM90_ALL); kernels guard their Hopper code with the same
 * macro. The wgmma wrappers themselves are generated: wgmma_e4m3.cuh.
 *
 * Shared-memory operand layout assumed by smem_desc_k128: a tile of R rows,
 * each row 128 bytes of K (128 e4m3 values), rows contiguous, tile base
 * 1024-byte aligned, written by TMA with CU_TENSOR_MAP_SWIZZLE_128B (or by
 * threads applying the same swizzle: 16-byte chunk c of row r lands at chunk
 * c ^ (r % 8)). One wgmma k-step (32 bytes of K) starts 32 * step bytes into
 * the row; the hardware applies the swizzle to the resulting addresses. */
#ifndef DEEPINFER_SM90_CUH
#define DEEPINFER_SM90_CUH

#include <stdint.h>

#include "async_copy.cuh"
#include "wgmma_e4m3.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace deepinfer {
namespace sm90 {

/* ---- TMA ------------------------------------------------------------------ */

/* `map` is the address of a CUtensorMap in kernel parameter space (a member
 * of a __grid_constant__ struct) or global memory. */
__device__ __forceinline__ void tma_prefetch_map(const void *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

/* Loads the box at coordinates (c0 innermost, c1) into `dst` and completes
 * its bytes on `bar`. Out-of-range elements are written as zeros. */
__device__ __forceinline__ void tma_load_2d(void *dst, const void *map, uint64_t *bar, int32_t c0,
                                            int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4}], [%2];" ::"r"(smem_u32(dst)),
        "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void tma_load_3d(void *dst, const void *map, uint64_t *bar, int32_t c0,
                                            int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_u32(dst)),
        "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/* ---- wgmma ---------------------------------------------------------------- */

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* Waits until at most `N` committed wgmma groups are still in flight. */
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving accesses to an accumulator register across
 * a wgmma fence, commit or wait. */
__device__ __forceinline__ void fence_operand(float &r) { asm volatile("" : "+f"(r)::"memory"); }

template <int N> __device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) fence_operand(d[i]);
}

/* Descriptor of a K-major operand tile in the 128-byte-swizzled layout
 * described at the top of this file, starting at `p` (the tile base plus
 * 32 * k-step bytes). Stride between 8-row groups: 1024 bytes. */
__device__ __forceinline__ uint64_t smem_desc_k128(const void *p) {
    const uint64_t addr = smem_u32(p);
    uint64_t desc = 0;
    desc |= (addr & 0x3FFFF) >> 4;          /* start address, bits 0-13 */
    desc |= uint64_t(1) << 16;              /* leading byte offset (unused when swizzled) */
    desc |= uint64_t(1024 >> 4) << 32;      /* stride byte offset: 8 rows of 128 B */
    desc |= uint64_t(1) << 62;              /* layout: 128-byte swizzle */
    return desc;
}

/* ---- named barriers (id 0 is __syncthreads) ------------------------------- */

/* Barrier `id` over `threads` threads (whole warps). */
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* Barrier `id` over `threads` threads that returns whether any of them passed
 * pred = true (barrier.red.or). */
__device__ __forceinline__ bool bar_or(uint32_t id, uint32_t threads, bool pred) {
    uint32_t any;
    asm volatile(
        "{\n"
        ".reg .pred p, q;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "barrier.red.or.pred q, %2, %3, p;\n"
        "selp.u32 %0, 1, 0, q;\n"
        "}\n"
        : "=r"(any)
        : "r"(uint32_t(pred)), "r"(id), "r"(threads)
        : "memory");
    return any != 0;
}

/* Atomic add with acquire-release semantics at GPU scope; returns the old
 * value. One thread of a CTA takes a ticket after a CTA barrier: the release
 * is cumulative, so it publishes every write the barrier ordered before it
 * (the CUTLASS semaphore pattern, one fence per CTA instead of one per thread). */
__device__ __forceinline__ uint32_t atom_add_acq_rel_gpu(uint32_t *addr, uint32_t v) {
    uint32_t old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(addr), "r"(v) : "memory");
    return old;
}

/* ---- register reallocation between warpgroups ----------------------------- */

template <uint32_t R> __device__ __forceinline__ void regs_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

template <uint32_t R> __device__ __forceinline__ void regs_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}

}  // namespace sm90
}  // namespace deepinfer
#endif

#endif
