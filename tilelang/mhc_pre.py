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

The 24 dots run on the tensor cores: hc_fn is split into three BF16 terms
that add up to it exactly (hi = w cut to 16 bits, mid = the rest cut to 16
bits, lo = what is left, at most 8 significant bits; a non-finite w stays in
hi, mid = lo = 0); each BF16 product with S is exact, and mma.sync m16n8k16
accumulates them in fp32, per K block of 16 the hi, mid and lo terms in
that order. The tensor cores' fp32 accumulation is not IEEE round-to-nearest
at each add (the terms of an MMA are aligned and truncated), so the sums are
close to an fp32 GEMV's, not bitwise. The squares are fp32 (FMA-contracted):
each thread walks its one vector of each step, stream by stream, and a
token's four vectors are added across the quad as (v0 + v1) + (v2 + v3).
The order is fixed by D alone and depends on neither T nor the token's place
in its tile (batch invariant); pass 2 adds the chunks in ascending order.
Not the CPU's sequential order: compare the mixes with a tolerance.

Layout and work mapping
-----------------------
    streams : bf16 [T, 4, n_vec, 8]          (== [T, 4, D]), n_vec = D / 8
    hc_fn   : fp32 [24, 4, n_vec, 2, 4]      (== [24, 4·D])
    pre_in  : fp32 [T, 4]
    u       : bf16 [T, n_vec, 8]             (== [T, D])
    part    : fp32 [n_chunks, T, 25]          n_chunks = ceil(n_vec / 16)

grid = (n_chunks, ceil(T / 64)): one CTA per chunk of 128 positions and tile
of 64 tokens; the chunk's 48 KiB of hc_fn is read once per tile (through L2).
128 threads = 4 warps; warp w holds the m16 tile of tokens 16w .. 16w + 15
and all 24 mixes (three n8 tiles), and skips the MMAs when its first token is
past T (a warp-uniform branch).

The chunk is walked in 4 steps of 32 positions. Each step's hc_fn slice
(24 × 4 × 32 fp32, 12 KiB, stored as the hi, mid and lo terms [24, 136] BF16)
and stream slice (64 tokens × 4 × 32 BF16, rows padded to 272 bytes) go
global → registers → shared memory; the next step's global loads are issued
before the current step's MMAs. The padded rows make the fragments' 32-bit
loads conflict-free (row r starts 4r banks on). u is written from the staged
registers. Positions past D and tokens past T stage as zeros. The
accumulators and squares meet in shared memory [64, 25], and the tile's
[64, 25] block of part is written contiguously.

Registers: 166 (3 CTAs an SM, the launch bounds ask for it; 180 and 2
without), the fused kernel 241 (2). Measured before (the fp32 FMA GEMV this
replaces, 2026-12-02): 240
registers, 2 CTAs an SM, 760 us at 16384 tokens with pass 2 (26 % of copy),
bound by the FMAs and the shared-memory loads that fed them. Two warps a
stream (256 threads) measured slower (929 us).

