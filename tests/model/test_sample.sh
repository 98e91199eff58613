#!/bin/sh
# test_sample.sh - fsdpc-sample end to end: within the context, the
# key/value cache gives the same text as recomputing the window (greedy, and
# seeded sampling with top-k and top-p) for GPT-2 and Llama; a nucleus of almost nothing is the
# greedy choice; with a Hugging Face tokenizer.json the prompt is text and
# the output is text (valid UTF-8, starting with the prompt), and the
# tokens its post-processor adds go before the prompt (or not, with
# --add-special-tokens off); a tokenizer with more ids than the model's
# vocabulary is one clear line. The text ends with a newline of its own
# (once) before the sampler's log lines, tagged 'sample', go to stderr, also
# when both go to one file.
. "$top_srcdir/tests/tap.sh"
B="$top_builddir"
T=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-sample.XXXXXX")
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3

"$B/fsdpc-ckpt" init --preset tiny --context 64 -o "$T/g.h5" > /dev/null 2>&1 &&
    "$B/fsdpc-ckpt" init --preset llama-tiny --context 64 -o "$T/l.h5" > /dev/null 2>&1
tap_ok $? "gpt2 and llama tiny models"

same() { # same DESC ARGS...: with and without the cache, identical output
    desc=$1
    shift
    "$B/fsdpc-sample" "$@" > "$T/a" 2> "$T/a.err"
    ra=$?
    "$B/fsdpc-sample" "$@" --no-cache > "$T/b" 2> "$T/b.err"
    rb=$?
    [ $ra = 0 ] && [ $rb = 0 ] && [ -s "$T/a" ] && cmp -s "$T/a" "$T/b"
    st=$?
    [ $st = 0 ] || tap_diag "$(head -c 300 "$T/a"; echo; head -c 300 "$T/b"; cat "$T/a.err" "$T/b.err")"
    tap_ok $st "$desc"
}
for m in g l; do
    same "$m: greedy, 40 tokens: the cache gives the text of recomputing the window" \
        --model "$T/$m.h5" --prompt "int main(" --tokens 40 --temperature 0
    same "$m: seeded sampling with top-k 20 and top-p 0.9: the same text with and without cache" \
        --model "$T/$m.h5" --prompt "static " --tokens 40 --temperature 0.8 --top-k 20 \
        --top-p 0.9 --seed 7
done
"$B/fsdpc-sample" --model "$T/l.h5" --prompt "a" --tokens 30 --temperature 0 > "$T/greedy" 2> /dev/null
"$B/fsdpc-sample" --model "$T/l.h5" --prompt "a" --tokens 30 --temperature 1 --top-p 0.000001 \
    --seed 9 > "$T/nucleus" 2> /dev/null
cmp -s "$T/greedy" "$T/nucleus"
tap_ok $? "a nucleus of almost no probability is the most likely token every time"

# a tokenizer: the hand-made one of the tokenizer tests (262 ids + 2 added)
"$PY" "$top_srcdir/tests/io/hf_tokenizer.py" tiny "$T/tok.json" &&
    "$B/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 264 --context 64 \
        -o "$T/v.h5" > /dev/null 2>&1
tap_ok $? "a 264-id tokenizer.json and a model for it"
same "tokenizer: the same text with and without cache" --model "$T/v.h5" \
    --tokenizer "$T/tok.json" --prompt "héllo wörld" --tokens 40 --temperature 0.9 --seed 3
head -c 13 "$T/a" | grep -q "^héllo wörld" && "$PY" -c "
import sys; open(sys.argv[1], 'rb').read().decode('utf-8')" "$T/a"
tap_ok $? "tokenizer: the output starts with the prompt and is valid UTF-8"
"$B/fsdpc-sample" --model "$T/g.h5" --tokenizer "$T/tok.json" --prompt x --tokens 3 \
    > /dev/null 2> "$T/err"
rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$T/err")" -le 2 ] &&
    grep -q "has ids up to 263, but the model's vocabulary is 256" "$T/err"
tap_ok $? "a tokenizer with more ids than the model's vocabulary: one line, exit $rc"

# a tokenizer whose post-processor puts <|endoftext|> (262) first: fed, not printed
"$PY" "$top_srcdir/tests/io/hf_tokenizer.py" tiny "$T/tpl.json" --edit 'post_processor={"type":
  "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
  {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<|endoftext|>":
  {"id": "<|endoftext|>", "ids": [262], "tokens": ["<|endoftext|>"]}}}' &&
    FSDPC_LOG=info "$B/fsdpc-sample" --model "$T/v.h5" --tokenizer "$T/tpl.json" --prompt abc \
        --tokens 5 --temperature 0 > "$T/on" 2> "$T/on.err" &&
    FSDPC_LOG=info "$B/fsdpc-sample" --model "$T/v.h5" --tokenizer "$T/tpl.json" --prompt abc \
        --tokens 5 --temperature 0 --add-special-tokens off > "$T/off" 2> "$T/off.err" &&
    grep -q "prompt: 2 tokens, 1 of them from the tokenizer's post_processor" "$T/on.err" &&
    grep -q "prompt: 1 tokens, 0 of them from the tokenizer's post_processor" "$T/off.err" &&
    head -c 3 "$T/on" | grep -q "^abc" && head -c 3 "$T/off" | grep -q "^abc"
tap_ok $? "the post-processor's <|endoftext|> goes before the prompt, unprinted; --add-special-tokens off leaves it out"
# stdout and stderr into one file: the text's newline comes before the log line
FSDPC_LOG=info "$B/fsdpc-sample" --model "$T/g.h5" --prompt "int main(" --tokens 40 \
    > "$T/both" 2>&1
rc=$?
FSDPC_LOG=info "$B/fsdpc-sample" --model "$T/g.h5" --prompt "int main(" --tokens 40 \
    > "$T/text" 2> "$T/log"
[ $rc -eq 0 ] && [ "$(tail -c 1 "$T/text" | od -An -c | tr -d ' ')" = '\n' ] &&
    [ "$(tail -c 2 "$T/text" | od -An -c | tr -d ' ')" != '\n\n' ] &&
    [ "$(tail -n 1 "$T/both" | grep -c '^\[fsdpc r0 INFO sample\] 40 tokens in ')" -eq 1 ] &&
    ! grep -q 'INFO train' "$T/both" &&
    grep -q '^\[fsdpc r0 INFO sample\] 40 tokens in ' "$T/log" && ! grep -q 'fsdpc r0' "$T/text"
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -c 300 "$T/both")"
tap_ok $r "the text ends with one newline before the log line, tagged sample, on stderr"

tap_done
