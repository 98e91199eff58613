# ckpt_lib.sh - fixtures shared by the checkpoint tests (sourced after tap.sh):
# a work directory $W, a byte-level token file and a 2-layer model, the
# programs, and helpers to run the trainer and compare metrics.
BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
CKPT="$BIN/fsdpc-ckpt"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
# a Python with h5py: $PYTHON3 when it has it, else the system one
PY=${PYTHON3:-python3}
"$PY" -c 'import h5py, numpy' > /dev/null 2>&1 || PY=/usr/bin/python3
COMPARE="$top_srcdir/tests/fsdp/compare_models.py"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ckpt.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

sh "$top_srcdir/tests/corpus.sh" 500000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
"$CKPT" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 -o "$W/m.h5" > /dev/null 2>&1
tap_ok $? "fixtures: token file and a 2-layer model"

# The common flags; a constant schedule after warm-up, so that a run cut at
# step k and resumed follows the same learning rates as one run of all steps.
COMMON="--model $W/m.h5 --data $W/train.bin --seq-len 32 --lr 1e-3 --warmup 2 \
--lr-schedule constant --peak-flops 1e11 --timeout 30"

# train N_RANKS ARGS...: fsdpc-train on N ranks (1: no mpiexec), output in $W/last.out
train() {
    n=$1
    shift
    if [ "$n" -eq 1 ]; then
        # shellcheck disable=SC2086
        timeout 60 "$TRAIN" $COMMON "$@" > "$W/last.out" 2>&1
    else
        # shellcheck disable=SC2086
        timeout 60 "$MPIEXEC" -n "$n" "$TRAIN" $COMMON "$@" > "$W/last.out" 2>&1
    fi
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$(tail -n 5 "$W/last.out")"
    return $rc
}

# readback MODEL OUT: the weights fsdpc-train loads from MODEL, written back to
# OUT unchanged (lr 0 makes AdamW's update, decay included, exactly zero) by
# the code path that writes every final model; two readbacks are the same
# bytes exactly when the two loads gave the same weights
readback() {
    train 1 --batch-size 4 --steps 2 --lr 0 --model "$1" --out "$2" --metrics "$2.jsonl"
}

# losses FILE: "step loss" per step line of a metrics file
losses() {
    sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"
}

have_h5py() {
    "$PY" -c 'import h5py, numpy' > /dev/null 2>&1
}

# crash_restart CALLS K ARGS...: fsdpc-train $COMMON ARGS on one rank, on a
# fresh copy of $W/base in $W/ck (ARGS name it as --ckpt-dir), killed before
# its call K under $W/ck (crash_shim.so, $SHIM; FSDPC_CRASH_NO_EXCHANGE from
# the environment), then a restart that resumes latest and trains to step 6,
# its metrics in $W/m.jsonl. 1 with $crash_msg naming call K (as the calls
# file CALLS lists it) when the run was not killed there or the restart
# failed.
crash_restart() {
    calls=$1 k=$2
    shift 2
    rm -rf "$W/ck" "$W/m.jsonl"
    cp -R -P "$W/base" "$W/ck"
    # shellcheck disable=SC2086
    timeout 60 env LD_PRELOAD="$SHIM" FSDPC_CRASH_AT="$k" FSDPC_CRASH_UNDER="$W/ck" "$TRAIN" \
        $COMMON "$@" > "$W/crash.out" 2>&1
    rc=$?
    call=$(awk -v k="$k" '$1 == k { print $2, $NF }' "$calls" | sed "s|$W/ck/||g")
    if [ $rc -ne 113 ]; then
        crash_msg="call $k ($call): the run was not killed there (rc $rc)"
        return 1
    fi
    if ! train 1 --batch-size 4 --steps 6 --ckpt-dir "$W/ck" --resume latest \
        --metrics "$W/m.jsonl"; then
        crash_msg="call $k ($call): the restart failed: $(grep fsdpc "$W/last.out" | tail -n 1)"
        return 1
    fi
    return 0
}
