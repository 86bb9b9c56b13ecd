"""Interleaved RoPE and its inverse on [tokens, heads, head_dim] BF16 (v41-flash.md §3.2, §3.1 step 5), in TileLang.

Semantics (bit-exact twin of `cpu_backend::rope` / `cpu_backend::inverse_rope`)
-----------------------------------------------------------------------------
x is BF16 [T, H, hd], positions int64 [T], freq fp32 [rope_dim / 2] (the
layer's table from `cpu_backend::rope_freqs`, computed on the host so θ and
YaRN stay there). Only the LAST rope_dim elements of every head rotate; pair
i is the adjacent elements (2i, 2i+1) of that slice. Per token t, pair i:

    angle = fp32(p_t) * freq_i                 ONE fp32 multiply (__fmul_rn);
                                               fp32(p) is cvt.rn (exact below 2^24)
    c     = fp32_rn(cos((double)angle))        double-precision cos / sin of the
    s     = fp32_rn(sin((double)angle))        fp32 angle, rounded once to fp32
    s     = -s                                 when `inverse` != 0 (exact)
    y_2i   = bf16_rn(x0*c - x1*s)              x0 = fp32(x_2i), x1 = fp32(x_2i+1);
    y_2i+1 = bf16_rn(x0*s + x1*c)              every product and the sum/difference
                                               rounded to fp32 on its own

which is the CPU's formula, operation for operation: the four products and
the add/sub are `__fmul_rn` / `__fadd_rn` / `__fsub_rn` (T.ieee_mul / add /
sub), which nvcc never contracts into an FMA (the build keeps nvcc's default
-fmad=true, so plain `a*b - c*d` would be contracted). Checked in the PTX of
both archs: the only `fma` instructions are the fp64 ones inside the
double-precision cos/sin; there is no `fma.rn.f32` and no approximate
`sin.approx`/`cos.approx`. The first hd - rope_dim elements of every head
are copied unchanged (bit for bit, NaN payloads included). A NaN that goes
through the rotation comes out as some NaN (its payload may differ from the
CPU's).

cos/sin: CUDA's double cos/sin are within 2 ulp (fp64) and the CPU's libm
within 1, so the fp32 roundings agree unless the exact value lies within a
few fp64 ulps of an fp32 rounding midpoint (none of 12.8 million sampled
(p, i) lies within 16 fp64 ulps of one); then c or s may differ by one fp32 ulp (the spec
allows last-ulp differences in cos/sin). tests/cuda_rope.rs counts such
pairs and checks everything else bit for bit.

Out of place: x and out are distinct buffers (TileLang declares every pointer
`__restrict__`). Each element is read once and written once, by the same
thread, read before written, so the access pattern would tolerate out == x,
but the generated signature's `__restrict__` makes that formally undefined:
an in-place variant needs its own program with a single tensor parameter.

Layout
------
Every token row is contiguous (H * hd elements) and is viewed as
n_tok_vec = H * hd / 8 vectors of 8 BF16 (16 bytes); `head_vecs` = hd / 8
and the freq table's first dimension rope_vecs = rope_dim / 8 are runtime
ints, so T, H, hd and rope_dim are all dynamic:

    x         : bf16  [T, n_tok_vec, 8]   (== [T, H, hd])      16-byte aligned
    out       : bf16  [T, n_tok_vec, 8]   (== [T, H, hd])      16-byte aligned
    positions : int64 [T]
    freq      : fp32  [rope_vecs, 4]      (== [rope_dim / 2])
    inverse   : int32 (0: rope, else the inverse rotation)
    head_vecs : int32 (hd / 8)

Limits: hd % 8 == 0, rope_dim % 8 == 0, 8 <= rope_dim <= hd, rope_dim <=
ROPE_DIM_MAX (256: the shared cos/sin table), n_tok_vec <= 65535 * 1024
(gridDim.y; also keeps the int32 vector index from overflowing), T < 2^31. Vector g of a token is a
rope vector when g % head_vecs >= head_vecs - rope_vecs; its pairs are
4 * (g % head_vecs - (head_vecs - rope_vecs)) + 0..3.

Work mapping
------------
CTA (blockIdx.x, blockIdx.y) = (t, c) handles token t's vectors [c * CHUNK, (c + 1) * CHUNK), CHUNK =
THREADS * VPT = 1024 (16 KiB): thread tx owns vectors c*CHUNK + k*THREADS + tx,
k = 0..VPT-1, so each warp instruction moves a contiguous, fully coalesced
512 B. Every thread first issues its VPT 16-byte loads; meanwhile threads
tx < rope_dim / 2 compute pair tx's (c, s) into shared memory (one fp64
cos and sin each: a token's table is computed ceil(n_tok_vec / CHUNK) times,
4 times for V4.1's 64 x 512, instead of once per head); after one barrier
the rope vectors rotate in registers and every vector is stored. Vectors past
n_tok_vec are masked.

Registers: __launch_bounds__(256, 5) caps the kernel at 48 registers
without spills (5 CTAs, 1280 threads and 80 KiB of loads in flight per SM;
unbounded it takes 52, i.e. 4 CTAs; 6 CTAs spill). The 40-byte stack frame
is the fp64 trig argument reduction's slow path (|angle| beyond CUDA's fast
reduction range), not a spill.

Launch: grid = (T, ceil(n_tok_vec / 1024), 1), block = (256, 1, 1), dynamic
shared memory 1024 bytes (cos and sin, 128 fp32 each). T up to 2^31 - 1.
"""

