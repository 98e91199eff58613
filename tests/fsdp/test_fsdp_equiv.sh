#!/bin/sh
# test_fsdp_equiv.sh - the sharding engine against the single-rank oracle
# engine (tests/train/oracle_engine.c, run by oracle_ours --run) on
# the same global batch: per-step losses (JSONL metrics) and the final model
# (--out) agree to rel 1e-5 (compare_models.py says how that is measured;
# it compares each step's gradient norm and loss scale as well as its loss)
# for 2, 3 and 4 ranks over tcp and mpi, tied and untied embeddings, every
# sharding mode, prefetch depth, hybrid sharding, gradient accumulation with
# and without no-sync, and activation checkpointing. Mixed precision and
# loss scaling are compared with a single-rank run of the same policy.
# Needs h5py for /usr/bin/python3 (skips without it).
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
# single-rank references: the oracle engine, or for options only the
# sharding engine has (16-bit dtypes, loss scaling, ...) the sharding engine
# on one rank
ORACLE="$BIN/tests/train/oracle_ours"
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-fsdp.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 133000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 256 --context 32 --seed 5 \
    -o "$W/tied.h5" > "$W/log" 2>&1
tap_ok $? "tied model"
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --vocab 256 --context 32 --seed 6 \
    --untied -o "$W/untied.h5" > "$W/log" 2>&1
tap_ok $? "untied model"

COMMON="--data $W/tok.bin --seq-len 16 --steps 10 --lr 3e-3 --warmup 2 --min-lr 3e-4 \
--weight-decay 0.1 --clip 1.0 --peak-flops 1e11 --log-every 1 --timeout 30 \
--val-data $W/tok.bin --val-every 5 --val-batches 2"

# run NAME NRANKS MODEL B EXTRA...: one training run; metrics and model in $W/NAME.*
# (variables r_*: sh has no locals, and callers loop over n)
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

