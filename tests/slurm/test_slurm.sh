#!/bin/bash
# test_slurm.sh - the Slurm job scripts on a real one-node Slurm cluster that
# this test brings up and takes down: its own munged (key, socket, pid and
# log in a temporary directory), slurmctld and slurmd with a minimal
# slurm.conf (found by every client through SLURM_CONF; /etc is not touched).
#
#   train.sbatch at 4 ranks (srun --mpi=pmi2, MPICH): ranks, losses, a
#     verified checkpoint and the final model;
#   the same job sent SIGUSR1 while it trains (scancel --signal=USR1): the
#     ranks checkpoint and exit 0, the script requeues the job, the job
#     resumes from that checkpoint and ends with the uninterrupted job's
#     losses, bitwise;
#   train-env.sbatch: one task per node starting 2 env:// ranks on tcp;
#   convert.sbatch: consolidate and export-safetensors of the checkpoint;
#   a job with a missing MODEL fails with one line saying so.
#
# Needs root (slurmd runs the jobs as their users) and the Debian packages
# slurmctld, slurmd, slurm-client and munge; installs them with apt-get when
# they are missing and it can, and reports a skip otherwise.
# FSDPC_TEST_SLURM=0 skips it; FSDPC_TEST_KEEP=1 keeps its directory.
. "$top_srcdir/tests/tap.sh"

skip_all() {
    echo "1..0 # SKIP $1"
    exit 0
}

[ "${FSDPC_TEST_SLURM:-1}" = 0 ] && skip_all "FSDPC_TEST_SLURM=0"
[ "$(id -u)" -eq 0 ] || skip_all "needs root to run slurmd and munged"
have_slurm() {
    for c in slurmctld slurmd sbatch scontrol scancel munged mungekey; do
        command -v "$c" > /dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$c" > /dev/null 2>&1 || return 1
    done
}
export PATH=$PATH:/usr/sbin:/sbin
if ! have_slurm; then
    command -v apt-get > /dev/null 2>&1 || skip_all "missing dependency: slurm (Slurm and munge are not installed and there is no apt-get)"
    echo "# installing slurmctld slurmd slurm-client munge"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurmctld slurmd slurm-client munge; } > "${TMPDIR:-/tmp}/fsdpc-slurm-apt.log" 2>&1 ||
        skip_all "missing dependency: slurm (apt-get could not install slurmctld slurmd slurm-client munge (${TMPDIR:-/tmp}/fsdpc-slurm-apt.log))"
    have_slurm || skip_all "missing dependency: slurm (Slurm programs still missing after apt-get install)"
fi

JS="$top_srcdir/jobscripts/slurm"
BIN="$top_builddir"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-slurm.XXXXXX")
# munged wants its socket directory searchable by everyone and nothing
# writable by others
chmod 711 "$W"
mkdir -p "$W/munge" "$W/state" "$W/spool" "$W/log" "$W/run"
chmod 755 "$W/munge"
export SLURM_CONF="$W/slurm.conf"
pids=""

