#!/bin/sh
# test_print_memory.sh - fsdpc-train --print-memory plans each rank's memory
# on one process, without allocating it:
#  - on small meshes its engine line is byte for byte the line the engine
#    logs when a real run creates it (FSDPC_LOG=info), over GPT-2 and Llama,
#    one rank, uneven dp, unit 0 by rows, HSDP, tp with and without sequence
#    parallelism, every sharding kind, bf16, accumulation without sync,
#    activation checkpointing, prefetch, an LM-head chunk;
#  - the parts it prints add up to its total;
#  - a preset of real size (llama-8b) on a 512-rank mesh is planned under a
#    1 GiB address-space limit, so nothing of that size is allocated, and
#    sharding over more ranks plans less per rank;
#  - with a pp dimension (pp=2, pp=2,dp=2, interleaved, pp=2,tp=2) the
#    engine line of pipeline rank 0 is the one its engine logs; each rank
#    is listed with the forwards it holds at most (1f1b: P - rank), the
#    parts of the largest add up, and llama-8b on pp=4,dp=16,tp=8 is
#    planned under 1 GiB (test_guarded.sh checks pp part by part);
#  - the refusals are one line each (no such model or preset, a mesh
#    dimension the trainer does not use, a tp the heads do not divide, a
#    seq-len past the context, a missing --batch-size, a pipeline schedule
#    that cannot be made);
#  - the checkpoint snapshot of --ckpt-async is the bytes a run's takes;
#  - under a launcher the plan is printed once, by rank 0.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-printmem.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn OPENBLAS_NUM_THREADS=1

sh "$top_srcdir/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 -o "$W/g.h5" \
        > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset llama-tiny --layers 2 --seed 1 -o "$W/l.h5" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 4 --heads 2 --width 32 --context 64 --seed 1 -o "$W/g4.h5" \
        > /dev/null 2>&1
tap_ok $? "fixtures: a token file, GPT-2 (2 and 4 layers) and a Llama model"

# the real engine's line (rank 0, logged at create) against the plan's
# same_line NAME RANKS MODEL ARGS...
same_line() {
    name=$1 n=$2 model=$3
    shift 3
    if [ "$n" -gt 1 ]; then
        launch="$MPIEXEC -n $n"
    else
        launch=""
    fi
    # shellcheck disable=SC2086
    FSDPC_LOG=info timeout 120 $launch "$TRAIN" --model "$W/$model" --data "$W/train.bin" \
        --lr 1e-3 --steps 1 "$@" > "$W/run.out" 2> "$W/run.err"
    real=$(grep -h "fsdp: .*-way shards x .* total [0-9]* bytes" "$W/run.out" "$W/run.err" |
        sed 's/^.*\(fsdp: [0-9]*-way shards\)/\1/' | head -1)
    "$TRAIN" --print-memory --model "$W/$model" "$@" > "$W/plan.out" 2> "$W/plan.err"
    plan=$(sed -n 's/^engine line: //p' "$W/plan.out")
    if grep -q "^engine line, pp rank 0: " "$W/plan.out"; then # world rank 0: pipeline rank 0
        plan=$(sed -n 's/^engine line, pp rank 0: //p' "$W/plan.out")
    fi
    [ -n "$real" ] && [ "$real" = "$plan" ]
    tap_ok $? "$name: the plan's engine line is the engine's"
    if [ -z "$real" ] || [ "$real" != "$plan" ]; then
        tap_diag "engine: $real" "plan:   $plan"
        tail -3 "$W/run.err" "$W/plan.err" | tap_diag "$(cat)"
    fi
}

same_line "gpt2, one rank" 1 g.h5 --batch-size 4 --seq-len 32
same_line "gpt2, dp=3 (uneven rows, unit 0 by rows)" 3 g.h5 --batch-size 1 --seq-len 16 \
    --mesh dp=3 --backend tcp
