#!/bin/sh
# test_store_env.sh - the TCP store through env:// and tcp://: four plain
# processes (no MPI launcher) exercise set/get/wait/add/check, prefixes,
# barriers, timeouts and a 64 MiB value; a foreign client that sends garbage
# or a wrong MAC is refused while the job carries on; rank 0 starting
# late, a store server that stops while a client is still connected.
. "$top_srcdir/tests/dist/store_lib.sh"

# 1. env:// with 4 ranks, while foreign clients knock on the store's port.
#    Rank 0 starts first and waits for the others; the intruders come in
#    between, and one idle connection stays open through the whole job.
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
( RANK=0 WORLD_SIZE=4 timeout 60 "$PROBE" --init env:// --big 67108864 >"$T/r0.log" 2>&1
  echo $? >"$T/r0.rc" ) &
p0=$!
"$PY" - "$port" "$top_srcdir/tests/dist" >"$T/intruder.log" 2>&1 <<'PYEOF' &
import socket, struct, sys, time
port = int(sys.argv[1])
sys.path.insert(0, sys.argv[2])
import store_wire
def closed(sock):
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
def connect():
    for _ in range(200):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            time.sleep(0.05)
    sys.exit("store never listened")
idle = connect()                      # says nothing at all, stays open
g = connect()                         # garbage
g.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)))
print("garbage: closed by server" if closed(g) else "garbage: got an answer")
w = connect()                         # a well-formed hello, then a wrong MAC
ok, why = store_wire.handshake(w, bytes(32), wrong_mac=True)
print("wrong mac: refused" if not ok and "authentication failed" in why else "wrong mac: %s" % why)
print("wrong mac: closed by server" if closed(w) else "wrong mac: still open")
print("intruders done", flush=True)
time.sleep(30)
PYEOF
intruder=$!
bg_pids="$p0 $intruder"
for i in $(seq 100); do grep -q "intruders done" "$T/intruder.log" 2>/dev/null && break; sleep 0.1; done
pids=""
for r in 1 2 3; do
    ( RANK=$r WORLD_SIZE=4 timeout 60 "$PROBE" --init env:// --big 67108864 >"$T/r$r.log" 2>&1
      echo $? >"$T/r$r.rc" ) &
    pids="$pids $!"
done
for p in $p0 $pids; do wait "$p"; done
kill "$intruder" 2>/dev/null
job_failed 4
tap_ok $? "env://: 4 ranks pass set/get/wait/add/check, prefixes, barriers, timeouts, 64 MiB value"
tap_diag "$(cat "$T/intruder.log")"
grep -q "garbage: closed by server" "$T/intruder.log"
tap_ok $? "garbage sent to the store port: connection closed"
grep -q "wrong mac: refused" "$T/intruder.log" && grep -q "wrong mac: closed by server" "$T/intruder.log"
tap_ok $? "a client that answers the challenge with a wrong MAC: refused with a reason, then closed"
grep -q "refused connection from 127.0.0.1:[0-9]*: not an fsdpc store client" "$T/r0.log" &&
    grep -q "refused connection from 127.0.0.1:[0-9]*: authentication failed" "$T/r0.log"
tap_ok $? "the store server logs a warning for each refused connection"
grep -q "counter sums every rank's adds (2000, want 2000)" "$T/r1.log"
tap_ok $? "concurrent adds from 4 ranks (200 x rank+1 each) sum to 2000"
grep -q "get of a missing key times out after 0\.[4-9][0-9] s and names it" "$T/r2.log"
tap_ok $? "get timeout reports the key"
"$PY" -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1', $port)) != 0 else 1)"
tap_ok $? "the store port is closed after the job"

# 2. tcp://HOST:PORT, rank 0 starting late: the others retry until it is up.
unset MASTER_ADDR MASTER_PORT
port=$(free_port)
pids=""
for r in 1 2; do
    ( RANK=$r WORLD_SIZE=3 timeout 60 "$PROBE" --init "tcp://127.0.0.1:$port" >"$T/r$r.log" 2>&1
      echo $? >"$T/r$r.rc" ) &
    pids="$pids $!"
done
sleep 1.5
( RANK=0 WORLD_SIZE=3 timeout 60 "$PROBE" --init "tcp://127.0.0.1:$port" >"$T/r0.log" 2>&1
  echo $? >"$T/r0.rc" ) &
for p in $pids $!; do wait "$p"; done
job_failed 3
tap_ok $? "tcp://127.0.0.1:PORT: 3 ranks pass, rank 0 started 1.5 s after the others"
grep -q "method tcp://" "$T/r1.log"
tap_ok $? "tcp:// reported as the init method"

# 3. A peer that never reaches finalize: rank 0 still ends, within the
#    finalize timeout, though that client stays connected to its server.
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FSDPC_FINALIZE_TIMEOUT=2
( RANK=1 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// --mode hold >"$T/r1.log" 2>&1 ) &
holder=$!
bg_pids="$bg_pids $holder"
start=$(date +%s)
RANK=0 WORLD_SIZE=2 timeout 30 "$PROBE" --init env:// --mode init >"$T/r0.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
kill -9 "$holder" 2>/dev/null
[ "$rc" -eq 0 ] && [ "$took" -le 10 ]
tap_ok $? "rank 0 finalizes in ${took} s while a peer hangs (rc $rc)"
grep -q "finalize without all ranks: store barrier 'fsdpc/finalize': 1 of 2 ranks arrived" "$T/r0.log"
tap_ok $? "finalize warns how many ranks arrived"
tap_diag "$(grep -v PASS "$T/r0.log")"
unset FSDPC_FINALIZE_TIMEOUT

tap_done