# ---------------------------------------------------------------------------
# teardown: cancel the jobs, stop the daemons by pid, end what is left of
# what they started (slurmstepd carries the daemons' FSDPC_SLURM_TEST mark, a
# job's processes our SLURM_CONF and a SLURM_JOB_ID), remove the directory
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$pids" ]; then
        scancel --full --quiet -u root > /dev/null 2>&1
        i=0
        while [ -n "$(squeue -h -o %i 2> /dev/null)" ] && [ $i -lt 50 ]; do
            sleep 0.2
            i=$((i + 1))
        done
        # shellcheck disable=SC2086
        kill -TERM $pids 2> /dev/null
        i=0
        while [ $i -lt 50 ]; do
            alive=""
            for p in $pids; do kill -0 "$p" 2> /dev/null && alive="$alive $p"; done
            [ -z "$alive" ] && break
            sleep 0.1
            i=$((i + 1))
        done
        # shellcheck disable=SC2086
        [ -n "$alive" ] && kill -KILL $alive 2> /dev/null
        for e in /proc/[0-9]*/environ; do
            p=${e#/proc/}
            p=${p%/environ}
            [ "$p" = $$ ] && continue
            env_of=$({ tr '\0' '\n' < "$e"; } 2> /dev/null)
            if echo "$env_of" | grep -qx "FSDPC_SLURM_TEST=$W" ||
                { echo "$env_of" | grep -qx "SLURM_CONF=$SLURM_CONF" && echo "$env_of" | grep -q '^SLURM_JOB_ID='; }; then
                kill -KILL "$p" 2> /dev/null
            fi
        done
    fi
    if [ "${FSDPC_TEST_KEEP:-0}" = 1 ]; then echo "# kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# port_free PORT: no socket, listening or connected, IPv4 or IPv6, is bound
# to PORT (a connection's local port blocks a bind as a listener does)
port_free() {
    hex=$(printf ':%04X$' "$1")
    ! cat /proc/net/tcp /proc/net/tcp6 2> /dev/null | awk 'NR > 1 { print $2 }' | grep -q "$hex"
}
# The daemons' two ports come from below the kernel's ephemeral range, which
# every outgoing connection of the tests running beside this one draws from:
# a port free when checked there can be a connection's a moment later.
eph_lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null)
[ "${eph_lo:-0}" -gt 12000 ] 2> /dev/null || eph_lo=32768
port_lo=$((eph_lo > 22000 ? 20000 : 10000))
port_span=$(((eph_lo - 2 - port_lo) / 2 * 2))
# next_ports: set port to the next pair of free adjacent ports after $port
next_ports() {
    tries=0
    port=$((port + 2))
    while ! port_free $port || ! port_free $((port + 1)); do
        port=$((port + 2))
        [ $port -ge $((port_lo + port_span)) ] && port=$port_lo
        tries=$((tries + 1))
        if [ $tries -gt $((port_span / 2)) ]; then
            echo "Bail out! no two free adjacent TCP ports in $port_lo..$((port_lo + port_span)) for slurmctld and slurmd"
            exit 1
        fi
    done
}
port=$((port_lo + $$ % port_span / 2 * 2 - 2))
next_ports

# ---------------------------------------------------------------------------
# munge

mungekey -c -k "$W/munge/munge.key" > "$W/log/mungekey.out" 2>&1 &&
    chmod 400 "$W/munge/munge.key"
FSDPC_SLURM_TEST="$W" munged -F --socket="$W/munge/sock" --key-file="$W/munge/munge.key" --pid-file="$W/munge/pid" \
    --log-file="$W/log/munged.log" --seed-file="$W/munge/seed" > "$W/log/munged.out" 2>&1 &
