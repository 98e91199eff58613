#!/bin/sh
# test_nccl_train_sim.sh - fsdpc-train over the nccl backend, on a machine
# without a GPU: train_nccl_sim runs the trainer on the simulated CUDA
# device "cuda-sim" (the CUDA device's host side, the CPU kernels) with
# NCCL simulated over MPI between the rank processes (tests/backends/
# mpsim.h), and every kernel, copy and collective checked against the
# order of the streams. Each run is compared with --device cpu --backend
# mpi: the same kernels and the same reductions in rank order, so every
# step's loss and gradient norm and the final weights are bit-identical.
# Also: dropping the stream waits stops a run (the check can fail), and
# the trainer's refusals of nccl where no buffer of the run could be
# NCCL's.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
SIM="$BIN/tests/backends/train_nccl_sim"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ncclsim.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
MPIEXEC=$(command -v mpiexec.mpich)
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"

if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "the simulated ranks are MPI processes"
    tap_done
    exit 0
fi
if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep python3-h5py "the comparisons"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 100000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
    -o "$W/gpt2.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --preset llama-tiny --seed 3 -o "$W/llama.h5" > /dev/null 2>&1
tap_ok $? "fixtures: a token file, GPT-2 (2 layers) and llama-tiny"

# one NAME RANKS DEVICE PROGRAM ARGS...: a run into $W/NAME.DEVICE.*
one() {
    o_name=$1 o_n=$2 o_dev=$3 o_prog=$4
    shift 4
    timeout 300 "$MPIEXEC" -n "$o_n" "$o_prog" "$@" --device "$o_dev" --batch-size 2 \
        --seq-len 32 --steps 3 --lr 3e-3 --out "$W/$o_name.$o_dev.h5" \
        --metrics "$W/$o_name.$o_dev.jsonl" > "$W/$o_name.$o_dev.out" 2>&1
}

# same NAME RANKS BACKEND MESH ARGS...: cpu over mpi, cuda-sim over BACKEND
same() {
    name=$1 n=$2 backend=$3 mesh=$4
    shift 4
    ok=0
    one "$name" "$n" cpu "$BIN/fsdpc-train" --mesh "$mesh" --backend mpi "$@" || ok=1
    one "$name" "$n" cuda-sim "$SIM" --mesh "$mesh" --backend "$backend" "$@" || ok=1
    if [ $ok -ne 0 ]; then
        tap_diag "$(grep -h '^fsdpc' "$W/$name.cpu.out" "$W/$name.cuda-sim.out" | head -n 4)"
        tap_diag "$(tail -n 2 "$W/$name.cpu.out" "$W/$name.cuda-sim.out")"
    elif ! grep -q "^fsdp: mesh $mesh ($backend)" "$W/$name.cuda-sim.out"; then
        ok=1
        tap_diag "the run did not say mesh $mesh ($backend): $(grep '^fsdp: mesh' "$W/$name.cuda-sim.out")"
    else
        for what in losses models; do
            ext=jsonl
            [ $what = models ] && ext=h5
            "$PY" "$CMP" $what "$W/$name.cuda-sim.$ext" "$W/$name.cpu.$ext" --tol 0 \
                > "$W/$name.$what" 2>&1 || {
                ok=1
                tap_diag "$what: $(tail -n 2 "$W/$name.$what")"
            }
        done
    fi
    tap_ok $ok "nccl (simulated) on cuda-sim = cpu over mpi, bit for bit: $name"
}

G="--model $W/gpt2.h5 --data $W/train.bin"
same "gpt2 dp=2" 2 nccl dp=2 $G
same "gpt2 tp=2" 2 nccl tp=2 $G
same "llama tp=2" 2 nccl tp=2 --model "$W/llama.h5" --data "$W/train.bin"
same "gpt2 rdp=2,dp=2" 4 nccl rdp=2,dp=2 $G
same "gpt2 rdp=2,dp=2, rdp over mpi (staged)" 4 rdp=mpi,dp=nccl rdp=2,dp=2 $G
same "llama dp=2,tp=2" 4 nccl dp=2,tp=2 --model "$W/llama.h5" --data "$W/train.bin"
same "gpt2 dp=2, bf16 params and reduction" 2 nccl dp=2 $G --param-dtype bf16 --reduce-dtype bf16

# the check can fail: without the stream waits the first collective that
# reads what the compute stream wrote stops the run, naming both streams
FSDPC_MPSIM_DROP_WAITS=1 one drop 2 cuda-sim "$SIM" --backend nccl $G
rc=$?
ok=0
if [ $rc -eq 0 ] || ! grep -q "nccl simulation: .* has not waited for" "$W/drop.cuda-sim.out"; then
    ok=1
    tap_diag "exit $rc: $(tail -n 3 "$W/drop.cuda-sim.out")"
fi
tap_ok $ok "a run whose stream waits are dropped stops at the first unordered read"

# refusals: one line and a hint, before any communicator
# bad NAME WANT HINT PROGRAM ARGS...
bad() {
    b_name=$1 want=$2 hint=$3 prog=$4
    shift 4
    ok=0
    timeout 120 "$MPIEXEC" -n 2 "$prog" "$@" $G --batch-size 2 --seq-len 32 --steps 1 \
        --lr 1e-3 > "$W/$b_name.out" 2>&1 && ok=1
    n=$(grep -c "^fsdpc: rank 0 on .*: fsdpc-train:" "$W/$b_name.out")
    if [ $ok -ne 0 ] || [ "$n" -ne 1 ] || ! grep -q "$want" "$W/$b_name.out" ||
        ! grep -q "^fsdpc: hint: .*$hint" "$W/$b_name.out"; then
        ok=1
        tap_diag "$(grep 'fsdpc' "$W/$b_name.out" | tail -n 4)"
    fi
    tap_ok $ok "refused in one line with a hint: $b_name"
}
bad "--device cpu --backend nccl" "takes CUDA device memory only" "--device cuda" \
    "$BIN/fsdpc-train" --device cpu --backend nccl
bad "--device guarded --backend nccl" "takes neither --device guarded's memory nor host" \
    "nccl takes CUDA device memory only" "$SIM" --device guarded --backend nccl
tap_done
