#!/bin/sh
# test_store_mpi.sh - the mpi init method: rank 0's TCP store address and
# the job nonce travel by MPI_Bcast; the same probe as the env:// test, then
# auto-detection under the MPI launcher, and a one-rank launch (no job).
. "$top_srcdir/tests/dist/store_lib.sh"

if [ -z "$MPIEXEC" ] || [ "$MPIEXEC" = no ]; then
    tap_skip_dep mpiexec "no MPI launcher"
    tap_done
    exit 0
fi

mpi_job() { # N LOG probe-args...
    n=$1 log=$2
    shift 2
    timeout 90 $MPIEXEC -n "$n" "$PROBE" "$@" >"$log" 2>&1
}

mpi_job 3 "$T/mpi.log" --init mpi --big 16777216 --expect-size 3
rc=$?
fails=$(grep -c '^FAIL' "$T/mpi.log")
passes=$(grep -c '^PASS' "$T/mpi.log")
[ "$rc" -eq 0 ] && [ "$fails" -eq 0 ] && [ "$passes" -gt 60 ]
tap_ok $? "mpi: 3 ranks pass the store probe ($passes checks passed, $fails failed, exit $rc)"
[ "$rc" -eq 0 ] || tap_diag "$(grep -v '^PASS' "$T/mpi.log")"
[ "$(grep -c 'method mpi nonce' "$T/mpi.log")" -eq 3 ] &&
    [ "$(sed -n 's/^IDENT.*nonce //p' "$T/mpi.log" | sort -u | wc -l)" -eq 1 ]
tap_ok $? "mpi: every rank reports method mpi and the same nonce"
[ "$(grep -c '^FINALIZED' "$T/mpi.log")" -eq 3 ]
tap_ok $? "mpi: every rank finalized"

mpi_job 2 "$T/auto.log" --expect-size 2
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c 'method mpi ' "$T/auto.log")" -eq 2 ]
tap_ok $? "auto under $MPIEXEC -n 2 picks mpi (exit $rc)"
[ "$rc" -eq 0 ] || tap_diag "$(grep -v '^PASS' "$T/auto.log")"

mpi_job 1 "$T/one.log" --expect-size 1
rc=$?
[ "$rc" -eq 0 ] && grep -q 'method single ' "$T/one.log"
tap_ok $? "auto under $MPIEXEC -n 1 runs as a single rank (exit $rc)"
[ "$rc" -eq 0 ] || tap_diag "$(grep -v '^PASS' "$T/one.log")"

# The job-wide abort: rank 2 dies, MPI_Abort ends ranks 0-1 waiting in a
# barrier long before its 60 s timeout; the callbacks ran in order.
start=$(date +%s)
timeout 90 $MPIEXEC -n 3 "$PROBE" --init mpi --mode abort --timeout 60 --abort-log "$T/cb.log" \
    >"$T/abort.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$took" -lt 30 ] && ! grep -q BARRIER-RETURNED "$T/abort.log"
tap_ok $? "fsdp_fatal on one rank aborts the whole MPI job (${took} s, exit $rc)"
[ "$(tr '\n' '|' <"$T/cb.log")" = "ABORT-CB first: job aborted|ABORT-CB second: job aborted|" ]
rc=$?
tap_ok $rc "the abort callbacks ran in registration order, the removed one did not"
[ $rc -eq 0 ] || tap_diag "$(cat "$T/cb.log" "$T/abort.log")"

"$PROBE" --expect-size 1 >"$T/single.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q 'method single ' "$T/single.log"
tap_ok $? "auto with no launcher: single rank, in-process store (exit $rc)"

tap_done
