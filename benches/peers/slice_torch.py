"""Torch peers for the slice benchmark, run on the GPU machine in the same
bundle run as our kernels: RMSNorm (eager fp32 formula and F.rms_norm), the
FP8 1x32 quantiser written as torch ops, and the two in sequence (the peer of
the fused RMSNorm + quantiser), timed like benches/slice_gpu.rs
(CUDA events, median of batches, inputs rotated over >= 512 MiB). Also
measures the BF16 GEMM ceiling. Prints JSON on stdout."""
import json
import subprocess

import torch
import torch.nn.functional as F

ROTATE = 512 << 20
BATCH, REPEATS = 20, 15
INV448 = torch.tensor(1.0 / 448.0, dtype=torch.float32).item()


def time_us(fn):
    for i in range(BATCH):
        fn(i)
    samples, i = [], 0
    for _ in range(REPEATS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(BATCH):
            fn(i)
            i += 1
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / BATCH)
    samples.sort()
    return samples[len(samples) // 2]


def rms_norm_eager(x, w, eps):
    xf = x.float()
    return (w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).bfloat16()


def act_quant_torch(x):
    rows, k = x.shape
    xf = x.float().view(rows, k // 32, 32)
    amax = xf.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    bits = (amax * INV448).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).int()
    inv = ((127 - e) << 23).view(torch.float32)
    q = (xf * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(rows, k)
    return q, (e + 127).to(torch.uint8).view(rows, k // 32)


def rms_norm_act_quant_torch(x, w, eps, norm=rms_norm_eager):
    """The unfused peer of the fused kernel: RMSNorm (BF16 out), then the quantiser."""
    y = norm(x, w, eps)
    q, s = act_quant_torch(y)
    return y, q, s


def emit(recs, bf16_ceiling=True):
    """Prints the peers' JSON: the driver, torch's version, the records and
    (unless told not to) the BF16 GEMM ceiling measured now, 8192³."""
    out = {"driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip(),
           "torch": torch.__version__, "records": recs}
    if bf16_ceiling:
        a = torch.randn(8192, 8192, device="cuda").bfloat16()
        us = time_us(lambda i: a @ a)
        out["ceilings"] = {"bf16_tflops": 2 * 8192**3 / (us * 1e-6) / 1e12}
    print(json.dumps(out))


def main():
    dev = torch.device("cuda")
    recs = []
    dim = 5120
    w = torch.randn(dim, device=dev).bfloat16()
    for rows in [1, 64, 256, 4096, 16384]:
        copies = max(2, min(256, -(-ROTATE // (rows * dim * 2))))
        xs = [torch.randn(rows, dim, device=dev).bfloat16() for _ in range(copies)]
        for name, fn in [
            ("torch_eager_fp32", lambda i: rms_norm_eager(xs[i % copies], w, 1e-20)),
            ("torch_F.rms_norm", lambda i: F.rms_norm(xs[i % copies], (dim,), w, 1e-20)),
        ]:
            recs.append({"op": "rms_norm", "rows": rows, "dim": dim, "name": name, "us": time_us(fn)})
        recs.append({"op": "act_quant_fp8", "rows": rows, "dim": dim, "name": "torch_ops",
                     "us": time_us(lambda i: act_quant_torch(xs[i % copies]))})
        for name, norm in [
            ("torch_eager", rms_norm_eager),
            ("torch_F.rms_norm+ops", lambda x, w, eps: F.rms_norm(x, (dim,), w, eps)),
        ]:
            recs.append({"op": "rms_norm_act_quant_fp8", "rows": rows, "dim": dim, "name": name,
                         "us": time_us(lambda i: rms_norm_act_quant_torch(xs[i % copies], w, 1e-20, norm))})
        del xs
    emit(recs)


if __name__ == "__main__":
    main()
