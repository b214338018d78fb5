#!/usr/bin/env bash
# multirail-cluster: seed 002's three striping schemes between the two Soft-RoCE VMs
# of scripts/softroce-cluster, over two links (issue #36): rxe0 on the first link and
# rxe1 on a second one in each VM, each link's egress limited with tc (default 64
# and 16 mbit: a 4:1 pair, both below what the TCG guests' CPUs move). VM 0 sends,
# VM 1 receives and prints (bench/multirail.rs --cluster):
#   the table: one rail (rxe0 alone), even, fixed 4:1 and adaptive striping from
#     equal weights, by message size, RCH_BENCH_ROUNDS rounds (default 3), medians;
#   the trace: adaptive striping of 1 MiB messages for RCH_BENCH_TRACE_SECS (40 s)
#     while a second connection streams over rxe1's link from 10 s to 25 s, the
#     bandwidth and rxe0's weight every half second (and an SVG with --svg FILE).
#
# usage: bench/multirail-cluster.sh [--svg FILE] [--no-trace] [--trace-only]
# environment: RCH_BENCH_ROUNDS (3), RCH_BENCH_SIZES (262144,1048576,4194304),
#   RCH_BENCH_RATE / RCH_BENCH_RATE2 (tc rates of the two links: 64mbit, 16mbit),
#   RCH_BENCH_BYTES (bytes a table cell, 16 MiB; the second half is timed), RCH_BENCH_TRACE_SECS (40),
#   RCH_VM_* (scripts/softroce-vm). A benchmark, never a test: nothing asserts.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,18s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
. scripts/deps.sh
need_apt_packages build-essential libibverbs-dev librdmacm-dev libclang-dev

rounds=${RCH_BENCH_ROUNDS:-3}
sizes=${RCH_BENCH_SIZES:-262144,1048576,4194304}
rate=${RCH_BENCH_RATE:-64mbit}
rate2=${RCH_BENCH_RATE2:-16mbit}
bytes=${RCH_BENCH_BYTES:-$((16 << 20))}
secs=${RCH_BENCH_TRACE_SECS:-40}
extra=()
svg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --svg) svg=$(realpath -m "${2:?--svg needs a file}"); shift 2 ;;
    --no-trace|--trace-only) extra+=("$1"); shift ;;
    *) echo "multirail-cluster: unknown argument $1" >&2; exit 2 ;;
  esac
done

log_build=$(mktemp)
trap 'rm -f "$log_build"' EXIT
cargo bench --features verbs --bench multirail --no-run 2>&1 | tee "$log_build" >&2
bin=$(pwd -P)/$(sed -n 's|^ *Executable bench/multirail.rs (\(.*\))$|\1|p' "$log_build" | tail -1)
[ -x "$bin" ] || { echo "multirail-cluster: no benchmark binary at $bin" >&2; exit 1; }

# The VMs see the host's files read-only: the SVG is drawn into a writable share.
share=$(mktemp -d)
trap 'rm -f "$log_build"; rm -rf "$share"' EXIT
[ -z "$svg" ] || extra+=(--svg "$share/trace.svg")
echo "== two Soft-RoCE VMs, two links ($rate, $rate2), $rounds round(s)" >&2
# RCH_IB_TIMEOUT: as the cluster's tests (a TCG guest that falls behind drops frames).
scripts/softroce-cluster -q --vms 2 --two-links --rate "$rate" --rate2 "$rate2" \
  --timeout "${RCH_VM_TIMEOUT:-3000}" --files "$share" --cwd "$(pwd -P)" \
  --env "RCH_IB_TIMEOUT=${RCH_IB_TIMEOUT:-18}" --env "RCH_BENCH_RATE=$rate" \
  --env "RCH_BENCH_RATE2=$rate2" -- \
  "$bin" --cluster --rounds "$rounds" --sizes "$sizes" --cluster-bytes "$bytes" \
  --trace-secs "$secs" --compete 10,25 "${extra[@]+"${extra[@]}"}" 2>&1 |
  grep -v '^\[vm0\] $' | sed 's/^\[vm1\] //'
if [ -n "$svg" ] && [ -s "$share/trace.svg" ]; then
  cp "$share/trace.svg" "$svg" && echo "wrote $svg" >&2
fi
