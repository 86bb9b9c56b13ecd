"""Torch peers for the RoPE benchmark (benches/rope_gpu.rs), run on the GPU
machine in the same bundle run as our kernel: interleaved RoPE and its
inverse on the last 64 dims of every head of BF16 [T, 64, 512], written as
torch ops (index the rope slice, rotate it, cat it back behind the
pass-through dims), in two forms: a complex multiply (view_as_complex by
polar(1, angle), conjugated for the inverse) and explicit cos/sin
arithmetic in fp32. Both include the per-call angle and cos/sin work from the
fp32 frequency table (theta 160000 with YaRN, as the Rust bench), like our
kernel. Timed like benches/rope_gpu.rs (CUDA events, median of batches,
inputs rotated over >= 512 MiB). Prints JSON on stdout; records carry
op/rows/dim/name/us with rows = T and dim = 64 * 512."""
import math

import torch

from slice_torch import ROTATE, emit, time_us

HEADS, HEAD_DIM, ROPE_DIM = 64, 512, 64


def rope_freqs(theta=160000.0, d=ROPE_DIM, factor=16.0, orig=65536, beta_fast=32.0, beta_slow=1.0):
    """The spec's fp32 table (v41-flash.md §3.2): 1/theta^(2i/d), then the YaRN blend."""
    i = torch.arange(d // 2, dtype=torch.float32)
    e = (2 * i) / torch.tensor(float(d), dtype=torch.float32)
    freq = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float64), e.double()).float()

    def corr(beta):
        return d * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), d - 1)
    ramp = ((i - low) / max(float(high - low), 0.001)).clamp(0, 1)
    smooth = 1 - ramp
    return freq / factor * (1 - smooth) + freq * smooth


def rope_complex(x, pos, freq, inverse):
    """x [T, H, hd] BF16: rotate the last ROPE_DIM dims as complex pairs."""
    t, h, hd = x.shape
    angle = pos.float()[:, None] * freq[None, :]  # [T, 32], fp32
    cis = torch.polar(torch.ones_like(angle), angle)
    if inverse:
        cis = cis.conj()
    r = torch.view_as_complex(x[..., hd - ROPE_DIM:].float().reshape(t, h, ROPE_DIM // 2, 2))
    r = torch.view_as_real(r * cis[:, None, :]).reshape(t, h, ROPE_DIM).bfloat16()
    return torch.cat([x[..., : hd - ROPE_DIM], r], dim=-1)


def rope_cos_sin(x, pos, freq, inverse):
    """The same with explicit fp32 cos/sin arithmetic (the spec's formula)."""
    t, h, hd = x.shape
    angle = pos.float()[:, None] * freq[None, :]
    c, s = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    if inverse:
        s = -s
    r = x[..., hd - ROPE_DIM:].float().reshape(t, h, ROPE_DIM // 2, 2)
    x0, x1 = r[..., 0], r[..., 1]
    y = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).reshape(t, h, ROPE_DIM).bfloat16()
    return torch.cat([x[..., : hd - ROPE_DIM], y], dim=-1)


def main():
    dev = torch.device("cuda")
    freq = rope_freqs().to(dev)
    recs = []
    dim = HEADS * HEAD_DIM
    for tokens in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (tokens * dim * 2))))
        xs = [torch.randn(tokens, HEADS, HEAD_DIM, device=dev).bfloat16() for _ in range(copies)]
        ps = [torch.randint(0, 1 << 20, (tokens,), device=dev, dtype=torch.int64) for _ in range(copies)]
        for op, inverse in [("inverse_rope", True), ("rope", False)]:
            for name, fn in [("torch_complex", rope_complex), ("torch_cos_sin", rope_cos_sin)]:
                us = time_us(lambda i: fn(xs[i % copies], ps[i % copies], freq, inverse))
                recs.append({"op": op, "rows": tokens, "dim": dim, "name": name, "us": us})
        del xs, ps
    emit(recs, bf16_ceiling=False)


if __name__ == "__main__":
    main()
