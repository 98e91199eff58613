#!/bin/sh
# test_tp_equiv.sh - tensor parallelism end to end: fsdpc-train over meshes
# with a tp dimension against one rank on the same global batch (batch-size
# x dp x rdp: tp peers read the same batch), GPT-2 and the Llama family
# (grouped-query attention), the single-rank oracle engine
# (tests/train/oracle_ours) as reference. Per-step losses, gradient norms
# (before clipping: a gradient whose replicated parts were counted tp times
# shows there) and the final weights agree to rel 1e-5 (compare_models.py;
# the largest element within 1e-4 of the largest weight, see models())
# for tp=2, tp=4, dp=2,tp=2 and rdp=2,dp=1,tp=2 over tcp, mpi and mixed
# backends, tied and untied, with gradient accumulation (with and without
# no-sync), activation checkpointing, clipping and without it, and the
# sharding modes, with sequence parallelism (the default) and without it;
# bf16 parameters equal one rank with the same policy and
# track f32; f16 loss scaling skips the same steps as one rank; join over
# uneven per-rank data equals the single-rank replay (join_ref). A
# checkpoint of dp=2,tp=2 is one of whole rows that fsdpc-ckpt verify,
# consolidate, reshard and export-hf read as they are, and resumes on
# dp=2,tp=2 (bitwise), dp=4, tp=4, tp=2 and one rank, and a dp=4 checkpoint
# on dp=2,tp=2, continuing like the uninterrupted run. A mesh the
# model cannot be cut over (heads or key/value heads not divisible, tp
# larger than the heads, a sequence not divisible with sequence parallelism)
# is one clear line and no hang. Needs h5py for /usr/bin/python3.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
ORACLE="$BIN/tests/train/oracle_ours"
JOINREF="$BIN/tests/train/join_ref"
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tp.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi
if ! command -v "$MPIEXEC" > /dev/null 2>&1; then
    tap_skip_dep mpiexec "$MPIEXEC not found"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 133000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"
# 4 heads of 8: cut over 2 and 4 ranks
"$BIN/fsdpc-ckpt" init --layers 2 --heads 4 --width 32 --vocab 256 --context 32 --seed 5 \
    -o "$W/tied.h5" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 4 --width 32 --vocab 256 --context 32 --seed 6 \
        --untied -o "$W/untied.h5" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 1 --heads 2 --width 32 --vocab 256 --context 32 --seed 7 \
        -o "$W/h2.h5" > "$W/log" 2>&1
tap_ok $? "models: gpt2 with 4 heads (tied, untied) and with 2"

COMMON="--data $W/tok.bin --seq-len 16 --steps 10 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--weight-decay 0.1 --clip 1.0 --peak-flops 1e11 --log-every 1 --timeout 30 \
--val-data $W/tok.bin --val-every 5 --val-batches 2"

# run NAME NRANKS MODEL B EXTRA...: one training run (NRANKS 1: the oracle);
# metrics and model in $W/NAME.*
run() {
    r_name=$1 r_n=$2 r_model=$3 r_b=$4
    shift 4
    rm -f "$W/$r_name.jsonl"
    if [ "$r_n" -eq 1 ]; then
        # shellcheck disable=SC2086
        "$ORACLE" --run --model "$W/$r_model.h5" $COMMON --batch-size "$r_b" \
            --metrics "$W/$r_name.jsonl" --out "$W/$r_name.h5" "$@" > "$W/$r_name.log" 2>&1
    else
        # shellcheck disable=SC2086
        timeout 60 "$MPIEXEC" -n "$r_n" "$TRAIN" --model "$W/$r_model.h5" $COMMON \
            --batch-size "$r_b" --metrics "$W/$r_name.jsonl" --out "$W/$r_name.h5" "$@" \
            > "$W/$r_name.log" 2>&1
    fi
    r_rc=$?
    [ $r_rc -eq 0 ] || tap_diag "$(tail -5 "$W/$r_name.log")"
    return $r_rc
}

