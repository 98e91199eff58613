#!/bin/sh
# test_join.sh - join for uneven inputs (--epochs, --uneven join|stop,
# per-rank data files): three ranks with 10, 11 and 13 batches train to the
# end without hanging, over tcp and mpi, with and without gradient
# accumulation, and every run's per-step losses and final weights equal a
# single-rank replay of exactly the batches that existed at each step,
# averaged over the ranks that contributed (join_ref.c, which also explains
# the tolerance). --uneven stop ends at step 10 on every rank; a shared file
# that does not split evenly joins at its last step; one rank (local engine)
# runs whole passes; pipelines (pp=2,dp=2) shadow as a whole when their
# replica runs out; a resumed run continues exactly and a resume that cannot
# know the per-rank cursors is refused; bad input is one clear line.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
REF="$BIN/tests/train/join_ref"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-join.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

# ---------------------------------------------------------------------------
# fixtures: B = 2, T = 16 (32 tokens per micro-batch), a 2-layer model

BT=32
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 256 --context 32 --seed 5 \
    -o "$W/m.h5" > /dev/null 2>&1
ok=$?
# per-rank files, K = 1: 10, 11, 13 steps (+ tails shorter than a step, left out)
for spec in "0 10 20" "1 11 5" "2 13 0"; do
    set -- $spec
    "$REF" gen "$W/k1_$1.bin" $(($2 * BT + 1 + $3)) $((1 + $1)) $BT || ok=1
    # K = 2: 10, 11, 13 steps of two micro-batches (+ one micro-batch left over on rank 1)
    "$REF" gen "$W/k2_$1.bin" $(($2 * 2 * BT + 1 + ($1 == 1) * BT)) $((7 + $1)) $BT || ok=1
done
# one shared file of 10 global steps of 3 ranks plus two ranks' slices: step 11 joins rank 2
"$REF" gen "$W/shared.bin" $((10 * 3 * BT + 2 * BT + 1)) 11 $BT || ok=1
tap_ok $ok "fixtures: model, per-rank files of 10, 11, 13 steps, a shared file"

BASE="--model $W/m.h5 --batch-size 2 --seq-len 16 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--peak-flops 1e11 --log-every 1 --timeout 20"

# run NAME NRANKS OPTIONS...: one run (bounded by a timeout); log, metrics and model in $W/NAME.*
run() {
    r_name=$1 r_n=$2
    shift 2
    rm -f "$W/$r_name.jsonl"
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n "$r_n" "$TRAIN" $BASE --metrics "$W/$r_name.jsonl" \
        --out "$W/$r_name.h5" "$@" > "$W/$r_name.log" 2>&1
    r_rc=$?
    [ $r_rc -eq 0 ] || tap_diag "exit $r_rc: $(tail -5 "$W/$r_name.log")"
    return $r_rc
}

# same NAME NRANKS OPTIONS...: NAME's losses and model equal the single-rank replay
same() {
    s_name=$1 s_n=$2
    shift 2
    # shellcheck disable=SC2086
    out=$("$REF" check "$s_n" "$W/$s_name.jsonl" "$W/$s_name.h5" -- $BASE "$@" 2>&1)
    s_rc=$?
    tap_diag "$out"
    return $s_rc
}

steps_of() {
    grep -c '"loss"' "$W/$1.jsonl" 2> /dev/null
}

# ---------------------------------------------------------------------------
# join: 10, 11 and 13 batches on 3 ranks

for be in tcp mpi; do
    O="--data $W/k1_{rank}.bin --epochs 1 --backend $be"
    # shellcheck disable=SC2086
    run "join-$be" 3 $O
    tap_ok $? "join over $be: 3 ranks with 10, 11, 13 batches finish"
    [ "$(steps_of "join-$be")" = 13 ]
    tap_ok $? "join over $be: 13 steps, the longest rank's"
    # shellcheck disable=SC2086
    same "join-$be" 3 $O
    tap_ok $? "join over $be equals one rank averaging the contributing ranks each step"
done

grep -q 'rank 0 out of data at step 11 (pass 1 of 1); 2 of 3 ranks contribute' "$W/join-tcp.log" ||
    FSDPC_LOG=info run join-log 3 --data "$W/k1_{rank}.bin" --epochs 1 --backend tcp
log="$W/join-log.log"
[ -f "$log" ] || log="$W/join-tcp.log"
grep -q 'rank 0 out of data at step 11 (pass 1 of 1); 2 of 3 ranks contribute' "$log" &&
    grep -q 'rank 1 out of data at step 12 (pass 1 of 1); 1 of 3 ranks contribute' "$log" &&
    grep -q 'pass 1 of 1 ended after step 13: no rank has data left; training ends' "$log"
