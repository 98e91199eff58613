#!/bin/sh
# test_checksums.sh - per-tensor checksums end to end (doc/formats.md,
# "Checksums"). A flipped byte in a model file fails fsdpc-train --model (1
# and 2 ranks), convert and export-safetensors with one line naming the
# file and the tensor. A flipped byte in a checkpoint shard fails verify,
# consolidate, reshard, --resume (on the shard layout and on another world
# size) and --model index.h5, naming the tensor and the shard file. A shard
# file swapped in from another run (same step, same shapes, other values)
# is refused by all of them. A root attribute of index.h5 edited with h5py
# (the data cursor, an optimizer counter, the architecture's) is refused by
# verify, --resume and the other readers, naming it. Files without checksums
# (an older fsdpc, another tool) still load; bad checksum attributes are one
# clear line.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"
BAD="$BIN/tests/io/bad_model"

# lines of FILE that are not hints
errlines() {
    grep -v '^fsdpc: hint:' "$1" | grep -c .
}

# one_error NAME PATTERN CMD...: CMD fails with one line (hints aside)
# matching PATTERN; on one rank, so the line is the only one
one_error() {
    name=$1
    pat=$2
    shift 2
    "$@" > "$W/out" 2> "$W/err"
    rc=$?
    n=$(errlines "$W/err")
    if [ $rc -ne 0 ] && [ "$n" -eq 1 ] && grep -q -- "$pat" "$W/err"; then
        return 0
    fi
    tap_diag "$name: rc $rc, $n lines: $(cat "$W/err")"
    return 1
}

# ---------------------------------------------------------------------------
# model files

"$BAD" flip:h.0.attn.c_attn.weight "$W/m.h5" "$W/mflip.h5" &&
    "$BAD" unsum "$W/m.h5" "$W/mold.h5"
tap_ok $? "fixtures: a model file with one flipped byte, and one without checksums"

pat="mflip.h5: tensor 'h.0.attn.c_attn.weight' rows \[0, 96): checksum mismatch (stored 0x[0-9a-f]\{16\}, computed 0x[0-9a-f]\{16\}): the file is damaged"
ok=0
# shellcheck disable=SC2086
one_error "train --model" "$pat" "$TRAIN" $COMMON --model "$W/mflip.h5" --batch-size 4 --steps 2 ||
    ok=1
one_error "convert" "$pat" "$CKPT" convert "$W/mflip.h5" --dtype bf16 -o "$W/c.h5" || ok=1
one_error "export" "$pat" "$CKPT" export-safetensors "$W/mflip.h5" -o "$W/c.st" || ok=1
[ ! -e "$W/c.h5" ] && [ ! -e "$W/c.st" ] || ok=1
tap_diag "$(cat "$W/err")"
tap_ok $ok "a flipped byte in a model file: train, convert and export fail with one line naming it"

# shellcheck disable=SC2086
timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $COMMON --model "$W/mflip.h5" --batch-size 2 --steps 2 \
    --backend tcp > "$W/out" 2> "$W/err"
rc=$?
[ $rc -ne 0 ] && grep -q -- "$pat" "$W/err"
r=$?
[ $r -eq 0 ] || tap_diag "rc $rc: $(cat "$W/err")"
tap_ok $r "... and so does a 2-rank run, each rank checking the blocks of its own rows"

train 1 --batch-size 4 --steps 3 --metrics "$W/new.jsonl" &&
    train 1 --batch-size 4 --steps 3 --model "$W/mold.h5" --metrics "$W/old.jsonl" &&
    losses "$W/new.jsonl" > "$W/new.loss" && losses "$W/old.jsonl" > "$W/old.loss" &&
    [ "$(wc -l < "$W/old.loss")" -eq 3 ] && cmp -s "$W/new.loss" "$W/old.loss" &&
    "$CKPT" convert "$W/mold.h5" --dtype f32 -o "$W/conv.h5" > /dev/null 2>&1
tap_ok $? "a model file without checksums loads unchecked: the same losses; convert reads it"
"$CKPT" inspect "$W/m.h5" > "$W/i1.out" 2>&1 && "$CKPT" inspect "$W/mold.h5" > "$W/i2.out" 2>&1 &&
    grep -q '^checksums     xxh3_64 per block, recorded for all [0-9]* tensors' "$W/i1.out" &&
    grep -q '^checksums     recorded for 0 of [0-9]* tensors (a file from an fsdpc without them' \
        "$W/i2.out"
tap_ok $? "inspect says whether a model file's checksums are recorded"

ok=0
"$BAD" sum-type:wpe.weight "$W/m.h5" "$W/st.h5" &&
    one_error "type" "st.h5: attribute 'xxh3_64' of /model/wpe.weight must hold unsigned 64-bit integers" \
        "$CKPT" inspect "$W/st.h5" || ok=1
