#!/usr/bin/env bash
# Runs one cargo-fuzz target for a stated time on its corpus, seeded from
# fuzz/seeds/<target> (the tiny model's config forms, shard header, index,
# JSONL requests and op-call bytes). Usage:
#   fuzz/run.sh TARGET [SECONDS] [extra libFuzzer flags...]
# Targets: config safetensors index request ops. Needs nightly and
# cargo-fuzz (cargo install cargo-fuzz). Crashes land in
# fuzz/artifacts/TARGET/; replay one with
#   fuzz/target/x86_64-unknown-linux-gnu/release/TARGET ARTIFACT
set -euo pipefail
cd "$(dirname "$0")"
target="$1"
secs="${2:-180}"
shift $(( $# >= 2 ? 2 : 1 ))
# No sanitizer (the library is safe Rust; mmap is the only unsafe), debug
# assertions on so that integer overflow panics.
cargo +nightly fuzz build -s none -a "$target"
mkdir -p "corpus/$target" "artifacts/$target"
cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
case "$target" in
  safetensors|index) max_len=131072 ;;
  *) max_len=8192 ;;
esac
exec nice -n 19 "target/x86_64-unknown-linux-gnu/release/$target" \
  "corpus/$target" -artifact_prefix="artifacts/$target/" \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
  -max_len="$max_len" -print_final_stats=1 "$@"
