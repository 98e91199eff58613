#!/bin/sh
# test_launchers.sh - the workstation launchers (jobscripts/local/
# train-mpiexec.sh and train-env.sh) train the tiny preset on 2 ranks, log the
# loss, write a checkpoint, and agree on every loss; train-env.sh passes
# SIGUSR1 on (checkpoint, exit 75, resume to the same losses) and stops all
# ranks when one fails; bad inputs give one clear line and a non-zero exit;
# the Slurm job scripts refuse to run outside a Slurm job.
. "$top_srcdir/tests/tap.sh"

JS="$top_srcdir/jobscripts"
BIN="$top_builddir"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-launch.XXXXXX")
trap 'rm -rf "$W"' EXIT
unset SLURM_JOB_ID RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
export FSDPC_LOG=warn FSDPC_TIMEOUT=30

sh "$top_srcdir/tests/corpus.sh" 95000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset tiny --seed 1 -o "$W/tiny.h5" > /dev/null 2>&1
tap_ok $? "fixtures: the tiny preset and a token file of the test corpus"

# what every run shares: 40 steps of 2 x 32 tokens per rank
export BIN MODEL="$W/tiny.h5" DATA="$W/train.bin" RANKS=2 STEPS=40 BATCH=2 SEQ_LEN=32 LR=1e-3 \
    THREADS=1 EXTRA_ARGS="--peak-flops 1e11"

# losses FILE: "step loss" per step record of a metrics file
losses() {
    sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"
}

# trained NAME: the run in $W/NAME logged 2 ranks and 40 losses and left a
# verified checkpoint of step 40
trained() {
    d="$W/$1"
    grep -q '^batch: 2 ranks x 2 seq x 32 tokens' "$d.out" &&
        grep -q '^step 40/40 | loss [0-9]' "$d.out" &&
        [ "$(losses "$d/metrics.jsonl" | wc -l)" -eq 40 ] &&
        [ "$(readlink "$d/ckpt/latest")" = step_40 ] &&
        "$BIN/fsdpc-ckpt" verify "$d/ckpt" > /dev/null 2>&1 && [ -f "$d/final.h5" ]
}

RUN_DIR="$W/mpi" timeout 60 "$JS/local/train-mpiexec.sh" > "$W/mpi.out" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(tail -n 5 "$W/mpi.out")"
[ $rc -eq 0 ] && trained mpi
tap_ok $? "train-mpiexec.sh: 2 ranks, 40 losses logged, checkpoint step_40 verified, final model"

RUN_DIR="$W/env" timeout 60 "$JS/local/train-env.sh" > "$W/env.out" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(tail -n 5 "$W/env.out")"
[ $rc -eq 0 ] && trained env && grep -q '^init *= env://' "$W/env.out" && grep -q '^fsdp: mesh dp=2 (tcp)' "$W/env.out"
tap_ok $? "train-env.sh: 2 env:// ranks on tcp, 40 losses logged, checkpoint step_40 verified"

losses "$W/mpi/metrics.jsonl" > "$W/mpi.loss"
losses "$W/env/metrics.jsonl" > "$W/env.loss"
tap_diag "final loss: mpiexec $(tail -n 1 "$W/mpi.loss" | cut -d' ' -f2), env:// $(tail -n 1 "$W/env.loss" | cut -d' ' -f2)"
[ -s "$W/mpi.loss" ] && cmp -s "$W/mpi.loss" "$W/env.loss"
tap_ok $? "the two launchers give the same losses, the final one included (bitwise)"

# A second launch over a finished run says so and trains nothing.
RUN_DIR="$W/env" "$JS/local/train-env.sh" > "$W/again.out" 2>&1 &&
    grep -q 'latest is at step 40 of 40: training is complete' "$W/again.out"
tap_ok $? "a finished run is not trained again"

# SIGUSR1 to train-env.sh: the ranks checkpoint and exit 75; the same command
# resumes and ends with the losses of the uninterrupted run.
RUN_DIR="$W/pre" STEPS=120 EXTRA_ARGS="--peak-flops 1e11" "$JS/local/train-env.sh" > "$W/pre1.out" 2>&1 &
lp=$!
# signal only once the ranks are training (their handlers are in place);
# the deadline is generous because a loaded machine (make -j check) starts slowly
i=0
while [ "$(losses "$W/pre/metrics.jsonl" 2> /dev/null | wc -l)" -lt 10 ] && [ $i -lt 1800 ]; do
    sleep 0.05
    i=$((i + 1))
done
[ $i -lt 1800 ] || tap_diag "no 10 logged steps after 90 s: $(tail -n 5 "$W/pre1.out")"
kill -USR1 $lp
wait $lp
rc=$?
s=$(readlink "$W/pre/ckpt/latest" | sed 's/step_//')
[ $rc -eq 75 ] && grep -q "^preempted: .*checkpoint step $s written" "$W/pre1.out" && [ "${s:-0}" -ge 10 ] &&
    [ "$s" -lt 120 ]
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -n 8 "$W/pre1.out")"
(exit $r)
tap_ok $? "SIGUSR1 to train-env.sh reaches the ranks: checkpoint at step ${s:-?} of 120, exit 75 (rc $rc)"

