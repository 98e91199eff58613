#!/bin/sh
# test_errors.sh - what a user sees when fsdpc-train is given bad input: under
# mpiexec.mpich -n 2, piped, the error line of a missing model file, a mesh
# that does not fit the ranks and a data file shorter than one batch appears
# exactly once in every one of 20 runs (the ranks agree on the failure and
# leave in order, so neither a repeat nor a line lost to the launcher); the
# common errors carry a second line "fsdpc: hint: ..."; a checkpoint that
# does not fit the model is labelled by what differs, not as a rank
# disagreement; --device cuda on a CPU build is one line with a hint.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-errors.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

sh "$top_srcdir/tests/corpus.sh" 100000 > "$W/text"
head -c 100 "$W/text" > "$W/short.txt"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-data" tokenize "$W/short.txt" -o "$W/short.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
        -o "$W/m.h5" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 1 --heads 2 --width 32 --context 64 --vocab 64 \
        -o "$W/v64.h5" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 3 --heads 2 --width 32 --context 64 --seed 1 \
        -o "$W/m3.h5" > /dev/null 2>&1
tap_ok $? "fixtures: token files and models"

base="--batch-size 4 --seq-len 64 --steps 2 --lr 1e-3 --peak-flops 1e11"

# ---------------------------------------------------------------------------
# every run of 20 under mpiexec -n 2, piped: the line once, a hint once

# once N NAME PATTERN ARGS...: N piped runs on 2 ranks, each failing with
# exactly one line matching PATTERN and one hint line
once() {
    o_runs=$1 o_name=$2 o_pat=$3
    shift 3
    o_bad=0 o_seen=""
    for i in $(seq "$o_runs"); do
        # shellcheck disable=SC2086
        { timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $base "$@"; echo "rc $?" > "$W/rc"; } 2>&1 |
            cat > "$W/once.out"
        n=$(grep -c -- "$o_pat" "$W/once.out")
        h=$(grep -c '^fsdpc: hint: ' "$W/once.out")
        e=$(grep '^fsdpc: ' "$W/once.out" | grep -vc '^fsdpc: hint: ')
        if [ "$n" -ne 1 ] || [ "$h" -ne 1 ] || [ "$e" -ne 1 ] || [ "$(cat "$W/rc")" != "rc 1" ]; then
            o_bad=$((o_bad + 1))
            o_seen="run $i: $(cat "$W/rc"), $n matching, $e error lines, $h hints"
        fi
    done
    [ $o_bad -eq 0 ] || tap_diag "$o_name: $o_bad of $o_runs runs wrong; last: $o_seen"
    [ $o_bad -eq 0 ] || tap_diag "$(grep '^fsdpc' "$W/once.out")"
    return $o_bad
}

if command -v "$MPIEXEC" > /dev/null 2>&1; then
    once 20 "missing model" "^fsdpc: rank 0 on .*: model: $W/none.h5: cannot open: No such file" \
        --model "$W/none.h5" --data "$W/train.bin"
    tap_ok $? "a missing model file on 2 ranks: one line and one hint, in each of 20 piped runs"
    once 20 "mesh product" "mesh 'dp=3' has 3 ranks (3) but the world has 2" \
        --model "$W/m.h5" --data "$W/train.bin" --mesh dp=3
    tap_ok $? "a mesh that does not fit 2 ranks: one line and one hint, in each of 20 piped runs"
    once 20 "data too short" "short.bin: 100 tokens, but one global batch .* needs 513" \
        --model "$W/m.h5" --data "$W/short.bin"
    tap_ok $? "a data file shorter than one global batch: one line and one hint, in each of 20 piped runs"
    once 5 "bad option" "options: unknown option --bogus" --model "$W/m.h5" --data "$W/train.bin" \
        --bogus 1
    tap_ok $? "an unknown option on 2 ranks: one line and one hint, in each of 5 piped runs"
    [ "$(grep -c . "$W/once.out")" -eq 2 ]
    tap_ok $? "an unknown option: nothing but the line and the hint (no start-up log before them)"
    # a learning rate that blows up: the ranks reduce the norm, so all stop at once
    once 5 "non-finite norm" "step [0-9]*: gradient norm is .*: parameters left unchanged" \
        --model "$W/m.h5" --data "$W/train.bin" --lr 900 --clip 0 --steps 50
    tap_ok $? "a non-finite gradient norm on 2 ranks: one line and one hint, in each of 5 piped runs"
else
    for i in 1 2 3 4 5; do tap_skip_dep mpiexec "no MPIEXEC"; done
fi

# ---------------------------------------------------------------------------
# the common errors carry a hint naming what to check or the flag that fixes it

# hint NAME ERROR-PATTERN HINT-PATTERN ARGS...: one error line, one hint line
hint() {
    h_name=$1 h_err=$2 h_hint=$3
    shift 3
    "$TRAIN" "$@" > "$W/h.out" 2> "$W/h.err"
    h_rc=$?
    if [ $h_rc -eq 1 ] && [ "$(grep -c . "$W/h.err")" -eq 2 ] &&
        head -n 1 "$W/h.err" | grep -q -- "$h_err" &&
        sed -n 2p "$W/h.err" | grep -q -- "^fsdpc: hint: .*$h_hint"; then
        tap_ok 0 "$h_name"
    else
        tap_diag "rc $h_rc: $(cat "$W/h.err")"
        tap_ok 1 "$h_name"
    fi
}

