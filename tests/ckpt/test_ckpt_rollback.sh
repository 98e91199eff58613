#!/bin/sh
# test_ckpt_rollback.sh - checkpoints of a run resumed from an older step,
# end to end with fsdpc-train on one rank:
# - fsdpc-train killed before each file-system call of a save that writes
#   an existing step again (crash_shim.so preloaded; every call but the
#   data writes inside a shard, of which every 25th), with the atomic
#   exchange and without it (the copy moved aside, then restored by the
#   restart): the restart always resumes, from a checkpoint that continues
#   with the uninterrupted run's losses, bitwise, and leaves no .tmp_*;
# - --ckpt-keep after a rollback (resume from step_20 while step_30..50 of
#   the abandoned run exist) keeps the resume point and this run's own
#   steps, counts and leaves the abandoned run's later steps with a
#   warning, and removes them once a run has passed them;
# - a latest that names a missing step: resume fails with one line naming
#   it and the steps there are;
# - on a root a crash left (a step moved aside, a partial save) verify,
#   inspect and list say so and change nothing; fsdpc-ckpt recover puts it
#   in order as the next run would.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

SHIM="$top_builddir/tests/ckpt/crash_shim.so"
# a sanitizer build wants its runtime first among the preloads; the shim
# wraps no call the runtime intercepts
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
# the shim compares paths without symbolic links
W=$(cd "$W" && pwd -P)

# steps DIR: its entries, one line
steps() {
    ls "$1" 2> /dev/null | tr '\n' ' '
}

# loss_of FILE STEP: the loss a metrics file records for STEP
loss_of() {
    losses "$1" | awk -v s="$2" '$1 == s { print $2 }' | tail -n 1
}

# ---------------------------------------------------------------------------
# killed while saving a step that exists

train 1 --batch-size 4 --steps 6 --metrics "$W/ref.jsonl" &&
    train 1 --batch-size 4 --steps 4 --ckpt-every 2 --ckpt-dir "$W/base"
tap_ok $? "fixtures: 6 uninterrupted steps; steps 2 and 4 saved, latest -> step_4"

# calls MODE: the calls under the root of one save of step 4 over the
# existing one, resumed from step 2 (MODE 1: no exchange), in $W/calls.MODE
calls() {
    rm -rf "$W/ck" "$W/calls.$1"
    cp -R -P "$W/base" "$W/ck"
    # shellcheck disable=SC2086
    timeout 60 env LD_PRELOAD="$SHIM" FSDPC_CRASH_AT=0 FSDPC_CRASH_UNDER="$W/ck" \
        FSDPC_CRASH_NOTE="$W/calls.$1" FSDPC_CRASH_NO_EXCHANGE="$1" "$TRAIN" $COMMON \
        --batch-size 4 --steps 4 --ckpt-every 2 --ckpt-dir "$W/ck" --resume "$W/ck/step_2" \
        > "$W/last.out" 2>&1
}

# kill_each MODE: for each chosen call k, the save killed before it, then a
# restart that resumes latest and trains to step 6
kill_each() {
    mode=$1
    points=0
    bad=0
    restored=0
    msg=""
    ref5=$(loss_of "$W/ref.jsonl" 5)
    ref6=$(loss_of "$W/ref.jsonl" 6)
    FSDPC_CRASH_NO_EXCHANGE=$mode
    export FSDPC_CRASH_NO_EXCHANGE
    for k in $(awk '$2 !~ /^pwrite/ || $1 % 25 == 0 { print $1 }' "$W/calls.$mode"); do
        points=$((points + 1))
        if ! crash_restart "$W/calls.$mode" "$k" --batch-size 4 --steps 4 --ckpt-every 2 \
            --ckpt-dir "$W/ck" --resume "$W/ck/step_2"; then
            bad=$((bad + 1))
            msg=$crash_msg
            continue
        fi
        grep -q 'step_4 restored from the copy a save of that step moved aside' "$W/last.out" &&
            restored=$((restored + 1))
        # resumed at step 4: the metrics start at step 5
        first=$(losses "$W/m.jsonl" | head -n 1 | cut -d' ' -f1)
        if [ "$first" != 5 ] || [ "$(loss_of "$W/m.jsonl" 5)" != "$ref5" ] ||
            [ "$(loss_of "$W/m.jsonl" 6)" != "$ref6" ] ||
            [ "$(readlink "$W/ck/latest")" != step_6 ] || ls -a "$W/ck" | grep -q '^\.tmp_' ||
            ! "$CKPT" verify "$W/ck/step_4" > /dev/null 2>&1; then
            bad=$((bad + 1))
            msg="call $k ($call): first step $first, losses 5, 6: $(loss_of "$W/m.jsonl" 5) $(loss_of "$W/m.jsonl" 6), expected $ref5 $ref6; $(ls -a "$W/ck" | tr '\n' ' ')"
        fi
    done
    unset FSDPC_CRASH_NO_EXCHANGE
}

