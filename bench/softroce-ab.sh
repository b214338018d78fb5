#!/usr/bin/env bash
# softroce-ab: variants of bench/verbs_pingpong.rs side by side in ONE Soft-RoCE
# boot (or one two-VM cluster boot with --cluster), interleaved round by round with
# the order rotated, so that a change is judged against the same boot's noise. With
# --perftest each round also runs ib_write_bw and ib_read_bw at every bandwidth size
# as the yardstick. A benchmark, never a test: nothing here asserts.
#
# usage: bench/softroce-ab.sh [--rounds N] [--sizes 2,65536,1048576] [--cluster]
#          [--perftest] -- VARIANT...
# VARIANT: LABEL:BINARY[:VAR=VAL,VAR=VAL...], BINARY a verbs_pingpong built on the
#   host (copy target/release/deps/verbs_pingpong-* aside to keep one per commit),
#   the VAR=VAL pairs (e.g. RCH_ZCOPY_PRIVATE_THRESHOLD=off) set for that variant
#   only, on both ends.
# environment: RCH_* pass into the VM(s) for every variant; SOFTROCE_BENCH_LOG=FILE
#   keeps the raw output; RCH_VM_* as for scripts/softroce-vm. --report FILE reads
#   such a kept output again (same options and variants) instead of booting.
# Example (defaults against the ring only, same binary):
#   bin=$(ls -t target/release/deps/verbs_pingpong-* | grep -v '\.d$' | head -1)
#   bench/softroce-ab.sh --rounds 3 -- "zc:$bin" "ring:$bin:RCH_ZCOPY_PRIVATE_THRESHOLD=off"
set -euo pipefail

