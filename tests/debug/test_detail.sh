#!/bin/sh
# test_detail.sh - FSDPC_DEBUG=DETAIL on 3 ranks, mpi and tcp backends: a
# rank that calls another op, dtype, count or root stops the job on every
# rank with a message naming both ranks and both calls; a rank that skips a
# collective is named by the others when the fingerprint exchange times
# out; a faultless run passes. The same with collectives issued ahead of
# their waits (more of them than the fingerprint ring holds), completed by
# waiting or by polling: on tcp the fingerprints are checked at the wait, and
# a mismatch that hangs the collective itself (two roots) must still be
# named. Every faulty run must end well within its deadline.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/debug/debug_probe"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-detail.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn FSDPC_DEBUG=DETAIL FSDPC_TIMEOUT=5 FSDPC_FLIGHT_DIR="$T/flight"
LIMIT=30 # a fault must end the job within this (deadline 5 s + launch)

# probe BACKEND MODE ARGS...: 3 ranks; sets st, secs
probe() {
    be=$1
    shift
    t0=$(date +%s)
    timeout -k 5 $LIMIT $MPIEXEC -n 3 "$PROG" --init mpi --mesh dp=3 --backend "$be" \
        "$@" > "$T/out" 2> "$T/err"
    st=$?
    secs=$(($(date +%s) - t0))
}

# run BACKEND FAULT: rank 1 changes collective #4
run() { probe "$1" detail "$2" 1 4; }

# every RANKS line of out has "rank R: error: <text>" with text containing $1
all_say() {
    want=$1
    shift
    for r in "$@"; do
        grep -F "rank $r: error: " "$T/out" | grep -qF "$want" || return 1
    done
}

for be in mpi tcp; do
    run "$be" none
    n=$(grep -c 'detail done' "$T/out")
    [ $st -eq 0 ] && [ "$n" -eq 3 ]
    tap_ok $? "$be: no fault: 3 ranks done (status $st)"

    run "$be" op
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "rank 1 called reduce_scatter(f32, 64, sum) as collective #4 on group dp[0] while rank 0 called all_gather(f32, 64)" 0 1 2
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "$be: wrong op named on every rank (status $st, ${secs}s)"

    run "$be" dtype
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "rank 1 called all_gather(i32, 64) as collective #4 on group dp[0] while rank 0 called all_gather(f32, 64)" 0 1 2
    tap_ok $? "$be: wrong dtype named on every rank (status $st, ${secs}s)"

    run "$be" count
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "rank 1 called all_gather(f32, 32) as collective #4 on group dp[0] while rank 0 called all_gather(f32, 64)" 0 1 2
    tap_ok $? "$be: wrong count named on every rank (status $st, ${secs}s)"

    run "$be" root
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "rank 1 called broadcast(f32, 64, root 1) as collective #4 on group dp[0] while rank 0 called broadcast(f32, 64, root 0)" 0 1 2
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "$be: wrong root named on every rank (status $st, ${secs}s)"

    run "$be" skip
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "collective #8 all_gather(f32, 64) on group dp[0]: rank 1 (last at #7) never reached it" 0 2
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "$be: skipped collective: the waiting ranks name rank 1 (status $st, ${secs}s)"
done

# collectives issued ahead: ahead FAULT RANK AT POLL N
for args in "tcp 0 40" "tcp 1 40" "mpi 0 40"; do
    set -- $args
    probe "$1" ahead none 1 4 "$2" "$3"
    n=$(grep -c 'ahead done, 0 wrong values' "$T/out")
    [ $st -eq 0 ] && [ "$n" -eq 3 ]
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "$1: $3 collectives issued ahead, $([ "$2" = 1 ] && echo polled || echo waited): right data on 3 ranks (status $st)"
done

for args in "op 0 reduce_scatter(f32, 64, sum) all_gather(f32, 64)" \
    "count 1 all_gather(f32, 32) all_gather(f32, 64)" \
    "root 1 broadcast(f32, 64, root 1) broadcast(f32, 64, root 0)"; do
    fault=${args%% *}
    rest=${args#* }
    poll=${rest%% *}
    calls=${rest#* }
    mine="${calls%) *})"
    theirs="${calls#*) }"
    probe tcp ahead "$fault" 1 4 "$poll" 8
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "rank 1 called $mine as collective #4 on group dp[0] while rank 0 called $theirs" 0 1 2
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "tcp: issued ahead, wrong $fault named on every rank at the $([ "$poll" = 1 ] && echo test || echo wait) (status $st, ${secs}s)"
done

# the training engine (prefetched all-gathers, polled reduce-scatters) under
# DETAIL: the same losses as without it, on both backends
BIN="$top_builddir"
sh "$top_srcdir/tests/corpus.sh" 96000 > "$T/text"
"$BIN/fsdpc-data" tokenize "$T/text" -o "$T/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
        -o "$T/m.h5" > /dev/null 2>&1
tap_ok $? "fixtures: token file and model"
for be in tcp mpi; do
    for lvl in off detail; do
        timeout -k 5 $LIMIT $MPIEXEC -n 2 "$BIN/fsdpc-train" --model "$T/m.h5" \
            --data "$T/train.bin" --batch-size 2 --seq-len 64 --steps 4 --log-every 1 \
            --lr 1e-3 --backend "$be" --debug "$lvl" > "$T/train-$lvl" 2>&1
        echo $? >> "$T/train-$lvl"
        sed -n 's/^step *\([0-9]*\)\/.*| loss \([0-9.]*\) .*/\1 \2/p' "$T/train-$lvl" > "$T/loss-$lvl"
    done
    [ "$(tail -n 1 "$T/train-detail")" = 0 ] && [ "$(wc -l < "$T/loss-detail")" -eq 4 ] &&
        cmp -s "$T/loss-off" "$T/loss-detail"
    r=$?
    [ $r -eq 0 ] || tap_diag "$(tail -n 5 "$T/train-detail"; cat "$T/loss-off" "$T/loss-detail")"
    tap_ok $r "$be: fsdpc-train under DETAIL: 4 steps, the same losses as without it"
done

# the dumps written at the mismatch let the merge tool point at it, and at
# the collective the skipping rank never entered
rm -rf "$T/flight"
run tcp skip
"$top_builddir/fsdpc-flight" merge "$T/flight" > "$T/merge" 2>&1
st=$?
grep -q '^first stuck collective: collective #8 all_gather(f32, 64) on group dp\[0\]$' "$T/merge" &&
    grep -qF 'entered by ranks: 0 (failed), 2 (failed)' "$T/merge" &&
    grep -q 'no dump from ranks: 1 ' "$T/merge" && [ $st -eq 1 ]
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$T/merge")"
tap_ok $r "fsdpc-flight merge names the collective rank 1 skipped (status $st)"
rm -rf "$T/flight"

run tcp op
"$top_builddir/fsdpc-flight" merge "$T/flight" > "$T/merge" 2>&1
st=$?
grep -q '^mismatched collective: collective #4 all_gather(f32, 64) on group dp\[0\]$' "$T/merge" &&
    grep -qF '1 (failed: reduce_scatter(f32, 64, sum))' "$T/merge" && [ $st -eq 1 ]
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$T/merge")"
tap_ok $r "fsdpc-flight merge reads the dumps of a mismatch (status $st)"

tap_done
