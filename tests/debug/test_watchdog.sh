#!/bin/sh
# test_watchdog.sh - a rank stopped (SIGSTOP) in the middle of a 3-rank
# fsdpc-train run on the tcp backend with --timeout 5: the other ranks must
# abort within the deadline with a message naming the stuck collective,
# the flight recorder of the first to fail must be on disk, and
# fsdpc-flight merge must name the collective the stopped rank never
# finished, and that rank.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-watchdog.XXXXXX")
stopped=""
cleanup() {
    [ -n "$stopped" ] && kill -KILL "$stopped" 2> /dev/null
    rm -rf "$T"
}
trap cleanup EXIT
export FSDPC_LOG=warn FSDPC_FLIGHT_DIR="$T/flight"
DEADLINE=5
LIMIT=60

sh "$top_srcdir/tests/corpus.sh" 500000 > "$T/text"
"$BIN/fsdpc-data" tokenize "$T/text" -o "$T/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
        -o "$T/m.h5" > /dev/null 2>&1
tap_ok $? "fixtures: token file and model"

# every process below pid $1
descendants() {
    for c in $(ps -o pid= --ppid "$1"); do
        echo "$c"
        descendants "$c"
    done
}

timeout -k 5 $LIMIT $MPIEXEC -n 3 "$TRAIN" --model "$T/m.h5" --data "$T/train.bin" \
    --batch-size 4 --seq-len 64 --peak-flops 1e11 --steps 100000 --log-every 1 --lr 1e-3 \
    --backend tcp --timeout $DEADLINE > "$T/out" 2> "$T/err" &
job=$!

# wait for training to be under way, then stop rank 1
i=0
while [ $i -lt 300 ] && ! grep -q '^step  *5/' "$T/out" 2> /dev/null; do
    sleep 0.1
    i=$((i + 1))
done
for p in $(descendants $job); do
    if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'PMI_RANK=1' &&
        [ "$(cat "/proc/$p/comm" 2> /dev/null)" = fsdpc-train ]; then
        stopped=$p
    fi
done
[ -n "$stopped" ] && kill -STOP "$stopped"
tap_ok $? "rank 1 found and stopped after 5 steps (pid ${stopped:-none})"
t0=$(date +%s)
wait $job
st=$?
secs=$(($(date +%s) - t0))
tap_diag "job ended with status $st ${secs}s after the stop"
tap_diag "$(grep -m 2 '^fsdpc: rank' "$T/err")"

[ $st -ne 0 ] && [ $st -ne 124 ] && [ $st -ne 137 ] && [ $secs -le $((DEADLINE + 10)) ]
tap_ok $? "the others abort within the deadline (+ grace and launch teardown): ${secs}s"

# the ranks print it as they stop; when the abort of one kills the other
# before it printed, the dump's "reason" carries the same message. Where
# rank 1 stopped decides the group: inside a step a dp[0] all-gather or
# reduce-scatter, at a step boundary the trainer's vote on the world group
named='collective #[0-9]+ [a-z_]+\([a-z0-9]+, [0-9]+.*\) on group (dp\[0\]|world) (not complete after|failed: )'
grep -E "fsdpc: rank [02] on .*$named" "$T/err" > /dev/null ||
    cat "$T"/flight/flight_*.json 2> /dev/null | head -n 1 | grep -E "\"reason\":\"$named" > /dev/null
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -n 5 "$T/err")"
tap_ok $r "the error names the collective, its group and its sequence number"

# the first rank to fail dumps and aborts the job; the other may be killed
# by that abort before its own dump, so one of the two is what is certain
{ [ -s "$T/flight/flight_0.json" ] || [ -s "$T/flight/flight_2.json" ]; } &&
    [ ! -e "$T/flight/flight_1.json" ]
tap_ok $? "a flight dump of rank 0 or 2 exists (the stopped rank 1 wrote none)"

"$BIN/fsdpc-flight" merge "$T/flight" > "$T/merge" 2>&1
mst=$?
grep -E '^first stuck collective: collective #[0-9]+ [a-z_]+\(.*\) on group (dp\[0\]|world)$' "$T/merge" \
    > /dev/null && grep -qE 'no dump from ranks: ([0-9]+, )*1[ ,]' "$T/merge" && [ $mst -eq 1 ]
r=$?
tap_diag "$(cat "$T/merge")"
tap_ok $r "fsdpc-flight merge names the stuck collective and rank 1"

tap_done
