#!/bin/sh
# test_store_file.sh - the file:// store: a 3-rank job; a store left behind
# by a killed job is never read as current (by launcher job id, and by time
# without one), with a conflicting old value to prove it; the pure-stale
# case (rank 0 never comes) ends with FSDP_ERR_STALE within the timeout; no
# store at all ends with a timeout; a normal end removes the store.
. "$top_srcdir/tests/dist/store_lib.sh"

dir="$T/store"

run_job 3 "file://$dir" --big 4000000 --expect-size 3
tap_ok $? "file://: 3 ranks pass set/get/wait/add/check, prefixes, barriers, timeouts"
grep -q "counter sums every rank's adds (1200, want 1200)" "$T/r2.log"
tap_ok $? "file://: concurrent adds from 3 processes sum correctly (lock file)"
[ ! -e "$dir" ]
tap_ok $? "file://: rank 0 removed the job's store at the end"

# kill_job N: starts a 3-rank job that writes conflict=old and is killed
# with SIGKILL once every rank holds, leaving its stamp and values behind.
killed_job() {
    pids=""
    for r in 0 1 2; do
        RANK=$r WORLD_SIZE=3 timeout 60 "$PROBE" --init "file://$dir" --mode hold \
            >"$T/old$r.log" 2>&1 &
        pids="$pids $!"
    done
    bg_pids="$bg_pids $pids"
    for i in $(seq 200); do
        [ "$(cat "$T"/old*.log 2>/dev/null | grep -c HOLDING)" -eq 3 ] && break
        sleep 0.1
    done
    kill -9 $pids 2>/dev/null
    for p in $pids; do wait "$p" 2>/dev/null; done
    rm -f "$T"/old*.log
    [ -f "$dir/fsdpc-store.stamp" ] && ls "$dir"/job-*/kconflict >/dev/null 2>&1
}

# new_job: ranks 1 and 2 start first and find the old stamp; rank 0 comes
# 1.5 s later, replaces it, and everyone must read conflict=new.
new_job() {
    pids=""
    for r in 1 2; do
        ( RANK=$r WORLD_SIZE=3 timeout 60 "$PROBE" --init "file://$dir" --conflict \
            >"$T/r$r.log" 2>&1; echo $? >"$T/r$r.rc" ) &
        pids="$pids $!"
    done
    sleep 1.5
    ( RANK=0 WORLD_SIZE=3 timeout 60 "$PROBE" --init "file://$dir" --conflict \
        >"$T/r0.log" 2>&1; echo $? >"$T/r0.rc" ) &
    for p in $pids $!; do wait "$p"; done
    job_failed 3
}

# 1. by launcher job id
FSDPC_JOB_ID=old-$$ killed_job
tap_ok $? "a killed job left its stamp and a value conflict=old"
FSDPC_JOB_ID=new-$$ new_job
tap_ok $? "new job (other job id) with ranks 1-2 first: all checks pass, conflict reads new"
grep -q "replacing the store of an earlier job" "$T/r0.log"
tap_ok $? "rank 0 warns that it replaces the earlier job's store"

# 2. pure stale: only the stamp of a killed job, rank 0 never comes
FSDPC_JOB_ID=old2-$$ killed_job
start=$(date +%s)
RANK=1 WORLD_SIZE=3 FSDPC_JOB_ID=new2-$$ timeout 60 "$PROBE" --init "file://$dir" --timeout 3 \
    --mode init >"$T/stale.out" 2>"$T/stale.err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 8 ] && [ "$(wc -l <"$T/stale.err")" -eq 1 ] &&
    grep -q "file://$dir holds a store from an earlier job (written [0-9-]* [0-9:]*); remove it or choose another path (stale state from an earlier job)" "$T/stale.err"
tap_ok $? "only a stale stamp (job id): FSDP_ERR_STALE after the 3 s timeout (${took} s, exit $rc)"
tap_diag "$(cat "$T/stale.err")"

# 3. without job ids, by time: the old stamp predates the new processes
#    (slack 0 here; the default of 10 s covers clock skew and slow starts)
rm -rf "$dir"
killed_job
tap_ok $? "a killed job without a job id left its store"
sleep 2
FSDPC_FILE_STORE_SLACK=0 new_job
tap_ok $? "new job without job id, ranks 1-2 first: ignores the old stamp, conflict reads new"
[ ! -e "$dir/fsdpc-store.stamp" ] && [ -z "$(ls "$dir" 2>/dev/null)" ]
tap_ok $? "the replaced store and the new one are both gone at the end"

killed_job
sleep 2
start=$(date +%s)
RANK=2 WORLD_SIZE=3 FSDPC_FILE_STORE_SLACK=0 timeout 60 "$PROBE" --init "file://$dir" --timeout 2 \
    --mode init >"$T/stale.out" 2>"$T/stale.err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$took" -le 7 ] && grep -q "holds a store from an earlier job" "$T/stale.err"
tap_ok $? "only a stale stamp (time): FSDP_ERR_STALE after the 2 s timeout (${took} s, exit $rc)"

# 4. no store at all
start=$(date +%s)
RANK=1 WORLD_SIZE=2 timeout 60 "$PROBE" --init "file://$T/empty" --timeout 2 --mode init \
    >"$T/none.out" 2>"$T/none.err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$took" -le 7 ] && grep -q "no store appeared within 2" "$T/none.err"
tap_ok $? "no store at the path: timeout naming the path (${took} s, exit $rc)"
tap_diag "$(cat "$T/none.err")"

tap_done
