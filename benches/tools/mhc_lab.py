#!/usr/bin/env python3
"""Kernel lab for the mHC front's pass 1 and the fused single-pass step
(tilelang/mhc_pre.py, tilelang/mhc_expand_pre.py).

Loads cubin variants of `deepinfer_mhc_pre_kernel` and
`deepinfer_mhc_expand_pre_kernel` that share the committed kernels'
signatures (each lowered from a variant of the TileLang program by
tilelang/generate.py's `lower` and compiled with nvcc -cubin for sm_90a;
see below), launches them through the
driver API on torch buffers, and times each from a CUDA graph of max(20, copies) launches
(median of 15), beside the committed expand kernel (`mhc.py`) followed by
the first pass-1 variant: the two-kernel path the fused one replaces.

Checks, at every size, before timing:
- u (and the fused kernel's new streams) bit for bit against torch's own
  rounding of the same operation order (float32 ops, one rounding each);
- the partial sums `part` [chunks, T, 25] of every variant against float64
  sums of the same chunks: the largest error relative to the chunk's sum of
  |terms|, reported; over 1e-4 is marked bad (fp32 accumulation over 512
  terms stays far below it; the lab's three BF16 terms make every product
  exact).

    VARIANTS=fma,tc ROWS=64,4096,16384 python3 mhc_lab.py   # <variant>.pre.cubin,
                                                            # <variant>.fused.cubin beside it

`benches/tools/mhc_lab_cubins.sh [OUT] [NAME=REV[+PATCH...] ...]` builds the
cubins (sm_90a: each variant from a commit, with lab patches on top if
given; expand.cubin from the first), writes variants.json (their shared
memory sizes, in order: the first is the base the others are compared
with) and copies this script beside them.

Prints one line per (rows, variant) and writes $OUT/mhclab.json.
"""
import ctypes, os, json
import torch

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


torch.cuda.init()
torch.zeros(1, device="cuda")
HERE = os.path.dirname(os.path.abspath(__file__))
D = 5120
N_VEC = D // 8
CHUNKS = -(-N_VEC // 16)
EXPAND_THREADS = 128  # mhc.py's THREADS
# Each variant's launch geometry for pass 1 and the fused kernel, read by
# mhc_lab_cubins.sh from the generated sources' headers (variants.json, in
# build order): {"pre": [smem bytes, threads, tokens a CTA], "fused": [...]}.
with open(os.path.join(HERE, "variants.json")) as f:
    GEOM_OF = json.load(f)
NAMES = {"pre": b"deepinfer_mhc_pre_kernel", "fused": b"deepinfer_mhc_expand_pre_kernel",
         "expand": b"deepinfer_mhc_expand_kernel"}


def load(path, name):
    mod = ctypes.c_void_p()
    fn = ctypes.c_void_p()
    ck(cu.cuModuleLoad(ctypes.byref(mod), path.encode()), "load " + path)
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name), "function " + name.decode())
    return fn


def smem_optin(fn, smem):
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
    ck(cu.cuFuncSetAttribute(fn, 8, ctypes.c_int(smem)), "smem attribute")


def occ(fn, geom):
    n = ctypes.c_int()
    ck(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, geom[1], ctypes.c_size_t(geom[0])), "occ")
    return n.value


def launch(fn, grid, threads, smem, args):
    """args: ctypes values (c_uint64 addresses, c_int sizes) in the kernel's order."""
    ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in args])
    stream = torch.cuda.current_stream().cuda_stream
    ck(cu.cuLaunchKernel(fn, grid[0], grid[1], 1, threads, 1, 1, smem, ctypes.c_void_p(stream), ptrs, None), "launch")


def p(t):
    return ctypes.c_uint64(t.data_ptr())


def i32(v):
    return ctypes.c_int(v)


