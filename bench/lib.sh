# Shared by the side-by-side benchmark drivers (bench/ab.sh, bench/mpich-compare.sh):
# interleaved rounds that are thrown away when the machine was slow or busy.
# Source it, define run_round (run every system once, in the order "${order[@]}",
# writing "$work/<system>.round$kept"), set work, rounds, probe_max and systems,
# then call keep_rounds <name>. Nothing here asserts: these are benchmarks.
# The second half is the report of the two Soft-RoCE benches (bench/softroce-bench.sh,
# bench/softroce-cluster-bench.sh): reading their VMs' raw output, medians, ratios
# against perftest, the verdicts and the tables.

# Options every driver takes; sets sizes, rounds and probe_max (defaults: the
# standard sizes 8 B - 4 MiB, 3 rounds, 80 ns). Usage: parse_round_options NAME "$@".
parse_round_options() {
    local name=$1
    shift
    sizes=8,64,512,4096,16384,65536,262144,1048576,4194304
    rounds=3
    probe_max=80
    while [ $# -gt 0 ]; do
        case "$1" in
            --sizes) sizes=$2; shift 2 ;;
            --rounds) rounds=$2; shift 2 ;;
            --probe-max) probe_max=$2; shift 2 ;;
            *) echo "$name: unknown argument '$1' (see the script's header)" >&2; exit 2 ;;
        esac
    done
}

