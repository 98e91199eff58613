#!/bin/sh
# test_guarded.sh - the whole training path on the guarded device (memory
# the host cannot touch outside the device's own kernels and copies) gives
# bit for bit what the CPU device gives: losses, gradient norms and loss
# scales of every step, and the final weights, for GPT-2 and Llama over
# the meshes, dtypes (bf16 activations too) and features the trainer has,
# with mpi and tcp staging the device's memory (in chunks of the default
# size, of 1 KiB and 1000 bytes, and whole); a checkpoint written on it
# resumes on another mesh,
# verifies, and samples; the sampler with and without its cache; and the
# host waits of a step do not grow with the model.
. "$top_srcdir/tests/tap.sh"

GUARDED_TAG=guarded
. "$top_srcdir/tests/train/guarded_lib.sh"

# same NAME RANKS ARGS...: the run on cpu and on guarded, compared (test_offload.sh
# compares --offload runs on guarded with runs without)
same() {
    name=$1 n=$2
    shift 2
    ok=0
    for d in cpu guarded; do
        if [ "$n" -gt 1 ]; then
            # shellcheck disable=SC2086
            "$MPIEXEC" -n "$n" "$TRAIN" --device $d --batch-size 4 --seq-len 64 --steps 3 \
                --lr 3e-3 --out "$W/$name.$d.h5" --metrics "$W/$name.$d.jsonl" "$@" \
                > "$W/$name.$d.out" 2> "$W/$name.$d.err" || ok=1
        else
            "$TRAIN" --device $d --batch-size 4 --seq-len 64 --steps 3 --lr 3e-3 \
                --out "$W/$name.$d.h5" --metrics "$W/$name.$d.jsonl" "$@" \
                > "$W/$name.$d.out" 2> "$W/$name.$d.err" || ok=1
        fi
    done
    if [ $ok -ne 0 ]; then
        tap_diag "$(tail -n 5 "$W/$name.guarded.err" "$W/$name.cpu.err")"
    else
        records "$W/$name.cpu.jsonl" > "$W/$name.cpu.rec"
        records "$W/$name.guarded.jsonl" > "$W/$name.guarded.rec"
        [ -s "$W/$name.cpu.rec" ] && cmp -s "$W/$name.cpu.rec" "$W/$name.guarded.rec" || ok=1
        [ $ok -eq 0 ] || tap_diag "$(diff "$W/$name.cpu.rec" "$W/$name.guarded.rec")"
        h5diff "$W/$name.cpu.h5" "$W/$name.guarded.h5" > "$W/$name.diff" 2>&1 || {
            ok=1
            tap_diag "$(head -n 5 "$W/$name.diff")"
        }
    fi
    tap_ok $ok "guarded = cpu bit for bit (step losses, norms, final weights): $name"
}

same "gpt2 1 rank" 1 --model "$W/gpt2.h5" --data "$W/train.bin"
same "gpt2 1 rank bf16" 1 --model "$W/gpt2.h5" --data "$W/train.bin" --param-dtype bf16
same "llama 1 rank, activation checkpointing" 1 --model "$W/llama.h5" --data "$W/train.bin" \
    --activation-checkpointing
same "gpt2 1 rank, bf16 activations" 1 --model "$W/gpt2.h5" --data "$W/train.bin" \
    --activation-dtype bf16
same "gpt2 1 rank, bf16 activations and params, activation checkpointing" 1 \
    --model "$W/gpt2-4.h5" --data "$W/train.bin" --activation-dtype bf16 --param-dtype bf16 \
    --activation-checkpointing
same "llama 1 rank, bf16 activations" 1 --model "$W/llama.h5" --data "$W/train.bin" \
    --activation-dtype bf16
same "llama 1 rank, bf16 activations and params, activation checkpointing" 1 \
    --model "$W/llama.h5" --data "$W/train.bin" --activation-dtype bf16 --param-dtype bf16 \
    --activation-checkpointing
