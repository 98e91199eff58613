# train-common.sh - inputs shared by train-mpiexec.sh and train-env.sh
# (sourced by them, not run): finds the programs, checks the environment
# variables, and leaves the fsdpc-train flags in the array `args`.
#
# Inputs (environment variables), the same as jobscripts/slurm/train.sbatch:
#   MODEL        model file to start from (fsdpc-ckpt init makes one) (required)
#   DATA         training token file (fsdpc-data tokenize makes one) (required)
#   VAL_DATA     validation token file (none)
#   BIN          directory holding fsdpc-train (default: found on PATH, else
#                <repo>/build, else <repo>)
#   RANKS        processes to start (2)
#   STEPS        optimizer steps of the whole run (1000); keep it the same
#                across restarts: the learning-rate schedule depends on it
#   BATCH        sequences per rank per micro-step (8)
#   SEQ_LEN      tokens per sequence, at most the model's context (128)
#   LR           peak learning rate (6e-4)
#   MESH         device mesh, e.g. rdp=2,dp=2 (default: dp=RANKS)
#   BACKEND      collective backend, or one per mesh dimension (launcher's default)
#   RUN_DIR      metrics.jsonl and final.h5 go here (./runs/train)
#   CKPT_DIR     sharded checkpoints ($RUN_DIR/ckpt); a run resumes from
#                CKPT_DIR/latest when there is one
#   CKPT_EVERY   checkpoint every N steps (500; 0: at the end and on SIGUSR1/SIGTERM)
#   CKPT_KEEP    keep the newest K checkpoints (3; 0: all)
#   THREADS      BLAS threads per rank (cores / RANKS, at least 1)
#   EXTRA_ARGS   further fsdpc-train flags, split on spaces

# shellcheck shell=bash disable=SC2154 # me: the sourcing script's name
die() {
    echo "$me: $*" >&2
    exit 1
}

common_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
common_repo=$(cd "$common_here/../.." && pwd)
if [ -z "${BIN:-}" ]; then
    if command -v fsdpc-train > /dev/null 2>&1; then
        BIN=$(dirname "$(command -v fsdpc-train)")
    elif [ -x "$common_repo/build/fsdpc-train" ]; then
        BIN=$common_repo/build
    else
        BIN=$common_repo
    fi
fi
[ -x "$BIN/fsdpc-train" ] || die "BIN=$BIN holds no fsdpc-train: build fsdpc first, or set BIN to the build directory"
[ -n "${MODEL:-}" ] || die "MODEL is not set: name the model file to train (fsdpc-ckpt init makes one)"
[ -f "$MODEL" ] || die "MODEL=$MODEL: no such file"
[ -n "${DATA:-}" ] || die "DATA is not set: name the training token file (fsdpc-data tokenize makes one)"
[ -f "$DATA" ] || die "DATA=$DATA: no such file"
[ -z "${VAL_DATA:-}" ] || [ -f "$VAL_DATA" ] || die "VAL_DATA=$VAL_DATA: no such file"
RANKS=${RANKS:-2}
case $RANKS in '' | *[!0-9]* | 0) die "RANKS=$RANKS is not a positive integer" ;; esac
STEPS=${STEPS:-1000}
case $STEPS in '' | *[!0-9]* | 0) die "STEPS=$STEPS is not a positive integer" ;; esac
BATCH=${BATCH:-8}
SEQ_LEN=${SEQ_LEN:-128}
LR=${LR:-6e-4}
RUN_DIR=${RUN_DIR:-./runs/train}
CKPT_DIR=${CKPT_DIR:-$RUN_DIR/ckpt}
CKPT_EVERY=${CKPT_EVERY:-500}
CKPT_KEEP=${CKPT_KEEP:-3}
common_cores=$(nproc 2> /dev/null || echo 1)
THREADS=${THREADS:-$((common_cores / RANKS > 0 ? common_cores / RANKS : 1))}
mkdir -p "$RUN_DIR" "$CKPT_DIR" || die "cannot create RUN_DIR=$RUN_DIR or CKPT_DIR=$CKPT_DIR"
# fsdpc-train sets its BLAS threads from --threads; the variable keeps anything
# else in the process from starting one thread per core in every rank.
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS

# the step CKPT_DIR/latest names, 0 when there is none
latest_step() {
    local l s
    l=$(readlink "$CKPT_DIR/latest" 2> /dev/null) || { echo 0; return; }
    s=${l##*step_}
    case $s in '' | *[!0-9]*) echo 0 ;; *) echo "$s" ;; esac
}

start_step=$(latest_step)
args=(--model "$MODEL" --data "$DATA" --steps "$STEPS" --batch-size "$BATCH" --seq-len "$SEQ_LEN"
    --lr "$LR" --threads "$THREADS" --metrics "$RUN_DIR/metrics.jsonl" --out "$RUN_DIR/final.h5"
    --ckpt-dir "$CKPT_DIR" --ckpt-every "$CKPT_EVERY" --ckpt-keep "$CKPT_KEEP")
[ -n "${VAL_DATA:-}" ] && args+=(--val-data "$VAL_DATA")
[ -n "${MESH:-}" ] && args+=(--mesh "$MESH")
[ -n "${BACKEND:-}" ] && args+=(--backend "$BACKEND")
if [ "$start_step" -ge "$STEPS" ]; then
    echo "$me: $CKPT_DIR/latest is at step $start_step of $STEPS: training is complete"
    exit 0
elif [ "$start_step" -gt 0 ]; then
    echo "$me: resuming from $CKPT_DIR/latest (step $start_step)"
    args+=(--resume latest)
fi
# EXTRA_ARGS: words split on blanks, no glob expansion
read -r -a extra <<< "${EXTRA_ARGS:-}"
args+=(${extra[@]+"${extra[@]}"})
