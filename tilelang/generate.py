#!/usr/bin/env python3
"""Lower deepinfer's TileLang programs to CUDA C++ source, without a GPU.

    python tilelang/generate.py --out-dir DIR [--check] [--compile] [--nvcc PATH]

For every program in PROGRAMS and every arch in ARCHS this writes
`DIR/<name>.<arch>.cu`. One file per arch is always written, even when two
archs happen to lower to the same text, so the build can pick files by name.
(TileLang does lower differently per arch: on sm_100a it vectorises fp32 math
into packed fp32x2 helpers.)

Each file gets a header naming the TileLang version, the source program and
target, the kernel entry point with its C parameters, and its launch geometry.
The `#include <tl_templates/cuda/...>` lines TileLang emits are replaced by
our own `#include "deepinfer_tl/compat.cuh"` (tilelang/include), so the files
compile with the pinned nvcc alone:

    nvcc -fatbin -gencode=arch=compute_90a,code=sm_90a -I tilelang/include -I kernels-cuda/include \
         tilelang/generated/act_quant_fp8.sm_90a.cu -o act_quant_fp8.sm_90a.fatbin

(never with --use_fast_math / -ftz=true). The output is deterministic: no
timestamps, no absolute paths, no #line directives. Every entry point's
body opens with `DI_PDL_ENTRY();` (inserted here; kernels-cuda/README.md,
"Programmatic dependent launch"), as every hand-written kernel's does.

--check   regenerate in memory and compare with DIR; exit 1 listing every
          stale, missing or unexpected .cu file (writes nothing).
--compile also compile each generated file with nvcc (-cubin for its arch)
          into a temporary directory; exit 1 on failure. nvcc is --nvcc, else
          $DEEPINFER_CUDA_ROOT/bin/nvcc, else `nvcc` on PATH.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
INCLUDE_DIR = HERE / "include"
# compat.cuh includes deepinfer/async_copy.cuh from the hand-written kernels' headers.
KERNELS_INCLUDE_DIR = REPO / "kernels-cuda" / "include"
COMPAT_INCLUDE = '#include "deepinfer_tl/compat.cuh"'

ARCHS = ("sm_90a", "sm_100a")


@dataclass(frozen=True)
class Program:
    name: str     # output file stem
    module: str   # module in tilelang/ holding the builder
    builder: str  # function returning the PrimFunc


PROGRAMS = (
    Program("act_quant_fp8", "act_quant_fp8", "act_quant_fp8"),
    Program("rms_norm_act_quant_fp8", "rms_norm_act_quant_fp8", "rms_norm_act_quant_fp8"),
    Program("swiglu_act_quant_fp8", "swiglu_act_quant_fp8", "swiglu_act_quant_fp8"),
    Program("rope", "rope", "rope"),
    Program("moe_route", "moe_route", "moe_route"),
    Program("moe_layout", "moe_layout", "moe_layout"),
    Program("mhc", "mhc", "mhc_expand"),
    Program("mhc_pre", "mhc_pre", "mhc_pre"),
    Program("mhc_split", "mhc_split", "mhc_split"),
    Program("mhc_expand_pre", "mhc_expand_pre", "mhc_expand_pre"),
)


def lower_to_cuda(prim_func, arch: str) -> str:
    """Lower with TileLang, device compile off (works without a GPU/driver)."""
    return lower(prim_func, arch)[0]


def lower(prim_func, arch: str) -> tuple[str, int]:
    """(CUDA source, dynamic shared memory bytes the kernel needs at launch)."""
    import tilelang
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": arch})
    # LayoutInference needs the target entered as a context as well.
    with tilelang.transform.PassContext(opt_level=3), target:
        artifact = tilelang.lower(prim_func, target=target, enable_device_compile=False)
    source = str(artifact.kernel_source or "")
    if not source.strip():
        raise RuntimeError("TileLang produced empty kernel source")
    dyn_smem = 0
    for _, func in artifact.device_mod.functions.items():
        if func.attrs is not None and "dyn_shared_memory_buf" in func.attrs:
            dyn_smem = max(dyn_smem, int(func.attrs["dyn_shared_memory_buf"]))
    return source, dyn_smem


_TL_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]tl_templates/[^>"]+[>"]\s*$')


def rewrite_includes(source: str) -> str:
    """Swap TileLang's runtime-header includes for our compat header."""
    out: list[str] = []
    lines = source.splitlines()
    inserted = False
    i = 0
    while i < len(lines):
        line = lines[i]
        # `#ifdef ENABLE_BF16` blocks that only include tl_templates go away.
        if line.strip().startswith("#ifdef") and i + 2 < len(lines):
            j = i + 1
            while j < len(lines) and _TL_INCLUDE.match(lines[j]):
                j += 1
            if j > i + 1 and j < len(lines) and lines[j].strip() == "#endif":
                i = j + 1
                continue
        if _TL_INCLUDE.match(line):
            if not inserted:
                out.append(COMPAT_INCLUDE)
                inserted = True
        else:
            out.append(line)
        i += 1
    text = "\n".join(out) + "\n"
    leftovers = [w for w in ("tl_templates", "cutlass", "cute/") if w in text]
    if leftovers:
        raise RuntimeError(f"generated source still refers to {leftovers}; extend rewrite_includes/compat.cuh")
    if not inserted:
        text = COMPAT_INCLUDE + "\n" + text
    return text


