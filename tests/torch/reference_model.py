#!/usr/bin/env python3
"""Independent torch (CPU, deterministic) reference of the DeepSeek-V4.1-Flash text
backbone, PREFILL of a whole prompt at start position 0.

Written from the specification only (/work/shared/spec/v41-flash.md, cited as §N),
not from deepinfer's Rust code nor from any other implementation.

    python tests/torch/reference_model.py --model-dir DIR --ckpt-dir DIR \
        --tokens 1,2,3 --out logits.f32 [--dump-routing routing.json] \
        [--dump-index index.json]
    python tests/torch/reference_model.py --self-test [--model-dir DIR --ckpt-dir DIR]

Output: fp32 logits [S, vocab] (raw little-endian f32, or .npy when the name ends
in .npy). Routing JSON: {"n_layers", "n_tokens", "experts": experts[layer][token]
= selected routed expert ids sorted ascending}.

Conventions that the spec leaves open (see tests/torch/README.md):
  * every top-k (experts, index entries, candidate blocks) orders by the higher score
    first and breaks ties towards the LOWER index (stable sort, not torch.topk);
  * a reduction whose order the spec leaves to "summation order" (dot products,
    GEMMs, means) is evaluated in fp64 and rounded to fp32 once: an order-free,
    near-exact fp32 accumulation. Where the spec fixes the order of fp32 additions
    (FP8/FP4 GEMM K blocks, the attention kernel's running blocks, the MoE combine,
    mHC collapse/expand) the additions are done one by one in fp32 in that order;
  * Engram token map: compressed id = token_id % engram_compressed_vocab_size (the
    test configs use this simple map; the official one is built from the tokenizer,
    §8.1, and is not implemented here).
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np
import torch

F32 = torch.float32
BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
NEG_INF = float("-inf")
CHUNK = 8192  # output rows per fp64 GEMM chunk (memory bound only)


# ----------------------------------------------------------------------------
# Generic numerics helpers (§10.6)
# ----------------------------------------------------------------------------

# How sums whose order the spec leaves free are evaluated. "seq" (default):
# fp32, one term at a time in index order, starting from 0 -- the convention
# deepinfer's CPU reference documents, so the two can agree to the last bit.
# "fp64": exact products summed in fp64 and rounded to fp32 once (independent
# of any order). Set by --accumulate.
ACCUMULATE = "seq"


def dot_acc(a, b):
    """Σ_k a[..., k]·b[..., k] (broadcasting) with fp32 products."""
    if ACCUMULATE == "fp64":
        return (a.double() * b.double()).sum(-1).float()
    a, b = torch.broadcast_tensors(a.float(), b.float())
    acc = torch.zeros(a.shape[:-1], dtype=F32)
    for k in range(a.shape[-1]):
        acc = acc + a[..., k] * b[..., k]
    return acc


def mm_acc(a, b):
    """a [..., K] @ b[N, K]^T in the accumulation mode, fp32 result."""
    if ACCUMULATE == "fp64":
        a64 = a.double()
        outs = [(a64 @ b[n0:n0 + CHUNK].double().transpose(0, 1)).float() for n0 in range(0, b.shape[0], CHUNK)]
        return torch.cat(outs, dim=-1) if outs else a64.new_zeros(*a.shape[:-1], 0).float()
    return dot_acc(a.unsqueeze(-2), b)


def sum_acc(x, dim):
    """fp32 sum along dim in the accumulation mode."""
    if ACCUMULATE == "fp64":
        return x.double().sum(dim=dim).float()
    x = x.float().movedim(dim, -1)
    acc = torch.zeros(x.shape[:-1], dtype=F32)
    for k in range(x.shape[-1]):
        acc = acc + x[..., k]
    return acc


def mean_acc(x, dim):
    """fp32 mean along dim: the sum, then one fp32 division by the count."""
    return sum_acc(x, dim) / torch.tensor(float(x.shape[dim]), dtype=F32)


def _map_f64(fn, x):
    """Applies a Python (C libm) double function elementwise."""
    flat = [fn(v) for v in x.double().flatten().tolist()]
    return torch.tensor(flat, dtype=torch.float64).reshape(x.shape)


def _exp64(v):
    return math.exp(v) if v < 709.0 else math.inf


def exp32(x):
    """e^x evaluated in double with the C library's exp and rounded to fp32 once.
    The spec leaves the last ulp of transcendentals open; deepinfer's CPU model
    uses the same convention (Rust's f64::exp is the same libm), so the two can
    agree bit for bit."""
    return _map_f64(_exp64, x).float()


def sqrt32(x):
    """The correctly rounded fp32 square root (computed in double, rounded
    once). torch's fp32 CPU sqrt/rsqrt are not always correctly rounded."""
    return torch.sqrt(x.double()).float()


def rsqrt32(x):
    """1 / sqrt32(x) in fp32 (two IEEE roundings, as a plain 1/sqrt)."""
    return torch.ones((), dtype=F32) / sqrt32(x)


def sigmoid32(x):
    """σ(x) = 1 / (1 + e^−x) in fp32 with exp32."""
    one = torch.ones((), dtype=F32)
    return one / (one + exp32(-x.float()))


def softplus32(z):
    """torch's softplus (β 1, threshold 20) with ln(1 + e^z) in double (C libm
    exp and log1p), rounded to fp32 once."""
    sp = _map_f64(lambda v: math.log1p(_exp64(v)), z).float()
    return torch.where(z > 20, z, sp)


def rms_norm(x, weight, eps):
    """§10.6 RMSNorm: fp32 y = x·rsqrt(mean(x²) + eps), then weight·y; BF16 out."""
    xf = x.float()
    ms = mean_acc(xf * xf, -1).unsqueeze(-1)
    y = xf * rsqrt32(ms + torch.tensor(eps, dtype=F32))
    return (weight.float() * y).to(BF16)


def bf16_linear(x, w):
    """§10.6 BF16 linear: BF16 operands, fp32 accumulation, BF16 result."""
    return mm_acc(x.float(), w.float()).to(BF16)


def f32_linear(x, w):
    """§10.6 fp32 linear: input and weight promoted to fp32, fp32 result."""
    return mm_acc(x.float(), w.float())


def stable_topk(scores, k):
    """Indices of the k best scores along the last dim, best first, ties broken
    towards the lower index (stable descending sort)."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


# ----------------------------------------------------------------------------
# Quantisers (§10)
# ----------------------------------------------------------------------------

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
# midpoint c sits between codes c and c+1; at an exact tie the even code wins
E2M1_MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def pow2_from_exponent(e):
    """2^e as fp32 for integer e in [-126, 127] (built from the bit pattern)."""
    bits = ((e.to(torch.int32) + 127) << 23).contiguous()
    return bits.view(F32)


def e8m0_to_f32(b):
    """§10: E8M0 byte -> 2^(b-127); 0xFF is NaN; byte 0 is 2^-127 (subnormal)."""
    b = b.to(torch.int32)
    bits = torch.where(b > 0, b << 23, torch.full_like(b, 0x00400000)).contiguous()
    f = bits.view(F32).clone()
    f[b == 255] = float("nan")
    return f


def ceil_pow2_exponent(t):
    """§10.1 step 2: ceil(log2 t) of a positive normal fp32 t, on the bit pattern:
    the exponent, plus one if the mantissa is nonzero."""
    bits = t.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127
    return e + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def to_e4m3_saturating(x):
    """fp32 -> e4m3 (RNE) with saturation to ±448; torch's cast does not saturate,
    so clamp first (§10.5, kernels.md §8.4)."""
    return x.clamp(-448.0, 448.0).to(E4M3)


def act_quant_fp8(x):
    """§10.1 FP8 activation quantisation per 1×32 block along the last dim.
    Returns (q as fp32 e4m3 values [..., K], scales fp32 [..., K/32])."""
    xf = x.float()
    K = xf.shape[-1]
    assert K % 32 == 0, f"act_quant needs K % 32 == 0, got {K}"
    blk = xf.reshape(*xf.shape[:-1], K // 32, 32)
    amax = blk.abs().amax(dim=-1).clamp_min(1e-4)
    t = amax * torch.tensor(1.0 / 448.0, dtype=F32)
    scale = pow2_from_exponent(ceil_pow2_exponent(t))
    q = to_e4m3_saturating(blk / scale.unsqueeze(-1)).float()
    return q.reshape(xf.shape), scale


def fake_quant_fp8(x):
    """§10.1 step 5 (window KV): BF16(e4m3 value × E8M0 scale), blocks of 32."""
    q, s = act_quant_fp8(x)
    K = q.shape[-1]
    blk = q.reshape(*q.shape[:-1], K // 32, 32) * s.unsqueeze(-1)
    return blk.reshape(q.shape).to(BF16)


def e2m1_round(v):
    """§10.3: round fp32 v (already clamped to ±6) to the e2m1 grid, nearest, ties
    to the even CODE (0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4)."""
    mag = v.abs()
    code = torch.zeros_like(mag, dtype=torch.int64)
    for c, mid in enumerate(E2M1_MIDS):
        up_on_tie = (c + 1) % 2 == 0
        code += ((mag > mid) | ((mag == mid) & up_on_tie)).to(torch.int64)
    return torch.where(v < 0, -E2M1_GRID[code], E2M1_GRID[code])


def nan_scale_if_not_finite(amax, scale):
    """A FP4 group holding a NaN or +-Inf (e2m1 has neither) takes the NaN scale,
    so the whole group dequantises to NaN (src/numerics.rs, issue 15); torch's
    amax keeps NaN. Finite groups are unchanged."""
    return torch.where(torch.isfinite(amax), scale, torch.full_like(scale, float("nan")))


def fake_quant_fp4_e8m0(x, group=32):
    """§10.3 FP4 with E8M0 scales per 32 (index keys and index queries):
    amax floor 6·2^-126, scale 2^ceil(log2(amax·fp32(1/6))), v = clamp(x/scale, ±6),
    e2m1, written back as BF16(e2m1·scale)."""
    xf = x.float()
    K = xf.shape[-1]
    assert K % group == 0
    blk = xf.reshape(*xf.shape[:-1], K // group, group)
    amax = blk.abs().amax(dim=-1).clamp_min(6.0 * 2.0 ** -126)
    t = amax * torch.tensor(1.0 / 6.0, dtype=F32)
    scale = nan_scale_if_not_finite(amax, pow2_from_exponent(ceil_pow2_exponent(t))).unsqueeze(-1)
    v = e2m1_round((blk / scale).clamp(-6.0, 6.0))
    return (v * scale).reshape(xf.shape).to(BF16)


def fake_quant_fp4_e4m3(x, group=16):
    """§10.3 FP4 with E4M3 scales per 16 (compressed main-KV entries):
    amax floor 6·2^-9, scale = e4m3(amax/6) (saturating), v = clamp(x/scale, ±6) with
    a true fp32 division, e2m1 ties-to-even-code, BF16(e2m1·scale)."""
    xf = x.float()
    K = xf.shape[-1]
    assert K % group == 0
    blk = xf.reshape(*xf.shape[:-1], K // group, group)
    amax = blk.abs().amax(dim=-1).clamp_min(6.0 * 2.0 ** -9)
    scale = to_e4m3_saturating(amax / torch.tensor(6.0, dtype=F32)).float()
    scale = nan_scale_if_not_finite(amax, scale).unsqueeze(-1)
    v = e2m1_round((blk / scale).clamp(-6.0, 6.0))
    return (v * scale).reshape(xf.shape).to(BF16)


def decode_e2m1_packed(packed):
    """§10.3/§12.4: I8 bytes holding two e2m1 codes, even element in the low nibble.
    [N, K/2] bytes -> fp32 [N, K]."""
    b = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(b.shape[0], -1)
    mag = E2M1_GRID[codes & 0x7]
    return torch.where((codes & 0x8) != 0, -mag, mag)


# ----------------------------------------------------------------------------
# Block-scaled weights and GEMMs (§10.2, §10.4)
# ----------------------------------------------------------------------------

class QWeight:
    """A block-scaled weight: exact fp32 values of the e4m3/e2m1 codes [N, K] and one
    fp32 scale per (output row, 32-deep K block) [N, K/32]."""

    def __init__(self, values, row_scales):
        self.values = values
        self.scale = row_scales

    @property
    def shape(self):
        return self.values.shape


def fp8_weight(ckpt, name):
    """§10.2 FP8 weight: e4m3 [N, K] with E8M0 scales on a 32×32 grid."""
    w = ckpt.get(name + ".weight")
    s = e8m0_to_f32(ckpt.get(name + ".scale"))
    N, K = w.shape
    assert s.shape == (-(-N // 32), -(-K // 32)), (name, s.shape)
    rows = s.repeat_interleave(32, dim=0)[:N]
    return QWeight(w.float(), rows)


def fp4_weight(ckpt, name):
    """§7.2 FP4 routed-expert weight: packed e2m1 [N, K/2] with E8M0 scales per
    (row, 32 along K) [N, K/32]."""
    vals = decode_e2m1_packed(ckpt.get(name + ".weight"))
    s = e8m0_to_f32(ckpt.get(name + ".scale"))
    assert s.shape == (vals.shape[0], vals.shape[1] // 32), (name, s.shape)
    return QWeight(vals, s)


def fp8_weight_to_bf16(ckpt, name):
    """§3.1 wo_a load: e4m3 × its 32×32 block's E8M0 scale, exact in BF16."""
    w = fp8_weight(ckpt, name)
    return (w.values * w.scale.repeat_interleave(32, dim=1)[:, :w.values.shape[1]]).to(BF16)


def block_gemm(q, a_s, w):
    """§10.4: per 32-deep K block, the fp32 partial (exact products; the in-block sum
    order is free) times a_s·b_s, added to the fp32 result in increasing K order;
    the result is rounded to BF16 (by the callers' .to(BF16))."""
    M, K = q.shape
    N = w.values.shape[0]
    assert w.values.shape[1] == K, (w.values.shape, q.shape)
    acc = torch.zeros(M, N, dtype=F32)
    for kb in range(K // 32):
        sl = slice(kb * 32, kb * 32 + 32)
        part = mm_acc(q[:, sl].float(), w.values[:, sl].float())
        acc = acc + part * (a_s[:, kb:kb + 1] * w.scale[:, kb].unsqueeze(0))
    return acc


def quant_linear(x, w):
    """FP8- or FP4-weight linear (§10.6): input FP8-quantised per 1×32, §10.4 GEMM,
    BF16 result. x [..., K] BF16."""
    lead = x.shape[:-1]
    q, s = act_quant_fp8(x.reshape(-1, x.shape[-1]))
    return block_gemm(q, s, w).to(BF16).reshape(*lead, w.shape[0])


# ----------------------------------------------------------------------------
# Checkpoint reader (safetensors, own parser; §12)
# ----------------------------------------------------------------------------

_ST_DTYPES = {
    "BF16": (2, BF16), "F16": (2, torch.float16), "F32": (4, F32), "F64": (8, torch.float64),
    "I8": (1, torch.int8), "U8": (1, torch.uint8), "I16": (2, torch.int16),
    "I32": (4, torch.int32), "I64": (8, torch.int64),
    "F8_E4M3": (1, E4M3), "F8_E8M0": (1, torch.uint8),  # E8M0 stays raw bytes
}


class Checkpoint:
    """Memory-mapped safetensors shards of a directory; tensors are read on demand."""

    def __init__(self, directory):
        files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {directory}")
        self.index = {}
        for path in files:
            with open(path, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(n))
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                self.index[name] = (mm, 8 + n + start, 8 + n + end, info["dtype"], info["shape"])

    def has(self, name):
        return name in self.index

    def _convert(self, raw, dtype, shape):
        if dtype not in _ST_DTYPES:
            raise ValueError(f"unsupported safetensors dtype {dtype}")
        t = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1))
        return t.view(_ST_DTYPES[dtype][1]).reshape(shape)

    def get(self, name):
        if name not in self.index:
            raise KeyError(f"tensor {name} missing from the checkpoint")
        mm, s, e, dtype, shape = self.index[name]
        return self._convert(np.array(mm[s:e]), dtype, shape)

    def get_rows(self, name, rows):
        """Rows `rows` (int array) of a 2-D tensor, reading only those rows."""
        mm, s, e, dtype, shape = self.index[name]
        item = _ST_DTYPES[dtype][0]
        row_bytes = item * shape[1]
        mat = mm[s:e].reshape(shape[0], row_bytes)
        flat = np.asarray(rows).reshape(-1)
        assert flat.min() >= 0 and flat.max() < shape[0], f"{name}: row out of range"
        return self._convert(mat[flat], dtype, [flat.size, shape[1]])


