#!/bin/sh
# test_fuzz.sh - randomized collective sequences on a 2-D mesh (dp=2,tp=2,
# 4 ranks, tcp on dp and mpi on tp) under FSDPC_DEBUG=DETAIL, with one rank
# skipping one collective at a random place: every trial must end within
# its deadline, non-zero, with a named error (a mismatch naming two calls,
# or a rank that never reached a collective). One faultless trial first.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/debug/debug_probe"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-fuzz.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn FSDPC_DEBUG=DETAIL FSDPC_TIMEOUT=3 FSDPC_FLIGHT_DIR="$T/flight"
LIMIT=20 # deadline 3 s (twice, for a rank waiting behind a waiting rank) + launch
TRIALS=${FSDPC_FUZZ_TRIALS:-10}

fuzz() {
    t0=$(date +%s)
    timeout -k 5 $LIMIT $MPIEXEC -n 4 "$PROG" --init mpi --mesh dp=2,tp=2 \
        --backend dp=tcp,tp=mpi fuzz "$@" > "$T/out" 2> "$T/err"
    st=$?
    secs=$(($(date +%s) - t0))
}

fuzz 1 -1 0
n=$(grep -c 'fuzz done' "$T/out")
[ $st -eq 0 ] && [ "$n" -eq 4 ]
tap_ok $? "no skip: the random sequence completes on 4 ranks (status $st)"

i=1
while [ $i -le "$TRIALS" ]; do
    seed=$((i * 7919 + 17))
    rank=$((i % 4))
    at=$((2 + (i * 13) % 36))
    fuzz $seed $rank $at
    named=$(grep -E 'rank [0-9]: error: .*(called .* as collective #[0-9]+ on group (dp|tp)\[[01]\] while rank [0-9] called|never reached it)' "$T/out" | head -n 1)
    [ $st -ne 0 ] && [ $st -ne 124 ] && [ $st -ne 137 ] && [ $secs -lt $LIMIT ] && [ -n "$named" ]
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
    tap_diag "trial $i: ${named#*error: }"
    tap_ok $r "trial $i (seed $seed, rank $rank skips #$at): named error in ${secs}s (status $st)"
    i=$((i + 1))
done

tap_done
