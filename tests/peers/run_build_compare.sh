#!/bin/bash
# run_build_compare.sh - tokens/s of two fsdpc builds on a preset
# (bench-small unless PRESET says), in one run, interleaved: 1 rank x 1
# thread and 2 ranks x 1 thread (RANKS)
# (--mesh dp=2 --backend BACKEND), ROUNDS rounds, each round running the
# old build then the new one; a run's figure is its median step time after
# WARMUP steps,
# the table gives the median over rounds and new/old. For checking that a
# change of the code's shape costs no speed (doc/performance.md).
#
#   OLD=/tmp/old/build NEW=build tests/peers/run_build_compare.sh
#
# Settings: OLD, NEW (build directories with fsdpc-train, fsdpc-ckpt,
# fsdpc-data), PRESET [bench-small], RANKS ["1 2"], ROUNDS [5], STEPS [20],
# WARMUP [4], BATCH [4], SEQ [256], BACKEND [tcp], MPIEXEC [mpiexec.mpich].
set -u
old=${OLD:?set OLD to the old build directory}
new=${NEW:?set NEW to the new build directory}
rounds=${ROUNDS:-5}
steps=${STEPS:-20}
warmup=${WARMUP:-4}
batch=${BATCH:-4}
seq=${SEQ:-256}
mpiexec=${MPIEXEC:-mpiexec.mpich}
backend=${BACKEND:-tcp}
preset=${PRESET:-bench-small}
ranks=${RANKS:-1 2}
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
w=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-cmp.XXXXXX")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 FSDPC_LOG=warn

sh "$srcdir/tests/corpus.sh" 2000000 > "$w/text"
"$new/fsdpc-data" tokenize "$w/text" -o "$w/tok.bin" > /dev/null
"$new/fsdpc-ckpt" init --preset "$preset" -o "$w/m.h5" > /dev/null

# median step ms after warmup, from a metrics file
median_ms() {
    /usr/bin/python3 - "$1" "$warmup" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
ms = [r["ms"] for r in recs[int(sys.argv[2]):]]
print("%.2f" % statistics.median(ms))
PY
}

# run BUILD RANKS TAG ROUND
run() {
    local args="--model $w/m.h5 --data $w/tok.bin --steps $steps --batch-size $batch
--seq-len $seq --lr 1e-3 --peak-flops 1e11 --threads 1 --log-every 1"
    local m="$w/$3.$4.jsonl"
    rm -f "$m"
    if [ "$2" -eq 1 ]; then
        # shellcheck disable=SC2086
        "$1/fsdpc-train" $args --metrics "$m" > "$w/$3.$4.log" 2>&1
    else
        # shellcheck disable=SC2086
        "$mpiexec" -n "$2" "$1/fsdpc-train" $args --mesh "dp=$2" --backend "$backend" --metrics "$m" \
            > "$w/$3.$4.log" 2>&1
    fi
    median_ms "$m"
}

echo "| ranks | old ms/step (median of $rounds) | new ms/step | new/old tokens/s | per-round ratios |"
echo "|---:|---:|---:|---:|---|"
for n in $ranks; do
    olds="" news="" ratios=""
    for r in $(seq 1 "$rounds"); do
        o=$(run "$old" "$n" "old$n" "$r")
        x=$(run "$new" "$n" "new$n" "$r")
        olds="$olds $o" news="$news $x"
        ratios="$ratios $(awk -v o="$o" -v x="$x" 'BEGIN { printf "%.3f", o / x }')"
    done
    med() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
    mo=$(med $olds) mx=$(med $news) mr=$(med $ratios)
    echo "| $n | $mo | $mx | $mr | $ratios |"
done
echo
echo "work directory: $w"
