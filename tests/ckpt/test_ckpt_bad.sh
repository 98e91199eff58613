#!/bin/sh
# test_ckpt_bad.sh - damaged or wrong checkpoints and bad fsdpc-ckpt
# arguments: a missing shard, a truncated shard, shards from different
# steps, an index without shards, a wrong format version or format, a
# directory that is not a checkpoint. Each gives one clear error line and a
# non-zero exit from fsdpc-ckpt verify, fsdpc-ckpt consolidate and
# fsdpc-train --resume.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

train 1 --batch-size 4 --steps 4 --ckpt-dir "$W/ck" --ckpt-every 2 &&
    "$CKPT" reshard "$W/ck/step_2" --world-size 2 -o "$W/s2" > /dev/null 2>&1 &&
    "$CKPT" reshard "$W/ck/step_4" --world-size 2 -o "$W/s4" > /dev/null 2>&1 &&
    "$CKPT" verify "$W/s2" > /dev/null 2>&1
tap_ok $? "fixtures: checkpoints of steps 2 and 4, resharded to 2 shards"

# bad NAME DIR PATTERN: every reader fails with one line matching PATTERN
bad() {
    name=$1
    path=$2
    pat=$3
    ok=0
    for cmd in verify consolidate resume; do
        case $cmd in
        verify) "$CKPT" verify "$path" > "$W/out" 2> "$W/err" ;;
        consolidate) "$CKPT" consolidate "$path" -o "$W/cons.h5" > "$W/out" 2> "$W/err" ;;
        # shellcheck disable=SC2086
        resume) "$TRAIN" $COMMON --batch-size 4 --steps 6 --resume "$path" > "$W/out" 2> "$W/err" ;;
        esac
        rc=$?
        n=$(grep -c . "$W/err")
        if [ $rc -eq 0 ] || [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
            tap_diag "$cmd: rc $rc, $n lines: $(cat "$W/err")"
            ok=1
        fi
    done
    tap_diag "$(cat "$W/err")"
    [ ! -e "$W/cons.h5" ] || ok=1
    tap_ok $ok "$name: verify, consolidate and --resume fail with one line"
}

cp -r "$W/s2" "$W/missing" && rm "$W/missing/shard_1.h5"
bad "missing shard" "$W/missing" 'missing/shard_1.h5: shard 1 of 2 is missing'

cp -r "$W/s2" "$W/trunc" && head -c 3000 "$W/s2/shard_0.h5" > "$W/trunc/shard_0.h5"
bad "truncated shard" "$W/trunc" 'trunc/shard_0.h5: cannot open shard (truncated or damaged?)'

cp -r "$W/s2" "$W/mixed" && cp "$W/s4/shard_1.h5" "$W/mixed/shard_1.h5"
bad "shards of different steps" "$W/mixed" 'shard_1.h5: shard is from step 4 but the index is step 2'

mkdir "$W/alone" && cp "$W/s2/index.h5" "$W/alone/"
bad "index without shards" "$W/alone" 'alone/shard_0.h5: shard 0 of 2 is missing'

mkdir "$W/notckpt" && cp "$W/m.h5" "$W/notckpt/model.h5"
bad "a directory that is not a checkpoint" "$W/notckpt" 'notckpt: not a checkpoint'

bad "a path that does not exist" "$W/nowhere" 'nowhere: not a checkpoint: No such file'

cp -r "$W/s2" "$W/shard2" && cp "$W/s2/shard_0.h5" "$W/shard2/shard_1.h5"
bad "a shard file under another shard's name" "$W/shard2" 'shard_1.h5: shard 0 of 2, expected 1 of 2'

if have_h5py; then
    cp -r "$W/s2" "$W/version" &&
        "$PY" -c 'import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["checkpoint_version"] = np.int32(99)' "$W/version/index.h5"
    bad "wrong format version" "$W/version" 'checkpoint_version 99; this fsdpc reads version 1'
    # another format, its attribute checksums gone (as in a checkpoint written without them)
    cp -r "$W/s2" "$W/format" &&
        "$PY" -c 'import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f.attrs["xxh3_64_attrs"]
    f.attrs["checkpoint_format"] = "other-checkpoint"' "$W/format/index.h5"
    bad "another checkpoint_format" "$W/format" \
        "checkpoint_format is 'other-checkpoint', expected 'fsdpc-checkpoint'"
else
    tap_skip_dep h5py "not importable by /usr/bin/python3 (format version)"
    tap_skip_dep h5py "not importable by /usr/bin/python3 (checkpoint_format)"
fi

# index.h5 with a missing virtual source, opened as a model file
# shellcheck disable=SC2086
"$TRAIN" $COMMON --batch-size 4 --steps 3 --model "$W/missing/index.h5" > /dev/null 2> "$W/err"
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . "$W/err")" -eq 1 ] &&
    grep -q "maps source file './shard_1.h5', which is missing" "$W/err"
tap_ok $? "--model index.h5 with a missing shard: one line naming the virtual source"

# --resume latest without ckpt-dir; --ckpt-every without ckpt-dir
# shellcheck disable=SC2086
"$TRAIN" $COMMON --batch-size 4 --steps 3 --resume latest > /dev/null 2> "$W/err"
[ $? -ne 0 ] && grep -q 'resume latest needs ckpt-dir' "$W/err"
tap_ok $? "--resume latest without --ckpt-dir is refused"

# resuming a checkpoint of another model
"$CKPT" init --layers 1 --heads 2 --width 32 --context 64 -o "$W/other.h5" > /dev/null 2>&1
# shellcheck disable=SC2086
"$TRAIN" $COMMON --model "$W/other.h5" --batch-size 4 --steps 6 --resume "$W/s2" > /dev/null 2> "$W/err"
[ $? -ne 0 ] && grep -q 'is not the model of' "$W/err"
tap_ok $? "resuming another model's checkpoint: clear error"

# tool arguments
ok=0
for args in "reshard $W/s2 -o $W/r" "reshard $W/s2 --world-size 0 -o $W/r" \
    "reshard $W/s2 --mesh pp=2 -o $W/r" "reshard $W/s2 --world-size 2 -o $W/s4" \
    "reshard $W/s2 --mesh dp=2,dp=4 -o $W/r" "reshard $W/s2 --mesh rdp=65536,dp=65536 -o $W/r" \
    "convert $W/s2 --dtype f64 -o $W/c.h5" "convert $W/s2 -o $W/c.h5" "consolidate $W/s2" \
    "verify" "verify --bogus $W/s2" "inspect $W/notckpt"; do
    # shellcheck disable=SC2086
    "$CKPT" $args > /dev/null 2> "$W/err"
    rc=$?
    if [ $rc -eq 0 ] || [ "$(grep -c . "$W/err")" -ne 1 ]; then
        tap_diag "fsdpc-ckpt $args: rc $rc: $(cat "$W/err")"
        ok=1
    fi
done
[ ! -e "$W/r" ] && [ ! -e "$W/c.h5" ] || ok=1
tap_ok $ok "bad fsdpc-ckpt arguments: one line each, non-zero exit, nothing written"

tap_done