same_line "gpt2, rdp=2,dp=2, reduce bf16, prefetch 2" 4 g.h5 --batch-size 2 --seq-len 32 \
    --mesh rdp=2,dp=2 --backend tcp --reduce-dtype bf16 --prefetch 2
same_line "gpt2, tp=2 without sequence parallelism, grad-op" 2 g.h5 --batch-size 2 \
    --seq-len 32 --mesh tp=2 --backend tcp --sequence-parallel off --sharding grad-op
same_line "gpt2, dp=2, reshard-after-forward off, LM-head chunk 8" 2 g.h5 --batch-size 2 \
    --seq-len 32 --mesh dp=2 --backend tcp --reshard-after-forward off --lm-head-chunk 8
same_line "llama, dp=3, bf16 params, accumulation without sync" 3 l.h5 --batch-size 2 \
    --seq-len 32 --mesh dp=3 --backend tcp --param-dtype bf16 --grad-accum 2 --no-sync-accum
same_line "llama, dp=2,tp=2, activation checkpointing" 4 l.h5 --batch-size 2 --seq-len 32 \
    --mesh dp=2,tp=2 --backend tcp --activation-checkpointing
same_line "llama, dp=2, sharding none (DDP)" 2 l.h5 --batch-size 2 --seq-len 32 --mesh dp=2 \
    --backend tcp --sharding none
same_line "llama, pp=2 1f1b, 4 micro-batches" 2 l.h5 --batch-size 2 --seq-len 32 --mesh pp=2 \
    --backend tcp --grad-accum 4
same_line "llama, pp=2,dp=2 gpipe" 4 l.h5 --batch-size 2 --seq-len 32 --mesh pp=2,dp=2 \
    --backend tcp --grad-accum 2 --pp-schedule gpipe
same_line "gpt2, pp=2 interleaved (2 stages per rank)" 2 g4.h5 --batch-size 2 --seq-len 32 \
    --mesh pp=2 --backend tcp --grad-accum 4 --pp-schedule interleaved --pp-virtual 2
same_line "llama, pp=2,tp=2 sequence parallel" 4 l.h5 --batch-size 2 --seq-len 32 \
    --mesh pp=2,tp=2 --backend tcp --grad-accum 2

# ---------------------------------------------------------------------------
# a model of real size, planned without its memory

# bytes of the plan's row starting with $2, in file $1
row() { awk -v k="$2" 'index($0, "  " k) == 1 { print $(NF - 2) }' "$1"; }

(ulimit -v 1048576 && "$TRAIN" --print-memory --model llama-8b --mesh dp=64,tp=8 \
    --batch-size 1 --seq-len 8192 --param-dtype bf16 --activation-checkpointing \
    > "$W/8b.out" 2> "$W/8b.err")
rc=$?
[ $rc -eq 0 ] && grep -q "^model: preset llama-8b: llama .*8030261248 parameters" "$W/8b.out" &&
    grep -q "^mesh: dp=64,tp=8 (512 ranks)" "$W/8b.out"
tap_ok $? "llama-8b on dp=64,tp=8 planned in under 1 GiB of address space (rc $rc)"
[ $rc -ne 0 ] && tap_diag "$(cat "$W/8b.err")"

total=$(row "$W/8b.out" "total, held")
sum=$(awk '/^  / && !/total, held/ && !/^  \+/ { s += $(NF - 2) } END { printf "%.0f", s }' \
    "$W/8b.out")
[ -n "$total" ] && [ "$total" = "$sum" ]
tap_ok $? "the parts add up to the total ($sum = $total)"

# shards are 1/(dp x tp) of 16 bytes per parameter, up to padding
shards=$(row "$W/8b.out" "parameter shards")
awk -v s="$shards" 'BEGIN { e = 8030261248 * 4 / 512; exit !(s >= e && s < e * 1.01) }'
tap_ok $? "parameter shards are 1/512 of the f32 weights ($shards bytes)"
grep -q "^  + from the first checkpoint on" "$W/8b.out"
tap_ok $? "tensor parallelism: the checkpoint re-layout buffer is listed"