"$BAD" sum-count:wpe.weight "$W/m.h5" "$W/sc.h5" &&
    one_error "count" "sc.h5: attribute 'xxh3_64' of /model/wpe.weight holds 2 hashes but blocks of 64 rows need 1" \
        "$CKPT" inspect "$W/sc.h5" || ok=1
"$BAD" sum-rows:wpe.weight=0 "$W/m.h5" "$W/sr0.h5" &&
    one_error "rows" "sr0.h5: attribute 'xxh3_64_rows' of /model/wpe.weight is 0; a block holds at least one row" \
    "$CKPT" inspect "$W/sr0.h5" || ok=1
tap_ok $ok "malformed checksum attributes: one line naming the file, dataset and attribute"

# ---------------------------------------------------------------------------
# checkpoints

"$CKPT" init --layers 2 --heads 2 --width 32 --context 64 --seed 2 -o "$W/m2.h5" > /dev/null 2>&1 &&
    train 2 --batch-size 2 --steps 2 --backend tcp --ckpt-dir "$W/ck" &&
    train 2 --batch-size 2 --steps 2 --backend tcp --ckpt-dir "$W/ck2" --model "$W/m2.h5" &&
    "$CKPT" verify "$W/ck" > "$W/verify.out" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/verify.out")"
tap_ok $r "fixtures: two 2-rank checkpoints of step 2 from models of other seeds; verify passes"

grep -q '^tensor  *model  *exp_avg  *exp_avg_sq$' "$W/verify.out" &&
    grep -q '^wte.weight  *ok  *ok  *ok$' "$W/verify.out" &&
    [ "$(grep -c ' ok  *ok  *ok$' "$W/verify.out")" -eq 28 ] &&
    grep -q '^ok: .*step 2, 2 shards, 28 tensors x 3 readable, all matched their checksums (xxh3_64), attributes matched theirs' "$W/verify.out"
tap_ok $? "verify prints every tensor's checksum status and the summary"

# bad NAME DIR PATTERN [PATTERN_MODEL]: verify, consolidate (with the
# optimizer), reshard and --resume on 1 rank (other shard layout) fail with
# one line; --resume on 2 ranks fails; --model index.h5 fails matching
# PATTERN_MODEL when given
bad() {
    name=$1
    d=$2
    pat=$3
    ok=0
    one_error "$name verify" "$pat" "$CKPT" verify "$d" || ok=1
    one_error "$name consolidate" "$pat" "$CKPT" consolidate "$d" --with-optimizer -o "$W/cons.h5" ||
        ok=1
    one_error "$name reshard" "$pat" "$CKPT" reshard "$d" --world-size 3 -o "$W/r3" || ok=1
    # shellcheck disable=SC2086
    one_error "$name resume 1 rank" "$pat" "$TRAIN" $COMMON --batch-size 4 --steps 4 --resume "$d" ||
        ok=1
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $COMMON --batch-size 2 --steps 4 --backend tcp \
        --resume "$d" > "$W/out" 2> "$W/err"
    rc=$?
    if [ $rc -eq 0 ] || ! grep -q -- "$pat" "$W/err"; then
        tap_diag "$name resume 2 ranks: rc $rc: $(cat "$W/err")"
        ok=1
    fi
    if [ -n "$4" ]; then
        # shellcheck disable=SC2086
        one_error "$name --model index.h5" "$4" "$TRAIN" $COMMON --batch-size 4 --steps 2 \
            --model "$d/index.h5" || ok=1
    fi
    [ ! -e "$W/cons.h5" ] && [ ! -e "$W/r3" ] || ok=1
    "$CKPT" verify "$d" 2> /dev/null | grep -v ' ok  *ok  *ok$' | sed 's/^/  /' > "$W/vout"
    tap_diag "verify: $(cat "$W/vout")"
    return $ok
}

cp -r "$W/ck/step_2" "$W/flip" &&
    "$BAD" flip:/model/wte.weight "$W/ck/step_2/shard_1.h5" "$W/flip/shard_1.h5"
bad "flipped byte" "$W/flip" \
    "flip/shard_1.h5: tensor 'model/wte.weight' rows \[128, 256): checksum mismatch (stored 0x[0-9a-f]*, computed 0x[0-9a-f]*): the shard file is damaged" \
    "flip/index.h5: tensor 'wte.weight' rows \[128, 256): checksum mismatch .*: shard_1.h5 is damaged or not the shard this index was written with"
tap_ok $? "a flipped byte in a shard: verify, consolidate, reshard, --resume (1 and 2 ranks) and --model index.h5 fail naming tensor and shard file"
grep -q '^  wte.weight  *FAILED  *ok  *ok$' "$W/vout" && [ "$(grep -c FAILED "$W/vout")" -eq 1 ]
tap_ok $? "verify marks that tensor FAILED and only that one"

