#!/bin/sh
# test_ckpt_async.sh - checkpoint shards written in the background
# (--ckpt-async), end to end with fsdpc-train:
# - on 2 ranks, on a slow file system (crash_shim.so preloaded, each call
#   under the root delayed), the background saves commit steps later than
#   they began while the loop stopped only for the snapshot; a save due
#   while one is in flight waits for it and says so; every shard file is
#   byte for byte the synchronous save's, and a resume from a background
#   save continues with the uninterrupted run's losses (bitwise);
# - a signal while a background save is in flight: the save is committed
#   first, then the signal's own, and the run exits 75;
# - fsdpc-train killed before each file-system call of a run whose save of
#   step 4 runs in the background (every call but the data writes inside a
#   shard, of which every 25th): the newest checkpoint committed before the
#   kill is never lost, and the restart resumes from it and continues with
#   the uninterrupted run's losses.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

SHIM="$top_builddir/tests/ckpt/crash_shim.so"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
W=$(cd "$W" && pwd -P) # the shim compares paths without symbolic links

# loss_of FILE STEP: the loss a metrics file records for STEP
loss_of() {
    losses "$1" | awk -v s="$2" '$1 == s { print $2 }' | tail -n 1
}

# slow N_RANKS MS ROOT ARGS...: fsdpc-train with every call under ROOT
# delayed MS ms, info log, output in $W/last.out
slow() {
    n=$1 ms=$2 root=$3
    shift 3
    mkdir -p "$root"
    # shellcheck disable=SC2086
    timeout 120 "$MPIEXEC" -n "$n" env LD_PRELOAD="$SHIM" FSDPC_CRASH_UNDER="$root" \
        FSDPC_CRASH_SLOW_MS="$ms" FSDPC_LOG=info "$TRAIN" $COMMON --ckpt-dir "$root" "$@" \
        > "$W/last.out" 2>&1
}

# ---------------------------------------------------------------------------
# the same checkpoints as the synchronous saves, committed in the background

train 2 --batch-size 4 --steps 6 --metrics "$W/ref.jsonl" &&
    train 2 --batch-size 4 --steps 6 --ckpt-every 2 --ckpt-dir "$W/sync" --ckpt-async off
tap_ok $? "fixtures: 6 uninterrupted steps on 2 ranks; checkpoints of steps 2, 4, 6 saved in the loop"

slow 2 3 "$W/bg" --batch-size 4 --steps 6 --ckpt-every 2 --ckpt-async on
rc=$?
cp "$W/last.out" "$W/bg.out"
tap_diag "$(grep 'INFO train\] checkpoint step [0-9]* \(written\|waits\)' "$W/bg.out" | sed 's/.*\] //')"
# every step committed in the background, later than it began, and the loop
# stopped for a small part of that
ok=$(awk '/checkpoint step [246] written to .* in the background/ {
        for (i = 1; i <= NF; i++) {
            if ($i == "committed") c = $(i + 1)
            if ($i == "stopped") s = $(i + 1)
        }
        if (c > 0.2 && s < c / 4) n++
    } END { print n + 0 }' "$W/bg.out")
[ $rc -eq 0 ] && [ "$ok" -eq 3 ] && [ "$(readlink "$W/bg/latest")" = step_6 ]
tap_ok $? "a slow file system: steps 2, 4, 6 committed in the background, each over 0.2 s after it began while the loop stopped under a quarter of that ($ok of 3)"
grep -q 'checkpoint step 4 waits for the save of step 2, still being written' "$W/bg.out"
tap_ok $? "the save of step 4, due while step 2's is in flight, waits for it and says so"

same=0
for s in 2 4 6; do
    for r in 0 1; do
        if cmp -s "$W/sync/step_$s/shard_$r.h5" "$W/bg/step_$s/shard_$r.h5"; then
            same=$((same + 1))
        else
            tap_diag "step_$s/shard_$r.h5 differs from the synchronous save's"
        fi
    done
    "$CKPT" verify "$W/bg/step_$s" > /dev/null 2>&1 || tap_diag "verify step_$s failed"
done
[ $same -eq 6 ] && "$CKPT" verify "$W/bg/step_2" > /dev/null 2>&1 &&
    "$CKPT" verify "$W/bg/step_4" > /dev/null 2>&1 && "$CKPT" verify "$W/bg/step_6" > /dev/null 2>&1
tap_ok $? "every shard file of the background saves is the synchronous save's, byte for byte ($same of 6), and verifies"

train 2 --batch-size 4 --steps 6 --ckpt-dir "$W/bg2" --resume "$W/bg/step_2" \
    --metrics "$W/res.jsonl"
rc=$?
losses "$W/ref.jsonl" | awk '$1 > 2' > "$W/a.loss"
losses "$W/res.jsonl" > "$W/b.loss"
[ $rc -eq 0 ] && [ "$(wc -l < "$W/b.loss")" -eq 4 ] && cmp -s "$W/a.loss" "$W/b.loss"
r=$?
[ $r -eq 0 ] || tap_diag "$(diff "$W/a.loss" "$W/b.loss" | head -n 6)"
tap_ok $r "resumed from the background save of step 2: steps 3..6 have the uninterrupted losses (bitwise)"

# ---------------------------------------------------------------------------
# a signal while a save is in flight

