#!/bin/sh
# test_tokenizer.sh - fsdpc-data tokenize/decode/inspect with a Hugging Face
# tokenizer.json.
#   - A small tokenizer written by hand (system Python only): known ids,
#     ignore_merges, added tokens, the token file's width, decoding across
#     the decoder's chunks, and every field the loader refuses (one line,
#     non-zero exit, no file left behind).
#   - Against the `tokenizers` package (a venv at $top_builddir/hf-venv, or
#     FSDPC_HF_PYTHON): tokenizers trained here on local text, GPT-2 style
#     (with and without add_prefix_space, after a Split on a string) and
#     Llama 3 style (its Split regex, special tokens, ids above 65535, so
#     uint32 files), token for token on
#     texts with accents, CJK, emoji, mixed whitespace, digit runs,
#     contractions, special tokens and a fuzz text of odd characters; the
#     validation split; decode with and without special tokens, and of
#     random ids whose bytes are seldom UTF-8 (U+FFFD as `tokenizers` puts it).
. "$top_srcdir/tests/tap.sh"
DATA="$top_builddir/fsdpc-data"
HELPER="$top_srcdir/tests/io/hf_tokenizer.py"
PY=${PYTHON3:-python3}
HF=${FSDPC_HF_PYTHON:-$top_builddir/hf-venv/bin/python}
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tokenizer-test.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1

# header int32 number $2 of file $1; the tokens of a version 1 / 2 file
header() { od -An -v -td4 -j$(($2 * 4)) -N4 "$1" | tr -d ' '; }
tokens() {
    w=2; [ "$(header "$1" 1)" = 2 ] && w=4
    od -An -v -tu$w -j1024 "$1" | tr -s ' ' '\n' | sed '/^$/d' | tr '\n' ' '
}

# ----------------------------------------------------------------------------
# The hand-made tokenizer: byte b is id b; merges make ab 256, abc 257, Ġab 258,
# cd 259, Ġabcd 260; abcd 261 is in the vocabulary but no merge makes it;
# <|endoftext|> 262 (special), [X] 263 (added, normalized)

"$PY" "$HELPER" tiny tiny.json && "$PY" "$HELPER" tiny tiny-im.json --ignore-merges &&
    "$PY" "$HELPER" tiny tiny-ps.json --prefix-space
tap_ok $? "hand-made tokenizer.json files"

printf 'abcd abcd' >t1.txt
"$DATA" tokenize --tokenizer tiny.json t1.txt -o t1.bin >out.txt 2>&1
tap_ok $? "tokenize: $(cat out.txt)"
[ "$(tokens t1.bin)" = "257 100 32 257 100 " ]
tap_ok $? "merges by rank: 'abcd abcd' -> abc d Ġ abc d ($(tokens t1.bin))"
[ "$(header t1.bin 0)" = 20240520 ] && [ "$(header t1.bin 1)" = 1 ] &&
    [ "$(header t1.bin 2)" = 5 ] && [ "$(wc -c <t1.bin)" -eq $((1024 + 10)) ]
tap_ok $? "vocab 264: a version 1 file of uint16 tokens"
"$DATA" tokenize --tokenizer tiny.json t1.txt -o tr.bin --val-fraction 0.4 --val-out va.bin \
    >out.txt 2>&1 && [ "$(tokens tr.bin)" = "257 100 32 " ] && [ "$(tokens va.bin)" = "257 100 " ] &&
    grep -q "t1.txt: 9 bytes -> 3 training tokens in tr.bin, 2 validation tokens in va.bin" out.txt
tap_ok $? "--val-fraction 0.4 of 5 tokens: the last 2 are the validation file"
"$DATA" tokenize --tokenizer tiny-im.json t1.txt -o t2.bin >/dev/null 2>&1 &&
    [ "$(tokens t2.bin)" = "261 260 " ]
