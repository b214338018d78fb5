#!/usr/bin/env bash
# rdma-channel as a parallel runtime's channel (issue #35, seed 004), side by side
# with what those runtimes use today, between two processes of this host: ZeroMQ (a
# PAIR socket over TCP on the loopback, as FastFlow's external channels) and plain
# TCP (bench/c/msg_peers.c), against rdma-channel's framed messages on a stream
# (`patterns::Messages`, cargo bench --bench runtime). Seed 004's two patterns:
# ping-pong one-way latency at its Table II sizes, and a one-way stream's bandwidth
# at its Table I sizes; and a farm (cargo bench --bench farm; bench/c/msg_farm.c):
# a master process's emitter thread deals tasks of each size to two worker
# processes, which send an 8-byte result each to the master's collector thread
# (ZeroMQ: PUSH/PULL; TCP: a socket per worker and direction, poll(2)), task MB/s.
#
# usage: bench/runtime.sh [--sizes 10,100,...] [--rounds 3] [--probe-max NS]
#
# Interleaved, probe-gated rounds (bench/lib.sh): every system once a round, in a
# rotating order; medians of the kept rounds, with rdma-channel over the better of
# the two (latency: below 1 is ahead; bandwidth: above 1 is ahead). Loopback only.
# It is a benchmark, never a test: nothing here asserts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh

parse_round_options runtime "$@"
[ "$sizes" != 8,64,512,4096,16384,65536,262144,1048576,4194304 ] ||
    sizes=10,100,1024,5000,10000,25000,50000,65536,200000,400000
need_apt_packages build-essential libzmq3-dev

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/msg_peers" bench/c/msg_peers.c -lzmq
cc -O2 -o "$work/msg_farm" bench/c/msg_farm.c -lzmq -lpthread
cargo bench --bench runtime --no-run 2>/dev/null
cargo bench --bench farm --no-run 2>/dev/null
rt=$(ls -t target/release/deps/runtime-* | grep -v '\.d$' | head -1)
farm=$(ls -t target/release/deps/farm-* | grep -v '\.d$' | head -1)
workers=2
iters=2000
bytes=$((64 << 20))

systems=(rch rch1 zmq tcp)
declare -A label=([rch]="rdma-channel" [rch1]="rdma-channel, a put a message" [zmq]="ZeroMQ/TCP" [tcp]="TCP")
run() {
    # A fresh port each run (run is called in a subshell: nothing carries over).
    local port=$((20000 + RANDOM % 20000))
    case "$1" in
        rch) "$rt" "$sizes" "$iters" "$bytes" && "$farm" "$sizes" "$bytes" "$workers" ;;
        rch1) export RCH_BENCH_BATCH=0
            "$rt" "$sizes" "$iters" "$bytes" && "$farm" "$sizes" "$bytes" "$workers" ;;
        zmq) "$work/msg_peers" zmq "$port" "$sizes" "$iters" "$bytes" &&
            "$work/msg_farm" zmq "$((port + 5000))" "$sizes" "$bytes" "$workers" ;;
        tcp) "$work/msg_peers" tcp "$port" "$sizes" "$iters" "$bytes" &&
            "$work/msg_farm" tcp "$((port + 5000))" "$sizes" "$bytes" "$workers" ;;
    esac
}
run_round() { probed_round runtime; }
keep_rounds runtime

# The median of pattern $2 at size $3 of system $1.
med() { cat "$work/$1".round* 2>/dev/null | awk -v p="$2" -v s="$3" '$1 == p && $2 == s { print $3 }' | median; }

echo
echo "runtime: $kept rounds kept, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), medians"
for pattern in pingpong stream farm; do
    echo
    case "$pattern" in
        pingpong) echo "ping-pong, one-way us (seed 004 Table II)" ;;
        stream) echo "one-way stream, MB/s (seed 004 Table I)" ;;
        farm) echo "farm, task MB/s: a master (emitter and collector threads), $workers worker processes" ;;
    esac
    table_head "rdma-channel / better"
    for s in ${sizes//,/ }; do runtime_row med "$pattern" "$s"; done
done
