"""mHC expand (v41-flash.md §6) in TileLang: the new residual streams of one
sublayer from the old streams, the sublayer output and the split's post/comb.

Semantics (bit-exact twin of `cpu_backend::mhc::hc_expand` per token)
---------------------------------------------------------------------
Streams S are BF16 [T, 4, D], the sublayer output F is BF16 [T, D], post is
fp32 [T, 4] and comb fp32 [T, 16] (comb[t, 4*j + k]: source stream j to
destination stream k). Per token t, stream k and element x, in fp32 with IEEE
rounding and no contraction:

    mix = comb[0][k]*S_0                      then, j = 1, 2, 3 in order,
    mix = mix + comb[j][k]*S_j                (multiply rounded, then add)
    S'_k = bf16_rn(post_k*F + mix)            (multiply rounded, then add)

Every multiply and add is `__fmul_rn` / `__fadd_rn` (T.ieee_mul / T.ieee_add):
nvcc compiles with -fmad=true, and a fused a*b + c would round once where the
CPU rounds twice.

Layout
------
D % 8 == 0; the rows are viewed as vectors of 8 BF16 (16 bytes):

    streams : bf16 [T, 4, n_vec, 8]   (== [T, 4, D])   16-byte aligned
    f       : bf16 [T, n_vec, 8]      (== [T, D])      16-byte aligned
    post    : fp32 [T, 4]                               4-byte aligned
    comb    : fp32 [T, 16]                              4-byte aligned
    out     : bf16 [T, 4, n_vec, 8]   (== [T, 4, D])   16-byte aligned, distinct from streams

Work mapping
------------
One CTA of THREADS = 128 threads covers one token and CHUNK = 256 vectors
(2048 elements) of each of its 4 streams: thread tx owns vectors
blk*256 + k*128 + tx, k = 0, 1 (a warp's loads are 512 B contiguous spans).
Each thread reads its token's 4 post and 16 comb values (the same addresses
across the CTA: broadcast loads), issues every stream and F load before any
math, and writes 4 vectors per owned vector. Vectors at or past n_vec are
masked.

Launch: grid = (T, ceil(n_vec / 256), 1), block = (128, 1, 1), no dynamic
shared memory. Indices are 32-bit: T * 4 * D must stay below 2^31.
"""

import tilelang.language as T

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_mhc_expand"

HC = 4        # residual streams
VEC = 8       # bf16 per 16-byte vector
THREADS = 128
VPT = 2       # vectors per thread
CHUNK = THREADS * VPT


def mhc_expand(threads: int = THREADS, vpt: int = VPT):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32."""
    assert threads % 32 == 0
    chunk = threads * vpt

    n_tokens = T.dynamic("n_tokens")
    n_vec = T.dynamic("n_vec")  # D / 8

    @T.prim_func
    def deepinfer_mhc_expand(
        streams: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
        f: T.Tensor((n_tokens, n_vec, VEC), T.bfloat16),
        post: T.Tensor((n_tokens, HC), T.float32),
        comb: T.Tensor((n_tokens, HC * HC), T.float32),
        out: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
    ):
        with T.Kernel(n_tokens, T.ceildiv(n_vec, chunk), threads=threads) as (tok, blk):
            tx = T.get_thread_binding()
            sb = T.alloc_local((vpt, HC, VEC), T.bfloat16)
            fb = T.alloc_local((vpt, VEC), T.bfloat16)
            ob = T.alloc_local((HC, VEC), T.bfloat16)
            pw = T.alloc_local((HC,), T.float32)
            cw = T.alloc_local((HC * HC,), T.float32)

            # 1. Every load first.
            for k in T.unroll(vpt):
                g = blk * chunk + k * threads + tx
                if g < n_vec:
                    for i in T.unroll(HC):
                        for j in T.vectorized(VEC):
                            sb[k, i, j] = streams[tok, i, g, j]
                    for j in T.vectorized(VEC):
                        fb[k, j] = f[tok, g, j]
            for i in T.unroll(HC):
                pw[i] = post[tok, i]
            for i in T.unroll(HC * HC):
                cw[i] = comb[tok, i]

            # 2. The CPU's operation order, every step rounded.
            for k in T.unroll(vpt):
                g = blk * chunk + k * threads + tx
                if g < n_vec:
                    for d in T.unroll(HC):
                        for j in T.unroll(VEC):
                            mix = T.ieee_mul(cw[d], T.cast(sb[k, 0, j], T.float32))
                            mix = T.ieee_add(mix, T.ieee_mul(cw[4 + d], T.cast(sb[k, 1, j], T.float32)))
                            mix = T.ieee_add(mix, T.ieee_mul(cw[8 + d], T.cast(sb[k, 2, j], T.float32)))
                            mix = T.ieee_add(mix, T.ieee_mul(cw[12 + d], T.cast(sb[k, 3, j], T.float32)))
                            ob[d, j] = T.cast(
                                T.ieee_add(T.ieee_mul(pw[d], T.cast(fb[k, j], T.float32)), mix),
                                T.bfloat16,
                            )
                        for j in T.vectorized(VEC):
                            out[tok, d, g, j] = ob[d, j]

    return deepinfer_mhc_expand


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_tokens, ceil(n_vec / %d), 1) with n_vec = D/8: one token and %d vectors per CTA"
        % (CHUNK, CHUNK),
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "streams, f, out 16 B, post, comb 4 B; D % 8 == 0, T*4*D < 2^31",
    }
