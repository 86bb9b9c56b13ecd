"""mHC front half (v41-flash.md §6) in TileLang, one token per CTA: the
collapse with the lagged pre, the 24 mixes (an fp32 GEMV over the 4·D
streams, scaled by the inverse RMS) and their split into pre/post/comb with
Sinkhorn. The streams are read from HBM once per token.

Semantics (twin of `cpu_backend::mhc` per token)
-----------------------------------------------
Streams S are BF16 [T, 4, D] (D % 8 == 0), hc_fn fp32 [24, 4·D], hc_base fp32
[24], hc_scale fp32 [3], pre_in fp32 [T, 4] (the lagged pre); eps, hc_eps
fp32, iters int (>= 1).

    u[x]  = bf16_rn((((0 + pre_0*S_0) + pre_1*S_1) + pre_2*S_2) + pre_3*S_3)
            every multiply and add rounded (__fmul_rn/__fadd_rn): bitwise
            equal to `hc_collapse` (the CPU folds from +0.0, which turns an
            all -0 sum into +0; the explicit 0 + keeps that).
    m_r   = (Σ_x hc_fn[r, x]·S[x]) · 1/sqrt(Σ S²/(4D) + eps)
            fp32, but each thread sums its own slice and the CTA sums the
            slices in a tree: NOT the CPU's sequential order (compare with a
            relative tolerance / calc_diff).
    split = `hc_split(m)` by thread 0 in the CPU's exact operation order,
            every multiply/add/divide IEEE rounded, σ(x) = 1/(1 + e^-x) and e^x
            evaluated in double precision and rounded to fp32 once (the CPU's
            correctly rounded convention; CUDA's exp is within 1 ulp of
            double, so the fp32 results agree except on near-midpoint inputs).

Outputs: u BF16 [T, D], mixes fp32 [T, 24] (the GPU's m, for checking the
split), pre / post fp32 [T, 4], comb fp32 [T, 16] (comb[4j + k]).

Layout and work mapping
-----------------------
    streams : bf16 [T, 4, n_vec, 8]   (== [T, 4, D]), n_vec = D / 8, 16-byte aligned
    hc_fn   : fp32 [24, 4, n_vec, 2, 4] (== [24, 4·D]),             16-byte aligned
    u       : bf16 [T, n_vec, 8]      (== [T, D]),                  16-byte aligned

One CTA of THREADS = 128 threads per token. Thread tx owns the vectors
v = tx, tx + 128, ... < n_vec: it loads the 4 stream vectors at v (16 B
each), writes u's vector v, and accumulates the sum of squares and the 24
row dots over those 32 elements (hc_fn's 24 × 4 × 32 B at v: read through
L2, 24·4·D·4 bytes per token). The 25 partial sums go to shared memory
[25, 128] and are tree-reduced (7 halvings); thread 0 then scales the mixes,
runs the split and Sinkhorn and writes mixes/pre/post/comb.

Launch: grid = (T, 1, 1), block = (128, 1, 1), 12800 bytes of dynamic shared
memory (the [25, 128] fp32 partial sums). T * 4 * D < 2^31.
"""

import tilelang.language as T

PRIM_FUNC_NAME = "deepinfer_mhc_pre"

HC = 4
MIXES = 24
VEC = 8
THREADS = 128
RED_ROWS = MIXES + 1  # 24 dots and the sum of squares
SMEM_BYTES = RED_ROWS * THREADS * 4


