"""Torch peers for the GEMM benchmark (benches/gemm_gpu.rs), run on the GPU
machine in the same bundle run as our kernels, on the same shapes:

- every dense V4.1 FP8 projection at every M: torch._scaled_mm FP8 e4m3 with
  per-tensor scales, the same with 1x128 (activation) / 128x128 (weight)
  block scales (cuBLASLt's closest format to our 32-blocks on Hopper), and
  BF16 matmul; wo_a as 8 calls of 1024x4096 per iteration, like ours;
- the MoE shapes (384 experts; w1 2304x5120, w2 5120x2304): torch._grouped_mm
  in BF16 (3D x 3D for the masked layout, 2D x 3D with offsets for the
  contiguous one) and torch._scaled_grouped_mm FP8 with row-wise scales.

A call this torch or GPU does not take is recorded with its error instead of
a time. Timing is slice_torch's time_us (CUDA events, median of batches);
inputs are rotated over >= 512 MiB like the Rust harness. Records are
{"op", "shape", "name", "us" | "error"}, with op and shape exactly as
gemm_gpu.rs matches them. DEEPINFER_BENCH_QUICK=1 runs the bench's small
subset. Prints JSON on stdout (emit(), with the BF16 ceiling)."""
import os
import sys

import torch

from slice_torch import ROTATE, emit, time_us

