#!/bin/sh
# test_ckpt_faults.sh - checkpoints under faults: a rank SIGKILLed at random
# points while saving every step (20 trials) always leaves `latest` naming a
# complete checkpoint that verify passes and that resumes; a file-size limit
# (disk full) fails the save with an error naming the file, the previous
# checkpoint intact, and --ckpt-keep-going trains on; SIGUSR1 on one rank
# checkpoints at the step boundary and exits 0, and the resumed run ends with
# the losses of an uninterrupted one.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

# rank_pid DIR N: pid of the N-th (1-based) fsdpc-train rank whose command line names DIR
rank_pid() {
    k=0
    for p in $(pgrep -x fsdpc-train); do
        if { tr '\0' ' ' < "/proc/$p/cmdline"; } 2> /dev/null | grep -q -- "--ckpt-dir $1 "; then
            k=$((k + 1))
            if [ "$k" -eq "$2" ]; then
                echo "$p"
                return 0
            fi
        fi
    done
    return 1
}

# wait_lines FILE N: until FILE has N lines (60 s at most: a loaded
# machine can take over 10 s to start two ranks; said when it runs out)
wait_lines() {
    i=0
    while [ "$(cat "$1" 2> /dev/null | wc -l)" -lt "$2" ] && [ $i -lt 1200 ]; do
        sleep 0.05
        i=$((i + 1))
    done
    [ $i -lt 1200 ] || tap_diag "$1: fewer than $2 lines after 60 s"
    [ $i -lt 1200 ]
}

# ---------------------------------------------------------------------------
# SIGKILL during saves

d="$W/kill"
trials=20
good=0
partial=0
msg=""
for i in $(seq 1 $trials); do
    # shellcheck disable=SC2086
    "$MPIEXEC" -n 2 "$TRAIN" $COMMON --batch-size 2 --backend tcp --steps 1000000 \
        --ckpt-dir "$d" --ckpt-every 1 --resume latest > "$W/kill.out" 2>&1 &
    mp=$!
    # once this run has committed a checkpoint of its own it is saving every
    # step: kill a rank at a random point from then on
    before=$(readlink "$d/latest" 2> /dev/null)
    j=0
    while [ "$(readlink "$d/latest" 2> /dev/null)" = "$before" ] && [ $j -lt 200 ]; do
        sleep 0.05
        j=$((j + 1))
    done
    sleep "$(awk -v s="$i" 'BEGIN { srand(s); printf "%.3f", rand() * 0.3 }')"
    victim=$(rank_pid "$d" $((i % 2 + 1)))
    [ -n "$victim" ] && kill -KILL "$victim"
    j=0
    while kill -0 "$mp" 2> /dev/null && [ $j -lt 100 ]; do
        sleep 0.1
        j=$((j + 1))
    done
    kill -0 "$mp" 2> /dev/null && kill -KILL "$mp"
    wait "$mp" 2> /dev/null
    ls -a "$d" | grep -q '^\.tmp_step_' && partial=$((partial + 1))
    if [ -z "$victim" ] || [ ! -L "$d/latest" ]; then
        msg="trial $i: no rank to kill or no latest ($(tail -n 2 "$W/kill.out"))"
        continue
    fi
    s=$(readlink "$d/latest" | sed 's/step_//')
    if ! "$CKPT" verify "$d" > "$W/verify.out" 2>&1; then
        msg="trial $i: verify failed: $(cat "$W/verify.out")"
        continue
    fi
    # loads on one rank (same global batch), takes one step, saves it, and
    # clears the leftovers of the interrupted save
    if ! train 1 --batch-size 4 --ckpt-dir "$d" --resume latest --steps $((s + 1)); then
        msg="trial $i: resume from step $s failed"
        continue
    fi
    if [ "$(readlink "$d/latest")" != "step_$((s + 1))" ] || ls -a "$d" | grep -q '^\.tmp_'; then
        msg="trial $i: after resuming step $s: latest $(readlink "$d/latest"), $(ls -a "$d" | tr '\n' ' ')"
        continue
    fi
    good=$((good + 1))
done
tap_diag "$good of $trials trials good; $partial kills interrupted a save in progress"
[ -z "$msg" ] || tap_diag "$msg"
[ $good -eq $trials ]
tap_ok $? "SIGKILL of a rank during saves: latest always complete, verified and resumable"

# ---------------------------------------------------------------------------
# disk full (file-size limit)

