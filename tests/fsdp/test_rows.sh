#!/bin/sh
# test_rows.sh - GPT-2 with unit 0 by rows (tests/fsdp/test_rows.c: the
# vocabulary-parallel embedding and tied head) against one process with the
# global batch, over 2 and 3 ranks with the mpi and tcp backends under
# mpiexec. Each run's TAP lines (rank 0's) are relayed, renumbered, followed
# by one line for its exit status.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/fsdp/test_rows"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
LIMIT=120 # seconds per run: a hang fails the run instead of the suite

if ! command -v "$MPIEXEC" > /dev/null 2>&1; then
    tap_skip_dep mpiexec "$MPIEXEC not found"
    tap_done
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-rows.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn

relay() {
    while IFS= read -r line; do
        case $line in
        "ok "*) tap_ok 0 "${line#* - }" ;;
        "not ok "*) tap_ok 1 "${line#* - }" ;;
        "#"*) echo "$line" ;;
        1..*) ;;
        *) tap_diag "$line" ;;
        esac
    done < "$T/out"
    [ "$2" -eq 0 ] || tap_diag "$(tail -n 20 "$T/err")"
    tap_ok "$2" "$1: exit status $2"
}

for backend in mpi tcp; do
    for n in 2 3; do
        timeout -k 5 $LIMIT "$MPIEXEC" -n $n "$PROG" --backend $backend > "$T/out" 2> "$T/err"
        relay "$backend n=$n" $?
    done
done
tap_done
