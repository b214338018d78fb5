#!/usr/bin/env bash
# runtime-cluster: bench/runtime.sh's comparison (issue #35, seed 004) between the two
# Soft-RoCE VMs of scripts/softroce-cluster instead of two processes of one host:
# rdma-channel over verbs (rxe0 on each VM's end of the private link, rdma_cm) against
# ZeroMQ (PAIR, and PUSH/PULL for the farm) over TCP and plain TCP over the same link
# (bench/c/msg_peers.c, bench/c/msg_farm.c with MSG_ROLE/MSG_HOST). In ONE boot,
# RCH_BENCH_ROUNDS (default 3) rounds, every system once a round in a rotating order;
# medians.
#   ping-pong (seed 004 Table II): VM 1 echoes, VM 0 measures (one-way us)
#   stream (Table I): VM 0 sends one way, VM 1 answers at the end (MB/s)
#   farm (Table I): VM 0 is the master (emitter and collector threads), VM 1 runs
#     the two worker processes (task MB/s)
# Targets (issue #35): ping-pong below ZeroMQ/TCP; farm ahead of ZeroMQ/TCP at every
# Table I size.
#
# usage: bench/runtime-cluster.sh
# environment: RCH_BENCH_ROUNDS (3), RCH_BENCH_SIZES (Table I: 10,...,400000),
#   RCH_BENCH_ITERS (ping-pong round trips a size, 200), RCH_BENCH_BYTES (stream and
#   farm bytes a size, 2 MiB), RCH_BENCH_MIN_TASKS (fewest farm tasks a size, 20),
#   RCH_BENCH_ALT='LABEL:VAR=VALUE ...' (the second rdma-channel column, run with
#   those variables on both VMs; default 'a put a message:RCH_BENCH_BATCH=0'),
#   RCH_VM_* (scripts/softroce-vm), SOFTROCE_BENCH_LOG=FILE keeps VM 0's raw output.
# The VMs are TCG guests of one CPU each on this 2-core host: absolute figures are the
# emulation's, the ratios are the point. Each step is bounded (300 s). It is a
# benchmark, never a test: nothing here asserts.
set -euo pipefail

