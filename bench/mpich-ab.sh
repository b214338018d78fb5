#!/usr/bin/env bash
# MPI-level A/B of two builds of rdma-channel's C library under ch3:rch, beside
# Debian's MPICH (ch4:ucx), in one interleaved run: for "did this change make MPI
# slower?" without rebuilding MPICH twice.
#
# usage: bench/mpich-ab.sh A_PREFIX B_PREFIX [--sizes 8,64,...] [--rounds 3] [--probe-max NS]
#
# A_PREFIX and B_PREFIX are ch3:rch installs made by scripts/mpich-rch (copy
# $RCH_MPICH_CACHE/install-rch aside before rebuilding at the other commit). Each
# runs bench/c/osu_mpi.c built with its own mpicc, with LD_LIBRARY_PATH set to its
# lib (which overrides libmpi's RUNPATH), two ranks pinned to CPUs 0 and 1, heap
# buffers; rounds under bench/lib.sh's probe and load checks, medians of the kept
# rounds, and B / A ratios (latency: below 1 is faster; bandwidth: above 1 is
# faster). A benchmark, never a test: nothing here asserts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh
[ $# -ge 2 ] || { sed -n '2,14p' "$0"; exit 2; }
a_prefix=$(realpath "$1") b_prefix=$(realpath "$2")
shift 2
parse_round_options mpich-ab "$@"
need_apt_packages mpich libmpich-dev

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cflags=(-O2 -Wno-stringop-overflow)
LD_LIBRARY_PATH="$a_prefix/lib" "$a_prefix/bin/mpicc" "${cflags[@]}" -o "$work/osu_a" bench/c/osu_mpi.c
LD_LIBRARY_PATH="$b_prefix/lib" "$b_prefix/bin/mpicc" "${cflags[@]}" -o "$work/osu_b" bench/c/osu_mpi.c
mpicc.mpich "${cflags[@]}" -o "$work/osu_deb" bench/c/osu_mpi.c

systems=(a b deb)
run() {
    case "$1" in
        a) LD_LIBRARY_PATH="$a_prefix/lib" "$a_prefix/bin/mpiexec" -n 2 "$work/osu_a" --sizes "$sizes" ;;
        b) LD_LIBRARY_PATH="$b_prefix/lib" "$b_prefix/bin/mpiexec" -n 2 "$work/osu_b" --sizes "$sizes" ;;
        deb) mpiexec.mpich -n 2 "$work/osu_deb" --sizes "$sizes" ;;
    esac | awk '/^ *[0-9]+ +[0-9.]+ +[0-9.]+$/ { print $1, $2, $3 }'
}
run_round() { probed_round mpich-ab; }
keep_rounds mpich-ab
echo
echo "A: $a_prefix"
echo "B: $b_prefix"
echo "medians of $kept rounds, two ranks on CPUs 0 and 1, heap buffers (bench/c/osu_mpi.c)"
echo
echo "| size | latency A (us) | latency B (us) | B / A | Debian MPICH (us) | bandwidth A (GB/s) | bandwidth B (GB/s) | B / A | Debian MPICH (GB/s) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for z in ${sizes//,/ }; do
    la=$(col a "$z" 2) lb=$(col b "$z" 2) ld=$(col deb "$z" 2)
    ba=$(col a "$z" 3) bb=$(col b "$z" 3) bd=$(col deb "$z" 3)
    awk -v z="$z" -v la="$la" -v lb="$lb" -v ld="$ld" -v ba="$ba" -v bb="$bb" -v bd="$bd" 'BEGIN {
        printf "| %s | %s | %s | %.3f | %s | %s | %s | %.3f | %s |\n", z, la, lb, lb / la, ld, ba, bb, bb / ba, bd }'
done
