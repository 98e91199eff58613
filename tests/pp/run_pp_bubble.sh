#!/bin/sh
# run_pp_bubble.sh - the pipeline's idle share per rank at pp=4 against the
# analytical bubble (doc/performance.md, "Pipeline bubble"): (P - 1) /
# (M + P - 1) for gpipe and 1f1b, (P - 1) / (V M + P - 1) interleaved.
#
# Four ranks on a machine with fewer cores than that would measure the
# cores' sharing, not the schedule, so the passes' compute is synthetic:
# FSDPC_PP_PASS_MS=T makes every forward take T ms more and every backward
# 2 T more, as sleeps, on a model whose own compute is well under T. Each
# stage keeps its micro-batches' activations, so every stage runs one
# forward and one backward per micro-batch (3 T). What it shows: the
# schedule and the runtime's message order. What it cannot show: the
# compute's own speed, memory traffic, or a real interconnect.
#
# Idle share of a rank: the milliseconds it waited in boundary messages
# (issue to completion of each receive; a send only where the next send of
# its direction waits for it) over the step's passes' time, as the rank logs them with FSDPC_LOG=fsdp=debug; the median of the
# steps after the first. Writes markdown to OUT.
#
#   BUILDDIR=build tests/pp/run_pp_bubble.sh
#
# Settings (environment): BUILDDIR (.), OUT (pp-bubble.md), STEPS (6),
# PASS_MS (20), MS ("4 8"), KINDS ("gpipe 1f1b interleaved"), BACKEND (tcp),
# MPIEXEC (mpiexec.mpich).
set -u
BUILDDIR=${BUILDDIR:-.}
OUT=${OUT:-pp-bubble.md}
STEPS=${STEPS:-6}
PASS_MS=${PASS_MS:-20}
MS=${MS:-4 8}
KINDS=${KINDS:-gpipe 1f1b interleaved}
BACKEND=${BACKEND:-tcp}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
P=4
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ppbubble.XXXXXX")
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1

sh "$(dirname "$0")/../corpus.sh" 60000 > "$W/text"
"$BUILDDIR/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > /dev/null 2>&1 &&
    "$BUILDDIR/fsdpc-ckpt" init --preset llama-tiny --width 48 --ffn 72 --context 32 \
        --layers 8 --seed 6 --untied -o "$W/m.h5" > /dev/null 2>&1 || {
    echo "run_pp_bubble: fixtures failed" >&2
    exit 1
}

{
    echo "| schedule | V | M | rank 0 | rank 1 | rank 2 | rank 3 | analytical |"
    echo "|---|---|---|---|---|---|---|---|"
} > "$OUT"
for kind in $KINDS; do
    V=1
    [ $kind = interleaved ] && V=2
    for M in $MS; do
        FSDPC_LOG=warn,fsdp=debug FSDPC_LOG_RANKS=all FSDPC_PP_PASS_MS=$PASS_MS \
            timeout 300 "$MPIEXEC" -n $P "$BUILDDIR/fsdpc-train" --model "$W/m.h5" \
            --data "$W/tok.bin" --batch-size 2 --seq-len 16 --grad-accum "$M" --steps "$STEPS" \
            --lr 1e-3 --mesh pp=$P --backend "$BACKEND" --pp-schedule $kind --pp-virtual $V \
            > "$W/run.log" 2>&1 || {
            echo "run_pp_bubble: $kind M $M failed" >&2
            tail -3 "$W/run.log" >&2
            continue
        }
        row="| $kind | $V | $M |"
        r=0
        while [ $r -lt $P ]; do
            share=$(sed -n "s/.*pipeline rank $r step \([0-9]*\): waited \([0-9.]*\) ms of \([0-9.]*\) ms.*/\1 \2 \3/p" \
                "$W/run.log" | awk '$1 > 1 { print $2 / $3 }' | sort -g |
                awk '{ a[NR] = $1 } END { if (NR) printf "%.3f", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
            row="$row $share |"
            r=$((r + 1))
        done
        an=$(awk -v P=$P -v V=$V -v M="$M" 'BEGIN { printf "%.3f", (P - 1) / (V * M + P - 1) }')
        echo "$row $an |" >> "$OUT"
    done
done
cat "$OUT"
