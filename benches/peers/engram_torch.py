"""Torch peers for the Engram benchmark (benches/engram_gpu.rs), run on the
GPU machine in the same bundle run as our kernels: the n-gram hashes and
their rows as int64 torch ops, the lookup as an index_select of the uint8
table followed by the e4m3 x E8M0 dequantisation, and the gate and update
of v41-flash.md §8.4 as fp32 torch ops. Same table size (the 24 primes after
333,333), same shapes, timed like the bench (CUDA events, median of
batches, inputs rotated over >= 512 MiB). Prints JSON on stdout (the schema
of slice_torch.py)."""

import torch

# The bundle puts every peer script in one folder, which is sys.path[0] here.
from slice_torch import ROTATE, emit, time_us

D = 5120
HD = 256
COLS = 24
ROW_BYTES = HD + HD // 32
MULT = [76632096046245, 4839876093313, 35959672319349, 73987337458391]
VOCAB = 99092
EPS = 1e-20


def primes_after(n, count=COLS):
    out = []
    while len(out) < count:
        n += 1
        if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)):
            out.append(n)
    return out


PRIMES = primes_after(333333)


def rows_torch(ids, primes, offsets):
    """ids int64 [T, 4] (the ids at p, p-1, p-2, p-3: newest first) -> rows
    int64 [T, 24]: the rolling XOR of id * multiplier (cpu_backend::engram::
    ngram_hashes), orders 2..4, each modulo the 8 primes of its order, plus
    the running offset (table_rows)."""
    h = ids[:, 0] * MULT[0]
    cols = []
    for n in range(1, 4):
        h = h ^ (ids[:, n] * MULT[n])
        cols.append(h.unsqueeze(1).expand(-1, 8))
    h = torch.cat(cols, 1)
    return h % primes + offsets


def lookup_torch(table, rows):
    t = rows.shape[0]
    g = table.index_select(0, rows.view(-1))
    vals = g[:, :HD].contiguous().view(torch.float8_e4m3fn).float().view(-1, HD // 32, 32)
    scales = torch.exp2(g[:, HD:].float() - 127.0).view(-1, HD // 32, 1)
    return (vals * scales).bfloat16().view(t, COLS * HD)


def gate_update_torch(s, kv, qw, kw):
    sf, kf = s.float(), kv.float()
    keys, value = kf[:, :4], kf[:, 4:5]
    w = qw.float() * kw.float()
    dot = (sf * w * keys).sum(-1)
    dot = dot * torch.rsqrt(sf.square().mean(-1) + EPS) * torch.rsqrt(keys.square().mean(-1) + EPS) * D ** -0.5
    gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp_min(1e-6)))
    return (sf + gate.unsqueeze(-1) * value).bfloat16()


def main():
    dev = torch.device("cuda")
    recs = []
    total = sum(PRIMES)
    table = torch.randint(0, 126, (total, ROW_BYTES), dtype=torch.uint8, device=dev)
    table[:, HD:] = torch.randint(119, 135, (total, ROW_BYTES - HD), dtype=torch.uint8, device=dev)
    primes = torch.tensor(PRIMES, dtype=torch.int64, device=dev)
    offsets = torch.cumsum(torch.tensor([0] + PRIMES[:-1], dtype=torch.int64, device=dev), 0)
    qw = torch.randn(4, D, device=dev).bfloat16()
    kw = torch.randn(4, D, device=dev).bfloat16()
    for t in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (t * (2 * 9 * D + COLS * ROW_BYTES)))))
        ids = [torch.randint(0, VOCAB, (t, 4), dtype=torch.int64, device=dev) for _ in range(copies)]
        rows = [rows_torch(i, primes, offsets) for i in ids]
        recs.append({"op": "engram_rows", "rows": t, "dim": COLS, "name": "torch_ops",
                     "us": time_us(lambda i: rows_torch(ids[i % copies], primes, offsets))})
        recs.append({"op": "engram_lookup", "rows": t, "dim": COLS * HD, "name": "torch_index_select",
                     "us": time_us(lambda i: lookup_torch(table, rows[i % copies]))})
        s = [torch.randn(t, 4, D, device=dev).bfloat16() for _ in range(copies)]
        kv = [torch.randn(t, 5, D, device=dev).bfloat16() for _ in range(copies)]
        recs.append({"op": "engram_gate_update", "rows": t, "dim": D, "name": "torch_ops",
                     "us": time_us(lambda i: gate_update_torch(s[i % copies], kv[i % copies], qw, kw))})
        del ids, rows, s, kv
    emit(recs, bf16_ceiling=False)


if __name__ == "__main__":
    main()