if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "the multi-rank comparisons"
else
    same "gpt2 dp=2 tcp" 2 --model "$W/gpt2.h5" --data "$W/train.bin" --mesh dp=2 --backend tcp
    same "gpt2 dp=2 mpi, bf16 params and reduction" 2 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh dp=2 --backend mpi --param-dtype bf16 --reduce-dtype bf16
    same "gpt2 dp=2 mpi, f16 with dynamic loss scaling" 2 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend mpi --param-dtype f16 --loss-scale dynamic
    same "gpt2 rdp=2,dp=2 tcp" 4 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh rdp=2,dp=2 --backend tcp
    same "gpt2 tp=2 mpi" 2 --model "$W/gpt2.h5" --data "$W/train.bin" --mesh tp=2 --backend mpi
    same "gpt2 dp=2 mpi, accumulation without sync, clipping at 0.5" 2 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend mpi --grad-accum 2 --no-sync-accum --clip 0.5
    same "llama dp=2 tcp, accumulation with sync, activation checkpointing" 2 \
        --model "$W/llama.h5" --data "$W/train.bin" --mesh dp=2 --backend tcp --grad-accum 2 \
        --activation-checkpointing
    same "llama dp=2,tp=2 (dp=tcp, tp=mpi)" 4 --model "$W/llama.h5" --data "$W/train.bin" \
        --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
    same "gpt2 dp=2 tcp, offload params,optim" 2 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh dp=2 --backend tcp --offload params,optim --grad-accum 2
    same "gpt2 dp=2 tcp, bf16 activations, accumulation" 2 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend tcp --activation-dtype bf16 --grad-accum 2
    same "llama dp=2 tcp, bf16 activations, accumulation" 2 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh dp=2 --backend tcp --activation-dtype bf16 --grad-accum 2
    same "llama tp=2 mpi, bf16 activations, activation checkpointing" 2 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh tp=2 --backend mpi --activation-dtype bf16 \
        --activation-checkpointing
    same "gpt2 tp=2 mpi, bf16 activations" 2 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh tp=2 --backend mpi --activation-dtype bf16
    same "gpt2 tp=2 tcp, sequence parallel off, bf16 activations, activation checkpointing" 2 \
        --model "$W/gpt2-4.h5" --data "$W/train.bin" --mesh tp=2 --backend tcp \
        --sequence-parallel off --activation-dtype bf16 --activation-checkpointing
    same "gpt2 dp=2 tcp, uneven data: join" 2 --model "$W/gpt2.h5" --data "$W/u{rank}.bin" \
        --mesh dp=2 --backend tcp --epochs 1 --steps 0
    # staging in small chunks (many per collective, a short last one; 1000
    # bytes is no whole number of elements) and in whole buffers
    export FSDPC_STAGE_CHUNK_BYTES=1K
    same "gpt2 dp=3 tcp, staged in 1 KiB chunks" 3 --model "$W/gpt2.h5" --data "$W/train.bin" \
        --mesh dp=3 --backend tcp
    same "llama dp=2,tp=2 (dp=tcp, tp=mpi), staged in 1 KiB chunks" 4 --model "$W/llama.h5" \
        --data "$W/train.bin" --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
    export FSDPC_STAGE_CHUNK_BYTES=1000
    same "gpt2 dp=2 mpi, bf16 params and reduction, staged in 1000-byte chunks" 2 \
        --model "$W/gpt2.h5" --data "$W/train.bin" --mesh dp=2 --backend mpi --param-dtype bf16 \
        --reduce-dtype bf16
    export FSDPC_STAGE_CHUNK_BYTES=0
    same "gpt2 rdp=2,dp=2 mpi, staged in whole buffers" 4 --model "$W/gpt2.h5" \
        --data "$W/train.bin" --mesh rdp=2,dp=2 --backend mpi
    unset FSDPC_STAGE_CHUNK_BYTES

    # a checkpoint written on the guarded device at dp=2, resumed on one rank
    ok=0
    for d in cpu guarded; do
        "$MPIEXEC" -n 2 "$TRAIN" --device $d --model "$W/llama.h5" --data "$W/train.bin" \
            --batch-size 2 --seq-len 64 --steps 2 --lr 3e-3 --mesh dp=2 --backend tcp \
            --ckpt-dir "$W/ck.$d" > /dev/null 2> "$W/ck.$d.err" &&
        "$TRAIN" --device $d --model "$W/llama.h5" --data "$W/train.bin" --batch-size 4 \
            --seq-len 64 --steps 4 --lr 3e-3 --ckpt-dir "$W/ck.$d" --resume \
            --out "$W/resumed.$d.h5" > /dev/null 2>> "$W/ck.$d.err" || ok=1
    done
    [ $ok -eq 0 ] && h5diff "$W/resumed.cpu.h5" "$W/resumed.guarded.h5" > /dev/null 2>&1 || {
        ok=1
        tap_diag "$(tail -n 5 "$W/ck.guarded.err")"
    }
    tap_ok $ok "a checkpoint saved on guarded dp=2 resumes on one rank as on cpu, bit for bit"
    "$BIN/fsdpc-ckpt" verify "$W/ck.guarded" > "$W/verify.out" 2>&1
    tap_ok $? "fsdpc-ckpt verify reads the checkpoint written from the guarded device"
    a=$("$BIN/fsdpc-sample" --model "$W/ck.guarded" --tokens 40 --seed 5 --device guarded 2>/dev/null | od -c)
    b=$("$BIN/fsdpc-sample" --model "$W/ck.guarded" --tokens 40 --seed 5 --device cpu 2>/dev/null | od -c)
    c=$("$BIN/fsdpc-sample" --model "$W/ck.guarded" --tokens 40 --seed 5 --device guarded --no-cache 2>/dev/null | od -c)
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]
    tap_ok $? "fsdpc-sample on guarded (cache, and whole window) prints what it prints on cpu"
