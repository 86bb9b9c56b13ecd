"""Clamped SwiGLU times the routing weight, fused with the FP8 1x32 activation quantiser
(v41-flash.md §7.2 then §10.1), in TileLang: the W2 input of every expert.

Semantics (bit-exact twin of `cpu_backend::swiglu_act_quant_fp8`, i.e. `moe::swiglu`
per row followed by `cpu_backend::act_quant_fp8`)
----------------------------------------------------------------------------------
Input gu is BF16 [M, 2I] row-major, the output of the gate-up projection whose W1 and
W3 rows are interleaved in blocks of 32: columns 64b .. 64b+31 are g's block b (W1),
columns 64b+32 .. 64b+63 are u's block b (W3); I % 32 == 0. weight is fp32 [M] (the token's routing weight; 1.0 for the shared expert), limit
L fp32 (10.0 in V4.1). Per element, in fp32 with IEEE rounding (no fast-math):

    g'  = min(fp32(g), L)                        (no lower clamp; NaN g -> L, like f32::min)
    u'  = clamp(fp32(u), -L, L)                  (NaN u stays NaN, like f32::clamp)
    e   = fp32_rn(exp(fp64(-g')))                double-precision exp, rounded once
    s   = 1 / (1 + e)                            IEEE add and division (rcp.rn)
    h   = bf16_rn(((g' * s) * u') * w_row)       left to right, three fp32 multiplies

then every block of 32 consecutive h values is quantised exactly as
`tilelang/act_quant_fp8.py` documents (amax of fp32(h) floored at 1e-4,
power-of-two scale 2^e from the bit-pattern ceiling of amax * fp32(1/448),
q = e4m3 saturating RNE of clamp(fp32(h) * 2^-e, -448, 448), E8M0 byte e + 127).

The exponential: the CPU reference computes e^x as the correctly rounded fp32
value, `(x as f64).exp() as f32`. CUDA's double exp (at most 1 ulp off) rounds to
the same fp32 value whenever e^x is more than one double ulp away from the midpoint
of two fp32 values; for every BF16 g' (L = 10 is one) the distance is at least 3.9
double ulps, so the two agree bit for bit on every input g can take. No expf, no
__expf: the division lowers to rcp.rn.f32 (IEEE), the conversions to
cvt.rn.f32.f64.

Layout
------
Because I % 32 == 0 the [M, 2I] input is viewed as G = M*I/32 independent groups,
each a 32-block of g followed by the 32-block of u it pairs with (as in
act_quant_fp8.py), so one dynamic size covers every (M, I) and no lane idles at the
end of a row; n_blocks = I/32 only locates a group's routing weight:
row = group / n_blocks (an unsigned 32-bit division per group).

    gu     : bf16  [G, 2, 32]  (== [M, 2I] row-major)  16-byte aligned
    weight : fp32  [M]                                 4-byte aligned
    q      : e4m3  [G, 32]  (== [M, I] row-major)      8-byte aligned
    scale  : u8    [G]      (== [M, I/32] row-major)   any alignment
    limit  : fp32;  n_blocks = I / 32 : int

Work mapping
------------
THREADS = 128 threads per CTA; each 32-group is owned by 4 consecutive lanes holding
8 consecutive elements each (one 16-byte load of g and of u, one 8-byte store of q).
One pass of the CTA covers 32 groups, i.e. a contiguous 4 KiB of gu, so the warp's
g load and u load each take every other 64 B of the same 1 KiB span; GROUP_PASSES = 2 passes (every
load issued before any use) give GROUPS_PER_CTA = 64 groups per CTA. The 4 lanes of
a group each load the group's weight (the same address; one transaction), combine
the amax with two xor-shuffles, and the first lane writes the scale byte. Two passes
(not four) keep small batches spread over more SMs (64 rows x 2304 -> 72 CTAs) and
the registers at 48 (no spills), leaving the FP64 exp latency many warps to hide in.

Launch: grid = (ceil(G / 64), 1, 1), block = (128, 1, 1), no dynamic shared memory.
Groups at or past G are masked (loads yield 0, stores are skipped), so G need not
be a multiple of 64; the group index is a 32-bit int, so G + 64 must fit in one.
"""

import tilelang.language as T

from act_quant_fp8 import AMAX_FLOOR, E4M3_MAX, INV_E4M3_MAX

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_swiglu_act_quant_fp8"

GROUP = 32              # quantisation block along I
LANES_PER_GROUP = 4     # lanes sharing one 32-group
VEC = GROUP // LANES_PER_GROUP  # 8 bf16 = 16 bytes per lane, pass and input
THREADS = 128
GROUP_PASSES = 2        # groups owned by each lane-quad
GROUPS_PER_CTA = THREADS // LANES_PER_GROUP * GROUP_PASSES  # 64


