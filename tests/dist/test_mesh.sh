#!/bin/sh
# test_mesh.sh - device meshes across 3 and 4 ranks (test_mesh): 2-D with a
# backend per dimension, 3-D with size-1 dimensions, plain processes with
# env://; then the failures every rank must report alike and at once: one
# rank with another mesh or backend (named in every rank's message), and
# specs that no rank can parse.
. "$top_srcdir/tests/tap.sh"

PROG="$top_builddir/tests/dist/test_mesh"
PY="${PYTHON3:-python3}"
[ "$PY" = no ] && PY=python3
LIMIT=60     # seconds per run
FAIL_FAST=15 # a refused mesh must fail every rank within this many seconds

for v in $(env | sed -n 's/^\(PMIX*_[A-Za-z0-9_]*\|SLURM_[A-Za-z0-9_]*\|OMPI_[A-Za-z0-9_]*\|HYDRA_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT FSDPC_JOB_ID
unset TEST_MESH_ALT_RANK TEST_MESH_ALT_MESH TEST_MESH_ALT_BACKEND

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-mesh-test.XXXXXX")
trap 'rm -rf "$T"' EXIT

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# mpirun N ARGS...: test_mesh under mpiexec; output in $T/out, status in $st.
mpirun() {
    n=$1
    shift
    timeout -k 5 $LIMIT $MPIEXEC -n "$n" "$PROG" --init mpi "$@" >"$T/out" 2>"$T/err"
    st=$?
}

# envrun N ARGS...: N plain processes with env://; all stdout in $T/out.
envrun() {
    n=$1
    shift
    port=$(free_port)
    pids=""
    r=0
    : >"$T/err"
    while [ $r -lt "$n" ]; do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout -k 5 $LIMIT "$PROG" --init env:// "$@" >"$T/out.$r" 2>>"$T/err" &
        pids="$pids $!"
        r=$((r + 1))
    done
    st=0
    for p in $pids; do
        wait "$p" || st=1
    done
    cat "$T"/out.* >"$T/out"
    rm -f "$T"/out.*
}

# relay LABEL: rank 0's TAP lines, renumbered, and the run's exit status.
relay() {
    while IFS= read -r line; do
        case $line in
        "ok "*) tap_ok 0 "${line#* - }" ;;
        "not ok "*) tap_ok 1 "${line#* - }" ;;
        "#"*) echo "$line" ;;
        1..*) ;;
        *) tap_diag "$line" ;;
        esac
    done <"$T/out"
    [ $st -ne 0 ] && tap_diag "$(tail -n 20 "$T/err")"
    tap_ok $st "$1: exit status $st"
}

# refused N LABEL PATTERN: the run failed on every rank, each rank printed a
# line with PATTERN, and it took at most FAIL_FAST seconds.
refused() {
    n=$1 label=$2 pattern=$3
    lines=$(grep "^rank [0-9]*: mesh: " "$T/out" | grep -cF "$pattern")
    ok=0
    if [ $st -eq 0 ] || [ "$lines" -ne "$n" ] || [ $elapsed -gt $FAIL_FAST ]; then
        tap_diag "exit status $st, $lines of $n ranks reported '$pattern', ${elapsed}s; output:"
        tap_diag "$(cat "$T/out")"
        tap_diag "$(tail -n 10 "$T/err")"
        ok=1
    fi
    tap_ok $ok "$label: every rank fails within ${FAIL_FAST}s naming it"
}

timed() {
    t0=$(date +%s)
    "$@"
    elapsed=$(($(date +%s) - t0))
}

# ---- meshes that work
mpirun 4 --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
relay "2-D mesh, dp over tcp and tp over mpi"
mpirun 4 --mesh dp=2,tp=2 --backend dp=mpi,tp=tcp
relay "2-D mesh, dp over mpi and tp over tcp"
mpirun 4 --mesh rdp=2,dp=1,tp=2 --backend tcp,tp=mpi
relay "3-D mesh with a size-1 middle dimension"
mpirun 4 --mesh pp=1,dp=4,tp=1 --backend mpi,pp=tcp
relay "3-D mesh with size-1 outer and inner dimensions"
mpirun 3 --mesh dp=3
relay "default backend at 3 ranks"
export TEST_MESH_MANY=70
mpirun 2 --mesh dp=2 --backend mpi
unset TEST_MESH_MANY
relay "70 more meshes after the first (more groups than the flight recorder names)"
envrun 4 --mesh dp=2,tp=2 --backend tcp
relay "2-D tcp mesh as plain processes (env://)"

# ---- one rank disagrees: everyone must say so, naming rank 2
export TEST_MESH_ALT_RANK=2
export TEST_MESH_ALT_MESH=dp=4
timed mpirun 4 --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
refused 4 "rank 2 with mesh dp=4" \
    "rank 2 has mesh dp=4 (backend dp=tcp,tp=mpi) but rank 0 has dp=2,tp=2 (backend dp=tcp,tp=mpi)"
unset TEST_MESH_ALT_MESH
export TEST_MESH_ALT_BACKEND=tcp
timed mpirun 4 --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
refused 4 "rank 2 with backend tcp" \
    "rank 2 has mesh dp=2,tp=2 (backend tcp) but rank 0 has dp=2,tp=2 (backend dp=tcp,tp=mpi)"
unset TEST_MESH_ALT_BACKEND
export TEST_MESH_ALT_MESH=dp=2,tp=3
timed mpirun 4 --mesh dp=2,tp=2 --backend mpi
refused 4 "rank 2 with an invalid mesh" "rank 2 has mesh dp=2,tp=3 (backend mpi)"
export TEST_MESH_ALT_MESH=tp=2,dp=2
timed envrun 4 --mesh dp=2,tp=2 --backend tcp
refused 4 "rank 2 with dimensions in another order (env://)" "rank 2 has mesh tp=2,dp=2"
unset TEST_MESH_ALT_RANK TEST_MESH_ALT_MESH

# ---- specs nobody can use: the same clear error on every rank
timed mpirun 4 --mesh dp=3 --backend mpi
refused 4 "mesh dp=3 on 4 ranks" "mesh 'dp=3' has 3 ranks (3) but the world has 4"
timed mpirun 4 --mesh dp=2,dp=2 --backend mpi
refused 4 "duplicate dimension" "dimension 'dp' appears twice"
timed mpirun 4 --mesh dp:4 --backend mpi
refused 4 "bad syntax" "'dp:4' is not NAME=SIZE"
timed mpirun 4 --mesh dp=2,tp=2 --backend dp=gloo
refused 4 "unknown backend" "backend 'gloo' (in --backend 'dp=gloo') is unknown; this build has: mpi,tcp"
timed mpirun 4 --mesh dp=2,tp=2 --backend pp=mpi
refused 4 "backend for a dimension the mesh lacks" "names dimension 'pp', which mesh dp=2,tp=2 does not have"

tap_done
