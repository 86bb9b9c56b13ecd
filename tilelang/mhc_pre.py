"""mHC front half (v41-flash.md §6), pass 1 of 2 in TileLang: the collapse
with the lagged pre and the fixed-split partial sums of the 24 mixes and of
the sum of squares. Pass 2 (`mhc_split.py`) adds the partials of each token
in a fixed order and runs the split and Sinkhorn.

Semantics (twin of `cpu_backend::mhc` per token)
-----------------------------------------------
Streams S are BF16 [T, 4, D] (D % 8 == 0), hc_fn fp32 [24, 4·D], pre_in fp32
[T, 4] (the lagged pre).

    u[x] = bf16_rn((((0 + pre_0*S_0) + pre_1*S_1) + pre_2*S_2) + pre_3*S_3)
           every multiply and add rounded (__fmul_rn/__fadd_rn): bitwise
           equal to `hc_collapse` (the CPU folds from +0.0, which turns an
           all -0 sum into +0; the explicit 0 + keeps that).
    part[c, t, r]  = Σ_{x in chunk c} hc_fn[r, x]·S_t[x]   (r < 24)
    part[c, t, 24] = Σ_{x in chunk c} S_t[x]²
           over the flat 4·D index x = i·D + p, chunk c holding the positions
           p in [128c, 128c + 128) of all four streams.

The reduction order is fixed and depends on neither T nor the token's place
in its tile (batch invariant): each thread sums one stream's positions of
the chunk in ascending order (fp32, FMA-contracted), the four streams are
then added in the order ((0 + 1) + 2) + 3, and pass 2 adds the chunks in
ascending order. Not the CPU's sequential order: compare the mixes with a
tolerance.

Layout and work mapping
-----------------------
    streams : bf16 [T, 4, n_vec, 8]          (== [T, 4, D]), n_vec = D / 8
    hc_fn   : fp32 [24, 4, n_vec, 2, 4]      (== [24, 4·D])
    pre_in  : fp32 [T, 4]
    u       : bf16 [T, n_vec, 8]             (== [T, D])
    part    : fp32 [n_chunks, T, 25]          n_chunks = ceil(n_vec / 16)

grid = (n_chunks, ceil(T / 64)): one CTA per chunk of 128 positions and tile
of 64 tokens; the chunk's 48 KiB of hc_fn is read once per tile (through L2).
128 threads = 4 warps; warp i sums stream i, lane l tokens l and l + 32 of
the tile (the second only when the tile has more than 32 tokens: a
warp-uniform branch, so small batches do half the arithmetic).

Tried and dropped: two warps a stream (256 threads, each taking half of a
step's vectors) compile to 214 registers, one CTA an SM, and measured
slower on the H200 (929 against 754 us at 16384 tokens, 2026-12-02): with
one CTA nothing overlaps a CTA's barriers and loads.

The chunk is walked in 4 steps of 32 positions. Each step's hc_fn slice
(24 × 4 × 32 fp32, 12 KiB) and stream slice (64 tokens × 4 × 32 BF16, rows
padded to 272 bytes so the per-token 16-byte loads are conflict-free) go
global → registers → shared memory; the next step's global loads are issued
before the current step's arithmetic. u is written from the staged
registers. Positions past D and tokens past T stage as zeros.
The four warps' sums meet in shared memory [64, 25] (stride 25 words:
conflict-free) in stream order, and the tile's [64, 25] block of part is
written contiguously.

Launch: grid = (n_chunks, ceil(T / 64), 1), block = (128, 1, 1), 29696 bytes
of dynamic shared memory (hc_fn slice 12288, streams 17408; the sums, 6400,
reuse the streams' space after the last step).
T * 4 * D < 2^31.
"""

import tilelang.language as T

PRIM_FUNC_NAME = "deepinfer_mhc_pre"

