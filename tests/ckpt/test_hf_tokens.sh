#!/bin/sh
# test_hf_tokens.sh - the special-token ids from a Hugging Face directory
# through import-hf, a training run and its checkpoint, to export-hf's
# config.json and generation_config.json (hf_tokens_check.py): with them
# transformers' generate() runs to its length while the model keeps
# producing token 2 (an ordinary token of the caller's tokenizer); a model
# without them (fsdpc-ckpt init) exports with a warning and generate() stops
# at 2, transformers' Llama default. Also --tokenizer, --eos-token-id, a list
# of eos ids and an id outside the vocabulary. Needs transformers 4.38.2 at
# $top_builddir/hf-venv (FSDPC_HF_PYTHON overrides); skips without.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
CKPT="$BIN/fsdpc-ckpt"
PYHF=${FSDPC_HF_PYTHON:-$top_builddir/hf-venv/bin/python}
HELP="$top_srcdir/tests/ckpt/hf_tokens_check.py"

if [ ! -x "$PYHF" ] || ! "$PYHF" -c 'import transformers, torch' > /dev/null 2>&1; then
    tap_skip_dep hf-venv "no transformers at $PYHF: make it with /usr/bin/python3 -m venv \
--system-site-packages $top_builddir/hf-venv && $top_builddir/hf-venv/bin/pip install \
transformers==4.38.2"
    tap_done
    exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-hf-tokens.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

# ids ... : hf_tokens_check.py ids, as one test
ids() {
    out=$("$PYHF" "$HELP" ids "$@" 2>&1)
    r=$?
    [ $r -eq 0 ] || tap_diag "$out"
    tap_ok $r "$(basename "$1"): $out"
}

sh "$top_srcdir/tests/corpus.sh" 20000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1 &&
    "$PYHF" "$HELP" make "$W/hf" >> "$W/log" 2>&1 &&
    "$CKPT" import-hf "$W/hf" -o "$W/m.h5" > "$W/import.out" 2>&1 &&
    "$BIN/fsdpc-train" --model "$W/m.h5" --data "$W/tok.bin" --steps 2 --batch-size 2 \
        --seq-len 32 --lr 1e-3 --peak-flops 1e11 --ckpt-dir "$W/ck" >> "$W/log" 2>&1 &&
    "$CKPT" export-hf "$W/ck" -o "$W/out" > "$W/export.out" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -5 "$W/log" "$W/import.out" "$W/export.out")"
tap_ok $r "a directory with bos 260 / eos 261 imported, trained 2 steps into a checkpoint, exported"
grep -q "special tokens: bos_token_id 260, eos_token_id 261" "$W/import.out" &&
    grep -q "special tokens: bos_token_id 260, eos_token_id 261" "$W/export.out"
tap_ok $? "import-hf and export-hf say which ids they carry"
"$CKPT" inspect "$W/m.h5" 2>&1 | grep -q '^tokens        bos_token_id 260, eos_token_id 261' &&
    "$CKPT" inspect "$W/ck/latest/index.h5" 2>&1 |
    grep -q '^tokens        bos_token_id 260, eos_token_id 261'
tap_ok $? "inspect shows them, in the imported model file and in the checkpoint's index.h5"
ids "$W/out" 260 261
out=$("$PYHF" "$HELP" generate "$W/out" 100 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "generate() on the export runs its 100 tokens through token 2 ($(echo "$out" | tail -n 1))"

# the failure this guards against: no ids, transformers' default eos 2
"$CKPT" init --preset llama-tiny --vocab 264 -o "$W/init.h5" > /dev/null 2>&1 &&
    "$CKPT" export-hf "$W/init.h5" -o "$W/bare" > "$W/bare.out" 2>&1
r=$?
[ $r -eq 0 ] && grep -q "WARN.*no eos_token_id in .*init.h5.*--eos-token-id" "$W/bare.out"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/bare.out")"
tap_ok $r "a model without ids exports with a warning naming the way out"
ids "$W/bare" none none
out=$("$PYHF" "$HELP" generate "$W/bare" 100 2>&1)
r=$?
tap_diag "$out"
[ $r -ne 0 ] && echo "$out" | grep -q "^1 of 100 new tokens"
tap_ok $? "without them generate() stops at token 2 after one token ($(echo "$out" | tail -n 1))"

# a tokenizer.json: no post-processor template, so <|endoftext|> (262) both
/usr/bin/python3 "$top_srcdir/tests/io/hf_tokenizer.py" tiny "$W/tok.json" &&
    "$CKPT" export-hf "$W/init.h5" --tokenizer "$W/tok.json" -o "$W/tk" > "$W/tk.out" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/tk.out")"
tap_ok $r "export-hf --tokenizer"
ids "$W/tk" 262 262
"$CKPT" export-hf "$W/ck" --eos-token-id 7 -o "$W/e7" > /dev/null 2>&1
ids "$W/e7" 260 7

# a list of eos ids in generation_config.json: the first, with a warning
"$PYHF" "$HELP" make "$W/hl" --eos-list > /dev/null 2>&1 &&
    "$CKPT" import-hf "$W/hl" -o "$W/hl.h5" > "$W/hl.out" 2>&1 &&
    grep -q "WARN.*eos_token_id lists 2 ids.*261" "$W/hl.out" &&
    grep -q "bos_token_id 260, eos_token_id 261" "$W/hl.out"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/hl.out")"
tap_ok $r "an eos list in generation_config.json: its first id (over config.json's), warned"

out=$("$CKPT" export-hf "$W/ck" --eos-token-id 264 -o "$W/bad" 2>&1)
r=$?
[ $r -eq 1 ] && [ "$(echo "$out" | wc -l)" -le 2 ] && echo "$out" | grep -q "in \[0, 264)" &&
    [ ! -e "$W/bad" ]
r=$?
[ $r -eq 0 ] || tap_diag "$out"
tap_ok $r "--eos-token-id outside the vocabulary: one line, nothing written"

tap_done