tap_ok $? "ignore_merges: pieces the vocabulary holds whole are one token ($(tokens t2.bin))"
printf '<|endoftext|>abcd[X]ab<|endoftext|[X' >t3.txt
"$DATA" tokenize --tokenizer tiny.json t3.txt -o t3.bin >/dev/null 2>&1 &&
    [ "$(tokens t3.bin)" = "262 257 100 263 256 60 124 101 110 100 111 102 116 101 120 116 124 91 88 " ]
tap_ok $? "added tokens cut out first, a partial one is text ($(tokens t3.bin))"
printf 'ab<|endoftext|>ab' >t4.txt
"$DATA" tokenize --tokenizer tiny-ps.json t4.txt -o t4.bin >/dev/null 2>&1 &&
    [ "$(tokens t4.bin)" = "258 262 258 " ]
tap_ok $? "add_prefix_space: each piece between added tokens gets one ($(tokens t4.bin))"

"$DATA" decode --tokenizer tiny.json t3.bin -o t3.out >/dev/null 2>&1 && cmp -s t3.txt t3.out
tap_ok $? "decode gives the text back"
[ "$("$DATA" decode --tokenizer tiny.json t3.bin --skip-special)" = 'abcd[X]ab<|endoftext|[X' ]
tap_ok $? "decode --skip-special leaves out <|endoftext|> only"
# a two-byte and a three-byte character across the decoder's 65536-token chunks
"$PY" -c '
import struct, sys
ids = [97] * 65535 + [0xc3, 0xa9] + [97] * 65533 + [0xe2, 0x82, 0xac] + [0xff, 0xc3]
sys.stdout.buffer.write(struct.pack("<3i", 20240520, 1, len(ids)) + bytes(1012) +
                        struct.pack("<%dH" % len(ids), *ids))' >cross.bin
"$DATA" decode --tokenizer tiny.json cross.bin -o cross.out >/dev/null 2>&1 &&
    "$PY" -c '
import sys
want = ("a" * 65535 + "\u00e9" + "a" * 65533 + "\u20ac\ufffd\ufffd").encode()
sys.exit(open(sys.argv[1], "rb").read() != want)' cross.out
tap_ok $? "characters split across decode chunks survive; invalid bytes become U+FFFD"

"$top_builddir/tests/io/tokenizer_api" tiny.json >out.txt 2>&1
rc=$?
[ $rc -ne 0 ] && tap_diag "$(cat out.txt)"
tap_ok $rc "$(tail -n 1 out.txt): encode into an array, ids by name, decode RAW, UTF-8 repair"
"$DATA" inspect t3.bin --tokenizer tiny.json --head 19 >out.txt 2>&1 &&
    grep -q '^format  *llm.c tokens, version 1, uint16' out.txt &&
    grep -q '^as text  *"<|endoftext|>abcd\[X\]ab<|endoftext|\[X"' out.txt
tap_ok $? "inspect --tokenizer prints the first tokens as text"

# errors: one line, non-zero exit, no file left
expect_fail() {
    desc=$1; pattern=$2; shift 2
    "$@" >out.txt 2>err.txt
    rc=$?
    if [ $rc -ne 0 ] && grep -q -F -- "$pattern" err.txt && [ "$(wc -l <err.txt)" -eq 1 ] &&
        ! ls | grep -q -e '^x\.bin' -e '^v\.bin' -e '^x\.txt'; then
        tap_ok 0 "$desc: $(sed 's/^fsdpc: rank 0 on [^:]*: //' err.txt)"
    else
        tap_diag "exit $rc; stderr:"; tap_diag "$(cat err.txt)"
        tap_ok 1 "$desc: expected '$pattern'"
    fi
}
# a tokenizer.json with one field changed (path=JSON value, or DELETE)
bad() { "$PY" "$HELPER" tiny bad.json --edit "$1"; }
refused() {
    desc=$1; edit=$2; pattern=$3
    if bad "$edit"; then
        expect_fail "$desc" "bad.json: $pattern" "$DATA" tokenize --tokenizer bad.json t1.txt -o x.bin
    else
        tap_ok 1 "$desc: could not make the file"
    fi
}
refused "normalizer" 'normalizer={"type": "NFC"}' \
    "normalizer: 'NFC' is not supported (must be null)"
