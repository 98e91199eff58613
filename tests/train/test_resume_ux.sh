#!/bin/sh
# test_resume_ux.sh - resuming cannot surprise: --resume latest with a
# mistyped --ckpt-dir warns on stderr; a changed schedule, global batch or
# precision warns with the keys and both values; resuming an older step warns that
# latest moves back; a finished run says there is nothing to do and exits 0;
# the done line counts this run's steps; the metrics file gets a start record
# that says where the run resumed from; fsdpc-sample and fsdpc-train take a
# checkpoint (root, step directory or index.h5) for --model; fsdpc-ckpt list
# shows the steps, which is latest, and what is incomplete (--quick: from
# the index and the shard files present), and says what it checked; with a
# flipped byte in the latest step, list --verify calls it DAMAGED, and
# --resume fails with a hint naming the newest older step that verifies and
# the --resume that continues from it, which then works.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
CKPT="$BIN/fsdpc-ckpt"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-resume-ux.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

sh "$top_srcdir/tests/corpus.sh" 100000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$CKPT" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 -o "$W/m.h5" \
        > /dev/null 2>&1
tap_ok $? "fixtures: a token file and a model"

base="--model $W/m.h5 --data $W/train.bin --batch-size 4 --seq-len 32 --lr 1e-3 --peak-flops 1e11"

# run NAME ARGS...: stdout in NAME.out, stderr in NAME.err, the exit status back
run() {
    r_name=$1
    shift
    # shellcheck disable=SC2086
    "$TRAIN" $base "$@" > "$W/$r_name.out" 2> "$W/$r_name.err"
}

run a --steps 10 --ckpt-dir "$W/ck" --ckpt-every 5 --metrics "$W/a.jsonl" &&
    [ "$(readlink "$W/ck/latest")" = step_10 ] && [ -d "$W/ck/step_5" ]
tap_ok $? "a run of 10 steps with checkpoints at 5 and 10"

# ---------------------------------------------------------------------------
# --resume latest that finds nothing, because --ckpt-dir is mistyped

run typo --steps 3 --ckpt-dir "$W/ckk" --resume latest
rc=$?
[ $rc -eq 0 ] &&
    grep -q "WARN train\] resume latest: no checkpoint in $W/ckk (the directory did not exist before this run); training starts at step 0" "$W/typo.err" &&
    grep -q -- "--resume required makes this an error" "$W/typo.err"
tap_ok $? "--resume latest with a mistyped --ckpt-dir warns on stderr (rc $rc)"

# ---------------------------------------------------------------------------
# what changed since the checkpoint: the schedule, the global batch

cp -R -P "$W/ck" "$W/ck_s"
run sched --steps 14 --warmup 2 --ckpt-dir "$W/ck_s" --resume latest
rc=$?
tap_diag "$(grep WARN "$W/sched.err")"
[ $rc -eq 0 ] &&
    grep -q "WARN train\] resume: the learning-rate schedule differs from the run that wrote $W/ck_s/step_10 (steps 10 -> 14, warmup 0 -> 2): step 11 runs at lr" "$W/sched.err"
tap_ok $? "a resume with other --steps and --warmup names both keys with both values (rc $rc)"
! grep -q "global batch" "$W/sched.err"
tap_ok $? "the same global batch is not reported"

cp -R -P "$W/ck" "$W/ck_b"
run batch --steps 12 --batch-size 2 --ckpt-dir "$W/ck_b" --resume latest
rc=$?
[ $rc -eq 0 ] &&
    grep -q "resume: the global batch differs from the run that wrote the checkpoint: 1 rank x 4 seq x 32 tokens x 1 micro-steps = 128 tokens per step there, 1 x 2 x 32 x 1 = 64 here" "$W/batch.err"
tap_ok $? "a resume with another global batch says so, with both (rc $rc)"
! grep -q "precision differs" "$W/sched.err" "$W/batch.err"
tap_ok $? "the same precision is not reported"

cp -R -P "$W/ck" "$W/ck_p"
run prec --steps 12 --param-dtype bf16 --ckpt-dir "$W/ck_p" --resume latest
rc=$?
[ $rc -eq 0 ] &&
    grep -q "WARN train\] resume: the precision differs from the run that wrote $W/ck_p/step_10 (param-dtype f32 -> bf16)" "$W/prec.err"
tap_ok $? "a resume with another param-dtype names it with both values (rc $rc)"

# ---------------------------------------------------------------------------
# an older step into the same directory

cp -R -P "$W/ck" "$W/ck_o"
run older --steps 10 --ckpt-dir "$W/ck_o" --resume "$W/ck_o/step_5" --metrics "$W/o.jsonl"
rc=$?
[ $rc -eq 0 ] &&
    grep -q "resume: step_5 is older than step_10 in $W/ck_o: from this run's first save on, latest names this run's checkpoints and moves back past it" "$W/older.err" &&
    grep -q "ckpt-keep neither counts nor removes the others" "$W/older.err"
