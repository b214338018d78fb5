#!/usr/bin/env bash
# The MPI level, measured with programs nobody here wrote: Intel MPI Benchmarks
# PingPong and PingPing and the OSU micro-benchmarks' osu_latency and osu_bw, on MPICH
# with ch3:rch beside Debian's MPICH (ch4:ucx) and Open MPI, in one interleaved run on
# this host.
#
# usage: bench/mpi-level.sh [--sizes 8,64,...] [--rounds 3] [--probe-max NS]
#                           [--before PREFIX [--before-label L]] [--floor] [--csv FILE]
#                           [--variant 'LABEL:VAR=VALUE ...']... [--programs P,...]
#
# Every MPI builds IMB-MPI1 (no -DCHECK: a timing build; -O2) and OSU 7.4's
# point-to-point programs with its own mpicc, from the sources scripts/mpi-programs
# keeps (give them once with its --source). Two ranks bound to cores (Hydra's
# `-bind-to core`, Open MPI's `--bind-to core`: CPUs 0 and 1), buffers from malloc as
# the programs make them. A round runs every MPI once, in a different order each
# round; each program of an MPI's turn (IMB PingPong, IMB PingPing, osu_latency,
# osu_bw) runs between two hand-off probes (bench/c/handoff_probe.c) and is run
# again while one read above --probe-max ns (default 80), and a round is
# thrown away when the probes around it read slow or another process used more than
# 10% of a CPU
# (bench/lib.sh). Prints medians of the kept rounds: one-way latency in us (IMB's
# t[usec] is half the round trip in PingPong, the time of a simultaneous exchange in
# PingPing; OSU's is half the round trip) and bandwidth in MB/s (10^6 bytes), with
# ch3:rch over the better peer (latency: below 1 is ahead; bandwidth: above 1 is
# ahead). --before PREFIX adds an MPICH with ch3:rch installed at PREFIX from an
# earlier commit, run in the same rounds (--before-label names its column, e.g.
# "ch3:nemesis" for an install of `scripts/mpich-rch --device ch3:nemesis`). --floor
# adds a column of what each pattern costs with only its copies and a flag per message
# (bench/c/copy_floor.c: one process_vm_readv, or a copy in and out of shared memory,
# whichever is faster), run in the same rounds: how far above the host's floor each
# MPI is, and whether a gap between them is protocol or copying (from 256 KiB it is
# one core's copy, which a transfer split between both cores beats). --csv FILE
# writes every kept figure. --variant 'LABEL:VAR=VALUE ...' (repeatable) adds a
# column of ch3:rch with those environment variables set for the run, in the same
# rounds (e.g. 'zc:RCH_ZCOPY_PRIVATE_THRESHOLD=16k', or
# 'old:LD_LIBRARY_PATH=/tmp/old-lib' for another build of the channel's library,
# which overrides libmpi's RUNPATH). --programs limits each turn to some of
# PingPong, PingPing, osu_latency and osu_bw: an IMB run of a few sizes takes under
# a second, so a targeted comparison can afford 20-30 rounds.
# It is a benchmark, never a test: nothing here asserts.
set -euo pipefail
here=$(pwd)
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh

before=
before_label="ch3:rch before"
floor=
csv=
variants=()
programs_run=PingPong,PingPing,osu_latency,osu_bw
rest=()
while [ $# -gt 0 ]; do
    case "$1" in
        --before)
            before=$(cd "$here" && realpath -m "$2"); shift 2
            [ -x "$before/bin/mpicc" ] && [ -x "$before/bin/mpiexec" ] ||
                { echo "mpi-level: --before holds no bin/mpicc and bin/mpiexec" >&2; exit 2; } ;;
        --before-label) before_label=$2; shift 2 ;;
        --floor) floor=1; shift ;;
        --csv) csv=$(cd "$here" && realpath -m "$2"); shift 2 ;;
        --variant)
            [[ "$2" =~ ^[A-Za-z0-9_.+-]+:([A-Za-z_][A-Za-z0-9_]*=[^ ]*( |$))+$ ]] ||
                { echo "mpi-level: --variant wants 'LABEL:VAR=VALUE ...', not '$2'" >&2; exit 2; }
            variants+=("$2"); shift 2 ;;
        --programs)
            [[ "$2" =~ ^((PingPong|PingPing|osu_latency|osu_bw)(,|$))+$ ]] ||
                { echo "mpi-level: --programs takes PingPong, PingPing, osu_latency, osu_bw" >&2; exit 2; }
            programs_run=$2; shift 2 ;;
        *) rest+=("$1"); shift ;;
    esac