# ------------------------------------------------------------- in VM 0
# VM 0 runs every step: its own side here, VM 1's through softroce-rexec (the
# cluster's ssh stand-in, --hydra), both bounded; a failed side ends the other.
if [ "${1:-}" = --in-vm ]; then
  set +e
  rounds=$2 rt=$3 farm=$4 peers=$5 mfarm=$6 sizes=$7 iters=$8 bytes=$9 min_tasks=${10}
  alt_env=${11}
  read -r -a hosts <<<"$SOFTROCE_HOSTS"
  vm0=${hosts[0]} vm1=${hosts[1]}
  workers=2
  port=19000
  systems=(rch rch1 zmq tcp)
  tmp=$(mktemp -d)
  for r in $(seq "$rounds"); do
    order=()
    for k in 0 1 2 3; do order+=("${systems[$(( (k + r) % 4 ))]}"); done
    for pattern in peers farm; do
      for sys in "${order[@]}"; do
        port=$((port + 10))
        tag=$pattern.$sys.$r
        # The second rdma-channel column: the same programs with RCH_BENCH_ALT's
        # variables (after the defaults, so that they override them).
        extra="RCH_BENCH_BATCH=1"
        [ "$sys" = rch1 ] && extra="$extra $alt_env"
        read -r -a extra_arr <<<"$extra"
        case "$pattern/${sys%1}" in
          # ping-pong and stream: VM 1 serves, VM 0 measures
          peers/rch)
            there="env RCH_IB_TIMEOUT=$RCH_IB_TIMEOUT $extra RCH_BENCH_LISTEN=$vm1:$port $rt $sizes $iters $bytes"
            here=(env "${extra_arr[@]}" RCH_BENCH_CONNECT="$vm1:$port" "$rt" "$sizes" "$iters" "$bytes") ;;
          peers/*)
            there="env MSG_ROLE=server MSG_HOST=$vm1 $peers $sys $port $sizes $iters $bytes"
            here=(env MSG_ROLE=client MSG_HOST="$vm1" "$peers" "$sys" "$port" "$sizes" "$iters" "$bytes") ;;
          # the farm: VM 0's master listens, VM 1's workers connect
          farm/rch)
            there="env RCH_IB_TIMEOUT=$RCH_IB_TIMEOUT $extra RCH_BENCH_CONNECT=$vm0:$port $farm $sizes $bytes $workers $min_tasks"
            here=(env "${extra_arr[@]}" RCH_BENCH_LISTEN="$vm0:$port" "$farm" "$sizes" "$bytes" "$workers" "$min_tasks") ;;
          farm/*)
            there="env MSG_ROLE=workers MSG_HOST=$vm0 $mfarm $sys $port $sizes $bytes $workers $min_tasks"
            here=(env MSG_ROLE=master MSG_HOST="$vm0" "$mfarm" "$sys" "$port" "$sizes" "$bytes" "$workers" "$min_tasks") ;;
        esac
        timeout 240 "$SOFTROCE_REXEC" vm1 "$there" >"$tmp/there" 2>&1 &
        rpid=$!
        timeout 240 "${here[@]}" >"$tmp/here" 2>&1
        hs=$?
        [ "$hs" = 0 ] || kill "$rpid" 2>/dev/null
        rs=0
        wait "$rpid" || rs=$?
        echo "=== BEGIN $tag"
        cat "$tmp/here"
        [ "$hs" = 0 ] || echo "step $tag failed here (VM 0): exit $hs"
        if [ "$rs" != 0 ]; then
          echo "step $tag failed there (VM 1): exit $rs"
          tail -n 5 "$tmp/there"
        fi
        echo "=== END $tag"
      done
    done
  done
  rm -rf "$tmp"
  exit 0
fi

# ------------------------------------------------------------- on the host
case "${1:-}" in -h|--help) sed -n '2,25s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh
self="$(pwd -P)/bench/runtime-cluster.sh"
sizes=${RCH_BENCH_SIZES:-10,100,1024,5000,10000,25000,50000,65536,200000,400000}
rounds=${RCH_BENCH_ROUNDS:-3}
iters=${RCH_BENCH_ITERS:-200}
bytes=${RCH_BENCH_BYTES:-$((2 << 20))}
min_tasks=${RCH_BENCH_MIN_TASKS:-20}
alt=${RCH_BENCH_ALT:-a put a message:RCH_BENCH_BATCH=0}
alt_label=${alt%%:*} alt_env=${alt#*:}
[ "$alt_label" != "$alt" ] && [[ "$alt_env" =~ ^([A-Z_][A-Z0-9_]*=[^\ ]*( |$))+$ ]] ||
  { echo "RCH_BENCH_ALT must be 'LABEL:VAR=VALUE ...'" >&2; exit 1; }
for v in "$rounds" "$iters" "$bytes" "$min_tasks"; do
  case "$v" in ''|*[!0-9]*|0) echo "RCH_BENCH_ROUNDS/ITERS/BYTES/MIN_TASKS must be positive numbers" >&2; exit 1 ;; esac
done
need_apt_packages build-essential libzmq3-dev libibverbs-dev librdmacm-dev libclang-dev

# Everything is built on the host; the VMs run it from the host's file system.
out=$(pwd -P)/target/runtime-cluster
mkdir -p "$out"
cc -O2 -o "$out/msg_peers" bench/c/msg_peers.c -lzmq
cc -O2 -o "$out/msg_farm" bench/c/msg_farm.c -lzmq -lpthread
log_build=$(mktemp)
cargo bench --features verbs --bench runtime --bench farm --no-run 2>&1 | tee "$log_build" >&2
bin() { sed -n "s|^ *Executable bench/$1.rs (\(.*\))$|\1|p" "$log_build" | tail -1; }
rt=$(pwd -P)/$(bin runtime)
farm=$(pwd -P)/$(bin farm)
rm -f "$log_build"
for b in "$rt" "$farm"; do [ -x "$b" ] || { echo "runtime-cluster: no benchmark binary at $b" >&2; exit 1; }; done

if [ -n "${SOFTROCE_BENCH_LOG:-}" ]; then
  log=$SOFTROCE_BENCH_LOG
else
  log=$(mktemp); trap 'rm -f "$log"' EXIT
fi
echo "== two Soft-RoCE VMs: rdma-channel, ZeroMQ/TCP and TCP, $rounds round(s)" >&2
t0=$SECONDS
load0=$(cut -d' ' -f1 /proc/loadavg)
# RCH_IB_TIMEOUT: as the cluster's tests (scripts/softroce-cluster-test): the link
# between two TCG guests drops frames when a guest falls behind.
RCH_IB_TIMEOUT=${RCH_IB_TIMEOUT:-18} scripts/softroce-cluster -q --vms 2 --hydra \
  --timeout "${RCH_VM_TIMEOUT:-3000}" -- "$self" --in-vm "$rounds" "$rt" "$farm" \
  "$out/msg_peers" "$out/msg_farm" "$sizes" "$iters" "$bytes" "$min_tasks" "$alt_env" \
  2>&1 | sed -n 's/^\[vm0\] //p' >"$log"
load1=$(cut -d' ' -f1 /proc/loadavg)
echo "== cluster done in $((SECONDS - t0)) s" >&2
grep -E "failed" "$log" >&2 || true

# value SYS PATTERN SIZE: the median over the rounds of "PATTERN SIZE value" lines
value() {
  for r in $(seq "$rounds"); do
    local pat=peers
    [ "$2" = farm ] && pat=farm
    awk -v t="=== BEGIN $pat.$1.$r" -v p="$2" -v s="$3" '
      $0 == t { on = 1; next } /^=== END/ { on = 0 } on && $1 == p && $2 == s { print $3 }' "$log"
  done | median
}

systems=(rch rch1 zmq tcp)
declare -A label=([rch]="rdma-channel" [rch1]="rdma-channel, $alt_label" [zmq]="ZeroMQ/TCP" [tcp]="TCP")
echo
echo "runtime across two Soft-RoCE VMs: $rounds round(s), $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), host load $load0-$load1, medians"
for pattern in pingpong stream farm; do
  echo
  case "$pattern" in
    pingpong) echo "ping-pong, one-way us (seed 004 Table II; $iters round trips a size)" ;;
    stream) echo "one-way stream, MB/s (seed 004 Table I; $bytes bytes a size)" ;;
    farm) echo "farm, task MB/s: VM 0's master (emitter and collector threads), 2 worker processes on VM 1" ;;
  esac
  table_head "rdma-channel / better"
  for s in ${sizes//,/ }; do runtime_row value "$pattern" "$s"; done
done
echo
echo "(rdma-channel: patterns::Messages on RdmaStream over verbs (rxe, rdma_cm), default"
echo " settings, senders batching with send_more where they know more follow (the stream's"
echo " sender, the farm's emitter and workers); '$alt_label': $alt_env;"
echo " ZeroMQ: libzmq's PAIR / PUSH-PULL over TCP; TCP: 4-byte-framed messages,"
echo " TCP_NODELAY. Both VMs TCG, 1 vCPU each, on one 2-core host; RCH_IB_TIMEOUT=${RCH_IB_TIMEOUT:-18}.)"
