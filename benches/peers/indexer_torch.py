"""Torch peers for the indexer benchmark (benches/indexer_gpu.rs), run in the
same bundle run: the index score written in torch (FP4 keys dequantised to
BF16 per call, einsum over heads, ReLU, weighted head sum in fp32) and, on the
same [batch, n] BF16 score shapes, torch.topk (k = 512) and a full torch.sort
(the baseline the top-k must beat by 5x); at 128K and 1M the candidate path
in torch (amax over blocks of 8 + topk 2048; where(mask, s, -inf) + topk 512
for reindex, the mask precomputed). Timed like the Rust harness (CUDA
events, median of batches, inputs rotated over >= 512 MiB where they fit).
Prints the peers' JSON on stdout. DEEPINFER_BENCH_QUICK=1 runs the subset."""
import os

import torch

from slice_torch import ROTATE, emit, time_us

HEADS, DIM, TOPK = 32, 128, 512
ROW_BYTES = DIM // 2 + DIM // 32
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def cases():
    quick = os.environ.get("DEEPINFER_BENCH_QUICK") == "1"
    ctx = [8192, 131072] if quick else [8192, 131072, 1 << 20]
    batches = [1] if quick else [1, 64]
    # The model's decode point (batch 256 at 128K tokens: 32K index keys a row).
    extra = [] if quick else [(256, 32768)]
    return [(b, n) for n in ctx for b in batches] + extra


def copies_for(nbytes):
    return 1 if nbytes >= ROTATE else max(2, min(256, -(-ROTATE // nbytes)))


def dequant(rows, lut):
    """[.., ROW_BYTES] uint8 index-key rows -> [.., DIM] bf16."""
    packed, scales = rows[..., : DIM // 2], rows[..., DIM // 2:]
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    s = torch.ldexp(torch.ones((), device=rows.device), scales.int() - 127)
    return (lut[nib] * s.repeat_interleave(32, dim=-1)).bfloat16()


def scores_torch(q, w, keys, lut):
    """q [b, h, DIM] bf16, w [b, h] bf16, keys [b, n, ROW_BYTES] uint8 -> [b, n] bf16."""
    k = dequant(keys, lut)
    dots = torch.einsum("bhd,bnd->bnh", q.float(), k.float()).bfloat16()
    t = (w.float()[:, None, :] * dots.float().relu()).bfloat16()
    return t.float().sum(-1).bfloat16()


def main():
    dev = torch.device("cuda")
    lut = torch.tensor(E2M1 + [-v for v in E2M1], device=dev)
    recs = []
    for batch, n in cases():
        kbytes = batch * n * ROW_BYTES
        copies = copies_for(kbytes)
        keys = []
        for _ in range(copies):
            k = torch.randint(0, 256, (batch, n, ROW_BYTES), dtype=torch.uint8, device=dev)
            k[..., DIM // 2:] = torch.randint(120, 130, (batch, n, DIM // 32), dtype=torch.uint8, device=dev)
            keys.append(k)
        q = torch.randn(batch, HEADS, DIM, device=dev).bfloat16()
        w = (torch.randn(batch, HEADS, device=dev) / 64).bfloat16()
        # The torch score materialises [b, n, DIM] BF16 keys; skip it where
        # that would not fit comfortably (1M x 64 = 17 GB per call).
        if batch * n <= (1 << 22):
            recs.append({"op": "index_scores", "rows": batch, "dim": n, "name": "torch_dequant_einsum",
                         "us": time_us(lambda i: scores_torch(q, w, keys[i % copies], lut))})
        del keys
        scopies = copies_for(batch * n * 2)
        scores = [torch.randn(batch, n, device=dev).bfloat16() for _ in range(scopies)]
        recs.append({"op": "index_topk", "rows": batch, "dim": n, "name": "torch.topk",
                     "us": time_us(lambda i: torch.topk(scores[i % scopies], TOPK, dim=-1))})
        recs.append({"op": "index_topk", "rows": batch, "dim": n, "name": "torch.sort",
                     "us": time_us(lambda i: torch.sort(scores[i % scopies], dim=-1, descending=True))})
        if n >= 131072:
            blocks = n // 8
            recs.append({"op": "index_candidates", "rows": batch, "dim": n, "name": "torch.amax+topk",
                         "us": time_us(lambda i: torch.topk(
                             scores[i % scopies].view(batch, blocks, 8).amax(-1), 2048, dim=-1))})
            mask = torch.rand(batch, n, device=dev) < 0.0625
            ninf = torch.tensor(float("-inf"), device=dev, dtype=torch.bfloat16)
            recs.append({"op": "index_mask_scores", "rows": batch, "dim": n, "name": "torch.where",
                         "us": time_us(lambda i: torch.where(mask, scores[i % scopies], ninf))})
            recs.append({"op": "index_reindex_topk", "rows": batch, "dim": n, "name": "torch.where+topk",
                         "us": time_us(lambda i: torch.topk(
                             torch.where(mask, scores[i % scopies], ninf), TOPK, dim=-1))})
            del mask
        del scores
    emit(recs, bf16_ceiling=False)


if __name__ == "__main__":
    main()
