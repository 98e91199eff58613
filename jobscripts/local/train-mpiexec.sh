#!/bin/bash
# train-mpiexec.sh - fsdpc-train on a workstation under MPICH's launcher:
# RANKS ranks with `mpiexec.mpich -n RANKS`, sharded checkpoints, and resume
# from the latest checkpoint when one exists.
#
#   MODEL=tiny.h5 DATA=train.bin jobscripts/local/train-mpiexec.sh
#   RANKS=4 MESH=rdp=2,dp=2 STEPS=2000 MODEL=... DATA=... jobscripts/local/train-mpiexec.sh
#
# Inputs: the environment variables of jobscripts/local/train-common.sh
# (MODEL, DATA, VAL_DATA, BIN, RANKS, STEPS, BATCH, SEQ_LEN, LR, MESH, BACKEND,
# RUN_DIR, CKPT_DIR, CKPT_EVERY, CKPT_KEEP, THREADS, EXTRA_ARGS), and
#   MPIEXEC      the launcher (mpiexec.mpich: Debian's plain mpiexec may be
#                Open MPI's, which starts MPICH programs as separate 1-rank jobs)
#   BACKEND      defaults to the trainer's choice, mpi
#
# Ctrl-C (MPICH's mpiexec passes the first one on to every rank as SIGINT),
# `kill -INT` of mpiexec, or `kill -USR1` of any rank: the ranks checkpoint at
# the next step boundary and exit with status 75, which this script returns;
# run the same command again to continue. A second Ctrl-C stops at once.
set -u
me=train-mpiexec.sh
# shellcheck source=train-common.sh source-path=SCRIPTDIR
. "$(cd "$(dirname "$0")" && pwd)/train-common.sh"

MPIEXEC=${MPIEXEC:-mpiexec.mpich}
command -v "$MPIEXEC" > /dev/null 2>&1 ||
    die "$MPIEXEC not found: install mpich, or set MPIEXEC to MPICH's launcher"

echo "$me: $RANKS ranks x $THREADS BLAS thread(s), $STEPS steps, run directory $RUN_DIR"
"$MPIEXEC" -n "$RANKS" "$BIN/fsdpc-train" "${args[@]}"
rc=$?
# After a Ctrl-C it passed on, MPICH's mpiexec does not always return the
# ranks' status (it returned 0 in some trials): a run that ended short of
# STEPS without an error was stopped.
if [ $rc -eq 0 ] && [ "$(latest_step)" -lt "$STEPS" ]; then
    rc=75
fi
if [ $rc -eq 75 ]; then
    echo "$me: stopped at checkpoint step $(latest_step) of $STEPS (status 75): run the same command again to continue"
elif [ $rc -ne 0 ]; then
    echo "$me: fsdpc-train failed (exit status $rc)" >&2
fi
exit $rc