(ulimit -v 1048576 && "$TRAIN" --print-memory --model llama-8b --mesh dp=128,tp=8 \
    --batch-size 1 --seq-len 8192 --param-dtype bf16 --activation-checkpointing \
    > "$W/8b2.out" 2>&1)
t2=$(row "$W/8b2.out" "total, held")
s2=$(row "$W/8b2.out" "parameter shards")
[ -n "$t2" ] && [ "$t2" -lt "$total" ] && [ "$s2" -lt "$shards" ]
tap_ok $? "twice the shards, less per rank ($t2 < $total bytes)"

# a pipeline of real size: every rank listed, rank r of 1f1b holding at
# most P - r forwards, the parts of the largest adding up
(ulimit -v 1048576 && "$TRAIN" --print-memory --model llama-8b --mesh pp=4,dp=16,tp=8 \
    --batch-size 1 --seq-len 8192 --param-dtype bf16 --activation-checkpointing --grad-accum 8 \
    > "$W/pp.out" 2> "$W/pp.err")
rc=$?
n=$(grep -c "^  pp rank \([0-3]\) .*in flight at most" "$W/pp.out")
bounds=$(sed -n 's/^  pp rank [0-9] .*in flight at most \([0-9]*\) .*/\1/p' "$W/pp.out" | tr '\n' ' ')
ptotal=$(row "$W/pp.out" "total, held")
psum=$(awk '/^  / && !/total, held/ && !/^  \+/ && !/^  pp rank/ { s += $(NF - 2) } END { printf "%.0f", s }' \
    "$W/pp.out")
[ $rc -eq 0 ] && [ "$n" = 4 ] && [ "$bounds" = "4 3 2 1 " ] && [ -n "$ptotal" ] &&
    [ "$ptotal" = "$psum" ] && grep -q "^  pipeline stage inputs received" "$W/pp.out"
tap_ok $? "llama-8b on pp=4,dp=16,tp=8: 4 ranks holding at most $bounds forwards, parts add up ($psum = $ptotal)"
[ $rc -eq 0 ] || tap_diag "$(cat "$W/pp.err")"

"$TRAIN" --print-memory --model llama-1b --batch-size 1 --seq-len 2048 > "$W/1b.out" 2>&1 &&
    grep -q "^mesh: dp=1 (1 rank)" "$W/1b.out" &&
    [ "$(row "$W/1b.out" "parameter shards")" -eq $((1235814400 * 4)) ]
tap_ok $? "one rank without --mesh: the whole model's f32 weights"

# ---------------------------------------------------------------------------
# --ckpt-async's snapshot: the plan's row is the bytes the run's snapshot
# takes on its largest rank (dp rank 0 of uneven rows; with tp the rows of
# checkpoint shard 0 of dp x tp); none with the saves in the loop

# shellcheck disable=SC2086
FSDPC_LOG=warn,train=debug timeout 120 $MPIEXEC -n 3 "$TRAIN" --model "$W/g.h5" \
    --data "$W/train.bin" --lr 1e-3 --steps 1 --batch-size 1 --seq-len 16 --mesh dp=3 \
    --backend tcp --ckpt-dir "$W/ck" --ckpt-every 1 --ckpt-async on > "$W/run.out" 2> "$W/run.err"
real=$(sed -n 's/.*checkpoint step 1: snapshot of \([0-9]*\) bytes taken.*/\1/p' "$W/run.err")
"$TRAIN" --print-memory --model "$W/g.h5" --batch-size 1 --seq-len 16 --mesh dp=3 \
    > "$W/snap.out" 2>&1
