#!/bin/sh
# test_output_files.sh - where the writers put their bytes. Every output is
# written under a fresh unpredictable name beside it and renamed into place,
# so a symbolic link planted at the old fixed temporary name (OUT.tmp) or at
# the output's own name redirects no write: the files the links point to stay
# byte for byte as they were, the link at OUT is replaced (not followed), the
# outputs equal the same commands' outputs in a clean directory, and neither
# a success nor a failure leaves a temporary behind. Every command reads its
# inputs from the reference run in ref/, so each check stands on its own. Covers fsdpc-data
# tokenize, fsdpc-ckpt init / consolidate / convert / export-safetensors /
# import-safetensors / reshard, and fsdpc-train's --out and checkpoints.
. "$top_srcdir/tests/tap.sh"
CKPT="$top_builddir/fsdpc-ckpt"
DATA="$top_builddir/fsdpc-data"
TRAIN="$top_builddir/fsdpc-train"
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-out-test.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
umask 022
export FSDPC_LOG=warn

printf 'a file of the user that no writer may touch\n' >victim
printf 'another one, behind the output name itself\n' >victim2
cp victim victim.orig && cp victim2 victim2.orig
mkdir ref

# plant NAME...: NAME.tmp -> victim (the old fixed name), NAME -> victim2
plant() {
    for n in "$@"; do
        ln -s victim "$n.tmp" && ln -s victim2 "$n" || return 1
    done
}

# temps NAME: the entries left beside NAME that a writer's temporary would be
temps() {
    ls -a | grep -F -x -v -e "$1.tmp" | grep -F -e "$1.tmp"
}

# planted_ok NAME...: the victims untouched, each NAME a regular file (the link
# there was replaced, not written through) equal to ref/NAME, the link at
# NAME.tmp left as planted, no temporary left; diagnostics say which failed
planted_ok() {
    ok=0
    cmp -s victim victim.orig || { tap_diag "victim (behind .tmp) was written"; ok=1; }
    cmp -s victim2 victim2.orig || { tap_diag "victim2 (behind the output name) was written"; ok=1; }
    for n in "$@"; do
        if [ -L "$n" ] || [ ! -f "$n" ]; then
            tap_diag "$n: not a regular file: $(ls -l "$n" 2>&1)"
            ok=1
        fi
        cmp -s "$n" "ref/$n" || { tap_diag "$n differs from ref/$n"; ok=1; }
        [ -L "$n.tmp" ] || { tap_diag "$n.tmp: the planted link is gone"; ok=1; }
        [ -z "$(temps "$n")" ] || { tap_diag "$n: left behind: $(temps "$n")"; ok=1; }
    done
    return $ok
}

# run LOG CMD...: CMD with its output in LOG, shown when it fails
run() {
    log=$1
    shift
    "$@" >"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tap_diag "exit $rc: $(tail -n 3 "$log")"
    return $rc
}

# --- fsdpc-data tokenize (training and validation outputs)
sh "$top_srcdir/tests/corpus.sh" 60000 >text
run ref.log "$DATA" tokenize text -o ref/tok.bin --val-fraction 0.1 --val-out ref/val.bin
tap_ok $? "reference token files"
plant tok.bin val.bin &&
    run out.log "$DATA" tokenize text -o tok.bin --val-fraction 0.1 --val-out val.bin &&
    planted_ok tok.bin val.bin
tap_ok $? "tokenize: links at tok.bin(.tmp) and val.bin(.tmp) redirect nothing; same bytes"

# --- fsdpc-ckpt init
run ref.log "$CKPT" init --layers 2 --heads 2 --width 32 --context 64 --seed 3 -o ref/m.h5
tap_ok $? "reference model"
plant m.h5 &&
    run out.log "$CKPT" init --layers 2 --heads 2 --width 32 --context 64 --seed 3 -o m.h5 &&
    planted_ok m.h5
tap_ok $? "init: links at m.h5.tmp and m.h5 redirect nothing; same bytes"

# --- fsdpc-train: --out and a checkpoint
COMMON="--model ref/m.h5 --data ref/tok.bin --seq-len 32 --batch-size 4 --steps 2 --lr 1e-3 --warmup 1 \
--peak-flops 1e11 --timeout 30"
# shellcheck disable=SC2086
run ref.log timeout 120 "$TRAIN" $COMMON --out ref/trained.h5 --ckpt-dir ref/ck --ckpt-every 2
tap_ok $? "reference training run (--out and --ckpt-dir)"
# shellcheck disable=SC2086
plant trained.h5 &&
    run out.log timeout 120 "$TRAIN" $COMMON --out trained.h5 --ckpt-dir ck --ckpt-every 2 &&
    planted_ok trained.h5 && cmp -s ck/step_2/shard_0.h5 ref/ck/step_2/shard_0.h5 &&
    [ -z "$(ls -a ck/step_2 | grep -v -x -e . -e .. -e shard_0.h5 -e index.h5)" ]
