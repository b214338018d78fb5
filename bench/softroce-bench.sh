#!/usr/bin/env bash
# softroce-bench: rdma-channel over verbs against perftest, on Soft-RoCE.
# Builds bench/verbs_pingpong.rs on the host, then in ONE scripts/softroce-vm
# boot runs ib_write_lat -s 2, ib_write_bw and ib_read_bw (64 KiB and 1 MiB)
# and our benchmark, and prints ours beside perftest with the issue's targets:
# latency <= 1.15x ib_write_lat (t_typical), bandwidth >= 0.97x the better of
# ib_write_bw / ib_read_bw (BW average) at 64 KiB and above.
#
# TCG timing is noisy (perftest's own 2 B latency varied 10.8-16.9 us between
# boots), so everything runs RCH_BENCH_ROUNDS times (default 3), interleaved,
# and the table shows medians over the rounds.
#
# usage: bench/softroce-bench.sh [-- verbs_pingpong args, e.g. --sizes 2,65536]
# environment: RCH_BENCH_ROUNDS (3), RCH_RING_SIZE, RCH_CHUNK_SIZE, ... (passed
#   into the VM), RCH_BENCH_SCALE (iteration multiplier), RCH_VM_* (see
#   scripts/softroce-vm), SOFTROCE_BENCH_LOG=FILE keeps the raw VM output.
set -euo pipefail

BW_SIZES="65536 1048576"   # perftest bandwidth sizes (bytes)

# ---------------------------------------------------------------- in the VM
# The host's / is visible read-only inside the VM, so this same file is the
# in-VM half: softroce-vm runs "$0 --in-vm ROUNDS BIN ARGS...".
if [ "${1:-}" = --in-vm ]; then
  rounds=$2 bin=$3; shift 3
  dev=${SOFTROCE_IBDEV:-rxe0}
  ip=${SOFTROCE_IP:?not inside softroce-vm}
  gid=${SOFTROCE_GID_INDEX:-1}

  # Server in the background, client against the VM's own address (both ends
  # on rxe0, as our two processes are). Prints the client's report between
  # markers for the host to parse.
  run_pair() {  # tag tool options...
    local tag=$1 tool=$2; shift 2
    local try crc src
    for try in 1 2 3; do
      timeout 300 "$tool" -d "$dev" -x "$gid" -F "$@" >/tmp/server.out 2>&1 &
      local spid=$!
      sleep 1   # let the server listen before the client connects
      crc=0; timeout 300 "$tool" -d "$dev" -x "$gid" -F "$@" "$ip" >/tmp/client.out 2>&1 || crc=$?
      src=0; wait "$spid" || src=$?
      # perftest's latency tools calibrate the CPU clock by sampling; under
      # TCG that sometimes fails and the report shows 'inf': run again.
      # (the bandwidth tools then print 0.00, as seen with ib_read_bw)
      if [ "$crc" = 0 ] && { grep -qw inf /tmp/client.out ||
           awk '$1 ~ /^[0-9]+$/ && $4 ~ /^0\.0+$/ { z = 1 } END { exit !z }' /tmp/client.out; }; then
        echo "softroce-bench: $tool printed inf or 0.00 (clock calibration, try $try), again" >&2
        continue
      fi
      break
    done
    echo "=== BEGIN $tag"; cat /tmp/client.out; echo "=== END $tag"
    if [ "$crc" != 0 ] || [ "$src" != 0 ]; then
      echo "softroce-bench: $tool $* failed (client $crc, server $src)" >&2
      cat /tmp/server.out >&2
    fi
  }

  echo "softroce-bench: in VM (${SOFTROCE_ACCEL:-?}), $(nproc) CPUs, $dev GID $gid, $rounds round(s)" >&2
  for r in $(seq "$rounds"); do
    run_pair "lat.$r" ib_write_lat -s 2
    for s in $BW_SIZES; do
      # ~64 MiB per run (at least 200 messages) keeps each one to a few seconds
      n=$(( (64 << 20) / s )); [ "$n" -ge 200 ] || n=200
      run_pair "write_bw_$s.$r" ib_write_bw -s "$s" -n "$n"
      run_pair "read_bw_$s.$r" ib_read_bw -s "$s" -n "$n"
    done
    echo "=== BEGIN ours.$r"
    "$bin" "$@"
    echo "=== END ours.$r"
  done
  exit 0
fi

# ---------------------------------------------------------------- on the host
case "${1:-}" in
  -h|--help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
  --) shift ;;
esac
cd "$(dirname "$0")/.."
self="$(pwd -P)/bench/softroce-bench.sh"