# shellcheck disable=SC2086
hint "seq-len above the context: lower --seq-len to at most 64" \
    "seq-len 128 is longer than the context 64" "lower --seq-len to at most 64" \
    --model "$W/m.h5" --data "$W/train.bin" $base --seq-len 128
# shellcheck disable=SC2086
hint "data too short: more text, or a smaller --batch-size or --seq-len" \
    "one global batch" "lower --batch-size or --seq-len" \
    --model "$W/m.h5" --data "$W/short.bin" $base
# shellcheck disable=SC2086
hint "tokens outside the vocabulary: tokenize for the model" \
    "token 65 at position 0 is outside the vocabulary (vocab_size 64)" "fsdpc-data tokenize" \
    --model "$W/v64.h5" --data "$W/train.bin" $base
# shellcheck disable=SC2086
hint "a missing model file: how to make one" "model: $W/none.h5: cannot open" \
    "fsdpc-ckpt init" --model "$W/none.h5" --data "$W/train.bin" $base
# shellcheck disable=SC2086
hint "a missing data file: how to make one" "data: $W/none.bin: cannot open" \
    "fsdpc-data tokenize" --model "$W/m.h5" --data "$W/none.bin" $base
# shellcheck disable=SC2086
hint "an unknown option: --help lists them" "unknown option --bach-size (did you mean --batch-size?)" \
    "fsdpc-train --help" --model "$W/m.h5" --data "$W/train.bin" $base --bach-size 2
# shellcheck disable=SC2086
# (a CPU build: not a device of it; a build with the CUDA toolkit but not its
# kernels: says how to build them)
hint "--device cuda on a build without the CUDA kernels" "device: device 'cuda': " \
    "--device cpu always works" --model "$W/m.h5" --data "$W/train.bin" $base --device cuda
# shellcheck disable=SC2086
hint "an unwritable --out, before training" "cannot write in directory $W/no/such" "mkdir -p" \
    --model "$W/m.h5" --data "$W/train.bin" $base --out "$W/no/such/m.h5"
# shellcheck disable=SC2086
hint "--resume required without a checkpoint" "resume required: ckpt-dir $W/typo does not exist" \
    "check --ckpt-dir" --model "$W/m.h5" --data "$W/train.bin" $base --ckpt-dir "$W/typo" \
    --resume required
[ ! -e "$W/typo" ]
tap_ok $? "--resume required does not create the directory it refuses"

# a mesh that cannot work is refused before any group is built for it, with
# a --mesh that works
# shellcheck disable=SC2086
hint "a mesh dimension typo: the nearest name, and the mesh with it" \
    "mesh pt=2: dimension 'pt' is not one the trainer uses (did you mean 'tp'?)" "--mesh tp=2$" \
    --model "$W/m.h5" --data "$W/train.bin" $base --mesh pt=2
# shellcheck disable=SC2086
hint "a mesh without a shard dimension: add dp" \
    "mesh rdp=1: the sharding engine needs a 'dp' dimension" "--mesh rdp=1,dp=1$" \
    --model "$W/m.h5" --data "$W/train.bin" $base --mesh rdp=1
if command -v "$MPIEXEC" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset llama-tiny --kv-heads 1 -o "$W/mqa.h5" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    FSDPC_LOG=info timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --model "$W/m.h5" --data "$W/train.bin" \
        $base --mesh pt=2 > "$W/pt.out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "did you mean 'tp'" "$W/pt.out" && ! grep -q '\] dim pt' "$W/pt.out"
    r=$?
    [ $r -eq 0 ] || tap_diag "rc $rc: $(grep -v '^[#a-z]' "$W/pt.out" | tail -5)"
    tap_ok $r "--mesh pt=2 on 2 ranks: refused before a group is built for 'pt' (rc $rc)"
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --model "$W/mqa.h5" --data "$W/train.bin" $base \
        --mesh tp=2 > "$W/tp.out" 2>&1
    rc=$?
    [ $rc -eq 1 ] &&
        grep -q "^fsdpc: .*mesh tp=2: n_kv_head 1 is not divisible by tp 2" "$W/tp.out" &&
        grep -q "^fsdpc: hint: tp sizes that split this model on 2 ranks: 1; --mesh dp=2$" "$W/tp.out"
    r=$?
    [ $r -eq 0 ] || tap_diag "rc $rc: $(grep '^fsdpc' "$W/tp.out")"
    tap_ok $r "tp not dividing the key/value heads: the tp sizes that do, and a mesh (rc $rc)"
else
    for i in 1 2; do tap_skip_dep mpiexec "no MPIEXEC"; done
fi

# a checkpoint that does not fit the model: what differs, with both values
# shellcheck disable=SC2086
"$TRAIN" --model "$W/m.h5" --data "$W/train.bin" $base --ckpt-dir "$W/ck" > /dev/null 2>&1
# shellcheck disable=SC2086
hint "a checkpoint of another model: what differs, with both values" \
    "the checkpoint's model (gpt2 .*) is not the model of $W/m3.h5: n_layer is 2 in the checkpoint and 3 in the model (invalid argument)" \
    "--model must be the model the checkpoint was trained from" \
    --model "$W/m3.h5" --data "$W/train.bin" $base --ckpt-dir "$W/ck" --resume latest
! grep -q "ranks disagree" "$W/h.err"
tap_ok $? "the checkpoint/model mismatch is not labelled as a rank disagreement"

tap_done
