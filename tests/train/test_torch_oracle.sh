#!/bin/sh
# test_torch_oracle.sh - fsdpc against PyTorch on the same GPT-2 and batch:
# logits, loss, every parameter's gradient, and 10 AdamW steps with warm-up,
# decay, weight decay and clipping (per-step losses and gradient norms, then
# every weight and both AdamW moments after the last step), for a tied and
# an untied model (the untied one with 2 micro-steps of gradient
# accumulation and a weight decay large enough that a tensor decayed when it
# should not be, or not when it should, moves far outside the tolerance).
# The decay groups come from torch_oracle.py's own statement of GPT-2's
# policy, not from fsdpc's parameter table.
# Needs Debian's python3-torch and python3-h5py for /usr/bin/python3; skips
# (with the reason) when they do not import.
. "$top_srcdir/tests/tap.sh"

PY=/usr/bin/python3
ORACLE="$top_srcdir/tests/train/torch_oracle.py"
BIN="$top_builddir"

if [ ! -x "$PY" ]; then
    tap_skip_dep python3-torch "no $PY (the oracle needs Debian's python3-torch and python3-h5py)"
    tap_done
    exit 0
fi
if ! why=$("$PY" "$ORACLE" check 2>&1); then
    tap_skip_dep python3-torch "torch/h5py not importable by $PY: $why"
    tap_done
    exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-oracle.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

# byte-level text: the test corpus
sh "$top_srcdir/tests/corpus.sh" 133000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file from the test corpus"

# variant name, init flags, training flags
oracle() {
    name=$1 init=$2 flags=$3
    # shellcheck disable=SC2086
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 256 --context 32 $init \
        -o "$W/$name.h5" > "$W/log" 2>&1
    tap_ok $? "$name: model V=256 T=32 L=2 NH=2 C=32"
    # shellcheck disable=SC2086
    "$PY" "$ORACLE" reference --model "$W/$name.h5" --data "$W/tok.bin" --out "$W/$name.ref.h5" \
        $flags > "$W/log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$(cat "$W/log")"
    tap_ok $rc "$name: torch reference ran"
    # shellcheck disable=SC2086
    "$BIN/tests/train/oracle_ours" --dump "$W/$name.ours.h5" --model "$W/$name.h5" \
        --data "$W/tok.bin" --peak-flops 1e11 --log-every 1000 $flags > "$W/log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$(cat "$W/log")"
    tap_ok $rc "$name: fsdpc trainer ran"
    for check in "logits 1e-5" "loss 1e-5" "grads 1e-4" "losses 1e-4" "params 1e-3" \
        "exp_avg 1e-3" "exp_avg_sq 1e-3"; do
        set -- $check
        out=$("$PY" "$ORACLE" compare "$1" "$W/$name.ref.h5" "$W/$name.ours.h5" --tol "$2" 2>&1)
        rc=$?
        echo "$out"
        tap_ok $rc "$name: $1 match torch (rel $2)"
    done
}

common="--batch-size 2 --seq-len 32 --steps 10 --lr 3e-3 --warmup 2 --min-lr 3e-4"
oracle tied "--seed 5" "$common --weight-decay 0.1 --lr-schedule cosine --clip 0.5"
oracle untied "--seed 6 --untied" "$common --weight-decay 1.0 --lr-schedule linear --grad-accum 2 --clip 2.0"

tap_done
