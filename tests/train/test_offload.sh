#!/bin/sh
# test_offload.sh - --offload optim and --offload params,optim on the
# guarded device (device memory the host cannot touch: the host AdamW must
# read only the pinned copies the device copied out) give bit for bit what
# the same run without offload gives: every step's loss and gradient norm
# and the final weights, for GPT-2 and llama-tiny on one rank and dp=2 over
# mpi and tcp (and rdp=2,dp=2), with accumulation (with and without sync),
# clipping, bf16, f16 with dynamic loss scaling and a skipped step, and a
# rank that joins (no batch); checkpoints written with offload equal
# those written without, and resume across offload settings either way;
# the step's host waits stay fixed; the flag's errors are one line.
. "$top_srcdir/tests/tap.sh"

GUARDED_TAG=offload
. "$top_srcdir/tests/train/guarded_lib.sh"

# train TAG RANKS ARGS...: one run on the guarded device
train() {
    tag=$1 n=$2
    shift 2
    if [ "$n" -gt 1 ]; then
        "$MPIEXEC" -n "$n" "$TRAIN" --device guarded --batch-size 4 --seq-len 64 --steps 3 \
            --lr 3e-3 --out "$W/$tag.h5" --metrics "$W/$tag.jsonl" "$@" \
            > "$W/$tag.out" 2> "$W/$tag.err"
    else
        "$TRAIN" --device guarded --batch-size 4 --seq-len 64 --steps 3 --lr 3e-3 \
            --out "$W/$tag.h5" --metrics "$W/$tag.jsonl" "$@" > "$W/$tag.out" 2> "$W/$tag.err"
    fi
}

# same NAME RANKS ARGS...: no offload, optim, params,optim, compared bit for bit
same() {
    name=$1 n=$2
    shift 2
    for o in none optim params,optim; do
        ok=0
        train "$name.$o" "$n" --offload $o "$@" || ok=1
        if [ $ok -ne 0 ]; then # a fault on the guarded device names the buffer
            tap_diag "$(grep -m 1 'guarded device:' "$W/$name.$o.err" || tail -n 5 "$W/$name.$o.err")"
        elif [ $o != none ]; then
            records "$W/$name.none.jsonl" > "$W/a.rec"
            records "$W/$name.$o.jsonl" > "$W/b.rec"
            [ -s "$W/a.rec" ] && cmp -s "$W/a.rec" "$W/b.rec" || {
                ok=1
                tap_diag "$(diff "$W/a.rec" "$W/b.rec")"
            }
            h5diff "$W/$name.none.h5" "$W/$name.$o.h5" > "$W/diff" 2>&1 || {
                ok=1
                tap_diag "$(head -n 5 "$W/diff")"
            }
        fi
        [ $o = none ] && [ $ok -eq 0 ] && continue
        tap_ok $ok "offload $o = no offload bit for bit (losses, norms, final weights): $name"
    done
}

