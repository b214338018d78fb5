#!/usr/bin/env bash
# Memory per rank and time as ranks per node grow, ch3:rch beside Debian's MPICH
# (ch4:ucx) and Open MPI in one run (seed 003's figures 3-6; issue #32).
#
# usage: bench/scale.sh [--ranks 2,8,32,64] [--patterns hello,pairwise,alltoall,idle[,quiet]]
#                       [--systems rch,deb,ompi] [--lib LABEL=DIR ...] [--out FILE]
#                       [--idle-runs 3] [--probe-max 80] [--csv FILE]
#
# Every system runs bench/c/scale_mpi.c, built with its own mpicc, with every rank
# count and pattern (see that file): the mean and max PSS per rank (KiB, read from
# /proc/self/smaps_rollup before MPI_Finalize), the all-to-all time (slowest rank,
# 4 KiB to every other rank, 3 rounds) and, for `idle`, the zero-byte latency of
# ranks 0 and 1 before and after every rank connected to every other (seed 003,
# figure 6); `quiet` (not in the default set) is `idle` with a 2 ms pause before
# each round trip, so each message finds its receiver waiting with every
# connection quiet (rdma-channel's doorbell, issue #32; ch3:rch polls while it
# waits there, RCH_SPIN=1000000000, as the other MPIs do). `--lib LABEL=DIR` adds a ch3:rch column run with another build of
# rdma-channel's C library (LD_LIBRARY_PATH=DIR, which overrides libmpi's RUNPATH),
# for before/after tables in one run. Systems run interleaved per cell. More ranks
# than this machine's CPUs are oversubscribed; each MPI is left at its own defaults.
# The idle and quiet patterns run --idle-runs times (default 3) per cell, each run between two
# cache-line hand-off probes and run again while either read above --probe-max ns
# (default 80: the shared host's slow phases, bench/lib.sh); its cell gives the
# medians and their ratio. Prints a markdown table (and writes it to --out). A
# benchmark: nothing asserts. `--csv FILE` also writes the figures as CSV, which
# `cargo bench --bench plot -- --scale --csv FILE` draws (seed 003's figures 3-6).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh

ranks=2,8,32,64
patterns=hello,pairwise,alltoall,idle
systems=rch,deb,ompi
out=""
csv=""
libs=()
idle_runs=3
probe_max=80
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) ranks=$2; shift 2 ;;
        --patterns) patterns=$2; shift 2 ;;
        --systems) systems=$2; shift 2 ;;
        --lib) libs+=("$2"); shift 2 ;;
        --out) out=$2; shift 2 ;;
        --csv) csv=$2; shift 2 ;;
        --idle-runs) idle_runs=$2; shift 2 ;;
        --probe-max) probe_max=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "scale.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

need_apt_packages mpich libmpich-dev openmpi-bin libopenmpi-dev
cache=${RCH_MPICH_CACHE:-$HOME/.cache/rdma-channel/mpich}
scripts/mpich-rch --device ch3:rch >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cache/install-rch/bin/mpicc" -O2 -Wno-stringop-overflow -o "$work/scale_rch" bench/c/scale_mpi.c
mpicc.mpich -O2 -Wno-stringop-overflow -o "$work/scale_deb" bench/c/scale_mpi.c
mpicc.openmpi -O2 -Wno-stringop-overflow -o "$work/scale_ompi" bench/c/scale_mpi.c
cc -O2 -pthread -o "$work/probe" bench/c/handoff_probe.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

IFS=, read -r -a sys_list <<<"$systems"
declare -A libdir
for l in "${libs[@]}"; do
    libdir[${l%%=*}]=${l#*=}
    sys_list+=("${l%%=*}")
done

# run SYSTEM NP PATTERN: one line of key=value fields, or "failed".
run() {
    local sys=$1 np=$2 pat=$3 cmd
    # quiet: ch3:rch waits by polling, as the other two MPIs do, so that the figure
    # is the cost of finding the message, not of waking from a sleep (ch3:rch's
    # own default on a host with more ranks than CPUs is to poll 100 times, then
    # sleep).
    local rch_env=(RCH_BENCH_PATTERN="$pat")
    [ "$pat" != quiet ] || rch_env+=(RCH_SPIN=1000000000 RCH_YIELD=0)
    case "$sys" in
        rch) cmd=(env "${rch_env[@]}" "$cache/install-rch/bin/mpiexec" -n "$np" "$work/scale_rch" "$pat") ;;
        deb) cmd=(mpiexec.mpich -n "$np" "$work/scale_deb" "$pat") ;;
        ompi) cmd=(mpirun.openmpi --oversubscribe --mca btl self,vader -n "$np" "$work/scale_ompi" "$pat") ;;
        *) cmd=(env "${rch_env[@]}" LD_LIBRARY_PATH="${libdir[$sys]}" "$cache/install-rch/bin/mpiexec"
                -n "$np" "$work/scale_rch" "$pat") ;;
    esac
    timeout 600 "${cmd[@]}" 2>"$work/err" | grep '^pattern=' || {
        echo "failed"
        sed 's/^/    /' "$work/err" | tail -3 >&2
    }
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

