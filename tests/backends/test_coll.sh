#!/bin/sh
# test_coll.sh - the collective correctness matrix (test_coll) for the mpi
# and tcp backends at 1, 2, 3 and 4 ranks under mpiexec, and for tcp also as
# plain processes rendezvousing through env:// (3 and 4 ranks, small counts:
# the large ones run under mpiexec with the same backend code). Each run's
# TAP lines are relayed, renumbered, followed by one line for its exit status.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/backends/test_coll"
PY="${PYTHON3:-python3}"
[ "$PY" = no ] && PY=python3
LIMIT=150 # seconds per run; a hang fails the run instead of the suite

# Nothing from an enclosing launcher may leak into the jobs started here.
for v in $(env | sed -n 's/^\(PMIX*_[A-Za-z0-9_]*\|SLURM_[A-Za-z0-9_]*\|OMPI_[A-Za-z0-9_]*\|HYDRA_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT FSDPC_JOB_ID

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-coll-test.XXXXXX")
trap 'rm -rf "$T"' EXIT

# relay LABEL STATUS: renumber rank 0's TAP from $T/out; show stderr when the
# run failed.
relay() {
    while IFS= read -r line; do
        case $line in
        "ok "*) tap_ok 0 "${line#* - }" ;;
        "not ok "*) tap_ok 1 "${line#* - }" ;;
        "#"*) echo "$line" ;;
        1..*) ;;
        *) tap_diag "$line" ;;
        esac
    done <"$T/out"
    if [ "$2" -ne 0 ]; then
        tap_diag "$(tail -n 20 "$T/err")"
    fi
    tap_ok "$2" "$1: exit status $2"
}

# The 2^20+3 counts (f32 and bf16) where there is communication; small
# counts for every dtype everywhere.
for backend in mpi tcp; do
    for n in 1 2 3 4; do
        large=f32,bf16
        [ $n -eq 1 ] && large=none
        timeout -k 5 $LIMIT $MPIEXEC -n $n "$PROG" --backend $backend --init mpi --large $large \
            >"$T/out" 2>"$T/err"
        relay "$backend n=$n under mpiexec" $?
    done
done

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# tcp without MPI: N plain processes, rank 0's output relayed.
for n in 3 4; do
    port=$(free_port)
    pids=""
    r=0
    while [ $r -lt $n ]; do
        if [ $r -eq 0 ]; then o="$T/out" e="$T/err"; else o=/dev/null e="$T/err.$r"; fi
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout -k 5 $LIMIT "$PROG" --backend tcp --init env:// --large none >"$o" 2>"$e" &
        pids="$pids $!"
        r=$((r + 1))
    done
    status=0
    for p in $pids; do
        wait "$p" || status=1
    done
    for f in "$T"/err.*; do
        [ -f "$f" ] && [ $status -ne 0 ] && tap_diag "$(tail -n 5 "$f")"
    done
    rm -f "$T"/err.*
    relay "tcp n=$n as plain processes (env://)" $status
done

tap_done
