/* Shared-memory addresses, mbarriers and bulk (TMA, non-tensor) copies: the
 * sm_90 feature set that sm_100a keeps, shared by the hand-written kernels
 * (through sm90.cuh) and the TileLang programs (through
 * tilelang/include/deepinfer_tl/compat.cuh, which call them by their
 * qualified names with T.call_extern).
 *
 * Everything here exists only in device passes for sm_90 and later. */
#ifndef DEEPINFER_ASYNC_COPY_CUH
#define DEEPINFER_ASYNC_COPY_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace deepinfer {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* ---- mbarriers ---------------------------------------------------------- */

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals));
}

/* Makes initialised barriers visible to the async proxy (TMA); follow with a
 * CTA barrier before any thread uses them. */
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* One arrival that also announces `bytes` of TMA traffic to wait for. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* Spins until the phase with parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

/* ---- bulk copies ------------------------------------------------------------ */

/* One contiguous global -> shared copy of `bytes` (a multiple of 16, both
 * addresses 16-byte aligned) by the async proxy, counted on `bar`'s
 * transaction bytes. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* Orders this thread's generic-proxy shared-memory accesses before later
 * async-proxy ones: thread-written wgmma operands before the wgmma, or a
 * stage's reads before the next bulk copy overwrites it (then a barrier). */
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace sm90
}  // namespace deepinfer
#endif
#endif
