#!/usr/bin/env bash
# The two-copy heap path against single copy, by the host's cross-core regime: how
# large messages between two ranks fare when a cache line's hand-off from one core to
# the other is fast (~30 ns here) and when it is slow (~170 ns; this shared host
# switches between the two for seconds to minutes).
#
# usage: bench/heap-path-phases.sh [--seconds 900] [--raw FILE]
#
# For --seconds, runs in turn: OSU osu_latency (64 KiB - 1 MiB), osu_bw (256 KiB -
# 4 MiB) and IMB PingPing (1-4 MiB) on MPICH with ch3:rch as it is (from 64 KiB the
# path the receiver measures faster: "adaptive"), with RCH_ZCOPY_ADAPTIVE=off
# (always the ring), with zero-copy forced from 64 KiB read whole ("read",
# process_vm_readv) and split half and half with the sender ("split",
# RCH_ZCOPY_PUSH=50, as the adaptive path does), on Debian's MPICH and on Open MPI
# (both copy once through CMA); two ranks bound to CPUs 0 and 1, the hand-off probe
# (bench/c/handoff_probe.c) before and after each run. Runs whose two probes read
# <= 80 ns count as the fast regime, >= 120 ns as the slow one (the rest are left
# out); prints each variant's medians per regime: one-way latency in us, bandwidth
# in MB/s. Uses the builds of bench/mpi-level.sh (run it once first). A benchmark:
# nothing asserts. (Raw files before 2026-12-03 have no latency and no "read"/"split"
# variants: "single-copy" was read from 256 KiB.)
set -euo pipefail
here=$(pwd)
cd "$(dirname "$0")/.."
seconds=900
raw=
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --raw) raw=$(cd "$here" && realpath -m "$2"); shift 2 ;;
        *) echo "heap-path-phases: unknown argument '$1' (see the script's header)" >&2; exit 2 ;;
    esac
done
programs=${RCH_PROGRAMS_CACHE:-$HOME/.cache/rdma-channel/programs}
rch=${RCH_MPICH_CACHE:-$HOME/.cache/rdma-channel/mpich}/install-rch
for b in perf-rch perf-deb perf-ompi; do
    [ -x "$programs/build/$b/imb/IMB-MPI1" ] ||
        { echo "heap-path-phases: no $b build; run bench/mpi-level.sh once first" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -pthread -o "$work/probe" bench/c/handoff_probe.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
: > "$work/raw"
end=$(($(date +%s) + seconds))
while [ "$(date +%s)" -lt "$end" ]; do
    for v in adaptive ring read split deb ompi; do
        env=(X=1) build=perf-rch launch=("$rch/bin/mpiexec" -bind-to core -n 2)
        forced=(RCH_ZCOPY_ADAPTIVE=off RCH_ZCOPY_PRIVATE_THRESHOLD=65536)
        case $v in
            ring) env=(RCH_ZCOPY_ADAPTIVE=off) ;;
            read) env=("${forced[@]}" RCH_ZCOPY_PUSH=0) ;;
            split) env=("${forced[@]}" RCH_ZCOPY_PUSH=50) ;;
            deb) build=perf-deb launch=(mpiexec.mpich -bind-to core -n 2) ;;
            ompi) build=perf-ompi launch=(mpiexec.openmpi --bind-to core -n 2) ;;
        esac
        dir=$programs/build/$build
        p0=$("$work/probe")
        lat=$(env "${env[@]}" "${launch[@]}" "$dir/osu/c/mpi/pt2pt/standard/osu_latency" -m 65536:1048576 |
            awk '$1 ~ /^[0-9]+$/ { printf "%s ", $2 }')
        bw=$(env "${env[@]}" "${launch[@]}" "$dir/osu/c/mpi/pt2pt/standard/osu_bw" -m 262144:4194304 |
            awk '$1 ~ /^[0-9]+$/ { printf "%s ", $2 }')
        pp=$(cd "$work" && env "${env[@]}" "${launch[@]}" "$dir/imb/IMB-MPI1" -msglog 20:22 PingPing |
            awk '/#bytes/ { on = 1; next } on && $1 ~ /^[0-9]+$/ && $1 > 0 { printf "%s ", $4 }')
        p1=$("$work/probe")
        echo "$(date +%T) $v $p0 $p1 lat: $lat bw: $bw pingping: $pp" >> "$work/raw"
    done
done
[ -z "$raw" ] || cp "$work/raw" "$raw"
echo "heap-path-phases: $(wc -l < "$work/raw") runs, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD); medians (latency us, bandwidth MB/s)"
echo "| regime | variant | runs | osu_latency 64 KiB | 256 KiB | 1 MiB | osu_bw 256 KiB | 1 MiB | 4 MiB | PingPing 1 MiB | 4 MiB |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
# A line: time variant probe0 probe1 "lat:" 64K 128K 256K 512K 1M
#         "bw:" 256K 512K 1M 2M 4M "pingping:" 1M 2M 4M
awk 'NF == 20 {
       ph = ($3 <= 80 && $4 <= 80) ? "fast" : (($3 >= 120 && $4 >= 120) ? "slow" : "")
       if (ph == "") next
       k = ph " | " $2; n[k]++
       for (c = 1; c <= 8; c++) f[k, c] = f[k, c] " " $(col[c]) }
     BEGIN { split("6 8 10 12 14 16 18 20", col, " ") }
     function med(s,   a, m, i, j, t) {
         m = split(s, a, " ")
         for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
         return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
     END { for (k in n) {
               printf "| %s | %d |", k, n[k]
               for (c = 1; c <= 8; c++) printf (c <= 3 ? " %.1f |" : " %.0f |"), med(f[k, c])
               print "" } }' \
    "$work/raw" | sort
