#!/bin/sh
# test_tp_ops.sh - the tensor-parallel operators (tests/tp/test_tp_ops.c)
# and the models' tensor-parallel paths against the whole model
# (tests/tp/test_tp_model.c) over tp = 2, 3 and 4 ranks with the mpi
# backend, and tp = 2 (operators) and 4 (models) with tcp, under mpiexec.
# Each run's TAP lines (rank 0's) are relayed, renumbered, followed by one
# line for its exit status.
. "$top_srcdir/tests/tap.sh"

OPS="$top_builddir/tests/tp/test_tp_ops"
MODEL="$top_builddir/tests/tp/test_tp_model"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
LIMIT=120 # seconds per run: a hang fails the run instead of the suite

if ! command -v "$MPIEXEC" > /dev/null 2>&1; then
    tap_skip_dep mpiexec "$MPIEXEC not found"
    tap_done
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tpops.XXXXXX")
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

for run in "ops mpi 2" "ops mpi 3" "ops mpi 4" "ops tcp 2" "model mpi 2" "model mpi 3" \
    "model mpi 4" "model tcp 4"; do
    set -- $run
    prog=$OPS
    [ "$1" = model ] && prog=$MODEL
    timeout -k 5 $LIMIT "$MPIEXEC" -n "$3" "$prog" --backend "$2" > "$T/out" 2> "$T/err"
    relay "$1 $2 tp=$3" $?
done
tap_done