# idle SYSTEM NP: the idle pattern $idle_runs times, each between probes (probed,
# bench/lib.sh); prints a line with the PSS fields of the last run and the median
# latencies, or "failed".
idle() {
    local alone=() peers=() line="" i
    for ((i = 0; i < idle_runs; i++)); do
        line=$(probed run "$1" "$2" "${3:-idle}") || true
        [ "$line" = failed ] && { echo failed; return; }
        alone+=("$(field lat_alone_us "$line")")
        peers+=("$(field lat_idle_peers_us "$line")")
    done
    echo "$line med_alone=$(printf '%s\n' "${alone[@]}" | median) med_peers=$(printf '%s\n' "${peers[@]}" | median)"
}

label() {
    case "$1" in
        rch) echo "ch3:rch" ;; deb) echo "Debian MPICH" ;; ompi) echo "Open MPI" ;;
        *) echo "ch3:rch ($1)" ;;
    esac
}

{
    echo "# bench/scale.sh, $(date -u +%Y-%m-%d), $(nproc) CPUs, rdma-channel $(git rev-parse --short HEAD)"
    echo
    echo "PSS per rank in MiB (mean over ranks, max in brackets); all-to-all time in seconds (3 rounds, and the first, where every pair connects); idle: zero-byte latency in us of ranks 0-1 alone / with every other rank connected and asleep (medians of $idle_runs probed runs, and their ratio)."
    echo
    head="| ranks | pattern |"
    rule="| ---: | --- |"
    for s in "${sys_list[@]}"; do head+=" $(label "$s") |"; rule+=" ---: |"; done
    echo "$head"
    echo "$rule"
} | tee "$work/table"

IFS=, read -r -a np_list <<<"$ranks"
IFS=, read -r -a pat_list <<<"$patterns"
for np in "${np_list[@]}"; do
    for pat in "${pat_list[@]}"; do
        row="| $np | $pat |"
        for s in "${sys_list[@]}"; do
            if [ "$pat" = idle ] || [ "$pat" = quiet ]; then
                line=$(idle "$s" "$np" "$pat")
            else
                line=$(run "$s" "$np" "$pat")
            fi
            if [ "$line" = failed ]; then
                row+=" failed |"
                continue
            fi
            mean=$(field pss_mean_kib "$line")
            max=$(field pss_max_kib "$line")
            cell=$(awk -v a="$mean" -v b="$max" 'BEGIN {printf "%.1f [%.1f]", a / 1024, b / 1024}')
            case "$pat" in
                alltoall) cell+=", $(field time_s "$line") s (first round $(field first_round_s "$line") s)" ;;
                idle|quiet) cell+=$(awk -v a="$(field med_alone "$line")" -v b="$(field med_peers "$line")" \
                    'BEGIN { printf ", %.3f / %.3f us (%.2fx)", a, b, (a > 0 ? b / a : 0) }') ;;
            esac
            row+=" $cell |"
            echo "$s,$(label "$s"),$np,$pat,$(awk -v a="$mean" 'BEGIN {printf "%.2f", a / 1024}'),$(field time_s "$line"),$(field med_alone "$line"),$(field med_peers "$line")" >>"$work/csv"
        done
        echo "$row" | tee -a "$work/table"
    done
done
[ -z "$out" ] || cp "$work/table" "$out"
if [ -n "$csv" ]; then
    {
        echo "# bench/scale.sh, $(date -u +%Y-%m-%d), $(nproc) CPUs, rdma-channel $(git rev-parse --short HEAD)"
        echo "system,label,ranks,pattern,pss_mib,a2a_s,lat_alone_us,lat_peers_us"
        cat "$work/csv" 2>/dev/null
    } >"$csv"
fi