same "gpt2 1 rank, clipping at 0.5" 1 --model "$W/gpt2.h5" --data "$W/train.bin" --clip 0.5
same "llama 1 rank, accumulation 2" 1 --model "$W/llama.h5" --data "$W/train.bin" --grad-accum 2
same "gpt2 1 rank bf16" 1 --model "$W/gpt2.h5" --data "$W/train.bin" --param-dtype bf16
if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "the multi-rank comparisons"
else
    same "gpt2 dp=2 mpi, accumulation with sync, clipping at 0.5" 2 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend mpi --grad-accum 2 --clip 0.5
    same "gpt2 dp=2 tcp, accumulation without sync" 2 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend tcp --grad-accum 3 --no-sync-accum
    same "llama dp=2 tcp, accumulation with sync, clipping at 0.5" 2 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend tcp --grad-accum 2 --clip 0.5
    same "llama dp=2 mpi, bf16 params and reduction" 2 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend mpi --param-dtype bf16 --reduce-dtype bf16
    f16="gpt2 dp=2 mpi, f16 with dynamic loss scaling from 2^18 (a step skipped)"
    same "$f16" 2 --model "$W/gpt2.h5" --data "$W/train.bin" --mesh dp=2 --backend mpi \
        --param-dtype f16 --reduce-dtype f16 --loss-scale dynamic --loss-scale-init 262144
    grep -q 'step skipped' "$W/$f16.optim.err" && grep -q 'step skipped' "$W/$f16.params,optim.err"
    tap_ok $? "the f16 run skipped a step on overflow (the offload's skip path ran)"
    same "gpt2 rdp=2,dp=2 tcp" 4 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh rdp=2,dp=2 --backend tcp
    same "gpt2 dp=2 tcp, uneven data: join (a rank shadows)" 2 --model "$W/gpt2.h5" \
        --data "$W/u{rank}.bin" --mesh dp=2 --backend tcp --epochs 1 --steps 0

    # checkpoints: written with and without offload at dp=2, resumed on one
    # rank with each setting
    # ck OFFLOAD [NAME ARGS...]
    ck() {
        c_off=$1 c_name=${2:-$1}
        shift
        [ $# -gt 0 ] && shift
        "$MPIEXEC" -n 2 "$TRAIN" --device guarded --model "$W/llama.h5" --data "$W/train.bin" \
            --batch-size 2 --seq-len 64 --steps 2 --lr 3e-3 --mesh dp=2 --backend tcp \
            --clip 0.5 --offload "$c_off" --ckpt-dir "$W/ck.$c_name" "$@" \
            > /dev/null 2> "$W/ck.$c_name.err"
    }
    resume() {
        "$TRAIN" --device guarded --model "$W/llama.h5" --data "$W/train.bin" --batch-size 4 \
            --seq-len 64 --steps 4 --lr 3e-3 --clip 0.5 --resume "$W/ck.$1/step_2" \
            --offload "$2" --out "$W/res.$1.$2.h5" --metrics "$W/res.$1.$2.jsonl" \
            > /dev/null 2>> "$W/ck.$1.err"
    }
    ok=0
    for o in none optim params,optim; do
        ck $o || { ok=1; tap_diag "$(tail -n 3 "$W/ck.$o.err")"; }
    done
    # the save in the loop (no background snapshot) reads the host pieces too
    ck params,optim sync --ckpt-async off || { ok=1; tap_diag "$(tail -n 3 "$W/ck.sync.err")"; }
    for o in optim params,optim sync; do
        for s in 0 1; do
            h5diff "$W/ck.none/step_2/shard_$s.h5" "$W/ck.$o/step_2/shard_$s.h5" \
                > "$W/diff" 2>&1 || { ok=1; tap_diag "$o shard $s: $(head -n 3 "$W/diff")"; }
        done
    done
    tap_ok $ok "checkpoint shards written with offload optim and params,optim (background and in-loop saves) = without, bit for bit"
    ok=0
    for pair in "none none" "none optim" "none params,optim" "optim none" "optim optim" \
        "params,optim none" "params,optim params,optim" "optim params,optim"; do
        # shellcheck disable=SC2086
        set -- $pair
        resume "$1" "$2" || { ok=1; tap_diag "$(tail -n 3 "$W/ck.$1.err")"; continue; }
        [ "$pair" = "none none" ] && continue
        records "$W/res.none.none.jsonl" > "$W/a.rec"
        records "$W/res.$1.$2.jsonl" > "$W/b.rec"
        [ -s "$W/a.rec" ] && cmp -s "$W/a.rec" "$W/b.rec" &&
            h5diff "$W/res.none.none.h5" "$W/res.$1.$2.h5" > /dev/null 2>&1 || {
            ok=1
            tap_diag "saved with offload $1, resumed with $2: differs"
        }
    done
    tap_ok $ok "resume across offload settings (none, optim, params,optim either way) = no offload"
fi

# host waits of a step with offload: the loss, the norm and one wait for
# the copy stream, whatever the depth; a D2H copy per unit's gradient shard
waits() {
    FSDPC_LOG=train=debug "$TRAIN" --device guarded --model "$1" --data "$W/train.bin" \
        --batch-size 2 --seq-len 64 --steps 2 --lr 1e-3 --offload "$2" 2>&1 |
        sed -n 's/.*step 2: device guarded: \([0-9]*\) host waits, \([0-9]*\) device-to-host.*/\1 \2/p'
}
w2=$(waits "$W/gpt2.h5" optim) w4=$(waits "$W/gpt2-4.h5" optim) wp=$(waits "$W/gpt2-4.h5" params,optim)
tap_diag "host waits and D2H copies at step 2: 2 layers '$w2', 4 layers '$w4', params,optim '$wp'"
[ "$w2" = "3 6" ] && [ "$w4" = "3 8" ] && [ "$wp" = "3 8" ]
tap_ok $? "an offloaded step waits three times (loss, norm, copy stream), and copies each unit's gradient out once"

# the flag: config file, help, errors, the cpu device's note, tensor parallelism
printf 'offload = params,optim\n' > "$W/cfg"
"$TRAIN" --config "$W/cfg" --device guarded --model "$W/gpt2.h5" --data "$W/train.bin" \
    --batch-size 2 --seq-len 64 --steps 1 --lr 1e-3 > "$W/cfg.out" 2>&1 &&
    grep -q 'offload: master and optimizer state on the host' "$W/cfg.out"
tap_ok $? "offload = params,optim in a config file reaches the engine"
"$TRAIN" --help 2>&1 | grep -q -- '--offload'
tap_ok $? "--help lists --offload"
"$TRAIN" --offload gpu --model "$W/gpt2.h5" --data "$W/train.bin" --batch-size 2 --seq-len 64 \
    --steps 1 --lr 1e-3 > "$W/bad.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . "$W/bad.out")" -le 2 ] && grep -q 'offload' "$W/bad.out" &&
    grep -q 'none|optim|params,optim\|none, optim' "$W/bad.out"
tap_ok $? "--offload gpu: a short error naming the key and its values ($(head -n 1 "$W/bad.out"))"
FSDPC_LOG=warn "$TRAIN" --device cpu --offload optim --model "$W/gpt2.h5" --data "$W/train.bin" \
    --batch-size 2 --seq-len 64 --steps 1 --lr 1e-3 > "$W/cpu.out" 2>&1 &&
    [ "$(grep -c 'offload on device cpu changes nothing' "$W/cpu.out")" -eq 1 ]
tap_ok $? "on device cpu offload runs and says once that it changes nothing"
if [ -n "$MPIEXEC" ]; then
    "$MPIEXEC" -n 2 "$TRAIN" --device guarded --offload optim --mesh tp=2 --backend mpi \
        --model "$W/gpt2.h5" --data "$W/train.bin" --batch-size 2 --seq-len 64 --steps 1 \
        --lr 1e-3 > "$W/tp.out" 2>&1
    [ $? -ne 0 ] && grep -q 'offload optim with tensor parallelism (tp=2) is not supported' "$W/tp.out"
    tap_ok $? "offload with tensor parallelism is refused with one line"
fi
tap_done