# ------------------------------------------------------------- in the VM(s)
if [ "${1:-}" = --in-vm ]; then
  rounds=$2 sizes=$3 perftest=$4; shift 4
  variants=("$@")
  n=${#variants[@]}
  dev=${SOFTROCE_IBDEV:-rxe0} gid=${SOFTROCE_GID_INDEX:-1}
  node=${SOFTROCE_NODE:-}
  if [ -n "$node" ]; then read -r -a hosts <<<"$SOFTROCE_HOSTS"; server=${hosts[1]}; fi
  port=18800
  # run_one TAG CMD...: one-VM mode runs CMD (verbs_pingpong pairs with itself);
  # cluster mode runs it on both VMs, VM 1 serving, VM 0 measuring (retrying until
  # VM 1's end listens), with RCH_BENCH_LISTEN / RCH_BENCH_CONNECT or perftest's
  # server/client split.
  run_one() {
    local tag=$1 kind=$2; shift 2
    port=$((port + 1))
    if [ -z "$node" ]; then
      if [ "$kind" = ours ]; then
        echo "=== BEGIN $tag"; timeout 600 "$@" 2>&1 || echo "failed: $?"; echo "=== END $tag"
      else
        timeout 120 "$@" -p "$port" >/dev/null 2>&1 &
        local spid=$!
        sleep 1
        echo "=== BEGIN $tag"; timeout 120 "$@" -p "$port" "$SOFTROCE_IP" 2>&1 || echo "failed: $?"; echo "=== END $tag"
        wait "$spid" || true
      fi
    elif [ "$node" = 1 ]; then
      if [ "$kind" = ours ]; then
        RCH_BENCH_LISTEN=0.0.0.0:$port timeout 600 "$@" >/dev/null 2>&1 || echo "server $tag failed" >&2
      else
        timeout 120 "$@" -p "$port" >/dev/null 2>&1 || echo "server $tag failed" >&2
      fi
    else
      local out=/tmp/ab.out
      for _ in $(seq 60); do
        if [ "$kind" = ours ]; then
          RCH_BENCH_CONNECT=$server:$port timeout 600 "$@" >$out 2>&1 && break
        else
          timeout 120 "$@" -p "$port" "$server" >$out 2>&1 && break
        fi
        sleep 1
      done
      echo "=== BEGIN $tag"; cat $out; echo "=== END $tag"
    fi
  }
  for r in $(seq "$rounds"); do
    if [ "$perftest" = 1 ]; then
      for s in ${sizes//,/ }; do
        [ "$s" -ge 65536 ] || continue
        m=$(( (32 << 20) / s )); [ "$m" -ge 100 ] || m=100
        run_one "write_bw_$s.$r" perftest ib_write_bw -d "$dev" -x "$gid" -F -s "$s" -n "$m"
        run_one "read_bw_$s.$r" perftest ib_read_bw -d "$dev" -x "$gid" -F -s "$s" -n "$m"
      done
    fi
    for k in $(seq 0 $((n - 1))); do
      v=${variants[$(( (k + r) % n ))]}
      label=${v%%:*} rest=${v#*:}
      bin=${rest%%:*} envs=""
      [ "$rest" = "$bin" ] || envs=${rest#*:}
      IFS=, read -r -a envv <<<"$envs"
      run_one "$label.$r" ours env "${envv[@]}" "$bin" --sizes "$sizes"
    done
  done
  exit 0
fi

# ------------------------------------------------------------- on the host
rounds=3 sizes=2,65536,1048576 cluster=0 perftest=0 report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --cluster) cluster=1; shift ;;
    --perftest) perftest=1; shift ;;
    --report) report=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,21s/^# \{0,1\}//p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "softroce-ab: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { sed -n '2,21s/^# \{0,1\}//p' "$0"; exit 2; }
case "$rounds" in ''|*[!0-9]*|0) echo "softroce-ab: --rounds needs a positive number" >&2; exit 2 ;; esac
variants=()
for v in "$@"; do
  rest=${v#*:}; bin=${rest%%:*}
  [ -x "$bin" ] || { echo "softroce-ab: $bin (variant ${v%%:*}) is not an executable" >&2; exit 2; }
  variants+=("${v%%:*}:$(realpath "$bin")${rest#"$bin"}")
done
cd "$(dirname "$0")/.."
self="$(pwd -P)/bench/softroce-ab.sh"
log=${SOFTROCE_BENCH_LOG:-$(mktemp)}
[ -n "${SOFTROCE_BENCH_LOG:-}" ] || [ -n "$report" ] || trap 'rm -f "$log"' EXIT
load0=$(cut -d' ' -f1 /proc/loadavg)
t0=$SECONDS
if [ -n "$report" ]; then
  log=$report
elif [ "$cluster" = 1 ]; then
  scripts/softroce-cluster -q --vms 2 --timeout "${RCH_VM_TIMEOUT:-3000}" -- \
    "$self" --in-vm "$rounds" "$sizes" "$perftest" "${variants[@]}" 2>&1 |
    sed -n 's/^\[vm0\] //p' >"$log"
else
  scripts/softroce-vm -q --timeout "${RCH_VM_TIMEOUT:-1800}" -- \
    "$self" --in-vm "$rounds" "$sizes" "$perftest" "${variants[@]}" >"$log"
fi
load1=$(cut -d' ' -f1 /proc/loadavg)

section() { awk -v t="$1" '$0 == "=== BEGIN " t {on = 1; next} $0 == "=== END " t {on = 0} on' "$log"; }
ours() {
  section "$1" | awk -v col="$2" -v s="$3" '
    $1 == "size" { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $1 == s { print $c; exit }'
}
perftest_bw() {
  section "$1" | awk '/#bytes/ { gsub(/BW /, "BW_"); for (i = 1; i <= NF; i++) if ($i == "BW_average[MB/sec]") c = i; next }
    c && $1 ~ /^[0-9]+$/ { print $c; exit }'
}
# all FN TAG ARGS: the value of every round, and the median
all() {
  local fn=$1 tag=$2 r; shift 2
  for r in $(seq "$rounds"); do "$fn" "$tag.$r" "$@"; done |
    awk '/^[0-9.]+$/ { v[n++] = $1; s = s (s == "" ? "" : " ") $1 }
      END { if (!n) { print "-"; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            printf "%s (%s)\n", (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2), s }'
}
echo "== softroce-ab: $rounds round(s), $([ "$cluster" = 1 ] && echo "two VMs" || echo "one VM"), $((SECONDS - t0)) s, host load $load0-$load1"
for v in "${variants[@]}"; do echo "   ${v%%:*}: ${v#*:}"; done
echo
echo "| variant | latency 2 B median us | $(for s in ${sizes//,/ }; do [ "$s" = 2 ] || printf '%s B MB/s | ' "$s"; done)"
echo "| --- | ---: | $(for s in ${sizes//,/ }; do [ "$s" = 2 ] || printf -- '---: | '; done)"
for v in "${variants[@]}"; do
  l=${v%%:*}
  printf '| %s | %s | ' "$l" "$(all ours "$l" lat_med_us 2)"
  for s in ${sizes//,/ }; do [ "$s" = 2 ] || printf '%s | ' "$(all ours "$l" bw_MB/s "$s")"; done
  echo
done
if [ "$perftest" = 1 ]; then
  for t in write read; do
    printf '| ib_%s_bw | - | ' "$t"
    for s in ${sizes//,/ }; do [ "$s" = 2 ] || printf '%s | ' "$([ "$s" -ge 65536 ] && all perftest_bw "${t}_bw_$s" || echo -)"; done
    echo
  done
fi
echo "(median (each round); MB = 2^20 B)"