cp -r "$W/ck/step_2" "$W/swap" && cp "$W/ck2/step_2/shard_1.h5" "$W/swap/shard_1.h5"
bad "shard of another run" "$W/swap" \
    "swap/shard_1.h5: tensor 'model/wte.weight': the shard's checksum 0x[0-9a-f]* (block 0) differs from 0x[0-9a-f]*, which index.h5 records for shard 1: a shard file from another checkpoint or run" \
    "swap/index.h5: tensor 'wte.weight' rows \[128, 256): checksum mismatch .*: shard_1.h5 is damaged or not the shard this index was written with"
tap_ok $? "a shard file of another run (same step and shapes): every reader refuses it, naming tensor and shard file"

# edit ATTR DIR: a copy of the checkpoint with root attribute ATTR of its
# index.h5 changed in place by h5py (same type: one more, or twice a float)
edit() {
    cp -r "$W/ck/step_2" "$2" && "$PY" - "$2/index.h5" "$1" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    v = f.attrs[sys.argv[2]]
    f.attrs.modify(sys.argv[2], v * 2 if np.issubdtype(np.asarray(v).dtype, np.floating) else v + 1)
PY
}
if have_h5py; then
    edit data_position "$W/epos"
    bad "edited data_position" "$W/epos" \
        "epos/index.h5: root attribute 'data_position' does not match its checksum in xxh3_64_attrs" \
        "epos/index.h5: root attribute 'data_position' does not match its checksum"
    tap_ok $? "data_position edited with h5py: verify, consolidate, reshard, --resume and --model index.h5 refuse it in one line naming it"
    ok=0
    for a in adam_step ln_eps n_layer loss_scale; do
        edit $a "$W/e_$a" || ok=1
        pat="e_$a/index.h5: root attribute '$a' does not match its checksum in xxh3_64_attrs"
        one_error "edited $a verify" "$pat" "$CKPT" verify "$W/e_$a" || ok=1
        # shellcheck disable=SC2086
        one_error "edited $a resume" "$pat" "$TRAIN" $COMMON --batch-size 4 --steps 4 \
            --resume "$W/e_$a" || ok=1
    done
    tap_diag "$(cat "$W/err")"
    tap_ok $ok "adam_step, ln_eps, n_layer, loss_scale edited: verify and --resume refuse, naming the attribute"
else
    tap_skip_dep h5py "editing a checkpoint's attributes"
    tap_skip_dep h5py "editing a checkpoint's attributes"
fi

mkdir "$W/old" && "$BAD" unsum "$W/ck/step_2/index.h5" "$W/old/index.h5" &&
    "$BAD" unsum "$W/ck/step_2/shard_0.h5" "$W/old/shard_0.h5" &&
    "$BAD" unsum "$W/ck/step_2/shard_1.h5" "$W/old/shard_1.h5" &&
    "$CKPT" verify "$W/old" > "$W/old.out" 2>&1 &&
    grep -q '^wte.weight  *unchecked  *unchecked  *unchecked$' "$W/old.out" &&
    grep -q '^ok: .*0 matched their checksums, 84 have none recorded, attributes have none recorded' \
        "$W/old.out" &&
    train 1 --batch-size 4 --steps 4 --resume "$W/old" --metrics "$W/rold.jsonl" &&
    train 1 --batch-size 4 --steps 4 --resume "$W/ck/step_2" --metrics "$W/rnew.jsonl" &&
    losses "$W/rold.jsonl" > "$W/rold.loss" && losses "$W/rnew.jsonl" > "$W/rnew.loss" &&
    [ "$(wc -l < "$W/rold.loss")" -eq 2 ] && cmp -s "$W/rold.loss" "$W/rnew.loss"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/old.out" | tail -n 3)"
tap_ok $r "a checkpoint without checksums: verify says unchecked, --resume continues as with them"
"$CKPT" inspect "$W/ck/step_2" > "$W/i1.out" 2>&1 && "$CKPT" inspect "$W/old" > "$W/i2.out" 2>&1 &&
    grep -q '^checksums     xxh3_64 per block, recorded for all 84 tensors' "$W/i1.out" &&
    grep -q '^checksums     recorded for 0 of 84 tensors (a checkpoint from an fsdpc without them' \
        "$W/i2.out" &&
    grep -q '^attributes    run state and architecture covered by xxh3_64_attrs, all matched' \
        "$W/i1.out" &&
    grep -q '^attributes    no checksums recorded (a checkpoint from an fsdpc without them' \
        "$W/i2.out"
tap_ok $? "inspect says whether a checkpoint's checksums are recorded, its attributes' too"

cp -r "$W/ck/step_2" "$W/half" && "$BAD" unsum "$W/ck/step_2/shard_0.h5" "$W/half/shard_0.h5"
one_error "shard without" "half/shard_0.h5: tensor 'model/wte.weight' has no checksums but index.h5 records them for shard 0" \
    "$CKPT" verify "$W/half"
tap_ok $? "a shard without checksums under an index that records them is refused"

tap_done