Launch: grid = (n_chunks, ceil(T / 64), 1), block = (128, 1, 1), 36992 bytes
of dynamic shared memory (hc_fn terms 3 × 6528, streams 17408; the sums,
6400, reuse space dead after the last step).
T * 4 * D < 2^31.
"""

import tilelang.language as T

PRIM_FUNC_NAME = "deepinfer_mhc_pre"

HC = 4
MIXES = 24
VEC = 8
THREADS = 128
RED_ROWS = MIXES + 1  # 24 dots and the sum of squares
TOK = 64  # tokens per CTA (16 per warp)
CHUNK_VEC = 16  # 16-byte vectors (of each stream) per chunk: 128 positions
STEP_VEC = 4  # vectors per step: 32 positions
STEPS = CHUNK_VEC // STEP_VEC
ROW = HC * STEP_VEC * VEC + VEC  # BF16 per staged token row, padded by 16 bytes
W_F4 = MIXES * HC * STEP_VEC * 2  # float4 loads of one step's hc_fn slice
W_PER_THREAD = W_F4 // THREADS
PAIRS = TOK * STEP_VEC // THREADS  # (token, vector) pairs staged per thread
MIX_COLS = HC + HC * HC  # the fused kernel's post and comb of a token
KCOLS = HC * STEP_VEC * VEC  # a step's positions of the four streams: the GEMM's K
WROW = KCOLS + VEC  # BF16 per staged hc_fn row (hi or lo term), padded by 16 bytes
KB = KCOLS // 16  # m16n8k16 K blocks a step
NT = MIXES // 8  # n8 tiles of the 24 mixes
WARP_TOK = TOK // (THREADS // 32)  # tokens a warp's m16 tile holds
assert WARP_TOK == 16 and MIXES % 8 == 0
# The [64, 25] sums live after the last step: TileLang places them over the
# staged streams (its liveness merge), so they add nothing.
SMEM_BYTES = 3 * MIXES * WROW * 2 + TOK * ROW * 2
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
    def store_step(wh, wm, wl, ss, u, wr, sr, sq, lag, ub, ch, tile, tx, n_vec, n_tokens, step):
        # Registers -> shared memory: hc_fn as three BF16 terms that add up to
        # w exactly: hi = w with its low 16 bits cut, r = w - hi (exact, at
        # most 16 significant bits), mid = r with its low 16 bits cut, lo =
        # r - mid (exact, at most 8 significant bits: a BF16 value). Cutting
        # never rounds up to infinity; a non-finite w keeps its value in hi
        # (NaN stays NaN) and mid = lo = 0. Then the squares of the staged
        # pairs, and the collapse u of the staged pairs.
        for k in T.unroll(W_PER_THREAD):
            r, i, vv, h = w_slot(k * THREADS + tx)
            for j in T.unroll(VEC // 2):
                bits = T.reinterpret(wr[k, j], T.uint32)
                hi = T.reinterpret(bits & T.uint32(0xFFFF0000), T.float32)
                rest = wr[k, j] - hi
                mid = T.reinterpret(T.reinterpret(rest, T.uint32) & T.uint32(0xFFFF0000), T.float32)
                finite = (bits & T.uint32(0x7F800000)) != T.uint32(0x7F800000)
                col = i * (STEP_VEC * VEC) + vv * VEC + h * (VEC // 2) + j
                wh[r, col] = T.cast(T.if_then_else(finite, hi, wr[k, j]), T.bfloat16)
                wm[r, col] = T.cast(T.if_then_else(finite, mid, T.float32(0)), T.bfloat16)
                wl[r, col] = T.cast(T.if_then_else(finite, rest - mid, T.float32(0)), T.bfloat16)
        for k in T.unroll(PAIRS):
            for i in T.unroll(HC):
                for j in T.unroll(VEC):
                    sq[k] = sq[k] + T.cast(sr[k, i, j], T.float32) * T.cast(sr[k, i, j], T.float32)
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
    def dots(ss, wh, wm, wl, af, acc, warp, lane):
        # The warp's 16 tokens x the 24 mixes over the step's 128 K columns:
        # per K block of 16, the A fragment once, then per n8 tile the hi, mid
        # and lo terms (mma.sync m16n8k16, fp32 accumulate), in that order.
        g = lane // 4
        t = lane % 4
        for kb in T.unroll(KB):
            T.call_extern(
                "handle",
                "deepinfer_ldfrag_a_16816",
                T.address_of(af[0]),
                T.address_of(ss[warp * WARP_TOK + g, kb * 16 + 2 * t]),
                T.address_of(ss[warp * WARP_TOK + g + 8, kb * 16 + 2 * t]),
            )
            for nt in T.unroll(NT):
                T.call_extern(
                    "handle",
                    "deepinfer_mma_bf16_16816",
                    T.address_of(acc[nt, 0]),
                    T.address_of(af[0]),
                    T.address_of(wh[nt * 8 + g, kb * 16 + 2 * t]),
                )
                T.call_extern(
                    "handle",
                    "deepinfer_mma_bf16_16816",
                    T.address_of(acc[nt, 0]),
                    T.address_of(af[0]),
                    T.address_of(wm[nt * 8 + g, kb * 16 + 2 * t]),
                )
                T.call_extern(
                    "handle",
                    "deepinfer_mma_bf16_16816",
                    T.address_of(acc[nt, 0]),
                    T.address_of(af[0]),
                    T.address_of(wl[nt * 8 + g, kb * 16 + 2 * t]),
                )

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
        wh = T.alloc_shared((MIXES, WROW), T.bfloat16)
        wm = T.alloc_shared((MIXES, WROW), T.bfloat16)
        wl = T.alloc_shared((MIXES, WROW), T.bfloat16)
        ss = T.alloc_shared((TOK, ROW), T.bfloat16)
        red = T.alloc_shared((TOK, RED_ROWS), T.float32)
        wr = T.alloc_local((W_PER_THREAD, VEC // 2), T.float32)
        sr = T.alloc_local((PAIRS, HC, VEC), T.bfloat16)
        sq = T.alloc_local((PAIRS,), T.float32)
        lag = T.alloc_local((PAIRS, HC), T.float32)
        ub = T.alloc_local((VEC,), T.bfloat16)
        af = T.alloc_local((4,), T.uint32)
        acc = T.alloc_local((NT, 4), T.float32)

        warp = tx // 32
        lane = tx % 32
        busy = tile * TOK + warp * WARP_TOK < n_tokens  # warp-uniform: the warp's tokens hold one

        for nt in T.unroll(NT):
            for c in T.unroll(4):
                acc[nt, c] = T.float32(0)
        for k in T.unroll(PAIRS):
            sq[k] = T.float32(0)
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
                store_step(wh, wm, wl, ss, u, wr, sr, sq, lag, ub, ch, tile, tx, n_vec, n_tokens, step)
                T.sync_threads()
                if step + 1 < STEPS:
                    load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, step + 1)
                    load_f(f, fr, ch, tile, tx, n_vec, n_tokens, step + 1)
                if busy:
                    dots(ss, wh, wm, wl, af, acc, warp, lane)
                T.sync_threads()
        else:
            load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, 0)
            for step in T.serial(STEPS):
                store_step(wh, wm, wl, ss, u, wr, sr, sq, lag, ub, ch, tile, tx, n_vec, n_tokens, step)
                T.sync_threads()
                if step + 1 < STEPS:
                    load_step(hc_fn, streams, wr, sr, ch, tile, tx, n_vec, n_tokens, step + 1)
                if busy:
                    dots(ss, wh, wm, wl, af, acc, warp, lane)
                T.sync_threads()

        # The warps' accumulators (C fragment: rows g and g + 8, columns 2t and
        # 2t + 1 of each n8 tile) and each token's squares, its four vectors'
        # sums added across the quad as (v0 + v1) + (v2 + v3); then the tile's
        # block of part.
        for nt in T.unroll(NT):
            for c in T.unroll(4):
                red[warp * WARP_TOK + lane // 4 + 8 * (c // 2), nt * 8 + 2 * (lane % 4) + c % 2] = acc[nt, c]
        for k in T.unroll(PAIRS):
            sq[k] = sq[k] + T.shfl_xor(sq[k], 1)
            sq[k] = sq[k] + T.shfl_xor(sq[k], 2)
            if tx % STEP_VEC == 0:
                red[(k * THREADS + tx) // STEP_VEC, MIXES] = sq[k]
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
            # 166 registers, no spills: 3 CTAs an SM (180 and 2 without).
            T.annotate_min_blocks_per_sm(3)
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
