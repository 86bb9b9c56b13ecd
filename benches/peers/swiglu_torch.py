"""Torch peers for the SwiGLU benchmark, run on the GPU machine in the same
bundle run as our kernels: the clamped SwiGLU times the routing weight, cast
to BF16 and FP8 1x32-quantised, written as a sequence of torch ops (clamp,
silu, mul, cast, then the quantiser ops of slice_torch.py) -- the peer of the
fused TileLang kernel. Timed like benches/swiglu_gpu.rs (CUDA events, median
of batches, inputs rotated over >= 512 MiB). Also measures the BF16 GEMM
ceiling. Prints JSON on stdout (the schema of slice_torch.py)."""

import torch
import torch.nn.functional as F

# The bundle puts every peer script in one folder, which is sys.path[0] here.
from slice_torch import ROTATE, act_quant_torch, time_us, emit

INTER = 2304
LIMIT = 10.0


def swiglu_act_quant_torch(g, u, w, limit=LIMIT):
    """h = BF16(SiLU(min(g, L)) * clamp(u, -L, L) * w) in fp32, then the quantiser."""
    gf = g.float().clamp(max=limit)
    uf = u.float().clamp(-limit, limit)
    h = (F.silu(gf) * uf * w.unsqueeze(-1)).bfloat16()
    return act_quant_torch(h)


def main():
    dev = torch.device("cuda")
    recs = []
    for rows in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (rows * INTER * 4 + rows * 4))))
        xs = [
            (
                (torch.randn(rows, INTER, device=dev) * 6).bfloat16(),
                (torch.randn(rows, INTER, device=dev) * 6).bfloat16(),
                torch.rand(rows, device=dev) * 1.5 + 0.25,
            )
            for _ in range(copies)
        ]
        recs.append({"op": "swiglu_act_quant_fp8", "rows": rows, "dim": INTER, "name": "torch_ops",
                     "us": time_us(lambda i: swiglu_act_quant_torch(*xs[i % copies]))})
        del xs
    emit(recs)


if __name__ == "__main__":
    main()