fi
a=$("$BIN/fsdpc-sample" --model "$W/gpt2.h5" --tokens 40 --seed 5 --device guarded 2>/dev/null | od -c)
b=$("$BIN/fsdpc-sample" --model "$W/gpt2.h5" --tokens 40 --seed 5 --device cpu 2>/dev/null | od -c)
[ -n "$a" ] && [ "$a" = "$b" ]
tap_ok $? "fsdpc-sample of GPT-2 with its cache on guarded prints what it prints on cpu"

# host waits of a step: K loss reads and one norm read, whatever the model
waits() {
    FSDPC_LOG=train=debug "$TRAIN" --device guarded --model "$1" --data "$W/train.bin" \
        --batch-size 2 --seq-len 64 --steps 2 --lr 1e-3 --grad-accum "$2" 2>&1 |
        sed -n 's/.*step 2: device guarded: \([0-9]*\) host waits, \([0-9]*\) device-to-host.*/\1 \2/p'
}
w2=$(waits "$W/gpt2.h5" 1) w4=$(waits "$W/gpt2-4.h5" 1) wl=$(waits "$W/llama.h5" 1)
w3=$(waits "$W/gpt2.h5" 3)
tap_diag "host waits and reads per step: gpt2 2 layers '$w2', 4 layers '$w4', llama '$wl', 3 micro-batches '$w3'"
[ "$w2" = "2 2" ] && [ "$w4" = "2 2" ] && [ "$wl" = "2 2" ] && [ "$w3" = "4 4" ]
tap_ok $? "a step waits for the loss of each micro-batch and the gradient norm only, whatever the depth or size"

# plan NAME RANKS ARGS...: the memory plan against the device (guarded_lib.sh)
plan "gpt2 1 rank" 1 --model "$W/gpt2.h5"
plan "gpt2 1 rank, bf16 activations" 1 --model "$W/gpt2.h5" --activation-dtype bf16
plan "gpt2 1 rank, bf16 activations, activation checkpointing" 1 --model "$W/gpt2-4.h5" \
    --activation-dtype bf16 --activation-checkpointing
plan "llama 1 rank, bf16 activations" 1 --model "$W/llama.h5" --activation-dtype bf16
plan "llama 1 rank, bf16 activations, activation checkpointing" 1 --model "$W/llama.h5" \
    --activation-dtype bf16 --activation-checkpointing
plan "llama 1 rank, activation checkpointing" 1 --model "$W/llama.h5" --activation-checkpointing
if [ -n "$MPIEXEC" ]; then
    plan "gpt2 dp=2" 2 --model "$W/gpt2.h5" --mesh dp=2 --backend tcp
    plan "llama dp=2, bf16 params" 2 --model "$W/llama.h5" --mesh dp=2 --backend tcp \
        --param-dtype bf16
    plan "llama dp=2,tp=2" 4 --model "$W/llama.h5" --mesh dp=2,tp=2 --backend tcp
    plan "gpt2 dp=2, bf16 activations" 2 --model "$W/gpt2.h5" --mesh dp=2 --backend tcp \
        --activation-dtype bf16
    plan "llama tp=2, bf16 activations" 2 --model "$W/llama.h5" --mesh tp=2 --backend tcp \
        --activation-dtype bf16
    plan "gpt2 tp=2, bf16 activations" 2 --model "$W/gpt2.h5" --mesh tp=2 --backend tcp \
        --activation-dtype bf16
    plan "gpt2 tp=2, sequence parallel off, bf16 activations" 2 --model "$W/gpt2.h5" \
        --mesh tp=2 --backend tcp --sequence-parallel off --activation-dtype bf16
    plan "gpt2 dp=2, offload optim" 2 --model "$W/gpt2.h5" --mesh dp=2 --backend tcp \
        --offload optim
    plan "llama dp=2, bf16 params, offload params,optim" 2 --model "$W/llama.h5" --mesh dp=2 \
        --backend tcp --param-dtype bf16 --offload params,optim
    PP_K=4 plan "llama pp=2 gpipe, 4 micro-batches (tied)" 2 --model "$W/llama.h5" \
        --mesh pp=2 --backend tcp --grad-accum 4 --pp-schedule gpipe
    PP_D=2 PP_K=2 plan "llama pp=2,dp=2 1f1b (tied)" 4 --model "$W/llama.h5" --mesh pp=2,dp=2 \
        --backend tcp --grad-accum 2
    PP_K=2 PP_V=2 plan "gpt2 4 layers pp=2 interleaved (2 chunks a rank, tied), bf16 activations" 2 \
        --model "$W/gpt2-4.h5" --mesh pp=2 --backend tcp --grad-accum 2 \
        --pp-schedule interleaved --pp-virtual 2 --activation-dtype bf16
fi
plan "llama 1 rank, offload optim" 1 --model "$W/llama.h5" --offload optim
tap_done
