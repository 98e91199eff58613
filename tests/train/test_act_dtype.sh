#!/bin/sh
# test_act_dtype.sh - --activation-dtype bf16 (GPT-2 and Llama): the losses
# and gradient norms of a 20-step run stay within 2e-3 and 1e-2 (relative)
# of the f32 run's, step by step; checkpointed
# blocks, which recompute from the stored input, change nothing, bit for
# bit; the memory plans of GPT-2 124M and Llama 1B at 4 x 1024 save
# exactly the bytes that bf16 storage of the blocks' tensors and the
# residual stream saves, less the f32 working set that remains (what the
# products cannot read or write as stores); pp=2 equals one
# rank; GPT-2 and Llama over tp=2 (with and without sequence
# parallelism) keep the same bounds against tp=2 at f32. (cpu = guarded
# bit for bit, the plan against the guarded device's buffers:
# test_guarded.sh; the cuda table: test_cuda_train.sh.)
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-actdtype.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
MPIEXEC=$(command -v mpiexec.mpich)

sh "$top_srcdir/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 3 --heads 2 --width 48 --context 64 --seed 1 \
    -o "$W/gpt2.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --preset llama-tiny --seed 3 -o "$W/llama.h5" > /dev/null 2>&1
tap_ok $? "fixtures: a token file, GPT-2 (3 layers) and llama-tiny"

# run NAME ARGS...: 20 steps into $W/NAME.jsonl; its losses into $W/NAME.loss
run() {
    r_name=$1
    shift
    "$TRAIN" --model "${MODEL:-$W/gpt2.h5}" --data "$W/train.bin" --batch-size 4 --seq-len 64 \
        --steps 20 --lr 3e-3 --metrics "$W/$r_name.jsonl" "$@" > "$W/$r_name.out" 2>&1 &&
    grep '"loss"' "$W/$r_name.jsonl" |
        sed 's/.*"step":\([0-9]*\).*"loss":\([^,]*\).*"grad_norm":\([^,]*\).*/\1 \2 \3/' \
        > "$W/$r_name.loss"
}
run f32 && run bf16 --activation-dtype bf16 && run bf16ck --activation-dtype bf16 \
    --activation-checkpointing
tap_ok $? "20 steps with f32 and bf16 activations (and checkpointing)"

# bf16 rounds every stored value by at most 2^-9 (2e-3) of itself; the
# loss, a mean over 256 tokens, moves far less in 20 steps (measured: 1.1e-4
# relative), the gradient norm a little more (2.4e-3). The bounds are the
# rounding unit for the loss and 5 of them for the norm: a tensor read back
# wrong (narrowed and read as f32, or another block's) moves them more (a
# planted one: the loss by 5.3e-3, the norm by 1.1e-2).
# near F32 BF16 WHAT: the two curves within those bounds
near() {
    python3 - "$1" "$2" "$3" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
def worst(i):
    return max(abs(float(x[i]) - float(y[i])) / abs(float(x[i])) for x, y in zip(a, b))
print("# %s: steps %d, worst relative difference bf16 vs f32: loss %.2e (tolerance 2e-3), "
      "grad norm %.2e (1e-2); loss first %s last %s vs %s"
      % (sys.argv[3], len(a), worst(1), worst(2), a[0][1], a[-1][1], b[-1][1]))
sys.exit(0 if len(a) == 20 and len(b) == 20 and worst(1) < 2e-3 and worst(2) < 1e-2
         and a != b else 1)
PY
}
near "$W/f32.loss" "$W/bf16.loss" gpt2
tap_ok $? "bf16 activations: losses within 2e-3 and norms within 1e-2 of f32's, step by step"

cmp -s "$W/bf16.loss" "$W/bf16ck.loss"
tap_ok $? "bf16 activations: activation checkpointing gives the same losses and norms, bit for bit"

# llama-tiny (RMSNorm, RoPE, GQA, SwiGLU) the same way
MODEL="$W/llama.h5" run lf32 && MODEL="$W/llama.h5" run lbf16 --activation-dtype bf16 &&
    MODEL="$W/llama.h5" run lbf16ck --activation-dtype bf16 --activation-checkpointing
