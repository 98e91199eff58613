#!/bin/sh
# test_mlp_sharded.sh - the test-only "mlp" architecture (mlp_model.c),
# registered at run time, trained by the unchanged trainer and sharding
# engine over 2 and 3 ranks, equals one rank on the same global batch
# (losses, gradient norms and final weights to rel 1e-5, compare_models.py),
# tied and untied, with accumulation and a checkpoint resumed on another
# rank count. The trainer, engine, io and checkpoints know only the model
# interface: this is what shows it.
# Needs h5py for /usr/bin/python3 (skips, loudly, without it).
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
MLP="$BIN/tests/model/mlp_train"
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-mlp.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 60000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"
"$MLP" --init "$W/tied.h5" 256 32 24 40 2 1 11 > "$W/log" 2>&1 &&
    "$MLP" --init "$W/untied.h5" 256 32 24 40 3 0 12 >> "$W/log" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(cat "$W/log")"
tap_ok $rc "mlp model files (V=256 T=32 C=24 H=40, 2 blocks tied, 3 untied)"
"$BIN/fsdpc-ckpt" inspect "$W/tied.h5" > "$W/inspect" 2>&1
[ $? -ne 0 ] && grep -q "supported architectures: gpt2" "$W/inspect"
tap_ok $? "fsdpc-ckpt (which registers only gpt2) refuses the file, naming what it knows"

COMMON="--data $W/tok.bin --seq-len 16 --steps 8 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--weight-decay 0.1 --clip 0 --peak-flops 1e11 --log-every 1 --timeout 30"

# run NAME NRANKS MODEL B EXTRA...
run() {
    r_name=$1 r_n=$2 r_model=$3 r_b=$4
    shift 4
    rm -f "$W/$r_name.jsonl"
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n "$r_n" "$MLP" --model "$W/$r_model.h5" $COMMON --batch-size "$r_b" \
        --metrics "$W/$r_name.jsonl" --out "$W/$r_name.h5" "$@" > "$W/$r_name.log" 2>&1
    r_rc=$?
    [ $r_rc -eq 0 ] || tap_diag "$(tail -5 "$W/$r_name.log")"
    return $r_rc
}
same() {
    out=$("$PY" "$CMP" losses "$W/$1.jsonl" "$W/$2.jsonl" --tol "$3" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        out="$out
$("$PY" "$CMP" models "$W/$1.h5" "$W/$2.h5" --tol "$3" 2>&1)"
        rc=$?
    fi
    tap_diag "$out"
    tap_ok $rc "$4"
}

for m in tied untied; do
    run "ref-$m" 1 "$m" 6
    tap_ok $? "$m: one rank, batch 6"
    grep -q "^model: .* | mlp " "$W/ref-$m.log"
    tap_ok $? "$m: the run header names the mlp architecture"
    run "dp2-$m" 2 "$m" 3 --backend tcp
    tap_ok $? "$m: dp=2 over tcp ran"
    same "dp2-$m" "ref-$m" 1e-5 "$m: dp=2 equals one rank"
    run "dp3-$m" 3 "$m" 2 --backend mpi
    tap_ok $? "$m: dp=3 over mpi ran"
    same "dp3-$m" "ref-$m" 1e-5 "$m: dp=3 equals one rank"
done
run refacc 1 untied 6 --grad-accum 2
run acc 3 untied 2 --grad-accum 2 --mesh dp=3 --backend tcp --activation-checkpointing
tap_ok $? "untied: dp=3, 2 micro-steps, activation checkpointing ran"
same acc refacc 1e-5 "untied: dp=3 with accumulation and checkpointing equals one rank"

# a checkpoint written by 3 ranks at step 4 resumes on 2
run half 3 tied 2 --ckpt-dir "$W/ck" --ckpt-every 4 --backend tcp
tap_ok $? "tied: 3 ranks, checkpoints at steps 4 and 8"
run resumed 2 tied 3 --resume "$W/ck/step_4" --backend tcp
tap_ok $? "tied: resumed from step 4 on 2 ranks"
"$PY" "$CMP" models "$W/resumed.h5" "$W/ref-tied.h5" --tol 1e-5 > "$W/cmp" 2>&1
rc=$?
tap_diag "$(cat "$W/cmp")"
tap_ok $rc "tied: 4 steps on 3 ranks, then 4 on 2 from the checkpoint, equal 8 on one rank"
tap_done
