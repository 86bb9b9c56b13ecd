"""Torch peers for the sparse MQA benchmark (benches/attention_gpu.rs), run in
the same bundle run: the gather + bmm + softmax path over BF16 copies of the
row pools (rows gathered by index per call, logits in fp32 with the sink as an
extra softmax column, P in BF16 times the gathered rows), on the bench's
shapes: decode B in {1, 16, 64, 128, 256} x s_q in {1, 2, 4} with 128 window +
512 compressed rows per query over pools far larger than L2, and prefill at
4096 tokens (not 32768: its gathered rows alone are 21 GB). Timed like the
Rust harness (CUDA events, median of batches, index sets rotated).

FlashMLA SM90 (peers/flashmla-sm90, its own 584-byte layout and its own L2
flush) runs before this script in the same device call; when
$FLASHMLA_PEER_JSON names its flashmla_peer.json files (space-separated), their
decode and prefill records are re-emitted here as peer `flashmla_sm90` at the
matching shapes. Prints the peers' JSON on stdout. DEEPINFER_BENCH_QUICK=1
runs the bench's subset."""
import json
import os

import torch

from slice_torch import ROTATE, emit, time_us

H, D, KW, KC = 64, 512, 128, 512
SCALE = D ** -0.5


def attend(q, kv_w, kv_c, wi, ci, sink):
    rows = torch.cat([kv_w[wi], kv_c[ci]], dim=1)  # [T, 640, 512] bf16
    s = torch.bmm(q, rows.transpose(1, 2)).float() * SCALE  # [T, 64, 640]
    s = torch.cat([s, sink.view(1, H, 1).expand(s.shape[0], H, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., : KW + KC].bfloat16()
    return torch.bmm(p, rows)


def flashmla_records():
    recs = []
    for path in os.environ.get("FLASHMLA_PEER_JSON", "").split():
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for r in data.get("records", []):
            sh = r.get("shape", {})
            if "us" not in r or not r.get("correct", False):
                continue
            if r.get("op") == "sparse_decode_fp8_model1" and sh.get("topk") == KW + KC:
                shape = {"batch": sh["b"], "s_q": sh["s_q"], "rows": KW + KC}
                recs.append({"op": "sparse_mqa_decode", "shape": shape, "name": "flashmla_sm90", "us": r["us"]})
            elif r.get("op") == "sparse_prefill_bf16" and sh.get("topk") == KW + KC:
                shape = {"tokens": sh["s_q"], "rows": KW + KC}
                recs.append({"op": "sparse_mqa_prefill", "shape": shape, "name": "flashmla_sm90", "us": r["us"]})
    return recs


def main():
    quick = os.environ.get("DEEPINFER_BENCH_QUICK") == "1"
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    sink = (torch.arange(H, device=dev) % 7).float() * 0.5 - 1.5
    recs = flashmla_records()

    nw, nc = 512 << 10, 2 << 20
    kv_w = (torch.randn(nw, D, device=dev, generator=g) * 0.5).bfloat16()
    kv_c = (torch.randn(nc, D, device=dev, generator=g) * 0.5).bfloat16()
    batches = [1, 64] if quick else [1, 16, 64, 128, 256]
    sqs = [1, 2] if quick else [1, 2, 4]
    for b in batches:
        for sq in sqs:
            t = b * sq
            copies = max(2, min(32, -(-ROTATE // (t * (KW + KC) * D * 2))))
            sets = []
            for _ in range(copies):
                base = torch.randint(0, nw // KW, (b, 1, 1), device=dev, generator=g) * KW
                wi = (base + torch.arange(KW, device=dev).view(1, 1, KW)).expand(b, sq, KW).reshape(t, KW)
                ci = torch.randint(0, nc, (t, KC), device=dev, generator=g)
                q = torch.randn(t, H, D, device=dev, generator=g).bfloat16()
                sets.append((q, wi, ci))
            us = time_us(lambda i: attend(sets[i % copies][0], kv_w, kv_c, sets[i % copies][1],
                                          sets[i % copies][2], sink))
            recs.append({"op": "sparse_mqa_decode", "shape": {"batch": b, "s_q": sq, "rows": KW + KC},
                         "name": "torch_gather_bmm_softmax", "us": us})
            del sets
    del kv_w, kv_c
    torch.cuda.empty_cache()

    tokens = 4096
    kv_w = (torch.randn(tokens, D, device=dev, generator=g) * 0.5).bfloat16()
    kv_c = (torch.randn(tokens // 2, D, device=dev, generator=g) * 0.5).bfloat16()
    p = torch.arange(tokens, device=dev).view(tokens, 1)
    wi = (p + tokens + 1 - KW + torch.arange(KW, device=dev).view(1, KW)) % tokens
    ci = torch.randint(0, tokens // 2, (tokens, KC), device=dev, generator=g)
    q = torch.randn(tokens, H, D, device=dev, generator=g).bfloat16()
    us = time_us(lambda i: attend(q, kv_w, kv_c, wi, ci, sink))
    recs.append({"op": "sparse_mqa_prefill", "shape": {"tokens": tokens, "rows": KW + KC},
                 "name": "torch_gather_bmm_softmax", "us": us})
    emit(recs)


if __name__ == "__main__":
    main()
