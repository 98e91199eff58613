#!/bin/sh
# test_hf_dir.sh - fsdpc-ckpt import-hf / export-hf against Hugging Face
# transformers 4.38 (hf_dir_check.py). Random-weight models written by
# save_pretrained: LlamaForCausalLM (GQA tied f32 and untied bf16 with linear
# rope scaling, sharded by a small max_shard_size so that an index is
# written; MQA untied f32 in shards too), MistralForCausalLM (no sliding
# window), Qwen2ForCausalLM (q/k/v biases) and GPT2LMHeadModel. Each is
# imported, fsdpc's first training step (tests/train/oracle_ours --dump) is
# compared with transformers' on the same tokens (loss and logits rel 1e-5,
# every gradient rel 1e-4, f32), then the imported file is exported and the
# directory loaded back with AutoModelForCausalLM.from_pretrained: the same
# logits (rel 1e-5) and the very same parameters. Also: a bf16 model file
# exports the same bytes, a checkpoint exports what its consolidation does,
# GPT-2 under bare names, Llama 3.1 rope_scaling through import and export,
# --force, and one clear line for each kind of bad directory. Needs the
# Python environment with transformers 4.38.2 at $top_builddir/hf-venv
# (FSDPC_HF_PYTHON overrides); skips, naming it, without.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
CKPT="$BIN/fsdpc-ckpt"
PYHF=${FSDPC_HF_PYTHON:-$top_builddir/hf-venv/bin/python}
HELP="$top_srcdir/tests/ckpt/hf_dir_check.py"

if [ ! -x "$PYHF" ]; then
    tap_skip_dep hf-venv "no $PYHF: make it with /usr/bin/python3 -m venv \
--system-site-packages $top_builddir/hf-venv && $top_builddir/hf-venv/bin/pip install \
transformers==4.38.2"
    tap_done
    exit 0
fi
if ! why=$("$PYHF" "$HELP" check 2>&1); then
    tap_skip_dep hf-venv "$PYHF: $why"
    tap_done
    exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-hf-dir.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

sh "$top_srcdir/tests/corpus.sh" 20000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1 &&
    "$PYHF" "$HELP" make --out "$W" >> "$W/log" 2>&1 &&
    [ -f "$W/llama-gqa-tied-f32/model.safetensors.index.json" ] &&
    [ -f "$W/llama-gqa-untied-bf16/model.safetensors.index.json" ]
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -5 "$W/log")"
tap_ok $r "token file; transformers wrote $("$PYHF" "$HELP" make --list | wc -w) models (Llama ones in indexed shards)"

# case NAME EXPORT-FLAGS...: import, fsdpc's first step against transformers,
# export, the export loaded back
case_() {
    c=$1
    shift
    "$CKPT" import-hf "$W/$c" -o "$W/$c.h5" > "$W/log" 2>&1 &&
        "$BIN/tests/train/oracle_ours" --dump "$W/$c.ours.h5" --model "$W/$c.h5" \
            --data "$W/tok.bin" --batch-size 2 --seq-len 32 --steps 1 --lr 1e-3 \
            --peak-flops 1e11 --log-every 1000 >> "$W/log" 2>&1 &&
        "$CKPT" export-hf "$W/$c.h5" -o "$W/$c.out" "$@" >> "$W/log" 2>&1
    r=$?
    [ $r -eq 0 ] || tap_diag "$(tail -5 "$W/log")"
    tap_ok $r "$c: import-hf, fsdpc's first step, export-hf ($(tail -n 1 "$W/log" | sed 's/.* in //'))"
    out=$("$PYHF" "$HELP" compare --hf "$W/$c" --ours "$W/$c.ours.h5" --data "$W/tok.bin" \
        --batch-size 2 --seq-len 32 --export "$W/$c.out" --exact 2>&1)
    r=$?
    tap_diag "$out"
    tap_ok $r "$c: loss, logits and every gradient match transformers; the export loads back with the same logits and parameters ($(echo "$out" | tail -n 1))"
}

case_ llama-gqa-tied-f32 --max-shard-size 30KB
case_ llama-gqa-untied-bf16 --dtype bf16 --max-shard-size 20KiB
case_ llama-mqa-untied-f32
case_ mistral
case_ qwen2 --max-shard-size 0.05MB
case_ gpt2 --max-shard-size 50KB

# a bf16 model file exports the bytes the f32 one does in bf16
"$CKPT" import-hf "$W/llama-gqa-untied-bf16" --dtype bf16 -o "$W/b16.h5" > /dev/null 2>&1 &&
    "$CKPT" export-hf "$W/b16.h5" --dtype bf16 --max-shard-size 20KiB -o "$W/b16.out" \
        > /dev/null 2>&1 &&
    diff -r "$W/b16.out" "$W/llama-gqa-untied-bf16.out" > /dev/null
tap_ok $? "bf16 source into a bf16 model file: export byte-identical to the f32 file's bf16 export"

# GPT-2 under bare names (h.0..., a GPT2Model's save) is the same model
"$PYHF" "$HELP" variant --kind bare --src "$W/gpt2" --out "$W/gpt2-bare" > /dev/null 2>&1 &&
    "$CKPT" import-hf "$W/gpt2-bare" -o "$W/gpt2-bare.h5" > /dev/null 2>&1 &&
    "$CKPT" export-hf "$W/gpt2-bare.h5" --max-shard-size 50KB -o "$W/gpt2-bare.out" \
        > /dev/null 2>&1 &&
    diff -r "$W/gpt2-bare.out" "$W/gpt2.out" > /dev/null
tap_ok $? "gpt2 under bare names (h.0.attn.c_attn.weight ...) imports to the same model"

