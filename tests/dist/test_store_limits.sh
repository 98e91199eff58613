#!/bin/sh
# test_store_limits.sh - the store server's limits (store_tcp_server.c):
# 400 connections that never say hello do not exhaust it (past 64 silent
# ones from one address each new one closes that address's oldest, and a
# real client is served at once) and its log stays short; values still
# being received count against the table's limit; a client that
# has begun its hello outlives 400 silent connections from its own
# address, and a silent one 200 silent and 300 stalled hellos from another
# address; an authenticated client cannot grow it past its quota, and
# a value announced at 4 GiB is refused before anything is allocated (the
# server's resident set does not grow). Loopback only, bounded in time.
. "$top_srcdir/tests/tap.sh"

PROBE="$top_builddir/tests/dist/store_probe"
FLOOD="$top_srcdir/tests/dist/store_flood.py"
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-limits.XXXXXX")
trap 'kill $srv 2>/dev/null; rm -rf "$T"' EXIT

if [ ! -x "$PY" ]; then
    tap_skip_dep python3 "no $PY to drive raw connections"
    tap_done
    exit 0
fi

# serve SECONDS QUOTA_MB: a store in the background; its port in $port
serve() {
    rm -f "$T/srv.out" # the child truncates it only once it runs
    FSDPC_LOG=warn FSDPC_STORE_QUOTA_MB=$2 "$PROBE" --mode serve --timeout "$1" \
        > "$T/srv.out" 2> "$T/srv.err" &
    srv=$!
    i=0
    while [ $i -lt 200 ] && ! grep -q '^PORT' "$T/srv.out"; do sleep 0.1; i=$((i + 1)); done
    port=$(sed -n 's/^PORT //p' "$T/srv.out")
}

serve 8 256
[ -n "$port" ]
tap_ok $? "a store server on 127.0.0.1:${port:-?}"
ulimit -n 4096 2>/dev/null
out=$("$PY" "$FLOOD" "$port" flood 2>&1)
echo "$out" | grep -q "^flood: ok"
tap_ok $? "$out"
wait $srv
tap_ok $? "the server stops in order"
lines=$(grep -c "store server:" "$T/srv.err")
tap_diag "$(head -2 "$T/srv.err")"
tap_diag "$(tail -1 "$T/srv.err")"
[ "$lines" -le 20 ]
tap_ok $? "the server's log holds $lines warning lines for the flood (a burst, then one a second)"
grep -q "similar warnings held back" "$T/srv.err"
tap_ok $? "the lines held back are counted"

serve 8 256
out=$("$PY" "$FLOOD" "$port" evict 2>&1)
tap_diag "$out"
echo "$out" | grep -q "^begun hello: ok"
tap_ok $? "a client that has begun its hello logs in after a flood of silent connections from its own address"
echo "$out" | grep -q "^other source: ok"
tap_ok $? "a silent client logs in after a flood of silent connections from another address"
echo "$out" | grep -q "^stalled hellos: ok"
tap_ok $? "a silent client logs in after a flood of stalled hellos from another address"
wait $srv

serve 8 1
out=$("$PY" "$FLOOD" "$port" inflight 1 2>&1)
tap_diag "$out"
echo "$out" | grep -q "^inflight: ok"
tap_ok $? "values still being received count against the table's limit (4 quotas)"
wait $srv

serve 8 1
rss0=$(sed -n 's/^RSS-KB //p' "$T/srv.out" | tail -1)
out=$("$PY" "$FLOOD" "$port" quota 1 2>&1)
tap_diag "$out"
echo "$out" | grep -q "^quota: ok"
tap_ok $? "a client within its quota (1 MiB) is served, the value past it refused with a reason"
echo "$out" | grep -q "^announced: ok"
tap_ok $? "a value announced at 4 GiB is refused with a reason"
sleep 0.5
rss1=$(sed -n 's/^RSS-KB //p' "$T/srv.out" | tail -1)
tap_diag "server resident set: ${rss0:-?} KiB before, ${rss1:-?} KiB after"
[ -n "$rss0" ] && [ -n "$rss1" ] && [ "$rss1" -lt $((rss0 + 16384)) ]
tap_ok $? "nothing was allocated for the announced value (resident set grew less than 16 MiB)"
wait $srv
tap_done
