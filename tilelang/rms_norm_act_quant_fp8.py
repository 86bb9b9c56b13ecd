"""RMSNorm fused with the FP8 1x32 activation quantiser (v41-flash.md §10.6 then §10.1), in TileLang.

Semantics (twin of `cpu_backend::rms_norm` followed by `cpu_backend::act_quant_fp8`)
----------------------------------------------------------------------------------
Input x is BF16 [M, D] row-major, weight BF16 [D], eps fp32, D % 32 == 0,
D <= D_MAX (8192). Per row, in fp32 with IEEE rounding (no fast-math):

    ss      = sum_i fp32(x_i)^2                  fixed-shape tree, see below
    inv_rms = 1 / sqrt(ss / fp32(D) + eps)       IEEE division and sqrt
    y_i     = bf16_rn(fp32(w_i) * (fp32(x_i) * inv_rms))

then every block of 32 consecutive y values is quantised exactly as
`tilelang/act_quant_fp8.py` documents (amax of fp32(y) floored at 1e-4,
power-of-two scale 2^e from the bit-pattern ceiling of amax * fp32(1/448),
q = e4m3 saturating RNE of clamp(fp32(y) * 2^-e, -448, 448), E8M0 byte
e + 127). The quantiser reads the BF16-rounded y, so q and scale are
bit-identical to the CPU quantiser applied to this kernel's own y.

Only the order of the fp32 sum of squares differs from the CPU reference
(which sums in index order): y is within one BF16 ulp of it.

Layout
------
The row is viewed as n_blocks = D / 32 blocks of 32, so the innermost
dimension is static (16-byte vector loads need no divisibility proof) while
both M and D stay dynamic:

    x      : bf16  [M, n_blocks, 32]  (== [M, D])         16-byte aligned
    weight : bf16  [n_blocks, 32]     (== [D])            16-byte aligned
    y      : bf16  [M, n_blocks, 32]  (== [M, D])         16-byte aligned
    q      : e4m3  [M, n_blocks, 32]  (== [M, D])          8-byte aligned
    scale  : u8    [M, n_blocks]      (== [M, D/32])       any alignment
    eps    : fp32

Work mapping
------------
Persistent: n_ctas CTAs (the resident ones, at most M) of THREADS = 256
threads, CTA b taking rows b, b + n_ctas, ...; thread 0 brings each row of x
to shared memory with one bulk copy (STAGES = 3 rows in flight a CTA, one
mbarrier a stage), every thread reads its elements from there once and keeps
them in registers across the reduction, and the stage goes back to thread 0
after a proxy fence and a CTA barrier. Block b of the row is owned by the
4 consecutive lanes 4*(b % 64) + 0..3, each holding 8 consecutive elements
(one 16-byte load of x and of the weight, one 16-byte store of y, one
8-byte store of q), in register slot b // 64. So a CTA covers up to
D_MAX / 32 = 256 blocks in PASSES = 4 passes; blocks at or past n_blocks
are masked (loads yield 0, stores are skipped).

Reduction order (batch invariance): each thread sums the squares of its 8
elements of a block in order, the 4 lanes of a block combine with two
xor-shuffles, each thread adds its 4 block sums in slot order, and the 64
lane-quads combine through the fixed tree of `tl::AllReduce` in
deepinfer_tl/compat.cuh (xor-shuffles inside each warp, then the 8 warp
sums added in warp order). The tree depends on nothing but THREADS: a row
reduces the same way at every M, and masked blocks add exact zeros. (On
sm_100a TileLang pairs the in-thread additions into fp32x2 adds; the order
is still fixed per arch.)

Registers: __launch_bounds__(256, 4) caps the kernel at 64 registers
without spills (x and the weight stay BF16, 16 registers each; the weight is
re-read from L2 for each row: kept in registers across rows it spilled). The
one-CTA-a-row kernel before it measured 138 us at 16384 x 5120 (72 % of the
copy ceiling), bound by the latency of its one row in flight a CTA.

Launch: grid = (n_ctas, 1, 1), block = (256, 1, 1), dynamic shared memory
50,208 bytes (stage barriers, three stages of 8192 BF16, the cross-warp
reduction workspace of one fp32 per thread).
"""

import tilelang.language as T

from act_quant_fp8 import e8m0_scales

# Entry point of the generated CUDA is f"{PRIM_FUNC_NAME}_kernel".
PRIM_FUNC_NAME = "deepinfer_rms_norm_act_quant_fp8"