# CPU used by other processes while none of ours runs, in % of one CPU, over half a
# second (/proc/stat): a busy neighbour makes a round's figures meaningless.
other_load() {
    local a b
    a=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    sleep 0.5
    b=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ");
        t = y[2] - x[2]; if (t <= 0) { print 0; exit } printf "%.0f\n", (y[1] - x[1]) / t * n * 100 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The median over kept rounds of field $3 (2 latency, 3 bandwidth) for size $2 of
# system $1, from lines "size latency bandwidth".
col() {
    cat "$work/$1".round* 2>/dev/null | awk -v s="$2" -v f="$3" '$1 == s { print $f }' | median
}

# Runs rounds until $rounds are kept: the cache-line hand-off probe
# (bench/c/handoff_probe.c) runs before and after each round, and a round where it
# read above $probe_max ns (the shared host sometimes slows from ~35 to ~200 ns for
# seconds) or where other processes used more than 10% of a CPU is run again
# (run_round brackets each system with probes too: see probed). The order of
# systems rotates every round. Sets kept.
keep_rounds() {
    local name=$1 attempts=0 l0 l1 p0 p1 i
    cc -O2 -pthread -o "$work/probe" bench/c/handoff_probe.c
    kept=0
    while [ "$kept" -lt "$rounds" ]; do
        attempts=$((attempts + 1))
        if [ "$attempts" -gt $((rounds * 4)) ]; then
            echo "$name: gave up after $attempts rounds: the machine stayed slow" >&2
            break
        fi
        l0=$(other_load)
        p0=$("$work/probe")
        order=("${systems[@]}")
        for ((i = 0; i < kept; i++)); do order=("${order[@]:1}" "${order[0]}"); done
        round_ok=1
        run_round
        p1=$("$work/probe")
        l1=$(other_load)
        if [ "$l0" -gt 10 ] || [ "$l1" -gt 10 ]; then
            echo "$name: round rejected (other processes used $l0% / $l1% of a CPU)" >&2
            continue
        fi
        if awk -v a="$p0" -v b="$p1" -v m="$probe_max" 'BEGIN { exit !(a > m || b > m) }'; then
            echo "$name: round rejected (hand-off probe $p0 / $p1 ns > $probe_max)" >&2
            continue
        fi
        [ "$round_ok" = 1 ] || continue
        echo "$name: round $((kept + 1)) kept (probe $p0 / $p1 ns, load $l0% / $l1%)" >&2
        kept=$((kept + 1))
    done
}

# The usual run_round: every system of "${order[@]}" once, through probed, its lines
# into "$work/<system>.round$kept". The driver defines `run SYSTEM`; $1 names it in
# the failure message.
probed_round() {
    local s
    for s in "${order[@]}"; do
        probed run "$s" > "$work/$s.round$kept" || echo "$1: $s failed" >&2
    done
}

# Runs "$@" (one system's turn in a round) between two probes, and again (at most
# four times in all) while either probe read above $probe_max ns: the slow phases of
# the shared host come and go within seconds, so the probes around a whole round
# miss those inside it, and one system of the round would carry them alone. Prints
# the output of the last try; sets round_ok=0 when every try was slow or the command
# failed.
probed() {
    local try p0 p1 out
    for ((try = 1; try <= 4; try++)); do
        p0=$("$work/probe")
        out=$("$@") || { round_ok=0; return 1; }
        p1=$("$work/probe")
        if awk -v a="$p0" -v b="$p1" -v m="$probe_max" 'BEGIN { exit (a > m || b > m) }'; then
            printf '%s\n' "$out"
            return 0
        fi
        echo "  $* run again (hand-off probe $p0 / $p1 ns > $probe_max)" >&2
    done
    printf '%s\n' "$out"
    round_ok=0
}
# The heading of a markdown table of the host drivers (bench/peers.sh,
# bench/mpich-compare.sh): "size", a column per system in "${systems[@]}" named by
# "${label[system]}", then one column per argument.
table_head() {
    local s c
    printf '| size |'
    for s in "${systems[@]}"; do printf ' %s |' "${label[$s]}"; done
    for c in "$@"; do printf ' %s |' "$c"; done
    printf '\n| ---: |'
    for s in "${systems[@]}"; do printf -- ' ---: |'; done
    for c in "$@"; do printf -- ' ---: |'; done
    echo
}

# runtime_row VALUE_FN PATTERN SIZE: a row of bench/runtime.sh's (and
# runtime-cluster.sh's) tables: rdma-channel (batching where the sender knows more
# follow), rdma-channel with a put a message (rch1), ZeroMQ/TCP, TCP (VALUE_FN SYS PATTERN
# SIZE prints a median) and ours over the better of the two (lower is better for
# the ping-pong's latency, higher for the rest).
runtime_row() {
    local r r1 z t best
    r=$("$1" rch "$2" "$3")
    r1=$("$1" rch1 "$2" "$3")
    z=$("$1" zmq "$2" "$3")
    t=$("$1" tcp "$2" "$3")
    if [ "$2" = pingpong ]; then
        best=$(printf '%s\n%s\n' "$z" "$t" | grep -E '^[0-9.]+$' | sort -g | head -1)
    else
        best=$(printf '%s\n%s\n' "$z" "$t" | grep -E '^[0-9.]+$' | sort -g | tail -1)
    fi
    echo "| $3 | ${r:--} | ${r1:--} | ${z:--} | ${t:--} | $(ratio "${r:-0}" "${best:-0}") |"
}

# ---------------------------------------------- the Soft-RoCE benches' report
# Their VMs print each run's output between "=== BEGIN TAG" and "=== END TAG" lines;
# the host keeps it in a file, LOG below. Tags end in ".ROUND" (once a round) or
# ".ROUND.PAIR" (the runs timed in pairs beside perftest); the medians read the
# caller's rounds and pairs.

# section LOG TAG: the lines between "=== BEGIN TAG" and "=== END TAG"
section() { awk -v t="$2" '$0 == "=== BEGIN " t {on = 1; next} $0 == "=== END " t {on = 0} on' "$1"; }
# perftest_col LOG TAG COLUMN: the named column of the first result row. Multi-word
# headers ("BW average[MB/sec]", "99% percentile[usec]") are joined first so
# that header words and row fields line up.
perftest_col() {
    section "$1" "$2" | awk -v col="$3" '
        /#bytes/ { gsub(/BW /, "BW_"); gsub(/% percentile/, "%_percentile")
                              for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
        c && $1 ~ /^[0-9]+$/ { print $c; exit }'
}
# ours LOG TAG COLUMN SIZE: the named column of our table's row for SIZE
# (bench/verbs_pingpong.rs's table: "size latency_us lat_med_us ...")
ours() {
    section "$1" "$2" | awk -v col="$3" -v s="$4" '
        $1 == "size" { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
        c && $1 == s { print $c; exit }'
}
# round_median FN LOG TAG ARGS...: the median over the rounds of "FN LOG TAG.r ARGS..."
# (numbers only; prints nothing when no round gave one)
round_median() {
    local fn=$1 log=$2 tag=$3 r; shift 3
    for r in $(seq "$rounds"); do "$fn" "$log" "$tag.$r" "$@"; done |
        awk '/^[0-9.]+$/ { v[n++] = $1 } END { if (n) { for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
                  print (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2) } }'
}
# pair_median FN LOG TAG ARGS...: the median over every pair of "FN LOG TAG.r.p ARGS..."
pair_median() {
    local fn=$1 log=$2 tag=$3 r p; shift 3
    for r in $(seq "$rounds"); do for p in $(seq "$pairs"); do "$fn" "$log" "$tag.$r.$p" "$@"; done; done |
        grep -E '^[0-9.]+$' | median
}
# ratio A B: A / B to two decimals, "-" unless both are numbers and B is not 0
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
# two_places: the median of the numbers on stdin to two decimals, "-" when none
two_places() { grep -E '^[0-9.]+$' | median | awk '/^[0-9.]+$/ { printf "%.2f\n", $1; next } { print "-" }'; }
# lat_ratio LOG TAG OURS_COLUMN PERFTEST_COLUMN: the median over the latency pairs of
# ours at 2 B ("TAG.r.p") / ib_write_lat ("lat.r.p"), each of one pair
lat_ratio() {
    local log=$1 r p
    for r in $(seq "$rounds"); do for p in $(seq "$pairs"); do
        # shellcheck disable=SC2005 # echo ends ratio's line: it prints none after a number
        echo "$(ratio "$(ours "$log" "$2.$r.$p" "$3" 2)" "$(perftest_col "$log" "lat.$r.$p" "$4")")"
    done; done | two_places
}
# verdict RATIO OP LIMIT: "met" or "MISSED" (OP "<=" or ">="), "n/a" without a ratio,
# "info" without an OP
verdict() {
    awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { if (op == "") print "info"; else if (r == "-") print "n/a";
        else if ((op == "<=" && r + 0 <= l + 0) || (op == ">=" && r + 0 >= l + 0)) print "met"; else print "MISSED" }'
}
# cells LABEL OURS OTHER RATIO TARGET RESULT: one line of a boot's table, laid out as
# $row_style says: "plain" (the default; softroce-bench.sh's aligned columns) or
# "markdown" (softroce-cluster-bench.sh's table rows)
cells() {
    if [ "${row_style:-plain}" = markdown ]; then
        printf '| %-30s | %10s | %-26s | %6s | %6s | %-6s |\n' "$@"
    else
        printf '%-28s %12s %22s %7s %8s %7s\n' "$@"
    fi
}
# row LABEL OURS OTHER_LABEL OTHER OP LIMIT: ours against the other tool's figure, with
# the ratio and the verdict; the other's cell reads "OTHER OTHER_LABEL" in plain rows
# and "OTHER (OTHER_LABEL)" in markdown ones
row() {
    local r other; r=$(ratio "$2" "$4")
    if [ "${row_style:-plain}" = markdown ]; then other="${4:--} ($3)"; else other="${4:--} $3"; fi
    cells "$1" "${2:--}" "$other" "$r" "$5$6" "$(verdict "$r" "$5" "$6")"
}
# verbs_pingpong_bin NAME: builds bench/verbs_pingpong.rs (cargo, verbs feature) and
# sets bin to the binary's absolute path; NAME prefixes the error when there is none
verbs_pingpong_bin() {
    local build
    echo "== cargo bench --features verbs --bench verbs_pingpong --no-run" >&2
    build=$(cargo bench --features verbs --bench verbs_pingpong --no-run 2>&1) || { echo "$build" >&2; exit 1; }
    # cargo names the binary on stderr: "Executable bench/verbs_pingpong.rs (target/...)"
    bin=$(printf '%s\n' "$build" | sed -n 's/.*Executable .*verbs_pingpong\.rs (\(.*\))$/\1/p' | tail -n 1)
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        echo "$build" >&2; echo "$1: cannot find the benchmark binary" >&2; exit 1
    fi
    bin="$(pwd -P)/$bin"
}

