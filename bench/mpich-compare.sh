#!/usr/bin/env bash
# MPI-level latency and bandwidth of MPICH on rdma-channel (ch3:rch) beside the
# channel's own C-level figures, the same MPICH with ch3:sock, Debian's MPICH
# (ch4:ucx) and Open MPI, in one interleaved run on this host.
#
# usage: bench/mpich-compare.sh [--sizes 8,64,...] [--rounds 3] [--probe-max NS]
#                               [--before PREFIX]
#
# Every system runs bench/c/osu_mpi.c (the channel's column: bench/c/osu.c through
# ffi/rch.h under rch-run, `cargo bench --bench capi_osu`), two ranks pinned to CPUs 0
# and 1, heap buffers. A round runs every system once, in a different order each
# round; the cache-line hand-off probe (bench/c/handoff_probe.c) runs before and after
# each round, and a round where it read above --probe-max ns (default 80; the shared
# host sometimes slows to ~200 ns for seconds) or where another process used more
# than 10% of a CPU is thrown away and run again. Medians of the kept rounds.
# --before PREFIX adds a column for an MPICH with ch3:rch installed at PREFIX from an
# earlier commit (`scripts/install-c PREFIX` on a copy of the install made by
# scripts/mpich-rch, at that commit), run in the same rounds, and a column "ch3:rch /
# before": a change judged side by side.
# It is a benchmark, never a test: nothing here asserts.
set -euo pipefail
here=$(pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)
. scripts/deps.sh
. bench/lib.sh

before=
rest=()
while [ $# -gt 0 ]; do
    case "$1" in
        --before)
            before=$(cd "$here" && realpath -m "$2")
            [ -x "$before/bin/mpicc" ] && [ -x "$before/bin/mpiexec" ] ||
                { echo "mpich-compare: --before $2 holds no bin/mpicc and bin/mpiexec" >&2; exit 2; }
            shift 2 ;;
        *) rest+=("$1"); shift ;;
    esac
done
parse_round_options mpich-compare "${rest[@]}"

need_apt_packages mpich libmpich-dev openmpi-bin libopenmpi-dev
cache=${RCH_MPICH_CACHE:-$HOME/.cache/rdma-channel/mpich}
scripts/mpich-rch --device ch3:rch >/dev/null
scripts/mpich-rch --device ch3:sock >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cflags=(-O2 -Wno-stringop-overflow)
"$cache/install-rch/bin/mpicc" "${cflags[@]}" -o "$work/osu_rch" bench/c/osu_mpi.c
"$cache/install-sock/bin/mpicc" "${cflags[@]}" -o "$work/osu_sock" bench/c/osu_mpi.c
mpicc.mpich "${cflags[@]}" -o "$work/osu_deb" bench/c/osu_mpi.c
[ -z "$before" ] || "$before/bin/mpicc" "${cflags[@]}" -o "$work/osu_before" bench/c/osu_mpi.c
mpicc.openmpi "${cflags[@]}" -o "$work/osu_ompi" bench/c/osu_mpi.c
cargo bench --bench capi_osu --no-run >/dev/null 2>&1

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
systems=(channel rch ${before:+before} sock deb ompi)
declare -A label=(
    [channel]="rdma-channel C (rch.h)"
    [rch]="MPICH ch3:rch"
    [before]="MPICH ch3:rch before"
    [sock]="MPICH ch3:sock"
    [deb]="Debian MPICH ch4:ucx"
    [ompi]="Open MPI"
)
run() {
    case "$1" in
        channel) cargo bench -q --bench capi_osu -- --sizes "$sizes" 2>/dev/null ;;
        rch) "$cache/install-rch/bin/mpiexec" -n 2 "$work/osu_rch" --sizes "$sizes" ;;
        before) "$before/bin/mpiexec" -n 2 "$work/osu_before" --sizes "$sizes" ;;
        sock) "$cache/install-sock/bin/mpiexec" -n 2 "$work/osu_sock" --sizes "$sizes" ;;
        deb) mpiexec.mpich -n 2 "$work/osu_deb" --sizes "$sizes" ;;
        ompi) mpirun.openmpi -np 2 --bind-to none "$work/osu_ompi" --sizes "$sizes" ;;
    esac | awk '/^ *[0-9]+ +[0-9.]+ +[0-9.]+$/ { print $1, $2, $3 }'
}
run_round() { probed_round mpich-compare; }
keep_rounds mpich-compare


# One markdown table: field 2 (latency, us) or 3 (bandwidth, GB/s), with ch3:rch's
# difference from the channel's own figure and its ratio to Debian's MPICH.
table() {
    local field=$1 title=$2 diff_fmt=$3
    echo
    echo "$title, medians of $kept rounds; ranks on CPUs 0 and 1, heap buffers"
    table_head "ch3:rch vs channel" "ch3:rch / Debian" ${before:+"ch3:rch / before"}
    for z in ${sizes//,/ }; do
        printf '| %s |' "$z"
        for s in "${systems[@]}"; do printf ' %s |' "$(col "$s" "$z" "$field")"; done
        awk -v a="$(col rch "$z" "$field")" -v c="$(col channel "$z" "$field")" \
            -v d="$(col deb "$z" "$field")" -v f="$diff_fmt" \
            -v b="${before:+$(col before "$z" "$field")}" \
            'BEGIN { if (f == "diff") printf " %+.3f us |", a - c; else printf " %.2fx |", a / c;
                     printf " %.2fx |", a / d
                     if (b != "") printf(b + 0 == 0 ? " - |" : " %.3f |", a / b)
                     printf "\n" }'
    done
}
table 2 "MPI-level one-way latency (us)" diff
table 3 "Bandwidth (GB/s, 64 messages in flight)" ratio
