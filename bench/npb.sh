#!/usr/bin/env bash
# NAS Parallel Benchmarks 3.4 (MPI) run times on MPICH with ch3:rch beside Debian's
# MPICH and Open MPI, in one interleaved run on this host (the form of seed 003's
# tables 2 and 3).
#
# usage: bench/npb.sh [--class A] [--np 4] [--kernels bt,cg,ep,ft,is,lu,mg,sp]
#                     [--rounds 3] [--probe-max NS] [--csv FILE]
#
# Each MPI builds NPB with its own mpif90/mpicc and checks it first through
# scripts/mpi-programs (every kernel once, "Verification = SUCCESSFUL" required; the
# NPB source must be in its cache: see its --source). Then rounds: in each, every
# kernel runs once on every MPI, the MPIs in a different order each round and kernel.
# A run starts once the cache-line hand-off probe (bench/c/handoff_probe.c) reads at
# most --probe-max ns (default 80; the shared host sometimes slows for minutes: it
# waits up to 10 minutes); one that did not verify is run again (at most four times;
# then it is left out). The probe after a run is printed, not used: seconds of four
# busy ranks on two CPUs leave it slow for a while, whichever MPI ran. Prints NPB's own
# run times as the median of the kept runs, and ch3:rch's time over the faster
# peer's (below 1: ch3:rch is faster). NPB prints "Time in seconds" with two decimals,
# too coarse for IS (0.15 s: a step is 7%), so a run's time is taken from its "Mop/s
# total" (the kernel's fixed operation count over the time it measured): K / Mop/s,
# K a kernel's operations in millions, estimated as the median of time x Mop/s over
# every kept run of every MPI. The ratios do not depend on K. All ranks on one
# host, unpinned.
# It is a benchmark, never a test: nothing here asserts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
. bench/lib.sh

class=A
np=4
kernels=bt,cg,ep,ft,is,lu,mg,sp
rounds=3
probe_max=80
csv=
while [ $# -gt 0 ]; do
    case "$1" in
        --class) class=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        --kernels) kernels=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --probe-max) probe_max=$2; shift 2 ;;
        --csv) csv=$2; shift 2 ;;
        *) echo "npb: unknown argument '$1' (see the script's header)" >&2; exit 2 ;;
    esac
done

cache=${RCH_PROGRAMS_CACHE:-$HOME/.cache/rdma-channel/programs}
rch_prefix=${RCH_MPICH_CACHE:-$HOME/.cache/rdma-channel/mpich}/install-rch
need_apt_packages mpich libmpich-dev openmpi-bin libopenmpi-dev gfortran
scripts/mpich-rch >/dev/null

systems=(rch mpich ompi)
declare -A label=([rch]="ch3:rch" [mpich]="Debian MPICH" [ompi]="Open MPI")
declare -A build=([rch]=install-rch [mpich]=debian-mpich [ompi]=openmpi)
declare -A check=([rch]="--prefix $rch_prefix" [mpich]="--mpi debian-mpich" [ompi]="--mpi openmpi")
declare -A launcher=(
    [rch]="$rch_prefix/bin/mpiexec -n $np"
    [mpich]="mpiexec.mpich -n $np"
    [ompi]="mpiexec.openmpi --oversubscribe --allow-run-as-root -n $np"
)
for s in "${systems[@]}"; do
    echo "npb: building and verifying on ${label[$s]}" >&2
    # shellcheck disable=SC2086 # check[] holds two words on purpose
    scripts/mpi-programs ${check[$s]} --programs npb --np "$np" --class "$class" >&2
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -pthread -o "$work/probe" bench/c/handoff_probe.c

