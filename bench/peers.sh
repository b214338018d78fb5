#!/usr/bin/env bash
# rdma-channel's pingpong beside the shared-memory stacks Debian ships (MPICH, Open
# MPI, UCX) on this host: one-way latency and windowed bandwidth per message size, in
# one interleaved run, as two markdown tables with the best peer and our ratio to it,
# a CSV and a plot. Installs what it needs (Debian packages); runs anywhere the
# repository builds.
#
# usage: bench/peers.sh [--sizes 8,64,...] [--rounds 3] [--probe-max NS]
#                       [--csv FILE] [--plot FILE.svg] [--before PINGPONG_BINARY]
#
# Systems (two processes or ranks pinned to CPUs 0 and 1, heap buffers):
#   rdma-channel        `cargo bench --bench pingpong` (bench/pingpong.rs), defaults
#   rdma-channel-alloc  the same with `--alloc` (alloc_mem buffers): informational, not
#                       a peer; the ratio compares the heap column, as an MPI
#                       application's buffers are
#   rdma-channel-inplace
#                       the same with `--in-place`: heap buffers, received in place
#                       (Receiver::peek and consume, bytes not read), the way ucx-am
#                       receives; informational, not a peer
#   mpich-ucx           Debian's MPICH (ch4:ucx); UCX's default transports here are
#                       the same as UCX_TLS=sm,self (sysv shared memory + CMA single
#                       copy), so that setting has no column of its own
#   mpich-ucx-mm        the same with UCX_TLS=mm,self: shared memory, no CMA
#   ompi-vader-cma      Open MPI, --mca pml ob1 --mca btl vader,self (CMA single copy)
#   ompi-vader-copy     the same with --mca btl_vader_single_copy_mechanism none
#   ompi-ucx            Open MPI, --mca pml ucx --mca pml_ucx_tls any. Open MPI 4.1
#                       selects pml ucx only when one of pml_ucx_tls (default: verbs,
#                       mlx5, cuda/rocm ipc) is present, so on shared memory alone
#                       `--mca pml ucx` fails with "PML ucx cannot be selected";
#                       "any" lifts that (pml_ucx_devices only sets its priority)
#   rdma-channel-before
#                       with --before: an earlier build of the same pingpong (build
#                       `cargo bench --bench pingpong --no-run` at that commit and
#                       pass target/release/deps/pingpong-*), heap buffers, in the
#                       same rounds: a change judged side by side with the peers;
#                       not a peer, and the tables gain a column "ours / before"
#   ucx-tag, ucx-stream, ucx-am
#                       ucx_perftest (ucx-utils), UCX_TLS=sm,self: tag_lat/tag_bw,
#                       stream_lat/stream_bw, ucp_am_lat/ucp_am_bw
# The MPI columns run bench/c/osu_mpi.c built with each library's mpicc, the
# measurement of bench/pingpong.rs: latency = half the mean round trip; bandwidth =
# 64 messages in flight into one receive buffer, then a 4-byte acknowledgement.
# ucx_perftest measures in its own way: latency is also half the mean round trip,
# and it too receives into one buffer, but its bandwidth test streams without
# acknowledgements, each send started once fewer than -O are incomplete (a sliding
# window; we pass -O 64, against its default 32 for tag and am and 1 for stream).
# That spares it the window's acknowledgement round trip, which weighs on small
# messages, so its small-message bandwidth is a little flattered. Its am test also
# leaves each message where it landed: the handler gets a pointer into UCX's
# receive buffer and does not copy it out (ucp_tests.cc, am_data_handler), so
# ucx-am is a one-copy measurement where the others deliver into the caller's
# buffer. Its MB/s are 2^20
# bytes/s; they are converted to GB/s of 10^9 bytes as everywhere else. Iteration
# counts follow bench/c/osu_common.h (latency round trips; bandwidth 64 messages per
# window), so each system spends about as long on a size. ucx_perftest's server
# listens on every interface and takes one test: each test starts a server on a free
# port and its client connects over 127.0.0.1, both inside a private network
# namespace (only its loopback) when `unshare -rn` is allowed.
#
# A round runs every system once, in a different order each round; the cache-line
# hand-off probe (bench/c/handoff_probe.c) runs before and after each system's turn,
# which is run again (up to four tries) when it read above --probe-max ns (default
# 80; the shared host slows to ~200 ns for seconds at a time, often several times a
# minute), and before and after each round, which is thrown away and run again when
# the probe read too high or another process used more than 10% of a CPU
# (bench/lib.sh). Figures are medians of the kept
# rounds. "best peer" is the best of the peer columns per size (all but ours):
# lowest latency, highest bandwidth; "ours / best" is rdma-channel (heap) over it:
# latency at or below 1 and bandwidth at or above 1 are ours ahead.
#
# Output: the two tables on stdout; --csv FILE (default
# $CARGO_TARGET_DIR/peers/peers.csv, else target/peers/peers.csv): one line per
# system and size, `system,label,size,latency_us,bw_GBps`, after comments with the
# date, rounds and host; --plot FILE (default: the CSV's with .svg): latency and
# bandwidth curves drawn from it by `cargo bench --bench plot` (bench/plot.rs).
# It is a benchmark, never a test: nothing here asserts.
set -euo pipefail
here=$(pwd)
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh

