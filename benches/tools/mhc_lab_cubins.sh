#!/usr/bin/env bash
# Builds the sm_90a cubins that benches/tools/mhc_lab.py times, into OUT
# (default .dev/mhclab), with the pinned nvcc ($DEEPINFER_CUDA_ROOT/bin/nvcc
# after `source` of scripts/setup's output, or $NVCC):
#
#   benches/tools/mhc_lab_cubins.sh [OUT] [NAME=REV[+PATCH...] ...]
#
# Each variant NAME is the committed pass 1 and fused kernels
# (tilelang/generated) at REV, with each PATCH (a lab patch carrying its
# generated sources, so no TileLang is needed) applied on top in order, built in a
# temporary worktree: NAME.pre.cubin and NAME.fused.cubin. The default is
# `fma=7e1eccf tc=HEAD` (the FMA mixes before the tensor cores, and now).
# expand.cubin is the first variant's expand kernel (the two-kernel path's
# first half). variants.json records each variant's launch geometry (shared
# memory, threads and tokens a CTA, from the generated sources' headers), in
# order; mhc_lab.py is copied
# beside them. Then, on the GPU machine:
#   cd OUT && python3 mhc_lab.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/.dev/mhclab}" && cd "${1:-$ROOT/.dev/mhclab}" && pwd)"
shift || true
[ $# -gt 0 ] || set -- fma=7e1eccf tc=HEAD
cd "$ROOT"
NVCC="${NVCC:-${DEEPINFER_CUDA_ROOT:?source scripts/setup output first}/bin/nvcc}"
# The crate build's flags (build/cuda.rs, nvcc_flags) and include folders.
cubin() {
  "$NVCC" -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo \
    --expt-relaxed-constexpr -I "$1/tilelang/include" -I "$1/kernels-cuda/include" \
    "$1/tilelang/generated/$2.sm_90a.cu" -o "$OUT/$3.cubin"
}
# A kernel's launch geometry from its generated source's header:
# [dynamic shared memory bytes, threads a CTA, tokens a CTA (the grid's
# ceil(n_tokens / N))].
geom() {
  local f="$1/tilelang/generated/$2.sm_90a.cu"
  echo "[$(sed -n 's|^// dynamic_smem: \([0-9]*\) bytes.*|\1|p' "$f" | head -n 1)," \
    "$(sed -n 's|^// block: (\([0-9]*\),.*|\1|p' "$f" | head -n 1)," \
    "$(sed -n 's|^// grid: .*ceil(n_tokens / \([0-9]*\)).*|\1|p' "$f" | head -n 1)]"
}
WT="$(mktemp -d)"
rmdir "$WT"
trap 'git -C "$ROOT" worktree remove --force "$WT" 2> /dev/null || rm -rf "$WT"' EXIT
json="{"
first=1
for spec in "$@"; do
  name="${spec%%=*}"
  IFS=+ read -r -a parts <<< "${spec#*=}"
  git worktree add -q --detach "$WT" "${parts[0]}"
  for patch in "${parts[@]:1}"; do
    git -C "$WT" apply "$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")"
  done
  cubin "$WT" mhc_pre "$name.pre"
  cubin "$WT" mhc_expand_pre "$name.fused"
  [ $first = 0 ] || cubin "$WT" mhc expand
  [ $first = 1 ] || json="$json, "
  json="$json\"$name\": {\"pre\": $(geom "$WT" mhc_pre), \"fused\": $(geom "$WT" mhc_expand_pre)}"
  first=0
  git worktree remove --force "$WT"
done
echo "$json}" > "$OUT/variants.json"
cp "$ROOT/benches/tools/mhc_lab.py" "$OUT/"
ls -l "$OUT"
cat "$OUT/variants.json"
