#!/usr/bin/env bash
# mpi-instructions: instructions per round trip of an 8-byte MPI ping-pong, counted
# by valgrind's callgrind on rank 0 of bench/c/osu_mpi.c (MPI_Send, then MPI_Recv),
# for one or more MPI installations side by side, with the functions that cost the
# most per round trip. A benchmark, never a test: nothing here asserts.
#
# The count repeats to the instruction whatever else the host does (its noise moves
# timings, not counts), so a change on the small-message path is judged in one run.
# Rank 0 runs twice, with LO and HI round trips; the difference divided by the
# difference in round trips cancels start-up, the first waits and MPI_Finalize.
# Rank 1 runs natively; it answers at once, so rank 0's blocking waits are short and
# their polls are counted as they happen (a slower peer would add idle passes). The
# native rank runs with RCH_SPIN=100000000 (unless RCH_SPIN is set): idle while the
# counted rank crawls under callgrind, it would otherwise go to sleep in rch_wait,
# and the counted rank's waits for it to wake would be counted (417 of 1,983
# instructions a message of a bandwidth run's receiver, 2026-12-03). The first line
# says how many instructions a unit were spent in rch_wait's backoff anyway.
#
# With --bandwidth it counts osu_mpi's bandwidth loop instead (a window of 64
# MPI_Isend, MPI_Waitall, a 4-byte ack back), per message, on the rank --rank names
# (0 sends, 1 receives). With --pingping it counts IMB's PingPing (both ranks
# MPI_Isend, MPI_Recv, MPI_Wait), per exchange. With --preposted it counts the
# ping-pong with each receive posted before the send (MPI_Irecv, MPI_Send,
# MPI_Wait): from the zero-copy sizes up, the counted rank is so slow that in the
# plain ping-pong most replies arrive before their MPI_Recv and are copied twice
# (95% of a 16 KiB round trip's instructions, 2026-12-03); posted first, they never
# are.
#
# usage: bench/mpi-instructions.sh [--size N] [--top K] [--bandwidth [--rank R] | --pingping | --preposted] MPI...
#   MPI is PREFIX (an MPICH install: PREFIX/bin/mpicc and mpiexec, e.g. one built by
#   scripts/mpich-rch), or LABEL=PREFIX to name its column, or the words "debian"
#   (Debian's mpich package) and "openmpi" (Debian's openmpi-bin).
#   --size N   message size in bytes (default 8)
#   --top K    how many functions to list per MPI, by their own cost (default 12)
#   --bandwidth  count the bandwidth loop, per message (default: the ping-pong)
#   --pingping   count the PingPing loop, per exchange
#   --preposted  count the ping-pong with its receives posted first, per round trip
#   --rank R   the rank counted (default 0)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
need_apt_packages valgrind bc

size=8 top=12 mode=latency counted=0
mpis=()
while [ $# -gt 0 ]; do
    case "$1" in
        --size) size=$2; shift 2 ;;
        --top) top=$2; shift 2 ;;
        --bandwidth) mode=bandwidth; shift ;;
        --pingping) mode=pingping; shift ;;
        --preposted) mode=preposted; shift ;;
        --rank) counted=$2; shift 2 ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        -*) echo "mpi-instructions: unknown option '$1'" >&2; exit 2 ;;
        *) mpis+=("$1"); shift ;;
    esac
