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
One warp per token, WARPS = 4 tokens per CTA of 128 threads. Lane l owns experts
l, l + 32, l + 64, ... (at most MAX_PER_LANE = 32, i.e. E <= 1024), so each of the
ceil(E/32) loads of the warp is one coalesced 128-byte row segment. Each lane keeps the
composites and scores of its experts in registers; k rounds then each take the lane's
best composite, reduce it across the warp with 5 xor-shuffles (max of a unique key:
every lane ends with the winner), fetch the winner's score from its lane with one
shuffle, and the owning lane clears the winner. Every lane thus holds the k winners in
rank order; lane r < k computes the denominator in rank order, the rank p of its
winner's id among the k ids (the ascending position), and stores id and weight at p.

Launch: grid = (ceil(T / 4), 1, 1), block = (128, 1, 1), no dynamic shared memory.
Tokens at or past T are masked (their warps do no loads and no stores).
"""

import struct

import tilelang.language as T

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_moe_route"

WARP = 32
WARPS = 4                   # tokens per CTA, one per warp
THREADS = WARP * WARPS      # 128
MAX_EXPERTS = 1024
MAX_PER_LANE = MAX_EXPERTS // WARP  # 32 experts a lane at most
MAX_TOP_K = 16
SOFTPLUS_THRESHOLD = 20.0
# 1e-20 rounded to fp32 (exactly representable, so the emitted literal is exact).
NORM_EPS = struct.unpack("<f", struct.pack("<f", 1e-20))[0]


def moe_route(warps: int = WARPS):
    """Build the TileLang PrimFunc: one warp per token, `warps` tokens per CTA."""
    threads = WARP * warps

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
        with T.Kernel(T.ceildiv(n_tokens, warps), threads=threads) as bx:
            tx = T.get_thread_binding()
            lane = tx % WARP
            tok = bx * warps + tx // WARP
            comp = T.alloc_local((MAX_PER_LANE,), T.uint64)  # selection composites
            score = T.alloc_local((MAX_PER_LANE,), T.float32)  # unbiased scores s
            sel_id = T.alloc_local((MAX_TOP_K,), T.int32)     # winners in rank order
            sel_s = T.alloc_local((MAX_TOP_K,), T.float32)
            best = T.alloc_var(T.uint64)
            best_s = T.alloc_var(T.float32)
            best_j = T.alloc_var(T.int32)
            other = T.alloc_var(T.uint64)
            den = T.alloc_var(T.float32)
            zv = T.alloc_var(T.float32)   # logit
            spv = T.alloc_var(T.float32)  # softplus
            sv = T.alloc_var(T.float32)   # score
            bv = T.alloc_var(T.uint32)    # bits of score + bias
            kv = T.alloc_var(T.uint32)    # total-order key
            pos = T.alloc_var(T.int32)

            # tok is warp-uniform: whole warps skip, so every shuffle below is full-warp.
            if tok < n_tokens:
                # 1. Scores and composites of this lane's experts (coalesced row loads).
                for j in T.unroll(MAX_PER_LANE):
                    e = j * WARP + lane
                    comp[j] = T.uint64(0)
                    score[j] = T.float32(0)
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
                        score[j] = sv
                        comp[j] = (T.cast(kv, T.uint64) << T.uint64(32)) | T.cast(
                            T.uint32(0xFFFFFFFF) - T.cast(e, T.uint32), T.uint64
                        )

                # 2. k rounds of a warp arg-max over unique composites.
                for r in T.serial(top_k):
                    best = T.uint64(0)
                    best_s = T.float32(0)
                    best_j = -1
                    for j in T.unroll(MAX_PER_LANE):
                        if comp[j] > best:
                            best = comp[j]
                            best_s = score[j]
                            best_j = j
                    mine = best
                    for m in T.unroll(5):
                        other = T.shfl_xor(best, 1 << m)
                        best = T.max(best, other)
                    # Every lane now holds the winner; recover its id and owner lane.
                    win = T.cast(
                        T.uint32(0xFFFFFFFF) - T.cast(best & T.uint64(0xFFFFFFFF), T.uint32), T.int32
                    )
                    sel_id[r] = win
                    sel_s[r] = T.shfl_sync(best_s, win % WARP)
                    if mine == best:
                        for j in T.unroll(MAX_PER_LANE):
                            if j == best_j:
                                comp[j] = T.uint64(0)

                # 3. Lane r < k: denominator in rank order, ascending position, store.
                if lane < top_k:
                    den = sel_s[0]
                    for r in T.serial(top_k - 1):
                        den = T.ieee_add(den, sel_s[r + 1])
                    den = T.ieee_add(den, T.float32(NORM_EPS))
                    pos = 0
                    for r in T.serial(top_k):
                        if sel_id[r] < sel_id[lane]:
                            pos = pos + 1
                    ids[tok, pos] = sel_id[lane]
                    weights[tok, pos] = T.ieee_mul(T.ieee_fdiv(sel_s[lane], den), route_scale)

    return deepinfer_moe_route


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(ceil(n_tokens / %d), 1, 1): one warp per token" % WARPS,
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "all buffers 4 B; n_experts <= %d, 1 <= top_k <= min(n_experts, %d), "
        "n_tokens + %d < 2^31" % (MAX_EXPERTS, MAX_TOP_K, WARPS),
    }