tap_ok $? "rank 0 logs when ranks start joining and when the data ends"
[ "$(grep -c 'out of data' "$log")" -eq 2 ]
tap_ok $? "each rank's join is logged once"

# gradient accumulation, with and without no-sync
O="--data $W/k2_{rank}.bin --epochs 1 --grad-accum 2"
# shellcheck disable=SC2086
run join-k2 3 $O --backend tcp && [ "$(steps_of join-k2)" = 13 ] && same join-k2 3 $O
tap_ok $? "join with grad-accum 2 over tcp equals the replay (a lone micro-batch is left out)"
# shellcheck disable=SC2086
run join-k2ns 3 $O --backend mpi --no-sync-accum && same join-k2ns 3 $O
tap_ok $? "join with grad-accum 2 and no-sync over mpi equals the replay"

# two passes, another sharding mode, clipping that bites
O="--data $W/k1_{rank}.bin --epochs 2 --clip 0.5"
# shellcheck disable=SC2086
run join-e2 3 $O --backend tcp --sharding grad-op && [ "$(steps_of join-e2)" = 26 ] &&
    same join-e2 3 $O
tap_ok $? "two passes (26 steps), grad-op sharding, clip 0.5: equals the replay"

# 2 and 4 ranks
# shellcheck disable=SC2086
run join-w2 2 --data "$W/k1_{rank}.bin" --epochs 1 --backend mpi &&
    [ "$(steps_of join-w2)" = 11 ] && same join-w2 2 --data "$W/k1_{rank}.bin" --epochs 1
tap_ok $? "2 ranks (10 and 11 batches) equal the replay"
cp "$W/k1_0.bin" "$W/k1_3.bin"
run join-w4 4 --data "$W/k1_{rank}.bin" --epochs 1 --backend tcp &&
    same join-w4 4 --data "$W/k1_{rank}.bin" --epochs 1
tap_ok $? "4 ranks (10, 11, 13, 10 batches) equal the replay"

# pipelines: the stages of a pipeline read the same batches (per-rank files
# go by dp rank), so a replica out of data shadows as a whole pipeline; the
# runs equal the replay of dp=2 (10 and 11 batches); 1f1b with a tied head
# and gpipe with accumulation
run join-pp 4 --data "$W/k1_{rank}.bin" --epochs 1 --mesh pp=2,dp=2 --backend tcp &&
    [ "$(steps_of join-pp)" = 11 ] && same join-pp 2 --data "$W/k1_{rank}.bin" --epochs 1
tap_ok $? "pp=2,dp=2 (1f1b, tied head): a pipeline out of data shadows; equals the replay"
O="--data $W/k2_{rank}.bin --epochs 1 --grad-accum 2"
# shellcheck disable=SC2086
run join-ppk2 4 $O --mesh pp=2,dp=2 --pp-schedule gpipe --backend pp=mpi,dp=tcp &&
    [ "$(steps_of join-ppk2)" = 11 ] && same join-ppk2 2 $O
tap_ok $? "pp=2,dp=2 gpipe, grad-accum 2: equals the replay"

# a shared file that does not split evenly over 3 ranks: step 11 has two slices
run shared 3 --data "$W/shared.bin" --epochs 1 --backend tcp &&
    [ "$(steps_of shared)" = 11 ] && same shared 3 --data "$W/shared.bin" --epochs 1
tap_ok $? "shared file, 3 ranks: the last step joins rank 2 and equals the replay"

# one rank: the local engine runs whole passes (and stops at the end of the data)
"$TRAIN" $BASE --data "$W/k1_2.bin" --epochs 2 --metrics "$W/one.jsonl" --out "$W/one.h5" \
    > "$W/one.log" 2>&1 && [ "$(steps_of one)" = 26 ] &&
    same one 1 --data "$W/k1_2.bin" --epochs 2
tap_ok $? "one rank, 2 epochs: 26 steps, equals the replay"

# ---------------------------------------------------------------------------
# stop

FSDPC_LOG=info run stop 3 --data "$W/k1_{rank}.bin" --epochs 1 --uneven stop --backend mpi
tap_ok $? "uneven stop over mpi finishes"
[ "$(steps_of stop)" = 10 ] && same stop 3 --data "$W/k1_{rank}.bin" --epochs 1 --uneven stop
tap_ok $? "uneven stop: 10 steps on every rank, equal to the replay"
grep -q 'uneven stop: rank 0 out of data at step 11; pass 1 of 1 ends here on all 3 ranks' \
    "$W/stop.log"
tap_ok $? "uneven stop is logged"

# ---------------------------------------------------------------------------
# checkpoints: resume in the middle of the join phase continues exactly

