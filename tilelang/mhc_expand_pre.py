"""The single-pass mHC step (v41-flash.md §6.2) in TileLang: the expand of
sublayer i fused with pass 1 of sublayer i+1's front half, so the residual
streams are read once and written once between two sublayers.

Semantics
---------
Inputs: the streams S BF16 [T, 4, D] that entered sublayer i, its output F
BF16 [T, D], its post fp32 [T, 4] and comb fp32 [T, 16] (as `mhc.py` takes
them), sublayer i+1's hc_fn fp32 [24, 4·D] and the lagged pre fp32 [T, 4]
(sublayer i's pre). Per token:

    out = S'  = mhc.py's expand of (S, F, post, comb), bitwise
    u, part   = mhc_pre.py's pass 1 of (S', hc_fn, pre), bitwise

`mhc_split.py` (pass 2) then reads part as it reads pass 1's. The program is
`mhc_pre.build(fused=True)`: one body with pass 1, which adds the F loads
beside each step's stream loads and the expand before each step's staging
(S' replaces S in the registers, zeros outside the tensors), so its sums are
the same code as pass 1's and the pair of kernels is bitwise the two-kernel
path (expand, then pass 1).

Layout and work mapping: those of `mhc_pre.py`, plus

    f       : bf16 [T, n_vec, 8]      (== [T, D])      16-byte aligned
    post    : fp32 [T, 4]
    comb    : fp32 [T, 16]                              comb[t, 4*j + k]
    out     : bf16 [T, 4, n_vec, 8]   (== [T, 4, D])   16-byte aligned, distinct from streams

and a [64, 20] fp32 shared copy of the tile's post and comb (zeros past T),
filled before the first step. Each CTA writes out for its chunk's positions
of its tile's tokens, so the grid writes every element of out once.

Launch: grid = (ceil(n_vec / 16), ceil(T / 64), 1), block = (128, 1, 1),
42112 bytes of dynamic shared memory. T * 4 * D < 2^31.
"""

import mhc_pre

PRIM_FUNC_NAME = "deepinfer_mhc_expand_pre"


def mhc_expand_pre():
    """Build the TileLang PrimFunc."""
    return mhc_pre.build(fused=True)


def launch_info() -> dict:
    """Launch geometry, for generate.py's header."""
    return mhc_pre.launch_info(fused=True)
