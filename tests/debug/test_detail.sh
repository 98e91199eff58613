#!/bin/sh
# test_detail.sh - FSDPC_DEBUG=DETAIL on 3 ranks, mpi and tcp backends: a
# rank that calls another op, dtype or count stops the job on every rank
# with a message naming both ranks and both calls; a rank that skips a
# collective is named by the others when the fingerprint exchange times
# out; a faultless run passes. Every faulty run must end well within its
# deadline.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/debug/debug_probe"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-detail.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn FSDPC_DEBUG=DETAIL FSDPC_TIMEOUT=5 FSDPC_FLIGHT_DIR="$T/flight"
LIMIT=30 # a fault must end the job within this (deadline 5 s + launch)

# run BACKEND FAULT: 3 ranks, rank 1 changes collective #4; sets st, secs
run() {
    t0=$(date +%s)
    timeout -k 5 $LIMIT $MPIEXEC -n 3 "$PROG" --init mpi --mesh dp=3 --backend "$1" \
        detail "$2" 1 4 > "$T/out" 2> "$T/err"
    st=$?
    secs=$(($(date +%s) - t0))
}

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

    run "$be" skip
    [ $st -ne 0 ] && [ $secs -lt $LIMIT ] && all_say \
        "collective #8 all_gather(f32, 64) on group dp[0]: rank 1 (last at #7) never reached it" 0 2
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_ok $r "$be: skipped collective: the waiting ranks name rank 1 (status $st, ${secs}s)"
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
