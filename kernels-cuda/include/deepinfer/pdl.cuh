/* Programmatic dependent launch (PDL, sm_90+): the first statement of every
 * kernel of kernels-cuda is DI_PDL_ENTRY(), which the build detects
 * (build/cuda.rs, `entry_points`) and which lets the launcher put the
 * kernel on the stream with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
 * (src/cuda_backend/mod.rs, `launch`): the kernel may then be scheduled
 * while the kernel before it on the stream still runs.
 *
 * Invariant: nothing before DI_PDL_ENTRY() touches global memory.
 * `griddepcontrol.wait` returns once every prerequisite grid has completed
 * and its memory operations are visible to this grid (a no-op when the
 * kernel was launched without the attribute), so the kernel reads and
 * writes exactly what it would under plain stream order. Only then does
 * `griddepcontrol.launch_dependents` let the next PDL kernel be scheduled
 * (its CTAs wait in their own entry until this grid completes): a chain is
 * at most one kernel ahead, and a dependent is scheduled only once every
 * CTA of this grid is resident, so no kernel starves the one before it.
 *
 * DI_PDL_PREFETCH_ENTRY(hint) is the same entry with `hint` run before the
 * wait: a kernel whose operands include constants of the model (weights no
 * kernel of a step writes) may ask L2 for them there, so their first loads
 * overlap the kernel before it. `hint` may only issue L2 prefetches
 * (`pdl_prefetch_l2`): a prefetch brings nothing into the kernel (L2 is
 * the device's point of coherence, a later write still reaches every
 * reader), so the invariant above holds and results cannot change. */
#ifndef DEEPINFER_PDL_CUH
#define DEEPINFER_PDL_CUH

#include <stdint.h>

namespace deepinfer {
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for `bytes` (a multiple of 16) at `p` (16-byte aligned): a hint,
// asynchronous, never waited for.
__device__ __forceinline__ void pdl_prefetch_l2(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
}  // namespace deepinfer

#define DI_PDL_ENTRY() deepinfer::pdl_entry()
#define DI_PDL_PREFETCH_ENTRY(hint) \
    do {                            \
        hint;                       \
        deepinfer::pdl_entry();     \
    } while (0)

#endif