# ----------------------------------------------------------------------------
# Configuration (§1) and layer roles (§2)
# ----------------------------------------------------------------------------

class Config:
    """Text-model configuration. Reads the HF config.json (nested text_config) and
    falls back to the flat inference-config keys."""

    def __init__(self, d):
        self.raw = d
        g = self._get
        self.n_layers = int(g("num_hidden_layers", "n_layers"))
        self.dim = int(g("hidden_size", "dim"))
        self.vocab = int(g("vocab_size"))
        self.n_heads = int(g("num_attention_heads", "n_heads"))
        self.head_dim = int(g("head_dim"))
        self.rope_dim = int(g("qk_rope_head_dim", "rope_head_dim"))
        self.q_lora_rank = int(g("q_lora_rank"))
        self.o_lora_rank = int(g("o_lora_rank"))
        self.o_groups = int(g("o_groups"))
        self.window = int(g("sliding_window", "window_size"))
        self.compress_ratios = [int(r) for r in g("compress_ratios")]
        self.kv_sources = [int(v) for v in g("kv_source_layer_ids", "kv_source_layers", default=[])]
        self.index_sources = [int(v) for v in g("index_source_layer_ids", "index_source_layers", default=[])]
        self.cand_source = int(g("candidate_source_layer_id", "candidate_source_layer", default=-1))
        self.cand_topk_blocks = int(g("candidate_topk_blocks", default=0))
        self.cand_block_size = int(g("candidate_block_size", default=1))
        self.index_n_heads = int(g("index_n_heads", default=0))
        self.index_head_dim = int(g("index_head_dim", default=0))
        self.index_topk = int(g("index_topk", default=0))
        self.rope_theta = float(g("rope_theta"))
        self.compress_rope_theta = float(g("compress_rope_theta"))
        rs = d.get("rope_scaling") or {}
        self.rope_factor = float(rs.get("factor", d.get("rope_factor", 1.0)))
        self.beta_fast = float(rs.get("beta_fast", d.get("beta_fast", 32)))
        self.beta_slow = float(rs.get("beta_slow", d.get("beta_slow", 1)))
        self.original_seq_len = int(rs.get("original_max_position_embeddings",
                                           d.get("original_seq_len", 0)))
        self.norm_eps = float(g("rms_norm_eps", "norm_eps"))
        self.hc_mult = int(g("hc_mult"))
        self.hc_iters = int(g("hc_sinkhorn_iters"))
        self.hc_eps = float(g("hc_eps"))
        self.n_experts = int(g("n_routed_experts"))
        self.n_active = int(g("num_experts_per_tok", "n_activated_experts"))
        self.n_shared = int(g("n_shared_experts", default=1))
        self.route_scale = float(g("routed_scaling_factor", "route_scale", default=1.0))
        self.swiglu_limit = float(g("swiglu_limit", default=0.0))
        self.score_func = g("scoring_func", "score_func", default="sqrtsoftplus")
        self.gate_temp = float(g("gate_temp", default=1.0))
        self.norm_topk_prob = bool(g("norm_topk_prob", default=True))
        self.engram_layers = [int(v) for v in g("engram_layer_ids", default=[])]
        self.engram_rows = [int(v) for v in g("engram_num_embeddings", default=[])]
        self.engram_max_ngram = int(g("engram_max_ngram_size", default=4))
        self.engram_hash_space = int(g("engram_vocab_size", default=0))
        self.engram_heads = int(g("engram_n_heads", default=0))
        self.engram_head_dim = int(g("engram_head_dim", default=0))
        self.engram_pad_id = int(g("engram_pad_token_id", "engram_pad_id", default=2))
        self.engram_vocab = int(g("engram_compressed_vocab_size", default=0))
        if self.score_func != "sqrtsoftplus":
            raise NotImplementedError(f"scoring function {self.score_func}")
        if self.n_shared != 1:
            raise NotImplementedError("exactly one shared expert is supported (§1)")

    def _get(self, *keys, default=KeyError):
        for k in keys:
            if k in self.raw:
                return self.raw[k]
        if default is KeyError:
            raise KeyError(f"config lacks {keys}")
        return default

    @staticmethod
    def from_model_dir(model_dir):
        path = os.path.join(model_dir, "config.json")
        if os.path.exists(path):
            with open(path) as fh:
                d = json.load(fh)
            d = d.get("text_config", d)
        else:
            with open(os.path.join(model_dir, "inference-config.json")) as fh:
                d = json.load(fh)
        return Config(d)


