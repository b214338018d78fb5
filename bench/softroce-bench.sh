#!/usr/bin/env bash
# softroce-bench: rdma-channel over verbs against perftest, on Soft-RoCE.
# Builds bench/verbs_pingpong.rs on the host, then in a scripts/softroce-vm
# boot runs ib_write_lat -s 2 (as many round trips as ours), ib_write_bw and
# ib_read_bw (64 KiB and 1 MiB) and our benchmark, and prints ours beside
# perftest with the targets of issue
# #13 item 4: latency <= 1.10x ib_write_lat (t_typical), bandwidth >= 1.0x the
# better of ib_write_bw / ib_read_bw (BW average) at 64 KiB and 1 MiB.
#
# TCG timing is noisy (perftest's own 2 B latency varied 10.8-16.9 us between
# boots), so everything runs RCH_BENCH_ROUNDS times (default 3) per boot,
# interleaved, and each boot's table shows medians over its rounds. Latency is
# timed in RCH_BENCH_LAT_PAIRS (default 3) pairs per round: ib_write_lat and a
# latency-only run of ours back to back, order alternating; the ratio is the
# median of the pairs' ratios (the host's slow phases last seconds: a pair meets
# one whole, or a run of it is an outlier the median drops). A target must hold
# in every boot: RCH_BENCH_BOOTS=N (default 1) boots N separate VMs one after
# the other and closes with one table, a row and ratios per boot.
#
# usage: bench/softroce-bench.sh [-- verbs_pingpong args, e.g. --sizes 2,65536]
#        bench/softroce-bench.sh --report LOG...   (the tables again from kept output)
# environment: RCH_BENCH_ROUNDS (3), RCH_BENCH_LAT_PAIRS (3), RCH_BENCH_BOOTS (1), RCH_RING_SIZE,
#   RCH_CHUNK_SIZE, ... (passed into the VM), RCH_BENCH_SCALE (iteration
#   multiplier), RCH_VM_* (see scripts/softroce-vm), SOFTROCE_BENCH_LOG=FILE
#   keeps the raw VM output (FILE.bootN with several boots).
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
  # ib_write_lat times as many round trips as ours (see bench/lib.sh).
  . "$(dirname "$0")/lib.sh"
  lat_n=$(perftest_lat_count)
  pairs=${RCH_BENCH_LAT_PAIRS:-3}
  for r in $(seq "$rounds"); do
    # Latency in adjacent pairs, ib_write_lat and ours right after each other (the
    # order alternates), so both runs of a pair meet the same phase of the host.
    for p in $(seq "$pairs"); do
      if [ $(( (r + p) % 2 )) = 0 ]; then
        run_pair "lat.$r.$p" ib_write_lat -s 2 -n "$lat_n"
      fi
      echo "=== BEGIN ours_lat.$r.$p"
      "$bin" --sizes 2 --latency-only
      echo "=== END ours_lat.$r.$p"
      if [ $(( (r + p) % 2 )) = 1 ]; then
        run_pair "lat.$r.$p" ib_write_lat -s 2 -n "$lat_n"
      fi
    done
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
reports=()
case "${1:-}" in
  -h|--help) sed -n '2,28s/^# \{0,1\}//p' "$0"; exit 0 ;;
  --report) shift; reports=("$@"); set -- ;;
  --) shift ;;
esac
cd "$(dirname "$0")/.."
. bench/lib.sh
self="$(pwd -P)/bench/softroce-bench.sh"
rounds=${RCH_BENCH_ROUNDS:-3}
case "$rounds" in ''|*[!0-9]*|0) echo "softroce-bench: RCH_BENCH_ROUNDS must be a positive number" >&2; exit 1 ;; esac
pairs=${RCH_BENCH_LAT_PAIRS:-3}
case "$pairs" in ''|*[!0-9]*|0) echo "softroce-bench: RCH_BENCH_LAT_PAIRS must be a positive number" >&2; exit 1 ;; esac
boots=${RCH_BENCH_BOOTS:-1}
case "$boots" in ''|*[!0-9]*|0) echo "softroce-bench: RCH_BENCH_BOOTS must be a positive number" >&2; exit 1 ;; esac