tap_ok $? "resuming an older step warns that latest moves back, and what retention does (rc $rc)"
grep -q '^done: 5 steps (5 -> 10) in ' "$W/older.out"
tap_ok $? "the done line counts this run's steps: 5 steps (5 -> 10)"
"${PYTHON3:-python3}" - "$W/o.jsonl" "$W/ck_o/step_5" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
s = recs[0]
assert s["event"] == "start" and s["resumed_from"] == 5 and s["resumed_dir"] == sys.argv[2], s
assert [r["step"] for r in recs[1:]] == [6, 7, 8, 9, 10], recs
assert all(r["time"] >= s["time"] for r in recs[1:])
PY
tap_ok $? "the metrics start record says which checkpoint the run resumed from"

# ---------------------------------------------------------------------------
# a run that is finished already

run again --steps 10 --ckpt-dir "$W/ck" --resume latest
rc=$?
[ $rc -eq 0 ] &&
    grep -q "^fsdpc-train: already at step 10 of 10 (resumed from $W/ck/step_10): nothing to do$" "$W/again.out" &&
    ! grep -q "nan" "$W/again.out" && ! grep -q '^done:' "$W/again.out"
tap_ok $? "resuming a finished run: already at step 10 of 10, nothing to do, exit 0 (rc $rc)"

# ---------------------------------------------------------------------------
# a checkpoint wherever a model file is taken

"$CKPT" consolidate "$W/ck" -o "$W/c.h5" > /dev/null 2>&1
S="$BIN/fsdpc-sample"
ref=$("$S" --model "$W/c.h5" --prompt "int " --tokens 20 --temperature 0 2> /dev/null | od -c)
ok=0
for p in "$W/ck" "$W/ck/step_10" "$W/ck/step_10/index.h5"; do
    got=$("$S" --model "$p" --prompt "int " --tokens 20 --temperature 0 2> "$W/s.err" | od -c)
    if [ -z "$ref" ] || [ "$got" != "$ref" ] || [ -s "$W/s.err" ]; then
        tap_diag "fsdpc-sample --model $p: $(head -c 300 "$W/s.err")"
        ok=1
    fi
done
tap_ok $ok "fsdpc-sample --model takes a checkpoint root, step directory or index.h5 (the same text as its consolidated model)"
"$S" --model "$W" --tokens 2 > /dev/null 2> "$W/s.err"
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . "$W/s.err")" -eq 1 ] &&
    grep -q "$W: a directory, but not a checkpoint (no index.h5, no latest)" "$W/s.err"
tap_ok $? "fsdpc-sample --model on a directory that is no checkpoint: one line (rc $rc)"

"$TRAIN" --model "$W/ck" --data "$W/train.bin" --batch-size 4 --seq-len 32 --lr 1e-3 \
    --peak-flops 1e11 --steps 1 --metrics "$W/fromck.jsonl" > "$W/fromck.out" 2>&1 &&
    "$TRAIN" --model "$W/c.h5" --data "$W/train.bin" --batch-size 4 --seq-len 32 --lr 1e-3 \
        --peak-flops 1e11 --steps 1 --metrics "$W/fromc.jsonl" > /dev/null 2>&1 &&
    grep -q "^model weights: $W/ck/step_10/index.h5 " "$W/fromck.out" &&
    [ "$(grep '"loss"' "$W/fromck.jsonl" | cut -d, -f2)" = "$(grep '"loss"' "$W/fromc.jsonl" | cut -d, -f2)" ]
tap_ok $? "fsdpc-train --model takes a checkpoint root and starts from its weights"

# ---------------------------------------------------------------------------
# fsdpc-ckpt list

mkdir "$W/ck/.tmp_step_7_1234abcd"
"$CKPT" list "$W/ck" > "$W/list.out" 2>&1
rc=$?
tap_diag "$(cat "$W/list.out")"
[ $rc -eq 0 ] && grep -q "^$W/ck: 2 checkpoints, latest -> step_10$" "$W/list.out" &&
    grep -qE '^ +5  [0-9-]+ [0-9:]+ +[0-9.]+ KiB +1  single rank +complete \(data not read\)$' "$W/list.out" &&
    grep -qE '^ +10  [0-9-]+ [0-9:]+ +[0-9.]+ KiB +1  single rank +complete \(data not read\), latest$' "$W/list.out" &&
    grep -q '^leftover  .tmp_step_7_1234abcd (an interrupted save' "$W/list.out"
tap_ok $? "fsdpc-ckpt list: steps, time, size, ranks, mesh, complete, latest, leftovers (rc $rc)"
rm "$W/ck/step_5/shard_0.h5"
"$CKPT" list "$W/ck" > "$W/list.out" 2>&1 &&
    grep -qE '^ +5  .*INCOMPLETE: .*shard_0.h5: shard 0 of 1 is missing' "$W/list.out"
tap_ok $? "fsdpc-ckpt list: a step with a missing shard is INCOMPLETE, naming it"
"$CKPT" list --quick "$W/ck" > "$W/list.out" 2>&1 &&
    grep -qE '^ +5  .*1  single rank +INCOMPLETE: 0 of 1 shard files present$' "$W/list.out" &&
    grep -qE '^ +10  .*1  single rank +index and 1 shard files present \(not opened: --quick\), latest$' "$W/list.out"