HC = 4
MIXES = 24
VEC = 8
THREADS = 128
RED_ROWS = MIXES + 1  # 24 dots and the sum of squares
TOK = 64  # tokens per CTA (2 per lane)
CHUNK_VEC = 16  # 16-byte vectors (of each stream) per chunk: 128 positions
STEP_VEC = 4  # vectors per step: 32 positions
STEPS = CHUNK_VEC // STEP_VEC
ROW = HC * STEP_VEC * VEC + VEC  # BF16 per staged token row, padded by 16 bytes
W_F4 = MIXES * HC * STEP_VEC * 2  # float4 loads of one step's hc_fn slice
W_PER_THREAD = W_F4 // THREADS
PAIRS = TOK * STEP_VEC // THREADS  # (token, vector) pairs staged per thread
MIX_COLS = HC + HC * HC  # the fused kernel's post and comb of a token
# The [64, 25] sums live after the last step: TileLang places them over the
# staged streams (its liveness merge), so they add nothing.
SMEM_BYTES = W_F4 * 16 + TOK * ROW * 2
FUSED_SMEM_BYTES = SMEM_BYTES + TOK * MIX_COLS * 4  # + the tile's post and comb
assert TOK * RED_ROWS * 4 <= TOK * ROW * 2

assert W_F4 % THREADS == 0 and (TOK * STEP_VEC) % THREADS == 0


def w_slot(f):
    """(mix r, stream i, vector vv, half h) of float4 `f` of a step's hc_fn
    slice [24, 4, STEP_VEC, 2, 4], flat in that order."""
    return f // (HC * STEP_VEC * 2), (f // (STEP_VEC * 2)) % HC, (f // 2) % STEP_VEC, f % 2


def mhc_pre():
    """Build the TileLang PrimFunc (pass 1)."""
    return build(fused=False)


