"""mHC front half (v41-flash.md §6), pass 2 of 2 in TileLang: each token's
24 mixes from the chunk partials of pass 1 (`mhc_pre.py`), their split into
pre/post/comb, and Sinkhorn, 16 lanes per token.

Semantics (twin of `cpu_backend::mhc::hc_split` on the GPU's mixes)
-------------------------------------------------------------------
part fp32 [n_chunks, T, 25] (24 dot partials and the sum of squares per
chunk), hc_base fp32 [24], hc_scale fp32 [3]; eps, hc_eps fp32; iters int
(>= 1); n_vec = D / 8 (so 4·D = 32·n_vec).

    dot_r = Σ_c part[c, t, r]        chunks in ascending order (fixed: batch
    ss    = Σ_c part[c, t, 24]       invariant), plain fp32 adds
    m_r   = dot_r · (1 / sqrt(ss / (4·D) + eps))      every op IEEE rounded
    split = `hc_split(m)` in the CPU's exact operation order, every multiply,
            add and divide IEEE rounded, σ(x) = 1/(1 + e^-x) and e^x evaluated
            in double precision and rounded to fp32 once, as the CPU does
            (CUDA's double exp is within an ulp of the CPU's, so the fp32
            results agree except on the rare input whose double lies next
            to an fp32 rounding boundary).

Outputs: mixes fp32 [T, 24] (the GPU's m, for checking the split), pre / post
fp32 [T, 4], comb fp32 [T, 16] (comb[4j + k]).

Work mapping
------------
128 threads = 8 tokens per CTA, 16 lanes per token (lane k of the group).
Lane k adds the chunk partials of mix k and, for k < 8, of mix 16 + k, and
(every lane) of the sum of squares; lanes 0-3 write pre_k, lanes 4-7 post_k.
Lane k then owns comb element k = 4j + c (row j, column c): it fetches
mix 8 + k from its neighbour with one 16-wide shuffle, and each Sinkhorn
row or column sum gathers the four elements with 16-wide shuffles and adds
them in the CPU's order ((x0 + x1) + x2) + x3 (+ eps), so every lane of a
row or column computes the same sum and divides its own element. Tokens
past T compute on a clamped copy of the last token and write nothing (the
shuffles need every lane).

Launch: grid = (ceil(T / 8), 1, 1), block = (128, 1, 1), no shared memory.
"""

import tilelang.language as T

PRIM_FUNC_NAME = "deepinfer_mhc_split"

HC = 4
MIXES = 24
RED_ROWS = MIXES + 1
THREADS = 128
LANES = 16  # lanes per token
TOK = THREADS // LANES
FLAT_PER_VEC = HC * 8  # flat 4·D values per 8-position vector
UNROLL = 8  # chunks loaded per round


