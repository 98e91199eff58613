#!/bin/sh
# test_stage.sh - collectives staged through host memory in chunks, on the
# guarded device (memory the host cannot touch, streams whose order it
# checks), over mpi and tcp at 2 and 3 ranks: every staged collective, in
# place and not, in f32, bf16, f16 and u8, over counts from 0 to 4099 and
# chunks from 64 bytes to 1 MiB (and whole buffers) leaves the device's
# bytes exactly as the same collective on host memory leaves the host's
# (stage_probe.c), however the handle is completed, with two in flight, and
# with a second pass that allocates nothing; the same with a stager without
# streams, and under FSDPC_DEBUG=DETAIL (every chunk fingerprinted); the
# flight recorder holds one record per chunk; a
# malformed FSDPC_STAGE_CHUNK_BYTES, or one that differs across the ranks,
# is a one-line error.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/debug/stage_probe"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-stage.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn FSDPC_TIMEOUT=60 FSDPC_GUARDED_BYTES=4294967296
LIMIT=300

if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "the staged collectives over 2 and 3 ranks"
    tap_done
    exit
fi

# probe N BACKEND ARGS...: sets st and k (ranks that said ok)
probe() {
    n=$1 be=$2
    shift 2
    timeout -k 5 $LIMIT $MPIEXEC -n "$n" "$PROG" --init mpi --mesh dp="$n" --backend "$be" \
        run "$@" > "$T/out" 2> "$T/err"
    st=$?
    k=$(grep -c '^rank [0-9]: staged ok [0-9]* collectives, 0 host allocations in the second pass$' \
        "$T/out")
    [ $st -eq 0 ] && [ "$k" -eq "$n" ]
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -20)"
}

for be in mpi tcp; do
    for n in 2 3; do
        probe $n $be
        c=$(sed -n 's/^rank 0: staged ok \([0-9]*\).*/\1/p' "$T/out")
        tap_ok $r "$be, $n ranks: staged in chunks = on the host, bit for bit${c:+ ($c collectives)}"
    done
done
probe 3 tcp nostream
tap_ok $r "tcp, 3 ranks: the same with a stager without streams"
FSDPC_DEBUG=DETAIL probe 2 mpi
tap_ok $r "mpi, 2 ranks, FSDPC_DEBUG=DETAIL: every chunk's fingerprint agrees"

FSDPC_STAGE_CHUNK_BYTES=4Q timeout -k 5 60 $MPIEXEC -n 2 "$PROG" --init mpi --mesh dp=2 \
    --backend tcp run > "$T/out" 2> "$T/err"
st=$?
want="rank 0: error: FSDPC_STAGE_CHUNK_BYTES='4Q' is not a size: give bytes, with K, M or G (4M), or 0 to copy whole buffers"
[ $st -ne 0 ] && grep -qxF "$want" "$T/out"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -10)"
tap_ok $r "a malformed FSDPC_STAGE_CHUNK_BYTES is one line that says what a size is"

# the flight recorder: one staged all-gather of 1001 f32 in 1000-byte chunks
# is five all_gather records on each rank, 250 x 4 and 1, complete, in turn
rm -rf "$T/flight"
FSDPC_FLIGHT_DIR="$T/flight" FSDPC_FLIGHT_DUMP_AT_EXIT=1 timeout -k 5 60 $MPIEXEC -n 2 "$PROG" \
    --init mpi --mesh dp=2 --backend tcp flight > "$T/out" 2> "$T/err"
st=$?
r=1
if [ $st -eq 0 ] && [ -f "$T/flight/flight_0.json" ] && [ -f "$T/flight/flight_1.json" ]; then
    r=0
    for f in "$T/flight"/flight_*.json; do
        got=$(sed -n 's/.*"group":"dp\[0\]","seq":\([0-9]*\),"op":"all_gather","dtype":"f32","count":\([0-9]*\),.*"state":"\([a-z]*\)".*/\1 \2 \3/p' "$f" |
            awk 'NR == 1 { s = $1 } { printf "%s%d:%s:%s", (NR > 1 ? " " : ""), $1 - s, $2, $3 }')
        [ "$got" = "0:250:completed 1:250:completed 2:250:completed 3:250:completed 4:1:completed" ] || {
            r=1
            tap_diag "$f: $got"
        }
    done
fi
[ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -10)"
tap_ok $r "the flight recorder holds a staged all-gather as one record per chunk (250 x 4, 1), in turn"

for be in mpi tcp; do
    timeout -k 5 60 $MPIEXEC -n 1 -env FSDPC_STAGE_CHUNK_BYTES 1K "$PROG" --init mpi --mesh dp=2 \
        --backend $be run : -n 1 -env FSDPC_STAGE_CHUNK_BYTES 4K "$PROG" --init mpi --mesh dp=2 \
        --backend $be run > "$T/out" 2> "$T/err"
    st=$?
    k=$(sed -n 's/^rank [01]: error: group dp\[0\]: FSDPC_STAGE_CHUNK_BYTES differs across its ranks (from 1024 to 4096 bytes): set the same value on every rank$/x/p' "$T/out" | wc -l)
    [ $st -ne 0 ] && [ "$k" -ge 1 ]
    r=$?
    [ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head -10)"
    tap_ok $r "$be: ranks with different FSDPC_STAGE_CHUNK_BYTES stop at once, the values named"
done
tap_done