O="--data $W/k1_{rank}.bin --epochs 1 --backend tcp"
# shellcheck disable=SC2086
run ck-a 3 $O --ckpt-dir "$W/ck" --ckpt-every 11 && [ -d "$W/ck/step_11" ]
tap_ok $? "join run with a checkpoint at step 11"
# shellcheck disable=SC2086
run ck-b 3 $O --resume "$W/ck/step_11" && [ "$(steps_of ck-b)" = 2 ]
tap_ok $? "resumed at step 11: two more steps"
out=$("$REF" same-model "$W/ck-b.h5" "$W/ck-a.h5" 2>&1)
rc=$?
tap_diag "$out"
tap_ok $rc "the resumed run's final model is the uninterrupted run's"
# a checkpoint at a pass boundary (13 steps per pass, 2 passes): the next
# pass has already started when it is written, and the resume must agree
O2="--data $W/k1_{rank}.bin --epochs 2 --backend tcp"
# shellcheck disable=SC2086
run ck-d 3 $O2 --ckpt-dir "$W/ck2" --ckpt-every 13 && [ -d "$W/ck2/step_13" ] &&
    run ck-e 3 $O2 --resume "$W/ck2/step_13" && [ "$(steps_of ck-e)" = 13 ]
tap_ok $? "per-rank files, 2 passes: resumed at the pass boundary (step 13), 13 more steps"
out=$("$REF" same-model "$W/ck-e.h5" "$W/ck-d.h5" 2>&1)
rc=$?
tap_diag "$out"
tap_ok $rc "the run resumed at the pass boundary ends with the uninterrupted run's model"
# shellcheck disable=SC2086
run ck-c 2 --data "$W/k1_{rank}.bin" --epochs 1 --backend tcp --resume "$W/ck/step_11"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep "^fsdpc: " "$W/ck-c.log" | grep -vc "^fsdpc: hint: ")" -eq 1 ] &&
    grep -q 'per-rank data files .*: the checkpoint was written by 3 ranks and this run has 2' \
        "$W/ck-c.log"
tap_ok $? "resume on 2 ranks with per-rank files is refused with one line"

# ---------------------------------------------------------------------------
# bad input: one clear line, no hang

# only_error NAME FILE: NAME's log has one error line in all, and it names FILE
# (the ranks agree on the failure before any of them exits, so the line
# cannot be lost to the launcher tearing the job down, nor be repeated)
only_error() {
    [ "$(grep "^fsdpc: " "$W/$1.log" | grep -vc "^fsdpc: hint: ")" -eq 1 ] &&
        [ "$(grep -c "$2" "$W/$1.log")" -eq 1 ] &&
        grep -q "^fsdpc: rank .*: data: $2: cannot open: No such file" "$W/$1.log"
}

mv "$W/k1_1.bin" "$W/k1_1.away"
run missing 3 --data "$W/k1_{rank}.bin" --epochs 1 --backend tcp
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && only_error missing "$W/k1_1.bin"
tap_ok $? "a missing per-rank file: one line naming it, no hang (exit $rc)"
mv "$W/k1_2.bin" "$W/k1_2.away"
run missing2 3 --data "$W/k1_{rank}.bin" --epochs 1 --backend mpi
rc=$?
mv "$W/k1_1.away" "$W/k1_1.bin"
mv "$W/k1_2.away" "$W/k1_2.bin"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && only_error missing2 "$W/k1_1.bin" &&
    grep -q "2 of 3 ranks failed here" "$W/missing2.log" && ! grep -q "k1_2.bin" "$W/missing2.log"
tap_ok $? "two missing per-rank files: one line, the lowest rank's, counting both (exit $rc)"

expect_error() {
    desc=$1 want=$2
    shift 2
    # shellcheck disable=SC2086
    timeout 30 "$TRAIN" $BASE "$@" > "$W/err.out" 2> "$W/err.log"
    e_rc=$?
    [ $e_rc -ne 0 ] && [ $e_rc -ne 124 ] && grep -q "$want" "$W/err.log"
    e_ok=$?
    [ $e_ok -eq 0 ] || tap_diag "exit $e_rc: $(cat "$W/err.log")"
    tap_ok $e_ok "$desc"
}
expect_error "an unknown {field} in data" "unknown field '{node}'" \
    --data "$W/k1_{node}.bin" --epochs 1
expect_error "uneven without epochs" "uneven needs epochs" \
    --data "$W/k1_0.bin" --steps 3 --uneven stop
expect_error "neither steps nor epochs" "missing required option 'steps'" --data "$W/k1_0.bin"
expect_error "a file with no full step" "no rank has a full step" \
    --data "$W/k1_0.bin" --epochs 1 --grad-accum 11
expect_error "warmup longer than the passes" "warmup 20 is longer than the run's 10 steps" \
    --data "$W/k1_0.bin" --epochs 1 --warmup 20

tap_done
