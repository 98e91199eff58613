#!/bin/sh
# test_offload.sh - --offload optim and --offload params,optim on the
# guarded device (device memory the host cannot touch: the host AdamW must
# read only the pinned copies the device copied out) give bit for bit what
# the same run without offload gives: every step's loss and gradient norm
# and the final weights, for GPT-2 and llama-tiny on one rank and dp=2 over
# mpi and tcp (and rdp=2,dp=2), with accumulation (with and without sync),
# clipping, bf16, f16 with dynamic loss scaling and a skipped step, and a
# rank that joins (no batch); with tensor parallelism (tp=2 and
# dp=2,tp=2, GPT-2 and llama, with and without sequence parallelism, over
# mpi and tcp); checkpoints written with offload equal those written
# without (with tp: both re-layout methods, saved in the loop and in the
# background), and resume across offload settings and meshes either way;
# the memory plan with tp and offload equals the device's buffers, and with
# bf16 params under params,optim holds no f32 master shard; the
# step's host waits stay fixed; the flag's errors are one line.
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
    # tensor parallelism: the blocks' moments (and master) on the host
    same "gpt2 tp=2 mpi, clipping at 0.5" 2 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh tp=2 --backend mpi --clip 0.5
    same "llama tp=2 tcp, sequence parallel off, accumulation 2" 2 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh tp=2 --backend tcp --sequence-parallel off --grad-accum 2
    same "llama dp=2,tp=2 mpi, clipping at 0.5" 4 --model "$W/llama.h5" --data "$W/train.bin" \
        --mesh dp=2,tp=2 --backend mpi --clip 0.5
    same "gpt2 dp=2,tp=2 tcp, sequence parallel off" 4 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2,tp=2 --backend tcp --sequence-parallel off
    # bf16 params on tp=2: under params,optim no f32 master on the device,
    # the final model file gathered from the host master
    same "gpt2 tp=2 mpi, bf16 params" 2 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh tp=2 --backend mpi --param-dtype bf16

    # checkpoints: written with and without offload at dp=2 (and dp=2,tp=2),
    # resumed on one rank (and tp=2) with each setting
    # ck OFFLOAD [NAME ARGS...] (CK_N ranks, mesh CK_MESH)
    ck() {
        c_off=$1 c_name=${2:-$1}
        shift
        [ $# -gt 0 ] && shift
        "$MPIEXEC" -n "${CK_N:-2}" "$TRAIN" --device guarded --model "$W/llama.h5" \
            --data "$W/train.bin" --batch-size 2 --seq-len 64 --steps 2 --lr 3e-3 \
            --mesh "${CK_MESH:-dp=2}" --backend tcp --clip 0.5 --offload "$c_off" \
            --ckpt-dir "$W/ck.$c_name" "$@" > /dev/null 2> "$W/ck.$c_name.err"
    }
    # resume CHECKPOINT OFFLOAD [MESH]: 2 more steps from step 2, on one
    # rank or (MESH) two over mpi, into res.CHECKPOINT.OFFLOAD[.MESH]
    resume() {
        r_out="$W/res.$1.$2${3:+.$3}"
        if [ -n "$3" ]; then
            set -- "$1" "$2" "$MPIEXEC" -n 2 "$TRAIN" --mesh "$3" --backend mpi
        else
            set -- "$1" "$2" "$TRAIN"
        fi
        r_ck=$1 r_off=$2
        shift 2
        # shellcheck disable=SC2086
        "$@" --device guarded --model "$W/llama.h5" --data "$W/train.bin" --batch-size 4 \
            --seq-len 64 --steps 4 --lr 3e-3 --clip 0.5 --resume "$W/ck.$r_ck/step_2" ${R_ARGS:-} \
            --offload "$r_off" --out "$r_out.h5" --metrics "$r_out.jsonl" \
            > /dev/null 2>> "$W/ck.$r_ck.err" || {
            tap_diag "$(grep -h -m 1 'guarded device:' "$W/ck.$r_ck.err" || tail -n 3 "$W/ck.$r_ck.err")"
            return 1
        }
    }
    # same_res A B: resumed runs A and B (res.A, res.B) took the same steps
    # to the same weights, bit for bit
    same_res() {
        records "$W/res.$1.jsonl" > "$W/a.rec"
        records "$W/res.$2.jsonl" > "$W/b.rec"
        [ -s "$W/a.rec" ] && cmp -s "$W/a.rec" "$W/b.rec" &&
            h5diff "$W/res.$1.h5" "$W/res.$2.h5" > /dev/null 2>&1 || {
            tap_diag "resumed $2: differs from $1"
            return 1
        }
    }
    # same_shards REF N NAME...: checkpoint NAME's N shards at step 2 equal
    # REF's bit for bit (h5diff); each difference named
    same_shards() {
        _ref=$1 _n=$2 _st=0
        shift 2
        for _c in "$@"; do
            for _s in $(seq 0 $((_n - 1))); do
                h5diff "$W/ck.$_ref/step_2/shard_$_s.h5" "$W/ck.$_c/step_2/shard_$_s.h5" \
                    > "$W/diff" 2>&1 || { _st=1; tap_diag "$_c shard $_s: $(head -n 3 "$W/diff")"; }
            done
        done
        return $_st
    }
    ok=0
    for o in none optim params,optim; do
        ck $o || { ok=1; tap_diag "$(tail -n 3 "$W/ck.$o.err")"; }
    done
    # the save in the loop (no background snapshot) reads the host pieces too
    ck params,optim sync --ckpt-async off || { ok=1; tap_diag "$(tail -n 3 "$W/ck.sync.err")"; }
    same_shards none 2 optim params,optim sync || ok=1
    tap_ok $ok "checkpoint shards written with offload optim and params,optim (background and in-loop saves) = without, bit for bit"
    ok=0
    for pair in "none none" "none optim" "none params,optim" "optim none" "optim optim" \
        "params,optim none" "params,optim params,optim" "optim params,optim"; do
        # shellcheck disable=SC2086
        set -- $pair
        resume "$1" "$2" || { ok=1; continue; }
        [ "$pair" = "none none" ] && continue
        same_res none.none "$1.$2" || ok=1
    done
    tap_ok $ok "resume across offload settings (none, optim, params,optim either way) = no offload"
    # bf16 params: under params,optim the device holds the parameters only
    # as the all-gathers' bf16 send, cast from the host master at the
    # update and at a load
    ok=0
    ck none bf16.none --param-dtype bf16 || { ok=1; tap_diag "$(tail -n 3 "$W/ck.bf16.none.err")"; }
    ck params,optim bf16.po --param-dtype bf16 || { ok=1; tap_diag "$(tail -n 3 "$W/ck.bf16.po.err")"; }
    same_shards bf16.none 2 bf16.po || ok=1
    export R_ARGS="--param-dtype bf16"
    resume bf16.none none || ok=1
    for pair in "bf16.none params,optim" "bf16.po none" "bf16.po params,optim"; do
        # shellcheck disable=SC2086
        set -- $pair
        resume "$1" "$2" && same_res bf16.none.none "$1.$2" || ok=1
    done
    unset R_ARGS
    tap_ok $ok "bf16 params: checkpoints with params,optim = without, and resume either way = no offload, bit for bit"

    # with tensor parallelism: saved at dp=2,tp=2 through the exchange and
    # the reduce-scatters, in the loop and in the background
    # ck_failed NAME: why checkpoint run NAME failed (the guarded device's
    # line where it stopped the run)
    ck_failed() {
        ok=1
        tap_diag "$1: $(grep -h -m 1 'guarded device:' "$W/ck.$1.err" || tail -n 3 "$W/ck.$1.err")"
    }
    ok=0
    export CK_N=4 CK_MESH=dp=2,tp=2
    for o in none optim params,optim; do
        ck $o "tp.$o" || ck_failed "tp.$o"
    done
    ck params,optim tp.sync --ckpt-async off || ck_failed tp.sync
    FSDPC_CKPT_TP_SAVE=reduce-scatter ck optim tp.rs --ckpt-async off || ck_failed tp.rs
    FSDPC_CKPT_TP_SAVE=reduce-scatter ck params,optim tp.rs.async || ck_failed tp.rs.async
    unset CK_N CK_MESH
    same_shards tp.none 4 tp.optim tp.params,optim tp.sync tp.rs tp.rs.async || ok=1
    tap_ok $ok "dp=2,tp=2 checkpoint shards written with offload (exchange and reduce-scatter, background and in-loop saves) = without, bit for bit"
    # resumed on another mesh: saved with offload and tp, resumed without
    # (tp=2, one rank), and the reverse (dp=2 and dp=2,tp=2 checkpoints
    # resumed with offload on tp=2)
    ok=0
    resume tp.none none tp=2 || ok=1
    for pair in "tp.optim none" "tp.params,optim none" "tp.none optim" "tp.none params,optim" \
        "tp.params,optim params,optim"; do
        # shellcheck disable=SC2086
        set -- $pair
        resume "$1" "$2" tp=2 && same_res tp.none.none.tp=2 "$1.$2.tp=2" || ok=1
    done
    resume tp.none none && resume tp.params,optim none && same_res tp.none.none tp.params,optim.none ||
        ok=1
    resume none none tp=2 && resume params,optim params,optim tp=2 &&
        same_res none.none.tp=2 params,optim.params,optim.tp=2 || ok=1
    tap_ok $ok "resume with tensor parallelism across offload settings and meshes (dp=2,tp=2 to tp=2 and one rank, dp=2 to tp=2) = no offload"

    # the memory plan with tp and offload: its device part and its pinned
    # host part against the guarded device and the engine's count
    plan "gpt2 tp=2, offload optim" 2 --model "$W/gpt2.h5" --mesh tp=2 --backend tcp \
        --offload optim
    plan "llama dp=2,tp=2, offload params,optim" 4 --model "$W/llama.h5" --mesh dp=2,tp=2 \
        --backend tcp --offload params,optim
    # params,optim with a 16-bit param dtype: no f32 master shard on the
    # device, only the all-gathers' send (2 bytes an element, half the f32
    # gradient shard), in the plan and in the guarded device's buffers
    plan "gpt2 dp=2 bf16, offload params,optim" 2 --model "$W/gpt2.h5" --mesh dp=2 \
        --backend tcp --param-dtype bf16 --offload params,optim
    ps=$(sed -n 's/^  parameter shards (16-bit, the all-gathers. send)  *\([0-9]*\) .*/\1/p' "$W/mem.plan")
    gs=$(sed -n 's/^  gradient shards (f32)  *\([0-9]*\) .*/\1/p' "$W/mem.plan")
    st=$(sed -n "s/.*\[fsdpc r0 .*device buffer after the first step: \([0-9]*\) bytes 'fsdp gradient shards and parameter send shards'.*/\1/p" "$W/mem.run")
    tap_diag "bf16 params,optim: parameter shards '$ps', gradient shards '$gs', state buffer '$st' bytes"
    [ -n "$ps" ] && [ -n "$gs" ] && [ -n "$st" ] && [ $((2 * ps)) -eq "$gs" ] &&
        [ "$st" -eq $((ps + gs)) ] && ! grep -q "r0 .*bytes 'fsdp parameter \(and\|,\)" "$W/mem.run"
    tap_ok $? "params,optim bf16: the device holds no f32 master shard (plan and guarded buffers: a 2-byte send, half the gradient shard)"
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

# the flag: config file, help, errors, the cpu device's note
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
tap_done