variants = os.environ["VARIANTS"].split(",") if "VARIANTS" in os.environ else list(GEOM_OF)
fns, geom = {}, {}
for v in variants:
    for kind in ("pre", "fused"):
        path = os.path.join(HERE, f"{v}.{kind}.cubin")
        if os.path.exists(path):
            fns[(v, kind)] = load(path, NAMES[kind])
            geom[(v, kind)] = GEOM_OF[v][kind]
            smem_optin(fns[(v, kind)], geom[(v, kind)][0])
expand = load(os.path.join(HERE, "expand.cubin"), NAMES["expand"])


def run_pre(fn, g, s, hc_fn, lag, u, part, t):
    # TileLang's order: hc_fn, part, pre_in, streams, u; n_chunks, n_tokens, n_vec.
    launch(fn, (CHUNKS, -(-t // g[2])), g[1], g[0],
           [p(hc_fn), p(part), p(lag), p(s), p(u), i32(CHUNKS), i32(t), i32(N_VEC)])


def run_fused(fn, g, s, f, post, comb, hc_fn, lag, out, u, part, t):
    # comb, f, hc_fn, out, part, post, pre_in, streams, u; n_chunks, n_tokens, n_vec.
    launch(fn, (CHUNKS, -(-t // g[2])), g[1], g[0],
           [p(comb), p(f), p(hc_fn), p(out), p(part), p(post), p(lag), p(s), p(u), i32(CHUNKS), i32(t), i32(N_VEC)])


def run_expand(s, f, post, comb, out, t):
    # comb, f, out, post, streams; n_tokens, n_vec: grid (T, ceil(n_vec / 256)).
    launch(expand, (t, -(-N_VEC // 256)), EXPAND_THREADS, 0,
           [p(comb), p(f), p(out), p(post), p(s), i32(t), i32(N_VEC)])


def ref_expand(s, f, post, comb):
    """mhc.py's order in float32, every op rounded once."""
    sf, ff = s.float(), f.float()
    c = comb.view(-1, 4, 4)
    out = []
    for d in range(4):
        m = c[:, 0, d, None] * sf[:, 0]
        for j in range(1, 4):
            m = m + c[:, j, d, None] * sf[:, j]
        out.append((post[:, d, None] * ff + m).bfloat16())
    return torch.stack(out, 1)


def ref_collapse(s, lag):
    sf = s.float()
    a = torch.zeros_like(sf[:, 0]) + lag[:, 0, None] * sf[:, 0]
    for i in range(1, 4):
        a = a + lag[:, i, None] * sf[:, i]
    return a.bfloat16()


def ref_part(s, hc_fn, t):
    """float64 chunk sums [chunks, T, 25] and the chunk sums of |terms|."""
    x = s.double().view(t, 4, CHUNKS, 128)
    w = hc_fn.double().view(24, 4, CHUNKS, 128)
    dots = torch.einsum("tick,rick->ctr", x, w)
    mags = torch.einsum("tick,rick->ctr", x.abs(), w.abs())
    sq = (x * x).sum((1, 3)).t().unsqueeze(-1)
    return torch.cat([dots, sq], -1), torch.cat([mags, sq], -1)


def timeit(f):
    for i in range(10):
        f(i)
    ts = []
    for _ in range(15):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(20):
            f(i)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / 20)
    return sorted(ts)[len(ts) // 2]


def graphed(body, copies):
    """µs a launch: a graph of max(20, copies) launches (every input copy
    once, so none stays in L2), replayed."""
    n = max(20, copies)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            body(i % copies)
    # timeit's batches are 20 calls: one replay each.
    return timeit(lambda i: g.replay() if i % 20 == 0 else None) * 20 / n


res = []
hc_fn = (torch.rand(24, 4 * D, device="cuda") - 0.5) * 0.1
for t in [int(r) for r in os.environ.get("ROWS", "1,64,256,4096,16384").split(",")]:
    # One copy: streams (8·t·D bytes), f (2·t·D) and small vectors.
    copies = max(2, min(64, (512 << 20) // (t * D * 10 + 1)))
    xs = [((torch.randn(t, 4, D, device="cuda")).bfloat16(), (torch.randn(t, D, device="cuda")).bfloat16(),
           torch.rand(t, 4, device="cuda") * 2, (torch.rand(t, 16, device="cuda") - 0.5) * 3,
           torch.rand(t, 4, device="cuda") * 1.5 + 0.25) for _ in range(copies)]
    u = torch.empty(t, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(t, 4, D, dtype=torch.bfloat16, device="cuda")
    part = torch.empty(CHUNKS, t, 25, device="cuda")
    s0, f0, post0, comb0, lag0 = xs[0]
    want_s = ref_expand(s0, f0, post0, comb0)
    want_u = {"pre": ref_collapse(s0, lag0), "fused": ref_collapse(want_s, lag0)}
    want_p = {"pre": ref_part(s0, hc_fn, t), "fused": ref_part(want_s, hc_fn, t)}
    pre_bytes = 2 * 4 * t * D + 2 * t * D + 4 * 24 * 4 * D + 4 * 4 * t + 4 * 25 * CHUNKS * t
    fused_bytes = pre_bytes + 2 * t * D + 2 * 4 * t * D + 4 * 20 * t
    src = torch.empty(fused_bytes // 8, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    copy_us = timeit(lambda i: dst.copy_(src))
    first_pre = None
    for (v, kind), fn in fns.items():
        nb = geom[(v, kind)]
        u.fill_(float("nan"))
        part.fill_(float("nan"))
        out.fill_(float("nan"))
        if kind == "pre":
            run_pre(fn, nb, s0, hc_fn, lag0, u, part, t)
        else:
            run_fused(fn, nb, s0, f0, post0, comb0, hc_fn, lag0, out, u, part, t)
        torch.cuda.synchronize()
        u_ok = bool(torch.equal(u.view(torch.int16), want_u[kind].view(torch.int16)))
        s_ok = kind == "pre" or bool(torch.equal(out.view(torch.int16), want_s.view(torch.int16)))
        ref, mag = want_p[kind]
        err = ((part.double() - ref).abs() / mag.clamp_min(1e-30)).max().item()
        if kind == "pre":
            first_pre = first_pre or (fn, nb, v)
            us = graphed(lambda i: run_pre(fn, nb, xs[i][0], hc_fn, xs[i][4], u, part, t), copies)
            nbytes = pre_bytes
        else:
            us = graphed(lambda i: run_fused(fn, nb, xs[i][0], xs[i][1], xs[i][2], xs[i][3], hc_fn, xs[i][4],
                                             out, u, part, t), copies)
            nbytes = fused_bytes
        gbps = nbytes / us / 1e3
        copy_gbps = (fused_bytes // 8 * 4 * 2) / copy_us / 1e3
        print(f"T {t:6d} {v:>6} {kind:>5} ctas/sm {occ(fn, nb)}: {us:9.2f} us {gbps:6.0f} GB/s "
              f"({100 * gbps / copy_gbps:5.1f}% of copy {copy_gbps:.0f}) u_bitwise {u_ok} s_bitwise {s_ok} "
              f"part_rel_err {err:.2e}{'' if err < 1e-4 else ' BAD'}")
        res.append(dict(rows=t, variant=v, kernel=kind, us=us, gbps=gbps, copy_gbps=copy_gbps,
                        ctas_per_sm=occ(fn, nb), u_bitwise=u_ok, s_bitwise=s_ok, part_rel_err=err))
    if first_pre is not None:
        us = graphed(lambda i: (run_expand(xs[i][0], xs[i][1], xs[i][2], xs[i][3], out, t),
                                run_pre(first_pre[0], first_pre[1], out, hc_fn, xs[i][4], u, part, t)), copies)
        print(f"T {t:6d} expand + {first_pre[2]} pass 1 (the two-kernel path): {us:9.2f} us")
        res.append(dict(rows=t, variant="expand+" + first_pre[2], kernel="two", us=us))
    del xs
out_dir = os.environ.get("OUT", ".")
os.makedirs(out_dir, exist_ok=True)
json.dump(res, open(out_dir + "/mhclab.json", "w"), indent=1)
