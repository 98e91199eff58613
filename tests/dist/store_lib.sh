# store_lib.sh - shared by the store tests (sourced): a clean launcher
# environment, free ports, and a way to run N plain processes as one job.
. "$top_srcdir/tests/tap.sh"

PROBE="$top_builddir/tests/dist/store_probe"
PY="${PYTHON3:-python3}"
[ "$PY" = no ] && PY=python3

# Nothing from an enclosing launcher may leak into the jobs started here.
for v in $(env | sed -n 's/^\(PMIX*_[A-Za-z0-9_]*\|SLURM_[A-Za-z0-9_]*\|OMPI_[A-Za-z0-9_]*\|HYDRA_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT \
    FSDPC_JOB_ID TORCHELASTIC_RUN_ID FSDPC_STORE_HOST FSDPC_FILE_STORE_SLACK \
    FSDPC_SECRET FSDPC_SECRET_FILE FSDPC_INSECURE

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-store-test.XXXXXX")
bg_pids=""
store_cleanup() {
    for p in $bg_pids; do kill -9 "$p" 2>/dev/null; done
    [ -n "$KEEP" ] || rm -rf "$T"
}
trap store_cleanup EXIT

# A TCP port nobody listens on right now.
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_job N INIT [probe args...]: ranks 0..N-1 as plain processes with
# RANK/WORLD_SIZE (plus whatever the caller exported); logs in $T/rR.log,
# exit codes in $T/rR.rc. Returns the number of failed ranks.
run_job() {
    n=$1 init=$2
    shift 2
    pids=""
    r=0
    while [ "$r" -lt "$n" ]; do
        ( RANK=$r WORLD_SIZE=$n timeout 60 "$PROBE" --init "$init" "$@" >"$T/r$r.log" 2>&1
          echo $? >"$T/r$r.rc" ) &
        pids="$pids $!"
        r=$((r + 1))
    done
    for p in $pids; do wait "$p"; done
    job_failed "$n"
}

# job_failed N: number of ranks whose rc file is not 0; shows their logs.
job_failed() {
    bad=0
    r=0
    while [ "$r" -lt "$1" ]; do
        if [ "$(cat "$T/r$r.rc" 2>/dev/null)" != 0 ]; then
            bad=$((bad + 1))
            tap_diag "rank $r exit $(cat "$T/r$r.rc" 2>/dev/null):"
            tap_diag "$(grep -v '^PASS' "$T/r$r.log")"
        fi
        r=$((r + 1))
    done
    return "$bad"
}

# expect_fail DESCRIPTION PATTERN MAX_SECONDS [VAR=VALUE...] -- PROBE ARGS...
expect_fail() {
    desc=$1 pattern=$2 max=$3
    shift 3
    vars=""
    while [ "$1" != "--" ]; do vars="$vars $1"; shift; done
    shift
    start=$(date +%s)
    env $vars timeout 60 "$PROBE" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    took=$(($(date +%s) - start))
    lines=$(wc -l <"$T/err")
    ok=1
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le "$max" ] && [ "$lines" -eq 1 ] &&
        grep -q -- "$pattern" "$T/err"; then
        ok=0
    fi
    tap_ok $ok "$desc (exit $rc, ${took} s)"
    [ $ok -eq 0 ] || tap_diag "stderr ($lines lines): $(cat "$T/err")"
    [ $ok -eq 0 ] && tap_diag "$(cat "$T/err")"
}