refused "truncation" 'truncation={"max_length": 8}' "truncation: is not supported (must be null)"
bad 'model.type=DELETE' && "$DATA" tokenize --tokenizer bad.json t1.txt -o x.bin >/dev/null 2>&1 &&
    [ "$(tokens x.bin)" = "257 100 32 257 100 " ] && rm -f x.bin
tap_ok $? "a model without 'type' but with merges is read as BPE"
refused "model type" 'model.type="WordPiece"' "model.type: 'WordPiece' is not supported (only BPE)"
refused "BPE dropout" 'model.dropout=0.1' "model.dropout: BPE dropout is not supported"
refused "byte fallback" 'model.byte_fallback=true' "model.byte_fallback: true is not supported"
refused "subword prefix" 'model.continuing_subword_prefix="##"' \
    "model: 'continuing_subword_prefix' is not supported"
refused "unknown model key" 'model.frobnicate=1' "model: unknown key 'frobnicate'"
refused "unknown top-level key" 'frobnicate=1' "top level: unknown key 'frobnicate'"
refused "merge of three symbols" 'model.merges.0="a b c"' \
    "model.merges[0]: expected two symbols separated by one space"
refused "merge outside the vocabulary" 'model.merges.1="x y"' \
    "model.merges[1]: the merged token 'xy' is not in model.vocab"
refused "merge of an unknown symbol" 'model.merges.1="zz y"' \
    "model.merges[1]: 'zz' is not in model.vocab"
refused "a byte without its symbol" 'model.vocab.Ā=DELETE' \
    "model.vocab: no symbol for byte 0x00"
refused "two tokens, one id" 'model.vocab.a=98' "model.vocab: 'a' and 'b' share id 98"
refused "a negative id" 'model.vocab.a=-1' "model.vocab['a']: id must be an integer in [0, 4194304)"
refused "pre-tokenizer type" 'pre_tokenizer={"type": "Whitespace"}' \
    "pre_tokenizer.type: 'Whitespace' is not supported"
refused "no pre-tokenizer" 'pre_tokenizer=null' "pre_tokenizer: null is not supported"
seq='{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "RE"},
  "behavior": "BEH", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false,
  "trim_offsets": true, "use_regex": false}]}'
refused "Split behavior" "pre_tokenizer=$(echo "$seq" | sed 's/RE/a/; s/BEH/Removed/')" \
    "pre_tokenizer.pretokenizers[0].behavior: 'Removed' is not supported (only Isolated)"
refused "a pattern that does not compile" \
    "pre_tokenizer=$(echo "$seq" | sed 's/RE/(/; s/BEH/Isolated/')" \
    "pre_tokenizer.pretokenizers[0].pattern: the pattern does not compile"
refused "a pattern that matches nothing" \
    "pre_tokenizer=$(echo "$seq" | sed 's/RE/a*/; s/BEH/Isolated/')" \
    "pre_tokenizer.pretokenizers[0].pattern: a pattern that can match the empty string"
refused "ByteLevel not last" \
    'pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "ByteLevel"}]}' \
    "pre_tokenizer.pretokenizers[0]: 'ByteLevel' is not supported here"
refused "lstrip" 'added_tokens.0.lstrip=true' \
    "added_tokens[0]: 'lstrip' true is not supported (token '<|endoftext|>')"
refused "single_word" 'added_tokens.1.single_word=true' "added_tokens[1]: 'single_word' true"
refused "an added id of another token" 'added_tokens.0.id=97' \
    "added_tokens[0]: id 97 belongs to another token of model.vocab"
refused "an added token repeated" 'added_tokens.1.content="<|endoftext|>"' \
    "added_tokens[1]: '<|endoftext|>' (id 263) repeats added_tokens[0]"
