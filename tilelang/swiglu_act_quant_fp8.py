"""Clamped SwiGLU times the routing weight, fused with the FP8 1x32 activation quantiser
(v41-flash.md §7.2 then §10.1), in TileLang: the W2 input of every expert.

Semantics (bit-exact twin of `cpu_backend::swiglu_act_quant_fp8`, i.e. `moe::swiglu`
per row followed by `cpu_backend::act_quant_fp8`)
----------------------------------------------------------------------------------
Input gu is BF16 [M, 2I] row-major, the output of the gate-up projection whose W1 and
W3 rows are interleaved in blocks of 32: columns 64b .. 64b+31 are g's block b (W1),
columns 64b+32 .. 64b+63 are u's block b (W3); I % 32 == 0. weight is fp32 [M] (the
token's routing weight; 1.0 for the shared expert), limit L fp32 (10.0 in V4.1). Per element, in fp32 with IEEE rounding (no fast-math):

    g'  = min(fp32(g), L)                        (no lower clamp; NaN g -> L, like f32::min)
    u'  = clamp(fp32(u), -L, L)                  (NaN u stays NaN, like f32::clamp)
    s   = sigmoid(g') = 1 / (1 + fp32_rn(e^-g'))  the reference's, looked up (below)
    h   = bf16_rn(((g' * s) * u') * w_row)       left to right, three fp32 multiplies

then every block of 32 consecutive h values is quantised exactly as
`tilelang/act_quant_fp8.py` documents (amax of fp32(h) floored at 1e-4,
power-of-two scale 2^e from the bit-pattern ceiling of amax * fp32(1/448),
q = e4m3 saturating RNE of clamp(fp32(h) * 2^-e, -448, 448), E8M0 byte e + 127).

sigma from a table: the CPU reference's sigma(g') = 1 / (1 + e^-g'), with e^x the
correctly rounded fp32 value, takes its argument from a small set: g' is a BF16
value or L itself. Outside |g'| in [2^-25, 2^7) it is 1/2, 1 or 0 by sign
(`tests/swiglu_cpu.rs` checks all 65,536 BF16 patterns), so the kernel computes no
exponential: it looks sigma up in `sigma`, a table of 2 x 4098 fp32 values the host
builds from the reference itself (`numerics::sigmoid_bf16_table`), indexed by g''s
BF16 bits b = fp32_bits(g') >> 16:

    idx = min(max(b & 0x7FFF, 0x32FF), 0x4300) - 0x32FF + (b >> 15) * 4098

(slot 0 of each sign: |g'| < 2^-25; slots 1..4096: the 32 binades x 128 mantissas
between; slot 4097: |g'| >= 2^7 and infinities). Where g' == L (g >= L, or g NaN)
the kernel takes sigma_limit = sigmoid(L), computed by the host, since L need not be
a BF16 value. `tests/swiglu_cpu.rs` checks the index formula and the table against
`numerics::sigmoid` on every BF16 input, so the lookup is the reference by
construction; the rest (three fp32 multiplies, the BF16 rounding) is IEEE.

Layout
------
Because I % 32 == 0 the [M, 2I] input is viewed as G = M*I/32 independent groups,
each a 32-block of g followed by the 32-block of u it pairs with (as in
act_quant_fp8.py), so one dynamic size covers every (M, I) and no lane idles at the
end of a row. A group's routing weight is weight[group / n_blocks] with
n_blocks = I/32, computed as (group * row_magic) >> row_shift in 64-bit arithmetic:
the host picks row_magic = ceil(2^(31+l) / n_blocks), l = ceil(log2 n_blocks),
row_shift = 31 + l, exact for every group below 2^31 (`row_divider` in
src/cuda_backend/tilelang_swiglu.rs, tested on its edges).

    gu     : bf16  [G, 2, 32]  (== [M, 2I] row-major)  16-byte aligned
    weight : fp32  [M]                                 4-byte aligned
    sigma  : fp32  [8196]                              4-byte aligned
    q      : e4m3  [G, 32]  (== [M, I] row-major)      8-byte aligned
    scale  : u8    [G]      (== [M, I/32] row-major)   any alignment
    limit, sigma_limit : fp32;  row_magic : u32;  row_shift, n_ctas : int

Work mapping
------------
Persistent: the grid is n_ctas <= ceil(G / 64) CTAs (the host launches the CTAs
that fit on the device at once), each copies the table into shared memory once
(32,784 bytes of dynamic shared memory) and then walks the tiles bx, bx + n_ctas,
... of 64 groups (8 KiB of gu). THREADS = 256 threads a CTA; each 32-group is
owned by 4 consecutive lanes holding 8 consecutive elements (one 16-byte load of
g and of u, one 8-byte store of q). The tiles go in pairs through two register
buffers: the loads of tile k+1 are issued before tile k is computed, so a warp
has a tile's loads in flight while it computes (measured: 73 % of copy at
16384 x 2304, against 71.6 % with one buffer; `tilelang/README.md`). Loads take
the group index clamped to G - 1 (a tile past the end reloads the last group,
and a CTA's last pair may compute such a tile), so no load is masked; stores
are masked at G. The 4 lanes of a group each load the group's weight (the same
address; one transaction), combine the amax with two xor-shuffles, and the
first lane writes the scale byte.

Instruction budget (the kernel was ALU-bound at 63 % of copy, ncu 2026-12-04):
the sigma index uses one integer multiply-shift on the FMA pipe per shift
(`__umulhi`: x >> k as the high word of x * 2^(32-k)) and x * 2 (IMAD) to drop
the sign; u's clamp is `deepinfer_clamp_nan` (PTX max.NaN / min.NaN: a NaN u
gives NaN h as in the reference, and q depends on no NaN payload); the
quantiser's clamp to +-448 is the e4m3 conversion's own (cvt.rn.satfinite
saturates finite values to +-448 and turns NaN into 0x7F, as clamp then
conversion would). The group index is a 32-bit int: the host requires
4 * (G + 64) < 2^31 (tiles computed stay below ceil(G / 64) + 2 * n_ctas,
at most three times the tiles).
"""