# models A B TOL: the final weights of A and B: the relative L2 difference
# within TOL, the largest element difference within max(TOL, 1e-4) of the
# largest weight. AdamW divides each element's step by its own gradient's
# size, so an element whose gradient is near zero turns the partial sums'
# other order into a visible step (up to 3e-5 of the largest weight after
# 10 steps); tests/tp/test_tp_model.c checks every gradient element of the
# cut models against the whole model to 1e-5 instead.
models() {
    m_out=$("$PY" "$CMP" models "$W/$1.h5" "$W/$2.h5" \
        --tol "$(awk -v t="$3" 'BEGIN { print (t > 1e-4 ? t : 1e-4) }')" 2>&1)
    m_rc=$?
    echo "$m_out"
    m_l2=$(echo "$m_out" | sed -n 's/.*relative L2 difference \([^,]*\),.*/\1/p')
    [ $m_rc -eq 0 ] && awk -v a="$m_l2" -v t="$3" 'BEGIN { exit !(a != "" && a <= t) }'
}

# same NAME REF TOL DESCRIPTION: losses, gradient norms and final model of NAME equal REF's
same() {
    out=$("$PY" "$CMP" losses "$W/$1.jsonl" "$W/$2.jsonl" --tol "$3" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        out2=$(models "$1" "$2" "$3")
        rc=$?
        out="$out
$out2"
    fi
    tap_diag "$out"
    tap_ok $rc "$4"
}

# single-rank references on the global batch
run ref2 1 tied 2 && run ref4 1 tied 4 && run refua 1 untied 4 --grad-accum 3 --clip 0
tap_ok $? "single-rank references: batch 2, batch 4, untied batch 4 x 3 micro-steps unclipped"

# 1. the meshes, over every backend
run tp2 2 tied 2 --mesh tp=2 --backend mpi
tap_ok $? "tp=2 over mpi ran"
grep -q "tensor parallel over 2 ranks, sequence parallel$" "$W/tp2.log"
tap_ok $? "tp=2: the engine reports tensor parallelism, sequence parallel by default"
same tp2 ref2 1e-5 "tp=2 over mpi (sequence parallel) equals one rank"
run tp2nosp 2 tied 2 --mesh tp=2 --backend tcp --sequence-parallel off
tap_ok $? "tp=2 without sequence parallelism ran"
grep -q "tensor parallel over 2 ranks$" "$W/tp2nosp.log"
tap_ok $? "tp=2 --sequence-parallel off: the engine reports tensor parallelism alone"
same tp2nosp ref2 1e-5 "tp=2 without sequence parallelism equals one rank"
run tp4 4 tied 2 --mesh tp=4 --backend tcp
tap_ok $? "tp=4 over tcp ran"
same tp4 ref2 1e-5 "tp=4 over tcp (one head per rank) equals one rank"
run dp2tp2 4 tied 2 --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
tap_ok $? "dp=2,tp=2 over dp=tcp,tp=mpi ran"
grep -q "^batch: 2 ranks (of 4: tp peers share a batch) x 2 seq" "$W/dp2tp2.log"
tap_ok $? "dp=2,tp=2: the global batch is batch-size x dp (tp peers share a batch)"
same dp2tp2 ref4 1e-5 "dp=2,tp=2 over mixed backends equals one rank with batch 4"
run hsdp 4 tied 2 --mesh rdp=2,dp=1,tp=2 --backend mpi
tap_ok $? "rdp=2,dp=1,tp=2 over mpi ran"
same hsdp ref4 1e-5 "rdp=2,dp=1,tp=2 equals one rank with batch 4"
"$BIN/fsdpc-ckpt" init --layers 2 --heads 4 --width 32 --vocab 258 --context 32 --seed 10 \
    --untied -o "$W/v258.h5" > "$W/log" 2>&1 && run ref258 1 v258 2
tap_ok $? "untied gpt2 with a vocabulary of 258 (not a multiple of 4), one rank"
run v258 4 v258 2 --mesh tp=4 --backend mpi
tap_ok $? "vocabulary of 258 over tp=4 (65 rows each, 63 and 2 padding on the last) ran"
same v258 ref258 1e-5 "vocabulary of 258 over tp=4 equals one rank; the padding stays out of the model file"
run none 4 tied 2 --mesh dp=2,tp=2 --sharding none --backend tcp
tap_ok $? "dp=2,tp=2 with sharding none ran"
same none ref4 1e-5 "dp=2,tp=2 with sharding none (tp with DDP) equals one rank"
run nosp4 4 tied 2 --mesh tp=4 --backend mpi --sequence-parallel off
tap_ok $? "tp=4 without sequence parallelism ran"
same nosp4 ref2 1e-5 "tp=4 without sequence parallelism equals one rank"

# 2. accumulation (with and without no-sync), checkpointing, no clipping, untied
run acc 4 untied 2 --mesh dp=2,tp=2 --grad-accum 3 --clip 0 --activation-checkpointing \
    --backend dp=mpi,tp=tcp
tap_ok $? "untied dp=2,tp=2, 3 micro-steps, checkpointing, no clipping ran"
same acc refua 1e-5 "untied dp=2,tp=2 with accumulation and checkpointing equals one rank"
run accns 4 untied 2 --mesh dp=2,tp=2 --grad-accum 3 --clip 0 --no-sync-accum --backend mpi
tap_ok $? "untied dp=2,tp=2 with no-sync accumulation ran"
same accns refua 1e-5 "untied dp=2,tp=2 with no-sync accumulation equals one rank"
run accnosp 4 untied 2 --mesh dp=2,tp=2 --grad-accum 3 --clip 0 --activation-checkpointing \
    --sequence-parallel off --backend tcp
tap_ok $? "untied dp=2,tp=2, accumulation and checkpointing, no sequence parallelism ran"
same accnosp refua 1e-5 "untied dp=2,tp=2 with accumulation and checkpointing, no sequence parallelism, equals one rank"

# 3. mixed precision: against one rank of the same policy (the sharding
# engine on one rank), and bf16 against f32
run refbf 1 tied 4 --param-dtype bf16
tap_ok $? "single rank, param-dtype bf16"
run bf 4 tied 2 --mesh dp=2,tp=2 --param-dtype bf16 --backend tcp
tap_ok $? "dp=2,tp=2 param-dtype bf16 ran"
same bf refbf 1e-5 "dp=2,tp=2 with bf16 parameters equals one rank with bf16 parameters"
out=$("$PY" "$CMP" losses "$W/bf.jsonl" "$W/ref4.jsonl" --tol 1e-2 2>&1)
rc=$?
tap_diag "$out"
tap_ok $rc "dp=2,tp=2 bf16 tracks f32: losses and gradient norms within 1e-2 of one rank in f32"
F16="--param-dtype f16 --reduce-dtype f16 --loss-scale dynamic --loss-scale-init 1e6 --steps 16"
# shellcheck disable=SC2086
run refls 1 tied 4 $F16
tap_ok $? "single rank, f16 with dynamic loss scaling"
# shellcheck disable=SC2086
run ls 4 tied 2 --mesh dp=2,tp=2 $F16 --backend mpi
tap_ok $? "dp=2,tp=2 f16 with dynamic loss scaling ran"
n1=$(grep -c '"grad_norm":null' "$W/refls.jsonl")
n2=$(grep -c '"grad_norm":null' "$W/ls.jsonl")
tap_diag "skipped steps: one rank $n1, dp=2,tp=2 $n2"
[ "$n1" -gt 0 ] && [ "$n1" -lt 16 ] && [ "$n1" -eq "$n2" ]
tap_ok $? "f16 loss scaling: the same steps are skipped as on one rank (decided by every rank)"
same ls refls 5e-3 "dp=2,tp=2 f16 with loss scaling equals one rank within 5e-3"

# 4. join: data ranks with 10 and 11 batches (each file read by both tp peers)
BT=32
"$JOINREF" gen "$W/k_0.bin" $((10 * BT + 21)) 1 $BT && "$JOINREF" gen "$W/k_1.bin" $((11 * BT + 6)) 2 $BT
tap_ok $? "per-data-rank files of 10 and 11 batches"
JB="--model $W/h2.h5 --batch-size 2 --seq-len 16 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--peak-flops 1e11 --log-every 1 --timeout 20 --data $W/k_{rank}.bin --epochs 1"
# shellcheck disable=SC2086
timeout 60 "$MPIEXEC" -n 4 "$TRAIN" $JB --mesh dp=2,tp=2 --backend tcp --metrics "$W/join.jsonl" \
    --out "$W/join.h5" > "$W/join.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(tail -5 "$W/join.log")"
tap_ok $rc "join: dp=2,tp=2 with 10 and 11 batches finishes"
# shellcheck disable=SC2086
out=$("$JOINREF" check 2 "$W/join.jsonl" "$W/join.h5" -- $JB 2>&1)
rc=$?
tap_diag "$out"
tap_ok $rc "join: dp=2,tp=2 equals the single-rank replay of the batches that existed"

# 5. checkpoints: written by dp=2,tp=2 as a data-parallel run's (4 shards of
# whole rows, every tool reads them), resumed on other meshes and back
CK="--lr-schedule constant --steps 8"
# losses NAME REF: the steps of NAME (a resumed run's) against REF's, rel 1e-5
losses() {
    "$PY" -c '
import json, sys
def read(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = read(sys.argv[1]), read(sys.argv[2])
worst = max([abs(a[s] - b[s]) / abs(b[s]) for s in a if s in b] or [1.0])
print("steps %s: worst relative loss difference %.3g" % (sorted(a), worst))
sys.exit(0 if a and set(a) <= set(b) and worst <= 1e-5 else 1)
' "$W/$1.jsonl" "$W/$2.jsonl"
}
# shellcheck disable=SC2086
run full 4 untied 2 --mesh dp=2,tp=2 --backend tcp $CK &&
    run half 4 untied 2 --mesh dp=2,tp=2 --backend tcp $CK --steps 4 --ckpt-dir "$W/ck"
tap_ok $? "untied dp=2,tp=2: 8 steps, and 4 steps with a checkpoint"
"$BIN/fsdpc-ckpt" verify "$W/ck/step_4" > "$W/ver" 2>&1 && grep -q "^ok: .*step 4, 4 shards" "$W/ver"
r=$?
tap_diag "$(tail -1 "$W/ver")"
tap_ok $r "fsdpc-ckpt verify: the tensor-parallel checkpoint is 4 shards of whole rows, checksums matched"
"$BIN/fsdpc-ckpt" consolidate "$W/ck/step_4" -o "$W/cons.h5" > /dev/null 2>&1 &&
    "$PY" "$CMP" models "$W/cons.h5" "$W/ck/step_4/index.h5" --tol 0 > "$W/cmp" 2>&1 &&
    "$BIN/fsdpc-ckpt" reshard "$W/ck/step_4" --world-size 3 -o "$W/rs3" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" verify "$W/rs3" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" export-hf "$W/ck/step_4" -o "$W/hf" > /dev/null 2>&1
r=$?
tap_diag "$(cat "$W/cmp")"
tap_ok $r "fsdpc-ckpt consolidate (equal to index.h5's virtual datasets), reshard and export-hf read it"
# reshard to a tp mesh: dp x tp shards, the same rows as the dp=2,tp=2 run wrote
"$BIN/fsdpc-ckpt" reshard "$W/ck/step_4" --mesh tp=4 -o "$W/rtp4" > "$W/cmp" 2>&1 &&
    grep -q "resharded to tp=4 (4 shards)" "$W/cmp" && "$BIN/fsdpc-ckpt" verify "$W/rtp4" > /dev/null 2>&1 &&
    h5diff -d 0 "$W/ck/step_4/shard_3.h5" "$W/rtp4/shard_3.h5" >> "$W/cmp" 2>&1 &&
    "$BIN/fsdpc-ckpt" reshard "$W/ck/step_4" --mesh rdp=2,dp=1,tp=2 -o "$W/rtp2" >> "$W/cmp" 2>&1 &&
    grep -q "resharded to rdp=2,dp=1,tp=2 (2 shards)" "$W/cmp"
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -3 "$W/cmp")"
tap_ok $r "fsdpc-ckpt reshard --mesh tp=4 and rdp=2,dp=1,tp=2: dp x tp shards of the same rows"
# shellcheck disable=SC2086
run back22 4 untied 2 --mesh dp=2,tp=2 --backend tcp $CK --resume "$W/ck/step_4"
tap_ok $? "resumed on dp=2,tp=2"
cmp -s "$W/back22.h5" "$W/full.h5" && losses back22 full > "$W/cmp" 2>&1
r=$?
tap_diag "$(cat "$W/cmp")"
tap_ok $r "resumed on dp=2,tp=2: steps 5-8 and the final model are the uninterrupted run's (model bitwise)"
# the re-layout a band of columns at a time (here one column a pass: a
# 256-byte bound) writes the same checkpoint: every dataset of every shard
# equal, and the resume as bitwise as above
# shellcheck disable=SC2086
FSDPC_CKPT_RELAYOUT_BYTES=256 run band 4 untied 2 --mesh dp=2,tp=2 --backend tcp $CK --steps 4 \
    --ckpt-dir "$W/ckb" &&
    for s in 0 1 2 3; do
        h5diff -d 0 "$W/ck/step_4/shard_$s.h5" "$W/ckb/step_4/shard_$s.h5" > "$W/cmp" 2>&1 ||
            { echo "shard $s differs" >> "$W/cmp"; false; } || break
    done &&
    run backband 4 untied 2 --mesh dp=2,tp=2 --backend tcp $CK --resume "$W/ckb/step_4" &&
    cmp -s "$W/backband.h5" "$W/full.h5"
r=$?
[ $r -eq 0 ] || tap_diag "$(tail -3 "$W/cmp")"
tap_ok $r "a checkpoint re-laid out one column at a time: the same shards, the same resume (bitwise)"
for to in "4 1 dp=4 mpi" "4 4 tp=4 mpi" "2 4 tp=2 tcp" "1 4 none -"; do
    set -- $to
    if [ "$1" -eq 1 ]; then
        # shellcheck disable=SC2086
        "$TRAIN" --model "$W/untied.h5" $COMMON $CK --batch-size 4 --resume "$W/ck/step_4" \
            --metrics "$W/b1.jsonl" --out "$W/b1.h5" > "$W/b1.log" 2>&1
        r=$? name=b1 what="1 rank"
    else
        # shellcheck disable=SC2086
        run "b$3" "$1" untied "$2" --mesh "$3" --backend "$4" $CK --resume "$W/ck/step_4"
        r=$? name="b$3" what="$3"
    fi
    tap_ok $r "the dp=2,tp=2 checkpoint resumed on $what"
    out=$(models "$name" full 1e-5) && out="$out
$(losses "$name" full 2>&1)"
    r=$?
    tap_diag "$out"
    tap_ok $r "resumed on $what: steps 5-8 and the final model equal the uninterrupted run's"
done
# shellcheck disable=SC2086
run half4 4 untied 1 --mesh dp=4 --backend mpi $CK --steps 4 --ckpt-dir "$W/ck4" &&
    run fromdp 4 untied 2 --mesh dp=2,tp=2 --backend mpi $CK --resume "$W/ck4/step_4"
tap_ok $? "back: a dp=4 checkpoint resumed on dp=2,tp=2"
out=$(models fromdp full 1e-5) && out="$out
$(losses fromdp full 2>&1)"
r=$?
tap_diag "$out"
tap_ok $r "a dp=4 checkpoint resumed on dp=2,tp=2: steps 5-8 and the final model equal the uninterrupted run's"

# 6. the Llama family: q, k, v by heads with grouped-query attention (the
# key/value heads split too), gate/up by features, o_proj/down_proj by columns
LS="--preset llama-tiny --layers 2 --context 32"
"$BIN/fsdpc-ckpt" init $LS --width 48 --ffn 72 --seed 5 -o "$W/ltied.h5" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init $LS --width 48 --ffn 72 --seed 6 --untied --attn-bias \
        -o "$W/luntied.h5" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init $LS --width 64 --ffn 96 --heads 8 --kv-heads 4 --seed 8 \
        -o "$W/l8.h5" > "$W/log" 2>&1
tap_ok $? "llama models: NH=4 NKV=2 tied, untied with q/k/v biases, and NH=8 NKV=4"
run lref2 1 ltied 2 && run lref4 1 luntied 4 && run l8ref 1 l8 2
tap_ok $? "llama single-rank references"
run ltp2 2 ltied 2 --mesh tp=2 --backend mpi
tap_ok $? "llama tp=2 ran"
same ltp2 lref2 1e-5 "llama tp=2 (one key/value head per rank) equals one rank"
run l8tp4 4 l8 2 --mesh tp=4 --backend tcp
tap_ok $? "llama NH=8 NKV=4 tp=4 ran"
same l8tp4 l8ref 1e-5 "llama tp=4 (2 query heads on their key/value head per rank) equals one rank"
run ldp 4 luntied 2 --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi --activation-checkpointing
tap_ok $? "llama untied with biases dp=2,tp=2, checkpointing ran"
same ldp lref4 1e-5 "llama untied with biases dp=2,tp=2 with checkpointing equals one rank"
run lhsdp 4 luntied 2 --mesh rdp=2,dp=1,tp=2 --backend mpi
tap_ok $? "llama rdp=2,dp=1,tp=2 ran"
same lhsdp lref4 1e-5 "llama rdp=2,dp=1,tp=2 equals one rank"
run lnosp 4 luntied 2 --mesh dp=2,tp=2 --backend tcp --sequence-parallel off --grad-accum 2
run lrefacc 1 luntied 4 --grad-accum 2
same lnosp lrefacc 1e-5 "llama dp=2,tp=2 without sequence parallelism, 2 micro-steps, equals one rank"
# shellcheck disable=SC2086
run lhalf 4 luntied 2 --mesh dp=2,tp=2 --backend tcp $CK --steps 4 --ckpt-dir "$W/lck" &&
    run lfull 2 luntied 4 --mesh tp=2 --backend tcp $CK &&
    run lback 2 luntied 4 --mesh tp=2 --backend mpi $CK --resume "$W/lck/step_4"
tap_ok $? "llama: a dp=2,tp=2 checkpoint resumed on tp=2"
out=$(models lback lfull 1e-5) && out="$out
$(losses lback lfull 2>&1)"
r=$?
tap_diag "$out"
tap_ok $r "llama: resumed on tp=2, steps 5-8 and the final model equal the uninterrupted run's"

# 7. activation memory: with sequence parallelism a tp=2 rank saves at most
# 55% of the activations of a rank without tensor parallelism at the same
# per-rank batch (4 layers: the blocks' half plus the head's whole part)
"$BIN/fsdpc-ckpt" init --layers 4 --heads 4 --width 64 --vocab 256 --context 32 --seed 3 \
    -o "$W/mem.h5" > "$W/log" 2>&1
MEM="--model $W/mem.h5 --data $W/tok.bin --lr 1e-3 --seq-len 32 --batch-size 2 --steps 1 \
--peak-flops 1e11 --timeout 30"
saved() {
    sed -n 's/.*activations [0-9]* (saved \([0-9]*\), workspace.*/\1/p' "$W/$1.log" | head -1
}
# shellcheck disable=SC2086
FSDPC_LOG=info "$TRAIN" $MEM > "$W/mem1.log" 2>&1 &&
    FSDPC_LOG=info timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $MEM --mesh tp=2 > "$W/memsp.log" 2>&1 &&
    FSDPC_LOG=info timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $MEM --mesh tp=2 --sequence-parallel off \
        > "$W/memtp.log" 2>&1
tap_ok $? "memory runs: one rank, tp=2 with and without sequence parallelism"
m1=$(saved mem1) msp=$(saved memsp) mtp=$(saved memtp)
tap_diag "saved activations per rank: one rank $m1, tp=2 $mtp, tp=2 sequence parallel $msp bytes"
[ -n "$m1" ] && [ -n "$msp" ] && [ -n "$mtp" ] && [ $((msp * 100)) -le $((m1 * 55)) ] &&
    [ "$msp" -lt "$mtp" ] && [ "$mtp" -lt "$m1" ]
tap_ok $? "tp=2 with sequence parallelism saves at most 55% of one rank's activations, less than without it"

# 8. meshes the model cannot be cut over: one clear line, no hang
bad() {
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n "$1" "$TRAIN" --model "$W/$2.h5" $COMMON --batch-size 2 \
        --mesh $3 > "$W/bad.log" 2>&1
    b_rc=$?
    n=$(grep -c "^fsdpc: rank" "$W/bad.log")
    tap_diag "exit $b_rc: $(grep "^fsdpc: rank" "$W/bad.log")"
    [ $b_rc -ne 0 ] && [ $b_rc -ne 124 ] && [ "$n" -eq 1 ] && grep -q "$4" "$W/bad.log"
}
bad 3 tied tp=3 "n_head 4 is not divisible by tp 3"
tap_ok $? "tp=3 with 4 heads: one line naming n_head and tp, no hang"
bad 4 h2 tp=4 "tp 4 is larger than n_head 2"
tap_ok $? "tp=4 with 2 heads: one line saying tp is larger than the heads, no hang"
bad 4 ltied dp=1,tp=4 "n_kv_head 2 is not divisible by tp 4"
tap_ok $? "llama tp=4 with 2 key/value heads: one line naming n_kv_head and tp, no hang"
bad 2 tied "tp=2 --seq-len 15" "seq-len 15 is not divisible by tp 2"
tap_ok $? "sequence parallel tp=2 with seq-len 15: one line naming seq-len and tp, no hang"
tap_done