RUN_DIR="$W/full" STEPS=120 EXTRA_ARGS="--peak-flops 1e11" "$JS/local/train-mpiexec.sh" > "$W/full.out" 2>&1 &&
    RUN_DIR="$W/pre" STEPS=120 EXTRA_ARGS="--peak-flops 1e11" "$JS/local/train-env.sh" > "$W/pre2.out" 2>&1 &&
    grep -q "resuming from .*latest (step $s)" "$W/pre2.out" &&
    losses "$W/full/metrics.jsonl" > "$W/full.loss" && losses "$W/pre/metrics.jsonl" > "$W/pre.loss" &&
    [ "$(wc -l < "$W/full.loss")" -eq 120 ] && cmp -s "$W/full.loss" "$W/pre.loss"
tap_ok $? "the relaunch resumes from step ${s:-?} and ends with the uninterrupted run's 120 losses (bitwise)"

# One failing rank: the launcher stops the others and returns its status.
mkdir -p "$W/fake"
cat > "$W/fake/fsdpc-train" << 'EOF'
#!/bin/sh
[ "$RANK" = 1 ] && exit 3
exec sleep 60
EOF
chmod +x "$W/fake/fsdpc-train"
t0=$(date +%s)
RUN_DIR="$W/fail" RANKS=3 BIN="$W/fake" timeout 30 "$JS/local/train-env.sh" > "$W/fail.out" 2>&1
rc=$?
t1=$(date +%s)
tap_diag "$(grep 'rank 1' "$W/fail.out")"
[ $rc -eq 3 ] && [ $((t1 - t0)) -lt 8 ] && grep -q 'rank 1 (pid [0-9]*) .*exited with status 3; stopping the other ranks' "$W/fail.out"
tap_ok $? "train-env.sh: rank 1 of 3 fails -> the other ranks are stopped, exit status 3 ($((t1 - t0)) s)"

RUN_DIR="$W/badflag" EXTRA_ARGS="--bach-size 2" timeout 30 "$JS/local/train-env.sh" > "$W/badflag.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'unknown option --bach-size' "$W/badflag.out"
tap_ok $? "train-env.sh: a bad trainer flag fails the launch with the trainer's message (rc $rc)"

# bad inputs: one line on stderr naming the problem, exit status 1
# bad NAME EXPECTED_MESSAGE COMMAND...: runs COMMAND (environment prefixed by the caller)
bad() {
    name=$1
    want=$2
    shift 2
    "$@" > "$W/bad.out" 2> "$W/bad.err"
    rc=$?
    [ $rc -eq 1 ] && [ "$(wc -l < "$W/bad.err")" -eq 1 ] && grep -q -- "$want" "$W/bad.err"
    r=$?
    [ $r -eq 0 ] || tap_diag "rc $rc, stderr: $(head -n 3 "$W/bad.err")"
    tap_ok $r "$name: '$(cat "$W/bad.err")'"
}

bad "train-mpiexec.sh, MODEL unset" "MODEL is not set" env -u MODEL RUN_DIR="$W/b1" "$JS/local/train-mpiexec.sh"
bad "train-mpiexec.sh, MODEL missing" "MODEL=$W/nope.h5: no such file" \
    env MODEL="$W/nope.h5" RUN_DIR="$W/b2" "$JS/local/train-mpiexec.sh"
bad "train-env.sh, MODEL missing" "MODEL=$W/nope.h5: no such file" \
    env MODEL="$W/nope.h5" RUN_DIR="$W/b3" "$JS/local/train-env.sh"
bad "train-env.sh, DATA missing" "DATA=$W/nope.bin: no such file" \
    env DATA="$W/nope.bin" RUN_DIR="$W/b4" "$JS/local/train-env.sh"
bad "train-env.sh, BIN without fsdpc-train" "BIN=$W holds no fsdpc-train" \
    env BIN="$W" RUN_DIR="$W/b5" "$JS/local/train-env.sh"
bad "train-mpiexec.sh, RANKS=0" "RANKS=0 is not a positive integer" \
    env RANKS=0 RUN_DIR="$W/b6" "$JS/local/train-mpiexec.sh"

# the Slurm job scripts outside a Slurm job
for s in train.sbatch train-env.sbatch convert.sbatch; do
    bad "$s outside Slurm" "$s: not inside a Slurm job (SLURM_JOB_ID is unset)" bash "$JS/slurm/$s"
done

# the env:// rank starter is written out twice (a batch job runs a spooled
# copy of its script and cannot source a neighbour): both copies must agree
body() { sed -n '/^fsdpc_run_ranks() {/,/^}/p' "$1"; }
[ -n "$(body "$JS/local/train-env.sh")" ] &&
    [ "$(body "$JS/local/train-env.sh")" = "$(body "$JS/slurm/train-env.sbatch")" ]
tap_ok $? "fsdpc_run_ranks is the same in local/train-env.sh and slurm/train-env.sbatch"

tap_done
