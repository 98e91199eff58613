#!/bin/sh
# test_data_tool.sh - fsdpc-data tokenize (byte level, validation split from
# the end of the text) and inspect, with their errors.
. "$top_srcdir/tests/tap.sh"
DATA="$top_builddir/fsdpc-data"
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-data-test.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1

# tokens of an llm.c file as decimal numbers, one per line
tokens() { od -An -v -tu2 -j1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
bytes() { od -An -v -tu1 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
# header int32 number $2 of file $1
header() { od -An -v -td4 -j$(($2 * 4)) -N4 "$1" | tr -d ' '; }

# 1000 bytes: "line N\n" repeated, then trimmed
i=0; : >text.txt
while [ $i -lt 200 ]; do printf 'line %d\n' $i >>text.txt; i=$((i + 1)); done
head -c 1000 text.txt >t.txt

"$DATA" tokenize t.txt -o train.bin --val-fraction 0.1 --val-out val.bin >out.txt 2>&1
tap_ok $? "tokenize with --val-fraction 0.1"
grep -q "1000 bytes -> 900 training tokens in train.bin, 100 validation tokens in val.bin" out.txt
tap_ok $? "summary line: $(cat out.txt)"
[ "$(header train.bin 0)" = 20240520 ] && [ "$(header train.bin 1)" = 1 ] &&
    [ "$(header train.bin 2)" = 900 ] && [ "$(header val.bin 2)" = 100 ] &&
    [ "$(wc -c <train.bin)" -eq $((1024 + 1800)) ] && [ "$(wc -c <val.bin)" -eq $((1024 + 200)) ]
tap_ok $? "headers (magic, version 1, counts 900 and 100) and file sizes"
head -c 900 t.txt >expect-train.txt; tail -c 100 t.txt >expect-val.txt
tokens train.bin >got.lst; bytes expect-train.txt >want.lst
cmp -s got.lst want.lst
tap_ok $? "training tokens are the first 900 bytes"
tokens val.bin >got.lst; bytes expect-val.txt >want.lst
cmp -s got.lst want.lst
tap_ok $? "validation tokens are the last 100 bytes"
"$DATA" tokenize t.txt -o all.bin >/dev/null 2>&1 && [ "$(header all.bin 2)" = 1000 ]
tap_ok $? "tokenize without a split keeps every byte"
printf '\000\377\n' >bin.txt
"$DATA" tokenize bin.txt -o bin.bin >/dev/null 2>&1 && [ "$(tokens bin.bin | tr '\n' ' ')" = "0 255 10 " ]
tap_ok $? "bytes 0 and 255 are tokens 0 and 255"

"$DATA" inspect train.bin >out.txt 2>&1
tap_ok $? "inspect"
grep -q "^tokens  *900$" out.txt && grep -q "^token range  *10 \.\. 110 (needs vocab_size >= 111)" out.txt &&
    grep -q '^as bytes  *"line 0\\nline 1\\nli"' out.txt
tap_ok $? "inspect prints count, range and the first tokens"
"$DATA" inspect train.bin --vocab 110 >out.txt 2>err.txt
[ $? -ne 0 ] && grep -q "train.bin: token 110 at position 2 is outside the vocabulary (vocab_size 110)" err.txt
tap_ok $? "inspect --vocab names the first bad token: $(sed 's/^.*inspect: //' err.txt)"

# errors: one line, non-zero exit
expect_fail() {
    desc=$1; pattern=$2; shift 2
    "$@" >out.txt 2>err.txt
    rc=$?
    if [ $rc -ne 0 ] && grep -q -- "$pattern" err.txt && [ "$(wc -l <err.txt)" -eq 1 ]; then
        tap_ok 0 "$desc: $(sed 's/^fsdpc: rank 0 on [^:]*: //' err.txt)"
    else
        tap_diag "exit $rc; stderr:"; tap_diag "$(cat err.txt)"
        tap_ok 1 "$desc: expected '$pattern'"
    fi
}
expect_fail "missing text" "cannot open text 'nope.txt': No such file" \
    "$DATA" tokenize nope.txt -o x.bin
: >empty.txt
expect_fail "empty text" "text 'empty.txt' is empty" "$DATA" tokenize empty.txt -o x.bin
expect_fail "fraction out of range" "--val-fraction '1.5' is out of range (0, 1)" \
    "$DATA" tokenize t.txt -o x.bin --val-fraction 1.5 --val-out v.bin
expect_fail "fraction not a number" "--val-fraction 'abc' is not a finite number" \
    "$DATA" tokenize t.txt -o x.bin --val-fraction abc --val-out v.bin
expect_fail "fraction without --val-out" "--val-fraction and --val-out go together" \
    "$DATA" tokenize t.txt -o x.bin --val-fraction 0.1
expect_fail "split too small" "leaves no validation tokens" \
    "$DATA" tokenize bin.txt -o x.bin --val-fraction 0.1 --val-out v.bin
expect_fail "missing -o" "missing -o FILE.bin" "$DATA" tokenize t.txt
expect_fail "unknown option" "unknown option --frobnicate" "$DATA" tokenize --frobnicate t.txt
[ ! -e x.bin ] && ! ls -a | grep -q -F -e x.bin.tmp -e v.bin.tmp && [ ! -e v.bin ]
tap_ok $? "failed runs leave no output files"
printf 'not a token file at all, but longer than nothing' >bad.bin
head -c 2000 train.bin >cut.bin
expect_fail "inspect of a short file" "bad.bin: truncated" "$DATA" inspect bad.bin
expect_fail "inspect of a truncated file" "cut.bin: truncated: header\[2\] says 900 tokens" \
    "$DATA" inspect cut.bin
"$DATA" --help | grep -q tokenize && "$DATA" tokenize --help | grep -q -- "--val-fraction"
tap_ok $? "--help"
tap_done