class LayerRole:
    """§2 derivation rules for one backbone layer."""

    def __init__(self, cfg, l):
        self.layer = l
        self.ratio = cfg.compress_ratios[l]
        self.kv_source = l < cfg.n_layers and l in cfg.kv_sources
        self.index_source = l < cfg.n_layers and l in cfg.index_sources
        self.owns_index_keys = self.kv_source and self.index_source
        self.candidate_source = self.index_source and l == cfg.cand_source
        self.reindex = self.index_source and 0 <= cfg.cand_source < l
        self.engram = l in cfg.engram_layers
        if (self.kv_source or self.index_source) and self.ratio <= 0:
            raise ValueError(f"layer {l}: a KV/index source needs ratio > 0")
        if l == cfg.cand_source and not self.index_source:
            raise ValueError(f"candidate source {l} is not an index source")

    def describe(self):
        kind = "window"
        if self.ratio > 0:
            kind = ("full" if self.kv_source else
                    "reindex" if self.reindex else
                    "index" if self.index_source else "reuse")
        extra = (" +candidates" if self.candidate_source else "") + (" +engram" if self.engram else "")
        return f"layer {self.layer}: ratio {self.ratio} {kind}{extra}"


# ----------------------------------------------------------------------------
# RoPE (§3.2)
# ----------------------------------------------------------------------------

