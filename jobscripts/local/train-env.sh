#!/bin/bash
# train-env.sh - fsdpc-train on a workstation without an MPI launcher: RANKS
# plain processes that meet through env:// (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), the way torchrun starts its
# workers. Sharded checkpoints, and resume from the latest one when it exists.
#
#   MODEL=tiny.h5 DATA=train.bin jobscripts/local/train-env.sh
#   RANKS=4 MASTER_PORT=29511 MODEL=... DATA=... jobscripts/local/train-env.sh
#
# Inputs: the environment variables of jobscripts/local/train-common.sh
# (MODEL, DATA, VAL_DATA, BIN, RANKS, STEPS, BATCH, SEQ_LEN, LR, MESH, BACKEND,
# RUN_DIR, CKPT_DIR, CKPT_EVERY, CKPT_KEEP, THREADS, EXTRA_ARGS), and
#   BACKEND      defaults to tcp (the mpi backend needs an MPI launcher)
#   MASTER_ADDR  where rank 0 serves the rendezvous store (127.0.0.1)
#   MASTER_PORT  its port (default: 20000 + this script's pid mod 20000)
#   FSDPC_SECRET_FILE, FSDPC_SECRET  the job secret; by default the script
#                makes a fresh one in a directory only you can read, and
#                removes it at the end (doc/rendezvous.md, "Authentication")
#
# The script waits for all ranks. When one fails, it stops the others (SIGTERM,
# then SIGKILL 10 s later) and exits with the failed rank's status. SIGUSR1,
# SIGUSR2, SIGTERM and SIGINT (Ctrl-C) sent to the script are passed to every
# rank: USR1, TERM and INT make them checkpoint at the next step boundary and
# exit with status 75, which the script returns too (run the same command
# again to continue; a second Ctrl-C stops them at once); USR2 dumps their
# flight recorders (doc/debugging.md).
set -u
me=train-env.sh
BACKEND=${BACKEND:-tcp}
# shellcheck source=train-common.sh source-path=SCRIPTDIR
. "$(cd "$(dirname "$0")" && pwd)/train-common.sh"

export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-$((20000 + $$ % 20000))}

# The job secret: every rank proves that it holds it on each store and tcp
# backend connection, so that no other process can join the job.
if [ -z "${FSDPC_SECRET:-}${FSDPC_SECRET_FILE:-}" ]; then
    secret_dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-secret.XXXXXX") ||
        { echo "$me: cannot create a directory for the job secret" >&2; exit 1; }
    trap 'rm -rf "$secret_dir"' EXIT
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$secret_dir/secret") ||
        { echo "$me: cannot write the job secret to $secret_dir" >&2; exit 1; }
    export FSDPC_SECRET_FILE=$secret_dir/secret
fi

# fsdpc_run_ranks NPROC FIRST_RANK WORLD_SIZE COMMAND [ARGS...]: start NPROC
# copies of COMMAND with RANK = FIRST_RANK + i, LOCAL_RANK = i,
# LOCAL_WORLD_SIZE = NPROC and WORLD_SIZE; pass USR1, USR2, TERM and INT on to
# them; when one fails stop the others; return the first failure's status, or
# 75 when the ranks stopped at a step boundary on a signal (not a failure).
# (jobscripts/slurm/train-env.sbatch runs the same function on every node.)
fsdpc_run_ranks() {
    local n=$1 first=$2 world=$3 i ranks="" live e p r s rc=0 stopped=0 ticks=0
    shift 3
    for ((i = 0; i < n; i++)); do
        RANK=$((first + i)) LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n WORLD_SIZE=$world "$@" &
        ranks="$ranks $((first + i)):$!"
    done
    fsdpc_pids() {
        for e in $ranks; do printf '%s ' "${e#*:}"; done
    }
    # shellcheck disable=SC2046 # a list of pids
    trap 'kill -s USR1 $(fsdpc_pids) 2> /dev/null' USR1
    # shellcheck disable=SC2046
    trap 'kill -s USR2 $(fsdpc_pids) 2> /dev/null' USR2
    # shellcheck disable=SC2046
    trap 'kill -s TERM $(fsdpc_pids) 2> /dev/null' TERM INT
    while [ -n "$ranks" ]; do
        sleep 0.2
        live=""
        for e in $ranks; do
            r=${e%%:*} p=${e#*:}
            if kill -0 "$p" 2> /dev/null; then
                live="$live $e"
                continue
            fi
            wait "$p"
            s=$?
            if [ "$s" -eq 75 ]; then # stopped by a signal, with a checkpoint
                stopped=75
            elif [ "$s" -ne 0 ] && [ "$rc" -eq 0 ]; then
                rc=$s
                echo "fsdpc_run_ranks: rank $r (pid $p) on $(hostname) exited with status $s; stopping the other ranks" >&2
            fi
        done
        ranks=$live
        if [ "$rc" -ne 0 ] && [ -n "$ranks" ]; then
            # shellcheck disable=SC2046
            if [ "$ticks" -eq 0 ]; then
                kill -s TERM $(fsdpc_pids) 2> /dev/null
            elif [ "$ticks" -eq 50 ]; then
                kill -s KILL $(fsdpc_pids) 2> /dev/null
            fi
            ticks=$((ticks + 1))
        fi
    done
    trap - USR1 USR2 TERM INT
    [ "$rc" -ne 0 ] || rc=$stopped
    return "$rc"
}

echo "$me: $RANKS ranks x $THREADS BLAS thread(s), $STEPS steps, store $MASTER_ADDR:$MASTER_PORT," \
    "run directory $RUN_DIR"
fsdpc_run_ranks "$RANKS" 0 "$RANKS" "$BIN/fsdpc-train" --init env:// "${args[@]}"
rc=$?
if [ $rc -eq 75 ]; then
    echo "$me: stopped at checkpoint step $(latest_step) of $STEPS (status 75): run the same command again to continue"
elif [ $rc -ne 0 ]; then
    echo "$me: fsdpc-train failed (exit status $rc)" >&2
fi
exit $rc
