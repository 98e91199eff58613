#!/bin/sh
# test_store_bad.sh - bad --init strings, launcher variables and addresses:
# each must end the process quickly with one clear line naming the problem,
# never a hang or a crash. Then keys that miss the store's by one bit or
# come from a secret one character off: each must be refused.
. "$top_srcdir/tests/dist/store_lib.sh"

expect_fail "unknown init method" "--init 'bogus://x': unknown method" 5 \
    -- --init bogus://x --mode init
expect_fail "tcp:// without a port" "expected tcp://HOST:PORT" 5 \
    -- --init tcp://localhost --mode init
expect_fail "tcp:// with a bad port" "port '99999' is not a number in 1..65535" 5 \
    RANK=0 WORLD_SIZE=1 -- --init tcp://localhost:99999 --mode init
expect_fail "file:// with a relative path" "expected file:///ABSOLUTE/PATH" 5 \
    -- --init file://relative/dir --mode init
expect_fail "RANK not below WORLD_SIZE" "RANK=5 is not below WORLD_SIZE=2" 5 \
    RANK=5 WORLD_SIZE=2 MASTER_PORT=29999 -- --init env:// --mode init
expect_fail "RANK not a number" "RANK='abc' is not an integer" 5 \
    RANK=abc WORLD_SIZE=2 MASTER_PORT=29999 -- --init env:// --mode init
expect_fail "WORLD_SIZE of zero" "WORLD_SIZE=0 is out of range" 5 \
    RANK=0 WORLD_SIZE=0 MASTER_PORT=29999 -- --init env:// --mode init
expect_fail "WORLD_SIZE missing" "RANK is set but WORLD_SIZE is not" 5 \
    RANK=0 -- --init env:// --mode init
expect_fail "env:// without any rank variables" "needs RANK and WORLD_SIZE" 5 \
    -- --init env:// --mode init
expect_fail "MASTER_PORT missing" "MASTER_PORT is not set" 5 \
    RANK=1 WORLD_SIZE=2 -- --init env:// --mode init
expect_fail "SLURM_PROCID beyond SLURM_NTASKS" "SLURM_PROCID=4 is not below SLURM_NTASKS=4" 5 \
    SLURM_PROCID=4 SLURM_NTASKS=4 -- --init env:// --mode init
expect_fail "LOCAL_RANK not a number" "LOCAL_RANK='x' is not an integer" 5 \
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=x -- --init env:// --mode init

# Nobody serves the store: the wait ends at the timeout, naming host:port.
port=$(free_port)
expect_fail "unreachable MASTER_ADDR:MASTER_PORT" \
    "cannot reach the store at 127.0.0.1:$port within 2" 6 \
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- \
    --init env:// --timeout 2 --mode init

# The port belongs to another job's store: refused at once, not a timeout.
port=$(free_port)
( RANK=0 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_JOB_ID=job-a timeout 60 "$PROBE" --init env:// \
    --timeout 20 --mode init >"$T/a.log" 2>&1 ) &
other=$!
bg_pids="$other"
for i in $(seq 100); do
    "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)))" && break
    sleep 0.1
done
expect_fail "a store of another job on MASTER_PORT" "failed to prove that it holds this job's secret" 5 \
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_JOB_ID=job-b -- --init env:// --mode init
kill -9 "$other" 2>/dev/null

# Same address, same size, no job id: the hello cannot tell the jobs apart,
# the count of joined ranks can.
port=$(free_port)
pids=""
for r in 0 1; do
    ( RANK=$r WORLD_SIZE=2 MASTER_PORT=$port timeout 60 "$PROBE" --init env:// --mode hold \
        >"$T/first$r.log" 2>&1 ) &
    pids="$pids $!"
done
bg_pids="$pids"
for i in $(seq 100); do
    [ "$(cat "$T"/first*.log 2>/dev/null | grep -c HOLDING)" -eq 2 ] && break
    sleep 0.1
done
expect_fail "a second job on the same MASTER_PORT" "another job uses this address" 5 \
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port -- --init env:// --mode init
# the store listens on MASTER_ADDR (127.0.0.1 by default), not on every
# interface: /proc/net/tcp lists the listening socket (state 0A) by address
hexport=$(printf '%04X' "$port")
listen=$(awk -v p=":$hexport" '$4 == "0A" && $2 ~ p"$" { print $2 }' /proc/net/tcp /proc/net/tcp6 \
    2>/dev/null | head -1)
tap_diag "store on port $port listens on ${listen:-?} (hex address:port)"
[ "$listen" = "0100007F:$hexport" ]
tap_ok $? "the env:// store binds to MASTER_ADDR 127.0.0.1, not to every interface"
kill -9 $pids 2>/dev/null

# Clients whose key differs from the server's in one bit, or comes from a
# secret one character off, connect to a store the probe serves itself:
# each is its own line, so a handshake that ignores part of the key is
# named by the bit it ignores.
timeout 60 "$PROBE" --mode key --timeout 5 >"$T/key.log" 2>"$T/key.err"
rc=$?
while IFS= read -r line; do
    case $line in
    "PASS "*) tap_ok 0 "store key: ${line#PASS }" ;;
    "FAIL "*) tap_ok 1 "store key: ${line#FAIL }" ;;
    esac
done <"$T/key.log"
[ "$(grep -c '^PASS client with a wrong key .* refused' "$T/key.log")" -eq 5 ] && [ "$rc" -eq 0 ]
st=$?
[ $st -eq 0 ] || tap_diag "$(cat "$T/key.log" "$T/key.err")"
tap_ok $st "store key: all 5 near-miss keys refused, probe exit $rc"

tap_done