BLOCK = 32              # quantisation block along D
LANES_PER_BLOCK = 4     # lanes sharing one 32-block
VEC = BLOCK // LANES_PER_BLOCK  # 8 bf16 = 16 bytes per lane and pass
THREADS = 256
PASSES = 4              # register slots (blocks) per lane-quad
MAX_BLOCKS = THREADS // LANES_PER_BLOCK * PASSES  # 256
D_MAX = MAX_BLOCKS * BLOCK  # 8192
WORKSPACE_BYTES = THREADS * 4  # fp32 per thread for the cross-warp reduction
MIN_CTAS_PER_SM = 4     # register cap of 64 per thread
STAGES = 3              # rows of x staged in shared memory (bulk copies)


def rms_norm_act_quant_fp8(threads: int = THREADS, passes: int = PASSES, stages: int = STAGES):
    """Build the TileLang PrimFunc. `threads` must be a multiple of 32."""
    assert threads % 32 == 0
    blocks_per_pass = threads // LANES_PER_BLOCK
    max_blocks = blocks_per_pass * passes

    n_rows = T.dynamic("n_rows")
    n_blocks = T.dynamic("n_blocks")  # D / 32

    @T.prim_func
    def deepinfer_rms_norm_act_quant_fp8(
        x: T.Tensor((n_rows, n_blocks, BLOCK), T.bfloat16),
        weight: T.Tensor((n_blocks, BLOCK), T.bfloat16),
        y: T.Tensor((n_rows, n_blocks, BLOCK), T.bfloat16),
        q: T.Tensor((n_rows, n_blocks, BLOCK), T.float8_e4m3fn),
        scale: T.Tensor((n_rows, n_blocks), T.uint8),
        eps: T.float32,
        n_ctas: T.int32,  # the grid, at most n_rows
    ):
        with T.Kernel(n_ctas, threads=threads) as bx:
            # __launch_bounds__(256, 4): at most 64 registers (no spills).
            T.annotate_min_blocks_per_sm(MIN_CTAS_PER_SM)
            stage = T.alloc_shared((stages, max_blocks, BLOCK), T.bfloat16)
            bars = T.alloc_shared((stages,), T.uint64)
            # x and the weight stay BF16 in registers (half the registers of
            # fp32; the promotion is exact and redone at each use).
            xb = T.alloc_fragment((max_blocks, BLOCK), T.bfloat16)
            wb = T.alloc_fragment((max_blocks, BLOCK), T.bfloat16)
            sq = T.alloc_fragment((max_blocks, BLOCK), T.float32)
            yb = T.alloc_fragment((max_blocks, BLOCK), T.bfloat16)
            yf = T.alloc_fragment((max_blocks, BLOCK), T.float32)
            ya = T.alloc_fragment((max_blocks, BLOCK), T.float32)
            qf = T.alloc_fragment((max_blocks, BLOCK), T.float8_e4m3fn)
            block_ss = T.alloc_fragment((max_blocks,), T.float32)
            row_ss = T.alloc_fragment((1,), T.float32)
            amax = T.alloc_fragment((max_blocks,), T.float32)
            inv = T.alloc_fragment((max_blocks,), T.float32)
            sbyte = T.alloc_fragment((max_blocks,), T.uint8)

            # Block b of the row lives on lanes 4*(b % blocks_per_pass) + 0..3,
            # lane j//8 holding elements 8*(j//8) .. +7, register slot b // blocks_per_pass.
            lane_layout = T.Fragment(
                (max_blocks, BLOCK),
                forward_thread_fn=lambda b, j: (b % blocks_per_pass) * LANES_PER_BLOCK + j // VEC,
                forward_index_fn=lambda b, j: (b // blocks_per_pass) * VEC + j % VEC,
            )
            T.annotate_layout({t: lane_layout for t in (xb, wb, sq, yb, yf, ya, qf)})

            tx = T.get_thread_binding()
            iters = T.ceildiv(n_rows - bx, n_ctas)
            row_bytes = T.cast(n_blocks * (BLOCK * 2), T.uint32)
            # Thread 0 owns the stage barriers (one arrival a phase, with the
            # row's bytes) and issues every bulk copy of a row of x.
            if tx == 0:
                for st in T.serial(stages):
                    T.call_extern("handle", "deepinfer::sm90::mbar_init", T.address_of(bars[st]), 1)
                T.call_extern("handle", "deepinfer::sm90::fence_barrier_init")
                for st in T.serial(stages):
                    if st < iters:
                        T.call_extern("handle", "deepinfer::sm90::mbar_arrive_expect_tx", T.address_of(bars[st]), row_bytes)
                        T.call_extern("handle", "deepinfer::sm90::bulk_load", T.address_of(stage[st, 0, 0]),
                                      T.address_of(x[bx + st * n_ctas, 0, 0]), row_bytes, T.address_of(bars[st]))
            T.sync_threads()  # the barriers are set up

            for it in T.serial(iters):
                st = it % stages
                row = bx + it * n_ctas
                T.call_extern("handle", "deepinfer::sm90::mbar_wait", T.address_of(bars[st]),
                              T.cast((it // stages) % 2, T.uint32))
                # Blocks past the row's end are zeros (they add nothing to the sum).
                for b, j in T.Parallel(max_blocks, BLOCK):
                    xb[b, j] = T.if_then_else(b < n_blocks, stage[st, T.min(b, n_blocks - 1), j], T.bfloat16(0))
                # Every thread's reads of the stage, then its next bulk copy.
                T.call_extern("handle", "deepinfer::sm90::fence_proxy_async_smem")
                T.sync_threads()
                if tx == 0 and it + stages < iters:
                    T.call_extern("handle", "deepinfer::sm90::mbar_arrive_expect_tx", T.address_of(bars[st]), row_bytes)
                    T.call_extern("handle", "deepinfer::sm90::bulk_load", T.address_of(stage[st, 0, 0]),
                                  T.address_of(x[row + stages * n_ctas, 0, 0]), row_bytes, T.address_of(bars[st]))

                T.copy(weight[0:max_blocks, 0:BLOCK], wb)  # from L2, a row at a time
                for b, j in T.Parallel(max_blocks, BLOCK):
                    sq[b, j] = T.cast(xb[b, j], T.float32) * T.cast(xb[b, j], T.float32)
                T.reduce_sum(sq, block_ss, dim=1)  # 4-lane xor-shuffle sum per block
                T.reduce_sum(block_ss, row_ss, dim=0)  # whole-CTA fixed tree
                inv_rms = T.float32(1.0) / T.sqrt(row_ss[0] / T.cast(n_blocks * BLOCK, T.float32) + eps)
                for b, j in T.Parallel(max_blocks, BLOCK):
                    yb[b, j] = T.cast(
                        T.cast(wb[b, j], T.float32) * (T.cast(xb[b, j], T.float32) * inv_rms), T.bfloat16
                    )
                # The quantiser works on the BF16-rounded y, promoted back to fp32.
                for b, j in T.Parallel(max_blocks, BLOCK):
                    yf[b, j] = T.cast(yb[b, j], T.float32)
                for b, j in T.Parallel(max_blocks, BLOCK):
                    ya[b, j] = T.abs(yf[b, j])
                T.reduce_max(ya, amax, dim=1)  # 4-lane xor-shuffle max (NaN ignored, as fmaxf)
                e8m0_scales(amax, inv, sbyte)
                for b, j in T.Parallel(max_blocks, BLOCK):
                    # e4m3fn casts lower to cvt.rn.satfinite: RNE, saturating at +-448
                    # (the quantiser's clamp), NaN -> 0x7F.
                    qf[b, j] = yf[b, j] * inv[b]

                T.copy(yb, y[row, 0:max_blocks, 0:BLOCK])
                T.copy(qf, q[row, 0:max_blocks, 0:BLOCK])
                T.copy(sbyte, scale[row, 0:max_blocks])

    return deepinfer_rms_norm_act_quant_fp8


def launch_info() -> dict:
    """Launch geometry of the default build, for generate.py's header."""
    smem = 32 + STAGES * MAX_BLOCKS * BLOCK * 2 + WORKSPACE_BYTES
    return {
        "grid": "(n_ctas, 1, 1): persistent, n_ctas <= n_rows, CTA b takes rows b, b + n_ctas, ...",
        "block": "(%d, 1, 1)" % THREADS,
        "dynamic_smem": "%d bytes (stage barriers, %d staged rows of x, cross-warp reduction workspace)"
        % (smem, STAGES),
        "dynamic_smem_bytes": smem,
        "alignment": "x, weight, y 16 B, q 8 B, scale 1 B; n_blocks = D/32, 1 <= n_blocks <= %d" % MAX_BLOCKS,
    }
