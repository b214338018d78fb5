#!/usr/bin/env bash
# instructions: how many instructions the small-message path executes per call, by
# valgrind's callgrind over bench/hotpath.rs: in a ping-pong of SIZE-byte messages,
# a put, the get that takes it, and a poll of an empty ring (the one after each put,
# which does the upkeep the get before it left). A benchmark, never a test: nothing
# here asserts.
#
# Unlike a timing on this shared host, the count repeats to the instruction, so a
# change to the path can be judged in one run; and it is what a slow CPU multiplies
# (in a TCG guest with Soft-RoCE an instruction costs ~0.35 ns and a call with its
# return ~12 ns: bench/notebook/2026-11.md, Soft-RoCE, "Where the rest of the latency goes").
#
# usage: bench/instructions.sh [SIZE...]      (default: 2 8 64 512)
# environment: RCH_* as for any program on the channel (e.g. RCH_RING_SIZE).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
need_rust
need_apt_packages valgrind

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(2 8 64 512)
build=$(cargo bench --bench hotpath --no-run 2>&1) || { echo "$build" >&2; exit 1; }
bin=$(printf '%s\n' "$build" | sed -n 's/.*Executable .*hotpath\.rs (\(.*\))$/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "instructions: no hotpath binary in cargo's output" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Two runs that differ only in the iteration count: the difference divided by the
# difference in calls (two of each per round trip) is the cost of one call, with
# start-up and the first calls' one-off work (page faults, lazy binding) cancelled.
lo=2000 hi=12000
printf '%8s %12s %12s %12s %12s\n' size put get empty_poll put+get
for size in "${sizes[@]}"; do
  declare -A cost=()
  for n in $lo $hi; do
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.$n" "$bin" "$n" "$size" \
      >"$work/out.$n" 2>"$work/err.$n" || { cat "$work/err.$n" >&2; exit 1; }
    while read -r fn count; do
      cost[$fn.$n]=$count
    done < <(callgrind_annotate --inclusive=yes "$work/cg.$n" 2>/dev/null |
      awk '{ gsub(",", "", $1) } /hotpath::hotpath_(put|get|empty)( |$)/ {
             match($0, /hotpath_(put|get|empty)/); print substr($0, RSTART + 8, RLENGTH - 8), $1 }')
  done
  per() { echo "scale=1; (${cost[$1.$hi]:?no $1 in the profile} - ${cost[$1.$lo]:?}) / (2 * ($hi - $lo))" | bc; }
  put=$(per put) get=$(per get) empty=$(per empty)
  printf '%8s %12s %12s %12s %12s\n' "$size" "$put" "$get" "$empty" "$(echo "$put + $get" | bc)"
  unset cost
done
echo "(instructions per call, callgrind; put and get of one message of SIZE bytes, empty_poll a get_nowait that finds nothing)"
