#!/bin/sh
# test_hosts.sh - jobs that span hosts, on two hosts made on this machine
# with network namespaces (tests/hosts/hosts_lib.sh): no address variable
# is set anywhere; every rank must find the address that reaches the store
# and its own neighbours by itself.
#   - env:// 2 ranks (1 per host) and tcp:// 4 ranks (2 per host) train
#     equal to one rank (rel 1e-5, compare_models.py); env:// over IPv6 too
#   - --init mpi, HSDP with rdp across the hosts and dp inside each, mixed
#     backends (dp=mpi, rdp=tcp), equal to one rank
#   - each rank names the address and interface it chose, and counts only
#     the ranks of its own host as local
#   - killing a host's ranks mid-run ends the other host's rank, naming it
#   - fsdpc-bench allreduce across the hosts
#   - the store listens only on MASTER_ADDR: a second address of the same
#     host refuses connections from the other host
# Skips (with the reason) where namespaces cannot be made (not root).
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-hosts.XXXXXX")
. "$top_srcdir/tests/hosts/hosts_lib.sh"
for v in $(env | sed -n 's/^\(PMIX*_[A-Za-z0-9_]*\|SLURM_[A-Za-z0-9_]*\|OMPI_[A-Za-z0-9_]*\|HYDRA_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT FSDPC_TCP_ADDR \
    FSDPC_SOCKET_IFNAME FSDPC_STORE_HOST FSDPC_SECRET FSDPC_SECRET_FILE FSDPC_INSECURE FSDPC_JOB_ID
export FSDPC_LOG=info FSDPC_LOG_RANKS=all

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi
hosts_up 2

sh "$top_srcdir/tests/corpus.sh" 60000 > "$T/text"
"$BIN/fsdpc-data" tokenize "$T/text" -o "$T/tok.bin" > "$T/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 256 --context 32 --seed 5 \
        -o "$T/model.h5" > "$T/log" 2>&1
tap_ok $? "model and token file"
(umask 077 && "$PY" -c 'import os; print(os.urandom(32).hex())' > "$T/secret")

COMMON="--model $T/model.h5 --data $T/tok.bin --seq-len 16 --steps 8 --lr 3e-3 --warmup 2
--batch-size 2 --log-every 1 --timeout 30 --peak-flops 1e11"
# the reference: one rank, global batch 4 (= 2 per rank x 2 ranks... so
# every run below keeps 4 sequences per step)
# shellcheck disable=SC2086
"$BIN/fsdpc-train" $COMMON --batch-size 4 --metrics "$T/ref.jsonl" --out "$T/ref.h5" \
    > "$T/ref.log" 2>&1
tap_ok $? "one-rank reference run"

# same NAME DESCRIPTION: NAME's losses and model equal the reference's
same() {
    out=$("$PY" "$CMP" losses "$T/$1.jsonl" "$T/ref.jsonl" --tol 1e-5 2>&1) &&
        out="$out
$("$PY" "$CMP" models "$T/$1.h5" "$T/ref.h5" --tol 1e-5 2>&1)"
    rc=$?
    tap_diag "$out"
    tap_ok $rc "$2"
}

# env_job NAME N_PER_HOST INIT BATCH EXTRA...: ranks 0..N-1 on host 1, the
# next N on host 2, plain processes (no launcher); waits for all.
env_job() {
    ej_name=$1 ej_n=$2 ej_init=$3 ej_b=$4
    shift 4
    ej_world=$((2 * ej_n))
    ej_pids=""
    r=0
    while [ $r -lt $ej_world ]; do
        h=$((r / ej_n + 1))
        # shellcheck disable=SC2086
        ( host_run "$h" env RANK=$r WORLD_SIZE=$ej_world MASTER_ADDR="${MASTER:-10.77.0.1}" \
            MASTER_PORT=29411 FSDPC_SECRET_FILE="$T/secret" \
            timeout 90 "$BIN/fsdpc-train" --init "$ej_init" $COMMON --batch-size "$ej_b" \
            --metrics "$T/$ej_name.jsonl" --out "$T/$ej_name.h5" "$@" \
            > "$T/$ej_name.$r.log" 2>&1
          echo $? > "$T/$ej_name.$r.rc" ) &
        ej_pids="$ej_pids $!"
        r=$((r + 1))
    done
    # shellcheck disable=SC2086
    wait $ej_pids
    ej_bad=0
    r=0
    while [ $r -lt $ej_world ]; do
        if [ "$(cat "$T/$ej_name.$r.rc")" != 0 ]; then
            ej_bad=1
            tap_diag "rank $r: $(tail -3 "$T/$ej_name.$r.log")"
        fi
        r=$((r + 1))
    done
    return $ej_bad
}

# 1. env://, one rank per host
env_job env2 1 env:// 2 --backend tcp
tap_ok $? "env://: 2 ranks on 2 hosts train with no address variable set"
same env2 "env://: 2 ranks on 2 hosts equal one rank"
grep -q "rank 1 of 2 (local 0 of 1) on fsdpc-host2.*address 10.77.0.2 on eth0 (route to 10.77.0.1)" \
    "$T/env2.1.log"
st=$?
[ $st = 0 ] || tap_diag "$(grep "rank 1 of 2" "$T/env2.1.log")"
tap_ok $st "rank 1 says it is local 0 of 1 on its host and names 10.77.0.2 on eth0, the route to the store"

# 1b. the same over IPv6
MASTER=fd77::1 env_job env6 1 env:// 2 --backend tcp
tap_ok $? "env:// over IPv6 (MASTER_ADDR=fd77::1): 2 ranks on 2 hosts train"
same env6 "env:// over IPv6: 2 ranks on 2 hosts equal one rank"
grep -q "address fd77::2 on eth0 (route to fd77::1)" "$T/env6.1.log"
st=$?
[ $st = 0 ] || tap_diag "$(grep "rank 1 of 2" "$T/env6.1.log")"
tap_ok $st "over IPv6 rank 1 listens on fd77::2, the route to the store"

# 1c. FSDPC_SOCKET_IFNAME names the interface; a wrong name is one clear line
export FSDPC_SOCKET_IFNAME=eth0
env_job ifn 1 env:// 2 --backend tcp
st=$?
unset FSDPC_SOCKET_IFNAME
[ $st = 0 ] && grep -q "address 10.77.0.2 on eth0 (FSDPC_SOCKET_IFNAME=eth0)" "$T/ifn.1.log"
tap_ok $? "FSDPC_SOCKET_IFNAME=eth0: each rank uses eth0's address and says why"
host_run 2 env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29416 \
    FSDPC_SECRET_FILE="$T/secret" FSDPC_SOCKET_IFNAME=ib9 timeout 30 "$BIN/fsdpc-train" \
    --init env:// $COMMON > "$T/badif.log" 2>&1
rc=$?
tap_diag "$(grep "fsdpc:" "$T/badif.log")"
[ $rc != 0 ] && [ $rc != 124 ] &&
    grep -q "FSDPC_SOCKET_IFNAME=ib9: no such interface.*(interfaces: lo, eth0)" "$T/badif.log"
tap_ok $? "FSDPC_SOCKET_IFNAME naming no interface: one line listing the interfaces"

# 2. tcp://, two ranks per host
env_job tcp4 2 tcp://10.77.0.1:29412 1 --backend tcp
tap_ok $? "tcp://: 4 ranks, 2 per host, train"
same tcp4 "tcp://: 4 ranks on 2 hosts equal one rank"
grep -q "rank 3 of 4 (local 1 of 2) on fsdpc-host2" "$T/tcp4.3.log"
tap_ok $? "ranks sharing a host count each other as local (rank 3: local 1 of 2)"

# 3. --init mpi, HSDP: dp=2 inside each host over mpi, rdp=2 across over tcp.
# mpiexec starts the ranks; a wrapper puts rank r on host r/2+1.
cat > "$T/onhost.sh" <<WRAP
#!/bin/sh
h=\$((PMI_RANK / 2 + 1))
exec ip netns exec "$HOSTS_PREFIX-h\$h" unshare --uts sh -c 'hostname "\$0" && exec "\$@"' \\
    "fsdpc-host\$h" "\$@"
WRAP
chmod +x "$T/onhost.sh"
# shellcheck disable=SC2086
timeout 90 "$MPIEXEC" -n 4 "$T/onhost.sh" "$BIN/fsdpc-train" --init mpi $COMMON --batch-size 1 \
    --mesh rdp=2,dp=2 --backend dp=mpi,rdp=tcp --metrics "$T/hsdp.jsonl" --out "$T/hsdp.h5" \
    > "$T/hsdp.log" 2>&1
st=$?
[ $st = 0 ] || tap_diag "$(tail -5 "$T/hsdp.log")"
tap_ok $st "mpi: HSDP rdp=2 across the hosts, dp=2 inside each, dp=mpi rdp=tcp, trains"
same hsdp "mpi: HSDP across 2 hosts with mixed backends equals one rank"
grep -q "rank 0 of 4 (local 0 of 2) on fsdpc-host1; init mpi; store tcp 10.77.0.1:" "$T/hsdp.log"
tap_ok $? "mpi: ranks in another network namespace are not neighbours; the store is on 10.77.0.1"

# 4. a host dies mid-run: host 2's rank is killed; host 1's rank must end,
# naming rank 1, well within its deadline
( host_run 1 env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29413 \
    FSDPC_SECRET_FILE="$T/secret" timeout 90 "$BIN/fsdpc-train" --init env:// $COMMON \
    --steps 100000 --timeout 60 --metrics "$T/kill.jsonl" > "$T/kill.0.log" 2>&1
  echo $? > "$T/kill.0.rc" ) &
k0=$!
( host_run 2 env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29413 \
    FSDPC_SECRET_FILE="$T/secret" timeout 90 "$BIN/fsdpc-train" --init env:// $COMMON \
    --steps 100000 --timeout 60 > "$T/kill.1.log" 2>&1 ) &
i=0
while [ $i -lt 300 ] && [ "$(cat "$T/kill.jsonl" 2> /dev/null | grep -c '"step"')" -lt 3 ]; do
    sleep 0.1
    i=$((i + 1))
done
t0=$(date +%s)
host_kill 2
wait $k0
took=$(($(date +%s) - t0))
rc=$(cat "$T/kill.0.rc")
tap_diag "$(grep -i "fsdpc:" "$T/kill.0.log" | tail -2)"
tap_diag "rank 1: $(tail -2 "$T/kill.1.log")"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ $took -le 30 ] && grep -q "rank 1" "$T/kill.0.log"
tap_ok $? "host 2 killed mid-run: host 1's rank exits (status $rc) in ${took} s naming rank 1"

