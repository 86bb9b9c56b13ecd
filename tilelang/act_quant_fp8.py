"""FP8 1x32 activation quantiser with E8M0 scales (v41-flash.md §10.1), in TileLang.

Semantics (bit-exact twin of `src/numerics.rs::act_quant_block` for K % 32 == 0)
---------------------------------------------------------------------------
Input x is BF16 [M, K], row-major, K % 32 == 0. For every block of 32
consecutive elements of a row:

    amax  = max(1e-4f, max_i |fp32(x_i)|)        NaN elements are ignored
    p     = amax * fp32(1/448)                   one fp32 multiply (RN)
    e     = ((bits(p) >> 23) & 0xFF) - 127 + ((bits(p) & 0x7FFFFF) != 0)
            -- ceil(log2(p)) on the bit pattern; no log2f/exp2f anywhere
    e     = clamp(e, -127, 127)                  only reachable with +-inf input
    inv   = 2^-e, built from bits: (127 - e) << 23, or 0x00400000 (2^-127,
            an fp32 subnormal) when e == 127
    q_i   = e4m3_satfinite_rne(clamp(fp32(x_i) * inv, -448, 448))
            (x * 2^-e is exact; NaN -> 0x7F, +-inf -> +-448)
    scale = uint8(e + 127)                       E8M0 byte

For finite inputs e lies in [-22, 120], so the clamp and the subnormal branch
never fire; they only make +-inf inputs agree with the CPU reference.

Layout
------
Because K % 32 == 0 the row structure is irrelevant: the [M, K] input is
viewed as G = M*K/32 independent groups of 32, so one kernel serves every
(M, K) with a single dynamic argument.

    x     : bf16  [G, 32]  (== [M, K] row-major)   16-byte aligned
    q     : e4m3  [G, 32]  (== [M, K] row-major)    8-byte aligned
    scale : u8    [G]      (== [M, K/32] row-major) any alignment

Work mapping (efficient for a memory-bound op)
----------------------------------------------
THREADS threads per CTA; each 32-group is owned by LANES_PER_GROUP = 4
consecutive lanes holding VEC = 8 consecutive elements each (one 16-byte
load, one 8-byte store). One "pass" of the CTA covers THREADS / 4 groups,
i.e. a contiguous THREADS*16 bytes of x, so every warp load instruction is a
fully coalesced 512 B span. Each thread runs GROUP_PASSES passes (all loads
issued before any use), so a CTA handles GROUPS_PER_CTA = THREADS / 4 *
GROUP_PASSES groups. The group amax is combined over the 4 lanes with two
xor-shuffles (TileLang's AllReduce over a fragment laid out by hand); the
first lane of each group writes the scale byte.

Launch: grid = (ceil(G / GROUPS_PER_CTA), 1, 1), block = (THREADS, 1, 1),
no dynamic shared memory. Rows past G are masked (loads yield 0, stores are
skipped), so G need not be a multiple of GROUPS_PER_CTA.
"""

import struct

import tilelang.language as T


def _f32(v: float) -> float:
    """Round to the nearest fp32 (RNE), so the emitted literal is exact."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_act_quant_fp8"

GROUP = 32              # quantisation block along K
LANES_PER_GROUP = 4     # lanes sharing one 32-group
VEC = GROUP // LANES_PER_GROUP  # 8 bf16 = 16 bytes per lane and pass
THREADS = 128
GROUP_PASSES = 4        # groups owned by each lane-quad
GROUPS_PER_CTA = THREADS // LANES_PER_GROUP * GROUP_PASSES

AMAX_FLOOR = _f32(1e-4)          # 0x38D1B717
E4M3_MAX = 448.0
INV_E4M3_MAX = _f32(1.0 / 448.0)  # 0x3B124925, == fp32(1) / fp32(448)


@T.macro
def e8m0_scales(amax, inv, sbyte):
    """Per group g: the E8M0 scale of amax[g] (§10.1) as the byte e + 127 in
    sbyte[g] and its reciprocal 2^-e in inv[g], where e is the bit-pattern
    ceiling of log2(max(amax, 1e-4) * fp32(1/448)) clamped to [-127, 127]
    (2^-127 is written as the subnormal it is). Shared by every FP8 1x32
    quantiser program."""
    for g in T.Parallel(amax.shape[0]):
        p = T.max(amax[g], T.float32(AMAX_FLOOR)) * T.float32(INV_E4M3_MAX)
        bits = T.reinterpret(p, T.uint32)
        e = (
            T.cast((bits >> T.uint32(23)) & T.uint32(0xFF), T.int32)
            - 127
            + T.cast((bits & T.uint32(0x7FFFFF)) != T.uint32(0), T.int32)
        )
        e = T.min(T.max(e, -127), 127)
        inv[g] = T.if_then_else(
            e == 127,
            T.reinterpret(T.uint32(0x00400000), T.float32),  # 2^-127
            T.reinterpret(T.shift_left(T.cast(127 - e, T.uint32), T.uint32(23)), T.float32),
        )
        sbyte[g] = T.cast(e + 127, T.uint8)


def act_quant_fp8(threads: int = THREADS, passes: int = GROUP_PASSES):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32."""
    assert threads % 32 == 0
    groups_per_pass = threads // LANES_PER_GROUP
    block_g = groups_per_pass * passes

    n_groups = T.dynamic("n_groups")  # G = M * K / 32

    @T.prim_func
    def deepinfer_act_quant_fp8(
        x: T.Tensor((n_groups, GROUP), T.bfloat16),
        q: T.Tensor((n_groups, GROUP), T.float8_e4m3fn),
        scale: T.Tensor((n_groups,), T.uint8),
    ):
        with T.Kernel(T.ceildiv(n_groups, block_g), threads=threads) as bx:
            xf = T.alloc_fragment((block_g, GROUP), T.float32)
            qf = T.alloc_fragment((block_g, GROUP), T.float8_e4m3fn)
            amax = T.alloc_fragment((block_g,), T.float32)
            inv = T.alloc_fragment((block_g,), T.float32)
            sbyte = T.alloc_fragment((block_g,), T.uint8)

            # Group g of the tile lives on lanes 4*(g % groups_per_pass) + 0..3,
            # lane j//8 holding elements 8*(j//8) .. +7, register slot g // groups_per_pass.
            lane_layout = T.Fragment(
                (block_g, GROUP),
                forward_thread_fn=lambda g, j: (g % groups_per_pass) * LANES_PER_GROUP + j // VEC,
                forward_index_fn=lambda g, j: (g // groups_per_pass) * VEC + j % VEC,
            )
            T.annotate_layout({xf: lane_layout, qf: lane_layout})

            T.copy(x[bx * block_g, 0], xf)  # bf16 -> fp32 (exact)
            T.reduce_absmax(xf, amax, dim=1)  # 4-lane xor-shuffle max

            e8m0_scales(amax, inv, sbyte)

            for g, j in T.Parallel(block_g, GROUP):
                # e4m3fn casts lower to cvt.rn.satfinite (RNE, NaN -> 0x7F).
                qf[g, j] = T.clamp(xf[g, j] * inv[g], -E4M3_MAX, E4M3_MAX)

            T.copy(qf, q[bx * block_g, 0])
            T.copy(sbyte, scale[bx * block_g])

    return deepinfer_act_quant_fp8


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    return {
        "grid": "(ceil(n_groups / %d), 1, 1) with n_groups = M*K/32" % GROUPS_PER_CTA,
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "0",
        "alignment": "x 16 B, q 8 B, scale 1 B; K % 32 == 0",
    }