_ENTRY = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\(([^)]*)\)\s+)?(\w+)\s*\(([^)]*)\)\s*\{'
)


def entry_points(source: str) -> list[tuple[str, str, str]]:
    """(name, parameter list, launch bounds) of every extern "C" kernel definition."""
    found = [(m.group(2), " ".join(m.group(3).split()), m.group(1) or "") for m in _ENTRY.finditer(source)]
    if not found:
        raise RuntimeError('no extern "C" __global__ kernel definition in generated source')
    return found


def insert_pdl_entry(source: str) -> str:
    """Open every extern "C" kernel definition's body with DI_PDL_ENTRY();
    (before anything TileLang emitted, so nothing touches global memory
    before the wait), as build/cuda.rs expects of a programmatic dependent."""
    out, last = [], 0
    for m in _ENTRY.finditer(source):
        out.append(source[last : m.end()])
        out.append("\n  DI_PDL_ENTRY();")
        last = m.end()
    if not out:
        raise RuntimeError('no extern "C" __global__ kernel definition in generated source')
    out.append(source[last:])
    return "".join(out)


def header(prog: Program, arch: str, version: str, entries, launch: dict) -> str:
    lines = [
        "// Generated by tilelang/generate.py -- DO NOT EDIT; regenerate instead:",
        "//   python tilelang/generate.py --out-dir tilelang/generated",
        f"// Source program: tilelang/{prog.module}.py ({prog.builder}())",
        f"// TileLang {version}, target {{\"kind\": \"cuda\", \"arch\": \"{arch}\"}}",
        "// TileLang's tl_templates includes are replaced by deepinfer_tl/compat.cuh;",
        "// every entry point opens with DI_PDL_ENTRY() (deepinfer/pdl.cuh).",
        f"// Build: nvcc -fatbin -gencode=arch=compute_{arch[3:]},code={arch} -I tilelang/include -I kernels-cuda/include <this file>",
        "//        (no --use_fast_math / -ftz=true)",
    ]
    for name, params, bounds in entries:
        lines.append(f'// Entry point: extern "C" __global__ void {name}({params})')
        if bounds:
            lines.append(f"//   __launch_bounds__({bounds})")
    for key in ("grid", "block", "dynamic_smem", "alignment"):
        if key in launch:
            lines.append(f"// {key}: {launch[key]}")
    return "\n".join(lines) + "\n\n"