import tilelang.language as T

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_rope"

VEC = 8                 # bf16 per 16-byte vector
PAIRS_PER_VEC = VEC // 2
THREADS = 256
VPT = 4                 # vectors (16-byte loads in flight) per thread
CHUNK = THREADS * VPT   # vectors per CTA
ROPE_DIM_MAX = 256      # rope_dim limit: the shared table holds rope_dim / 2 pairs
MAX_PAIRS = ROPE_DIM_MAX // 2
TABLE_BYTES = 2 * MAX_PAIRS * 4  # cos and sin, fp32
MIN_CTAS_PER_SM = 5     # register cap of 48 per thread
assert MAX_PAIRS <= THREADS  # one pass of threads fills the table


def rope(threads: int = THREADS, vpt: int = VPT):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32 and >= MAX_PAIRS."""
    assert threads % 32 == 0 and threads >= MAX_PAIRS
    chunk = threads * vpt

    n_tokens = T.dynamic("n_tokens")
    n_tok_vec = T.dynamic("n_tok_vec")  # H * hd / 8
    rope_vecs = T.dynamic("rope_vecs")  # rope_dim / 8

    @T.prim_func
    def deepinfer_rope(
        x: T.Tensor((n_tokens, n_tok_vec, VEC), T.bfloat16),
        positions: T.Tensor((n_tokens,), T.int64),
        freq: T.Tensor((rope_vecs, PAIRS_PER_VEC), T.float32),
        out: T.Tensor((n_tokens, n_tok_vec, VEC), T.bfloat16),
        inverse: T.int32,
        head_vecs: T.int32,
    ):
        with T.Kernel(n_tokens, T.ceildiv(n_tok_vec, chunk), threads=threads) as (tok, blk):
            # __launch_bounds__(256, 5): 48 registers, no spills (6 spills).
            T.annotate_min_blocks_per_sm(MIN_CTAS_PER_SM)
            tx = T.get_thread_binding()
            buf = T.alloc_local((vpt, VEC), T.bfloat16)
            rv = T.alloc_var(T.int32)  # rope vector index of the current vector (int32 math)
            # Row 0: cos, row 1: sin (negated for the inverse), of pair i.
            table = T.alloc_shared((2, MAX_PAIRS), T.float32)

            # 1. Issue every load first: the table math below overlaps them.
            for k in T.unroll(vpt):
                g = blk * chunk + k * threads + tx
                if g < n_tok_vec:
                    for j in T.vectorized(VEC):
                        buf[k, j] = x[tok, g, j]

            # 2. This token's cos/sin table, one pair per thread.
            if tx < rope_vecs * PAIRS_PER_VEC:
                angle = T.ieee_mul(
                    T.cast(positions[tok], T.float32), freq[tx // PAIRS_PER_VEC, tx % PAIRS_PER_VEC]
                )
                wide = T.cast(angle, T.float64)
                sin = T.cast(T.sin(wide), T.float32)
                table[0, tx] = T.cast(T.cos(wide), T.float32)
                table[1, tx] = T.if_then_else(inverse != 0, -sin, sin)
            T.sync_threads()

            # 3. Rotate the rope vectors in registers, store every vector.
            for k in T.unroll(vpt):
                g = blk * chunk + k * threads + tx
                if g < n_tok_vec:
                    rv = T.truncmod(g, head_vecs) - (head_vecs - rope_vecs)
                    if rv >= 0:
                        for m in T.unroll(PAIRS_PER_VEC):
                            x0 = T.cast(buf[k, 2 * m], T.float32)
                            x1 = T.cast(buf[k, 2 * m + 1], T.float32)
                            c = table[0, rv * PAIRS_PER_VEC + m]
                            s = table[1, rv * PAIRS_PER_VEC + m]
                            buf[k, 2 * m] = T.cast(
                                T.ieee_sub(T.ieee_mul(x0, c), T.ieee_mul(x1, s)), T.bfloat16
                            )
                            buf[k, 2 * m + 1] = T.cast(
                                T.ieee_add(T.ieee_mul(x0, s), T.ieee_mul(x1, c)), T.bfloat16
                            )
                    for j in T.vectorized(VEC):
                        out[tok, g, j] = buf[k, j]

    return deepinfer_rope


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_tokens, ceil(n_tok_vec / %d), 1) with n_tok_vec = H*hd/8: one CTA per token and %d vectors"
        % (CHUNK, CHUNK),
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d bytes (cos/sin table, %d pairs)" % (TABLE_BYTES, MAX_PAIRS),
        "dynamic_smem_bytes": TABLE_BYTES,
        "alignment": "x, out 16 B; head_vecs = hd/8, rope_vecs = rope_dim/8, 1 <= rope_vecs <= head_vecs, "
        "rope_vecs <= %d" % (ROPE_DIM_MAX // VEC),
    }
