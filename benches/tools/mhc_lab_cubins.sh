#!/usr/bin/env bash
# Builds the sm_90a cubins that benches/tools/mhc_lab.py times, into OUT
# (default .dev/mhclab), with the pinned nvcc ($DEEPINFER_CUDA_ROOT/bin/nvcc
# after `source` of scripts/setup's output, or $NVCC):
#   fma.pre / fma.fused  the committed pass 1 and fused kernels (tilelang/generated)
#   tc.pre / tc.fused    the tensor-core lab (tilelang/labs/2026-12-05-mhc-tensor-cores.patch,
#                        applied to HEAD in a temporary worktree; the patch carries its
#                        generated sources, so no TileLang is needed)
#   expand               the committed expand kernel (the two-kernel path's first half)
# and copies mhc_lab.py beside them. Then, on the GPU machine:
#   cd OUT && python3 mhc_lab.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/.dev/mhclab}" && cd "${1:-$ROOT/.dev/mhclab}" && pwd)"
cd "$ROOT"
NVCC="${NVCC:-${DEEPINFER_CUDA_ROOT:?source scripts/setup output first}/bin/nvcc}"
# The crate build's flags (build/cuda.rs, nvcc_flags).
cubin() {
  "$NVCC" -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo \
    --expt-relaxed-constexpr -I "$1/tilelang/include" "$1/tilelang/generated/$2.sm_90a.cu" -o "$OUT/$3.cubin"
}
# Both versions from HEAD (commit first: the working tree is not used).
WT="$(mktemp -d)"
trap 'git -C "$ROOT" worktree remove --force "$WT" 2> /dev/null || rm -rf "$WT"' EXIT
git worktree add -q --detach "$WT" HEAD
cubin "$WT" mhc_pre fma.pre
cubin "$WT" mhc_expand_pre fma.fused
cubin "$WT" mhc expand
git -C "$WT" apply "$ROOT/tilelang/labs/2026-12-05-mhc-tensor-cores.patch"
cubin "$WT" mhc_pre tc.pre
cubin "$WT" mhc_expand_pre tc.fused
cp "$ROOT/benches/tools/mhc_lab.py" "$OUT/"
ls -l "$OUT"