done
parse_round_options mpi-level "${rest[@]}"

need_apt_packages mpich libmpich-dev openmpi-bin libopenmpi-dev
programs=${RCH_PROGRAMS_CACHE:-$HOME/.cache/rdma-channel/programs}
rch_prefix=${RCH_MPICH_CACHE:-$HOME/.cache/rdma-channel/mpich}/install-rch
scripts/mpich-rch >/dev/null
for p in imb osu; do
    [ -d "$programs/src/$p" ] || {
        echo "mpi-level: no $p source in $programs/src; give it once: scripts/mpi-programs --programs $p --source $p=PATH" >&2
        exit 2
    }
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
systems=(rch ${before:+before} deb ompi ${floor:+floor})
declare -A label=([rch]="ch3:rch" [before]="$before_label" [deb]="Debian MPICH" [ompi]="Open MPI"
    [floor]="floor (copies only)")
declare -A mpicc=([rch]="$rch_prefix/bin/mpicc" [before]="$before/bin/mpicc" [deb]=mpicc.mpich [ompi]=mpicc.openmpi)
declare -A launch=(
    [rch]="$rch_prefix/bin/mpiexec -bind-to core -n 2"
    # A copied install still names the original library folder in its RUNPATH.
    [before]="env LD_LIBRARY_PATH=$before/lib $before/bin/mpiexec -bind-to core -n 2"
    [deb]="mpiexec.mpich -bind-to core -n 2"
    [ompi]="mpiexec.openmpi --bind-to core -n 2"
)
# Variants run ch3:rch's own programs (built[] names whose) with their environment;
# Hydra hands the launching environment to the ranks.
declare -A built=()
for ((i = 0; i < ${#variants[@]}; i++)); do
    v=variant$i
    systems=("${systems[@]:0:1}" "$v" "${systems[@]:1}")
    label[$v]="ch3:rch ${variants[$i]%%:*}"
    built[$v]=rch
    launch[$v]="env ${variants[$i]#*:} $rch_prefix/bin/mpiexec -bind-to core -n 2"
done

# build SYSTEM: IMB-MPI1 and OSU's pt2pt programs under $programs/build/perf-SYSTEM,
# rebuilt when the source or the compiler wrapper changes.
build() {
    local s=$1 dir=$programs/build/perf-$1 id
    id="$(cd "$programs/src" && find imb osu -type f -printf '%p %s\n' | sort | md5sum | cut -c1-16) $("${mpicc[$s]}" -show 2>/dev/null || "${mpicc[$s]}" --showme)"
    [ -f "$dir/.built" ] && [ "$(cat "$dir/.built")" = "$id" ] && return 0
    echo "mpi-level: building IMB-MPI1 and OSU with ${label[$s]}" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -a "$programs/src/imb" "$dir/imb"
    cp -a "$programs/src/osu" "$dir/osu"
    # IMB's Makefile compiles with -g -O0 -Werror: -O2 here, so that the MPI is timed
    # rather than IMB's own loop, and no -Werror (Open MPI's C++ header trips
    # -Wcast-function-type). The same flags for every MPI.
    sed -i 's/-g -O0 -Wall -Werror/-O2 -Wall/; s/-g -O0 -Wall -Wextra -Werror/-O2 -Wall/' \
        "$dir/imb/src_cpp/Makefile"
    {
        make -C "$dir/imb" IMB-MPI1 CC="${mpicc[$s]}" CXX="${mpicc[$s]/mpicc/mpicxx}"
        (cd "$dir/osu" && ./configure CC="${mpicc[$s]}" CXX="${mpicc[$s]/mpicc/mpicxx}" &&
            make -C c/mpi/pt2pt)
    } >"$dir/build.log" 2>&1 || { echo "mpi-level: build failed, see $dir/build.log" >&2; exit 1; }
    echo "$id" > "$dir/.built"
}
for s in "${systems[@]}"; do [ "$s" = floor ] || [ -n "${built[$s]:-}" ] || build "$s"; done
osu_bin() { find "$programs/build/perf-${built[$1]:-$1}/osu/c/mpi/pt2pt" -type f -name "$2" -perm -u+x | head -1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
max=$(tr , '\n' <<<"$sizes" | sort -n | tail -1)
log2max=$(awk -v m="$max" 'BEGIN { l = 0; while (2 ^ l < m) l++; print l }')
# The floor measures the table's sizes, all four patterns in one run.
[ -z "$floor" ] || cc -O2 -o "$work/copy_floor" bench/c/copy_floor.c

# run SYSTEM PROGRAM: one program of a system's turn; prints "metric size value" lines.
run() {
    local s=$1 dir=$programs/build/perf-${built[$1]:-$1}
    if [ "$s" = floor ]; then
        # One run prints every metric; a failure fails the turn like an MPI's.
        [ "$2" != "${programs_run%%,*}" ] || "$work/copy_floor" "$sizes"
        return
    fi
    case "$2" in
        PingPong|PingPing)
            # shellcheck disable=SC2086 # launch[] holds the launcher and its options
            (cd "$work" && ${launch[$s]} "$dir/imb/IMB-MPI1" -msglog "3:$log2max" "$2") |
                awk '/# Benchmarking / { b = ($3 == "PingPong") ? "imb_pingpong" : "imb_pingping"; next }
                     /#bytes/ { on = 1; next } NF == 0 { on = 0 }
                     on && $1 ~ /^[0-9]+$/ { print b "_lat", $1, $3; print b "_bw", $1, $4 }' ;;
        osu_latency|osu_bw)
            # shellcheck disable=SC2086
            ${launch[$s]} "$(osu_bin "$s" "$2")" -m "8:$max" |
                awk -v m="$2" '$1 ~ /^[0-9]+$/ { print m, $1, $2 }' ;;
    esac
}
# A round: every system's turn, each of its four programs between two probes of its
# own (bench/lib.sh, probed), run again while one read slow. A slow phase of the host
# that begins inside a turn (they last seconds) then costs one program a rerun, not
# the turn's figures: with the probes around whole turns, osu_latency at 4-256 KiB
# read 2-2.5x in one table while the probes passed (bench/notebook/2026-12.md).
run_round() {
    local s p
    for s in "${order[@]}"; do
        : > "$work/$s.round$kept"
        for p in ${programs_run//,/ }; do
            probed run "$s" "$p" >> "$work/$s.round$kept" || echo "mpi-level: $s $p failed" >&2
        done
    done
}
keep_rounds mpi-level

# fig SYSTEM METRIC SIZE: the median over the kept rounds
fig() { cat "$work/$1".round* 2>/dev/null | awk -v m="$2" -v z="$3" '$1 == m && $2 == z { print $3 }' | median; }

metrics=()
for m in imb_pingpong_lat osu_latency imb_pingping_lat imb_pingpong_bw osu_bw imb_pingping_bw; do
    case "$m" in
        imb_pingpong_*) p=PingPong ;;
        imb_pingping_*) p=PingPing ;;
        *) p=$m ;;
    esac
    [[ ",$programs_run," == *",$p,"* ]] && metrics+=("$m")
