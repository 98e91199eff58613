#!/bin/sh
# test_pp_equiv.sh - the pipeline runtime against one rank: llama-tiny
# (untied, 4 layers) trained on --mesh pp=2 and pp=4 with the gpipe and
# 1f1b schedules, on pp=2,dp=2 with mixed backends (pp=tcp,dp=mpi and
# pp=mpi,dp=tcp), and on pp=2,tp=2 with and without sequence parallelism,
# each against the single-rank oracle engine on the same
# global batch (per-step losses and gradient norms, then the final model,
# rel 1e-5: compare_models.py); the passes each stage ran, as it logs them,
# equal its schedule's table, and the stage inputs it held at most equal
# the schedule's bound (pp_table); --pp-microbatches and --pp-layers;
# validation, and f16 with dynamic loss scaling; checkpoints written under
# pp (and pp x dp, pp x tp) resume on pp (bitwise), dp and one rank, and a
# dp checkpoint on pp; interleaved (2 stages per rank) alone, with dp=2,
# and its checkpoint; 1f1b and interleaved on pp=2 and pp=4 over tcp with
# 4 KiB socket buffers (messages that outgrow them, sends still in flight
# while their sender computes); tied embeddings (llama and gpt2: the last stage holds
# a copy of the embedding, the copies' gradients summed before the update)
# and gpt2 untied; and what the runtime does not do is one line each (a
# split that cannot be made, interleaved settings that make no schedule).
# Needs h5py for /usr/bin/python3 (skips without it).
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
CKPT="$BIN/fsdpc-ckpt"
ORACLE="$BIN/tests/train/oracle_ours"
TABLE="$BIN/tests/pp/pp_table"
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-pp.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 60000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"
SHAPE="--preset llama-tiny --width 48 --ffn 72 --context 32"
"$CKPT" init $SHAPE --layers 4 --seed 6 --untied -o "$W/untied.h5" > "$W/init.out" 2>&1 &&
    "$CKPT" init $SHAPE --layers 4 --seed 5 -o "$W/tied.h5" >> "$W/init.out" 2>&1 &&
    "$CKPT" init $SHAPE --layers 1 --seed 5 --untied -o "$W/one.h5" >> "$W/init.out" 2>&1 &&
    "$CKPT" init $SHAPE --layers 8 --seed 6 --untied -o "$W/eight.h5" >> "$W/init.out" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(cat "$W/init.out")"
tap_ok $rc "llama-tiny: 4 layers untied and tied, 1 and 8 layers untied"
G2="--layers 4 --heads 2 --width 32 --vocab 256 --context 32"
# shellcheck disable=SC2086
"$CKPT" init $G2 --seed 7 -o "$W/gpt2.h5" > "$W/init.out" 2>&1 &&
    "$CKPT" init $G2 --seed 8 --untied -o "$W/gpt2u.h5" >> "$W/init.out" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(cat "$W/init.out")"
tap_ok $rc "gpt2: 4 layers tied and untied"

COMMON="--data $W/tok.bin --seq-len 16 --steps 6 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--weight-decay 0.1 --clip 1.0 --peak-flops 1e11 --log-every 1 --timeout 30"

# run NAME NRANKS MODEL B EXTRA...: one training run (1: the oracle engine;
# 1t: the trainer on one rank)
run() {
    r_name=$1 r_n=$2 r_model=$3 r_b=$4
    shift 4
    rm -f "$W/$r_name.jsonl"
    if [ "$r_n" = 1 ]; then
        # shellcheck disable=SC2086
        "$ORACLE" --run --model "$W/$r_model.h5" $COMMON --batch-size "$r_b" \
            --metrics "$W/$r_name.jsonl" --out "$W/$r_name.h5" "$@" > "$W/$r_name.log" 2>&1
    else
        # shellcheck disable=SC2086
        timeout 90 "$MPIEXEC" -n "${r_n%t}" "$TRAIN" --model "$W/$r_model.h5" $COMMON \
            --batch-size "$r_b" --metrics "$W/$r_name.jsonl" --out "$W/$r_name.h5" "$@" \
            > "$W/$r_name.log" 2>&1
    fi
    r_rc=$?
    [ $r_rc -eq 0 ] || tap_diag "$(tail -5 "$W/$r_name.log")"
    return $r_rc
}

