"""Torch peers for the MoE routing benchmark, run on the GPU machine in the same
bundle run as our kernel: sqrt-softplus scores, top-6 of s + bias, gather of the
unbiased scores, renormalise and scale by 1.5, written as a sequence of torch ops
(softplus, sqrt, add, topk, gather, sum, div, mul) -- the peer of the TileLang
routing kernel, over V4.1's 384 experts. Timed like benches/moe_route_gpu.rs (CUDA
events, median of batches, inputs rotated over >= 512 MiB). Also measures the BF16
GEMM ceiling. Prints JSON on stdout (the schema of slice_torch.py)."""

import torch
import torch.nn.functional as F

# The bundle puts every peer script in one folder, which is sys.path[0] here.
from slice_torch import ROTATE, time_us, emit

EXPERTS = 384
TOP_K = 6
ROUTE_SCALE = 1.5


def moe_route_torch(z, bias, k=TOP_K, route_scale=ROUTE_SCALE):
    """(ids, weights) in rank order: the reference's sequence of ops."""
    s = F.softplus(z).sqrt()
    ids = (s + bias).topk(k, dim=-1)[1]
    w = s.gather(1, ids)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * route_scale
    return ids, w


def main():
    dev = torch.device("cuda")
    bias = (torch.rand(EXPERTS, device=dev) - 0.5)
    recs = []
    for rows in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (rows * EXPERTS * 4))))
        xs = [torch.rand(rows, EXPERTS, device=dev) * 32 - 8 for _ in range(copies)]
        recs.append({"op": "moe_route", "rows": rows, "dim": EXPERTS, "name": "torch_ops",
                     "us": time_us(lambda i: moe_route_torch(xs[i % copies], bias))})
        del xs
    emit(recs)


if __name__ == "__main__":
    main()