refused "decoder" 'decoder={"type": "Metaspace"}' "decoder.type: 'Metaspace' is not supported"
tpl='{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "S", "type_id": 0}},
  {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"S": {"id": "S",
  "ids": [IDS], "tokens": ["S"]}}}'
refused "a template's special token without ids" \
    "post_processor=$(echo "$tpl" | sed 's/"special_tokens": {"S"/"special_tokens": {"T"/; s/IDS/1/')" \
    "post_processor.single[0]: special token 'S' has no 'ids' list under special_tokens"
refused "a template's id outside the vocabulary" "post_processor=$(echo "$tpl" | sed 's/IDS/264/')" \
    "post_processor.single[0]: special_tokens['S'].ids[0]: id 264 is not in the vocabulary (ids below 264)"
refused "a template without the sequence" \
    "post_processor=$(echo "$tpl" | sed 's/"Sequence": {"id": "A"/"Sequence": {"id": "B"/; s/IDS/1/')" \
    "post_processor.single[1]: the single template holds the sequence \"A\" once ('B' here)"
# a template puts its tokens around the text; another type loads and is refused only when applied
"$PY" "$HELPER" tiny tpl.json --edit "post_processor=$(echo "$tpl" | sed 's/IDS/262, 97/')" &&
    [ "$("$top_builddir/tests/io/tokenizer_api" --special tpl.json abc)" = "262 97 257" ]
tap_ok $? "TemplateProcessing: the single template's ids before the text ('S' is 262 97)"
"$PY" "$HELPER" tiny bert.json --edit 'post_processor={"type": "BertProcessing"}' &&
    "$DATA" tokenize --tokenizer bert.json t1.txt -o bert.bin >/dev/null 2>&1 && rm -f bert.bin &&
    "$top_builddir/tests/io/tokenizer_api" --special bert.json abc >out.txt 2>&1
[ $? -ne 0 ] && grep -q "bert.json: post_processor: 'BertProcessing' is not applied here" out.txt
tap_ok $? "another post-processor type loads, and applying it is refused: $(cat out.txt)"
refused "no decoder" 'decoder=null' "decoder: null is not supported (ByteLevel)"
printf '{"model": {"type": ' >bad.json
expect_fail "not JSON" "bad.json: not valid JSON: " "$DATA" tokenize --tokenizer bad.json t1.txt -o x.bin
printf '[1, 2]' >bad.json
expect_fail "JSON, not a tokenizer" "bad.json: not a tokenizer.json" \
    "$DATA" tokenize --tokenizer bad.json t1.txt -o x.bin
expect_fail "missing tokenizer" "nope.json: cannot open: No such file" \
    "$DATA" tokenize --tokenizer nope.json t1.txt -o x.bin
printf 'ab\377cd' >bad.txt
expect_fail "text not UTF-8" "bad.txt: not valid UTF-8 at byte 2 (0xff)" \
    "$DATA" tokenize --tokenizer tiny.json bad.txt -o x.bin
printf 'ab\355\240\200' >bad.txt
expect_fail "a surrogate in the text" "bad.txt: not valid UTF-8 at byte 2 (0xed)" \
    "$DATA" tokenize --tokenizer tiny.json bad.txt -o x.bin
"$PY" -c '
import struct, sys
sys.stdout.buffer.write(struct.pack("<3i", 20240520, 1, 3) + bytes(1012) + struct.pack("<3H", 97, 264, 98))' >far.bin
expect_fail "decode of an id outside the vocabulary" \
    "far.bin: token 264 at position 1 is outside the vocabulary (vocab_size 264)" \
    "$DATA" decode --tokenizer tiny.json far.bin -o x.txt
expect_fail "a split without validation tokens" \
    "--val-fraction 0.1 of 5 tokens leaves no validation tokens" \
    "$DATA" tokenize --tokenizer tiny.json t1.txt -o x.bin --val-fraction 0.1 --val-out v.bin
expect_fail "decode without a tokenizer" "missing --tokenizer tokenizer.json" \
    "$DATA" decode far.bin

