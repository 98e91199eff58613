#!/bin/bash
# run_debug_bench.sh - what the debug layer costs a training run: fsdpc-train
# on the bench-small model, 2 ranks x 1 BLAS thread, data parallel, with
# FSDPC_DEBUG=OFF (the default: flight recorder and watchdog on), with the
# recorder off too, and with FSDPC_DEBUG=DETAIL, interleaved in one run, for
# each backend. Writes a
# markdown table to stdout and to $OUT. Not part of `make check`.
#
#   tests/peers/run_debug_bench.sh                      # from a build dir
#   BUILDDIR=/tmp/build ROUNDS=3 tests/peers/run_debug_bench.sh
#   STEPS=12 WARMUP=3 ROUNDS=1 BACKENDS=tcp tests/peers/run_debug_bench.sh  # dry run
#
# Settings (environment):
#   BUILDDIR     build directory holding fsdpc-train, fsdpc-ckpt, fsdpc-data [.]
#   OUT          markdown output [./debug-bench.md]
#   WORKDIR      model, token file, logs [a fresh temp dir, kept]
#   STEPS        steps per run [30]
#   WARMUP       steps left out of the median [5]
#   ROUNDS       rounds; each runs every backend x configuration once [3]
#   BATCH, SEQ   sequences per step per rank and their length [4, 256]
#   BACKENDS     fsdpc backends ["tcp mpi"]
#   CONFIGS      configurations, in the order run within a round
#                ["off norecorder detail"]:
#                  off         FSDPC_DEBUG=OFF: the flight recorder and
#                              the watchdog on (the default; the baseline)
#                  norecorder  FSDPC_DEBUG=OFF FSDPC_FLIGHT_RECORDER=0: no
#                              recorder, no watchdog
#                  info        FSDPC_DEBUG=INFO
#                  detail      FSDPC_DEBUG=DETAIL
#   BASELINE     another build directory (e.g. of an earlier commit): its
#                fsdpc-train also runs `off` and `detail` in every round,
#                reported as base-off and base-detail, base-detail's ratio
#                taken to base-off [unset]
#   PACE         1: also time single collectives with and without DETAIL
#                (tests/debug/debug_probe pace, built by `make check` or
#                `make tests/debug/debug_probe`); 0: skip [1 when built]
#   QUIET_WAIT   up to this many seconds before each run, wait until the
#                CPUs are at least 85% idle over 2 s (on a shared machine,
#                runs then start in the quiet spells); 0: never wait [0]
#   RUN_TIMEOUT  seconds before a single run is killed [600]
#
# Method: one process per rank with one BLAS/OpenMP thread; runs never
# overlap; a run's figure is the median step time after WARMUP steps
# (tokens/s = global tokens per step / that time); the table gives the
# median over rounds, the range, and the median over rounds of the ratio to
# the `off` run of the same backend and round (above 1: faster than the
# default). Configurations alternate within each round, so load that drifts
# during the run hits all of them alike.
set -u

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
builddir=${BUILDDIR:-.}
out=${OUT:-./debug-bench.md}
workdir=${WORKDIR:-}
steps=${STEPS:-30}
warmup=${WARMUP:-5}
rounds=${ROUNDS:-3}
batch=${BATCH:-4}
seq=${SEQ:-256}
backends=${BACKENDS:-tcp mpi}
configs=${CONFIGS:-off norecorder detail}
run_timeout=${RUN_TIMEOUT:-600}
baseline=${BASELINE:-}
quiet_wait=${QUIET_WAIT:-0}
pace=${PACE:-auto}
mpiexec=${MPIEXEC:-mpiexec.mpich}
python=${PYTHON:-python3}

die() { echo "run_debug_bench.sh: $*" >&2; exit 2; }

is_uint() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
for v in steps warmup rounds batch seq run_timeout quiet_wait; do
    is_uint "${!v}" || die "${v^^}=${!v}: not a non-negative integer"
done
[ "$steps" -gt "$warmup" ] || die "STEPS=$steps must be larger than WARMUP=$warmup"
[ "$rounds" -ge 1 ] || die "ROUNDS=$rounds: at least 1"
for c in $configs; do
    case $c in off | norecorder | info | detail) ;; *) die "CONFIGS: unknown configuration $c" ;; esac
done
builddir=$(cd "$builddir" 2>/dev/null && pwd) || die "BUILDDIR ${BUILDDIR:-.}: no such directory"
for p in fsdpc-train fsdpc-ckpt fsdpc-data; do
    [ -x "$builddir/$p" ] || die "$builddir/$p: not built (set BUILDDIR to a build directory)"
