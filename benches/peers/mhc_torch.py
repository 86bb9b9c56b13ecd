"""Torch peers for the mHC benchmark, run on the GPU machine in the same
bundle run as our kernels (D = 5120): mhc_pre as torch ops (the collapse with
the lagged pre, the 24 mixes as an fp32 matmul scaled by the inverse RMS, the
split with sigmoid, and the 20-iteration Sinkhorn on [T, 4, 4]) and
mhc_expand (post * F + comb^T-weighted stream mix, cast to BF16), and the
two in a row (mhc_expand_pre) -- the peers of the TileLang kernels. Timed like benches/mhc_gpu.rs (CUDA events, median
of batches, inputs rotated over >= 512 MiB). Prints JSON on stdout (the
schema of slice_torch.py)."""

import torch

# The bundle puts every peer script in one folder, which is sys.path[0] here.
from slice_torch import ROTATE, emit, time_us

D = 5120
EPS = 1e-20
HC_EPS = 1e-6
ITERS = 20


def mhc_pre_torch(s, hc_fn, base, scale, lag):
    """s bf16 [T, 4, D], hc_fn f32 [24, 4D], lag f32 [T, 4] -> u, mixes, pre, post, comb."""
    t = s.shape[0]
    sf = s.float()
    u = (lag.unsqueeze(-1) * sf).sum(1).bfloat16()
    flat = sf.reshape(t, 4 * D)
    inv_rms = torch.rsqrt(flat.square().mean(-1, keepdim=True) + EPS)
    m = (flat @ hc_fn.t()) * inv_rms
    pre = torch.sigmoid(m[:, :4] * scale[0] + base[:4]) + HC_EPS
    post = 2 * torch.sigmoid(m[:, 4:8] * scale[1] + base[4:8])
    c = (m[:, 8:] * scale[2] + base[8:]).view(t, 4, 4)
    c = torch.softmax(c, -1) + HC_EPS
    c = c / (c.sum(-2, keepdim=True) + HC_EPS)
    for _ in range(ITERS - 1):
        c = c / (c.sum(-1, keepdim=True) + HC_EPS)
        c = c / (c.sum(-2, keepdim=True) + HC_EPS)
    return u, m, pre, post, c.view(t, 16)


def mhc_expand_torch(s, f, post, comb):
    """S'_k = BF16(post_k * F + sum_j comb[j][k] * S_j)."""
    t = s.shape[0]
    mix = torch.einsum("tjk,tjd->tkd", comb.view(t, 4, 4), s.float())
    return (post.unsqueeze(-1) * f.float().unsqueeze(1) + mix).bfloat16()


def main():
    dev = torch.device("cuda")
    recs = []
    hc_fn = (torch.rand(24, 4 * D, device=dev) - 0.5) * 0.1
    base = torch.rand(24, device=dev) - 0.5
    scale = torch.tensor([0.5, 0.75, 1.0], device=dev)
    for t in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (2 * 5 * t * D + 16 * t))))
        xs = [
            (
                (torch.randn(t, 4, D, device=dev)).bfloat16(),
                torch.rand(t, 4, device=dev) * 1.5 + 0.25,
                (torch.randn(t, D, device=dev)).bfloat16(),
            )
            for _ in range(copies)
        ]
        recs.append({"op": "mhc_pre", "rows": t, "dim": D, "name": "torch_ops",
                     "us": time_us(lambda i: mhc_pre_torch(xs[i % copies][0], hc_fn, base, scale,
                                                           xs[i % copies][1]))})
        _, _, _, post, comb = mhc_pre_torch(xs[0][0], hc_fn, base, scale, xs[0][1])
        recs.append({"op": "mhc_expand", "rows": t, "dim": D, "name": "torch_ops",
                     "us": time_us(lambda i: mhc_expand_torch(xs[i % copies][0], xs[i % copies][2],
                                                              post, comb))})

        def step(i):
            s, lag, f = xs[i % copies]
            return mhc_pre_torch(mhc_expand_torch(s, f, post, comb), hc_fn, base, scale, lag)

        recs.append({"op": "mhc_expand_pre", "rows": t, "dim": D, "name": "torch_ops", "us": time_us(step)})
        del xs
    emit(recs, bf16_ceiling=False)


if __name__ == "__main__":
    main()