PROJECTIONS = [
    ("wq_a", 1280, 5120, 1),
    ("wq_b", 32768, 1280, 1),
    ("wkv", 512, 5120, 1),
    ("wo_a", 1024, 4096, 8),
    ("wo_b", 5120, 8192, 1),
    ("shared_w13", 4608, 5120, 1),
    ("shared_w2", 5120, 2304, 1),
    ("indexer_wq_b", 4096, 1280, 1),
]
MS = [1, 8, 32, 64, 128, 512, 4096, 16384]
EXPERTS = 384
MOE_SHAPES = [("w13", 4608, 5120), ("w2", 5120, 2304)]
MASKED_COUNTS = [1, 4, 16, 64]
CONTIGUOUS = [(32, 128), (32, 512), (16, 2048), (8, 4096), (8, 8192)]
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def copies(nbytes):
    return max(2, min(256, -(-ROTATE // max(nbytes, 1))))


def measure(recs, op, shape, name, fn):
    """Times fn(i) into a record; an exception becomes the record's error."""
    try:
        fn(0)
        torch.cuda.synchronize()
        rec = {"us": time_us(fn)}
    except Exception as e:  # noqa: BLE001 -- any refusal is a result here
        print(f"{op} {shape} {name}: {e}", file=sys.stderr)
        torch.cuda.synchronize()
        rec = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    recs.append({"op": op, "shape": shape, "name": name, **rec})


def dense(recs, name, n, k, g, ms):
    dev = "cuda"
    wc = copies(g * n * k)
    w8 = [[torch.randn(n, k, device=dev, dtype=BF16).to(FP8) for _ in range(g)] for _ in range(wc)]
    wbc = copies(2 * g * n * k)
    w16 = [[torch.randn(n, k, device=dev, dtype=BF16) * 0.05 for _ in range(g)] for _ in range(wbc)]
    one = torch.ones((), device=dev)
    # 128x128 weight scales, laid out as _scaled_mm checks them on b.t() = w.
    sb_blk = torch.ones(n // 128, k // 128, device=dev).t()
    for m in ms:
        shape = {"m": m, "n": n, "k": k, "groups": g}
        ac = copies(g * m * k)
        a8 = [[torch.randn(m, k, device=dev, dtype=BF16).to(FP8) for _ in range(g)] for _ in range(ac)]
        abc = copies(2 * g * m * k)
        a16 = [[torch.randn(m, k, device=dev, dtype=BF16) for _ in range(g)] for _ in range(abc)]
        # 1x128 activation scales: shape [m, k/128], stride (1, m).
        sa_blk = torch.ones(k // 128, m, device=dev).t()

        def fp8_tensorwise(i):
            for j in range(g):
                torch._scaled_mm(a8[i % ac][j], w8[i % wc][j].t(), one, one, out_dtype=BF16)

        def fp8_blockwise(i):
            for j in range(g):
                torch._scaled_mm(a8[i % ac][j], w8[i % wc][j].t(), sa_blk, sb_blk, out_dtype=BF16)

        def bf16(i):
            for j in range(g):
                torch.matmul(a16[i % abc][j], w16[i % wbc][j].t())

        measure(recs, name, shape, "torch_scaled_mm_fp8_tensorwise", fp8_tensorwise)
        measure(recs, name, shape, "torch_scaled_mm_fp8_block_1x128_128x128", fp8_blockwise)
        measure(recs, name, shape, "torch_bf16_matmul", bf16)
        del a8, a16
    del w8, w16


def moe_masked(recs, counts, shapes, e=EXPERTS):
    dev = "cuda"
    for name, n, k in shapes:
        # A whole layer's experts take one copy; an EP rank's few rotate
        # through copies so they are not L2-hot (as the bench's rows).
        wc = 1 if e >= EXPERTS else copies(2 * e * n * k)
        w16 = [torch.randn(e, n, k, device=dev, dtype=BF16) * 0.05 for _ in range(wc)]
        w8 = [x.to(FP8) for x in w16]
        sb = torch.ones(e, n, device=dev)
        for c in counts:
            shape = {"experts": e, "tokens_per_expert": c, "n": n, "k": k}
            ac = copies(2 * e * c * k)
            a16 = [torch.randn(e, c, k, device=dev, dtype=BF16) for _ in range(ac)]
            a8 = [x.to(FP8) for x in a16]
            sa = torch.ones(e, c, device=dev)
            measure(recs, f"moe_masked/{name}", shape, "torch_grouped_mm_bf16",
                    lambda i: torch._grouped_mm(a16[i % ac], w16[i % wc].transpose(-2, -1)))
            measure(recs, f"moe_masked/{name}", shape, "torch_scaled_grouped_mm_fp8_rowwise",
                    lambda i: torch._scaled_grouped_mm(a8[i % ac], w8[i % wc].transpose(-2, -1), sa, sb,
                                                       out_dtype=BF16))
            del a16, a8
        del w16, w8
        torch.cuda.empty_cache()


def moe_contiguous(recs, configs, shapes):
    dev = "cuda"
    for name, n, k in shapes:
        for e, per in configs:
            shape = {"experts": e, "tokens_per_expert": per, "n": n, "k": k}
            t = e * per
            wc = copies(2 * e * n * k)
            w16 = [torch.randn(e, n, k, device=dev, dtype=BF16) * 0.05 for _ in range(wc)]
            w8 = [x.to(FP8) for x in w16]
            ac = copies(2 * t * k)
            a16 = [torch.randn(t, k, device=dev, dtype=BF16) for _ in range(ac)]
            a8 = [x.to(FP8) for x in a16]
            offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * per
            sa = torch.ones(t, device=dev)
            sb = torch.ones(e, n, device=dev)
            measure(recs, f"moe_contiguous/{name}", shape, "torch_grouped_mm_bf16",
                    lambda i: torch._grouped_mm(a16[i % ac], w16[i % wc].transpose(-2, -1), offs=offs))
            measure(recs, f"moe_contiguous/{name}", shape, "torch_scaled_grouped_mm_fp8_rowwise",
                    lambda i: torch._scaled_grouped_mm(a8[i % ac], w8[i % wc].transpose(-2, -1), sa, sb,
                                                       offs=offs, out_dtype=BF16))
            del w16, w8, a16, a8
            torch.cuda.empty_cache()


def main():
    recs = []
    if os.environ.get("DEEPINFER_BENCH_MOE") == "1":
        # The bench's DEEPINFER_BENCH_MOE subset: wq_a and wo_b at M 4096,
        # masked decode at 1, 4, 16 tokens, two contiguous configurations.
        for name, n, k, g in PROJECTIONS:
            if name in ("wq_a", "wo_b"):
                dense(recs, name, n, k, g, [4096])
        moe_masked(recs, MASKED_COUNTS[:3], MOE_SHAPES)
        moe_contiguous(recs, [(16, 2048), (8, 4096)], MOE_SHAPES)
    elif os.environ.get("DEEPINFER_BENCH_MOE") == "rank":
        # One EP-64 rank's decode layer: 6 experts of 1 or 8 tokens, both
        # layouts, then 1-3 experts of 1 token (the bench's rank rows).
        e = EXPERTS // 64
        moe_masked(recs, [1, 8], MOE_SHAPES, e)
        moe_contiguous(recs, [(e, 1), (e, 8)], MOE_SHAPES)
        for fewer in (1, 2, 3):
            moe_masked(recs, [1], MOE_SHAPES, fewer)
    elif os.environ.get("DEEPINFER_BENCH_QUICK") == "1":
        for name, n, k, g in PROJECTIONS:
            if name in ("wq_a", "wo_b"):
                dense(recs, name, n, k, g, [1, 64, 4096])
        moe_masked(recs, [4], MOE_SHAPES[:1])
        moe_contiguous(recs, [(8, 4096)], MOE_SHAPES[:1])
    else:
        for name, n, k, g in PROJECTIONS:
            dense(recs, name, n, k, g, MS)
        moe_masked(recs, MASKED_COUNTS, MOE_SHAPES)
        moe_contiguous(recs, CONTIGUOUS, MOE_SHAPES)
    emit(recs)


if __name__ == "__main__":
    main()
