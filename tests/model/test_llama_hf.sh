#!/bin/sh
# test_llama_hf.sh - fsdpc's Llama family against Hugging Face transformers
# 4.38 on the same weights and batch (llama_hf_check.py): the logits and the
# loss (rel 1e-5) and every parameter's gradient (rel 1e-4), in f32, of
#   LlamaForCausalLM    grouped-query, tied, no rope scaling
#   LlamaForCausalLM    multi-query, untied, linear rope scaling
#   LlamaForCausalLM    llama3 rope scaling (Llama 3.2 1B's, shrunk): transformers
#                       4.38 predates it, so against a port of its
#                       _compute_llama3_parameters (see llama_hf_check.py)
#   Qwen2ForCausalLM    q/k/v biases
#   MistralForCausalLM  no sliding window, rope_theta 1e6
# The weights are moved off their init first (llama_hf_check.py perturb)
# so that attention is far from uniform. fsdpc's side is the trainer's first
# step (tests/train/oracle_ours --dump). Needs the Python environment with
# transformers 4.38.2 at $top_builddir/hf-venv (FSDPC_HF_PYTHON overrides);
# skips, naming it, without.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
PYHF=${FSDPC_HF_PYTHON:-$top_builddir/hf-venv/bin/python}
CHECK="$top_srcdir/tests/model/llama_hf_check.py"

if [ ! -x "$PYHF" ]; then
    tap_skip_dep hf-venv "no $PYHF: make it with /usr/bin/python3 -m venv \
--system-site-packages $top_builddir/hf-venv && $top_builddir/hf-venv/bin/pip install \
transformers==4.38.2"
    tap_done
    exit 0
fi
if ! why=$("$PYHF" "$CHECK" check 2>&1); then
    tap_skip_dep hf-venv "$PYHF: $why"
    tap_done
    exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-llama-hf.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

sh "$top_srcdir/tests/corpus.sh" 20000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"

# case NAME FAMILY INIT-FLAGS...: init, perturb, fsdpc's first step, compare
case_() {
    c_name=$1 c_family=$2
    shift 2
    "$BIN/fsdpc-ckpt" init --layers 2 --width 64 --ffn 96 --context 64 "$@" \
        -o "$W/$c_name.0.h5" > "$W/log" 2>&1 &&
        "$PYHF" "$CHECK" perturb --model "$W/$c_name.0.h5" --out "$W/$c_name.h5" >> "$W/log" 2>&1 &&
        "$BIN/tests/train/oracle_ours" --dump "$W/$c_name.ours.h5" --model "$W/$c_name.h5" \
            --data "$W/tok.bin" --batch-size 2 --seq-len 32 --steps 1 --lr 1e-3 \
            --peak-flops 1e11 --log-every 1000 >> "$W/log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$(tail -5 "$W/log")"
    tap_ok $rc "$c_name: model file and fsdpc's first step"
    out=$("$PYHF" "$CHECK" compare --family "$c_family" --model "$W/$c_name.h5" \
        --data "$W/tok.bin" --ours "$W/$c_name.ours.h5" --batch-size 2 --seq-len 32 2>&1)
    rc=$?
    tap_diag "$out"
    tap_ok $rc "$c_name: logits, loss and every gradient match transformers ($(echo "$out" |
        grep -v '^grad\|^logits\|^loss' | tail -n 1))"
}

case_ gqa-tied llama --preset llama-tiny --seed 3
case_ mqa-linear llama --preset llama-tiny --kv-heads 1 --untied --rope-scaling linear \
    --rope-factor 2 --seed 4
case_ llama3 llama --preset llama-1b --heads 4 --kv-heads 2 --vocab 256 --seed 5
case_ qwen2-bias llama --preset llama-tiny --attn-bias --untied --seed 6
case_ mistral mistral --preset llama-tiny --untied --rope-theta 1e6 --seed 7
tap_done
