#!/usr/bin/env bash
# Two builds of the pingpong benchmark side by side: A and B alternate within each
# round, so a change is judged against the same moment's machine. For a refactoring,
# build `cargo bench --bench pingpong --no-run` at both commits and pass the two
# binaries (target/release/deps/pingpong-*).
#
# usage: bench/ab.sh A_BINARY B_BINARY [--sizes 8,4096,...] [--rounds 3] [--probe-max NS]
#
# Rounds run under the probe and load checks of bench/lib.sh (rejected and redone
# when the machine was slow or busy); medians of the kept rounds, and B / A ratios
# (latency: below 1 is faster; bandwidth: above 1 is faster). A benchmark, never a
# test: nothing here asserts.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
a_bin=$(realpath "$1") b_bin=$(realpath "$2")
shift 2
parse_round_options ab "$@"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
systems=(a b)
declare -A bin=([a]=$a_bin [b]=$b_bin)
run_one() {
    "${bin[$1]}" --sizes "$sizes" 2>/dev/null |
        awk '/^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$/ { print $1, $2, $3 }'
}
run_round() {
    local s
    for s in "${order[@]}"; do
        probed run_one "$s" > "$work/$s.round$kept" || true
    done
}
keep_rounds ab
echo
echo "A: $a_bin"
echo "B: $b_bin"
echo "medians of $kept rounds, two processes on CPUs 0 and 1, heap buffers"
echo
echo "| size | latency A (us) | latency B (us) | B / A | bandwidth A (GB/s) | bandwidth B (GB/s) | B / A |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for z in ${sizes//,/ }; do
    la=$(col a "$z" 2) lb=$(col b "$z" 2) ba=$(col a "$z" 3) bb=$(col b "$z" 3)
    awk -v z="$z" -v la="$la" -v lb="$lb" -v ba="$ba" -v bb="$bb" 'BEGIN {
        printf "| %s | %s | %s | %.3f | %s | %s | %.3f |\n", z, la, lb, lb / la, ba, bb, bb / ba }'
done