done
command -v "$mpiexec" >/dev/null || die "$mpiexec: not found (set MPIEXEC)"
all_configs=$configs
if [ -n "$baseline" ]; then
    baseline=$(cd "$baseline" 2>/dev/null && pwd) || die "BASELINE $BASELINE: no such directory"
    [ -x "$baseline/fsdpc-train" ] || die "$baseline/fsdpc-train: not built"
    all_configs="$configs base-off base-detail"
fi
if [ -z "$workdir" ]; then
    workdir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-debug-bench.XXXXXX") || die "cannot make a temp dir"
fi
mkdir -p "$workdir" || die "WORKDIR $workdir: cannot create"

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export FSDPC_LOG=warn FSDPC_FLIGHT_DIR="$workdir/flight"
unset FSDPC_DEBUG FSDPC_FLIGHT_RECORDER FSDPC_FLIGHT_DUMP_AT_EXIT

echo "== work directory: $workdir" >&2
find "$srcdir/src" "$srcdir/doc" -type f \( -name '*.c' -o -name '*.h' -o -name '*.md' \) -print0 |
    LC_ALL=C sort -z | xargs -0 cat >"$workdir/corpus.txt"
"$builddir/fsdpc-data" tokenize "$workdir/corpus.txt" -o "$workdir/tokens.bin" >/dev/null ||
    die "fsdpc-data tokenize failed"
"$builddir/fsdpc-ckpt" init --preset bench-small -o "$workdir/bench-small.h5" >/dev/null ||
    die "fsdpc-ckpt init --preset bench-small failed"

# idle share of all CPUs over 2 s, in percent
idle_pct() {
    local a b
    read -r -a a < /proc/stat
    sleep 2
    read -r -a b < /proc/stat
    local busy=0 idle=0 i
    for i in 1 2 3 4 5 6 7 8; do busy=$((busy + ${b[$i]} - ${a[$i]})); done
    idle=$((${b[4]} + ${b[5]} - ${a[4]} - ${a[5]}))
    echo $((busy > 0 ? 100 * idle / busy : 100))
}
# waits up to QUIET_WAIT s for a quiet spell; prints the idle share found
wait_quiet() {
    local t0 p
    t0=$(date +%s)
    p=$(idle_pct)
    while [ "$p" -lt 85 ] && [ $(($(date +%s) - t0)) -lt "$quiet_wait" ]; do
        p=$(idle_pct)
    done
    echo "$p"
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$(date +%s)
: >"$workdir/runs.tsv"
for r in $(seq 1 "$rounds"); do
    for b in $backends; do
        for c in $all_configs; do
            bin=$builddir
            case $c in
            base-*) bin=$baseline ;;
            esac
            case ${c#base-} in
            off) env=(FSDPC_DEBUG=OFF) ;;
            norecorder) env=(FSDPC_DEBUG=OFF FSDPC_FLIGHT_RECORDER=0) ;;
            info) env=(FSDPC_DEBUG=INFO) ;;
            detail) env=(FSDPC_DEBUG=DETAIL) ;;
            esac
            name=$b-$c-$r
            m=$workdir/$name.jsonl
            rm -f "$m"
            idle=-
            [ "$quiet_wait" -gt 0 ] && idle=$(wait_quiet)
            echo "== $name (${env[*]}; ${idle}% idle before)" >&2
            env "${env[@]}" timeout -k 10 "$run_timeout" "$mpiexec" -n 2 "$bin/fsdpc-train" \
                --model "$workdir/bench-small.h5" --data "$workdir/tokens.bin" --lr 3e-4 \
                --log-every 1 --mesh dp=2 --backend "$b" --steps "$steps" --batch-size "$batch" \
                --seq-len "$seq" --threads 1 --metrics "$m" >"$workdir/$name.log" 2>&1
            rc=$?
            [ $rc -eq 0 ] || { echo "   failed with status $rc:" >&2; tail -n 5 "$workdir/$name.log" >&2; }
            printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$c" "$r" "$rc" "$m" >>"$workdir/runs.tsv"
        done
    done
done
# what DETAIL adds to one collective: 2000 all_gather(f32, 64), waited one
# by one (1 in flight) and 4 in flight as the engine's prefetch, OFF and
# DETAIL alternating
if [ "$pace" = auto ]; then
    if [ -x "$builddir/tests/debug/debug_probe" ]; then pace=1; else pace=0; fi
fi
: >"$workdir/pace.tsv"
if [ "$pace" = 1 ]; then
    [ -x "$builddir/tests/debug/debug_probe" ] || die "PACE=1: $builddir/tests/debug/debug_probe not built"
    for r in $(seq 1 "$rounds"); do
        for b in $backends; do
            for ahead in 1 4; do
                for lvl in OFF DETAIL; do
                    us=$(FSDPC_DEBUG=$lvl timeout -k 10 "$run_timeout" "$mpiexec" -n 2 \
                        "$builddir/tests/debug/debug_probe" --init mpi --mesh dp=2 --backend "$b" \
                        pace 2000 "$ahead" 64 2>&1 | sed -n 's/^pace: .*: \([0-9.]*\) us each$/\1/p')
                    printf '%s\t%s\t%s\t%s\n' "$b" "$ahead" "$lvl" "${us:-}" >>"$workdir/pace.tsv"
                done
            done
        done
    done
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

