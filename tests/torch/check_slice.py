"""Checks the CUDA slice kernels against torch CUDA ops on the GPU machine.
tests/cuda_slice.rs (with DEEPINFER_DUMP_DIR) dumps each case's inputs and our
GPU outputs; this recomputes them with torch on the GPU:
  act_quant: bitwise (values and scales), rms_norm: <= 1 BF16 ulp per element
  and calc_diff < 1e-6, rms_norm_act_quant: y as rms_norm, q and scales
  bitwise the torch quantiser of our y. Prints 'torch check: N passed, M
  failed' last."""
import glob
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benches", "peers"))
from slice_torch import act_quant_torch  # noqa: E402

DT = {"BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.uint8}


def load(path):
    name = os.path.basename(path)[:-4]
    stem, dtype, shape = name.split("__")
    shape = [int(s) for s in shape.split("x")]
    raw = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8)
    return stem, raw.view(DT[dtype]).view(shape).cuda()


def ulps(a, b):
    def key(t):
        i = t.view(torch.int16).int()
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (key(a) - key(b)).abs()


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def rms_norm_ref(x, w, eps=1e-20):
    xf = x.float()
    return (w.float() * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).bfloat16()


def close_bf16(ref, y):
    return bool(ulps(ref, y).max() <= 1) and calc_diff(ref.float(), y.float()) < 1e-6


def main(d):
    t = dict(load(p) for p in glob.glob(os.path.join(d, "*.bin")))
    passed = failed = 0
    for key in sorted(k[:-2] for k in t if k.endswith("_x")):
        if key.startswith("act_quant"):
            x = t[key + "_x"]
            if x.shape[-1] % 32:
                xq = None
            else:
                xq = act_quant_torch(x)
            if xq is None:
                # torch formula here needs whole blocks; tails are covered bitwise by the CPU check.
                continue
            q, s = xq
            ok = torch.equal(q.view(torch.uint8), t[key + "_q"].view(torch.uint8)) and torch.equal(s, t[key + "_s"])
        elif key.startswith("rms_norm_act_quant"):
            x, w, y = t[key + "_x"], t[key + "_w"], t[key + "_y"]
            q, s = act_quant_torch(y)
            ok = (close_bf16(rms_norm_ref(x, w), y)
                  and torch.equal(q.view(torch.uint8), t[key + "_q"].view(torch.uint8))
                  and torch.equal(s, t[key + "_s"]))
        else:
            x, w, y = t[key + "_x"], t[key + "_w"], t[key + "_y"]
            ok = close_bf16(rms_norm_ref(x, w), y)
        print(f"{key}: {'ok' if ok else 'MISMATCH'}")
        passed += ok
        failed += not ok
    print(f"torch check: {passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