def mhc_split():
    """Build the TileLang PrimFunc (pass 2)."""
    n_tokens = T.dynamic("n_tokens")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def deepinfer_mhc_split(
        part: T.Tensor((n_chunks, n_tokens, RED_ROWS), T.float32),
        hc_base: T.Tensor((MIXES,), T.float32),
        hc_scale: T.Tensor((3,), T.float32),
        mixes: T.Tensor((n_tokens, MIXES), T.float32),
        pre: T.Tensor((n_tokens, HC), T.float32),
        post: T.Tensor((n_tokens, HC), T.float32),
        comb: T.Tensor((n_tokens, HC * HC), T.float32),
        eps: T.float32,
        hc_eps: T.float32,
        iters: T.int32,
        n_vec: T.int32,
    ):
        with T.Kernel(T.ceildiv(n_tokens, TOK), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            s = T.alloc_local((3,), T.float32)  # dot of mix k, of mix 16 + k, squares
            v = T.alloc_local((UNROLL, 3), T.float32)
            m = T.alloc_local((2,), T.float32)
            c = T.alloc_local((1,), T.float32)
            g = T.alloc_local((HC,), T.float32)

            k = tx % LANES
            tok = bx * TOK + tx // LANES
            tc = T.min(tok, n_tokens - 1)
            row = k // HC
            col = k % HC
            k2 = T.min(16 + k, MIXES)  # mix 16 + k for k < 8 (k >= 8 reads squares, unused)

            for i in T.unroll(3):
                s[i] = T.float32(0)
            # UNROLL chunks' loads in flight at once; the adds stay in order.
            for cb in T.serial(T.ceildiv(n_chunks, UNROLL)):
                for uu in T.unroll(UNROLL):
                    ci = T.min(cb * UNROLL + uu, n_chunks - 1)
                    v[uu, 0] = part[ci, tc, k]
                    v[uu, 1] = part[ci, tc, k2]
                    v[uu, 2] = part[ci, tc, MIXES]
                for uu in T.unroll(UNROLL):
                    if cb * UNROLL + uu < n_chunks:
                        for i in T.unroll(3):
                            s[i] = s[i] + v[uu, i]
            ms = T.ieee_add(T.ieee_fdiv(s[2], T.cast(n_vec * FLAT_PER_VEC, T.float32)), eps)
            rs = T.ieee_fdiv(T.float32(1), T.sqrt(ms))
            m[0] = T.ieee_mul(s[0], rs)
            m[1] = T.ieee_mul(s[1], rs)
            if tok < n_tokens:
                mixes[tok, k] = m[0]
                if k < 8:
                    mixes[tok, 16 + k] = m[1]
                if k < HC:
                    zp = T.ieee_add(T.ieee_mul(m[0], hc_scale[0]), hc_base[k])
                    ep = T.cast(T.exp(T.cast(-zp, T.float64)), T.float32)
                    pre[tok, k] = T.ieee_add(T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), ep)), hc_eps)
                elif k < 2 * HC:
                    zq = T.ieee_add(T.ieee_mul(m[0], hc_scale[1]), hc_base[k])
                    eq = T.cast(T.exp(T.cast(-zq, T.float64)), T.float32)
                    post[tok, k - HC] = T.ieee_mul(
                        T.float32(2), T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), eq))
                    )

            # comb element k is mix 8 + k: lane k + 8's first mix (k < 8) or
            # lane k - 8's second (k >= 8).
            src = (k + 8) % LANES
            lo = T.shfl_sync(m[0], src, LANES)
            hi = T.shfl_sync(m[1], src, LANES)
            mc = T.if_then_else(k < 8, lo, hi)
            c[0] = T.ieee_add(T.ieee_mul(mc, hc_scale[2]), hc_base[8 + k])

            # Row softmax, + eps.
            for i in T.unroll(HC):
                g[i] = T.shfl_sync(c[0], row * HC + i, LANES)
            mx = T.max(T.max(g[0], g[1]), T.max(g[2], g[3]))
            c[0] = T.cast(T.exp(T.cast(T.ieee_sub(c[0], mx), T.float64)), T.float32)
            for i in T.unroll(HC):
                g[i] = T.shfl_sync(c[0], row * HC + i, LANES)
            rsum = T.ieee_add(T.ieee_add(T.ieee_add(g[0], g[1]), g[2]), g[3])
            c[0] = T.ieee_add(T.ieee_fdiv(c[0], rsum), hc_eps)
            # Columns, then iters - 1 x (rows, columns).
            for it in T.serial(iters):
                if it > 0:
                    for i in T.unroll(HC):
                        g[i] = T.shfl_sync(c[0], row * HC + i, LANES)
                    c[0] = T.ieee_fdiv(
                        c[0], T.ieee_add(T.ieee_add(T.ieee_add(T.ieee_add(g[0], g[1]), g[2]), g[3]), hc_eps)
                    )
                for i in T.unroll(HC):
                    g[i] = T.shfl_sync(c[0], i * HC + col, LANES)
                c[0] = T.ieee_fdiv(
                    c[0], T.ieee_add(T.ieee_add(T.ieee_add(T.ieee_add(g[0], g[1]), g[2]), g[3]), hc_eps)
                )
            if tok < n_tokens:
                comb[tok, k] = c[0]

    return deepinfer_mhc_split


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(ceil(n_tokens / %d), 1, 1): %d lanes per token" % (TOK, LANES),
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "4 B",
    }