csv=${CARGO_TARGET_DIR:-target}/peers/peers.csv
plot=
before=
rest=()
while [ $# -gt 0 ]; do
    case "$1" in
        # Relative to where the script was started, as the user typed them.
        --csv) csv=$(cd "$here" && realpath -m "$2"); shift 2 ;;
        --plot) plot=$(cd "$here" && realpath -m "$2"); shift 2 ;;
        --before)
            before=$(cd "$here" && realpath -m "$2")
            [ -x "$before" ] || { echo "peers: --before $2 is not an executable" >&2; exit 2; }
            shift 2 ;;
        *) rest+=("$1"); shift ;;
    esac
done
parse_round_options peers "${rest[@]}"
plot=${plot:-${csv%.csv}.svg}
mkdir -p "$(dirname "$csv")" "$(dirname "$plot")"

need_rust
need_apt_packages mpich libmpich-dev openmpi-bin libopenmpi-dev ucx-utils iproute2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cflags=(-O2 -Wno-stringop-overflow)
mpicc.mpich "${cflags[@]}" -o "$work/osu_mpich" bench/c/osu_mpi.c
mpicc.openmpi "${cflags[@]}" -o "$work/osu_ompi" bench/c/osu_mpi.c
cargo bench --bench pingpong --no-run >/dev/null 2>&1
cargo bench --bench plot --no-run >/dev/null 2>&1

# The Debian version without its revision: 4.0.2-3+b1 -> 4.0.2.
version() { dpkg-query -W -f='${Version}' "$1" | sed 's/-[^-]*$//; s/^[0-9]*://'; }
mpich_v=$(version mpich) ompi_v=$(version openmpi-bin) ucx_v=$(version ucx-utils)

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ours=rdma-channel
peers=(mpich-ucx mpich-ucx-mm ompi-vader-cma ompi-vader-copy ompi-ucx ucx-tag ucx-stream ucx-am)
systems=(rdma-channel ${before:+rdma-channel-before} rdma-channel-alloc rdma-channel-inplace "${peers[@]}")
# Labels go into the CSV unquoted: no commas.
declare -A label=(
    [rdma-channel]="rdma-channel (heap)"
    [rdma-channel-alloc]="rdma-channel (alloc_mem)"
    [rdma-channel-inplace]="rdma-channel (heap; in place)"
    [rdma-channel-before]="rdma-channel before (heap)"
    [mpich-ucx]="MPICH $mpich_v ch4:ucx"
    [mpich-ucx-mm]="MPICH $mpich_v ch4:ucx UCX_TLS=mm+self"
    [ompi-vader-cma]="Open MPI $ompi_v ob1+vader (CMA)"
    [ompi-vader-copy]="Open MPI $ompi_v ob1+vader (no single copy)"
    [ompi-ucx]="Open MPI $ompi_v pml ucx"
    [ucx-tag]="UCX $ucx_v tag (ucx_perftest)"
    [ucx-stream]="UCX $ucx_v stream (ucx_perftest)"
    [ucx-am]="UCX $ucx_v am (ucx_perftest)"
)
declare -A ucx_test=([ucx-tag]=tag [ucx-stream]=stream [ucx-am]=ucp_am)