"$python" - "$workdir" "$warmup" "$all_configs" "$load_start" "$load_end" "$(($(date +%s) - t_start))" \
    "$steps" "$rounds" "$batch" "$seq" >"$workdir/report.md" <<'PYEOF' || die "report failed (logs in $workdir)"
import json, statistics, sys

work, warmup, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
load_start, load_end, secs, steps, rounds, batch, seq = sys.argv[4:11]
label = {"off": "`FSDPC_DEBUG=OFF` (default: recorder + watchdog)",
         "norecorder": "`OFF`, `FSDPC_FLIGHT_RECORDER=0`",
         "info": "`FSDPC_DEBUG=INFO`", "detail": "`FSDPC_DEBUG=DETAIL`",
         "base-off": "baseline build, `OFF`", "base-detail": "baseline build, `DETAIL`"}
runs = {}  # backend -> config -> round -> tokens/s at the median step (None: failed)
quart = {}  # the same at the fastest quartile's step time
for line in open(work + "/runs.tsv"):
    b, c, r, rc, m = line.rstrip("\n").split("\t")
    tps = fast = None
    if rc == "0":
        recs = [json.loads(l) for l in open(m) if l.strip()]
        recs = [s for s in recs if "ms" in s]
        ms = sorted(s["ms"] for s in recs[warmup:])
        if ms:
            tps = recs[0]["tokens"] / (statistics.median(ms) / 1e3)
            fast = recs[0]["tokens"] / (ms[len(ms) // 4] / 1e3)
    runs.setdefault(b, {}).setdefault(c, {})[r] = tps
    quart.setdefault(b, {}).setdefault(c, {})[r] = fast
print("### Debug layer overhead: bench-small, 2 ranks x 1 thread, data parallel")
print()
print("- %s rounds of %s steps (median after %d), batch %s x %s per rank; load average %s at "
      "start, %s at end; %s s in all" % (rounds, steps, warmup, batch, seq, load_start, load_end, secs))
print("- vs OFF: the median over rounds of tokens/s / tokens/s of `off` (base-*: of base-off) in the "
      "same round; fastest quartile: the same ratio from each run's 25th-percentile step time, "
      "which load from other processes disturbs least")
print()
print("| backend | configuration | tokens/s (median) | range | vs OFF | vs OFF, fastest quartile | runs ok |")
print("|---|---|---:|---:|---:|---:|---:|")
for b, by in runs.items():
    for c in configs:
        base = by.get("base-off" if c.startswith("base-") else "off", {})
        got = by.get(c, {})
        xs = [x for x in got.values() if x]
        ratios = [x / base[r] for r, x in got.items() if x and base.get(r)]
        qbase = quart[b].get("base-off" if c.startswith("base-") else "off", {})
        qratios = [x / qbase[r] for r, x in quart[b][c].items() if x and qbase.get(r)]
        print("| %s | %s | %s | %s | %s | %s | %d/%d |" % (
            b, label[c], "%.0f" % statistics.median(xs) if xs else "-",
            "%.0f-%.0f" % (min(xs), max(xs)) if xs else "-",
            "%.3f" % statistics.median(ratios) if ratios else "-",
            "%.3f" % statistics.median(qratios) if qratios else "-", len(xs), len(got)))
pace = {}
for line in open(work + "/pace.tsv"):
    b, ahead, lvl, us = line.rstrip("\n").split("\t")
    if us:
        pace.setdefault((b, ahead), {}).setdefault(lvl, []).append(float(us))
if pace:
    print()
    print("Time per all_gather(f32, 64), 2 ranks, 2000 calls, median over rounds:")
    print()
    print("| backend | in flight | OFF us | DETAIL us | DETAIL adds |")
    print("|---|---:|---:|---:|---:|")
    for (b, ahead), by in pace.items():
        off, det = by.get("OFF"), by.get("DETAIL")
        mo = statistics.median(off) if off else None
        md = statistics.median(det) if det else None
        print("| %s | %s | %s | %s | %s |" % (b, ahead, "%.1f" % mo if mo else "-",
              "%.1f" % md if md else "-", "%+.1f us" % (md - mo) if mo and md else "-"))
print()
print("Logs and metrics: `%s`." % work)
PYEOF
cat "$workdir/report.md"
cp "$workdir/report.md" "$out" || die "OUT $out: cannot write"
echo "== table written to $out (logs in $workdir)" >&2
