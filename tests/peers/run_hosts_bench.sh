#!/bin/sh
# run_hosts_bench.sh - the tcp backend between two hosts made with network
# namespaces on this machine (tests/hosts/hosts_lib.sh: a veth pair each,
# joined by a bridge), next to the physical limit of that path measured by
# iperf3 (Debian's iperf3) in the same run: one TCP stream each way, then
# both directions at once (what a 2-rank ring step does). Run by hand as
# root; not part of make check.
#
#   tests/peers/run_hosts_bench.sh BUILD_DIR [ROUNDS]
#
# Prints, per round, fsdpc-bench's allreduce table (2 ranks, 1 per host,
# no address variable set) and the iperf3 figures; the medians at the end.
set -u
BUILD=${1:?usage: run_hosts_bench.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-3}
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
PY=python3
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-hostsbench.XXXXXX")
tap_skip() { echo "skipped: $1" >&2; }
tap_done() { :; }
. "$top_srcdir/tests/hosts/hosts_lib.sh"
command -v iperf3 > /dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
hosts_up 2
(umask 077 && "$PY" -c 'import os; print(os.urandom(32).hex())' > "$T/secret")
host_run 1 iperf3 -s -D -1 > /dev/null 2>&1
r=1
while [ "$r" -le "$ROUNDS" ]; do
    port=$((29500 + r))
    for k in 0 1; do
        host_run $((k + 1)) env RANK=$k WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
            FSDPC_SECRET_FILE="$T/secret" OPENBLAS_NUM_THREADS=1 timeout 300 \
            "$BUILD/fsdpc-bench" --init env:// --backend tcp --op allreduce --min 1M --max 256M \
            --iters 5 --warmup 2 --stat median > "$T/bench.$r.$k.log" 2>&1 &
    done
    wait
    echo "== round $r: fsdpc-bench allreduce, 2 ranks on 2 hosts (tcp)"
    grep -E "^ +[0-9]" "$T/bench.$r.0.log"
    host_run 1 iperf3 -s -D -1 > /dev/null 2>&1
    sleep 0.3
    uni=$(host_run 2 iperf3 -c 10.77.0.1 -t 3 -f g 2> /dev/null | awk '/receiver/ {print $7}')
    host_run 1 iperf3 -s -D -1 > /dev/null 2>&1
    sleep 0.3
    bidir=$(host_run 2 iperf3 -c 10.77.0.1 -t 3 -f g --bidir 2> /dev/null |
        awk '/receiver/ {s += $7; n++} END {if (n) printf "%.2f", s / n}')
    echo "== round $r: iperf3 one stream $uni Gbit/s; both directions at once $bidir Gbit/s each"
    echo "$uni $bidir" >> "$T/iperf"
    r=$((r + 1))
done
echo "== medians over $ROUNDS rounds"
for f in "$T"/bench.*.0.log; do grep -E "^ +268435456 " "$f"; done |
    awk '{print $7}' | sort -n | awk '{a[NR] = $1} END {print "fsdpc allreduce 256 MiB busbw (out of place) GB/s:", a[int((NR + 1) / 2)]}'
sort -n -k1 "$T/iperf" | awk '{a[NR] = $1} END {print "iperf3 one stream Gbit/s:", a[int((NR + 1) / 2)]}'
sort -n -k2 "$T/iperf" | awk '{a[NR] = $2} END {print "iperf3 both directions, each, Gbit/s:", a[int((NR + 1) / 2)]}'