plan=$(row "$W/snap.out" "+ host, pinned: checkpoint snapshot")
[ -n "$real" ] && [ "$real" = "$plan" ]
tap_ok $? "dp=3: the planned checkpoint snapshot is the run's ($plan = $real bytes)"
# shellcheck disable=SC2086
FSDPC_LOG=warn,train=debug timeout 120 $MPIEXEC -n 2 "$TRAIN" --model "$W/g.h5" \
    --data "$W/train.bin" --lr 1e-3 --steps 1 --batch-size 1 --seq-len 16 --mesh tp=2 \
    --backend tcp --ckpt-dir "$W/cktp" --ckpt-every 1 --ckpt-async on > "$W/run.out" 2> "$W/run.err"
real=$(sed -n 's/.*checkpoint step 1: snapshot of \([0-9]*\) bytes taken.*/\1/p' "$W/run.err")
"$TRAIN" --print-memory --model "$W/g.h5" --batch-size 1 --seq-len 16 --mesh tp=2 \
    > "$W/snap.out" 2>&1
plan=$(row "$W/snap.out" "+ host, pinned: checkpoint snapshot")
[ -n "$real" ] && [ "$real" = "$plan" ]
tap_ok $? "tp=2: the planned checkpoint snapshot is the run's ($plan = $real bytes)"
"$TRAIN" --print-memory --model "$W/g.h5" --batch-size 1 --seq-len 16 --ckpt-async off \
    > "$W/snap2.out" 2>&1 && grep -q '^  total, held' "$W/snap2.out" &&
    ! grep -q 'checkpoint snapshot' "$W/snap2.out"
tap_ok $? "no snapshot row with --ckpt-async off"

# ---------------------------------------------------------------------------
# refusals: one line, non-zero exit

# refused NAME PATTERN ARGS...
refused() {
    name=$1 pat=$2
    shift 2
    "$TRAIN" --print-memory "$@" > "$W/r.out" 2> "$W/r.err"
    rc=$?
    [ $rc -ne 0 ] && [ "$(grep -c . "$W/r.err")" -le 2 ] && grep -q "$pat" "$W/r.err" &&
        ! grep -q "^engine line" "$W/r.out"
    tap_ok $? "refused: $name (rc $rc)"
    [ $rc -eq 0 ] || grep -q "$pat" "$W/r.err" || tap_diag "$(cat "$W/r.err")"
}
refused "no such model or preset" "model nosuch.h5: no such file, and not a preset (gpt2: tiny" \
    --model nosuch.h5 --batch-size 1 --seq-len 16
refused "a mesh dimension the trainer does not use" "dimension 'ep' is not one the trainer uses" \
    --model llama-8b --mesh dp=2,ep=2 --batch-size 1 --seq-len 16
refused "a pipeline schedule that cannot be made" "micro-batches" \
    --model llama-8b --mesh pp=2,dp=2 --batch-size 1 --seq-len 16 --pp-schedule interleaved \
    --pp-virtual 2 --grad-accum 3
refused "tp that does not divide the heads" "n_head 32 is not divisible by tp 3" \
    --model llama-8b --mesh dp=2,tp=3 --batch-size 1 --seq-len 16
refused "seq-len past the context" "seq-len 128 is longer than the context 64" \
    --model "$W/g.h5" --batch-size 1 --seq-len 128
refused "no --batch-size" "missing required option 'batch-size'" --model llama-8b --seq-len 16

# ---------------------------------------------------------------------------
# under a launcher: once

if command -v "$MPIEXEC" > /dev/null 2>&1; then
    n=$(timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --print-memory --model "$W/g.h5" --batch-size 2 \
        --seq-len 32 2>&1 | grep -c "^engine line: fsdp: 2-way shards")
    [ "$n" = 1 ]
    tap_ok $? "under mpiexec -n 2: printed once, for dp=2 ($n)"
else
    tap_skip_dep "$MPIEXEC" "the launcher check needs MPICH's mpiexec"
fi

tap_done