# same NAME REF TOL DESCRIPTION: losses and final model of NAME equal REF's
same() {
    out=$("$PY" "$CMP" losses "$W/$1.jsonl" "$W/$2.jsonl" --tol "$3" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        out2=$("$PY" "$CMP" models "$W/$1.h5" "$W/$2.h5" --tol "$3" 2>&1)
        rc=$?
        out="$out
$out2"
    fi
    tap_diag "$out"
    tap_ok $rc "$4"
}

# single-rank references, global batch 2N
for n in 2 3 4; do
    run "ref$n" 1 tied $((2 * n))
    tap_ok $? "single rank, tied, batch $((2 * n))"
done
run refu2 1 untied 4
tap_ok $? "single rank, untied, batch 4"

# 1. full sharding: world sizes 2..4 over both backends
for be in tcp mpi; do
    for n in 2 3 4; do
        run "full-$be-$n" "$n" tied 2 --mesh "dp=$n" --backend "$be"
        tap_ok $? "dp=$n over $be ran"
        same "full-$be-$n" "ref$n" 1e-5 "dp=$n over $be equals one rank with batch $((2 * n))"
    done
    run "untied-$be" 2 untied 2 --mesh dp=2 --backend "$be"
    tap_ok $? "untied dp=2 over $be ran"
    same "untied-$be" refu2 1e-5 "untied dp=2 over $be equals one rank"
done
run one 1 tied 4 --mesh dp=1
tap_ok $? "the sharding engine on one rank ran"
same one ref2 1e-5 "the sharding engine on one rank equals the local engine"

# unit 0 by rows (doc/sharding.md): GPT-2 takes it when its tables, V +
# context = 288 rows, exceed 2 W B T: the runs above (at most 2 x 4 x 2 x
# 16 = 256) have it; 8 sequences per rank at dp=2 (512) keep it gathered
grep -q "| unit 0 by rows" "$W/full-tcp-2.log" && grep -q "| unit 0 by rows" "$W/untied-mpi.log"
tap_ok $? "dp=2 with 2 sequences per rank takes unit 0 by rows (tied and untied)"
run refb16 1 tied 16
tap_ok $? "single rank, tied, batch 16"
run gathered 2 tied 8 --mesh dp=2 --backend tcp
tap_ok $? "dp=2 with 8 sequences per rank ran"
! grep -q "unit 0 by rows" "$W/gathered.log"
tap_ok $? "dp=2 with 8 sequences per rank keeps unit 0 gathered"
same gathered refb16 1e-5 "dp=2 with unit 0 gathered equals one rank with batch 16"

# rows split unevenly, and parameters with fewer rows than ranks (C = 2 at 4 ranks)
"$BIN/fsdpc-ckpt" init --layers 1 --heads 1 --width 2 --vocab 256 --context 32 --seed 9 \
    --untied -o "$W/narrow.h5" > "$W/log" 2>&1
tap_ok $? "narrow model (C = 2)"
run refn 1 narrow 4
run narrow 4 narrow 1 --backend mpi
tap_ok $? "narrow model over 4 ranks ran"
same narrow refn 1e-5 "parameters with fewer rows than ranks: 4 ranks equal one rank"

# 2. sharding modes and prefetch depths
for mode in "--reshard-after-forward off" "--sharding grad-op" "--sharding none" \
    "--prefetch 0" "--prefetch 3"; do
    tag=$(echo "$mode" | tr -c 'a-z0-9\n' '_')
    # shellcheck disable=SC2086
    run "mode$tag" 4 tied 2 --backend tcp $mode
    tap_ok $? "4 ranks $mode ran"
    same "mode$tag" ref4 1e-5 "4 ranks $mode equals one rank"
done

# 3. hybrid: shard over dp, replicate over rdp
run hsdp 4 tied 2 --mesh rdp=2,dp=2 --backend tcp
tap_ok $? "rdp=2,dp=2 ran"
same hsdp ref4 1e-5 "rdp=2,dp=2 equals one rank"
run hsdp-mpi 4 untied 1 --mesh rdp=2,dp=2 --backend mpi
tap_ok $? "untied rdp=2,dp=2 over mpi ran"
run refu4 1 untied 4
same hsdp-mpi refu4 1e-5 "untied rdp=2,dp=2 over mpi equals one rank"

run hsdp-none 4 tied 2 --mesh rdp=2,dp=2 --sharding none --backend tcp
tap_ok $? "rdp=2,dp=2 with sharding none ran"
same hsdp-none ref4 1e-5 "rdp=2,dp=2 with sharding none (all-reduce over both) equals one rank"

# 3b. without clipping: a gradient off by a constant factor (an average over
# the wrong number of ranks or micro-steps) is rescaled away by a clip that
# acts every step, but shows here in every step's gradient norm and update
run refc0 1 tied 8 --clip 0
tap_ok $? "single rank, batch 8, no clipping"
run hsdpc0 4 tied 2 --mesh rdp=2,dp=2 --clip 0 --backend tcp
tap_ok $? "rdp=2,dp=2 without clipping ran"
same hsdpc0 refc0 1e-5 "rdp=2,dp=2 without clipping equals one rank"
run fullc0 4 tied 2 --mesh dp=4 --clip 0 --backend mpi
tap_ok $? "dp=4 over mpi without clipping ran"
same fullc0 refc0 1e-5 "dp=4 over mpi without clipping equals one rank"
run refacc0 1 tied 4 --grad-accum 3 --clip 0
tap_ok $? "single rank, 3 micro-steps, no clipping"
run acc0 2 tied 2 --grad-accum 3 --clip 0 --backend tcp
tap_ok $? "dp=2, 3 micro-steps, no clipping ran"
same acc0 refacc0 1e-5 "dp=2 with 3 micro-steps and no clipping equals one rank"
run accns0 2 tied 2 --grad-accum 3 --no-sync-accum --clip 0 --backend mpi
tap_ok $? "dp=2, 3 micro-steps, no-sync, no clipping ran"
same accns0 refacc0 1e-5 "dp=2 no-sync accumulation without clipping equals one rank"
run haccc0 4 tied 1 --mesh rdp=2,dp=2 --grad-accum 2 --clip 0 --backend mpi
tap_ok $? "rdp=2,dp=2, 2 micro-steps, no clipping ran"
run refhacc0 1 tied 4 --grad-accum 2 --clip 0
same haccc0 refhacc0 1e-5 "rdp=2,dp=2 with 2 micro-steps and no clipping equals one rank"

# 6. gradient accumulation (with and without no-sync) and activation checkpointing
run refacc 1 tied 4 --grad-accum 3
tap_ok $? "single rank, 3 micro-steps"
run acc 2 tied 2 --grad-accum 3 --backend tcp
tap_ok $? "dp=2, 3 micro-steps ran"
same acc refacc 1e-5 "dp=2 with 3 micro-steps equals one rank"
run accns 2 tied 2 --grad-accum 3 --no-sync-accum --backend mpi
tap_ok $? "dp=2, 3 micro-steps, no-sync ran"
same accns refacc 1e-5 "dp=2 no-sync accumulation equals one rank"
printf 'no-sync-accum = on\ngrad-accum = 3\nmesh = "dp=2"\n' > "$W/accns.cfg"
run accnscfg 2 tied 2 --config "$W/accns.cfg" --backend tcp
tap_ok $? "dp=2 with no-sync accumulation from a config file ran"
grep -q "^no-sync-accum *= on *# file" "$W/accnscfg.log"
tap_ok $? "the printed configuration shows no-sync-accum = on from the file"
same accnscfg refacc 1e-5 "no-sync accumulation from a config file equals one rank"
run ckpt 3 untied 1 --activation-checkpointing --backend tcp
tap_ok $? "dp=3 with activation checkpointing ran"
run refu3 1 untied 3
same ckpt refu3 1e-5 "activation checkpointing equals one rank without it"

# 4. mixed precision: against one rank running the same policy through the
# sharding engine. bf16 gathers round the same f32 masters the same way, so
# they match tightly; 16-bit reductions sum in another order and precision.
run refbf 1 tied 4 --param-dtype bf16
tap_ok $? "single rank, param-dtype bf16"
run bf 2 tied 2 --param-dtype bf16 --backend tcp
tap_ok $? "dp=2 param-dtype bf16 ran"
# (a master one f32 bit apart can round to the next bf16 value: the gradient
# norm moves at the 1e-5 level; 8.8e-6 measured)
same bf refbf 5e-5 "dp=2 param-dtype bf16 equals one rank with bf16 params"
"$PY" "$CMP" models "$W/refbf.h5" "$W/ref2.h5" --tol 1e-5 > /dev/null 2>&1
[ $? -ne 0 ]
tap_ok $? "bf16 params change the result (the policy is applied)"
run refbfr 1 tied 4 --param-dtype bf16 --reduce-dtype bf16
tap_ok $? "single rank, bf16 params and reductions"
run bfr 2 tied 2 --param-dtype bf16 --reduce-dtype bf16 --backend mpi
tap_ok $? "dp=2 bf16 params and reductions ran"
same bfr refbfr 5e-3 "dp=2 bf16 reductions equal one rank within 5e-3"
run refbfr4 1 tied 8 --param-dtype bf16 --reduce-dtype bf16
tap_ok $? "single rank, bf16 params and reductions, batch 8"
run hbfr 4 tied 2 --param-dtype bf16 --reduce-dtype bf16 --mesh rdp=2,dp=2 --backend tcp
tap_ok $? "rdp=2,dp=2 with bf16 reductions ran"
same hbfr refbfr4 1e-2 "rdp=2,dp=2 bf16 reductions equal one rank within 1e-2"

# 5. f16 with dynamic loss scaling from a scale that overflows: the first
# steps are skipped on every rank, the scale backs off, training proceeds
F16="--param-dtype f16 --reduce-dtype f16 --loss-scale dynamic --loss-scale-init 1e6"
# shellcheck disable=SC2086
run refls 1 tied 4 $F16 --steps 16
tap_ok $? "single rank, f16 with dynamic loss scaling"
# shellcheck disable=SC2086
run ls 2 tied 2 $F16 --steps 16 --backend tcp
tap_ok $? "dp=2 f16 with dynamic loss scaling ran"
n1=$(grep -c "step skipped" "$W/refls.log")
n2=$(grep -c '"grad_norm":null' "$W/ls.jsonl")
tap_diag "skipped steps: one rank $n1, two ranks $n2"
[ "$n1" -gt 0 ] && [ "$n1" -lt 16 ] && [ "$n1" -eq "$n2" ]
tap_ok $? "the first steps are skipped, then training proceeds, as on one rank"
same ls refls 5e-3 "dp=2 f16 with loss scaling equals one rank within 5e-3"
# shellcheck disable=SC2086
run allskip 2 tied 2 $F16 --loss-scale-init 1e30 --steps 2 --warmup 0 --backend mpi
tap_ok $? "dp=2 with every step overflowing ran"
"$PY" "$CMP" models "$W/allskip.h5" "$W/tied.h5" --tol 0 > "$W/cmp" 2>&1
tap_ok $? "skipped steps leave the parameters untouched"

# 5b. an overflow in some ranks' gradient shards only: at a high enough
# initial scale the f16 reduce-scatter overflows in some ranks' rows while
# the other shards stay finite. Which scale does it depends on the data and
# the kernels' rounding, so the run tries a few scales and asserts that one
# of them did it. The skip is the group's decision: every rank must skip
# that step, as one rank does. Each rank logs what it saw and decided
# (fsdp=debug, every rank).
# skips NAME: "update rank local decision" per line, from every rank's log
skips() {
    sed -n 's/.*fsdpc r\([0-9]*\) .*update \([0-9]*\): local gradient shard \([a-z]*\),.*step \([a-z]*\)$/\2 \1 \3 \4/p' \
        "$W/$1.log" | sort -n -k1,1 -k2,2
}
# partial SKIPS N: some update where some ranks overflowed and others did not
partial() {
    awk -v n="$2" '{ seen[$1]++; if ($3 == "overflowed") o[$1]++ }
        END { for (u in seen) if (seen[u] == n && o[u] > 0 && o[u] < n) { print u; exit 0 }
              exit 1 }' "$1"
}
# agree SKIPS N: every update was logged by all N ranks, with one decision
agree() {
    awk -v n="$2" '{ seen[$1]++; d[$1 " " $4]++ }
        END { for (u in seen) if (seen[u] != n || (d[u " skipped"] > 0 && d[u " applied"] > 0))
                  { print "update " u ": " seen[u] " ranks, " d[u " skipped"] + 0 " skipped"; exit 1 }
              exit 0 }' "$1"
}
F16P="--param-dtype f16 --reduce-dtype f16 --loss-scale dynamic"
export FSDPC_LOG=warn,fsdp=debug FSDPC_LOG_RANKS=all
for n in 2 3; do
    be=tcp
    [ "$n" -eq 3 ] && be=mpi
    u="" ok=1
    for init in 5e5 3e5 2e5 7e5 1e6; do
        # shellcheck disable=SC2086
        run "part$n" "$n" tied 2 $F16P --loss-scale-init "$init" --steps 16 --backend "$be"
        ok=$?
        [ $ok -eq 0 ] || break
        skips "part$n" > "$W/part$n.skips"
        u=$(partial "$W/part$n.skips" "$n") && break
    done
    tap_ok $ok "dp=$n over $be, f16 with dynamic loss scaling ran"
    [ -n "$u" ]
    tap_ok $? "dp=$n: an overflow in some ranks' shards only (update ${u:-none}, initial scale $init)"
    # shellcheck disable=SC2086
    run "refpart$n" 1 tied $((2 * n)) $F16P --loss-scale-init "$init" --steps 16
    tap_ok $? "single rank, batch $((2 * n)), f16 from loss scale $init"
    skips "refpart$n" > "$W/refpart$n.skips"
    why=$(agree "$W/part$n.skips" "$n")
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$why"
    tap_ok $rc "dp=$n: every rank logged every update and all took the same skip decision"
    ref=$(awk '$4 == "skipped" { print $1 }' "$W/refpart$n.skips" | tr '\n' ' ')
    got=$(awk '$2 == 0 && $4 == "skipped" { print $1 }' "$W/part$n.skips" | tr '\n' ' ')
    tap_diag "skipped updates: one rank [$ref], dp=$n [$got]"
    [ -n "$ref" ] && [ "$ref" = "$got" ]
    tap_ok $? "dp=$n skips the same updates as one rank"
    # f16 sums in another order over 16 steps: the largest element has
    # come within 0.5% of max |w| here; the skip-decision bug this guards
    # against moved it by 14% (doc/testing.md)
    same "part$n" "refpart$n" 1e-2 "dp=$n with a partial overflow equals one rank within 1e-2"
done
export FSDPC_LOG=warn
unset FSDPC_LOG_RANKS

# 7. memory: model states per rank (shards + gathered parameters) within 10%
# of 16 x params / 4 + the largest block, 4 bytes per element: unit 0 is
# taken by rows and never gathered. Model: V=512 C=32 L=4 T=32 tied: unit 0
# = 512*32 + 32*32 = 17408, a block 12704, ln_f 64; 68288 parameters:
# 16 * 68288 / 4 + 4 * 12704 = 323968.
"$BIN/fsdpc-ckpt" init --layers 4 --heads 2 --width 32 --vocab 512 --context 32 --seed 7 \
    -o "$W/mem.h5" > "$W/log" 2>&1
tap_ok $? "model for memory accounting"
FSDPC_LOG=info timeout 60 "$MPIEXEC" -n 4 "$TRAIN" --model "$W/mem.h5" --data "$W/tok.bin" \
    --seq-len 16 --steps 1 --lr 1e-3 --batch-size 1 --peak-flops 1e11 --prefetch 0 \
    --backend tcp > "$W/mem.log" 2>&1
tap_ok $? "4 ranks with memory accounting ran"
bytes=$(sed -n 's/.*model states \([0-9]*\) bytes.*/\1/p' "$W/mem.log" | head -1)
tap_diag "model states: ${bytes:-?} bytes per rank, expected 323968 +- 10%"
[ -n "$bytes" ] && [ "$bytes" -ge 291571 ] && [ "$bytes" -le 356365 ]
tap_ok $? "model states per rank within 10% of 16 P / 4 + the largest block (unit 0 by rows)"
# unsharded gradients: the two ring slots of a block, none of unit 0, whose
# gradient exists only as each rank's rows: 2 * 4 * 12704
grads=$(sed -n 's/.* | unsharded grads \([0-9]*\) | .*/\1/p' "$W/mem.log" | head -1)
tap_diag "unsharded grads: ${grads:-?} bytes per rank, expected 101632"
[ "$grads" = 101632 ]
tap_ok $? "no unsharded gradient of unit 0 (by rows): two block slots only"
grep -q "| unit 0 by rows" "$W/mem.log"
tap_ok $? "the run header says unit 0 is by rows"
grep -q "fsdp: comm exposed [0-9.]* s .* comm busy [0-9.]* s, summed over collectives that overlap" "$W/mem.log"
tap_ok $? "the run reports exposed communication time first, then busy time summed over overlapping collectives"
# communication buffers: the collectives run in the parameter and gradient
# slots themselves, so all that remains is the packing scratch (a block less
# its largest parameter, 12704 - 4096 = 8608 floats) and the padding of the
# slots that hold a block (S = 3176 rounded up to 3184: 4 * 3184 - 12704 =
# 32 floats; one parameter slot and two gradient slots at --prefetch 0):
# 4 * (8608 + 3 * 32) = 34816 bytes, with 16-bit collectives too.
comm=$(sed -n 's/.* | comm \([0-9]*\) | .*/\1/p' "$W/mem.log" | head -1)
tap_diag "comm buffers: ${comm:-?} bytes per rank, expected 34816"
[ "$comm" = 34816 ]
tap_ok $? "communication buffers per rank are the packing scratch and padding only"
FSDPC_LOG=info timeout 60 "$MPIEXEC" -n 4 "$TRAIN" --model "$W/mem.h5" --data "$W/tok.bin" \
    --seq-len 16 --steps 1 --lr 1e-3 --batch-size 1 --peak-flops 1e11 --prefetch 0 \
    --param-dtype bf16 --reduce-dtype f16 --backend tcp > "$W/mem16.log" 2>&1
tap_ok $? "4 ranks with 16-bit collectives ran"
# the same, except that the parameter slot holds bf16, so its padding is
# 32 two-byte elements: 4 * (8608 + 2 * 32) + 2 * 32 = 34752 bytes
comm=$(sed -n 's/.* | comm \([0-9]*\) | .*/\1/p' "$W/mem16.log" | head -1)
[ "$comm" = 34752 ]
tap_ok $? "16-bit collectives need no staging either (comm ${comm:-?} bytes, want 34752)"

# bad input: one clear line naming what is wrong (on one rank, where no
# other rank's abort can cut the launcher's output short)
bad() {
    b_want=$1 b_n=$2
    shift 2
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n "$b_n" "$TRAIN" --model "$W/tied.h5" $COMMON --batch-size 1 "$@" \
        > "$W/bad.log" 2>&1
    b_rc=$?
    grep -q "$b_want" "$W/bad.log"
    b_found=$?
    [ $b_found -eq 0 ] || tap_diag "$(tail -3 "$W/bad.log")"
    [ $b_rc -ne 0 ] && [ $b_rc -ne 124 ] && [ $b_found -eq 0 ]
}
bad "mesh 'dp=3' has 3 ranks (3) but the world has 1" 1 --mesh dp=3
tap_ok $? "a mesh that does not fit the world is one clear error"
bad "dimension 'ep' is not one the trainer uses" 1 --mesh ep=1
tap_ok $? "an unknown mesh dimension is one clear error"
bad "loss-scale 'abc' is not off, dynamic or a positive number" 1 --loss-scale abc
tap_ok $? "a bad loss scale is one clear error"
bad "param-dtype 'f64' is not one of f32|bf16|f16" 1 --param-dtype f64
tap_ok $? "a bad param dtype is one clear error"
# a backend that takes device memory only, for a trainer whose buffers are
# on the host: refused while the mesh is parsed, before any group (and so
# any communicator) exists; without NCCL in the build the name is unknown
if grep -q "^#define HAVE_NCCL 1" "$top_builddir/config.h"; then
    want="backend nccl (dimension dp) takes CUDA device memory only, and this run's buffers are in host memory"
else
    want="backend 'nccl' (in --backend 'nccl') is unknown"
fi
FSDPC_LOG=info bad "$want" 1 --mesh dp=1 --backend nccl
rc=$?
# the nccl backend logs as subsystem "nccl": it must never have run
grep -Eq "(INFO|WARN|ERROR|DEBUG) nccl" "$W/bad.log" && rc=1
[ "$(grep -c "$want" "$W/bad.log")" -eq 1 ] || rc=1
tap_ok $rc "--backend nccl with host buffers: one line, before any communicator"

tap_done