for mode in 0 1; do
    what=$([ $mode -eq 0 ] && echo "with the exchange" || echo "without the exchange")
    calls $mode
    ncalls=$(wc -l < "$W/calls.$mode")
    if [ $mode -eq 0 ]; then
        grep -q '^[0-9]* renameat2 .*/\.tmp_step_4_[0-9a-f]* .*/step_4$' "$W/calls.$mode"
    else
        grep -q '^[0-9]* rename .*/step_4 .*/\.tmp_old_step_4_[0-9a-f]*$' "$W/calls.$mode"
    fi
    tap_ok $? "$what: the save of step 4 over the existing one makes $ncalls calls under the root"
    kill_each $mode
    tap_diag "$what: killed before $points of the $ncalls calls, $restored restarts restored step_4 from its aside copy, $bad failed${msg:+; last: $msg}"
    [ $bad -eq 0 ] && [ $points -gt 20 ] && { [ $mode -eq 0 ] || [ $restored -gt 0 ]; }
    tap_ok $? "$what: killed before each of $points calls, the restart resumes step 4 and continues with the uninterrupted losses (bitwise); $bad checkpoints lost"
done

# ---------------------------------------------------------------------------
# retention after a rollback

d="$W/roll"
train 1 --batch-size 4 --steps 50 --ckpt-every 10 --ckpt-dir "$d" --metrics "$W/a.jsonl" &&
    [ "$(steps "$d")" = "latest step_10 step_20 step_30 step_40 step_50 " ]
tap_ok $? "a run of 50 steps saved every 10"

train 1 --batch-size 4 --steps 25 --ckpt-every 5 --ckpt-keep 2 --ckpt-dir "$d" \
    --resume "$d/step_20" --metrics "$W/b.jsonl"
rc=$?
tap_diag "$(grep 'WARN.*ckpt-keep' "$W/last.out")"
[ $rc -eq 0 ] && [ "$(steps "$d")" = "latest step_20 step_25 step_30 step_40 step_50 " ] &&
    [ "$(readlink "$d/latest")" = step_25 ] &&
    grep -q "ckpt-keep: step_50, step_40, step_30 in $d are newer than step_20, which this run resumed from, and not written by this run" "$W/last.out"
tap_ok $? "resumed from step_20, --ckpt-keep 2: step_20 and step_25 kept, the abandoned step_30..50 left with a warning (got: $(steps "$d"))"

train 1 --batch-size 4 --steps 35 --ckpt-every 5 --ckpt-keep 2 --ckpt-dir "$d" --resume latest \
    --metrics "$W/b.jsonl" &&
    [ "$(steps "$d")" = "latest step_30 step_35 step_40 step_50 " ] &&
    [ "$(readlink "$d/latest")" = step_35 ] &&
    grep -q "ckpt-keep: step_50, step_40 in $d are newer than step_25" "$W/last.out"
tap_ok $? "resumed latest (step_25) to step 35: this lineage's newest 2 (step_30 written again, step_35) kept, step_40 and step_50 left (got: $(steps "$d"))"

losses "$W/a.jsonl" | awk '$1 > 20 && $1 <= 35' > "$W/a.loss"
losses "$W/b.jsonl" > "$W/b.loss"
[ "$(wc -l < "$W/b.loss")" -eq 15 ] && cmp -s "$W/a.loss" "$W/b.loss"
r=$?
[ $r -eq 0 ] || tap_diag "$(diff "$W/a.loss" "$W/b.loss" | head -n 6)"
tap_ok $r "the rolled-back run's steps 21..35 have the first run's losses (bitwise)"

train 1 --batch-size 4 --steps 60 --ckpt-every 5 --ckpt-keep 2 --ckpt-dir "$d" --resume latest &&
    [ "$(steps "$d")" = "latest step_55 step_60 " ] && [ "$(readlink "$d/latest")" = step_60 ]
tap_ok $? "a run past the abandoned steps writes them again and keeps 2 (got: $(steps "$d"))"