import tilelang.language as T

from act_quant_fp8 import e8m0_scales

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_swiglu_act_quant_fp8"

GROUP = 32              # quantisation block along I
LANES_PER_GROUP = 4     # lanes sharing one 32-group
VEC = GROUP // LANES_PER_GROUP  # 8 bf16 = 16 bytes per lane, pass and input
THREADS = 256
GROUP_PASSES = 1        # groups owned by each lane-quad per tile
GROUPS_PER_TILE = THREADS // LANES_PER_GROUP * GROUP_PASSES  # 64
# The sigma table (numerics::sigmoid_bf16_table): per sign, slot 0 for
# |g'| < 2^-25, slots 1..4096 for BF16 magnitudes 0x3300..0x42FF, slot 4097
# for |g'| >= 2^7.
MAG_LO = 0x32FF         # BF16 magnitude bits of the largest |g'| below 2^-25
MAG_HI = 0x4300         # of 2^7
HALF = MAG_HI - MAG_LO + 1  # 4098 slots per sign
TABLE = 2 * HALF
TABLE_BYTES = TABLE * 4


def swiglu_act_quant_fp8(threads: int = THREADS, passes: int = GROUP_PASSES):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32."""
    assert threads % 32 == 0
    groups_per_pass = threads // LANES_PER_GROUP
    block_g = groups_per_pass * passes

    n_groups = T.dynamic("n_groups")  # G = M * I / 32
    n_rows = T.dynamic("n_rows")      # M

    @T.macro
    def load(gu, weight, row_magic, row_shift, t, gbuf, ubuf, wbuf):
        """Tile t's g, u and routing weights into one register buffer. Groups are
        clamped to the last one (a tile past the end is computed, never stored),
        so no load needs a mask."""
        for i, j in T.Parallel(block_g, GROUP):
            gbuf[i, j] = gu[T.min(t * block_g + i, n_groups - 1), 0, j]
            ubuf[i, j] = gu[T.min(t * block_g + i, n_groups - 1), 1, j]
        for i in T.Parallel(block_g):
            gi = T.cast(T.min(t * block_g + i, n_groups - 1), T.uint64)
            wbuf[i] = weight[T.cast((gi * T.cast(row_magic, T.uint64)) >> T.cast(row_shift, T.uint64), T.int32)]

    @T.macro
    def compute(q, scale, tbl, limit, sigma_limit, gf, uf, hf, hb, ha, amax, inv, sbyte, qf, t, gbuf, ubuf, wbuf):
        """h, its amax, q and the scale bytes of tile t from one register buffer;
        the stores are masked at n_groups."""
        for i, j in T.Parallel(block_g, GROUP):
            gf[i, j] = T.cast(gbuf[i, j], T.float32)
            uf[i, j] = T.call_extern(T.float32, "deepinfer_clamp_nan", T.cast(ubuf[i, j], T.float32), -limit, limit)
        for i, j in T.Parallel(block_g, GROUP):
            # The table slot from g's bits (numerics::sigmoid_bf16_index): fb * 2
            # drops the sign and leaves |g|'s BF16 bits << 17, clamped to the
            # bounds << 17, then >> 17 by __umulhi; plus HALF for a negative g.
            # The - MAG_LO is folded into the shared-memory load's offset.
            fb = T.reinterpret(gf[i, j], T.uint32)
            m = T.min(T.max(fb * T.uint32(2), T.uint32(MAG_LO << 17)), T.uint32(MAG_HI << 17))
            sgn = T.call_extern(T.uint32, "__umulhi", fb, T.uint32(2))
            idx = T.call_extern(T.uint32, "__umulhi", m, T.uint32(0x8000)) + sgn * T.uint32(HALF)
            gv = T.min(gf[i, j], limit)
            sig = T.if_then_else(gv == limit, sigma_limit, tbl[idx - T.uint32(MAG_LO)])
            hf[i, j] = ((gv * sig) * uf[i, j]) * wbuf[i]
        for i, j in T.Parallel(block_g, GROUP):
            hb[i, j] = T.cast(hf[i, j], T.bfloat16)
        for i, j in T.Parallel(block_g, GROUP):
            hf[i, j] = T.cast(hb[i, j], T.float32)
        for i, j in T.Parallel(block_g, GROUP):
            ha[i, j] = T.abs(hf[i, j])
        T.reduce_max(ha, amax, dim=1)
        e8m0_scales(amax, inv, sbyte)
        for i, j in T.Parallel(block_g, GROUP):
            qf[i, j] = hf[i, j] * inv[i]
        T.copy(qf, q[t * block_g, 0])
        T.copy(sbyte, scale[t * block_g])

    @T.prim_func
    def deepinfer_swiglu_act_quant_fp8(
        gu: T.Tensor((n_groups, 2, GROUP), T.bfloat16),
        weight: T.Tensor((n_rows,), T.float32),
        sigma: T.Tensor((TABLE,), T.float32),
        q: T.Tensor((n_groups, GROUP), T.float8_e4m3fn),
        scale: T.Tensor((n_groups,), T.uint8),
        limit: T.float32,
        sigma_limit: T.float32,  # sigmoid(L)
        row_magic: T.uint32,     # group / n_blocks == (group * row_magic) >> row_shift
        row_shift: T.int32,
        n_ctas: T.int32,         # the grid, at most ceil(n_groups / block_g)
    ):
        with T.Kernel(n_ctas, threads=threads) as bx:
            tbl = T.alloc_shared((TABLE,), T.float32)
            # g and u stay BF16 in registers until their tile is computed.
            gb = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            ub = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            hb = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            hf = T.alloc_fragment((block_g, GROUP), T.float32)
            ha = T.alloc_fragment((block_g, GROUP), T.float32)
            gf = T.alloc_fragment((block_g, GROUP), T.float32)
            uf = T.alloc_fragment((block_g, GROUP), T.float32)
            qf = T.alloc_fragment((block_g, GROUP), T.float8_e4m3fn)
            wf = T.alloc_fragment((block_g,), T.float32)
            gb2 = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            ub2 = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            wf2 = T.alloc_fragment((block_g,), T.float32)
            amax = T.alloc_fragment((block_g,), T.float32)
            inv = T.alloc_fragment((block_g,), T.float32)
            sbyte = T.alloc_fragment((block_g,), T.uint8)

            # Group i of a tile lives on lanes 4*(i % groups_per_pass) + 0..3,
            # lane j//8 holding elements 8*(j//8) .. +7, register slot i // groups_per_pass.
            lane_layout = T.Fragment(
                (block_g, GROUP),
                forward_thread_fn=lambda i, j: (i % groups_per_pass) * LANES_PER_GROUP + j // VEC,
                forward_index_fn=lambda i, j: (i // groups_per_pass) * VEC + j % VEC,
            )
            T.annotate_layout(
                {b: lane_layout for b in (gb, ub, gb2, ub2, gf, uf, hf, hb, ha, qf)}
            )

            T.copy(sigma, tbl)  # once per CTA

            # Tiles bx, bx + n_ctas, ... in pairs through buffers (gb, ub, wf)
            # and (gb2, ub2, wf2): each load is issued one tile before its use.
            iters = T.ceildiv(T.ceildiv(n_groups, block_g) - bx, n_ctas)
            load(gu, weight, row_magic, row_shift, bx, gb, ub, wf)
            for p in T.serial(T.ceildiv(iters, 2)):
                t = bx + 2 * p * n_ctas
                load(gu, weight, row_magic, row_shift, t + n_ctas, gb2, ub2, wf2)
                compute(q, scale, tbl, limit, sigma_limit, gf, uf, hf, hb, ha, amax, inv, sbyte, qf, t, gb, ub, wf)
                load(gu, weight, row_magic, row_shift, t + 2 * n_ctas, gb, ub, wf)
                compute(q, scale, tbl, limit, sigma_limit, gf, uf, hf, hb, ha, amax, inv, sbyte, qf, t + n_ctas, gb2, ub2, wf2)

    return deepinfer_swiglu_act_quant_fp8


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(n_ctas, 1, 1): persistent, n_ctas <= ceil(n_groups / %d), n_groups = M*I/32" % GROUPS_PER_TILE,
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d bytes (the sigma table)" % TABLE_BYTES,
        "dynamic_smem_bytes": TABLE_BYTES,
        "alignment": "gu 16 B, q 8 B, weight and sigma 4 B, scale 1 B; I %% 32 == 0, "
        "4 * (n_groups + %d) < 2^31" % GROUPS_PER_TILE,
    }