class Rope:
    """Interleaved-pair RoPE on the LAST rope_dim dims. Ratio-0 layers: θ = rope_theta
    without YaRN; ratio > 0 layers: θ = compress_rope_theta with YaRN (§3.2)."""

    def __init__(self, cfg, ratio):
        d = cfg.rope_dim
        self.dim = d
        theta = cfg.rope_theta if ratio == 0 else cfg.compress_rope_theta
        # fp32 pow, then fp32 reciprocal
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=F32) / d))
        if ratio > 0 and cfg.original_seq_len > 0:
            def corr(beta):  # double precision
                return d * math.log(cfg.original_seq_len / (2 * math.pi * beta)) / (2 * math.log(theta))
            low = max(math.floor(corr(cfg.beta_fast)), 0)
            high = min(math.ceil(corr(cfg.beta_slow)), d - 1)
            self.band = (low, high)
            ramp = ((torch.arange(d // 2, dtype=F32) - low) / max(high - low, 0.001)).clamp(0, 1)
            smooth = 1 - ramp
            freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
        else:
            self.band = None
        self.freqs = freqs

    def cos_sin(self, positions):
        ang = torch.outer(positions.to(F32), self.freqs)  # one fp32 multiply
        return _map_f64(math.cos, ang).float(), _map_f64(math.sin, ang).float()

    def apply(self, x, positions, inverse=False):
        """Rotate x [S, ..., hd] (BF16) at positions [S]; fp32 math, BF16 result."""
        d = self.dim
        cos, sin = self.cos_sin(positions)
        if inverse:
            sin = -sin
        shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        xr = x[..., -d:].float().reshape(*x.shape[:-1], d // 2, 2)
        x0, x1 = xr[..., 0], xr[..., 1]
        y = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
        y = y.reshape(*x.shape[:-1], d).to(BF16)
        return torch.cat([x[..., :-d], y], dim=-1)


# ----------------------------------------------------------------------------
# Sparse attention kernel (§3.10) and window lists (§3.3)
# ----------------------------------------------------------------------------

def window_indices(S, W):
    """§3.3 prefill: query p lists max(0, p−W+1)+k for k < min(S, W); entries > p
    are -1 (trailing). Indices into the prompt's own window-KV rows."""
    p = torch.arange(S).unsqueeze(1)
    k = torch.arange(min(S, W)).unsqueeze(0)
    idx = (p - W + 1).clamp_min(0) + k
    return torch.where(idx > p, torch.full_like(idx, -1), idx)


def sparse_attention(q, rows, idx, sink, block=64, q_chunk=64):
    """§3.10 sparse MQA with sink for q [S, H, hd] BF16, rows [R, hd] BF16 (K = V),
    idx [S, L] (-1 = no row), sink [H] fp32. Walks the list in blocks of 64 with a
    running max from -1e30; probabilities rounded to BF16 against the running max for
    P·V; sink only in the denominator; out = BF16(acc / l)."""
    S, H, hd = q.shape
    L = idx.shape[1]
    scale = torch.tensor(hd ** -0.5, dtype=F32)
    out = torch.empty(S, H, hd, dtype=BF16)
    for s0 in range(0, S, q_chunk):
        qs = q[s0:s0 + q_chunk]
        ids = idx[s0:s0 + q_chunk]
        n = qs.shape[0]
        valid = ids >= 0
        g = rows[ids.clamp_min(0)] if rows.shape[0] else torch.zeros(n, L, hd, dtype=BF16)
        g = torch.where(valid.unsqueeze(-1), g, torch.zeros((), dtype=BF16))
        gf = g.float()
        logits = dot_acc(qs.float().unsqueeze(2), gf.unsqueeze(1)) * scale
        logits = torch.where(valid.unsqueeze(1), logits, torch.full((), NEG_INF))
        m = torch.full((n, H), -1e30, dtype=F32)
        lsum = torch.zeros(n, H, dtype=F32)
        acc = torch.zeros(n, H, hd, dtype=F32)
        for b0 in range(0, L, block):
            s = logits[:, :, b0:b0 + block]
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = exp32(m - m_new)
            p = exp32(s - m_new.unsqueeze(-1))
            lsum = lsum * alpha + sum_acc(p, -1)
            pb = p.to(BF16).float()  # [n, H, l]
            pv = dot_acc(pb.unsqueeze(-2), gf[:, b0:b0 + block].transpose(1, 2).unsqueeze(1))
            acc = acc * alpha.unsqueeze(-1) + pv
            m = m_new
        lsum = lsum + exp32(sink.float().unsqueeze(0) - m)
        out[s0:s0 + n] = (acc / lsum.unsqueeze(-1)).to(BF16)
    return out


# ----------------------------------------------------------------------------
# Compressor (§3.4), indexer (§3.5), candidate pre-filter (§3.6)
# ----------------------------------------------------------------------------

def compressor(ckpt, prefix, x, ratio, eps):
    """§3.4: the normalised latent of every complete group, BEFORE RoPE, [S//ratio, C].
    ratio 1: RMSNorm(BF16 GEMM). ratio > 1: fp32 wkv/wgate on the unquantised input,
    per-channel softmax over the group's tokens in fp32, pooled vector rounded to
    BF16, then compressor.norm."""
    S = x.shape[0]
    n = S // ratio
    wkv = ckpt.get(prefix + ".wkv.weight")
    norm_w = ckpt.get(prefix + ".norm.weight")
    if ratio == 1:
        return rms_norm(bf16_linear(x, wkv), norm_w, eps)
    wgate = ckpt.get(prefix + ".wgate.weight")
    xs = x[:n * ratio]
    C = wkv.shape[0]
    kv = f32_linear(xs, wkv).reshape(n, ratio, C)
    sc = f32_linear(xs, wgate).reshape(n, ratio, C)
    mx = sc[:, 0]
    for t in range(1, ratio):
        mx = torch.maximum(mx, sc[:, t])
    e = [exp32(sc[:, t] - mx) for t in range(ratio)]
    den = e[0]
    for t in range(1, ratio):
        den = den + e[t]
    pooled = (e[0] / den) * kv[:, 0]
    for t in range(1, ratio):
        pooled = pooled + (e[t] / den) * kv[:, t]
    return rms_norm(pooled.to(BF16), norm_w, eps)


def index_scores(q, k, w):
    """§3.5 BF16 score: BF16(q_h·k_t) (fp32 accumulation), ReLU, BF16(· w_h), fp32 sum
    over heads rounded to BF16 once. q [S, IH, ID], k [N, ID], w [S, IH] -> [S, N]."""
    dots = dot_acc(q.float().unsqueeze(2), k.float().unsqueeze(0).unsqueeze(0)).to(BF16)
    prod = (torch.relu(dots).float() * w.float().unsqueeze(-1)).to(BF16)
    return sum_acc(prod.float(), 1).to(BF16)


def candidate_mask(scores, visible, block, topk_blocks):
    """§3.6: block score = max of the (visibility-masked) BF16 scores in blocks of
    `block` entries (tail padded with -inf); the block holding the newest visible
    entry is pinned at +inf (nothing when c = 0); keep the top min(topk_blocks, nb)
    blocks (ties: lower block first), dropping picks whose score is -inf.
    Returns a bool mask [S, N]."""
    S, N = scores.shape
    nb = -(-N // block)
    pad = torch.full((S, nb * block), NEG_INF)
    pad[:, :N] = scores
    bscore = pad.reshape(S, nb, block).amax(dim=-1)
    has = visible > 0
    pin = ((visible - 1).clamp_min(0) // block)
    rows = torch.arange(S)[has]
    bscore[rows, pin[has]] = float("inf")
    kb = min(topk_blocks, nb)
    picks = stable_topk(bscore, kb)
    keep = torch.gather(bscore, 1, picks) > NEG_INF
    bmask = torch.zeros(S, nb, dtype=torch.bool)
    bmask.scatter_(1, picks, keep)
    # a False from a dropped pick must not clear a True: picks are distinct, so fine
    return bmask.repeat_interleave(block, dim=1)[:, :N]


def indexer(cfg, role, ckpt, prefix, x, qr, rope, shared, S):
    """§3.5–3.7 for an index source: FP4 index queries, BF16 scores against the
    published index keys, visibility mask, candidate pre-filter at the candidate
    source (own top-k from the unmasked scores), candidate mask at Reindex layers,
    top-K with K = min(index_topk, S//ratio), picks sorted ascending, picks >= the
    visible count -> -1, others offset by the window offset S."""
    r = role.ratio
    n_e = S // r
    if n_e == 0:  # §3.5 "no entry yet": the indexer is not run
        return torch.zeros(S, 0, dtype=torch.int64)
    keys = shared["keys"]
    assert keys is not None and keys.shape[0] == n_e, "index keys missing or of another ratio"
    IH, ID = cfg.index_n_heads, cfg.index_head_dim
    pos = torch.arange(S)
    iq = quant_linear(qr, fp8_weight(ckpt, prefix + ".wq_b")).reshape(S, IH, ID)
    iq = fake_quant_fp4_e8m0(rope.apply(iq, pos))
    w = bf16_linear(x, ckpt.get(prefix + ".weights_proj.weight"))
    w_scale = torch.tensor(ID ** -0.5 * IH ** -0.5, dtype=F32)
    w = (w.float() * w_scale).to(BF16)
    scores = index_scores(iq, keys, w).float()
    visible = (pos + 1) // r
    invisible = torch.arange(n_e).unsqueeze(0) >= visible.unsqueeze(1)
    scores = scores.masked_fill(invisible, NEG_INF)
    if role.candidate_source:
        shared["cand"] = candidate_mask(scores, visible, cfg.cand_block_size, cfg.cand_topk_blocks)
    if role.reindex:
        cand = shared["cand"]
        assert cand is not None and cand.shape == scores.shape, "candidate mask missing/mismatched"
        scores = scores.masked_fill(~cand, NEG_INF)
    K = min(cfg.index_topk, n_e)
    picks = torch.sort(stable_topk(scores, K), dim=-1).values
    return torch.where(picks >= visible.unsqueeze(1), torch.full_like(picks, -1), picks + S)


# ----------------------------------------------------------------------------
# Attention block (§3.1, §3.4, §3.8, §3.9)
# ----------------------------------------------------------------------------

def attention(cfg, role, ckpt, l, x, shared, trace):
    """§3.1 attention of layer l on its attn_norm output x [S, D] (BF16)."""
    p = f"layers.{l}.attn"
    S = x.shape[0]
    H, hd = cfg.n_heads, cfg.head_dim
    eps = cfg.norm_eps
    rope = Rope(cfg, role.ratio)
    pos = torch.arange(S)

    qr = rms_norm(quant_linear(x, fp8_weight(ckpt, p + ".wq_a")), ckpt.get(p + ".q_norm.weight"), eps)
    q = quant_linear(qr, fp8_weight(ckpt, p + ".wq_b")).reshape(S, H, hd)
    q = rope.apply(q, pos)
    kv = rms_norm(quant_linear(x, fp8_weight(ckpt, p + ".wkv")), ckpt.get(p + ".kv_norm.weight"), eps)
    kv = fake_quant_fp8(rope.apply(kv, pos))

    idx = window_indices(S, cfg.window)
    rows = kv
    if role.ratio > 0:
        r = role.ratio
        if role.kv_source:
            latent = compressor(ckpt, p + ".compressor", x, r, eps)  # pre-RoPE
            epos = torch.arange(latent.shape[0]) * r
            if role.owns_index_keys:
                k = rms_norm(bf16_linear(latent, ckpt.get(p + ".indexer.wk.weight")),
                             ckpt.get(p + ".indexer.k_norm.weight"), eps)
                shared["keys"] = fake_quant_fp4_e8m0(rope.apply(k, epos))
            shared["kv"] = (fake_quant_fp4_e4m3(rope.apply(latent, epos)), r)
        entries, src_ratio = shared["kv"]
        assert src_ratio == r, f"layer {l} reads a ratio-{src_ratio} cache with ratio {r}"
        if role.index_source:
            comp = indexer(cfg, role, ckpt, p + ".indexer", x, qr, rope, shared, S)
            shared["topk"] = comp
        else:
            comp = shared["topk"]
            assert comp is not None, f"layer {l}: no published top-k list to reuse"
        trace["index"][l] = comp
        rows = torch.cat([kv, entries], dim=0)
        idx = torch.cat([idx, comp], dim=1)

    o = sparse_attention(q, rows, idx, ckpt.get(p + ".attn_sink"))
    o = rope.apply(o, pos, inverse=True)
    G, R = cfg.o_groups, cfg.o_lora_rank
    woa = fp8_weight_to_bf16(ckpt, p + ".wo_a").reshape(G, R, -1)
    og = o.reshape(S, G, -1)
    y = dot_acc(og.float().unsqueeze(2), woa.float().unsqueeze(0)).to(BF16).reshape(S, G * R)
    return quant_linear(y, fp8_weight(ckpt, p + ".wo_b"))


# ----------------------------------------------------------------------------
# mHC (§6)
# ----------------------------------------------------------------------------

def hc_mixes(cfg, ckpt, name, streams):
    """§6.1 mixes + split + Sinkhorn for streams [S, n, D] (BF16).
    Returns pre [S, n], post [S, n], comb [S, n, n] (row = source, col = dest), fp32."""
    S, n, D = streams.shape
    fn = ckpt.get(f"{name}_fn").float()
    base = ckpt.get(f"{name}_base").float()
    scale = ckpt.get(f"{name}_scale").float()
    flat = streams.float().reshape(S, n * D)
    rs = rsqrt32(mean_acc(flat * flat, -1) + torch.tensor(cfg.norm_eps, dtype=F32))
    m = mm_acc(flat, fn) * rs.unsqueeze(-1)
    eps = torch.tensor(cfg.hc_eps, dtype=F32)
    pre = sigmoid32(m[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * sigmoid32(m[:, n:2 * n] * scale[1] + base[n:2 * n])
    comb = (m[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(S, n, n)
    comb = sinkhorn(comb, cfg.hc_iters, eps)
    return pre, post, comb


def sinkhorn(comb, iters, eps):
    """§6.1 Sinkhorn in the stated order: row softmax + eps; column normalise; then
    iters−1 times: rows, then columns (each divides by sum + eps)."""
    def seq_sum(t, dim):  # fp32, index ascending
        parts = t.unbind(dim)
        acc = parts[0]
        for x in parts[1:]:
            acc = acc + x
        return acc.unsqueeze(dim)

    mx = comb.amax(dim=-1, keepdim=True)
    e = exp32(comb - mx)
    c = e / seq_sum(e, -1) + eps
    c = c / (seq_sum(c, -2) + eps)
    for _ in range(iters - 1):
        c = c / (seq_sum(c, -1) + eps)
        c = c / (seq_sum(c, -2) + eps)
    return c


def hc_collapse(streams, pre):
    """§6.1 collapse u = Σ_i pre_i·S_i in fp32 (i ascending), BF16 once."""
    sf = streams.float()
    u = pre[:, 0:1] * sf[:, 0]
    for i in range(1, sf.shape[1]):
        u = u + pre[:, i:i + 1] * sf[:, i]
    return u.to(BF16)


def hc_expand(streams, f, post, comb):
    """§6.1 expand S'_k = post_k·F + Σ_j comb[j][k]·S_j in fp32 (j ascending), one
    BF16 rounding per element."""
    sf = streams.float()
    ff = f.float()
    n = sf.shape[1]
    out = []
    for k in range(n):
        mix = comb[:, 0, k:k + 1] * sf[:, 0]
        for j in range(1, n):
            mix = mix + comb[:, j, k:k + 1] * sf[:, j]
        out.append(post[:, k:k + 1] * ff + mix)
    return torch.stack(out, dim=1).to(BF16)


# ----------------------------------------------------------------------------
# MoE (§7)
# ----------------------------------------------------------------------------

def swiglu_expert(cfg, q, s, w1, w3, w2, weight=None):
    """§7.2 expert on pre-quantised input (q, s): g = W1 x, u = W3 x (BF16 outputs,
    promoted), u ∈ [−L, L], g ≤ L, h = g·σ(g)·u in fp32, × routing weight, BF16,
    FP8-quantised, W2 -> BF16."""
    g = block_gemm(q, s, w1).to(BF16).float()
    u = block_gemm(q, s, w3).to(BF16).float()
    L = cfg.swiglu_limit
    if L > 0:
        u = u.clamp(-L, L)
        g = g.clamp(max=L)
    h = g * sigmoid32(g) * u
    if weight is not None:
        h = h * weight.unsqueeze(-1)
    return quant_linear(h.to(BF16), w2)


def moe(cfg, ckpt, l, x, trace):
    """§7: √softplus routing (selection by score + gate.bias, weights from the unbiased
    scores normalised with +1e-20, × route_scale), FP4 routed experts and one FP8
    shared expert, combined as an fp32 sum of the BF16 outputs in ascending expert id,
    shared expert last, one BF16 rounding."""
    p = f"layers.{l}.ffn"
    S = x.shape[0]
    k = cfg.n_active
    z = f32_linear(x, ckpt.get(p + ".gate.weight"))
    if cfg.gate_temp != 1.0:
        z = z / cfg.gate_temp
    scores = sqrt32(softplus32(z))  # beta 1, threshold 20
    bias = ckpt.get(p + ".gate.bias").float()
    sel = stable_topk(scores + bias, k)  # rank order
    sw = torch.gather(scores, 1, sel)
    if cfg.norm_topk_prob and k > 1:
        den = sw[:, 0]
        for i in range(1, k):  # fp32, in rank order
            den = den + sw[:, i]
        sw = sw / (den + torch.tensor(1e-20, dtype=F32)).unsqueeze(-1)
    weights = sw * torch.tensor(cfg.route_scale, dtype=F32)

    q, s = act_quant_fp8(x)
    outs = torch.zeros(S, k, cfg.dim, dtype=BF16)
    for e in torch.unique(sel).tolist():
        tok, slot = torch.nonzero(sel == e, as_tuple=True)
        ep = f"{p}.experts.{e}"
        outs[tok, slot] = swiglu_expert(cfg, q[tok], s[tok], fp4_weight(ckpt, ep + ".w1"),
                                        fp4_weight(ckpt, ep + ".w3"), fp4_weight(ckpt, ep + ".w2"),
                                        weights[tok, slot])
    sp = p + ".shared_experts"
    shared = swiglu_expert(cfg, q, s, fp8_weight(ckpt, sp + ".w1"), fp8_weight(ckpt, sp + ".w3"),
                           fp8_weight(ckpt, sp + ".w2"))
    asc = torch.sort(sel, dim=-1)
    ordered = torch.gather(outs, 1, torch.argsort(sel, dim=-1).unsqueeze(-1).expand(-1, -1, cfg.dim))
    y = torch.zeros(S, cfg.dim, dtype=F32)
    for i in range(k):
        y = y + ordered[:, i].float()
    y = y + shared.float()
    trace["routing"][l] = asc.values.tolist()
    return y.to(BF16)


# ----------------------------------------------------------------------------
# Engram (§8)
# ----------------------------------------------------------------------------

def engram_multipliers(layer_id, compressed_vocab, max_ngram):
    """§8.2: odd int64 multipliers, one per shift, from numpy's default_rng(10007·layer)."""
    bound = (np.iinfo(np.int64).max // compressed_vocab) // 2
    x = np.random.default_rng(10007 * layer_id).integers(0, bound, size=max_ngram)
    return (2 * x + 1).astype(np.int64)


def _is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_primes(layer_ids, hash_space, max_ngram, n_heads):
    """§8.2: successive primes after hash_space−1, never reused, in (layer, order,
    head) order. Returns {layer: [prime of column (n−2)·heads + head]}."""
    out = {}
    p = hash_space - 1
    for l in layer_ids:
        col = []
        for _n in range(2, max_ngram + 1):
            for _h in range(n_heads):
                p += 1
                while not _is_prime(p):
                    p += 1
                col.append(p)
        out[l] = col
    return out


def engram_rows(cfg, l, tokens, primes):
    """§8.2 table rows [S, (max_ngram−1)·heads] for prompt `tokens` (start 0).
    Token map: compressed id = token_id % engram_compressed_vocab_size."""
    Vc = cfg.engram_vocab
    ids = np.asarray(tokens, dtype=np.int64) % Vc
    pad = np.int64(cfg.engram_pad_id % Vc)
    S = ids.shape[0]
    hist = []
    for shift in range(cfg.engram_max_ngram):
        h = np.full(S, pad, dtype=np.int64)
        if shift < S:
            h[shift:] = ids[:S - shift]
        hist.append(h)
    m = engram_multipliers(l, Vc, cfg.engram_max_ngram)
    h = hist[0] * m[0]
    cols = []
    pr = primes[l]
    offsets = np.concatenate([[0], np.cumsum(pr)[:-1]]).astype(np.int64)
    for n in range(2, cfg.engram_max_ngram + 1):
        h = h ^ (hist[n - 1] * m[n - 1])
        for head in range(cfg.engram_heads):
            c = (n - 2) * cfg.engram_heads + head
            cols.append(h % pr[c] + offsets[c])
    return np.stack(cols, axis=1)


def engram(cfg, ckpt, l, tokens, streams, primes):
    """§8.3–8.4: gather and dequantise the rows, wkv FP8 linear -> hc keys + 1 value,
    per-stream gate σ(sign(dot)·√max(|dot|, 1e−6)), S_c += gate·value (fp32, BF16)."""
    p = f"layers.{l}.engram"
    S, n, D = streams.shape
    rows = engram_rows(cfg, l, tokens, primes)
    ncol = rows.shape[1]
    hd = cfg.engram_head_dim
    vals = ckpt.get_rows(p + ".embed.weight", rows).float().reshape(S, ncol, hd)
    sc = e8m0_to_f32(ckpt.get_rows(p + ".embed.scale", rows)).reshape(S, ncol, hd // 32)
    emb = (vals.reshape(S, ncol, hd // 32, 32) * sc.unsqueeze(-1)).to(BF16).reshape(S, ncol * hd)
    kvv = quant_linear(emb, fp8_weight(ckpt, p + ".wkv"))
    keys = kvv[:, :n * D].reshape(S, n, D).float()
    value = kvv[:, n * D:].float()
    qk = ckpt.get(p + ".q_weight").float() * ckpt.get(p + ".k_weight").float()  # [n, D]
    sf = streams.float()
    eps = torch.tensor(cfg.norm_eps, dtype=F32)
    num = sum_acc(sf * qk.unsqueeze(0) * keys, -1)
    rs = rsqrt32(mean_acc(sf * sf, -1) + eps)
    rk = rsqrt32(mean_acc(keys * keys, -1) + eps)
    dot = num * rs * rk * torch.tensor(D ** -0.5, dtype=F32)
    gate = sigmoid32(torch.sign(dot) * sqrt32(dot.abs().clamp_min(1e-6)))
    return (sf + gate.unsqueeze(-1) * value.unsqueeze(1)).to(BF16)


# ----------------------------------------------------------------------------
# Whole forward (§2, §6.2)
# ----------------------------------------------------------------------------

def forward(cfg, ckpt, tokens, log=None):
    """Prefill forward of `tokens` from position 0. Returns (fp32 logits [S, vocab],
    trace with 'routing' {layer: [[expert ids asc] per token]} and 'index'
    {layer: compressed index list [S, K]})."""
    torch.use_deterministic_algorithms(True)
    S = len(tokens)
    n = cfg.hc_mult
    tok = torch.tensor(tokens, dtype=torch.int64)
    assert tok.min() >= 0 and tok.max() < cfg.vocab, "token id out of range"
    emb = ckpt.get("embed.weight")[tok]  # BF16
    streams = emb.unsqueeze(1).expand(S, n, cfg.dim).contiguous()
    pre = torch.zeros(S, n, dtype=F32)
    pre[:, 0] = 1.0  # layer 0's attention: one-hot pre (§6.2)
    primes = (engram_primes(cfg.engram_layers, cfg.engram_hash_space, cfg.engram_max_ngram,
                            cfg.engram_heads) if cfg.engram_layers else {})
    for i, l in enumerate(cfg.engram_layers):
        if i < len(cfg.engram_rows):
            assert sum(primes[l]) == cfg.engram_rows[i], f"engram layer {l}: table rows mismatch"
    shared = {"kv": None, "keys": None, "topk": None, "cand": None}
    trace = {"routing": {}, "index": {}}
    for l in range(cfg.n_layers):
        role = LayerRole(cfg, l)
        if log:
            log(role.describe())
        if role.engram:
            streams = engram(cfg, ckpt, l, tokens, streams, primes)
        # attention sublayer: mixes from its own input, collapse with the lagged pre
        pre_a, post, comb = hc_mixes(cfg, ckpt, f"layers.{l}.hc_attn", streams)
        x = rms_norm(hc_collapse(streams, pre), ckpt.get(f"layers.{l}.attn_norm.weight"), cfg.norm_eps)
        streams = hc_expand(streams, attention(cfg, role, ckpt, l, x, shared, trace), post, comb)
        # FFN sublayer: collapses with the attention's pre
        pre_f, post, comb = hc_mixes(cfg, ckpt, f"layers.{l}.hc_ffn", streams)
        x = rms_norm(hc_collapse(streams, pre_a), ckpt.get(f"layers.{l}.ffn_norm.weight"), cfg.norm_eps)
        streams = hc_expand(streams, moe(cfg, ckpt, l, x, trace), post, comb)
        pre = pre_f
    h = rms_norm(hc_collapse(streams, pre), ckpt.get("norm.weight"), cfg.norm_eps)
    logits = f32_linear(h, ckpt.get("head.weight"))
    return logits, trace


# ----------------------------------------------------------------------------
# Self-tests
# ----------------------------------------------------------------------------

SPEC_MULTIPLIERS = [76632096046245, 4839876093313, 35959672319349, 73987337458391,
                    67716810739261, 51510806800915, 30921347202721, 82619226485591]


def self_test_constants():
    """Engram constants (§8.2), quantiser edge cases (§10), YaRN band (§3.2)."""
    got = (engram_multipliers(1, 99092, 4).tolist() + engram_multipliers(14, 99092, 4).tolist())
    assert got == SPEC_MULTIPLIERS, got
    bound = (np.iinfo(np.int64).max // 99092) // 2
    assert bound == 46539438283891
    pr = engram_primes([1, 14], 16_000_000, 4, 8)
    allp = pr[1] + pr[14]
    assert allp[:3] == [16000057, 16000079, 16000081], allp[:3]
    assert allp[-1] == 16000889 and len(set(allp)) == 48
    assert sum(pr[1]) == 384006168 and sum(pr[14]) == 384016682
    print("engram: multipliers (8 spec values), primes (first 16000057, last 16000889, "
          "sums 384006168/384016682): ok")
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, 6.0, 0.2, 0.3])
    assert e2m1_round(v).tolist() == [0, 1, 1, 2, 2, 4, 4, -0.0, -1, 6, 0, 0.5], e2m1_round(v)
    # act_quant: amax 448 -> scale 1; amax 449 -> scale 2 (bit-pattern ceiling)
    x = torch.zeros(2, 32)
    x[0, 0], x[1, 0], x[1, 1] = 448.0, 449.0, -3.0
    q, s = act_quant_fp8(x)
    assert s.flatten().tolist() == [1.0, 2.0] and q[1].tolist()[:2] == [224.0, -1.5], (q, s)
    z = torch.zeros(1, 32)
    assert act_quant_fp8(z)[1].item() == 2.0 ** -22  # 1e-4·(1/448) -> 2^-22
    # FP4/E4M3 scale floor: zero group -> scale 2^-9, values 0
    assert fake_quant_fp4_e4m3(torch.zeros(1, 16)).abs().sum().item() == 0
    # FP4/E8M0: amax 6 -> scale 1 exactly
    y = torch.tensor([[6.0, 1.25, 0.75] + [0.0] * 29])
    assert fake_quant_fp4_e8m0(y).float()[0, :3].tolist() == [6.0, 1.0, 1.0]
    # FP4: a NaN or +-Inf makes its whole group NaN, the other groups untouched
    for bad in (float("nan"), float("inf"), float("-inf")):
        for fq, group in ((fake_quant_fp4_e8m0, 32), (fake_quant_fp4_e4m3, 16)):
            yb = torch.ones(1, 2 * group)
            clean = fq(yb).float()
            yb[0, 3] = bad
            out = fq(yb).float()
            assert out[0, :group].isnan().all(), (fq, bad, out)
            assert torch.equal(out[0, group:], clean[0, group:]), (fq, bad, out)

    class _C:  # YaRN band for θ = 160000, d = 64 (§3.2)
        rope_dim, rope_theta, compress_rope_theta = 64, 10000.0, 160000.0
        rope_factor, beta_fast, beta_slow, original_seq_len = 16.0, 32.0, 1.0, 65536
    assert Rope(_C, 2).band == (15, 25)
    # stable top-k: ties to the lower index
    assert stable_topk(torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0]), 3).tolist() == [1, 2, 4]
    # attention: all -1 indices give zeros
    qq = torch.ones(1, 2, 64, dtype=BF16)
    o = sparse_attention(qq, torch.ones(3, 64, dtype=BF16), torch.tensor([[-1, -1]]), torch.zeros(2))
    assert o.abs().sum().item() == 0
    print("quantisers, YaRN band (15, 25), tie rule, empty attention: ok")


def calc_diff(x, y):
    """kernels.md §8.1: 1 − 2·Σ(x·y) / (Σx² + Σy²) in fp64."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    return 0.0 if den == 0 else float(1 - 2 * (x * y).sum() / den)


def self_test_kernels():
    """Cross-check the emulated kernels against plain fp64 formulas on random data."""
    g = torch.Generator().manual_seed(0)
    # §10.4 block GEMM == the fp64 product of the dequantised operands (up to fp32 rounding)
    x = (torch.randn(5, 128, generator=g) * 3).to(BF16)
    w = QWeight(to_e4m3_saturating(torch.randn(64, 128, generator=g) * 100).float(),
                torch.exp2(torch.randint(-12, -4, (64, 4), generator=g).float()))
    q, s = act_quant_fp8(x)
    got = block_gemm(q, s, w)
    deq_x = (q.reshape(5, 4, 32) * s.unsqueeze(-1)).reshape(5, 128).double()
    deq_w = (w.values.reshape(64, 4, 32) * w.scale.unsqueeze(-1)).reshape(64, 128).double()
    ref = deq_x @ deq_w.T
    assert ((got.double() - ref).abs() <= ref.abs() * 2 ** -20 + 1e-30).all()
    assert calc_diff(deq_x.float(), x.float()) < 1e-3  # FP8 activations: e4m3 error only
    # §3.10 attention == exact softmax with sink (BF16 rounding of p only)
    S, H, hd, R = 6, 3, 64, 20
    qq = torch.randn(S, H, hd, generator=g).to(BF16)
    rows = torch.randn(R, hd, generator=g).to(BF16)
    idx = torch.randint(-1, R, (S, 150), generator=g)
    sink = torch.randn(H, generator=g)
    o = sparse_attention(qq, rows, idx, sink)
    valid = idx >= 0
    kk = rows[idx.clamp_min(0)].double()
    lg = torch.einsum("shd,sld->shl", qq.double(), kk) * hd ** -0.5
    lg = lg.masked_fill(~valid.unsqueeze(1), float("-inf"))
    mx = torch.maximum(lg.amax(-1), sink.double().unsqueeze(0))
    pr = torch.exp(lg - mx.unsqueeze(-1))
    den = pr.sum(-1) + torch.exp(sink.double().unsqueeze(0) - mx)
    ref = torch.einsum("shl,sld->shd", pr, kk) / den.unsqueeze(-1)
    assert calc_diff(o.float(), ref.float()) < 1e-4, calc_diff(o.float(), ref.float())
    # §3.2 inverse RoPE undoes RoPE (up to BF16 rounding)
    class _C:
        rope_dim, rope_theta, compress_rope_theta = 16, 10000.0, 160000.0
        rope_factor, beta_fast, beta_slow, original_seq_len = 16.0, 32.0, 1.0, 65536
    rope = Rope(_C, 1)
    xx = torch.randn(7, 2, 32, generator=g).to(BF16)
    pos = torch.arange(7) * 1000
    back = rope.apply(rope.apply(xx, pos), pos, inverse=True)
    assert torch.equal(back[..., :16], xx[..., :16]) and calc_diff(back.float(), xx.float()) < 1e-4
    # §10.3 FP4 fake quantisers: values on the grid, relative error bounded
    yy = torch.randn(4, 64, generator=g).to(BF16)
    for fq in (fake_quant_fp4_e8m0, fake_quant_fp4_e4m3):
        assert calc_diff(fq(yy).float(), yy.float()) < 2e-2
    print("kernel cross-checks (block GEMM, attention, RoPE inverse, FP4): ok")


def smoke_and_causality(cfg, ckpt, n_tokens=40, prefix=24, seed=1234):
    """Run a pseudo-random prompt, check finite/non-flat logits, then assert that a
    prefix prompt reproduces the first rows bit for bit (causality)."""
    g = np.random.default_rng(seed)
    tokens = g.integers(3, cfg.vocab, size=n_tokens).tolist()
    logits, trace = forward(cfg, ckpt, tokens)
    assert torch.isfinite(logits).all(), "non-finite logits"
    std = logits.std(dim=-1)
    assert (std > 0).all(), "flat logits row"
    print(f"smoke: S={n_tokens} logits {tuple(logits.shape)} finite, per-row std "
          f"min {std.min().item():.4g} max {std.max().item():.4g}, argmax {logits.argmax(-1)[:8].tolist()}...")
    for cut in sorted({prefix, 1, 5, cfg.window + 1}):
        if cut >= n_tokens:
            continue
        lp, tp = forward(cfg, ckpt, tokens[:cut])
        assert torch.equal(lp, logits[:cut]), (
            f"causality: prefix {cut} differs (max |diff| {(lp - logits[:cut]).abs().max().item()})")
        for l, r in tp["routing"].items():
            assert r == trace["routing"][l][:cut], f"routing differs at layer {l} for prefix {cut}"
        print(f"causality: prefix of {cut} tokens == first {cut} rows of the {n_tokens}-token run "
              "(logits bitwise, routing identical)")
    return logits, trace


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", help="directory with config.json (HF, nested text_config)")
    ap.add_argument("--ckpt-dir", help="directory with the *.safetensors shards (default: model dir)")
    ap.add_argument("--tokens", help="comma-separated prompt token ids")
    ap.add_argument("--out", help="logits output: raw little-endian f32 [S, vocab], or .npy")
    ap.add_argument("--dump-routing", help="JSON: selected expert ids (ascending) per layer and token")
    ap.add_argument("--dump-index", help="JSON: compressed index list per ratio>0 layer and query")
    ap.add_argument("--compare", help="another logits file (raw f32 or .npy) to compare with ours")
    ap.add_argument("--compare-routing", help="another routing JSON (same format) to compare with ours")
    ap.add_argument("--self-test", action="store_true",
                    help="check constants/quantisers; with a model, also smoke + causality")
    ap.add_argument("--accumulate", choices=["seq", "fp64"], default="seq",
                    help="order-free sums: fp32 in index order (default) or fp64 rounded once")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    global ACCUMULATE
    ACCUMULATE = a.accumulate

    cfg = ckpt = None
    if a.model_dir:
        cfg = Config.from_model_dir(a.model_dir)
        ckpt = Checkpoint(a.ckpt_dir or a.model_dir)
    if a.self_test:
        self_test_constants()
        self_test_kernels()
        if cfg is not None:
            smoke_and_causality(cfg, ckpt)
        print("self-test: all checks passed")
        return 0
    if cfg is None or not a.tokens or not a.out:
        ap.error("--model-dir, --tokens and --out are required")
    tokens = [int(t) for t in a.tokens.replace(" ", "").split(",") if t]
    logits, trace = forward(cfg, ckpt, tokens, log=(lambda m: print(m, file=sys.stderr)) if a.verbose else None)
    arr = logits.numpy().astype("<f4")
    if a.out.endswith(".npy"):
        np.save(a.out, arr)
    else:
        arr.tofile(a.out)
    if a.dump_routing:
        with open(a.dump_routing, "w") as fh:
            json.dump({"n_layers": cfg.n_layers, "n_tokens": len(tokens),
                       "experts": [trace["routing"][l] for l in range(cfg.n_layers)]}, fh)
    if a.dump_index:
        with open(a.dump_index, "w") as fh:
            json.dump({"window_offset": len(tokens),
                       "layers": {str(l): v.tolist() for l, v in trace["index"].items()}}, fh)
    if a.compare:
        other = (np.load(a.compare) if a.compare.endswith(".npy")
                 else np.fromfile(a.compare, dtype="<f4")).reshape(arr.shape)
        o = torch.from_numpy(np.ascontiguousarray(other))
        agree = (o.argmax(-1) == logits.argmax(-1)).float().mean().item()
        print(f"compare: calc_diff {calc_diff(logits, o):.3e}, max |diff| "
              f"{(logits - o).abs().max().item():.4g}, argmax agreement {agree:.3f}")
    if a.compare_routing:
        with open(a.compare_routing) as fh:
            theirs = json.load(fh)["experts"]
        total = same = 0
        first = None
        for l in range(cfg.n_layers):
            for t, ours in enumerate(trace["routing"][l]):
                total += 1
                ok = sorted(theirs[l][t]) == ours
                same += ok
                if not ok and first is None:
                    first = (l, t, ours, theirs[l][t])
        print(f"compare routing: {same}/{total} (layer, token) expert sets equal"
              + (f"; first difference layer {first[0]} token {first[1]}: ours {first[2]} theirs {first[3]}"
                 if first else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