d="$W/fresh"
mkdir -p "$d" && cp -R -P "$W/base/step_2" "$W/base/step_4" "$d/" &&
    train 1 --batch-size 4 --steps 3 --ckpt-every 1 --ckpt-keep 1 --ckpt-dir "$d" &&
    [ "$(steps "$d")" = "latest step_3 step_4 " ] && [ "$(readlink "$d/latest")" = step_3 ] &&
    grep -q "ckpt-keep: step_4, step_2 in $d are from before this run, which did not resume" \
        "$W/last.out"
tap_ok $? "a fresh run into a directory with another run's step_2 and step_4: keeps 1 of its own (step_2 written again is its own), step_4 left with a warning (got: $(steps "$d"))"

# ---------------------------------------------------------------------------
# a latest that names nothing

d="$W/dangling"
cp -R -P "$W/base" "$d" && ln -sfn step_9 "$d/latest"
# shellcheck disable=SC2086
"$TRAIN" $COMMON --batch-size 4 --steps 6 --ckpt-dir "$d" --resume latest > "$W/out" 2> "$W/err"
rc=$?
tap_diag "$(cat "$W/err")"
[ $rc -ne 0 ] && [ "$(grep -c . "$W/err")" -eq 1 ] &&
    grep -q "resume: $d/latest names step_9, which is missing; step directories in $d: step_4, step_2 (resume one of them by its path)" "$W/err"
tap_ok $? "latest naming a missing step: one line naming it and the steps there are (rc $rc)"

# ---------------------------------------------------------------------------
# the tools on a root a crash left: they say so and change nothing; recover
# puts it in order as the next run would

d="$W/crashed"
cp -R -P "$W/base" "$d" && mv "$d/step_4" "$d/.tmp_old_step_4_5eed" && mkdir "$d/.tmp_step_6_beef" &&
    [ "$(readlink "$d/latest")" = step_4 ]
tap_ok $? "a root whose step_4 an interrupted save moved aside, with a partial step_6"
before=$(ls -a "$d" | tr '\n' ' ')
"$CKPT" verify "$d" > /dev/null 2> "$W/err1"
r1=$?
"$CKPT" inspect "$d/step_4" > /dev/null 2> "$W/err2"
r2=$?
"$CKPT" list "$d" > "$W/list" 2>&1
tap_diag "$(cat "$W/err1" "$W/err2")"
[ $r1 -ne 0 ] && [ $r2 -ne 0 ] &&
    grep -q "hint: an interrupted save moved step_4 of $d aside: 'fsdpc-ckpt recover $d'" "$W/err1" &&
    grep -q "hint: an interrupted save moved step_4 of $d aside: 'fsdpc-ckpt recover $d'" "$W/err2" &&
    grep -q "^leftover  .tmp_old_step_4_5eed: the only copy of step_4" "$W/list" &&
    grep -q "^leftover  .tmp_step_6_beef (an interrupted save; 'fsdpc-ckpt recover $d'" "$W/list" &&
    [ "$(ls -a "$d" | tr '\n' ' ')" = "$before" ]
tap_ok $? "verify, inspect and list name the aside copy and 'fsdpc-ckpt recover', and change nothing"
"$CKPT" recover "$d" > "$W/rec" 2>&1 &&
    grep -q "^$d: step_4 put back from the copy an interrupted save moved aside" "$W/rec" &&
    grep -q "^$d: 1 leftover of interrupted saves removed" "$W/rec" &&
    [ "$(ls -A "$d" | tr '\n' ' ')" = "latest step_2 step_4 " ] &&
    "$CKPT" verify "$d" > /dev/null 2>&1 &&
    [ "$("$CKPT" recover "$d")" = "$d: nothing to recover" ]
tap_ok $? "fsdpc-ckpt recover puts step_4 back and removes the partial save; verify passes; again: nothing to do"
"$CKPT" recover "$d/step_4" > /dev/null 2> "$W/err1"
r1=$?
"$CKPT" recover "$W/nope" > /dev/null 2> "$W/err2"
r2=$?
[ $r1 -ne 0 ] && [ $r2 -ne 0 ] && [ "$(cat "$W/err1" "$W/err2" | grep -c .)" -eq 2 ] &&
    grep -q "is a step directory; recover takes the checkpoint root above it" "$W/err1" &&
    grep -q "$W/nope: No such file or directory" "$W/err2"
tap_ok $? "recover refuses a step directory and a missing path, one line each"

tap_done