def mhc_pre(threads: int = THREADS):
    """Build the TileLang PrimFunc. `threads` must be a power of two >= 32."""
    assert threads >= 32 and threads & (threads - 1) == 0
    log2_threads = threads.bit_length() - 1

    n_tokens = T.dynamic("n_tokens")
    n_vec = T.dynamic("n_vec")  # D / 8

    @T.prim_func
    def deepinfer_mhc_pre(
        streams: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
        hc_fn: T.Tensor((MIXES, HC, n_vec, 2, VEC // 2), T.float32),
        hc_base: T.Tensor((MIXES,), T.float32),
        hc_scale: T.Tensor((3,), T.float32),
        pre_in: T.Tensor((n_tokens, HC), T.float32),
        u: T.Tensor((n_tokens, n_vec, VEC), T.bfloat16),
        mixes: T.Tensor((n_tokens, MIXES), T.float32),
        pre: T.Tensor((n_tokens, HC), T.float32),
        post: T.Tensor((n_tokens, HC), T.float32),
        comb: T.Tensor((n_tokens, HC * HC), T.float32),
        eps: T.float32,
        hc_eps: T.float32,
        iters: T.int32,
    ):
        with T.Kernel(n_tokens, threads=threads) as tok:
            tx = T.get_thread_binding()
            sb = T.alloc_local((HC, VEC), T.bfloat16)
            wb = T.alloc_local((VEC,), T.float32)
            ub = T.alloc_local((VEC,), T.bfloat16)
            lag = T.alloc_local((HC,), T.float32)
            acc = T.alloc_local((RED_ROWS,), T.float32)
            m = T.alloc_local((MIXES,), T.float32)
            c = T.alloc_local((HC * HC,), T.float32)
            sc = T.alloc_local((4,), T.float32)
            red = T.alloc_shared((RED_ROWS, threads), T.float32)

            for i in T.unroll(HC):
                lag[i] = pre_in[tok, i]
            for r in T.unroll(RED_ROWS):
                acc[r] = T.float32(0)

            # 1. One pass over the token's streams: collapse, sum of squares, dots.
            for it in T.serial(T.ceildiv(n_vec, threads)):
                v = it * threads + tx
                if v < n_vec:
                    for i in T.unroll(HC):
                        for j in T.vectorized(VEC):
                            sb[i, j] = streams[tok, i, v, j]
                    for j in T.unroll(VEC):
                        # 0 + p0*S0 like the CPU's fold from 0.0 (turns -0 into +0).
                        a = T.ieee_add(T.float32(0), T.ieee_mul(lag[0], T.cast(sb[0, j], T.float32)))
                        a = T.ieee_add(a, T.ieee_mul(lag[1], T.cast(sb[1, j], T.float32)))
                        a = T.ieee_add(a, T.ieee_mul(lag[2], T.cast(sb[2, j], T.float32)))
                        a = T.ieee_add(a, T.ieee_mul(lag[3], T.cast(sb[3, j], T.float32)))
                        ub[j] = T.cast(a, T.bfloat16)
                    for j in T.vectorized(VEC):
                        u[tok, v, j] = ub[j]
                    for i in T.unroll(HC):
                        for j in T.unroll(VEC):
                            x = T.cast(sb[i, j], T.float32)
                            acc[MIXES] = acc[MIXES] + x * x
                    for r in T.unroll(MIXES):
                        for i in T.unroll(HC):
                            # Two 16-byte loads (sm_100a would otherwise merge them into
                            # one 32-byte load that compat.cuh does not provide).
                            for h in T.unroll(2):
                                for j in T.vectorized(VEC // 2):
                                    wb[h * (VEC // 2) + j] = hc_fn[r, i, v, h, j]
                            for j in T.unroll(VEC):
                                acc[r] = acc[r] + wb[j] * T.cast(sb[i, j], T.float32)

            # 2. Tree reduction of the 25 partial sums over the CTA.
            for r in T.unroll(RED_ROWS):
                red[r, tx] = acc[r]
            T.sync_threads()
            for step in T.unroll(log2_threads):
                half = T.shift_right(threads, step + 1)
                if tx < half:
                    for r in T.unroll(RED_ROWS):
                        red[r, tx] = red[r, tx] + red[r, tx + half]
                T.sync_threads()

            # 3. Thread 0: mixes, split, Sinkhorn (the CPU's order, IEEE ops).
            if tx == 0:
                for i in T.unroll(3):
                    sc[i] = hc_scale[i]
                ms = T.ieee_add(T.ieee_fdiv(red[MIXES, 0], T.cast(n_vec * (HC * VEC), T.float32)), eps)
                sc[3] = T.ieee_fdiv(T.float32(1), T.sqrt(ms))
                for r in T.unroll(MIXES):
                    m[r] = T.ieee_mul(red[r, 0], sc[3])
                    mixes[tok, r] = m[r]
                for i in T.unroll(HC):
                    zp = T.ieee_add(T.ieee_mul(m[i], sc[0]), hc_base[i])
                    ep = T.cast(T.exp(T.cast(-zp, T.float64)), T.float32)
                    pre[tok, i] = T.ieee_add(
                        T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), ep)), hc_eps
                    )
                    zq = T.ieee_add(T.ieee_mul(m[4 + i], sc[1]), hc_base[4 + i])
                    eq = T.cast(T.exp(T.cast(-zq, T.float64)), T.float32)
                    post[tok, i] = T.ieee_mul(
                        T.float32(2), T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), eq))
                    )
                for k in T.unroll(HC * HC):
                    c[k] = T.ieee_add(T.ieee_mul(m[8 + k], sc[2]), hc_base[8 + k])
                # Row softmax, + eps.
                for j in T.unroll(HC):
                    mx = T.max(T.max(c[4 * j], c[4 * j + 1]), T.max(c[4 * j + 2], c[4 * j + 3]))
                    for k in T.unroll(HC):
                        c[4 * j + k] = T.cast(
                            T.exp(T.cast(T.ieee_sub(c[4 * j + k], mx), T.float64)), T.float32
                        )
                    s = T.ieee_add(
                        T.ieee_add(T.ieee_add(c[4 * j], c[4 * j + 1]), c[4 * j + 2]), c[4 * j + 3]
                    )
                    for k in T.unroll(HC):
                        c[4 * j + k] = T.ieee_add(T.ieee_fdiv(c[4 * j + k], s), hc_eps)
                # Columns, then iters - 1 x (rows, columns).
                for it in T.serial(iters):
                    if it > 0:
                        for j in T.unroll(HC):
                            s = T.ieee_add(
                                T.ieee_add(
                                    T.ieee_add(T.ieee_add(c[4 * j], c[4 * j + 1]), c[4 * j + 2]),
                                    c[4 * j + 3],
                                ),
                                hc_eps,
                            )
                            for k in T.unroll(HC):
                                c[4 * j + k] = T.ieee_fdiv(c[4 * j + k], s)
                    for k in T.unroll(HC):
                        s = T.ieee_add(
                            T.ieee_add(T.ieee_add(T.ieee_add(c[k], c[4 + k]), c[8 + k]), c[12 + k]),
                            hc_eps,
                        )
                        for j in T.unroll(HC):
                            c[4 * j + k] = T.ieee_fdiv(c[4 * j + k], s)
                for k in T.unroll(HC * HC):
                    comb[tok, k] = c[k]

    return deepinfer_mhc_pre


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_tokens, 1, 1): one token per CTA",
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d bytes (the [25, %d] fp32 partial sums)" % (SMEM_BYTES, THREADS),
        "dynamic_smem_bytes": SMEM_BYTES,
        "alignment": "streams, hc_fn, u 16 B, the rest 4 B; D % 8 == 0, T*4*D < 2^31",
    }
