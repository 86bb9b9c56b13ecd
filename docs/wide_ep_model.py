"""The arithmetic of docs/wide-ep.md: a V4.1-Flash decode step on one GPU of
an expert-parallel group (DP attention, EP MoE), from the checkpoint's shapes
(v41-flash.md §1, §12), this repo's H200 GEMM bench
(benches/results/2026-12-01-h200-gemm.json) and published communication
figures (kernels.md §3.2). Run: python3 docs/wide_ep_model.py"""

LAYERS, D, TOP_K, EXPERTS, INTER = 40, 5120, 6, 384, 2304
MB = 1e6

# Bytes read per step per GPU, not counting the routed experts.
fp8 = lambda n, k: n * k + (n // 32) * (k // 32)  # FP8 weight + 32x32 E8M0 scales
dense_layer = (
    fp8(1280, D) + fp8(32768, 1280) + fp8(512, D)      # wq_a, wq_b, wkv
    + 8192 * 4096 * 2                                    # wo_a (BF16 after load)
    + fp8(D, 8192)                                       # wo_b
    + 2 * fp8(INTER, D) + fp8(D, INTER)                  # shared expert
    + EXPERTS * D * 2 + 2 * 24 * 4 * D * 4               # gate (BF16), hc_attn/ffn_fn (F32)
)
extra = (3 * 2 + 1) * 512 * D * 2 + 8 * (fp8(4096, 1280) + 32 * D * 2)  # compressors, indexers
head = 129280 * D * 2                                     # BF16 head
engram = 2 * fp8(25600, 6144)                             # Engram wkv, layers 1 and 14
dense = LAYERS * dense_layer + extra + head + engram
expert = 2 * (INTER * D // 2 + INTER * D // 32) + (D * INTER // 2 + D * INTER // 32)

# FLOPs per token.
f_dense = LAYERS * 2 * (1280 * D + 32768 * 1280 + 512 * D + 8192 * 4096 + D * 8192 + 3 * INTER * D)
f_attn = LAYERS * 64 * 640 * 512 * 2 * 2                # QK and PV over 640 keys, 64 heads
f_head = 2 * 129280 * D
f_moe = LAYERS * TOP_K * 3 * 2 * INTER * D
kv_per_token = LAYERS * 640 * 584                       # 640 rows of the 584-byte FP8 layout
# The indexer at context CTX: layers 2, 8, 14 score CTX/2 keys, layer 20 CTX,
# the Reindex layers 24..36 their 16,384 candidates; a key is 128 FP4 values
# with 4 E8M0 scales (68 B) and costs 32 heads x 128 x 2 FLOP.
CTX = 32768
index_keys = 3 * CTX // 2 + CTX + 4 * 16384
index_bytes, f_index = index_keys * 68, index_keys * 32 * 128 * 2

# The glue kernels of a layer (norms, quantisers, RoPE, ring writers, routing,
# mHC, layouts): about 20 at decode sizes, each at least ~3 us even in a graph.
GLUE_PER_LAYER, GLUE_US = 20, 3.0
COPY = 4.24e12                    # H200 copy ceiling in the same bench run (B/s)
RATES = {                         # achieved (ours, 2026-12-01) and target
    "ours": dict(fp4_bw=1.95e12, fp4_tf=275e12, dense_tf=450e12, dense_bw=2.4e12),
    "target": dict(fp4_bw=0.8 * COPY, fp4_tf=682e12, dense_tf=900e12, dense_bw=0.8 * COPY),
}

# Communication per layer: dispatch FP8 (+1/32 scales), combine BF16, per (token, expert) entry.
dispatch_bytes = lambda b: b * TOP_K * (D + D // 32)
combine_bytes = lambda b: b * TOP_K * D * 2
# Effective GB/s: DeepEP low-latency on H800 (EP 8 NVLink, EP 64/128 RDMA) and UCCL-EP on 8 x H200.
LINKS = {
    8: dict(name="NVLink, DeepEP LL (H800)", dispatch=98e9, combine=127e9),
    "8u": dict(name="NVLink, UCCL-EP (8 x H200)", dispatch=320e9, combine=320e9),
    64: dict(name="RDMA, DeepEP LL", dispatch=43e9, combine=46e9),
    128: dict(name="RDMA, DeepEP LL", dispatch=39e9, combine=39e9),
}


def slots(ep):
    return EXPERTS // ep + (1 if ep > 8 else 0)  # one redundant expert per GPU past one node


def step(ep, link, b, rates):
    r = RATES[rates]
    s = slots(ep)
    moe_bytes = LAYERS * s * expert
    t_dense = max(dense / r["dense_bw"], b * (f_dense + f_head) / r["dense_tf"])
    t_attn = b * (kv_per_token + index_bytes) / COPY + b * (f_attn + f_index) / 500e12
    t_moe = max(moe_bytes / r["fp4_bw"], b * f_moe / r["fp4_tf"])
    t_comp = t_dense + t_attn + t_moe + LAYERS * GLUE_PER_LAYER * GLUE_US * 1e-6
    l = LINKS[link]
    t_comm = LAYERS * (dispatch_bytes(b) / l["dispatch"] + combine_bytes(b) / l["combine"])
    return s, moe_bytes, t_comp, t_comm


if __name__ == "__main__":
    print(f"dense bytes per step {dense / 1e9:.2f} GB (layer {dense_layer / MB:.1f} MB); expert {expert / MB:.2f} MB")
    print(f"FLOP per token: dense {f_dense / 1e9:.1f} G, head {f_head / 1e9:.2f} G, attention {f_attn / 1e9:.2f} G, MoE {f_moe / 1e9:.1f} G")
    print(f"indexer at context {CTX}: {index_keys} keys, {index_bytes / MB:.1f} MB, {f_index / 1e9:.2f} GFLOP per token")
    print(f"per layer, B tokens: dispatch {dispatch_bytes(1) / 1e3:.1f} KB x B, combine {combine_bytes(1) / 1e3:.1f} KB x B")
    print("| EP | link | B | experts/GPU | expert GB | compute ms (ours / target) | comm ms | serial tok/s (ours) | 2-µbatch tok/s (ours / target) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ep, link in [(8, 8), (8, "8u"), (64, 64), (128, 128)]:
        for b in (32, 64, 128, 256):
            s, mb, tc, tm = step(ep, link, b, "ours")
            _, _, tt, _ = step(ep, link, b, "target")
            serial = b / (tc + tm)
            # Two micro-batches of b/2: one's communication hides under the
            # other's compute, but each half reads every weight again.
            h, ht = step(ep, link, b // 2, "ours")[2], step(ep, link, b // 2, "target")[2]
            over = b / max(2 * h, tm)
            over_t = b / max(2 * ht, tm)
            print(f"| {ep} | {LINKS[link]['name']} | {b} | {s} | {mb / 1e9:.2f} | {tc * 1e3:.2f} / {tt * 1e3:.2f} | {tm * 1e3:.2f} | {serial:,.0f} | {over:,.0f} / {over_t:,.0f} |")