echo "== cargo bench --features verbs --bench verbs_pingpong --no-run" >&2
build=$(cargo bench --features verbs --bench verbs_pingpong --no-run 2>&1) || { echo "$build" >&2; exit 1; }
# cargo names the binary on stderr: "Executable bench/verbs_pingpong.rs (target/...)"
bin=$(printf '%s\n' "$build" | sed -n 's/.*Executable .*verbs_pingpong\.rs (\(.*\))$/\1/p' | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "$build" >&2; echo "softroce-bench: cannot find the benchmark binary" >&2; exit 1
fi
bin="$(pwd -P)/$bin"

log=${SOFTROCE_BENCH_LOG:-$(mktemp)}
[ -n "${SOFTROCE_BENCH_LOG:-}" ] || trap 'rm -f "$log"' EXIT
echo "== one Soft-RoCE VM: perftest, then $(basename "$bin") $*" >&2
t0=$SECONDS
rounds=${RCH_BENCH_ROUNDS:-3}
case "$rounds" in ''|*[!0-9]*|0) echo "softroce-bench: RCH_BENCH_ROUNDS must be a positive number" >&2; exit 1 ;; esac
scripts/softroce-vm -q --timeout "${RCH_VM_TIMEOUT:-900}" -- "$self" --in-vm "$rounds" "$bin" "$@" >"$log"
echo "== VM done in $((SECONDS - t0)) s; raw output:" >&2
cat "$log"

# section TAG: the lines between "=== BEGIN TAG" and "=== END TAG"
section() { awk -v t="$1" '$0 == "=== BEGIN " t {on = 1; next} $0 == "=== END " t {on = 0} on' "$log"; }
# perftest_col TAG COLUMN: the named column of the first result row. Multi-word
# headers ("BW average[MB/sec]", "99% percentile[usec]") are joined first so
# that header words and row fields line up.
perftest_col() {
  section "$1" | awk -v col="$2" '
    /#bytes/ { gsub(/BW /, "BW_"); gsub(/% percentile/, "%_percentile")
               for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $1 ~ /^[0-9]+$/ { print $c; exit }'
}
# ours TAG COLUMN SIZE: the named column of our table's row for SIZE
ours() {
  section "$1" | awk -v col="$2" -v s="$3" '
    $1 == "size" { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $1 == s { print $c; exit }'
}
# median FN ARGS...: the median over the rounds of "FN TAG.r ARGS..." (numbers only)
median() {
  local fn=$1 tag=$2 r; shift 2
  for r in $(seq "$rounds"); do "$fn" "$tag.$r" "$@"; done |
    awk '/^[0-9.]+$/ { v[n++] = $1 } END { if (n) { asort_(v, n); print (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2) } }
         function asort_(a, n,   i, j, t) { for (i = 1; i < n; i++) for (j = i; j > 0 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t } }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
verdict() {  # ratio op limit
  awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { if (r == "-") print "n/a";
    else if ((op == "<=" && r + 0 <= l + 0) || (op == ">=" && r + 0 >= l + 0)) print "met"; else print "MISSED" }'
}

echo
echo "== rdma-channel (verbs) vs perftest on Soft-RoCE, median of $rounds round(s); $(grep -m1 '^# ring' "$log" | sed 's/;.*//; s/^# //')"
printf '%-28s %12s %22s %7s %8s %7s\n' metric ours perftest ratio target result
row() {  # label ours perftest-label perftest op limit
  local r; r=$(ratio "$2" "$4")
  printf '%-28s %12s %22s %7s %8s %7s\n' "$1" "${2:--}" "${4:--} $3" "$r" "$5$6" "$(verdict "$r" "$5" "$6")"
}
# t_typical is perftest's median, t_avg its mean: compare like with like
row "latency 2 B, median (us)" "$(median ours ours lat_med_us 2)" t_typical \
  "$(median perftest_col lat 't_typical[usec]')" "<=" 1.15
row "latency 2 B, mean (us)" "$(median ours ours latency_us 2)" t_avg \
  "$(median perftest_col lat 't_avg[usec]')" "<=" 1.15
for s in $BW_SIZES; do
  w=$(median perftest_col "write_bw_$s" 'BW_average[MB/sec]')
  rd=$(median perftest_col "read_bw_$s" 'BW_average[MB/sec]')
  if awk -v a="$w" -v b="$rd" 'BEGIN { exit !(a + 0 >= b + 0) }'; then best=$w which=write; else best=$rd which=read; fi
  row "bandwidth $s B (MB/s)" "$(median ours ours bw_MB/s "$s")" "${which}_bw" "$best" ">=" 0.97
  printf '%-28s %12s %22s\n' "" "" "(write ${w:--}, read ${rd:--})"
done
echo "(latency: half the ping-pong round trip, ib_write_lat -s 2; bandwidth: ours 64 messages in"
echo " flight then an ack, perftest BW average; MB = 2^20 B in both; same VM, both ends on rxe0)"