d="$W/sig"
mkdir -p "$d"
# shellcheck disable=SC2086
timeout 120 env LD_PRELOAD="$SHIM" FSDPC_CRASH_UNDER="$d" FSDPC_CRASH_SLOW_MS=10 FSDPC_LOG=info \
    "$TRAIN" $COMMON --batch-size 4 --steps 100000 --ckpt-every 2 --ckpt-dir "$d" \
    --ckpt-async on > "$W/sig.out" 2>&1 &
pid=$!
i=0
while ! grep -q "checkpoint step 2: saving to" "$W/sig.out" && [ $i -lt 600 ]; do
    sleep 0.05
    i=$((i + 1))
done
kill -TERM $pid
wait $pid
rc=$?
stop=$(sed -n 's/^preempted: a rank received SIGTERM; checkpoint step \([0-9]*\) written.*/\1/p' "$W/sig.out")
tap_diag "$(grep -E 'checkpoint step [0-9]+ (written|waits)|^preempted' "$W/sig.out" | sed 's/.*\] //' | head -n 4)"
bgline=$(grep -n "checkpoint step 2 written to $d/step_2 in the background" "$W/sig.out" | cut -d: -f1)
pline=$(grep -n '^preempted' "$W/sig.out" | cut -d: -f1)
[ $rc -eq 75 ] && [ -n "$stop" ] && [ -n "$bgline" ] && [ -n "$pline" ] && [ "$bgline" -lt "$pline" ] &&
    [ "$(readlink "$d/latest")" = "step_$stop" ] && ! ls -a "$d" | grep -q '^\.tmp_' &&
    "$CKPT" verify "$d/step_2" > /dev/null 2>&1 && "$CKPT" verify "$d/step_$stop" > /dev/null 2>&1
tap_ok $? "SIGTERM during the background save of step 2: it is committed first, then step $stop's, latest names it, exit 75 (rc $rc)"

# ---------------------------------------------------------------------------
# killed before each call of a run that saves in the background

train 1 --batch-size 4 --steps 6 --metrics "$W/ref1.jsonl" &&
    train 1 --batch-size 4 --steps 2 --ckpt-every 2 --ckpt-dir "$W/base"
tap_ok $? "fixtures: 6 uninterrupted steps on 1 rank; step 2 saved, latest -> step_2"

rm -rf "$W/ck"
cp -R -P "$W/base" "$W/ck"
# shellcheck disable=SC2086
timeout 60 env LD_PRELOAD="$SHIM" FSDPC_CRASH_AT=0 FSDPC_CRASH_UNDER="$W/ck" \
    FSDPC_CRASH_NOTE="$W/calls" FSDPC_LOG=info "$TRAIN" $COMMON --batch-size 4 --steps 6 \
    --ckpt-every 2 --ckpt-dir "$W/ck" --resume latest --ckpt-async on > "$W/calls.out" 2>&1
ncalls=$(wc -l < "$W/calls")
# the call that moves latest to step_4: from it on, step 4 is the newest committed
k4=$(awk '$2 == "rename" && $3 ~ /\.tmp_step_4_/ { s = 1 } s && $2 == "rename" && $NF ~ /\/latest$/ { print $1; exit }' "$W/calls")
grep -q 'checkpoint step 4 written to .* in the background' "$W/calls.out" && [ -n "$k4" ]
tap_ok $? "the run resumed from step 2 saves step 4 in the background and step 6: $ncalls calls under the root, latest moves to step_4 at call $k4"

points=0
bad=0
msg=""
for k in $(awk '$2 !~ /^pwrite/ || $1 % 25 == 0 { print $1 }' "$W/calls"); do
    points=$((points + 1))
    if ! crash_restart "$W/calls" "$k" --batch-size 4 --steps 6 --ckpt-every 2 \
        --ckpt-dir "$W/ck" --resume latest --ckpt-async on; then
        bad=$((bad + 1))
        msg=$crash_msg
        continue
    fi
    # the step the restart resumed from: the newest committed before the kill
    first=$(losses "$W/m.jsonl" | head -n 1 | cut -d' ' -f1)
    from=$((${first:-7} - 1))
    want=2
    [ "$k" -gt "$k4" ] && want=4
    good=1
    { [ "$from" -lt "$want" ] || [ "$(readlink "$W/ck/latest")" != step_6 ] ||
        ls -a "$W/ck" | grep -q '^\.tmp_' ||
        ! "$CKPT" verify "$W/ck/step_6" > /dev/null 2>&1; } && good=0
    for s in 3 4 5 6; do
        if [ "$s" -gt "$from" ] && [ "$(loss_of "$W/m.jsonl" $s)" != "$(loss_of "$W/ref1.jsonl" $s)" ]; then
            good=0
        fi
    done
    if [ $good -eq 0 ]; then
        bad=$((bad + 1))
        msg="call $k ($call): resumed from step $from (at least $want expected), losses $(losses "$W/m.jsonl" | tr '\n' ' '); $(ls -a "$W/ck" | tr '\n' ' ')"
    fi
done
tap_diag "killed before $points of the $ncalls calls, $bad failed${msg:+; last: $msg}"
[ $bad -eq 0 ] && [ $points -gt 40 ]
tap_ok $? "killed before each of $points calls (background shard writes included): the restart resumes from the newest committed step and continues with the uninterrupted losses (bitwise); $bad checkpoints lost"

tap_done