d="$W/full"
train 1 --batch-size 4 --steps 2 --ckpt-dir "$d"
tap_ok $? "a first checkpoint at step 2"

# shellcheck disable=SC2086
(ulimit -f 200 && exec "$TRAIN" $COMMON --batch-size 4 --steps 4 --ckpt-dir "$d" --ckpt-every 1 \
    --resume latest) > "$W/full.out" 2>&1
rc=$?
tap_diag "$(grep fsdpc: "$W/full.out" | tail -n 1)"
[ $rc -ne 0 ] && grep -q 'fsdpc-train: .*/\.tmp_step_3_[0-9a-f]*/shard_0\.h5: .*File too large' "$W/full.out"
tap_ok $? "file-size limit: non-zero exit, the error names the shard file and the reason"

[ "$(readlink "$d/latest")" = step_2 ] && "$CKPT" verify "$d" > /dev/null 2>&1 &&
    ! ls -a "$d" | grep -q '^\.tmp_'
tap_ok $? "the previous checkpoint is intact and latest still names it; no leftovers"

# shellcheck disable=SC2086
(ulimit -f 200 && exec "$TRAIN" $COMMON --batch-size 4 --steps 4 --ckpt-dir "$d" --ckpt-every 1 \
    --resume latest --ckpt-keep-going) > "$W/full2.out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'checkpoint step [34] failed: .*shard_0.h5' "$W/full2.out")" -eq 2 ] &&
    grep -q '^done: 2 steps (2 -> 4)' "$W/full2.out" && [ "$(readlink "$d/latest")" = step_2 ]
tap_ok $? "--ckpt-keep-going: failed saves are logged and training finishes (rc $rc)"

# ---------------------------------------------------------------------------
# preemption by SIGUSR1

d="$W/pre"
steps=600
PRE="--batch-size 2 --backend tcp --steps $steps --lr-schedule cosine --min-lr 1e-4"
# shellcheck disable=SC2086
train 2 $PRE --metrics "$W/pre_a.jsonl"
tap_ok $? "uninterrupted run of $steps steps"

# shellcheck disable=SC2086
"$MPIEXEC" -n 2 "$TRAIN" $COMMON $PRE --ckpt-dir "$d" --metrics "$W/pre_b.jsonl" \
    > "$W/pre.out" 2>&1 &
mp=$!
wait_lines "$W/pre_b.jsonl" 20 && victim=$(rank_pid "$d" 2) && kill -USR1 "$victim"
wait "$mp"
rc=$?
s=$(readlink "$d/latest" | sed 's/step_//')
tap_diag "$(grep '^preempted' "$W/pre.out")"
[ $rc -eq 75 ] && grep -q "^preempted: .*checkpoint step $s written" "$W/pre.out" &&
    [ "$s" -ge 20 ] && [ "$s" -lt $steps ] && ! grep -q '^done:' "$W/pre.out"
tap_ok $? "SIGUSR1 to rank 1: checkpoint at step ${s:-?} and exit 75, stopped (rc $rc)"

# shellcheck disable=SC2086
train 2 $PRE --ckpt-dir "$d" --resume latest --metrics "$W/pre_b.jsonl" &&
    losses "$W/pre_a.jsonl" > "$W/pre_a.loss" && losses "$W/pre_b.jsonl" > "$W/pre_b.loss" &&
    [ "$(wc -l < "$W/pre_a.loss")" -eq $steps ] && cmp -s "$W/pre_a.loss" "$W/pre_b.loss"
tap_ok $? "resumed run finishes with the same per-step and final losses (bitwise)"

# SIGTERM on a single-rank run (no launcher in between)
d="$W/term"
# shellcheck disable=SC2086
"$TRAIN" $COMMON --batch-size 4 --steps 1000000 --ckpt-dir "$d" --metrics "$W/term.jsonl" \
    > "$W/term.out" 2>&1 &
tp=$!
wait_lines "$W/term.jsonl" 10 && kill -TERM "$tp"
wait "$tp"
rc=$?
s=$(readlink "$d/latest" | sed 's/step_//')
[ $rc -eq 75 ] && grep -q "^preempted: .*checkpoint step $s written" "$W/term.out" &&
    "$CKPT" verify "$d" > /dev/null 2>&1
tap_ok $? "SIGTERM on one rank: checkpoint at step ${s:-?}, verified, exit 75 (rc $rc)"

tap_done
