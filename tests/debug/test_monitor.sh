#!/bin/sh
# test_monitor.sh - the monitored barrier, the watchdog and the SIGUSR2
# dump, 3 ranks: a barrier with one late rank names exactly that rank on
# every rank (the late one included), with every rank arriving in time it
# passes; a collective nobody waits for is caught by the watchdog; SIGUSR2
# writes each rank's flight recorder, which the merge tool reads back as
# a job with nothing pending.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/debug/debug_probe"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-monitor.XXXXXX")
trap 'rm -rf "$T"' EXIT
export FSDPC_LOG=warn FSDPC_TIMEOUT=10 FSDPC_FLIGHT_DIR="$T/flight"
LIMIT=40

# mb BACKEND RANK SLEEP TIMEOUT WAIT_ALL
mb() {
    timeout -k 5 $LIMIT $MPIEXEC -n 3 "$PROG" --init mpi --mesh dp=3 --backend "$1" \
        mbarrier "$2" "$3" "$4" "$5" > "$T/out" 2> "$T/err"
    st=$?
}

mb tcp -1 0 2 1
n=$(grep -c 'mbarrier: ok' "$T/out")
[ $st -eq 0 ] && [ "$n" -eq 3 ]
tap_ok $? "monitored barrier: all ranks in time pass (status $st, $n ok)"

mb tcp 2 3.5 1.5 1
want="monitored barrier #1 on group dp[0]: rank 2 did not arrive within 1.5 s"
ok=0
for r in 0 1 2; do
    grep -F "rank $r: mbarrier: $want" "$T/out" > /dev/null || ok=1
done
# exactly rank 2: no other rank is named
grep -E 'ranks? [0-9, ]*[01][0-9, ]* did not arrive' "$T/out" > /dev/null && ok=1
[ $ok -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err")"
tap_ok $ok "monitored barrier: a late rank 2 is named, alone, on all 3 ranks"

mb mpi 1 3.5 1.5 0
grep -F "rank 0: mbarrier: monitored barrier #1 on group dp[0]: rank 1 did not arrive" "$T/out" \
    > /dev/null && grep -F "rank 2: mbarrier: monitored barrier #1" "$T/out" > /dev/null
tap_ok $? "monitored barrier (wait_all off, mpi backend): the first late rank is named"

# the watchdog: a collective issued and never waited for, a rank that never joins
t0=$(date +%s)
FSDPC_TIMEOUT=3 timeout -k 5 $LIMIT $MPIEXEC -n 3 "$PROG" --init mpi --mesh dp=3 --backend tcp \
    stall 2 > "$T/out" 2> "$T/err"
st=$?
secs=$(($(date +%s) - t0))
# the message is on stderr, or, when the launcher's teardown loses the last
# lines of a rank it kills, in the dump the watchdog wrote first
wd='collective #6 allreduce\(f32, 16, sum\) on group dp\[0\] not complete after [0-9.]+ s \(deadline 3.0 s'
{ grep -qE "watchdog: $wd" "$T/err" ||
    cat "$T"/flight/flight_?.json 2> /dev/null | grep -qE "\"reason\":\"$wd"; } && [ $st -ne 0 ] && [ $st -ne 124 ] && [ $secs -lt 15 ] &&
    ! grep -q 'did not fire' "$T/out" && ls "$T"/flight/flight_?.json > /dev/null 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err" | head)"
tap_ok $r "watchdog: an unwaited stuck collective aborts the job by name in ${secs}s (status $st)"
rm -rf "$T/flight"

timeout -k 5 $LIMIT $MPIEXEC -n 3 "$PROG" --init mpi --mesh dp=3 --backend tcp usr2 \
    > "$T/out" 2> "$T/err"
st=$?
n=$(grep -c 'usr2 dump written' "$T/out")
[ $st -eq 0 ] && [ "$n" -eq 3 ] && [ -s "$T/flight/flight_0.json" ]
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$T/out" "$T/err")"
tap_ok $r "SIGUSR2 writes flight_<rank>.json on every rank (status $st)"

grep -c '"op":"allreduce","dtype":"f32","count":16' "$T/flight/flight_1.json" | grep -qx 5
tap_ok $? "the dump holds the 5 allreduce(f32, 16) calls"

"$top_builddir/fsdpc-flight" merge "$T/flight" > "$T/merge" 2>&1
st=$?
[ $st -eq 0 ] && grep -q '^3 of 3 ranks dumped' "$T/merge"
tap_ok $? "merge of a healthy job: nothing pending (status $st)"

FSDPC_DEBUG=loud timeout -k 5 $LIMIT $MPIEXEC -n 2 "$PROG" --init mpi --mesh dp=2 \
    --backend tcp usr2 > "$T/out" 2> "$T/err"
st=$?
[ $st -ne 0 ] && grep -q 'rank 1: error: FSDPC_DEBUG=loud: expected OFF, INFO or DETAIL' "$T/out"
tap_ok $? "a bad FSDPC_DEBUG is one clear error on every rank (status $st)"

mkdir -p "$T/bad" && echo '{"format":"other"}' > "$T/bad/flight_0.json"
"$top_builddir/fsdpc-flight" merge "$T/bad" > "$T/merge" 2>&1
st=$?
[ $st -eq 2 ] && grep -q 'flight_0.json: line 1' "$T/merge"
tap_ok $? "merge of a file fsdpc did not write: one clear error (status $st)"

# the command line: generated help, and a usage error is bad input (2), not a finding (1)
"$top_builddir/fsdpc-flight" merge --help > "$T/help" 2>&1 &&
    grep -q '^usage: fsdpc-flight merge DIR' "$T/help" && grep -q -- '--help' "$T/help"
tap_ok $? "fsdpc-flight merge --help prints its usage"
"$top_builddir/fsdpc-flight" merge > "$T/merge" 2>&1
st=$?
[ $st -eq 2 ] && grep -q 'fsdpc-flight merge: expected one dump directory, got 0' "$T/merge"
tap_ok $? "fsdpc-flight merge without a directory: one line, status 2 (status $st)"
"$top_builddir/fsdpc-flight" merge "$T/bad" --dir x > "$T/merge" 2>&1
st=$?
[ $st -eq 2 ] && grep -q 'unknown option --dir' "$T/merge"
tap_ok $? "fsdpc-flight merge with an unknown flag: one line, status 2 (status $st)"

tap_done