pids="$pids $!"
i=0
until [ -S "$W/munge/sock" ] || [ $i -ge 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
munge -S "$W/munge/sock" -n 2> /dev/null | unmunge -S "$W/munge/sock" > /dev/null 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/log/munged.out" "$W/log/mungekey.out" 2> /dev/null | tail -n 5)"
tap_ok $r "munged with its own key and socket: a credential round trip"

# ---------------------------------------------------------------------------
# slurm.conf and the daemons

node=$(hostname -s)
hw=$(slurmd -C 2> /dev/null | head -n 1)
cpus=$(echo "$hw" | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p')
mem=$(echo "$hw" | sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p')
# at least 4 CPUs, so that 4 one-CPU tasks fit on a 2-core machine
# (config_overrides: slurmd takes the declared counts over the hardware's)
[ "${cpus:-0}" -ge 4 ] || cpus=4
[ "${mem:-0}" -ge 1 ] || mem=2048
# start_daemons: write slurm.conf for $port and $((port + 1)), start
# slurmctld and slurmd, wait for the node to be idle; 0 when it is
start_daemons() {
    rm -rf "$W/state"/* "$W/spool"/* "$W/log"/slurm*
cat > "$SLURM_CONF" << EOF
# one-node test cluster of tests/slurm/test_slurm.sh
ClusterName=fsdpctest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge/sock
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=5
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=fsdpctest Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    FSDPC_SLURM_TEST="$W" slurmctld -D -i -f "$SLURM_CONF" > "$W/log/slurmctld.out" 2>&1 &
    ctld=$!
    FSDPC_SLURM_TEST="$W" slurmd -D -f "$SLURM_CONF" -N "$node" > "$W/log/slurmd.out" 2>&1 &
    slurmd_pid=$!
    pids="$pids $ctld $slurmd_pid"
    i=0
    until [ "$(sinfo -h -n "$node" -o %T 2> /dev/null)" = idle ] || [ $i -ge 150 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    [ "$(sinfo -h -n "$node" -o %T 2> /dev/null)" = idle ]
}
# stop_daemons: end the two daemons of a start that did not come up
stop_daemons() {
    kill -KILL $ctld $slurmd_pid 2> /dev/null
    wait $ctld $slurmd_pid 2> /dev/null
    pids=$(echo "$pids" | sed "s/ $ctld $slurmd_pid\$//")
}
# A port taken between the check and the daemon's bind is retried on the
# next free pair; any other failure is the test's.
attempt=1
while ! start_daemons; do
    if [ $attempt -lt 3 ] && grep -qs "Address already in use" "$W/log/slurmctld.out" "$W/log/slurmd.out"; then
        echo "# ports $port, $((port + 1)) were taken before the daemons bound them; trying the next pair"
        stop_daemons
        next_ports
        attempt=$((attempt + 1))
        continue
    fi
    break
done
r=1
[ "$(sinfo -h -n "$node" -o %T 2> /dev/null)" = idle ] && r=0
[ $r -eq 0 ] || tap_diag "$(tail -n 5 "$W/log/slurmctld.out" "$W/log/slurmd.out")"
tap_ok $r "slurmctld and slurmd on ports $port, $((port + 1)): node $node idle with $cpus CPUs"
if [ $r -ne 0 ]; then
    tap_done
    exit 1
fi

# ---------------------------------------------------------------------------
# fixtures

sh "$top_srcdir/tests/corpus.sh" 95000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset tiny --seed 1 -o "$W/tiny.h5" > /dev/null 2>&1
tap_ok $? "fixtures: the tiny preset and a token file"

# what the training jobs share: 2 x 32 tokens per rank per step
COMMON="BIN=$BIN,MODEL=$W/tiny.h5,DATA=$W/train.bin,BATCH=2,SEQ_LEN=32,LR=1e-3,THREADS=1"
COMMON="$COMMON,FSDPC_LOG=info,FSDPC_TIMEOUT=60,EXTRA_ARGS=--peak-flops 1e11"

# submit NAME SBATCH_ARGS... : sbatch from $W, output to $W/NAME.out; prints the job id
submit() {
    name=$1
    shift
    sbatch --parsable --chdir="$W" --output="$W/$name.out" --job-name="$name" "$@" 2> "$W/$name.sbatch.err"
}

# field JOB KEY: a field of `scontrol show job`
field() {
    scontrol show job -o "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# wait_job JOB [SECONDS]: polls until the job has ended; leaves its final
# state in $state (not a command substitution: a subshell would hold off the
# INT/TERM trap until it ended). A requeued job is held by Slurm for about two minutes (BeginTime);
# the test makes it eligible 2 s after it sees the requeue instead (slurmd
# refuses a launch whose credential is not newer than the revocation of the
# previous run's, to the second: "Job credential revoked"). The update itself
# makes the scheduler run.
wait_job() {
    if [ -z "$1" ]; then
        state="not submitted"
        return 1
    fi
    moved="" seen=""
    t0=$(date +%s)
    end=$((t0 + ${2:-90}))
    while [ "$(date +%s)" -lt "$end" ]; do
        st=$(field "$1" JobState)
        case $st in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
            state=$st
            tap_diag "job $1: $st after $(($(date +%s) - t0)) s"
            return 0
            ;;
        PENDING)
            n=$(field "$1" Restarts)
            if [ "$(field "$1" Reason)" = BeginTime ] && [ "${n:-0}" -gt 0 ] && [ "$moved" != "$n" ]; then
                [ -n "$seen" ] || seen=$(date +%s)
                if [ $(($(date +%s) - seen)) -ge 2 ]; then
                    scontrol update JobId="$1" StartTime=now > /dev/null 2>&1 && moved=$n seen=""
                fi
            fi
            ;;
        esac
        sleep 0.2
    done
    state="still $(field "$1" JobState) after ${2:-90} s"
    scancel "$1" > /dev/null 2>&1
    return 1
}

# losses FILE: "step loss" per step record of a metrics file
losses() {
    sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"
}

# ---------------------------------------------------------------------------
# train.sbatch, 4 ranks, uninterrupted

STEPS=60
ja=$(submit full --nodes=1 --ntasks-per-node=4 --export="ALL,$COMMON,STEPS=$STEPS,RUN_DIR=$W/full" \
    "$JS/train.sbatch")
wait_job "$ja"
sa=$state
[ "$sa" = COMPLETED ] || tap_diag "job $ja: $sa; $(cat "$W/full.sbatch.err"; tail -n 5 "$W/full.out" 2> /dev/null)"
[ "$sa" = COMPLETED ]
tap_ok $? "train.sbatch (4 tasks, $STEPS steps): job $ja completed"

grep -q '^batch: 4 ranks x 2 seq x 32 tokens' "$W/full.out" &&
    grep -q '^fsdp: mesh dp=4 (mpi)' "$W/full.out" && grep -q 'init mpi' "$W/full.out"
tap_ok $? "train.sbatch: srun --mpi=pmi2 started 4 MPI ranks, sharded dp=4 on the mpi backend"

losses "$W/full/metrics.jsonl" > "$W/full.loss"
[ "$(wc -l < "$W/full.loss")" -eq $STEPS ] && grep -q "^step $STEPS/$STEPS | loss [0-9]" "$W/full.out" &&
    grep -q "^done: $STEPS steps .* final loss [0-9]" "$W/full.out"
tap_ok $? "train.sbatch: $STEPS losses logged (final $(tail -n 1 "$W/full.loss" | cut -d' ' -f2))"

[ "$(readlink "$W/full/ckpt/latest")" = step_$STEPS ] &&
    [ -f "$W/full/ckpt/step_$STEPS/shard_3.h5" ] &&
    "$BIN/fsdpc-ckpt" verify "$W/full/ckpt" > "$W/verify.out" 2>&1 && [ -f "$W/full/final.h5" ]
tap_ok $? "train.sbatch: checkpoint step_$STEPS with 4 shards verifies; final model written"

# ---------------------------------------------------------------------------
# preemption: SIGUSR1 while training -> checkpoint, exit 0, requeue, resume

jb=$(submit pre --nodes=1 --ntasks-per-node=4 --export="ALL,$COMMON,STEPS=$STEPS,RUN_DIR=$W/pre" \
    "$JS/train.sbatch")
end=$(($(date +%s) + 60))
while [ "$(losses "$W/pre/metrics.jsonl" 2> /dev/null | wc -l)" -lt 10 ] && [ "$(date +%s)" -lt "$end" ]; do
    sleep 0.05
done
scancel --signal=USR1 "$jb"
tap_ok $? "scancel --signal=USR1 $jb after $(losses "$W/pre/metrics.jsonl" 2> /dev/null | wc -l) steps"
wait_job "$jb" 120
sb=$state
[ "$sb" = COMPLETED ] || tap_diag "job $jb: $sb; $(tail -n 5 "$W/pre.out" 2> /dev/null)"
k=$(sed -n 's/^preempted: .*checkpoint step \([0-9]*\) written.*/\1/p' "$W/pre.out" | head -n 1)
tap_diag "$(grep -E '^(preempted|train.sbatch):|DUE TO JOB REQUEUE' "$W/pre.out")"
[ "$sb" = COMPLETED ] && [ -n "$k" ] && [ "$k" -lt $STEPS ] &&
    grep -q "^train.sbatch: stopped at checkpoint step $k of $STEPS: requeueing job $jb" "$W/pre.out" &&
    [ "$(field "$jb" Restarts)" = 1 ]
tap_ok $? "the ranks checkpointed at step ${k:-?} and exited 75 (stopped); the script requeued job $jb (Restarts=1)"

grep -q "^train.sbatch: job $jb (restart 1): 4 ranks .*resuming from step $k" "$W/pre.out" &&
    grep -q "^done: $((STEPS - k)) steps ($k -> $STEPS)" "$W/pre.out" &&
    [ "$(readlink "$W/pre/ckpt/latest")" = step_$STEPS ]
tap_ok $? "the requeued job resumed from step ${k:-?} (--resume latest) and finished $STEPS steps"

losses "$W/pre/metrics.jsonl" > "$W/pre.loss"
tap_diag "final loss: uninterrupted $(tail -n 1 "$W/full.loss" | cut -d' ' -f2)," \
    "preempted and resumed $(tail -n 1 "$W/pre.loss" | cut -d' ' -f2)"
[ "$(wc -l < "$W/pre.loss")" -eq $STEPS ] && cmp -s "$W/full.loss" "$W/pre.loss" &&
    cmp -s "$W/full/final.h5" "$W/pre/final.h5"
r=$?
[ $r -eq 0 ] || tap_diag "$(diff "$W/full.loss" "$W/pre.loss" | head -n 4)"
tap_ok $r "preempted + requeued job: the $STEPS losses and the final model equal the uninterrupted job's (bitwise)"

# ---------------------------------------------------------------------------
# train-env.sbatch: one task per node, env:// ranks

jc=$(submit envjob --nodes=1 --cpus-per-task=2 \
    --export="ALL,$COMMON,STEPS=30,RUN_DIR=$W/env,PROCS_PER_NODE=2" "$JS/train-env.sbatch")
wait_job "$jc"
sc=$state
[ "$sc" = COMPLETED ] || tap_diag "job $jc: $sc; $(cat "$W/envjob.sbatch.err"; tail -n 5 "$W/envjob.out" 2> /dev/null)"
[ "$sc" = COMPLETED ] && grep -q '^batch: 2 ranks x 2 seq x 32 tokens' "$W/envjob.out" &&
    grep -q 'init env://; store tcp ' "$W/envjob.out" && grep -q '^fsdp: mesh dp=2 (tcp)' "$W/envjob.out" &&
    [ "$(losses "$W/env/metrics.jsonl" | wc -l)" -eq 30 ] && [ "$(readlink "$W/env/ckpt/latest")" = step_30 ]
tap_ok $? "train-env.sbatch: 1 task starts 2 env:// ranks on tcp; 30 losses; checkpoint step_30"

# ---------------------------------------------------------------------------
# convert.sbatch on the uninterrupted job's checkpoint

jd=$(submit conv --mem=256M --export="ALL,BIN=$BIN,CKPT=$W/full/ckpt" "$JS/convert.sbatch")
wait_job "$jd"
sd=$state
[ "$sd" = COMPLETED ] || tap_diag "job $jd: $sd; $(cat "$W/conv.sbatch.err"; tail -n 5 "$W/conv.out" 2> /dev/null)"
# same weights: their safetensors exports are byte-identical
[ "$sd" = COMPLETED ] && [ -f "$W/full/ckpt/step_$STEPS.h5" ] &&
    "$BIN/fsdpc-ckpt" export-safetensors "$W/full/ckpt/step_$STEPS.h5" -o "$W/a.st" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" export-safetensors "$W/full/final.h5" -o "$W/b.st" > /dev/null 2>&1 &&
    cmp -s "$W/a.st" "$W/b.st"
tap_ok $? "convert.sbatch: consolidate writes step_$STEPS.h5, with the weights of the job's final model"

je=$(submit st --mem=256M --export="ALL,BIN=$BIN,CKPT=$W/full/ckpt/step_$STEPS,ACTION=export-safetensors,DTYPE=bf16" \
    "$JS/convert.sbatch")
wait_job "$je"
se=$state
[ "$se" = COMPLETED ] && [ -s "$W/full/ckpt/step_$STEPS.safetensors" ] &&
    "$BIN/fsdpc-ckpt" import-safetensors "$W/full/ckpt/step_$STEPS.safetensors" -o "$W/back.h5" > /dev/null 2>&1
tap_ok $? "convert.sbatch: export-safetensors (bf16) of step_$STEPS reads back with import-safetensors"

# ---------------------------------------------------------------------------
# bad input inside Slurm

jf=$(submit bad --nodes=1 --ntasks-per-node=1 --export="ALL,$COMMON,MODEL=$W/nope.h5,RUN_DIR=$W/bad" \
    "$JS/train.sbatch")
wait_job "$jf"
sf=$state
[ "$sf" = FAILED ] && [ "$(wc -l < "$W/bad.out")" -eq 1 ] &&
    grep -q "^train.sbatch: MODEL=$W/nope.h5: no such file$" "$W/bad.out"
tap_ok $? "train.sbatch with a missing MODEL: job FAILED, output '$(cat "$W/bad.out")'"

tap_done
