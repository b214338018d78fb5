#!/usr/bin/env bash
# Sweeps ring and chunk sizes with bench/pingpong and prints one line per setting:
# latency (us) and bandwidth (GB/s) at a few message sizes. Used to pick defaults.
#   bench/sweep.sh                       # default grid
#   RINGS="256k 4m" CHUNKS="16k 64k" SIZES=8,65536 bench/sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RINGS=${RINGS:-"64k 256k 1m 4m 16m"}
CHUNKS=${CHUNKS:-"4k 16k 64k 256k"}
SIZES=${SIZES:-8,4096,65536,1048576,4194304}
cargo bench --bench pingpong --no-run >/dev/null 2>&1
bin=$(ls -t target/release/deps/pingpong-* | grep -v '\.d$' | head -1)
printf "%-6s %-6s" ring chunk
for s in ${SIZES//,/ }; do printf " %14s" "$s(us|GB/s)"; done
echo
for r in $RINGS; do
  for c in $CHUNKS; do
    out=$(RCH_RING_SIZE=$r RCH_CHUNK_SIZE=$c "$bin" --sizes "$SIZES" 2>&1) || { echo "$r $c: invalid ($out)" | head -1; continue; }
    printf "%-6s %-6s" "$r" "$c"
    echo "$out" | awk '$1 ~ /^[0-9]+$/ {printf " %6.3f|%6.2f", $2, $3}'
    echo
  done
done