def swiglu_act_quant_fp8(threads: int = THREADS, passes: int = GROUP_PASSES):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32."""
    assert threads % 32 == 0
    groups_per_pass = threads // LANES_PER_GROUP
    block_g = groups_per_pass * passes

    n_groups = T.dynamic("n_groups")  # G = M * I / 32
    n_rows = T.dynamic("n_rows")      # M

    @T.prim_func
    def deepinfer_swiglu_act_quant_fp8(
        gu: T.Tensor((n_groups, 2, GROUP), T.bfloat16),
        weight: T.Tensor((n_rows,), T.float32),
        q: T.Tensor((n_groups, GROUP), T.float8_e4m3fn),
        scale: T.Tensor((n_groups,), T.uint8),
        limit: T.float32,
        n_blocks: T.int32,  # I / 32: groups per row
    ):
        with T.Kernel(T.ceildiv(n_groups, block_g), threads=threads) as bx:
            # g and u stay BF16 in registers (the promotion is exact and redone at use).
            gb = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            ub = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            hb = T.alloc_fragment((block_g, GROUP), T.bfloat16)
            hf = T.alloc_fragment((block_g, GROUP), T.float32)
            qf = T.alloc_fragment((block_g, GROUP), T.float8_e4m3fn)
            wf = T.alloc_fragment((block_g,), T.float32)
            amax = T.alloc_fragment((block_g,), T.float32)
            inv = T.alloc_fragment((block_g,), T.float32)
            sbyte = T.alloc_fragment((block_g,), T.uint8)

            # Group i of the tile lives on lanes 4*(i % groups_per_pass) + 0..3,
            # lane j//8 holding elements 8*(j//8) .. +7, register slot i // groups_per_pass.
            lane_layout = T.Fragment(
                (block_g, GROUP),
                forward_thread_fn=lambda i, j: (i % groups_per_pass) * LANES_PER_GROUP + j // VEC,
                forward_index_fn=lambda i, j: (i // groups_per_pass) * VEC + j % VEC,
            )
            T.annotate_layout({gb: lane_layout, ub: lane_layout, hb: lane_layout, hf: lane_layout, qf: lane_layout})

            T.copy(gu[bx * block_g : (bx + 1) * block_g, 0, 0:GROUP], gb)  # the one read of g
            T.copy(gu[bx * block_g : (bx + 1) * block_g, 1, 0:GROUP], ub)  # the one read of u
            for i in T.Parallel(block_g):
                # The group's row; unsigned so the division needs no sign fix-ups.
                row = T.cast(
                    T.cast(bx * block_g + i, T.uint32) // T.cast(n_blocks, T.uint32), T.int32
                )
                wf[i] = T.if_then_else(bx * block_g + i < n_groups, weight[row], T.float32(0))

            for i, j in T.Parallel(block_g, GROUP):
                gv = T.min(T.cast(gb[i, j], T.float32), limit)
                uv = T.clamp(T.cast(ub[i, j], T.float32), -limit, limit)
                # e^-g' correctly rounded to fp32: double exp, one rounding.
                e = T.cast(T.exp(T.cast(-gv, T.float64)), T.float32)
                sig = T.float32(1.0) / (T.float32(1.0) + e)
                hb[i, j] = T.cast(((gv * sig) * uv) * wf[i], T.bfloat16)
            # The quantiser works on the BF16-rounded h, promoted back to fp32.
            for i, j in T.Parallel(block_g, GROUP):
                hf[i, j] = T.cast(hb[i, j], T.float32)

            T.reduce_absmax(hf, amax, dim=1)  # 4-lane xor-shuffle max
            for i in T.Parallel(block_g):
                p = T.max(amax[i], T.float32(AMAX_FLOOR)) * T.float32(INV_E4M3_MAX)
                bits = T.reinterpret(p, T.uint32)
                ex = (
                    T.cast((bits >> T.uint32(23)) & T.uint32(0xFF), T.int32)
                    - 127
                    + T.cast((bits & T.uint32(0x7FFFFF)) != T.uint32(0), T.int32)
                )
                ex = T.min(T.max(ex, -127), 127)
                inv[i] = T.if_then_else(
                    ex == 127,
                    T.reinterpret(T.uint32(0x00400000), T.float32),  # 2^-127
                    T.reinterpret(T.shift_left(T.cast(127 - ex, T.uint32), T.uint32(23)), T.float32),
                )
                sbyte[i] = T.cast(ex + 127, T.uint8)
            for i, j in T.Parallel(block_g, GROUP):
                # e4m3fn casts lower to cvt.rn.satfinite (RNE, NaN -> 0x7F).
                qf[i, j] = T.clamp(hf[i, j] * inv[i], -E4M3_MAX, E4M3_MAX)

            T.copy(qf, q[bx * block_g, 0])
            T.copy(sbyte, scale[bx * block_g])

    return deepinfer_swiglu_act_quant_fp8


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(ceil(n_groups / %d), 1, 1) with n_groups = M*I/32" % GROUPS_PER_CTA,
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "gu 16 B, q 8 B, weight 4 B, scale 1 B; I %% 32 == 0, n_blocks = I/32, "
        "n_groups + %d < 2^31" % GROUPS_PER_CTA,
    }