# 200,000 added tokens, all starting with '<': the duplicate check, the
# matching set and the JSON reading were quadratic or byte by byte (100,000
# took 30 s to load; 20,000 '<' then cost 20,000 x 200,000 comparisons);
# now about a second, so 30 s is ample
"$PY" - tiny.json many.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
base = max(t["model"]["vocab"].values()) + 3
t["added_tokens"] += [{"id": base + i, "content": "<|t%d|>" % i} for i in range(200000)]
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False, separators=(",", ":"))
PY
{ printf '%20000s' '' | tr ' ' '<'; printf '<|t199999|>ab<|t7|>'; } >many.txt
timeout 30 "$DATA" tokenize --tokenizer many.json many.txt -o many.bin >out.txt 2>&1 &&
    [ "$(tokens many.bin | tr ' ' '\n' | tail -n 4 | tr '\n' ' ')" = "60 200263 256 271 " ]
tap_ok $? "200,000 added tokens: loaded and a text of 20,000 '<' encoded within 30 s ($(tail -n 1 out.txt | head -c 200))"

# Split patterns that make each match look to the end of the text (that
# was quadratic: 64 KiB in 1.8 s, 1 MiB in minutes) or backtrack: refused
# once the text's bound of regex steps is spent, naming the limit
head -c 262144 /dev/zero | tr '\0' a >aaa.txt
split_seq() {
    echo "$seq" | sed "s/RE/$1/; s/BEH/Isolated/"
}
if bad "pre_tokenizer=$(split_seq 'a(?=[^z]*z)|a')"; then
    expect_fail "a pattern that looks to the end of the text" \
        "aaa.txt: bad.json: the pre-tokenizer regex needs more than 272629760 matching steps for a text of 262144 bytes (the limit: 1024 per byte + 4194304)" \
        "$DATA" tokenize --tokenizer bad.json aaa.txt -o x.bin
else
    tap_ok 1 "a pattern that looks to the end of the text: could not make the file"
fi
if bad "pre_tokenizer=$(split_seq '(?:a|aa)+z|a')"; then
    head -c 4096 aaa.txt >a4k.txt
    expect_fail "a pattern that backtracks" \
        "a4k.txt: bad.json: the pre-tokenizer regex needs more than 8388608 matching steps" \
        "$DATA" tokenize --tokenizer bad.json a4k.txt -o x.bin
else
    tap_ok 1 "a pattern that backtracks: could not make the file"
fi

"$DATA" --help | grep -q '^  decode' && "$DATA" tokenize --help | grep -q -- '--tokenizer' &&
    "$DATA" decode --help | grep -q -- '--skip-special'
tap_ok $? "--help names decode and the tokenizer options"

# ----------------------------------------------------------------------------
# Against the `tokenizers` package

if [ ! -x "$HF" ] || ! "$HF" -c 'import tokenizers' 2>/dev/null; then
    tap_skip_dep hf-venv "no Python with the tokenizers package at $HF (./quickstart.sh test makes it; FSDPC_HF_PYTHON overrides)"
    tap_done
    exit $?
fi
"$HF" "$HELPER" train . >train.log 2>&1
tap_ok $? "tokenizers $("$HF" -c 'import tokenizers; print(tokenizers.__version__)') trained on local text"

# $1 tokenizer, $2 text: tokenize, then compare with the reference
same() {
    rm -f o.bin cmp.txt
    "$DATA" tokenize --tokenizer "$1.json" "$2.txt" -o o.bin >out.txt 2>&1 &&
        "$HF" "$HELPER" check-encode "$1.json" "$2.txt" o.bin >cmp.txt 2>&1
    rc=$?
    [ $rc -ne 0 ] && tap_diag "$(cat out.txt cmp.txt)"
    tap_ok $rc "$1: $2: $(tail -n 1 cmp.txt)"
}
for t in gpt2 gpt2p llama3; do
    for x in plain unicode spaces digits contractions special code fuzz corpus; do
        same $t $x
    done