def build(fused: bool):
    """Pass 1 alone (`fused` False) or with the previous sublayer's expand
    in front of it (`mhc_expand_pre.py`): one body, so the two kernels' sums
    are the same code."""
    n_tokens = T.dynamic("n_tokens")
    n_vec = T.dynamic("n_vec")  # D / 8
    n_chunks = T.dynamic("n_chunks")  # ceil(n_vec / CHUNK_VEC)

    @T.macro
    def load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, step):
        # Global -> registers: this thread's hc_fn float4s and stream pairs.
        for k in T.unroll(W_PER_THREAD):
            r, i, vv, h = w_slot(k * THREADS + tx)
            g = ch * CHUNK_VEC + step * STEP_VEC + vv
            for j in T.vectorized(VEC // 2):
                wr[k, j] = T.if_then_else(g < n_vec, hc_fn[r, i, T.min(g, n_vec - 1), h, j], T.float32(0))
        for k in T.unroll(PAIRS):
            p = k * THREADS + tx
            tok = tile * TOK + p // STEP_VEC
            g = ch * CHUNK_VEC + step * STEP_VEC + p % STEP_VEC
            for i in T.unroll(HC):
                for j in T.vectorized(VEC):
                    sr[k, i, j] = T.if_then_else(
                        tok < n_tokens and g < n_vec,
                        streams[T.min(tok, n_tokens - 1), i, T.min(g, n_vec - 1), j],
                        T.bfloat16(0),
                    )

    @T.macro
    def store_step(ws, ss, u, wr, sr, lag, ub, ch, tile, tx, n_vec, n_tokens, step):
        # Registers -> shared memory, and the collapse u of the staged pairs.
        for k in T.unroll(W_PER_THREAD):
            r, i, vv, h = w_slot(k * THREADS + tx)
            for j in T.vectorized(VEC // 2):
                ws[r, i, vv, h, j] = wr[k, j]
        for k in T.unroll(PAIRS):
            p = k * THREADS + tx
            tt = p // STEP_VEC
            vv = p % STEP_VEC
            tok = tile * TOK + tt
            g = ch * CHUNK_VEC + step * STEP_VEC + vv
            for i in T.unroll(HC):
                for j in T.vectorized(VEC):
                    ss[tt, i * (STEP_VEC * VEC) + vv * VEC + j] = sr[k, i, j]
            if tok < n_tokens and g < n_vec:
                for j in T.unroll(VEC):
                    # 0 + p0*S0 like the CPU's fold from 0.0 (turns -0 into +0).
                    a = T.ieee_add(T.float32(0), T.ieee_mul(lag[k, 0], T.cast(sr[k, 0, j], T.float32)))
                    a = T.ieee_add(a, T.ieee_mul(lag[k, 1], T.cast(sr[k, 1, j], T.float32)))
                    a = T.ieee_add(a, T.ieee_mul(lag[k, 2], T.cast(sr[k, 2, j], T.float32)))
                    a = T.ieee_add(a, T.ieee_mul(lag[k, 3], T.cast(sr[k, 3, j], T.float32)))
                    ub[j] = T.cast(a, T.bfloat16)
                for j in T.vectorized(VEC):
                    u[tok, g, j] = ub[j]

    @T.macro
    def dots(ss, ws, sb, xs, wv, acc, warp, lane, nq):
        # Warp `warp` = stream i; lane: tokens lane and lane + 32.
        for vv in T.unroll(STEP_VEC):
            for q in T.unroll(nq):
                for j in T.vectorized(VEC):
                    sb[q, j] = ss[lane + 32 * q, warp * (STEP_VEC * VEC) + vv * VEC + j]
                for j in T.unroll(VEC):
                    xs[q, j] = T.cast(sb[q, j], T.float32)
                    acc[q, MIXES] = acc[q, MIXES] + xs[q, j] * xs[q, j]
            for r in T.unroll(MIXES):
                for h in T.unroll(2):
                    for j in T.vectorized(VEC // 2):
                        wv[h * (VEC // 2) + j] = ws[r, warp, vv, h, j]
                for j in T.unroll(VEC):
                    for q in T.unroll(nq):
                        acc[q, r] = acc[q, r] + wv[j] * xs[q, j]

    @T.macro
    def load_f(f, fr, ch, tile, tx, n_vec, n_tokens, step):
        # Global -> registers: the previous sublayer's output F of the pairs.
        for k in T.unroll(PAIRS):
            p = k * THREADS + tx
            tok = tile * TOK + p // STEP_VEC
            g = ch * CHUNK_VEC + step * STEP_VEC + p % STEP_VEC
            for j in T.vectorized(VEC):
                fr[k, j] = T.if_then_else(
                    tok < n_tokens and g < n_vec,
                    f[T.min(tok, n_tokens - 1), T.min(g, n_vec - 1), j],
                    T.bfloat16(0),
                )

    @T.macro
    def expand_step(out, mix, sr, fr, cw, ob, ch, tile, tx, n_vec, n_tokens, step):
        # S'_d = bf16(post_d*F + mix) with mix = comb[0][d]*S_0 + ... in
        # mhc.py's order, every step rounded; S' replaces S in sr (zeros
        # outside the tensors, so the sums there stay zero) and is written out.
        for k in T.unroll(PAIRS):
            p = k * THREADS + tx
            tt = p // STEP_VEC
            tok = tile * TOK + tt
            g = ch * CHUNK_VEC + step * STEP_VEC + p % STEP_VEC
            for c in T.unroll(MIX_COLS):
                cw[c] = mix[tt, c]
            for d in T.unroll(HC):
                for j in T.unroll(VEC):
                    m = T.ieee_mul(cw[HC + d], T.cast(sr[k, 0, j], T.float32))
                    m = T.ieee_add(m, T.ieee_mul(cw[2 * HC + d], T.cast(sr[k, 1, j], T.float32)))
                    m = T.ieee_add(m, T.ieee_mul(cw[3 * HC + d], T.cast(sr[k, 2, j], T.float32)))
                    m = T.ieee_add(m, T.ieee_mul(cw[4 * HC + d], T.cast(sr[k, 3, j], T.float32)))
                    ob[d, j] = T.cast(T.ieee_add(T.ieee_mul(cw[d], T.cast(fr[k, j], T.float32)), m), T.bfloat16)
            for d in T.unroll(HC):
                for j in T.unroll(VEC):
                    sr[k, d, j] = T.if_then_else(tok < n_tokens and g < n_vec, ob[d, j], T.bfloat16(0))
            if tok < n_tokens and g < n_vec:
                for d in T.unroll(HC):
                    for j in T.vectorized(VEC):
                        out[tok, d, g, j] = sr[k, d, j]

    @T.macro
    def front(ch, tile, streams, hc_fn, pre_in, u, part, f, post, comb, out):
        tx = T.get_thread_binding()
        ws = T.alloc_shared((MIXES, HC, STEP_VEC, 2, VEC // 2), T.float32)
        ss = T.alloc_shared((TOK, ROW), T.bfloat16)
        red = T.alloc_shared((TOK, RED_ROWS), T.float32)
        wr = T.alloc_local((W_PER_THREAD, VEC // 2), T.float32)
        sr = T.alloc_local((PAIRS, HC, VEC), T.bfloat16)
        lag = T.alloc_local((PAIRS, HC), T.float32)
        ub = T.alloc_local((VEC,), T.bfloat16)
        sb = T.alloc_local((2, VEC), T.bfloat16)
        xs = T.alloc_local((2, VEC), T.float32)
        wv = T.alloc_local((VEC,), T.float32)
        acc = T.alloc_local((2, RED_ROWS), T.float32)

        warp = tx // 32
        lane = tx % 32
        both = tile * TOK + 32 < n_tokens  # warp-uniform: a second token per lane

        for q in T.unroll(2):
            for r in T.unroll(RED_ROWS):
                acc[q, r] = T.float32(0)
        for k in T.unroll(PAIRS):
            tok = tile * TOK + (k * THREADS + tx) // STEP_VEC
            for i in T.unroll(HC):
                lag[k, i] = T.if_then_else(tok < n_tokens, pre_in[T.min(tok, n_tokens - 1), i], T.float32(0))

        if fused:
            # The tile's post and comb, [TOK, 4 + 16] (zeros past T).
            mix = T.alloc_shared((TOK, MIX_COLS), T.float32)
            fr = T.alloc_local((PAIRS, VEC), T.bfloat16)
            cw = T.alloc_local((MIX_COLS,), T.float32)
            ob = T.alloc_local((HC, VEC), T.bfloat16)
            for e in T.unroll(TOK * MIX_COLS // THREADS):
                idx = e * THREADS + tx
                tok = T.min(tile * TOK + idx // MIX_COLS, n_tokens - 1)
                c = idx % MIX_COLS
                mix[idx // MIX_COLS, c] = T.if_then_else(
                    tile * TOK + idx // MIX_COLS < n_tokens,
                    T.if_then_else(c < HC, post[tok, T.min(c, HC - 1)], comb[tok, T.max(c - HC, 0)]),
                    T.float32(0),
                )
            T.sync_threads()
            load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, 0)
            load_f(f, fr, ch, tile, tx, n_vec, n_tokens, 0)
            for step in T.serial(STEPS):
                expand_step(out, mix, sr, fr, cw, ob, ch, tile, tx, n_vec, n_tokens, step)
                store_step(ws, ss, u, wr, sr, lag, ub, ch, tile, tx, n_vec, n_tokens, step)
                T.sync_threads()
                if step + 1 < STEPS:
                    load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, step + 1)
                    load_f(f, fr, ch, tile, tx, n_vec, n_tokens, step + 1)
                if both:
                    dots(ss, ws, sb, xs, wv, acc, warp, lane, 2)
                else:
                    dots(ss, ws, sb, xs, wv, acc, warp, lane, 1)
                T.sync_threads()
        else:
            load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, 0)
            for step in T.serial(STEPS):
                store_step(ws, ss, u, wr, sr, lag, ub, ch, tile, tx, n_vec, n_tokens, step)
                T.sync_threads()
                if step + 1 < STEPS:
                    load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, step + 1)
                if both:
                    dots(ss, ws, sb, xs, wv, acc, warp, lane, 2)
                else:
                    dots(ss, ws, sb, xs, wv, acc, warp, lane, 1)
                T.sync_threads()

        # The four streams' sums, in stream order, then the tile's block of part.
        for w in T.unroll(HC):
            if warp == w:
                for q in T.unroll(2):
                    for r in T.unroll(RED_ROWS):
                        if w == 0:
                            red[lane + 32 * q, r] = acc[q, r]
                        else:
                            red[lane + 32 * q, r] = red[lane + 32 * q, r] + acc[q, r]
            T.sync_threads()
        for e in T.serial(T.ceildiv(TOK * RED_ROWS, THREADS)):
            idx = e * THREADS + tx
            tt = idx // RED_ROWS
            tok = tile * TOK + tt
            if idx < TOK * RED_ROWS and tok < n_tokens:
                part[ch, tok, idx % RED_ROWS] = red[tt, idx % RED_ROWS]

    if fused:

        @T.prim_func
        def deepinfer_mhc_expand_pre(
            streams: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
            f: T.Tensor((n_tokens, n_vec, VEC), T.bfloat16),
            post: T.Tensor((n_tokens, HC), T.float32),
            comb: T.Tensor((n_tokens, HC * HC), T.float32),
            hc_fn: T.Tensor((MIXES, HC, n_vec, 2, VEC // 2), T.float32),
            pre_in: T.Tensor((n_tokens, HC), T.float32),
            out: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
            u: T.Tensor((n_tokens, n_vec, VEC), T.bfloat16),
            part: T.Tensor((n_chunks, n_tokens, RED_ROWS), T.float32),
        ):
            with T.Kernel(n_chunks, T.ceildiv(n_tokens, TOK), threads=THREADS) as (ch, tile):
                front(ch, tile, streams, hc_fn, pre_in, u, part, f, post, comb, out)

        return deepinfer_mhc_expand_pre

    @T.prim_func
    def deepinfer_mhc_pre(
        streams: T.Tensor((n_tokens, HC, n_vec, VEC), T.bfloat16),
        hc_fn: T.Tensor((MIXES, HC, n_vec, 2, VEC // 2), T.float32),
        pre_in: T.Tensor((n_tokens, HC), T.float32),
        u: T.Tensor((n_tokens, n_vec, VEC), T.bfloat16),
        part: T.Tensor((n_chunks, n_tokens, RED_ROWS), T.float32),
    ):
        with T.Kernel(n_chunks, T.ceildiv(n_tokens, TOK), threads=THREADS) as (ch, tile):
            front(ch, tile, streams, hc_fn, pre_in, u, part, None, None, None, None)

    return deepinfer_mhc_pre


def launch_info(fused: bool = False) -> dict:
    """Launch geometry of the default build (or of the fused kernel), for
    generate.py's header."""
    smem = FUSED_SMEM_BYTES if fused else SMEM_BYTES
    what = "hc_fn step slice, staged streams%s; the [%d, 25] sums reuse space dead by then" % (
        ", the tile's post and comb" if fused else "",
        TOK,
    )
    return {
        "grid": "(ceil(n_vec / %d), ceil(n_tokens / %d), 1): one chunk of %d positions and %d tokens per CTA"
        % (CHUNK_VEC, TOK, CHUNK_VEC * VEC, TOK),
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d bytes (%s)" % (smem, what),
        "dynamic_smem_bytes": smem,
        "alignment": "streams, hc_fn, u%s 16 B, the rest 4 B; D %% 8 == 0, T*4*D < 2^31" % (", f, out" if fused else ""),
    }
