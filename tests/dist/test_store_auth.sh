#!/bin/sh
# test_store_auth.sh - the job secret and the authenticated handshake of the
# rendezvous store (doc/rendezvous.md, "Authentication"), attacked from
# outside the job on loopback, bounded in count and time:
#   - an outsider who knows the address and guesses WORLD_SIZE (1..64)
#     cannot log in to a job that has a secret (without one, on loopback, it
#     can: the control that shows the attack is real);
#   - a client that answers the challenge with a wrong MAC is refused, and
#     so are near misses: the right MAC with its last byte flipped, the
#     server's MAC echoed back;
#   - a server that cannot prove the secret is refused by the client, and so
#     is one that holds it but sends its MAC with the last byte flipped;
#   - ranks with different secrets fail at once, naming the secret;
#   - a secret file that others can read, a link, a short secret: refused;
#   - no secret on a non-loopback address (the one connected to, or the one
#     the store listens on): refused unless FSDPC_INSECURE=1;
#   - file:// keeps its secret in a 0600 stamp inside 0700 directories and
#     refuses a store directory others can write.
. "$top_srcdir/tests/dist/store_lib.sh"
WIRE="$top_srcdir/tests/dist"

secret_file() { # secret_file PATH: a fresh 0600 secret
    (umask 077 && "$PY" -c 'import os; print(os.urandom(32).hex())' >"$1")
}
secret_file "$T/secret"

wait_listening() { # wait_listening LOG: until a fake server logs "listening" (10 s)
    for i in $(seq 100); do grep -q listening "$1" 2>/dev/null && break; sleep 0.1; done
}

# attack PORT WORLD_MAX LOG: an outsider tries every WORLD_SIZE with the key
# a secret-less job would have, sending its MAC whatever the server proves;
# prints "in WORLD" for every login and the nonce it could then read.
attack() {
    "$PY" - "$1" "$2" "$WIRE" >"$3" 2>&1 <<'PYEOF'
import socket, sys
port, wmax = int(sys.argv[1]), int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
import store_wire as w
ins = refused = 0
for world in range(1, wmax + 1):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = w.public_env_key("127.0.0.1", port, world)
    ok, why = w.handshake(s, key, verify_server=False)
    if ok:
        ins += 1
        t, _, body = w.get(s, b"fsdpc/nonce", 2000)
        print("in %d: read fsdpc/nonce (%d bytes)" % (world, len(body)) if t == w.R_VALUE
              else "in %d: no nonce (%r)" % (world, t))
    elif "authentication failed" in why:
        refused += 1
    else:
        print("world %d: %s" % (world, why))
    s.close()
print("attempts %d, logged in %d, refused %d" % (wmax, ins, refused), flush=True)
PYEOF
}