done
[ ${#mpis[@]} -gt 0 ] || { echo "mpi-instructions: name at least one MPI (see --help)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$mode" != bandwidth ]; then
    lo=20000 hi=60000 unit="round trip" flag=--latency
    [ "$mode" != pingping ] || unit=exchange flag=--pingping
    [ "$mode" != preposted ] || flag=--preposted
    # osu_mpi's latency and PingPing loops add iters/10 + 10 warm-up rounds to the timed ones.
    round_trips() { echo $(($1 + $1 / 10 + 10)); }
    per_rt=$(($(round_trips $hi) - $(round_trips $lo)))
else
    lo=500 hi=1500 unit=message flag=--bandwidth
    # Its bandwidth loop adds iters/10 + 2 warm-up windows of 64 messages.
    windows() { echo $(($1 + $1 / 10 + 2)); }
    per_rt=$(((($(windows $hi) - $(windows $lo))) * 64))
fi

summary=()
for spec in "${mpis[@]}"; do
    label=${spec%%=*}
    where=${spec#*=}
    extra=()
    case "$where" in
        debian)
            need_apt_packages mpich libmpich-dev
            cc=mpicc.mpich run=mpiexec.mpich ;;
        openmpi)
            need_apt_packages openmpi-bin libopenmpi-dev
            cc=mpicc.openmpi run=mpiexec.openmpi
            extra=(--allow-run-as-root --oversubscribe --mca btl self,vader) ;;
        *)
            [ -x "$where/bin/mpicc" ] || { echo "mpi-instructions: no $where/bin/mpicc" >&2; exit 2; }
            cc=$where/bin/mpicc run=$where/bin/mpiexec ;;
    esac
    bin=$work/osu_mpi.$label
    # -g: callgrind names the functions; -O2 as any benchmark build.
    "$cc" -O2 -g -o "$bin" bench/c/osu_mpi.c 2>"$work/cc.$label" || {
        cat "$work/cc.$label" >&2
        exit 1
    }
    for n in $lo $hi; do
        # The counted rank under callgrind (PMI_RANK under Hydra,
        # OMPI_COMM_WORLD_RANK under Open MPI's launcher), the other as is.
        "$run" "${extra[@]}" -n 2 sh -c '
            r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}
            if [ "$r" = "$5" ]; then
                exec valgrind --tool=callgrind --callgrind-out-file="$0" "$1" "$4" --sizes "$2" --iters "$3"
            fi
            exec env RCH_SPIN="${RCH_SPIN:-100000000}" "$1" "$4" --sizes "$2" --iters "$3"' \
            "$work/cg.$label.$n" "$bin" "$size" "$n" "$flag" "$counted" \
            >"$work/out.$label.$n" 2>"$work/err.$label.$n" || {
            echo "mpi-instructions: $label failed with $n iterations:" >&2
            tail -20 "$work/err.$label.$n" >&2
            exit 1
        }
        callgrind_annotate --auto=no --threshold=100 "$work/cg.$label.$n" >"$work/ann.$label.$n" 2>/dev/null
    done
    echo "== $label ($where): instructions per $unit of $size B, rank $counted, by own cost"
    python3 - "$work/ann.$label.$lo" "$work/ann.$label.$hi" "$per_rt" "$top" "$label" \
        "$work/totals" <<'EOF'
import re, sys
lo_path, hi_path, per_rt, top, label, totals = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
def read(path):
    total, fns = 0, {}
    for line in open(path):
        m = re.match(r'\s*([\d,]+) \(.*?\)\s+PROGRAM TOTALS', line) or re.match(r'\s*([\d,]+)\s+PROGRAM TOTALS', line)
        if m:
            total = int(m.group(1).replace(',', ''))
            continue
        m = re.match(r'\s*([\d,]+) (?:\([^)]*\) )?\s*(\S.*?)(?: \[.*\])?$', line)
        if m and ':' in m.group(2):
            name = m.group(2).split(':', 1)[1].strip()
            fns[name] = fns.get(name, 0) + int(m.group(1).replace(',', ''))
    return total, fns
t_lo, f_lo = read(lo_path)
t_hi, f_hi = read(hi_path)
rows = sorted(((f_hi.get(k, 0) - f_lo.get(k, 0)) / per_rt, k) for k in set(f_lo) | set(f_hi))
rows.reverse()
# A rank 0 that waited for its peer (a busy host that descheduled rank 1) counts the
# instructions of its idle passes too: the blocking waits it entered say how much.
def waits(path):
    for line in open(path):
        if re.search(r':(rch_wait|MPIDI_CH3I_Progress_wait)\b', line):
            m = re.search(r'\(([\d,]+)x\)', line)
            if m:
                return int(m.group(1).replace(',', ''))
    return 0
waited = sum(cost for cost, name in rows if re.search(r'ffi::state::wait|engine::wait::Backoff|poll_readable|up_ready', name))
print(f"{(t_hi - t_lo) / per_rt:10.0f}  all ({(waits(hi_path) - waits(lo_path)) / per_rt:.3f} rch_wait calls and {waited:.0f} instructions in its waits per unit: more than a few means the counted rank waited for a descheduled peer)")
for cost, name in rows[:top]:
    if cost < 1:
        break
    print(f"{cost:10.0f}  {name[:100]}")
with open(totals, "a") as f:
    print(f"{label} {(t_hi - t_lo) / per_rt:.0f}", file=f)
EOF
done
echo "== instructions per $unit (rank $counted, $size B; callgrind, $lo and $hi ${unit}s or windows)"
awk '{printf "%10s  %s\n", $2, $1}' "$work/totals"