tap_ok $? "llama-tiny: 20 steps with f32 and bf16 activations (and checkpointing)"
near "$W/lf32.loss" "$W/lbf16.loss" llama-tiny
tap_ok $? "llama bf16 activations: losses within 2e-3 and norms within 1e-2 of f32's, step by step"
cmp -s "$W/lbf16.loss" "$W/lbf16ck.loss"
tap_ok $? "llama bf16 activations: activation checkpointing gives the same losses and norms, bit for bit"

# the plan of GPT-2 124M (L 12, C 768, NH 12) at 4 x 1024: of each block's
# 15 C values a row (ln_1, qkv 3C, attention output, res2, ln_2, c_fc 4C,
# GELU 4C) and of the L+1 residual rows, bf16 saves 2 bytes each; it holds
# an f32 working set of one C a row (res2, the MLP product's f32 residual:
# the products read and write the other tensors' stores) and two f32
# residual rows more
saved() {
    "$TRAIN" --print-memory --model "${MODEL:-gpt2}" --batch-size 4 --seq-len 1024 "$@" \
        2> /dev/null |
        sed -n 's/^  activations saved for the backward  *\([0-9]*\) .*/\1/p'
}
f=$(saved) b=$(saved --activation-dtype bf16)
BT=4096 C=768 L=12 NH=12
want=$((((L + 1) * 2 + L * 15 * 2 - 1 * 4 - 2 * 4) * C * BT))
tap_diag "gpt2 124M 4 x 1024, saved activations: f32 $f, bf16 $b bytes; saved $((f - b)), planned $want"
[ -n "$f" ] && [ -n "$b" ] && [ $((f - b)) -eq "$want" ]
tap_ok $? "print-memory: bf16 activations save exactly what bf16 storage saves (gpt2 124M)"