if [ ${#reports[@]} -gt 0 ]; then bin=verbs_pingpong; else
echo "== cargo bench --features verbs --bench verbs_pingpong --no-run" >&2
build=$(cargo bench --features verbs --bench verbs_pingpong --no-run 2>&1) || { echo "$build" >&2; exit 1; }
# cargo names the binary on stderr: "Executable bench/verbs_pingpong.rs (target/...)"
bin=$(printf '%s\n' "$build" | sed -n 's/.*Executable .*verbs_pingpong\.rs (\(.*\))$/\1/p' | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "$build" >&2; echo "softroce-bench: cannot find the benchmark binary" >&2; exit 1
fi
bin="$(pwd -P)/$bin"
fi

# The targets of issue #13 item 4.
LAT_MAX=1.10 BW_MIN=1.00

# section LOG TAG: the lines between "=== BEGIN TAG" and "=== END TAG"
section() { awk -v t="$2" '$0 == "=== BEGIN " t {on = 1; next} $0 == "=== END " t {on = 0} on' "$1"; }
# perftest_col LOG TAG COLUMN: the named column of the first result row. Multi-word
# headers ("BW average[MB/sec]", "99% percentile[usec]") are joined first so
# that header words and row fields line up.
perftest_col() {
  section "$1" "$2" | awk -v col="$3" '
    /#bytes/ { gsub(/BW /, "BW_"); gsub(/% percentile/, "%_percentile")
               for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $1 ~ /^[0-9]+$/ { print $c; exit }'
}
# ours LOG TAG COLUMN SIZE: the named column of our table's row for SIZE
ours() {
  section "$1" "$2" | awk -v col="$3" -v s="$4" '
    $1 == "size" { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $1 == s { print $c; exit }'
}
# round_median FN LOG TAG ARGS...: the median over the rounds of "FN LOG TAG.r ARGS..." (numbers only)
round_median() {
  local fn=$1 log=$2 tag=$3 r; shift 3
  for r in $(seq "$rounds"); do "$fn" "$log" "$tag.$r" "$@"; done |
    awk '/^[0-9.]+$/ { v[n++] = $1 } END { if (n) { asort_(v, n); print (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2) } }
         function asort_(a, n,   i, j, t) { for (i = 1; i < n; i++) for (j = i; j > 0 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t } }'
}
pair_count() { echo $((rounds * pairs)); }
# pair_median FN LOG TAG ARGS...: the median over every latency pair of
# "FN LOG TAG.r.p ARGS..."
pair_median() {
  local fn=$1 log=$2 tag=$3 r p; shift 3
  for r in $(seq "$rounds"); do for p in $(seq "$pairs"); do "$fn" "$log" "$tag.$r.$p" "$@"; done; done |
    grep -E '^[0-9.]+$' | median
}
# pair_ratio LOG OURS_COLUMN PERFTEST_COLUMN: the median of ours / perftest over the
# latency pairs in which both runs reported
pair_ratio() {
  local log=$1 r p o q
  for r in $(seq "$rounds"); do for p in $(seq "$pairs"); do
    o=$(ours "$log" "ours_lat.$r.$p" "$2" 2); q=$(perftest_col "$log" "lat.$r.$p" "$3")
    echo "$(ratio "$o" "$q")"
  done; done | grep -E '^[0-9.]+$' | median | awk '/^[0-9.]+$/ { printf "%.2f\n", $1; next } { print "-" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
verdict() {  # ratio op limit
  awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { if (op == "") print "info"; else if (r == "-") print "n/a";
    else if ((op == "<=" && r + 0 <= l + 0) || (op == ">=" && r + 0 >= l + 0)) print "met"; else print "MISSED" }'
}
row() {  # label ours perftest-label perftest op limit
  local r; r=$(ratio "$2" "$4")
  printf '%-28s %12s %22s %7s %8s %7s\n' "$1" "${2:--}" "${4:--} $3" "$r" "$5$6" "$(verdict "$r" "$5" "$6")"
}

# One line per boot for the closing table, filled by report().
summary=()
# report LOG BOOT LOAD: the table of one boot, and its line of the summary
report() {
  local log=$1 b=$2 load=$3 s w rd best which line r lat_o lat_p verdicts=""
  echo
  echo "== boot $b of $boots: rdma-channel (verbs) vs perftest on Soft-RoCE, median of $rounds round(s); $(grep -m1 '^# ring' "$log" | sed 's/;.*//; s/^# //')"
  printf '%-28s %12s %22s %7s %8s %7s\n' metric ours perftest ratio target result
  # t_typical is perftest's median, t_avg its mean: compare like with like. Each
  # latency pair gives a ratio; the boot's is their median (header comment).
  lat_o=$(pair_median ours "$log" ours_lat lat_med_us 2)
  lat_p=$(pair_median perftest_col "$log" lat 't_typical[usec]')
  r=$(pair_ratio "$log" lat_med_us 't_typical[usec]')
  row "latency 2 B, median (us)" "$lat_o" t_typical "$lat_p" "" ""
  printf '%-28s %12s %22s %7s %8s %7s\n' "  median of $(pair_count) pair ratios" "" "" "$r" "<=$LAT_MAX" "$(verdict "$r" "<=" $LAT_MAX)"
  verdicts+=" $(verdict "$r" "<=" $LAT_MAX)"
  line="| $b | $load | ${lat_o:--} / ${lat_p:--} | **$r** |"
  row "latency 2 B, mean (us)" "$(pair_median ours "$log" ours_lat latency_us 2)" t_avg \
    "$(pair_median perftest_col "$log" lat 't_avg[usec]')" "" ""
  for s in $BW_SIZES; do
    w=$(round_median perftest_col "$log" "write_bw_$s" 'BW_average[MB/sec]')
    rd=$(round_median perftest_col "$log" "read_bw_$s" 'BW_average[MB/sec]')
    if awk -v a="$w" -v b="$rd" 'BEGIN { exit !(a + 0 >= b + 0) }'; then best=$w which=write; else best=$rd which=read; fi
    o=$(round_median ours "$log" ours bw_MB/s "$s")
    row "bandwidth $s B (MB/s)" "$o" "${which}_bw" "$best" ">=" $BW_MIN
    printf '%-28s %12s %22s\n' "" "" "(write ${w:--}, read ${rd:--})"
    r=$(ratio "$o" "$best"); verdicts+=" $(verdict "$r" ">=" $BW_MIN)"
    line+=" ${o:--} / ${w:--} / ${rd:--} | **$r** |"
  done
  case "$verdicts" in *MISSED*|*n/a*) line+=" no |" ;; *) line+=" yes |" ;; esac
  summary+=("$line")
}

t_all=$SECONDS
if [ ${#reports[@]} -gt 0 ]; then
  # Tables again from kept raw output (SOFTROCE_BENCH_LOG), one boot per file.
  boots=${#reports[@]} b=0
  for log in "${reports[@]}"; do
    b=$((b + 1)); [ -r "$log" ] || { echo "softroce-bench: cannot read $log" >&2; exit 1; }
    report "$log" "$b" "-"
  done
  per_boot_table "write / read" " (from kept output)"
  exit 0
fi
for b in $(seq "$boots"); do
  if [ -n "${SOFTROCE_BENCH_LOG:-}" ]; then
    log=$SOFTROCE_BENCH_LOG; [ "$boots" = 1 ] || log=$SOFTROCE_BENCH_LOG.boot$b
  else
    log=$(mktemp); trap 'rm -f "$log"' EXIT
  fi
  echo "== boot $b of $boots: one Soft-RoCE VM: perftest, then $(basename "$bin") $*" >&2
  t0=$SECONDS
  # The host is shared: its load during the boot goes into the table.
  load0=$(cut -d' ' -f1 /proc/loadavg)
  scripts/softroce-vm -q --timeout "${RCH_VM_TIMEOUT:-900}" -- "$self" --in-vm "$rounds" "$bin" "$@" >"$log"
  load1=$(cut -d' ' -f1 /proc/loadavg)
  echo "== VM done in $((SECONDS - t0)) s; raw output:" >&2
  cat "$log"
  report "$log" "$b" "$load0-$load1"
  if [ -z "${SOFTROCE_BENCH_LOG:-}" ]; then rm -f "$log"; trap - EXIT; fi
done
echo "(latency: half the ping-pong round trip, ib_write_lat -s 2; bandwidth: ours 64 messages in"
echo " flight then an ack, perftest BW average; MB = 2^20 B in both; same VM, both ends on rxe0)"

per_boot_table "write / read" "; $((SECONDS - t_all)) s"