tap_ok $? "fsdpc-ckpt list --quick: the index and the shard files counted, without opening them"
"$CKPT" list "$W/ck/step_10" > /dev/null 2> "$W/list.err"
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . "$W/list.err")" -eq 1 ] &&
    grep -q "is a step directory; list takes the checkpoint root above it" "$W/list.err"
tap_ok $? "fsdpc-ckpt list of a step directory: one line pointing to the root (rc $rc)"

# ---------------------------------------------------------------------------
# a save says when it starts, and (past FSDPC_SAVE_PROGRESS_S) how far it is

(export FSDPC_LOG=info FSDPC_SAVE_PROGRESS_S=0 && run sp --steps 1 --ckpt-dir "$W/sp") &&
    (export FSDPC_LOG=info && run sq --steps 1 --ckpt-dir "$W/sq")
r=$?
s1=$(grep -n "INFO train\] checkpoint step 1: saving to $W/sp/step_1 " "$W/sp.err" | cut -d: -f1)
p1=$(grep -n 'INFO train\] checkpoint step 1: rank 0 has written 1 of [0-9]* tensors' "$W/sp.err" | cut -d: -f1)
w1=$(grep -n "INFO train\] checkpoint step 1 written to $W/sp/step_1 " "$W/sp.err" | cut -d: -f1)
np=$(grep -c 'checkpoint step 1: rank 0 has written' "$W/sp.err")
[ $r -eq 0 ] && [ -n "$s1" ] && [ -n "$p1" ] && [ -n "$w1" ] && [ "$s1" -lt "$p1" ] &&
    [ "$p1" -lt "$w1" ] && [ "$np" -gt 10 ] &&
    grep -q "checkpoint step 1: saving to $W/sq/step_1 " "$W/sq.err" &&
    ! grep -q 'has written' "$W/sq.err"
r=$?
[ $r -eq 0 ] || tap_diag "$(grep checkpoint "$W/sp.err" | head -5)"
tap_ok $r "a save logs its start, then progress lines ($np with FSDPC_SAVE_PROGRESS_S=0, none for a short save by default), then its end"

# ---------------------------------------------------------------------------
# a damaged checkpoint: what list says, and the way out of a failed resume

run d --steps 6 --ckpt-dir "$W/dk" --ckpt-every 2 &&
    mv "$W/dk/step_6/shard_0.h5" "$W/good_shard.h5" &&
    "$BIN/tests/io/bad_model" flip:/model/wte.weight "$W/good_shard.h5" "$W/dk/step_6/shard_0.h5"
tap_ok $? "fixtures: checkpoints at steps 2, 4, 6, one byte of step 6's shard flipped"
"$CKPT" list "$W/dk" > "$W/list.out" 2>&1 &&
    grep -qE '^ +6  .* +complete \(data not read\), latest$' "$W/list.out" &&
    grep -q '^checked: every shard of every step opened .*; not checked: the data against its checksums (--verify reads it' "$W/list.out"
tap_ok $? "list: the damaged step opens, and the last line says the data was not read"
"$CKPT" list --verify "$W/dk" > "$W/list.out" 2>&1
rc=$?
tap_diag "$(cat "$W/list.out")"
[ $rc -eq 0 ] &&
    grep -qE "^ +6  .* +DAMAGED: $W/dk/step_6/shard_0.h5: tensor 'model/wte.weight' rows \[0, [0-9]+\): checksum mismatch .*, latest$" "$W/list.out" &&
    [ "$(grep -cE '^ +[24]  .* +complete, data verified$' "$W/list.out")" -eq 2 ] &&
    grep -q '^checked: every shard of every step opened, and every tensor read back against its checksums$' "$W/list.out"
tap_ok $? "list --verify: step 6 DAMAGED naming the shard and tensor, steps 2 and 4 verified"
run dr --steps 8 --ckpt-dir "$W/dk" --resume
rc=$?
tap_diag "$(cat "$W/dr.err")"
[ $rc -eq 1 ] && [ "$(grep -c '^fsdpc: ' "$W/dr.err")" -eq 2 ] &&
    grep -q "^fsdpc: .*resume: .*shard_0.h5: tensor 'model/wte.weight' .*checksum mismatch" "$W/dr.err" &&
    grep -q "^fsdpc: hint: step_6 is damaged; step_4, the newest older checkpoint in $W/dk, reads back against its checksums: --resume $W/dk/step_4 continues from it" "$W/dr.err"
tap_ok $? "--resume of the damaged step: the error, and a hint naming step_4 and its --resume (rc $rc)"
run dr2 --steps 8 --ckpt-dir "$W/dk" --resume "$W/dk/step_4" &&
    grep -q "^resumed: $W/dk/step_4 " "$W/dr2.out" && grep -q '^done: 4 steps (4 -> 8)' "$W/dr2.out"
tap_ok $? "the hinted --resume continues from step 4 to step 8"

tap_done