done
declare -A title=(
    [imb_pingpong_lat]="IMB PingPong, t[usec] (half a round trip)"
    [osu_latency]="OSU osu_latency, us (half a round trip)"
    [imb_pingping_lat]="IMB PingPing, t[usec] (both ranks send at once)"
    [imb_pingpong_bw]="IMB PingPong, MB/s"
    [osu_bw]="OSU osu_bw, MB/s (a window of 64 messages)"
    [imb_pingping_bw]="IMB PingPing, MB/s"
)
echo
echo "mpi-level: $kept rounds kept, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), medians"
ahead=0 behind=0
for m in "${metrics[@]}"; do
    echo
    echo "${title[$m]}"
    table_head "ch3:rch / better peer"
    for z in ${sizes//,/ }; do
        printf '| %s |' "$z"
        for s in "${systems[@]}"; do printf ' %s |' "$(fig "$s" "$m" "$z")"; done
        r=$(awk -v a="$(fig rch "$m" "$z")" -v d="$(fig deb "$m" "$z")" -v o="$(fig ompi "$m" "$z")" -v m="$m" '
            BEGIN { if (a == "-" || d == "-" || o == "-") { print "-"; exit }
                    bw = (m ~ /_bw$/); best = bw ? (d > o ? d : o) : (d < o ? d : o)
                    r = a / best; printf "%.2f %s\n", r, ((bw && r > 1) || (!bw && r < 1)) ? "ahead" : "behind" }')
        printf ' %s |\n' "$r"
        case "$r" in *ahead) ahead=$((ahead + 1)) ;; *behind) behind=$((behind + 1)) ;; esac
    done
done
echo
echo "mpi-level: ch3:rch ahead of both peers in $ahead of $((ahead + behind)) cells"
if [ -n "$csv" ]; then
    {
        echo "system,metric,round,size,value"
        for s in "${systems[@]}"; do
            for f in "$work/$s".round*; do
                awk -v s="$s" -v r="${f##*.round}" '{ print s "," $1 "," r "," $2 "," $3 }' "$f"
            done
        done
    } > "$csv"
fi