def generate(arch_filter=None) -> dict[str, tuple[str, list]]:
    """Return {file name: (text, entry points)} for all programs and archs."""
    import tilelang

    sys.dont_write_bytecode = True  # keep tilelang/ free of __pycache__
    sys.path.insert(0, str(HERE))
    files: dict[str, tuple[str, list]] = {}
    for prog in PROGRAMS:
        mod = importlib.import_module(prog.module)
        launch = mod.launch_info() if hasattr(mod, "launch_info") else {}
        for arch in ARCHS:
            if arch_filter and arch not in arch_filter:
                continue
            prim_func = getattr(mod, prog.builder)()
            source, dyn_smem = lower(prim_func, arch)
            # Our launchers pass the dynamic shared memory size by hand (there
            # is no TileLang host code): the program must state it correctly.
            stated = launch.get("dynamic_smem_bytes", 0)
            if dyn_smem != stated:
                raise RuntimeError(
                    f"{prog.module}: the kernel needs {dyn_smem} bytes of dynamic shared memory at "
                    f"{arch}, launch_info() states {stated} (dynamic_smem_bytes)"
                )
            body = insert_pdl_entry(rewrite_includes(source))
            entries = entry_points(body)
            text = header(prog, arch, tilelang.__version__, entries, launch) + body
            files[f"{prog.name}.{arch}.cu"] = (text, entries)
    return files


def find_nvcc(explicit: str | None) -> str:
    if explicit:
        return explicit
    root = os.environ.get("DEEPINFER_CUDA_ROOT")
    if root and (Path(root) / "bin" / "nvcc").exists():
        return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if not found:
        raise SystemExit("error: nvcc not found (use --nvcc or set DEEPINFER_CUDA_ROOT)")
    return found


def compile_check(nvcc: str, files: dict[str, tuple[str, list]]) -> list[str]:
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for fname, (text, _) in sorted(files.items()):
            arch = fname.rsplit(".", 2)[-2]
            src = Path(tmp) / fname
            src.write_text(text)
            cmd = [nvcc, "-cubin", f"-gencode=arch=compute_{arch[3:]},code={arch}",
                   "-I", str(INCLUDE_DIR), "-I", str(KERNELS_INCLUDE_DIR), str(src), "-o", str(Path(tmp) / (fname + ".cubin"))]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                failures.append(fname)
                print(f"nvcc failed for {fname}:\n{res.stdout}{res.stderr}", file=sys.stderr)
            else:
                print(f"nvcc ok: {fname}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, type=Path, help="directory for <name>.<arch>.cu files")
    ap.add_argument("--check", action="store_true", help="compare with DIR instead of writing; exit 1 if stale")
    ap.add_argument("--compile", action="store_true", help="also compile every generated file with nvcc")
    ap.add_argument("--nvcc", help="nvcc to use with --compile")
    args = ap.parse_args(argv)

    files = generate()
    for fname, (_, entries) in sorted(files.items()):
        for name, params, bounds in entries:
            lb = f" __launch_bounds__({bounds})" if bounds else ""
            print(f"{fname}: extern \"C\" __global__{lb} void {name}({params})")

    status = 0
    out_dir: Path = args.out_dir
    if args.check:
        stale = []
        for fname, (text, _) in sorted(files.items()):
            path = out_dir / fname
            if not path.exists():
                stale.append(f"{path} (missing)")
            elif path.read_text() != text:
                stale.append(f"{path} (differs)")
        if out_dir.is_dir():
            for path in sorted(out_dir.glob("*.cu")):
                if path.name not in files:
                    stale.append(f"{path} (not generated by any program)")
        if stale:
            print("stale generated files:", file=sys.stderr)
            for s in stale:
                print(f"  {s}", file=sys.stderr)
            status = 1
        else:
            print(f"{out_dir}: {len(files)} files up to date")
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        for fname, (text, _) in sorted(files.items()):
            path = out_dir / fname
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path}")
            else:
                print(f"unchanged {path}")

    if args.compile:
        if compile_check(find_nvcc(args.nvcc), files):
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