# a checkpoint (its root) exports what its consolidated model file does
"$BIN/fsdpc-train" --model "$W/llama-gqa-tied-f32.h5" --data "$W/tok.bin" --seq-len 32 \
    --batch-size 2 --steps 2 --lr 1e-3 --warmup 1 --peak-flops 1e11 --timeout 30 \
    --ckpt-dir "$W/ck" > "$W/log" 2>&1 &&
    "$CKPT" export-hf "$W/ck" -o "$W/ck.out" > /dev/null 2>&1 &&
    "$CKPT" consolidate "$W/ck" -o "$W/ck.h5" > /dev/null 2>&1 &&
    "$CKPT" export-hf "$W/ck.h5" -o "$W/ck2.out" > /dev/null 2>&1 &&
    diff -r "$W/ck.out" "$W/ck2.out" > /dev/null
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -5 "$W/log")"
tap_ok $r "a checkpoint root exports the same directory as its consolidated model file"

# Llama 3.1's rope_scaling: read into the file's attributes, written back
"$PYHF" "$HELP" variant --kind llama3 --src "$W/llama-mqa-untied-f32" --out "$W/l3" \
    > /dev/null 2>&1 &&
    "$CKPT" import-hf "$W/l3" -o "$W/l3.h5" > /dev/null 2>&1 &&
    "$CKPT" inspect "$W/l3.h5" | grep -q "rope_scaling 2, rope_factor 8, rope_low_freq_factor 1, rope_high_freq_factor 4, rope_original_context 16" &&
    "$CKPT" export-hf "$W/l3.h5" -o "$W/l3.out" > /dev/null 2>&1 &&
    /usr/bin/python3 - "$W/l3.out/config.json" "$W/l3/config.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["rope_scaling"] == b["rope_scaling"], (a["rope_scaling"], b["rope_scaling"])
for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
          "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
    assert a[k] == b[k], (k, a[k], b[k])
PY
tap_ok $? "llama3 rope_scaling: imported into the attributes, exported as Llama 3.1 writes it"

# export into an existing directory: refused without --force, replaced with it
cp -r "$W/qwen2" "$W/busy"
"$CKPT" export-hf "$W/mistral.h5" -o "$W/busy" > /dev/null 2> "$W/err"
r=$?
[ $r -ne 0 ] && [ "$(grep -c . "$W/err")" -eq 1 ] &&
    grep -q "busy exists and is not empty (--force replaces it)" "$W/err" &&
    diff -r "$W/busy" "$W/qwen2" > /dev/null
r=$?
tap_diag "$(cat "$W/err")"
tap_ok $r "an existing directory is refused in one line and left as it was"
"$CKPT" export-hf "$W/mistral.h5" -o "$W/busy/" --force > /dev/null 2>&1 &&
    diff -r "$W/busy" "$W/mistral.out" > /dev/null && [ -z "$(ls -d "$W"/busy.tmp.* 2> /dev/null)" ]
tap_ok $? "--force replaces it whole, nothing left beside it"

"$PYHF" "$HELP" bad --good "$W/llama-gqa-untied-bf16" --out "$W/bad" > "$W/log" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -5 "$W/log")"
tap_ok $r "damaged directories written"

# bad KIND PATTERN: import fails with one line matching PATTERN, nothing written
bad() {
    "$CKPT" import-hf "$W/bad/$1" -o "$W/out.h5" > /dev/null 2> "$W/err"
    rc=$?
    [ $rc -ne 0 ] && [ "$(grep -c . "$W/err")" -eq 1 ] && grep -q -- "$2" "$W/err" &&
        [ ! -e "$W/out.h5" ] && [ -z "$(ls "$W" | grep '^out\.h5\.tmp')" ]
    r=$?
    tap_diag "$(cat "$W/err")"
    tap_ok $r "$1: one clear line (rc $rc)"
}
bad model_type 'config.json: model_type "falcon" is not one fsdpc reads (gpt2, llama, mistral, qwen2)'
bad nokey "config.json: 'hidden_size' is missing"
bad notjson 'config.json: not valid JSON: '
bad shape "model-000.*: tensor 'model.layers.0.self_attn.k_proj.weight' has shape (64, 64) but config.json makes it (32, 64)"
bad missing "tensor 'model.layers.1.mlp.up_proj.weight' is missing"
bad noshard "shard 'model-00012-of-00012.safetensors' named in the index is missing"
bad twoshards "tensor 'model.layers.0.self_attn.k_proj.weight' is in both .*model-000.* and .*model-000"
bad unexpected "unexpected tensor 'model.layers.0.mlp.extra.weight'"
bad wrongshard "weight_map puts 'model.layers.0.self_attn.k_proj.weight' in model-000.*, which does not hold it"
bad escape "weight_map puts .* in '../model-000.*', which is not a file name inside the directory"
bad window "'sliding_window' is 16, below max_position_embeddings 64"
bad attention_bias "'attention_bias' is true; fsdpc reads only false"
bad rope_dynamic "'rope_scaling.type' is \"dynamic\"; fsdpc has \"linear\" and \"llama3\""
bad tied_head "lm_head.weight differs from model.embed_tokens.weight, but config.json ties them"
bad heads "config.json: a model fsdpc cannot build: n_head 4 is not divisible by n_kv_head 3"
bad alias "both 'model.norm.weight' and 'norm.weight' are present: one tensor under two names"

"$CKPT" export-hf "$W/qwen2.h5" -o "$W/x" --max-shard-size 5XB > /dev/null 2> "$W/err"
[ $? -ne 0 ] && grep -q "max-shard-size '5XB' must be a positive size" "$W/err" && [ ! -e "$W/x" ]
tap_ok $? "export-hf: a bad --max-shard-size is refused"

tap_done