# The closing table of the Soft-RoCE benches (bench/softroce-bench.sh and
# bench/softroce-cluster-bench.sh): a row per boot from "${summary[@]}", with the
# latency columns and, for each size in $BW_SIZES, "ours / $1" bandwidth columns and a
# ratio. Reads boots, rounds, LAT_MAX and BW_MIN; $2 ends the heading (e.g. the time).
per_boot_table() {
    local cols=$1 extra=${2:-} hdr sep s
    echo
    echo "== per boot ($boots boot(s), $rounds round(s) each, medians; targets: latency <= ${LAT_MAX}x"
    echo "   ib_write_lat t_typical, bandwidth >= ${BW_MIN}x the better of ib_write_bw / ib_read_bw$extra)"
    echo
    hdr="| boot | host load | latency 2 B us, ours / ib_write_lat | ratio |"
    sep="| ---: | --- | ---: | ---: |"
    for s in $BW_SIZES; do
        hdr+=" $((s >> 10)) KiB MB/s, ours / $cols | ratio |"
        sep+=" ---: | ---: |"
    done
    echo "$hdr all met |"
    echo "$sep --- |"
    printf '%s\n' "${summary[@]}"
}

# The round trips bench/verbs_pingpong.rs times at 2 B (its lat_iters, scaled by
# RCH_BENCH_SCALE), for ib_write_lat -n: this host has slow phases of seconds, and a
# run five times longer than the other's (perftest's default is 1000) met them five
# times as often. Used inside the Soft-RoCE VMs by softroce-bench.sh and
# softroce-cluster-bench.sh.
perftest_lat_count() {
    awk -v s="${RCH_BENCH_SCALE:-1}" 'BEGIN { if (s + 0 <= 0) s = 1; n = int(2000000 / 202 * s)
        print (n < 10 ? 10 : (n > 5000 ? 5000 : n)) }'
}