# bench/c/osu_common.h's iteration counts: round trips, and windows of 64.
lat_iters() { awk -v s="$1" 'BEGIN { n = int(20000000 / (s + 2000)); print (n < 50 ? 50 : n > 20000 ? 20000 : n) }'; }
bw_iters() { awk -v s="$1" 'BEGIN { n = int(2000000000 / (s * 64 + 100000)); print (n < 5 ? 5 : n > 2000 ? 2000 : n) }'; }

# One ucx_perftest test, server on CPU 1 and client on CPU 0: prints the client's
# CSV line (iterations,percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,...)
# without the spaces that pad its iteration count to 4 characters.
# In a private network namespace every port is free; the search is for when there
# is none. A failed client leaves its server waiting for a connection: ended here.
ucx_pair() {
    local port=13337 server out i
    while ss -Htan "sport = :$port" | grep -q .; do port=$((port + 1)); done
    UCX_TLS=sm,self timeout 300 ucx_perftest -c 1 -p "$port" >/dev/null 2>&1 &
    server=$!
    for ((i = 0; i < 100; i++)); do
        ss -Hltn "sport = :$port" | grep -q . && break
        sleep 0.05
    done
    if ! out=$(UCX_TLS=sm,self timeout 300 ucx_perftest 127.0.0.1 -p "$port" -c 0 "$@" -f -v); then
        kill "$server" 2>/dev/null
        wait "$server" || true
        return 1
    fi
    wait "$server"
    tail -n 1 <<< "$out" | tr -d ' '
}
# The command that runs the ucx_perftest pairs: in a network namespace of their own
# with only its loopback up, when this user may make one.
if unshare -rn true 2>/dev/null; then
    isolate=(unshare -rn bash -c 'ip link set lo up && exec "$@"' _)
else
    isolate=()
    echo "peers: unshare -rn is not allowed here; ucx_perftest's server listens on every interface while it runs" >&2
fi
# "size latency_us bw_GB/s" lines of ucx_perftest's tests $1_lat and $1_bw (tag,
# stream, ucp_am) for every size.
run_ucx() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    "${isolate[@]}" bash -c '
        set -euo pipefail
        for z in ${sizes//,/ }; do
            l=$(lat_iters "$z") b=$(bw_iters "$z")
            lat=$(ucx_pair -t "$1_lat" -s "$z" -n "$l" -w $((l / 10 + 10)))
            bw=$(ucx_pair -t "$1_bw" -s "$z" -O 64 -n $((b * 64)) -w $(((b / 10 + 2) * 64)))
            echo "$z $lat $bw"
        done' _ "$1" |
        awk -F'[ ,]' 'NF >= 15 { printf "%s %s %.3f\n", $1, $5, $15 * 1048576 / 1e9 }'
}
export -f ucx_pair lat_iters bw_iters
export sizes

