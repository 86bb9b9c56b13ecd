"""MoE routing (v41-flash.md §7.1, §7.3) in TileLang: √softplus scores, the biased top-k
selection, and the unbiased renormalised weights of every token.

Semantics (bit-exact twin of `cpu_backend::moe::route` applied per token)
--------------------------------------------------------------------------
Inputs: logits fp32 [T, E] (the gate GEMM output, already divided by gate_temp), bias
fp32 [E], top_k k, route_scale fp32. E <= 1024, 1 <= k <= min(E, 16). Per token, in
fp32 with IEEE rounding (no fast-math, no contraction):

    s_e   = sqrtf(sp(z_e))      sp(z) = z if z > 20, else fp32_rn(log1p(exp(fp64(z))))
    key_e = s_e + bias_e        IEEE add; ordered by Rust's f32::total_cmp
    sel   = the k experts with the largest key, ties (equal total-order key) to the lower id,
            listed in RANK order (best first)
    den   = ((s_sel0 + s_sel1) + ... + s_sel(k-1)) + 1e-20     rank order, left to right
    w_e   = (s_e / den) * route_scale                         IEEE division, then multiply

Outputs: ids int32 [T, k] = sel sorted ASCENDING by expert id, weights fp32 [T, k] in
the same order (exactly what `route` returns).

softplus: the CPU computes ln(1 + e^z) in double and rounds once; CUDA's double exp
and log1p are within 1-2 double ulps of the true value, so the fp32 rounding agrees
except where ln(1 + e^z) lies within a few double ulps (2^-29 relative) of an fp32
rounding midpoint; the square root is sqrtf (IEEE with nvcc's default -prec-sqrt=true).

The selection key: the fp32 bit pattern b of s + bias maps to the unsigned total-order
key (b ^ 0xFFFFFFFF if negative, else b | 0x80000000), so NaNs order exactly as
f32::total_cmp orders them; the 64-bit composite (key << 32) | (0xFFFFFFFF - e) is
unique per expert and larger for a better expert or, at equal keys, a lower id. Taken
experts and lanes past E hold composite 0, which no expert reaches.

Layout
------
    logits  : fp32  [T, E] row-major     4-byte aligned
    bias    : fp32  [E]                  4-byte aligned
    ids     : int32 [T, k] row-major     4-byte aligned
    weights : fp32  [T, k] row-major     4-byte aligned
    route_scale : fp32;  top_k : int

Work mapping
------------
One CTA of THREADS = 256 per token (8 warps); thread t owns experts t, t + 256, ...
(SLOTS = 4 at most, E <= 1024). Step 1 computes each owned expert's score and
composite once, in a loop that is not unrolled (one copy of the fp64 softplus), into
shared memory. Step 2 runs k rounds of a CTA arg-max over the unique composites: a
thread's best over its slots, 5 xor-shuffles per warp, the 8 warp winners in shared
memory, read by every thread (the same max everywhere); thread 0 records the winner
(id and unbiased score, rank order) and clears its composite; two barriers a round.
Step 3: thread r < k computes the denominator in rank order, the rank p of its
winner's id among the k ids (the ascending position), and stores id and weight at p.

The first version (one warp per token, 32 register slots a lane, every loop
unrolled) lowered to about 17,000 SASS lines with the fp64 softplus inlined 32 times
and took 16.5 us per launch on the H200 even at E = 6 (ncu, 2026-12-03): straight-line
code a launch fetches once is paid in instruction-cache misses, not in math.

Launch: grid = (T, 1, 1), block = (256, 1, 1), static shared memory only (12.4 KB).
"""

import struct

import tilelang.language as T

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_moe_route"

WARP = 32
THREADS = 256               # one token per CTA
WARPS = THREADS // WARP     # 8
MAX_EXPERTS = 1024
SLOTS = MAX_EXPERTS // THREADS  # 4 experts a thread at most
MAX_TOP_K = 16
SOFTPLUS_THRESHOLD = 20.0
# 1e-20 rounded to fp32 (exactly representable, so the emitted literal is exact).
NORM_EPS = struct.unpack("<f", struct.pack("<f", 1e-20))[0]


