"""Torch peers for the EP benchmark (benches/ep_gpu.rs), run on the GPU
machine in the same bundle run: dispatch as torch's row gather of the
tokens into expert order (index_select of BF16 rows by the sorted entry
list, then the FP8 1x32 quantiser of slice_torch.py), combine as the
weighted scatter back (index_add_ of every entry's BF16 row into fp32
token rows, plus the shared output, cast to BF16). One rank, hidden 5120,
384 experts, top-6; the shapes and the {mode, tokens, ranks} records of
the bench. Timed like the bench (CUDA events, median of batches). Prints
JSON on stdout (the schema of slice_torch.py)."""

import torch

from slice_torch import act_quant_torch, time_us, emit

D, EXPERTS, TOP_K = 5120, 384, 6


def main():
    dev = torch.device("cuda")
    recs = []
    shapes = [("normal", t) for t in (4096, 8192, 16384, 32768)] + \
             [("low_latency", t) for t in (1, 16, 64, 128, 256)]
    for mode, tokens in shapes:
        x = torch.randn(tokens, D, device=dev).bfloat16()
        ids = torch.rand(tokens, EXPERTS, device=dev).topk(TOP_K, dim=-1).indices.sort(dim=-1).values
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        token_of = order // TOP_K
        shape = {"mode": mode, "tokens": tokens, "ranks": 1}

        def dispatch(_):
            return act_quant_torch(x.index_select(0, token_of))

        recs.append({"op": "ep_dispatch", "shape": shape, "name": "torch_index_select_act_quant",
                     "us": time_us(dispatch)})
        expert_out = torch.randn(tokens * TOP_K, D, device=dev).bfloat16()
        shared = torch.randn(tokens, D, device=dev).bfloat16()

        def combine(_):
            acc = torch.zeros(tokens, D, device=dev, dtype=torch.float32)
            acc.index_add_(0, token_of, expert_out.float())
            return (acc + shared.float()).bfloat16()

        recs.append({"op": "ep_combine", "shape": shape, "name": "torch_index_add",
                     "us": time_us(combine)})
    emit(recs)


if __name__ == "__main__":
    main()