run() {
    case "$1" in
        rdma-channel) cargo bench -q --bench pingpong -- --sizes "$sizes" 2>/dev/null ;;
        rdma-channel-alloc) cargo bench -q --bench pingpong -- --sizes "$sizes" --alloc 2>/dev/null ;;
        rdma-channel-inplace) cargo bench -q --bench pingpong -- --sizes "$sizes" --in-place 2>/dev/null ;;
        rdma-channel-before) "$before" --sizes "$sizes" 2>/dev/null ;;
        mpich-ucx) mpiexec.mpich -n 2 "$work/osu_mpich" --sizes "$sizes" ;;
        mpich-ucx-mm) UCX_TLS=mm,self mpiexec.mpich -n 2 "$work/osu_mpich" --sizes "$sizes" ;;
        ompi-vader-cma)
            mpirun.openmpi -np 2 --bind-to none --mca pml ob1 --mca btl vader,self \
                "$work/osu_ompi" --sizes "$sizes" ;;
        ompi-vader-copy)
            mpirun.openmpi -np 2 --bind-to none --mca pml ob1 --mca btl vader,self \
                --mca btl_vader_single_copy_mechanism none "$work/osu_ompi" --sizes "$sizes" ;;
        ompi-ucx)
            mpirun.openmpi -np 2 --bind-to none --mca pml ucx --mca pml_ucx_tls any \
                "$work/osu_ompi" --sizes "$sizes" ;;
        ucx-*) run_ucx "${ucx_test[$1]}" ;;
    esac | awk '/^ *[0-9]+ +[0-9.]+ +[0-9.]+( +[0-9.]+)?$/ { print $1, $2, $3 }'
}
run_round() {
    local s
    for s in "${order[@]}"; do
        probed run "$s" > "$work/$s.round$kept" || echo "peers: $s failed" >&2
        # A system that printed fewer sizes than asked failed too.
        if [ "$(wc -l < "$work/$s.round$kept")" -ne "$(tr , '\n' <<< "$sizes" | wc -l)" ]; then
            echo "peers: $s gave $(wc -l < "$work/$s.round$kept") of the sizes" >&2
            round_ok=0
        fi
    done
}
keep_rounds peers
[ "$kept" -gt 0 ] || { echo "peers: no round kept, nothing to show" >&2; exit 1; }
# When keep_rounds gave up, its last round (not kept) left files under the next number.
rm -f "$work"/*.round"$kept"

# One markdown table of field $1 (2 latency, 3 bandwidth); $2 is min or max, which
# is best.
table() {
    local field=$1 best=$2 title=$3 z s
    echo
    echo "$title, medians of $kept round(s); CPUs 0 and 1, heap buffers (but rdma-channel (alloc_mem)); ours / best compares rdma-channel (heap)"
    echo
    table_head "best peer" "ours / best" ${before:+"ours / before"}
    for z in ${sizes//,/ }; do
        for s in "${systems[@]}"; do echo "$s $(col "$s" "$z" "$field")"; done |
            awk -v z="$z" -v best="$best" -v ours="$ours" -v peers=" ${peers[*]} " '
                { name[NR] = $1; v[$1] = $2 }
                END {
                    printf "| %s |", z
                    for (i = 1; i <= NR; i++) printf " %s |", v[name[i]]
                    b = ""
                    for (i = 1; i <= NR; i++) {
                        n = name[i]
                        if (index(peers, " " n " ") == 0 || v[n] == "-") continue
                        if (b == "" || (best == "min" ? v[n] < v[b] : v[n] > v[b])) b = n
                    }
                    if (b == "" || v[ours] == "-" || v[b] == 0) printf " - | - |"
                    else printf " %s (%s) | %.2f |", v[b], b, v[ours] / v[b]
                    if ("rdma-channel-before" in v)
                        printf(v[ours] == "-" || v["rdma-channel-before"] + 0 == 0 ? " - |" : " %.3f |",
                               v[ours] / v["rdma-channel-before"])
                    printf "\n"
                }'
    done
}
table 2 min "One-way latency (us)"
table 3 max "Bandwidth (GB/s, 64 messages in flight)"

{
    # The first line is the plot's caption: when, how many rounds, how strict, where.
    echo "# bench/peers.sh $(date -u +%Y-%m-%d): medians of $kept round(s), probe max $probe_max ns, $(nproc) CPUs: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    echo "# latency = half the mean round trip (us); bandwidth = 64 in flight (GB/s = 1e9 B/s); two processes or ranks on CPUs 0 and 1, heap buffers but rdma-channel-alloc; rdma-channel-inplace receives in place"
    echo "system,label,size,latency_us,bw_GBps"
    for s in "${systems[@]}"; do
        for z in ${sizes//,/ }; do
            echo "$s,${label[$s]},$z,$(col "$s" "$z" 2),$(col "$s" "$z" 3)"
        done
    done
} > "$csv"
echo
echo "CSV: $csv"
cargo bench -q --bench plot -- --csv "$csv" --out "$plot" >/dev/null
echo "plot: $plot"