done
same gpt2s corpus
same gpt2s fuzz
same tiny fuzz
# read and encoded 4 KiB at a time, cut only where no piece crosses: the same ids
# (gpt2p's prefix space cannot be cut: it reads the text whole)
for t in gpt2 gpt2p gpt2s llama3; do
    for x in corpus fuzz spaces code; do
        rm -f o.bin cmp.txt
        FSDPC_TOKENIZE_CHUNK_BYTES=4096 "$DATA" tokenize --tokenizer "$t.json" "$x.txt" -o o.bin \
            >out.txt 2>&1 && "$HF" "$HELPER" check-encode "$t.json" "$x.txt" o.bin >cmp.txt 2>&1
        rc=$?
        [ $rc -ne 0 ] && tap_diag "$(cat out.txt cmp.txt)"
        tap_ok $rc "$t: $x read 4 KiB at a time: $(tail -n 1 cmp.txt)"
    done
done

"$DATA" tokenize --tokenizer llama3.json corpus.txt -o o.bin >/dev/null 2>&1 &&
    [ "$(header o.bin 1)" = 2 ] && [ "$(tokens o.bin | tr ' ' '\n' | sort -n | tail -n 1)" -gt 65535 ]
tap_ok $? "llama3: a version 2 file holding ids above 65535"
"$DATA" tokenize --tokenizer gpt2.json corpus.txt -o o.bin >/dev/null 2>&1 && [ "$(header o.bin 1)" = 1 ]
tap_ok $? "gpt2: a version 1 file"

# encode(text) with its special tokens: the post-processor's, as the package adds them
for t in gpt2 llama3; do
    want=$("$HF" "$HELPER" encode-special $t.json "Hello, world! café 中文")
    got=$("$top_builddir/tests/io/tokenizer_api" --special $t.json "Hello, world! café 中文")
    [ -n "$want" ] && [ "$want" = "$got" ]
    tap_ok $? "$t: encode with special tokens equals tokenizers' encode(text) ($got)"
done

"$DATA" tokenize --tokenizer llama3.json corpus.txt -o tr.bin --val-fraction 0.1 --val-out va.bin \
    >out.txt 2>&1 && "$HF" "$HELPER" check-encode llama3.json corpus.txt tr.bin va.bin >cmp.txt 2>&1
tap_ok $? "validation split: training + validation tokens are the text's ($(tail -n 1 cmp.txt))"
n=$(($(header tr.bin 2) + $(header va.bin 2)))
[ "$(header va.bin 2)" -eq $((n / 10)) ] && grep -q "validation tokens in va.bin" out.txt
tap_ok $? "the last floor(0.1 * $n) tokens are the validation split: $(cat out.txt)"

for t in gpt2 llama3; do
    for x in unicode special fuzz; do
        "$DATA" tokenize --tokenizer $t.json $x.txt -o o.bin >/dev/null 2>&1
        "$DATA" decode --tokenizer $t.json o.bin -o d.txt >/dev/null 2>&1 &&
            "$HF" "$HELPER" check-decode $t.json o.bin d.txt >cmp.txt 2>&1 && cmp -s d.txt $x.txt
        tap_ok $? "$t: decode of $x equals tokenizers' and the text ($(tail -n 1 cmp.txt))"
        "$DATA" decode --tokenizer $t.json o.bin --skip-special >d.txt 2>/dev/null &&
            "$HF" "$HELPER" check-decode $t.json o.bin d.txt --skip-special >cmp.txt 2>&1
        tap_ok $? "$t: decode --skip-special of $x ($(tail -n 1 cmp.txt))"
    done
    "$HF" "$HELPER" random-ids $t.json r.bin 150001 &&
        "$DATA" decode --tokenizer $t.json r.bin -o d.txt >/dev/null 2>&1 &&
        "$HF" "$HELPER" check-decode $t.json r.bin d.txt >cmp.txt 2>&1
    tap_ok $? "$t: decode of 150001 random ids, invalid UTF-8 and all ($(tail -n 1 cmp.txt))"
done
tap_done
