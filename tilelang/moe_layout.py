"""The grouped-GEMM layout of a routed batch (issue 6, item 6) in TileLang: per-expert
token counts, exclusive offsets and the permutation of routed entries grouped by expert.

Semantics (bit-exact twin of `cpu_backend::moe_layout::moe_layout`)
-------------------------------------------------------------------
Input ids int32 [N] (N = T * top_k, the `ids` of moe_route.py flattened; entry
j = token * top_k + slot), every id in 0..E. Outputs:

    counts[e]    = #{j : ids[j] == e}                              int32 [E]
    offsets[e]   = #{j : ids[j] <  e}  (exclusive prefix sum)      int32 [E + 1]
    offsets[E]   = offsets[E-1] + counts[E-1]  (= N)
    perm[offsets[e] + r] = the r-th smallest j with ids[j] == e     int32 [N]

i.e. a stable counting sort by expert id: grouped by expert in ascending id, and within
an expert in ascending entry index (= ascending token, as a token selects an expert once).

Deterministic by construction: no atomics; every output element has exactly one writer
whose value depends on the input only.

Work mapping
------------
One CTA of THREADS = 512 threads per expert e (grid = E). Pass 1: the CTA reads all N
ids (coalesced, strided by 512) and counts ids < e and ids == e; the per-thread counts
are reduced with xor-shuffles and a 16-slot shared array (integer sums: exact in any
order). Thread 0 writes counts[e] and offsets[e] (and offsets[E] in the last CTA).
Pass 2 (skipped when counts[e] == 0): tiles of 512 entries in ascending j; each thread
flags ids[j] == e, a warp ballot gives its rank in the warp, the 16 warp totals in shared
memory the rank of its warp, and a flagged entry goes to perm[offsets[e] + found + rank],
found being the flags of the earlier tiles. The loop stops (uniformly) once all counts[e]
entries are placed. Every CTA reads the N ids twice (from L2 after the first CTAs).

Launch: grid = (E, 1, 1), block = (512, 1, 1), 128 bytes of dynamic shared memory.
"""

import tilelang.language as T

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_moe_layout"

WARP = 32
THREADS = 512
WARPS = THREADS // WARP  # 16
FULL = 0xFFFFFFFF


def moe_layout(threads: int = THREADS):
    """Build the TileLang PrimFunc: one CTA of `threads` threads per expert."""
    warps = threads // WARP

    n_entries = T.dynamic("n_entries")  # N = T * top_k
    n_experts = T.dynamic("n_experts")  # E

    @T.prim_func
    def deepinfer_moe_layout(
        ids: T.Tensor((n_entries,), T.int32),
        counts: T.Tensor((n_experts,), T.int32),
        offsets: T.Tensor((n_experts + 1,), T.int32),
        perm: T.Tensor((n_entries,), T.int32),
    ):
        with T.Kernel(n_experts, threads=threads) as e:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            # Row 0: per-warp "below e" counts / ballot totals; row 1: per-warp "== e" counts.
            red = T.alloc_shared((2, warps), T.int32)
            lt = T.alloc_var(T.int32)
            eq = T.alloc_var(T.int32)
            base = T.alloc_var(T.int32)
            found = T.alloc_var(T.int32)
            before = T.alloc_var(T.int32)
            total = T.alloc_var(T.int32)
            v = T.alloc_var(T.int32)

            # 1. Count ids below e and equal to e.
            lt = 0
            eq = 0
            for t in T.serial(T.ceildiv(n_entries, threads)):
                j = t * threads + tx
                if j < n_entries:
                    v = ids[j]
                    lt = lt + T.cast(v < e, T.int32)
                    eq = eq + T.cast(v == e, T.int32)
            for m in T.unroll(5):
                lt = lt + T.shfl_xor(lt, 1 << m)
                eq = eq + T.shfl_xor(eq, 1 << m)
            if lane == 0:
                red[0, warp] = lt
                red[1, warp] = eq
            T.sync_threads()
            base = 0
            total = 0
            for w in T.unroll(warps):
                base = base + red[0, w]
                total = total + red[1, w]
            if tx == 0:
                counts[e] = total
                offsets[e] = base
                if e == n_experts - 1:
                    offsets[n_experts] = base + total
            T.sync_threads()  # red is reused below

            # 2. Stable placement of the entries of expert e, in ascending j.
            found = 0
            for t in T.serial(T.ceildiv(n_entries, threads)):
                if found < total:  # uniform across the CTA
                    j = t * threads + tx
                    flag = T.alloc_var(T.int32)
                    flag = 0
                    if j < n_entries:
                        flag = T.cast(ids[j] == e, T.int32)
                    ballot = T.call_extern("uint32", "__ballot_sync", T.uint32(FULL), flag)
                    if lane == 0:
                        red[0, warp] = T.call_extern("int32", "__popc", ballot)
                    T.sync_threads()
                    before = 0
                    v = 0
                    for w in T.unroll(warps):
                        before = before + T.if_then_else(w < warp, red[0, w], 0)
                        v = v + red[0, w]
                    if flag != 0:
                        rank = T.call_extern(
                            "int32", "__popc", ballot & ((T.uint32(1) << T.cast(lane, T.uint32)) - T.uint32(1))
                        )
                        perm[base + found + before + rank] = j
                    found = found + v
                    T.sync_threads()  # red is rewritten by the next tile

    return deepinfer_moe_layout


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_experts, 1, 1): one CTA per expert",
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d" % (2 * WARPS * 4),
        "dynamic_smem_bytes": 2 * WARPS * 4,
        "alignment": "all buffers 4 B; every id in 0..n_experts; n_entries + %d < 2^31" % THREADS,
    }
