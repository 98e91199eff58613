#!/bin/sh
# test_tcp_faults.sh - the tcp backend across plain processes (env://, one
# tcp_probe per rank) when things go wrong:
#   a healthy job of 3 ranks (the baseline);
#   SIGKILL of rank 1 in the middle of a loop of large allreduces: every other
#     rank exits non-zero within 2x the timeout, naming rank 1;
#   SIGSTOP of rank 1: the others time out, naming rank 1;
#   a foreign client knocking on a rank's listening port during setup with
#     garbage, and one that says nothing: refused, and the job's results are
#     correct; 60 idle connections before the peer dials: the oldest closed,
#     the peer gets in;
#   a hello like rank 0's whose job nonce differs in one 32-bit half or one
#     bit: refused, naming the nonce, and the job's results are correct;
#   a genuine hello whose MAC is made with a key one bit off, is the right
#     MAC with its last byte flipped, or is rank 1's own MAC echoed back:
#     refused at the MAC, and the job's results are correct.
. "$top_srcdir/tests/tap.sh"

PROBE="$top_builddir/tests/backends/tcp_probe"
PY="${PYTHON3:-python3}"
[ "$PY" = no ] && PY=python3
TMO=3 # the job's timeout (seconds)

# Nothing from an enclosing launcher may leak into the jobs started here.
for v in $(env | sed -n 's/^\(PMIX*_[A-Za-z0-9_]*\|SLURM_[A-Za-z0-9_]*\|OMPI_[A-Za-z0-9_]*\|HYDRA_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT FSDPC_JOB_ID \
    FSDPC_TCP_ALGO FSDPC_TCP_CHUNK_BYTES FSDPC_TCP_SMALL_BYTES FSDPC_TCP_DIRECT_MAX FSDPC_TCP_ADDR

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tcp-faults.XXXXXX")
cleanup() {
    for f in "$T"/pid.*; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$T"
}
trap cleanup EXIT

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start N ARGS...: ranks 0..N-1 in the background; pid in $T/pid.R, output
# in $T/rR.log. A watchdog kills the job after LIMIT seconds, so that a hang
# fails the test instead of stalling the suite.
LIMIT=60
start() {
    n=$1
    shift
    rm -f "$T"/r*.log "$T"/r*.rc "$T"/pid.* "$T"/ready.* "$T"/addr
    port=$(free_port)
    r=0
    pids=""
    while [ "$r" -lt "$n" ]; do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$PROBE" --timeout "$TMO" "$@" >"$T/r$r.log" 2>&1 &
        echo $! >"$T/pid.$r"
        pids="$pids $!"
        r=$((r + 1))
    done
    ( sleep $LIMIT; kill -9 $pids 2>/dev/null ) >/dev/null 2>&1 &
    watchdog=$!
}

# finish N: waits for ranks 0..N-1; exit status in $T/rR.rc.
finish() {
    r=0
    while [ "$r" -lt "$1" ]; do
        wait "$(cat "$T/pid.$r")" 2>/dev/null
        echo $? >"$T/r$r.rc"
        r=$((r + 1))
    done
    kill "$watchdog" 2>/dev/null
}

# wait_files SECONDS FILE...: 0 once all exist, 1 on timeout.
wait_files() {
    limit=$1
    shift
    i=0
    while [ "$i" -lt $((limit * 20)) ]; do
        all=1
        for f in "$@"; do [ -e "$f" ] || all=0; done
        [ "$all" = 1 ] && return 0
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}

now_ms() {
    "$PY" -c 'import time; print(int(time.monotonic() * 1000))'
}

show_logs() {
    for f in "$T"/r*.log; do
        tap_diag "$(basename "$f"): $(tail -n 3 "$f")"
    done
}

# results_ok ITERS COUNT: 0 when ranks 0 and 1 exited 0 with ITERS correct
# allreduces of COUNT floats.
results_ok() {
    for r in 0 1; do
        [ "$(cat "$T/r$r.rc")" = 0 ] &&
            grep -q "$1 allreduces of $2 floats correct" "$T/r$r.log" || return 1
    done
}

# ---------------------------------------------------------------------------
# baseline

start 3 --count 1000003 --iters 5
finish 3
ok=0
for r in 0 1 2; do
    [ "$(cat "$T/r$r.rc")" = 0 ] && grep -q "5 allreduces of 1000003 floats correct" "$T/r$r.log" || ok=1
done
[ "$ok" = 0 ] || show_logs
tap_ok $ok "3 ranks: 5 allreduces of 1000003 floats, correct"

# ---------------------------------------------------------------------------
# a lost rank: SIGKILL (connections reset) and SIGSTOP (silence)

# lose SIGNAL: runs 3 ranks in a loop, sends SIGNAL to rank 1 mid-loop, and
# checks how ranks 0 and 2 end.
lose() {
    sig=$1
    start 3 --count 4000000 --iters 0 --ready "$T/ready"
    if ! wait_files 30 "$T/ready.0" "$T/ready.1" "$T/ready.2"; then
        show_logs
        tap_ok 1 "SIG$sig: the job got going"
        return
    fi
    sleep 0.2
    t0=$(now_ms)
    kill -"$sig" "$(cat "$T/pid.1")"
    for r in 0 2; do
        wait "$(cat "$T/pid.$r")" 2>/dev/null
        echo $? >"$T/r$r.rc"
    done
    dt=$(($(now_ms) - t0))
    kill -9 "$(cat "$T/pid.1")" 2>/dev/null
    wait "$(cat "$T/pid.1")" 2>/dev/null
    kill "$watchdog" 2>/dev/null
    ok=0
    for r in 0 2; do
        rc=$(cat "$T/r$r.rc")
        if [ "$rc" = 0 ] || [ "$rc" = 137 ]; then
            tap_diag "rank $r exit status $rc"
            ok=1
        fi
    done
    tap_ok $ok "SIG$sig of rank 1: ranks 0 and 2 exit non-zero"
    ok=0
    [ "$dt" -lt $((2 * TMO * 1000)) ] || ok=1
    tap_diag "SIG$sig: the other ranks ended ${dt} ms after the signal (limit $((2 * TMO)) s)"
    tap_ok $ok "SIG$sig of rank 1: they exit within 2x the timeout"
    ok=0
    for r in 0 2; do
        grep -q "rank 1 (world rank 1, 127.0.0.1:" "$T/r$r.log" || ok=1
    done
    [ "$ok" = 0 ] || show_logs
    for r in 0 2; do tap_diag "rank $r: $(grep fsdpc: "$T/r$r.log" | head -n 1)"; done
    tap_ok $ok "SIG$sig of rank 1: their messages name rank 1 and its address"
}

lose KILL
lose STOP

# ---------------------------------------------------------------------------
# foreign clients during setup: rank 0 waits before it connects, rank 1
# publishes its listening address, and this script knocks first

start 2 --count 100000 --iters 3 --delay 1.5 --addr-file "$T/addr"
if wait_files 20 "$T/addr"; then
    "$PY" - "$(cat "$T/addr")" <<'EOF' >"$T/intruder.log" 2>&1
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
garbage = socket.create_connection((host, int(port)))
garbage.sendall(b"GET / HTTP/1.1\r\nHost: fsdpc\r\n\r\n" + bytes(range(256)) * 4)
silent = socket.create_connection((host, int(port)))
garbage.settimeout(10)
try:
    closed = garbage.recv(100) == b""
except ConnectionResetError:
    closed = True
print("garbage connection closed by the backend:", closed)
silent.settimeout(20)
try:
    data = silent.recv(100)
    print("silent connection closed by the backend:", data == b"")
except ConnectionResetError:
    print("silent connection closed by the backend: True")
EOF
fi
finish 2
ok=0
results_ok 3 100000 || ok=1
[ "$ok" = 0 ] || show_logs
tap_ok $ok "foreign clients during setup: the job runs and its results are correct"
grep -q "refused a connection from 127.0.0.1:[0-9]*: not an fsdpc tcp peer" "$T/r1.log"
st=$?
[ $st = 0 ] || { show_logs; tap_diag "$(cat "$T/intruder.log" 2>/dev/null)"; }
tap_ok $st "the garbage client is refused with a warning naming it"
grep -q "garbage connection closed by the backend: True" "$T/intruder.log" 2>/dev/null &&
    grep -q "silent connection closed by the backend: True" "$T/intruder.log" 2>/dev/null
st=$?
[ $st = 0 ] || tap_diag "$(cat "$T/intruder.log" 2>/dev/null)"
tap_ok $st "both foreign connections are closed by the backend"

# 60 idle connections to rank 1 before rank 0 dials (setup holds 32
# strangers): the oldest silent ones are closed, rank 0 still gets in.
# Rank 0 dials 4 s in: the 60 must all be open by then, also on a loaded
# machine (once setup ends, the listener is gone and a late one is refused);
# the job's timeout is longer here to cover that wait.
start 2 --count 1000 --iters 1 --delay 4 --timeout 12 --addr-file "$T/addr"
if wait_files 20 "$T/addr"; then
    "$PY" - "$(cat "$T/addr")" <<'EOF' >"$T/idle.log" 2>&1
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
idle = [socket.create_connection((host, int(port))) for _ in range(60)]
print("60 idle connections open", flush=True)
time.sleep(6)
for c in idle:
    c.close()
EOF
fi
finish 2
ok=0
results_ok 1 1000 || ok=1
grep -q "60 idle connections open" "$T/idle.log" 2>/dev/null || ok=1
[ "$ok" = 0 ] || { show_logs; tap_diag "$(cat "$T/idle.log" 2>/dev/null)"; }
tap_diag "rank 1: $(grep -c "refused a connection" "$T/r1.log") refusals logged; $(grep "in all" "$T/r1.log")"
tap_ok $ok "60 idle connections before the peer's: strangers closed, the job's results correct"

# ---------------------------------------------------------------------------
# near-miss nonces: before it dials, rank 0 knocks on rank 1 with the hello it
# would send, the nonce changed in one 32-bit half or one bit, so a check of
# part of the nonce is named by the half it ignores. One job per knock: a
# hello let in takes rank 0's place and ends that job.

# knock FLIP REASON DESCRIPTION: rank 0 must see the knock refused, rank 1
# must log REASON for it, and the job must then run correctly.
knock() {
    start 2 --count 1000 --iters 1 --knock "$1"
    finish 2
    ok=0
    grep -q "^rank 0: knock with nonce .*: refused$" "$T/r0.log" &&
        grep -q "refused a connection from 127.0.0.1:[0-9]*: $2" "$T/r1.log" || ok=1
    results_ok 1 1000 || ok=1
    [ "$ok" = 0 ] || show_logs
    tap_diag "$(grep "knock with" "$T/r0.log")"
    tap_ok $ok "$3"
}

# First the right nonce with one flaw that is checked after it: the knocks
# below differ from a genuine hello in their nonce alone.
knock 0 "hello claims rank 0 (world rank 99)" \
    "knock with the right nonce (world rank 99): past the nonce check, refused for its rank"
knock ffffffff00000000 "wrong job nonce" "knock whose nonce differs only in the high 32-bit half: refused"
knock 00000000ffffffff "wrong job nonce" "knock whose nonce differs only in the low 32-bit half: refused"
knock 8000000000000000 "wrong job nonce" "knock whose nonce differs only in bit 63: refused"
knock 0000000100000000 "wrong job nonce" "knock whose nonce differs only in bit 32: refused"
knock 0000000080000000 "wrong job nonce" "knock whose nonce differs only in bit 31: refused"
knock 0000000000000001 "wrong job nonce" "knock whose nonce differs only in bit 0: refused"

# The right nonce and a genuine hello, but no job key: whoever learnt the
# nonce (it is in the store) still cannot join without the secret.
knock_key() {
    start 2 --count 1000 --iters 1 --knock-key "$1"
    finish 2
    ok=0
    grep -q "^rank 0: knock with the right nonce and the job key off in bit $1: refused$" \
        "$T/r0.log" &&
        grep -q "refused a connection from 127.0.0.1:[0-9]*: authentication failed" "$T/r1.log" ||
        ok=1
    results_ok 1 1000 || ok=1
    [ "$ok" = 0 ] || show_logs
    tap_ok $ok "knock with a genuine hello but the job key off in bit $1: refused at the MAC"
}
knock_key 0
knock_key 255

# Near misses of the MAC itself: the right MAC with its last byte flipped
# (a comparison of fewer than 32 bytes lets it in), and rank 1's own MAC
# sent back (a dialer MAC made with the acceptor's label lets it in; the
# hello that carries it is public).
knock_mac() {
    start 2 --count 1000 --iters 1 --knock-mac "$1"
    finish 2
    ok=0
    grep -q "^rank 0: knock with the right nonce and $2: refused$" "$T/r0.log" &&
        grep -q "refused a connection from 127.0.0.1:[0-9]*: authentication failed" "$T/r1.log" ||
        ok=1
    results_ok 1 1000 || ok=1
    [ "$ok" = 0 ] || show_logs
    tap_diag "$(grep "knock with" "$T/r0.log")"
    tap_ok $ok "knock with a genuine hello and $2: refused at the MAC"
}
knock_mac last "the right MAC but its last byte flipped"
knock_mac echo "rank 1's own MAC echoed"

tap_done