# 5. fsdpc-bench across the hosts
for r in 0 1; do
    ( host_run $((r + 1)) env RANK=$r WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29414 \
        FSDPC_SECRET_FILE="$T/secret" timeout 60 "$BIN/fsdpc-bench" --init env:// \
        --backend tcp --op allreduce --min 1K --max 4M --iters 5 --warmup 1 \
        > "$T/bench.$r.log" 2>&1
      echo $? > "$T/bench.$r.rc" ) &
done
wait
tap_diag "$(tail -4 "$T/bench.0.log")"
[ "$(cat "$T/bench.0.rc")" = 0 ] && [ "$(cat "$T/bench.1.rc")" = 0 ] &&
    grep -q "4194304" "$T/bench.0.log"
tap_ok $? "fsdpc-bench allreduce across the hosts, 1 KiB to 4 MiB, results checked"

# 6. the store listens on MASTER_ADDR only: host 1 gets a second address;
# from host 2 the store's port answers on 10.77.0.1 and refuses on it
ip -n "$HOSTS_PREFIX-h1" addr add 10.77.0.11/24 dev eth0
( host_run 1 env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29415 \
    FSDPC_SECRET_FILE="$T/secret" timeout 30 "$BIN/fsdpc-train" --init env:// $COMMON \
    --timeout 20 > "$T/bind.log" 2>&1 ) &
b0=$!
probe() { # probe ADDRESS: 0 when the port accepts, 111 when refused
    host_run 2 "$PY" -c "import socket, sys; s = socket.socket(); s.settimeout(2)
sys.exit(s.connect_ex(('$1', 29415)))"
}
i=0
while [ $i -lt 100 ] && ! probe 10.77.0.1; do sleep 0.1; i=$((i + 1)); done
probe 10.77.0.1
on_master=$?
probe 10.77.0.11
on_other=$?
host_kill 1
wait $b0 2> /dev/null
tap_diag "connect from host 2: 10.77.0.1 -> $on_master, 10.77.0.11 -> $on_other (111: refused)"
[ $on_master = 0 ] && [ $on_other = 111 ]
tap_ok $? "the store listens on MASTER_ADDR 10.77.0.1 only: host 1's other address refuses host 2"

tap_done