tap_ok $? "fsdpc-train --out: links at trained.h5(.tmp) redirect nothing; same model and shard"

# --- fsdpc-ckpt consolidate, convert, export-safetensors, import-safetensors
run ref.log "$CKPT" consolidate ref/ck/step_2 -o ref/cons.h5 --with-optimizer &&
    run ref.log "$CKPT" convert ref/m.h5 --dtype bf16 -o ref/conv.h5 &&
    run ref.log "$CKPT" export-safetensors ref/m.h5 -o ref/m.st &&
    run ref.log "$CKPT" import-safetensors ref/m.st -o ref/imp.h5
tap_ok $? "reference consolidate, convert, export and import"
plant cons.h5 && run out.log "$CKPT" consolidate ref/ck/step_2 -o cons.h5 --with-optimizer &&
    planted_ok cons.h5
tap_ok $? "consolidate: links at cons.h5.tmp and cons.h5 redirect nothing; same bytes"
plant conv.h5 && run out.log "$CKPT" convert ref/m.h5 --dtype bf16 -o conv.h5 && planted_ok conv.h5
tap_ok $? "convert: links at conv.h5.tmp and conv.h5 redirect nothing; same bytes"
plant m.st && run out.log "$CKPT" export-safetensors ref/m.h5 -o m.st && planted_ok m.st
tap_ok $? "export-safetensors: links at m.st.tmp and m.st redirect nothing; same bytes"
plant imp.h5 && run out.log "$CKPT" import-safetensors ref/m.st -o imp.h5 && planted_ok imp.h5
tap_ok $? "import-safetensors: links at imp.h5.tmp and imp.h5 redirect nothing; same bytes"

# --- fsdpc-ckpt reshard: a directory committed by rename
run out.log "$CKPT" reshard ref/ck/step_2 --world-size 2 -o rs && run out.log "$CKPT" verify rs &&
    [ -z "$(temps rs)" ] && [ "$(stat -c %a rs)" = 755 ] &&
    [ "$(ls rs | tr '\n' ' ')" = "index.h5 shard_0.h5 shard_1.h5 " ]
tap_ok $? "reshard: a verified step directory, mode 755 under umask 022, no temporary left"

# --- failures remove their temporary
# fails NAME DESC CMD...: CMD must fail writing NAME (its error names it) and
# leave neither NAME nor a temporary beside it; SIGXFSZ is ignored so that a file-size limit fails a write
# instead of killing the program before it can clean up
fails() {
    name=$1 desc=$2
    shift 2
    (trap '' XFSZ && ulimit -f 16 && exec "$@") >fail.log 2>&1
    rc=$?
    tap_diag "$(tail -n 1 fail.log)"
    if [ $rc -ne 0 ] && grep -q -F "$name" fail.log && [ ! -e "$name" ] &&
        [ -z "$(temps "$name")" ]; then
        tap_ok 0 "$desc: fails, leaves no output and no temporary"
    else
        tap_diag "exit $rc, left: $(ls -d "$name"* 2>&1 | tr '\n' ' ')"
        tap_ok 1 "$desc: a failed write must leave no output and no temporary"
    fi
}
fails big.bin "tokenize over a file-size limit" "$DATA" tokenize text -o big.bin
fails big.h5 "init over a file-size limit" "$CKPT" init --layers 2 -o big.h5
fails bigc.h5 "consolidate over a file-size limit" "$CKPT" consolidate ref/ck/step_2 -o bigc.h5
fails bigv.h5 "convert over a file-size limit" "$CKPT" convert ref/m.h5 --dtype f32 -o bigv.h5
fails big.st "export-safetensors over a file-size limit" \
    "$CKPT" export-safetensors ref/m.h5 -o big.st
fails bigr "reshard over a file-size limit" "$CKPT" reshard ref/ck/step_2 --world-size 2 -o bigr
# the commit's rename fails when the output name is a non-empty directory
mkdir busy.h5 busy.bin && : >busy.h5/x && : >busy.bin/x
"$CKPT" init --layers 1 -o busy.h5 >fail.log 2>&1
[ $? -ne 0 ] && grep -q "rename to busy.h5 failed" fail.log && [ -z "$(temps busy.h5)" ] &&
    [ -f busy.h5/x ]
tap_ok $? "init onto a directory: the rename fails, the temporary is removed"
"$DATA" tokenize text -o busy.bin >fail.log 2>&1
[ $? -ne 0 ] && grep -q "rename to busy.bin failed" fail.log && [ -z "$(temps busy.bin)" ]
tap_ok $? "tokenize onto a directory: the rename fails, the temporary is removed"

cmp -s victim victim.orig && cmp -s victim2 victim2.orig
tap_ok $? "the victims are still untouched at the end"
tap_done