def moe_route():
    """Build the TileLang PrimFunc: one CTA of 256 threads per token."""
    n_tokens = T.dynamic("n_tokens")    # T
    n_experts = T.dynamic("n_experts")  # E
    top_k = T.dynamic("top_k")          # k

    @T.prim_func
    def deepinfer_moe_route(
        logits: T.Tensor((n_tokens, n_experts), T.float32),
        bias: T.Tensor((n_experts,), T.float32),
        ids: T.Tensor((n_tokens, top_k), T.int32),
        weights: T.Tensor((n_tokens, top_k), T.float32),
        route_scale: T.float32,
    ):
        with T.Kernel(n_tokens, threads=THREADS) as tok:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            comp_s = T.alloc_shared((MAX_EXPERTS,), T.uint64, scope="shared")  # composites
            score_s = T.alloc_shared((MAX_EXPERTS,), T.float32, scope="shared")  # scores s
            red = T.alloc_shared((WARPS,), T.uint64, scope="shared")  # warp winners
            sel_id = T.alloc_shared((MAX_TOP_K,), T.int32, scope="shared")  # rank order
            sel_s = T.alloc_shared((MAX_TOP_K,), T.float32, scope="shared")
            best = T.alloc_var(T.uint64)
            other = T.alloc_var(T.uint64)
            den = T.alloc_var(T.float32)
            zv = T.alloc_var(T.float32)   # logit
            spv = T.alloc_var(T.float32)  # softplus
            sv = T.alloc_var(T.float32)   # score
            bv = T.alloc_var(T.uint32)    # bits of score + bias
            kv = T.alloc_var(T.uint32)    # total-order key
            pos = T.alloc_var(T.int32)
            win = T.alloc_var(T.int32)

            # 1. Scores and composites of this thread's experts (coalesced row loads).
            for j in T.serial(SLOTS):
                e = j * THREADS + tx
                if e < n_experts:
                    zv = logits[tok, e]
                    spv = T.if_then_else(
                        zv > T.float32(SOFTPLUS_THRESHOLD),
                        zv,
                        T.cast(T.log1p(T.exp(T.cast(zv, T.float64))), T.float32),
                    )
                    sv = T.sqrt(spv)
                    bv = T.reinterpret(T.ieee_add(sv, bias[e]), T.uint32)
                    kv = T.if_then_else(
                        (bv >> T.uint32(31)) != T.uint32(0),
                        bv ^ T.uint32(0xFFFFFFFF),
                        bv | T.uint32(0x80000000),
                    )
                    score_s[e] = sv
                    comp_s[e] = (T.cast(kv, T.uint64) << T.uint64(32)) | T.cast(
                        T.uint32(0xFFFFFFFF) - T.cast(e, T.uint32), T.uint64
                    )
            T.sync_threads()

            # 2. k rounds of a CTA arg-max over unique composites (taken ones are 0).
            for r in T.serial(top_k):
                best = T.uint64(0)
                for j in T.unroll(SLOTS):
                    if j * THREADS + tx < n_experts:
                        best = T.max(best, comp_s[j * THREADS + tx])
                for m in T.unroll(5):
                    other = T.shfl_xor(best, 1 << m)
                    best = T.max(best, other)
                if lane == 0:
                    red[warp] = best
                T.sync_threads()
                best = red[0]
                for w in T.unroll(WARPS - 1):
                    best = T.max(best, red[w + 1])
                if tx == 0:
                    win = T.cast(
                        T.uint32(0xFFFFFFFF) - T.cast(best & T.uint64(0xFFFFFFFF), T.uint32), T.int32
                    )
                    sel_id[r] = win
                    sel_s[r] = score_s[win]
                    comp_s[win] = T.uint64(0)
                T.sync_threads()

            # 3. Thread r < k: denominator in rank order, ascending position, store.
            if tx < top_k:
                den = sel_s[0]
                for r in T.serial(top_k - 1):
                    den = T.ieee_add(den, sel_s[r + 1])
                den = T.ieee_add(den, T.float32(NORM_EPS))
                pos = 0
                for r in T.serial(top_k):
                    if sel_id[r] < sel_id[tx]:
                        pos = pos + 1
                ids[tok, pos] = sel_id[tx]
                weights[tok, pos] = T.ieee_mul(T.ieee_fdiv(sel_s[tx], den), route_scale)

    return deepinfer_moe_route


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_tokens, 1, 1): one CTA per token",
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "all buffers 4 B; n_experts <= %d, 1 <= top_k <= min(n_experts, %d), "
        "n_tokens < 2^31" % (MAX_EXPERTS, MAX_TOP_K),
    }
