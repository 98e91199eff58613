#!/bin/sh
# test_store_flood.sh - a 2-rank env:// job forms while two local processes
# flood the store's port with connections that never send anything (each
# as fast as it can, to 127.0.0.1 only, at most 25 s and 1,000,000
# connections, stopped as soon as the job is done). The job's timeout is
# 15 s: a store whose listen backlog the flood keeps full holds rank 1 out
# (its SYNs dropped, resent by the kernel 1, 3, 7, 15 s later) until the
# flood ends, and the job fails. Prints the flood's rate and the time the
# job took, the figures of doc/troubleshooting.md.
. "$top_srcdir/tests/dist/store_lib.sh"
FLOOD="$top_srcdir/tests/dist/store_flood.py"
ulimit -n 4096 2>/dev/null

# storm_job SOURCE: the job under a storm from source address SOURCE.
storm_job() {
    port=$(free_port)
    rm -f "$T/stop" "$T"/r?.rc
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
    ( RANK=0 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// --timeout 15 --mode init \
        >"$T/r0.log" 2>&1; echo $? >"$T/r0.rc" ) &
    p0=$!
    for i in $(seq 100); do
        "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)))" && break
        sleep 0.1
    done
    FLOOD_SOURCE=$1 "$PY" "$FLOOD" "$port" storm 25 "$T/stop" >"$T/storm1.log" 2>&1 &
    fl=$!
    FLOOD_SOURCE=$1 "$PY" "$FLOOD" "$port" storm 25 "$T/stop" >"$T/storm2.log" 2>&1 &
    fl="$fl $!"
    bg_pids="$p0 $fl"
    for i in $(seq 100); do
        [ "$(cat "$T"/storm?.log | grep -c '^storming')" -eq 2 ] && break
        sleep 0.1
    done
    sleep 0.5 # the backlog is full by now, if it ever fills
    start=$(date +%s.%N)
    ( RANK=1 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// --timeout 15 --mode init \
        >"$T/r1.log" 2>&1; echo $? >"$T/r1.rc" )
    took=$(echo "$(date +%s.%N) - $start" | bc)
    wait $p0
    touch "$T/stop"
    for p in $fl; do wait "$p"; done
    storm=$(grep -h '^storm:' "$T"/storm?.log | tr '\n' ' ')
}

storm_job 127.0.0.1
tap_diag "$storm; rank 1 joined and the job ended in ${took} s"
job_failed 2
tap_ok $? "a flood from the ranks' own address (127.0.0.1): the job forms within its 15 s timeout"

storm_job 127.0.0.2
tap_diag "$storm; rank 1 joined and the job ended in ${took} s"
job_failed 2
tap_ok $? "a flood from another address (127.0.0.2): the job forms within its 15 s timeout"

tap_done