# run SYSTEM KERNEL: NPB's time in seconds and its Mop/s total ("T M"), or nothing
# when the run did not verify.
run() {
    local bin=$cache/build/${build[$1]}/npb-$class/bin/$2.$class.x out
    # shellcheck disable=SC2086 # the launcher is a command line
    out=$(cd "$work" && timeout 1800 ${launcher[$1]} "$bin" </dev/null 2>&1) || return 0
    grep -qE 'Verification += +SUCCESSFUL' <<<"$out" || return 0
    awk '/Time in seconds/ {t = $NF} /Mop\/s total/ {m = $NF} END { if (t != "" && m > 0) print t, m }' <<<"$out"
}

# The slow phases of the shared host last minutes, longer than a run: wait (10 s at a
# time, 10 minutes at most) until the probe reads fast before starting one.
wait_fast() {
    local waited=0 p
    while p=$("$work/probe") && awk -v a="$p" -v m="$probe_max" 'BEGIN { exit !(a > m) }'; do
        [ "$waited" -lt 600 ] || { echo "npb: still slow after 10 min ($p ns), running" >&2; return; }
        [ "$waited" -gt 0 ] || echo "npb: waiting for the hand-off probe to read fast ($p ns)" >&2
        sleep 10
        waited=$((waited + 10))
    done
}

turn=0
for ((r = 1; r <= rounds; r++)); do
    for k in ${kernels//,/ }; do
        order=("${systems[@]}")
        for ((i = 0; i < turn % ${#systems[@]}; i++)); do order=("${order[@]:1}" "${order[0]}"); done
        turn=$((turn + 1))
        for s in "${order[@]}"; do
            for ((try = 1; try <= 4; try++)); do
                wait_fast
                p0=$("$work/probe")
                t=$(run "$s" "$k")
                p1=$("$work/probe")
                if [ -z "$t" ]; then
                    echo "npb: $k on ${label[$s]} did not verify (try $try)" >&2
                    continue
                fi
                # Only the probe before decides: after seconds of four busy ranks on two
                # CPUs the probe reads slow for a while whoever ran (seen on every MPI).
                if awk -v a="$p0" -v m="$probe_max" 'BEGIN { exit !(a > m) }'; then
                    echo "npb: $k on ${label[$s]} run again (probe $p0 ns before)" >&2
                    continue
                fi
                echo "$t" >> "$work/$s.$k"
                echo "npb: round $r $k ${label[$s]} ${t% *} s, ${t#* } Mop/s (probe $p0 / $p1 ns)" >&2
                break
            done
        done
    done
done

# A kernel's operations in millions (see the header), then a system's median time.
ops() { cat "$work"/*."$1" 2>/dev/null | awk '{print $1 * $2}' | median; }
med() {
    if [ -f "$work/$1.$2" ]; then
        awk -v k="$3" '{printf "%.4f\n", k / $2}' "$work/$1.$2" | median | awk '{printf "%.3f\n", $1}'
    else
        echo "-"
    fi
}
echo "# NPB 3.4 class $class, $np ranks on one host ($(nproc) CPUs), $rounds rounds, median s; $(date -u +%F)"
printf '| kernel | %s | %s | %s | ch3:rch / faster peer |\n' "${label[rch]}" "${label[mpich]}" "${label[ompi]}"
echo "| --- | ---: | ---: | ---: | ---: |"
[ -z "$csv" ] || echo "kernel,class,np,rch_s,mpich_s,openmpi_s" > "$csv"
for k in ${kernels//,/ }; do
    ops_k=$(ops "$k")
    a=$(med rch "$k" "$ops_k") b=$(med mpich "$k" "$ops_k") c=$(med ompi "$k" "$ops_k")
    best=$(awk -v b="$b" -v c="$c" 'BEGIN { if (b == "-") print c; else if (c == "-") print b; else print (b < c ? b : c) }')
    printf '| %s | %s | %s | %s | %s |\n' "${k^^}" "$a" "$b" "$c" "$(ratio "$a" "$best")"
    [ -z "$csv" ] || echo "$k,$class,$np,$a,$b,$c" >> "$csv"
done