# llama-1b (L 16, C 2048, NH 32, NKV 8, F 8192): of each block's 4 C + QKV +
# 3 F values a row (the two norms' outputs, q k v after RoPE (NH + 2 NKV)
# hs, the attention output, res2, gate, up, SwiGLU's output) and of the L+1
# residual rows, bf16 saves 2 bytes each; it holds an f32 working set of
# gate and up (their gradients in the backward; qkv, rotated in place
# before it is stored, shares gate's buffer) and res2 (the MLP product's
# f32 residual), 2 F + C a row, and two f32 residual rows more
f=$(MODEL=llama-1b saved) b=$(MODEL=llama-1b saved --activation-dtype bf16)
C=2048 L=16 NH=32 QKV=$((2048 / 32 * (32 + 2 * 8))) F=8192
K=$((4 * C + QKV + 3 * F))
want=$((((L + 1) * C * 2 + L * K * 2 - (2 * F + C) * 4 - 2 * C * 4) * BT))
tap_diag "llama-1b 4 x 1024, saved activations: f32 $f, bf16 $b bytes; saved $((f - b)), planned $want"
[ -n "$f" ] && [ -n "$b" ] && [ $((f - b)) -eq "$want" ]
tap_ok $? "print-memory: bf16 activations save exactly what bf16 storage saves (llama-1b)"
if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "tensor parallelism and the pipeline"
else
    # GPT-2 and Llama over tp=2, with sequence parallelism (the norms'
    # outputs, res2 and the residual stream stored as this rank's rows, a
    # norm's output rounded before it is gathered) and without: the same
    # bounds against tp=2 at f32, and checkpointing the same bits
    tp_run() {
        t_name=$1
        shift
        "$MPIEXEC" -n 2 "$TRAIN" --model "$TP_MODEL" --data "$W/train.bin" --batch-size 4 \
            --seq-len 64 --steps 20 --lr 3e-3 --mesh tp=2 --metrics "$W/$t_name.jsonl" "$@" \
            > "$W/$t_name.out" 2>&1 &&
            grep '"loss"' "$W/$t_name.jsonl" |
            sed 's/.*"step":\([0-9]*\).*"loss":\([^,]*\).*"grad_norm":\([^,]*\).*/\1 \2 \3/' \
                > "$W/$t_name.loss"
    }
    for arch in gpt2 llama; do
        TP_MODEL="$W/$arch.h5"
        for sp in on off; do
            n="$arch$sp"
            tp_run "tpf32$n" --sequence-parallel $sp &&
                tp_run "tpbf16$n" --sequence-parallel $sp --activation-dtype bf16 &&
                tp_run "tpbf16ck$n" --sequence-parallel $sp --activation-dtype bf16 \
                    --activation-checkpointing &&
                near "$W/tpf32$n.loss" "$W/tpbf16$n.loss" "$arch tp=2, sequence parallel $sp" &&
                cmp -s "$W/tpbf16$n.loss" "$W/tpbf16ck$n.loss"
            tap_ok $? "$arch tp=2 (sequence parallel $sp), bf16 activations: within the bounds of tp=2 at f32, checkpointing the same bits"
        done
        # the first step's loss (a forward from the same weights) is the
        # same bits with sequence parallelism and without, as at f32: a
        # norm's output gathered before it is rounded gives the products
        # other inputs than the ranks that hold every row read
        l_on=$(head -n 1 "$W/tpbf16${arch}on.loss" | cut -d' ' -f2)
        l_off=$(head -n 1 "$W/tpbf16${arch}off.loss" | cut -d' ' -f2)
        tap_diag "$arch tp=2 bf16, first loss: sequence parallel on $l_on, off $l_off"
        [ -n "$l_on" ] && [ "$l_on" = "$l_off" ]
        tap_ok $? "$arch tp=2 bf16 activations: the first loss the same bits with sequence parallelism and without"
    done

    # a pipeline stage's input arrives in the residual's f32 slot and is
    # stored (rounded) before the block reads it: pp=2 equals one rank up to
    # the order of sums (f32: 1e-7), which bf16's rounding magnifies where a
    # value sits at a rounding boundary (measured: 3e-8 here, 3.6e-6 with
    # another 4-layer model). A stage that reads its store instead of the
    # input it was sent misses by far more.
    if /usr/bin/python3 -c 'import h5py, numpy' > /dev/null 2>&1; then
        PP="--model $W/gpt2.h5 --data $W/train.bin --batch-size 2 --seq-len 32 --grad-accum 2 \
--steps 4 --lr 3e-3 --activation-dtype bf16"
        # shellcheck disable=SC2086
        "$TRAIN" $PP --metrics "$W/pp1.jsonl" > "$W/pp1.out" 2>&1 &&
            "$MPIEXEC" -n 2 "$TRAIN" $PP --mesh pp=2 --backend tcp --metrics "$W/pp2.jsonl" \
                > "$W/pp2.out" 2>&1 &&
            /usr/bin/python3 "$top_srcdir/tests/fsdp/compare_models.py" losses "$W/pp2.jsonl" \
                "$W/pp1.jsonl" --tol 1e-4 > "$W/pp.cmp" 2>&1
        rc=$?
        tap_diag "$(head -n 2 "$W/pp.cmp")"
        tap_ok $rc "bf16 activations over pp=2 equal one rank within 1e-4 (losses, norms)"
        PP="--model $W/llama.h5 --data $W/train.bin --batch-size 2 --seq-len 32 --grad-accum 2 \
--steps 4 --lr 3e-3 --activation-dtype bf16"
        # shellcheck disable=SC2086
        "$TRAIN" $PP --metrics "$W/lpp1.jsonl" > "$W/lpp1.out" 2>&1 &&
            "$MPIEXEC" -n 2 "$TRAIN" $PP --mesh pp=2 --backend tcp --metrics "$W/lpp2.jsonl" \
                > "$W/lpp2.out" 2>&1 &&
            /usr/bin/python3 "$top_srcdir/tests/fsdp/compare_models.py" losses "$W/lpp2.jsonl" \
                "$W/lpp1.jsonl" --tol 1e-4 > "$W/lpp.cmp" 2>&1
        rc=$?
        tap_diag "$(head -n 2 "$W/lpp.cmp")"
        tap_ok $rc "llama bf16 activations over pp=2 equal one rank within 1e-4 (losses, norms)"
    else
        tap_skip_dep python3-h5py "the pipeline comparison"
    fi
fi
tap_done