# same NAME REF DESCRIPTION: losses and final model of NAME equal REF's (1e-5)
same() {
    out=$("$PY" "$CMP" losses "$W/$1.jsonl" "$W/$2.jsonl" --tol 1e-5 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        out="$out
$("$PY" "$CMP" models "$W/$1.h5" "$W/$2.h5" --tol 1e-5 2>&1)"
        rc=$?
    fi
    tap_diag "$out"
    tap_ok $rc "$3"
}

# order NAME KIND P M [V]: every pipeline rank's logged passes of step 1
# and its peak of held inputs equal pp_table's
order() {
    o_ok=0
    s=0
    while [ $s -lt "$3" ]; do
        want=$("$TABLE" "$2" "$3" "$4" $s ${5:-1})
        got=$(sed -n "s/.*pipeline rank $s step 1: //p" "$W/$1.log" | head -1)
        if [ "$want" != "$got" ]; then
            tap_diag "rank $s: table '$want', ran '$got'"
            o_ok=1
        fi
        s=$((s + 1))
    done
    tap_ok $o_ok "$1: each rank ran its $2 table (P $3, M $4, V ${5:-1}) and held at most its bound"
    kept "$@"
}

# kept NAME KIND P M [V]: no stage forward ran twice: every rank's every
# step ran M V stage forwards (its chunks' activations kept to the backward)
kept() {
    k_want=$(($4 * ${5:-1}))
    k_got=$(sed -n "s/.*pipeline rank [0-9]* step [0-9]*: \([0-9]*\) stage forwards run.*/\1/p" \
        "$W/$1.log" | sort -u | tr '\n' ' ')
    k_n=$(grep -c "pipeline rank [0-9]* step [0-9]*: [0-9]* stage forwards run" "$W/$1.log")
    tap_diag "$1: stage forwards a step '$k_got' in $k_n step lines"
    [ "$k_got" = "$k_want " ] && [ "$k_n" -ge "$3" ]
    tap_ok $? "$1: every rank ran $k_want stage forwards a step (M V): none recomputed"
}

run ref 1 untied 2 --grad-accum 4
tap_ok $? "one rank, batch 2, 4 micro-steps"
VAL="--val-data $W/tok.bin --val-every 3 --val-batches 2"
# shellcheck disable=SC2086
run ref4 1 untied 4 --grad-accum 4 $VAL
tap_ok $? "one rank, batch 4, 4 micro-steps, validation every 3 steps"

export FSDPC_LOG=warn,fsdp=debug FSDPC_LOG_RANKS=all
for kind in 1f1b gpipe; do
    run "pp2-$kind" 2 untied 2 --grad-accum 4 --mesh pp=2 --pp-schedule $kind --backend tcp
    tap_ok $? "pp=2 $kind over tcp ran"
    same "pp2-$kind" ref "pp=2 $kind equals one rank"
    order "pp2-$kind" $kind 2 4
    run "pp4-$kind" 4 untied 2 --grad-accum 4 --mesh pp=4 --pp-schedule $kind --backend mpi
    tap_ok $? "pp=4 $kind over mpi ran"
    same "pp4-$kind" ref "pp=4 $kind equals one rank"
    order "pp4-$kind" $kind 4 4
done
# interleaved: 2 ranks, 2 stages each (4 stages of one layer, the last
# stage's messages going round to rank 0), alone and with dp=2
run il 2 untied 2 --grad-accum 4 --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 \
    --backend tcp
tap_ok $? "pp=2 interleaved (2 stages per rank) over tcp ran"
same il ref "pp=2 interleaved equals one rank"
order il interleaved 2 4 2
grep -q "rank 0 holds units 0-1, 3-3 " "$W/il.log"
tap_ok $? "interleaved: rank 0 holds the embedding with layer 0, and layer 2 (units 0-1, 3-3)"
# shellcheck disable=SC2086
run ildp 4 untied 2 --grad-accum 4 --mesh pp=2,dp=2 --pp-schedule interleaved --pp-virtual 2 \
    --backend pp=mpi,dp=tcp $VAL
tap_ok $? "pp=2,dp=2 interleaved over pp=mpi, dp=tcp ran"
same ildp ref4 "pp=2,dp=2 interleaved equals one rank with batch 4 (and its val loss)"
export FSDPC_LOG=warn
unset FSDPC_LOG_RANKS

# shellcheck disable=SC2086
run ppdp 4 untied 2 --grad-accum 4 --mesh pp=2,dp=2 --backend pp=tcp,dp=mpi $VAL
tap_ok $? "pp=2,dp=2 1f1b (pp=tcp, dp=mpi) ran"
same ppdp ref4 "pp=2,dp=2 1f1b with mixed backends equals one rank with batch 4 (and its val loss)"
# shellcheck disable=SC2086
run ppdp-g 4 untied 2 --grad-accum 4 --mesh pp=2,dp=2 --pp-schedule gpipe \
    --backend pp=mpi,dp=tcp $VAL
tap_ok $? "pp=2,dp=2 gpipe (pp=mpi, dp=tcp) ran"
same ppdp-g ref4 "pp=2,dp=2 gpipe with mixed backends equals one rank with batch 4 (and its val loss)"

# the sharding policies inside a stage, and the guarded device (nothing
# outside the device touches its memory: the boundary messages, the held
# inputs, a checkpoint's rows)
# shellcheck disable=SC2086
export FSDPC_LOG=warn,fsdp=debug FSDPC_LOG_RANKS=all
run pol 4 untied 2 --grad-accum 4 --mesh pp=2,dp=2 --backend pp=tcp,dp=mpi --no-sync-accum \
    --sharding grad-op --activation-checkpointing --prefetch 2 $VAL
tap_ok $? "pp=2,dp=2 with --no-sync-accum --sharding grad-op --activation-checkpointing --prefetch 2 ran"
same pol ref4 "those policies under pp=2,dp=2 equal one rank with batch 4"
kept pol 1f1b 2 4
export FSDPC_LOG=warn
unset FSDPC_LOG_RANKS
# shellcheck disable=SC2086
run grd 4 untied 2 --grad-accum 4 --mesh pp=2,dp=2 --backend pp=tcp,dp=mpi --device guarded \
    --ckpt-dir "$W/ckg" $VAL
tap_ok $? "pp=2,dp=2 on the guarded device with a checkpoint ran"
same grd ref4 "pp=2,dp=2 on the guarded device equals one rank with batch 4"
"$CKPT" verify "$W/ckg/step_6" > "$W/ver" 2>&1 && grep -q "^ok: .*step 6, 2 shards" "$W/ver"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/ver")"
tap_ok $r "the guarded run's checkpoint verifies (2 shards)"

# tensor parallelism inside each stage: the residual at the boundaries goes
# from each tp rank to the same tp rank of the next stage (with sequence
# parallelism only its rows)
run pptp 4 untied 2 --grad-accum 4 --mesh pp=2,tp=2 --backend tcp
tap_ok $? "pp=2,tp=2 (sequence parallel) over tcp ran"
same pptp ref "pp=2,tp=2 with sequence parallelism equals one rank"
run pptp-nosp 4 untied 2 --grad-accum 4 --mesh pp=2,tp=2 --sequence-parallel off \
    --pp-schedule gpipe --backend mpi
tap_ok $? "pp=2,tp=2 without sequence parallelism, gpipe, over mpi ran"
same pptp-nosp ref "pp=2,tp=2 without sequence parallelism equals one rank"

# large messages: socket buffers of 4 KiB (FSDPC_TCP_SOCKBUF) against
# boundary messages of 24 KiB (batch 4 x 32 tokens x 48), so that a send
# completes only as its receiver takes it and is still in flight while its
# sender computes the next pass (more so behind an uneven split, whose
# heavier stage takes its inputs late): the two groups' queues as the
# message order assumes them, and a send slot written again before its
# send completed would change what the receiver gets
SAVED="$COMMON"
COMMON="$COMMON --seq-len 32 --steps 4"
run ref8 1 eight 4 --grad-accum 8
tap_ok $? "one rank, 8 layers, batch 4 x 32 tokens, 8 micro-steps"
export FSDPC_TCP_SOCKBUF=4096
run sb-1f1b 2 eight 4 --grad-accum 8 --mesh pp=2 --pp-layers 1,7 --backend tcp
tap_ok $? "pp=2 1f1b, split 1,7, over tcp with 4 KiB socket buffers ran"
same sb-1f1b ref8 "pp=2 1f1b with 4 KiB socket buffers and an uneven split equals one rank"
run sb-1f1b4 4 eight 4 --grad-accum 8 --mesh pp=4 --backend tcp
tap_ok $? "pp=4 1f1b over tcp with 4 KiB socket buffers ran"
same sb-1f1b4 ref8 "pp=4 1f1b with 4 KiB socket buffers equals one rank"
run sb-il 2 eight 4 --grad-accum 8 --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 \
    --pp-layers 1,5,1,1 --backend tcp
tap_ok $? "pp=2 interleaved, split 1,5,1,1, over tcp with 4 KiB socket buffers ran"
same sb-il ref8 "pp=2 interleaved with 4 KiB socket buffers and an uneven split equals one rank"
run sb-il4 4 eight 4 --grad-accum 8 --mesh pp=4 --pp-schedule interleaved --pp-virtual 2 \
    --backend tcp
tap_ok $? "pp=4 interleaved over tcp with 4 KiB socket buffers ran"
same sb-il4 ref8 "pp=4 interleaved with 4 KiB socket buffers equals one rank"
unset FSDPC_TCP_SOCKBUF
COMMON="$SAVED"

# tied embeddings (Megatron's way): the last stage holds a copy of the
# embedding for its head, the two copies' gradients are summed before the
# update and the norm counts the embedding once; llama tied and gpt2 tied
# under 1f1b, gpipe with dp=2 and interleaved, and gpt2 untied
run reft 1 tied 2 --grad-accum 4
tap_ok $? "one rank, llama tied"
run pptied 2 tied 2 --grad-accum 4 --mesh pp=2 --backend tcp
tap_ok $? "pp=2 llama tied ran"
same pptied reft "pp=2 with a tied llama equals one rank"
run refg 1 gpt2 2 --grad-accum 4
tap_ok $? "one rank, gpt2 tied"
# shellcheck disable=SC2086
run refg4 1 gpt2 4 --grad-accum 4 $VAL
tap_ok $? "one rank, gpt2 tied, batch 4, validation"
run g4 4 gpt2 2 --grad-accum 4 --mesh pp=4 --backend mpi
tap_ok $? "pp=4 gpt2 tied over mpi ran"
same g4 refg "pp=4 with tied gpt2 equals one rank"
# shellcheck disable=SC2086
run gdp 4 gpt2 2 --grad-accum 4 --mesh pp=2,dp=2 --pp-schedule gpipe --backend pp=tcp,dp=mpi $VAL
tap_ok $? "pp=2,dp=2 gpipe gpt2 tied ran"
same gdp refg4 "pp=2,dp=2 with tied gpt2 equals one rank with batch 4 (and its val loss)"
run gil 2 gpt2 2 --grad-accum 4 --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 \
    --backend tcp
tap_ok $? "pp=2 interleaved gpt2 tied ran"
same gil refg "pp=2 interleaved with tied gpt2 equals one rank"
run refgu 1 gpt2u 2 --grad-accum 4
tap_ok $? "one rank, gpt2 untied"
run gu 2 gpt2u 2 --grad-accum 4 --mesh pp=2 --backend tcp
tap_ok $? "pp=2 gpt2 untied ran"
same gu refgu "pp=2 with untied gpt2 equals one rank"

# f16 parameters with dynamic loss scaling: the scale and the skip decided
# on the whole model's gradient, as on one rank with the same policy
F16="--param-dtype f16 --loss-scale dynamic"
# shellcheck disable=SC2086
run ref16 1 untied 2 --grad-accum 4 $F16
tap_ok $? "one rank, f16 parameters, dynamic loss scale"
# shellcheck disable=SC2086
run pp16 2 untied 2 --grad-accum 4 --mesh pp=2 --backend tcp $F16
tap_ok $? "pp=2 1f1b with f16 parameters and dynamic loss scale ran"
same pp16 ref16 "pp=2 with f16 and dynamic loss scaling equals one rank (loss, norm, scale, model)"

run mb 2 untied 2 --pp-microbatches 4 --mesh pp=2 --pp-layers 1,3 --backend tcp
tap_ok $? "pp=2 with --pp-microbatches 4 and --pp-layers 1,3 ran"
grep -q "rank 0 holds units 0-1 " "$W/mb.log"
tap_ok $? "--pp-layers 1,3: stage 0 holds the embedding and one block"
same mb ref "--pp-microbatches 4 is the step of --grad-accum 4; an uneven split equals one rank"

# checkpoints: rows of the whole tensors whatever the mesh. One written by
# pp=2 at step 4 of 8 resumes on pp=2 bitwise the uninterrupted run, and on
# dp=2 to 1e-5; one written by pp=2,dp=2 (two shards, each by a stage-0
# rank) resumes on one rank, and one written by dp=2 on pp=2, both to 1e-5
COMMON="$COMMON --lr-schedule constant --steps 8"
run full 2 untied 2 --grad-accum 4 --mesh pp=2 --backend tcp
tap_ok $? "pp=2, 8 steps"
run half 2 untied 2 --grad-accum 4 --mesh pp=2 --backend tcp --steps 4 --ckpt-dir "$W/ck"
tap_ok $? "pp=2, 4 steps and a checkpoint"
run back 2 untied 2 --grad-accum 4 --mesh pp=2 --backend tcp --resume "$W/ck/step_4"
sed -n 's/^{"step":\([5-8]\),"loss":\([^,]*\),.*/\1 \2/p' "$W/full.jsonl" > "$W/full.loss"
sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$W/back.jsonl" > "$W/back.loss"
[ "$(wc -l < "$W/back.loss")" -eq 4 ] && cmp -s "$W/full.loss" "$W/back.loss" &&
    cmp -s "$W/full.h5" "$W/back.h5"
r=$?
[ $r -eq 0 ] || tap_diag "$(diff "$W/full.loss" "$W/back.loss")"
tap_ok $r "the pp=2 checkpoint resumed on pp=2: steps 5-8 and the final model bitwise the uninterrupted run's"
run dpback 2 untied 1 --grad-accum 4 --mesh dp=2 --backend mpi --resume "$W/ck/step_4"
tap_ok $? "the pp=2 checkpoint resumed on dp=2"
out=$("$PY" "$CMP" models "$W/dpback.h5" "$W/full.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on dp=2: the final model equals the uninterrupted pp=2 run's"
run half22 4 untied 1 --grad-accum 4 --mesh pp=2,dp=2 --backend pp=tcp,dp=mpi --steps 4 \
    --ckpt-dir "$W/ck2"
tap_ok $? "pp=2,dp=2, 4 steps and a checkpoint"
"$CKPT" verify "$W/ck2/step_4" > "$W/ver" 2>&1 && grep -q "^ok: .*step 4, 2 shards" "$W/ver"
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/ver")"
tap_ok $r "fsdpc-ckpt verify: the pp=2,dp=2 checkpoint holds 2 shards of whole tensors"
run solo 1t untied 2 --grad-accum 4 --resume "$W/ck2/step_4"
tap_ok $? "the pp=2,dp=2 checkpoint resumed on one rank"
out=$("$PY" "$CMP" models "$W/solo.h5" "$W/full.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on one rank: the final model equals the uninterrupted pp=2 run's"
run tphalf 4 untied 2 --grad-accum 4 --mesh pp=2,tp=2 --backend tcp --steps 4 --ckpt-dir "$W/ck4"
tap_ok $? "pp=2,tp=2, 4 steps and a checkpoint"
run tpback 2 untied 1 --grad-accum 4 --mesh dp=2 --backend mpi --resume "$W/ck4/step_4"
tap_ok $? "the pp=2,tp=2 checkpoint resumed on dp=2"
out=$("$PY" "$CMP" models "$W/tpback.h5" "$W/full.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on dp=2: the final model equals the uninterrupted pp=2 run's"
run ilhalf 2 untied 2 --grad-accum 4 --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 \
    --backend tcp --steps 4 --ckpt-dir "$W/ck5"
tap_ok $? "pp=2 interleaved, 4 steps and a checkpoint"
run ilback 2 untied 1 --grad-accum 4 --mesh dp=2 --backend mpi --resume "$W/ck5/step_4"
tap_ok $? "the interleaved checkpoint resumed on dp=2"
out=$("$PY" "$CMP" models "$W/ilback.h5" "$W/full.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on dp=2: the final model equals the uninterrupted pp=2 run's"
run gthalf 2 gpt2 2 --grad-accum 4 --mesh pp=2 --backend tcp --steps 4 --ckpt-dir "$W/ck6"
tap_ok $? "pp=2 gpt2 tied, 4 steps and a checkpoint"
run gtfull 1 gpt2 2 --grad-accum 4
run gtback 2 gpt2 1 --grad-accum 4 --mesh dp=2 --backend mpi --resume "$W/ck6/step_4"
tap_ok $? "the tied pp=2 checkpoint resumed on dp=2"
out=$("$PY" "$CMP" models "$W/gtback.h5" "$W/gtfull.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on dp=2: the final model equals one rank's uninterrupted run (the embedding saved once)"
run dphalf 2 untied 1 --grad-accum 4 --mesh dp=2 --backend mpi --steps 4 --ckpt-dir "$W/ck3"
tap_ok $? "dp=2, 4 steps and a checkpoint"
run ppback 2 untied 2 --grad-accum 4 --mesh pp=2 --backend mpi --resume "$W/ck3/step_4"
tap_ok $? "the dp=2 checkpoint resumed on pp=2"
out=$("$PY" "$CMP" models "$W/ppback.h5" "$W/full.h5" --tol 1e-5 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "resumed on pp=2: the final model equals the uninterrupted pp=2 run's"

# refuse NAME PATTERN DESCRIPTION ARGS...: the run fails with one line matching PATTERN
refuse() {
    f_name=$1 f_pat=$2 f_what=$3
    shift 3
    timeout 60 "$MPIEXEC" -n 2 "$TRAIN" $COMMON --batch-size 2 "$@" > "$W/$f_name.log" 2>&1
    f_rc=$?
    grep -q "$f_pat" "$W/$f_name.log" && [ $f_rc -ne 0 ] && [ $f_rc -ne 124 ]
    r=$?
    [ $r -eq 0 ] || tap_diag "rc $f_rc: $(tail -3 "$W/$f_name.log")"
    tap_ok $r "$f_what"
}
refuse few "stage" "pp=2 of a 1-layer model: one line" --model "$W/one.h5" --mesh pp=2
refuse layers "pp-layers\|layers" "--pp-layers that do not sum to the layers: one line" \
    --model "$W/untied.h5" --mesh pp=2 --pp-layers 1,1
refuse inter "at least 2 virtual stages" "--pp-schedule interleaved without --pp-virtual: one line" \
    --model "$W/untied.h5" --mesh pp=2 --pp-schedule interleaved
refuse interm "multiple\|groups of" "interleaved with micro-batches not a multiple of P: one line" \
    --model "$W/untied.h5" --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 --grad-accum 3
refuse interl "stage" "interleaved with more stages than layers: one line" \
    --model "$W/untied.h5" --mesh pp=2 --pp-schedule interleaved --pp-virtual 4 --grad-accum 4
refuse twice "differ" "--pp-microbatches and a different --grad-accum: one line" \
    --model "$W/untied.h5" --mesh pp=2 --pp-microbatches 4 --grad-accum 2

tap_done