# 1. A 2-rank job with a secret: rank 0 waits for rank 1 while the outsider
#    tries all 64 sizes; then rank 1 joins and the job passes every check.
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret"
( RANK=0 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// >"$T/r0.log" 2>&1; echo $? >"$T/r0.rc" ) &
p0=$!
bg_pids=$p0
for i in $(seq 100); do
    "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)))" && break
    sleep 0.1
done
attack "$port" 64 "$T/attack.log"
( RANK=1 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// >"$T/r1.log" 2>&1; echo $? >"$T/r1.rc" )
wait $p0
tap_diag "$(cat "$T/attack.log")"
grep -q "^attempts 64, logged in 0, refused 64$" "$T/attack.log"
tap_ok $? "with a secret: an outsider guessing WORLD_SIZE 1..64 is refused all 64 times"
job_failed 2
tap_ok $? "with a secret: the job itself passes every store check meanwhile"
[ "$(grep -c "refused connection from 127.0.0.1:[0-9]*: authentication failed" "$T/r0.log")" -ge 8 ]
tap_ok $? "the store server logs the refusals (rate-limited)"
unset FSDPC_SECRET_FILE

# 2. A job without a secret on loopback (every rank on this host) takes the
#    user's per-user secret ($XDG_RUNTIME_DIR/fsdpc/secret, made on first
#    use): the outsider with the public keys is refused. The control: with
#    FSDPC_INSECURE=1 the job is keyed by public values, and the same
#    outsider gets in with WORLD_SIZE=2 and reads the job nonce, as the
#    attack in the threat model says.
# held_job LOG [VAR=VALUE...]: a 2-rank job without a secret, holding; the
# outsider's attempts in LOG.
held_job() {
    log=$1
    shift
    port=$(free_port)
    export MASTER_PORT=$port
    ( env "$@" RANK=0 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// --mode hold >"$T/c0.log" 2>&1 ) &
    p0=$!
    bg_pids=$p0
    for i in $(seq 100); do grep -q HOLDING "$T/c0.log" 2>/dev/null && break; sleep 0.1; done
    ( env "$@" RANK=1 WORLD_SIZE=2 timeout 60 "$PROBE" --init env:// --mode hold >"$T/c1.log" 2>&1 ) &
    p1=$!
    bg_pids="$p0 $p1"
    for i in $(seq 100); do grep -q HOLDING "$T/c1.log" 2>/dev/null && break; sleep 0.1; done
    attack "$port" 4 "$log"
    kill -9 $p0 $p1 2>/dev/null
    tap_diag "$(cat "$log")"
}
export XDG_RUNTIME_DIR="$T/run"
mkdir -m 700 "$XDG_RUNTIME_DIR"
held_job "$T/local.log"
grep -q "^attempts 4, logged in 0, refused 4$" "$T/local.log" && grep -q HOLDING "$T/c1.log"
tap_ok $? "without a secret (loopback): the job runs on the per-user secret, the outsider with the public keys is refused"
[ "$(stat -c %a "$T/run/fsdpc") $(stat -c %a "$T/run/fsdpc/secret")" = "700 600" ] &&
    [ "$(wc -c <"$T/run/fsdpc/secret")" -eq 65 ]
tap_ok $? "the per-user secret: 32 random bytes (hex) in a 0600 file in a 0700 directory"
held_job "$T/control.log" FSDPC_INSECURE=1
grep -q "^in 2: read fsdpc/nonce (8 bytes)" "$T/control.log"
tap_ok $? "with FSDPC_INSECURE=1 (loopback): the same outsider gets in with WORLD_SIZE=2 (the exposure the secret closes)"
port=$(free_port)
chmod 755 "$T/run/fsdpc"
expect_fail "a per-user secret directory others can enter is refused" \
    "per-user secret: $T/run/fsdpc is another user's or open to others" 5 \
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port -- --init env:// --mode init
chmod 700 "$T/run/fsdpc"
if [ "$(id -u)" -eq 0 ]; then
    chown 65534 "$T/run/fsdpc/secret"
    expect_fail "a per-user secret file of another user is refused" \
        "per-user secret $T/run/fsdpc/secret: owned by uid 65534" 5 \
        RANK=0 WORLD_SIZE=2 MASTER_PORT=$port -- --init env:// --mode init
else
    tap_skip "needs root to give the file to another user"
fi
unset XDG_RUNTIME_DIR

# fake_store PORT random|near|exact: a store on PORT for one client that
# answers its hello with a random challenge and MAC (it cannot prove the
# secret), or, holding the key, with the right MAC with its last byte
# flipped, or the exact MAC; logs whether the client then sent its AUTH.
fake_store() {
    "$PY" - "$1" "$WIRE" "$T/secret" "$2" >"$T/fake.log" 2>&1 <<'PYEOF' &
import os, socket, sys
sys.path.insert(0, sys.argv[2])
import store_wire as w
port = int(sys.argv[1])
key = w.derive(open(sys.argv[3], "rb").read().rstrip(b"\n"), "fsdpc store|127.0.0.1|%d|2|" % port)
c = w.accept_one(port)
t, _, body = w.recv_reply(c)
cchal, schal = body[-16:], os.urandom(16)
m = w.mac(key, w.LABEL_SERVER, cchal, schal)
m = {"random": os.urandom(32), "near": w.near_miss(m), "exact": m}[sys.argv[4]]
c.sendall(w.hdr(w.R_CHALLENGE, 0, 0, 48) + schal + m)
t, _, _ = w.recv_reply(c)
print("the client sent %s after the challenge" % ("AUTH" if t == w.AUTH else "nothing"), flush=True)
PYEOF
    fake=$!
    bg_pids=$fake
    wait_listening "$T/fake.log"
}

# client_refuses MODE DESCRIPTION: a rank meets fake_store MODE; it must
# fail at once, naming the proof (one test line), and send no MAC (0).
client_refuses() {
    port=$(free_port)
    fake_store "$port" "$1"
    expect_fail "$2" "failed to prove that it holds this job's secret" 5 \
        RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" -- --init env:// \
        --mode init
    wait $fake
    grep -q "the client sent nothing after the challenge" "$T/fake.log"
}

# 3. A server that cannot prove the secret: the client refuses it at once.
client_refuses random "a store that cannot prove the secret: the client refuses it"
tap_ok $? "the client sends no MAC to a server that failed to prove the secret"

# 3b. Near misses: MACs that are right but for their last byte, or that
#     echo the other side's MAC. A comparison of fewer than 32 bytes, or a
#     client MAC made with the server's label, lets these in; the exact MAC
#     is the control that the key itself is right.
FSDPC_LOG=warn "$PROBE" --mode serve --timeout 10 >"$T/serve.out" 2>"$T/serve.err" &
srv=$!
bg_pids=$srv
for i in $(seq 50); do grep -q '^PORT' "$T/serve.out" 2>/dev/null && break; sleep 0.1; done
sport=$(sed -n 's/^PORT //p' "$T/serve.out")
"$PY" - "${sport:-0}" "$WIRE" >"$T/near.log" 2>&1 <<'PYEOF'
import socket, sys
sys.path.insert(0, sys.argv[2])
import store_wire as w
for near in ("last", "echo", None):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    ok, why = w.handshake(s, w.probe_key(), near=near)
    print("%s: %s" % (near or "exact", "in" if ok else why), flush=True)
    s.close()
PYEOF
kill $srv 2>/dev/null
tap_diag "$(cat "$T/near.log")"
grep -q "^last: refused: authentication failed" "$T/near.log"
tap_ok $? "store: the right client MAC with its last byte flipped is refused"
grep -q "^echo: refused: authentication failed" "$T/near.log"
tap_ok $? "store: the server's own MAC echoed back as the client's is refused"
grep -q "^exact: in$" "$T/near.log"
tap_ok $? "store: the exact MAC with the same key gets in (the control)"

# A fake store that holds the key but sends its MAC with the last byte
# flipped: the client refuses it and sends no MAC. (With the exact MAC, the
# control, the same fake store gets the client's AUTH.)
client_refuses near "a store whose MAC is right but for its last byte: the client refuses it"
tap_ok $? "the client sends no MAC to a store whose MAC is one byte off"
port=$(free_port)
fake_store "$port" exact
RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" timeout 30 "$PROBE" \
    --init env:// --timeout 3 --mode init >/dev/null 2>&1
wait $fake
grep -q "the client sent AUTH after the challenge" "$T/fake.log"
tap_ok $? "the control: the same fake store with the exact MAC gets the client's AUTH"

# 3c. What a fake store says before it proves anything is read with care:
#     a reply announcing a 4 GiB value (64 MiB of it sent) is refused on its
#     header, nothing allocated (the client's peak resident set, from the
#     rusage of the children its launcher waited for, which holds however
#     soon the client leaves); an error text full of terminal escapes is
#     printed as plain text.
rude_store() { # rude_store PORT big|escape
    "$PY" - "$1" "$WIRE" "$2" >"$T/rude.log" 2>&1 <<'PYEOF' &
import socket, sys
sys.path.insert(0, sys.argv[2])
import store_wire as w
c = w.accept_one(int(sys.argv[1]))
t, _, body = w.recv_reply(c)
if sys.argv[3] == "escape":
    msg = b"\x1b[2J\x1b]0;owned\x07\x1b[31mred\rhidden\x9b1m"
    c.sendall(w.hdr(w.R_ERR, -1, 0, len(msg)) + msg)
else:
    c.sendall(w.hdr(w.R_ERR, -1, 0, (4 << 30) - 1))
    try:
        for _ in range(64):
            c.sendall(b"x" * (1 << 20))
    except OSError:
        pass
c.close()
PYEOF
    fake=$!
    bg_pids=$fake
    wait_listening "$T/rude.log"
}
port=$(free_port)
rude_store "$port" big
RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" "$PY" -c '
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
print("client peak resident set: %d KiB" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
' timeout 30 "$PROBE" --init env:// --timeout 20 --mode init >"$T/big.peak" 2>"$T/big.err"
wait $fake
kib=$(sed -n 's/^client peak resident set: \([0-9]*\) KiB$/\1/p' "$T/big.peak")
tap_diag "$(cat "$T/big.peak")"
[ -n "$kib" ] && [ "$kib" -lt 32768 ]
tap_ok $? "a fake store's reply announcing 4 GiB is refused on its header (client peak ${kib:-?} KiB)"
port=$(free_port)
rude_store "$port" escape
RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" timeout 30 "$PROBE" \
    --init env:// --timeout 3 --mode init >/dev/null 2>"$T/esc.err"
wait $fake
tap_diag "$(cat -v "$T/esc.err")"
esc=$(printf '\033')
! grep -q "$esc" "$T/esc.err" && ! grep -q "$(printf '\r')" "$T/esc.err" &&
    grep -q "refused this process: ?\[2J?\]0;owned??\[31mred?hidden?1m" "$T/esc.err"
tap_ok $? "a fake store's error text is printed without its terminal escapes"

# 4. Ranks with different secrets: the one that joins second fails at once.
port=$(free_port)
secret_file "$T/other"
( RANK=0 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" timeout 60 "$PROBE" \
    --init env:// --timeout 4 --mode init >"$T/d0.log" 2>&1 ) &
p0=$!
bg_pids=$p0
for i in $(seq 100); do
    "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)))" && break
    sleep 0.1
done
expect_fail "ranks given different secrets: the second one fails at once, naming the secret" \
    "different secrets (FSDPC_SECRET / FSDPC_SECRET_FILE)" 5 \
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/other" -- --init env:// --mode init
kill -9 $p0 2>/dev/null

# 5. Secrets that must not be used.
port=$(free_port)
cp "$T/secret" "$T/open"; chmod 644 "$T/open"
expect_fail "a secret file others can read" "mode 0644 lets group or others read" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/open" -- --init env:// --mode init
ln -s "$T/secret" "$T/link"
expect_fail "a secret file given as a symbolic link" "is a symbolic link" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/link" -- --init env:// --mode init
(umask 077 && echo short >"$T/short")
expect_fail "a secret of 5 bytes" "6 bytes (a secret has 16 to" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET_FILE="$T/short" -- --init env:// --mode init
expect_fail "FSDPC_SECRET shorter than 16 characters" "FSDPC_SECRET has 6 characters" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET=abcdef -- --init env:// --mode init
expect_fail "both FSDPC_SECRET and FSDPC_SECRET_FILE" "both FSDPC_SECRET and FSDPC_SECRET_FILE" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET=0123456789abcdef0123 \
    FSDPC_SECRET_FILE="$T/secret" -- --init env:// --mode init
expect_fail "an empty FSDPC_SECRET_FILE is an error, not 'no secret'" \
    "FSDPC_SECRET_FILE is set but empty" 5 \
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port FSDPC_SECRET_FILE= -- --init env:// --mode init
expect_fail "a directory as the secret file" "not a regular file" 5 \
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port FSDPC_SECRET_FILE="$T" -- --init env:// --mode init

# 6. No secret on an address that is not loopback: refused before anything
#    listens, unless the user says --insecure (FSDPC_INSECURE=1).
expect_fail "no secret on a non-loopback MASTER_ADDR" \
    "is not a loopback address and no job secret is set" 5 \
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=192.0.2.1 MASTER_PORT=$port -- --init env:// --mode init
expect_fail "no secret on a non-loopback tcp:// address" \
    "is not a loopback address and no job secret is set" 5 \
    RANK=1 WORLD_SIZE=2 -- --init tcp://192.0.2.1:$port --mode init
# The address that counts is the one the store listens on: loopback
# MASTER_ADDR with FSDPC_STORE_BIND on every interface is refused too, and
# nothing listens on the port meanwhile.
for any in 0.0.0.0 ::; do
    expect_fail "no secret, MASTER_ADDR=127.0.0.1 but FSDPC_STORE_BIND=$any" \
        "listening address (FSDPC_STORE_BIND) $any is not a loopback address and no job secret" 5 \
        RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FSDPC_STORE_BIND=$any \
        -- --init env:// --mode init
done
# (a port picked free may be taken by another test's socket before the bind
# on every interface; then another port, up to 5 tries)
for try in 1 2 3 4 5; do
    port=$(free_port)
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FSDPC_STORE_BIND=0.0.0.0 \
        FSDPC_SECRET_FILE="$T/secret" timeout 30 "$PROBE" --init env:// --mode init \
        >"$T/bind.out" 2>"$T/bind.err"
    rc=$?
    [ $rc -eq 0 ] || grep -qi "in use" "$T/bind.err" || break
    [ $rc -eq 0 ] && break
done
[ $rc -eq 0 ] || tap_diag "$(cat "$T/bind.err")"
tap_ok $rc "with a secret, FSDPC_STORE_BIND=0.0.0.0 runs"
ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep '\.' | head -1)
if [ -n "$ip" ]; then
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=$ip MASTER_PORT=$port FSDPC_INSECURE=1 timeout 30 "$PROBE" \
        --init env:// --mode init >"$T/ins.out" 2>"$T/ins.err"
    rc=$?
    [ $rc -eq 0 ] && grep -q "no job secret (--insecure)" "$T/ins.err"
    tap_ok $? "FSDPC_INSECURE=1 on $ip: runs, with a warning (exit $rc)"
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=$ip MASTER_PORT=$port FSDPC_SECRET_FILE="$T/secret" \
        timeout 30 "$PROBE" --init env:// --mode init >"$T/sec.out" 2>"$T/sec.err"
    tap_ok $? "a secret on $ip: runs"
else
    tap_skip "no non-loopback IPv4 address on this host"
    tap_skip "no non-loopback IPv4 address on this host"
fi

# 7. file://: the secret lives in a 0600 stamp in 0700 directories.
unset MASTER_ADDR MASTER_PORT
store="$T/fstore"
( RANK=0 WORLD_SIZE=1 timeout 60 "$PROBE" --init "file://$store" --mode hold >"$T/f0.log" 2>&1 ) &
p0=$!
bg_pids=$p0
for i in $(seq 100); do grep -q HOLDING "$T/f0.log" 2>/dev/null && break; sleep 0.1; done
modes="$(stat -c %a "$store") $(stat -c %a "$store/fsdpc-store.stamp") $(stat -c %a "$store"/job-*)"
keys=$(find "$store" -type f ! -perm 600 | wc -l)
kill -9 $p0 2>/dev/null
tap_diag "store dir, stamp, namespace: $modes; files not 0600: $keys"
[ "$modes" = "700 600 700" ] && [ "$keys" -eq 0 ] && grep -q "^secret [0-9a-f]\{64\}$" "$store/fsdpc-store.stamp"
tap_ok $? "file://: store directory 0700, stamp (with the secret) 0600, namespace 0700, every file 0600"
mkdir -m 777 "$T/open-store"
chmod 777 "$T/open-store"
expect_fail "file:// on a directory others can write" "writable by group or others (mode 0777)" 5 \
    RANK=0 WORLD_SIZE=1 -- --init "file://$T/open-store" --mode init

tap_done
