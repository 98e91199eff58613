#!/bin/sh
# run_gpu_checks.sh - the checks that need a CUDA GPU, run on a bare GPU
# machine from the kit that tests/gpu/kit.sh builds elsewhere: nothing is
# built here, and the machine needs no MPI, HDF5 or BLAS of its own; only a
# CUDA driver, CUDA's libraries (the toolkit's lib64, or python3's nvidia
# wheels), and for the peer benchmark PyTorch.
#
# Most valuable first, each step with a time limit, under one budget for the
# whole run (BUDGET seconds; a step that no longer fits is skipped, and the
# summary says so):
#   a. probe: the GPU, driver and CUDA versions, where CUDA's libraries were
#      found, whether the kit's fsdpc-train has the cuda device
#   b. GPT-2 and Llama (tiny) trained 10 steps with --device cuda and with
#      --device cpu: every step's loss and gradient norm within 1e-4
#      (relative) in f32; with bf16 parameters, bf16 activations (f32
#      parameters: the products widen the stores; bf16: the stores are
#      cuBLASLt's operands as they are), and both with activation
#      checkpointing, the loss within 2e-2
#   b2. the sharded engine on device memory: dp=2 over tcp in two
#      processes on the one GPU equal to one process (same global batch),
#      the same staged in 4 KiB chunks bit for bit, and the nccl backend
#      through fsdpc-train at one rank
#   c. compute-sanitizer memcheck and racecheck on a 2-step GPT-2 run, and
#      memcheck again with bf16 parameters and activations
#   d. GPT-2 124M, bf16 parameters and activations, batch 16 x 1024:
#      fsdpc-train's tokens/s, MFU and memory beside --print-memory's plan
#      (against PEAK_FLOPS), and PyTorch's on the same GPU, eager and compiled
#      (tests/peers/torch_gpt2_bench.py)
#   d2. --offload optim and params,optim on gpt2-tiny (f32) equal to no
#      offload within 1e-6, their checkpoints resumed with the other
#      setting; GPT-2 124M's step time with --offload optim against d's
#      (target at most 1.3x)
#   e. the nccl backend: its test program (the one-GPU checks) and a
#      one-rank allreduce sweep with fsdpc-bench
#   f. a Llama of 1B parameters (Llama 3.2 1B's shape), bf16, if time is left
# When the kit's build has no cuda device, every step that needs it says so
# and skips; the CPU runs and the PyTorch benchmark still run.
#
# Without a GPU it does nothing and says so (exit 0), before it looks for
# the kit: the GPU checks skip cleanly on every other machine.
#
# Usage: tests/gpu/run_gpu_checks.sh [KIT]
#   KIT   the kit archive (default: build-gpu-kit/fsdpc-gpu-kit.tar.gz at the
#         top of the source), or an unpacked kit's directory (the default
#         when this script runs from one)
# Environment:
#   OUT         where summary.txt and logs.tar.gz go (default ./gpu-logs)
#   BUDGET      seconds for the whole run (default 330)
#   PEAK_FLOPS  the GPU's dense bf16 peak for MFU (default 989e12: H100/H200)
#   PYTHON      the Python with PyTorch (default python3)
#
# Exit status: 0 when every step that ran passed (or there is no GPU), 1
# otherwise.

set -u

t_start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-./gpu-logs}
BUDGET=${BUDGET:-330}
PEAK_FLOPS=${PEAK_FLOPS:-989e12}
PYTHON=${PYTHON:-python3}
deadline=$((t_start + BUDGET))
mkdir -p "$OUT" || { echo "$0: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
summary=$OUT/summary.txt
failed=0
: >"$summary"

say() {
    echo "$*" | tee -a "$summary"
}

fail() {
    say "FAIL  $*"
    failed=1
}

# How many GPUs this process would see: CUDA_VISIBLE_DEVICES when set (empty
# or -1 hides them all), else nvidia-smi, else the driver's /proc entries.
count_gpus() {
    phys=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        phys=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    elif [ -d /proc/driver/nvidia/gpus ]; then
        phys=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    fi
    if [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then
        case "$CUDA_VISIBLE_DEVICES" in
        "" | -1* | none | NoDevFiles) echo 0; return ;;
        esac
        listed=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$listed" -lt "$phys" ] && phys=$listed
    fi
    echo "$phys"
}

say "fsdpc GPU checks: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), budget $BUDGET s"
ngpu=$(count_gpus)
say "GPUs visible: $ngpu (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>})"
if [ "$ngpu" -eq 0 ]; then
    say "SKIP  all GPU checks: no GPU visible on this machine"
    exit 0
fi

# -- the kit -----------------------------------------------------------------
kit_arg=${1:-}
if [ -z "$kit_arg" ]; then
    if [ -f "$here/KIT_INFO" ]; then
        kit_arg=$here
    else
        kit_arg=$(cd "$here/../.." && pwd)/build-gpu-kit/fsdpc-gpu-kit.tar.gz
    fi
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-gpu.XXXXXX") || exit 1
L=$W/logs
D=$W/data
mkdir -p "$L" "$D"
# shellcheck disable=SC2317 # called by the trap
finish() {
    cp "$summary" "$L/" 2>/dev/null
    tar -C "$W" -czf "$OUT/logs.tar.gz" logs 2>/dev/null
    rm -rf "$W"
}
trap finish EXIT
trap 'exit 1' INT TERM
if [ -d "$kit_arg" ]; then
    kit=$(cd "$kit_arg" && pwd)
elif [ -f "$kit_arg" ]; then
    tar -C "$W" -xzf "$kit_arg" || { fail "cannot unpack the kit $kit_arg"; exit 1; }
    kit=$W/fsdpc-gpu-kit
else
    fail "no kit at $kit_arg (build it with tests/gpu/kit.sh on a machine with the dependencies)"
    exit 1
fi
[ -f "$kit/KIT_INFO" ] || { fail "$kit holds no KIT_INFO: not a kit"; exit 1; }
info() {
    sed -n "s/^$1=//p" "$kit/KIT_INFO"
}
say "kit: $kit_arg (source $(info source), built $(info built))"
bin=$kit/libexec

# -- step runner ---------------------------------------------------------------
left() {
    echo $((deadline - $(date +%s)))
}

# step NAME CAP MIN CMD...: runs CMD into $L/NAME.log with a limit of CAP
# seconds, or of what is left of the budget (less 10 s to pack the logs)
# when that is less; when under MIN seconds are left, says it skips and
# returns 200. Sets dt to the seconds it took.
step() {
    s_name=$1 s_cap=$2 s_min=$3
    shift 3
    s_lim=$(($(left) - 10))
    [ "$s_lim" -gt "$s_cap" ] && s_lim=$s_cap
    if [ "$s_lim" -lt "$s_min" ]; then
        say "SKIP  $s_name: out of time ($(left) s of the $BUDGET s budget left)"
        dt=0
        return 200
    fi
    s_t0=$(date +%s)
    timeout -k 5 "$s_lim" "$@" >"$L/$s_name.log" 2>&1
    s_rc=$?
    dt=$(($(date +%s) - s_t0))
    if [ $s_rc -eq 124 ] || [ $s_rc -eq 137 ]; then
        echo "killed after its limit of $s_lim s" >>"$L/$s_name.log"
    fi
    return $s_rc
}

# the last line of a log that says what went wrong (not the hint after it)
tail_msg() {
    grep -v '^fsdpc: hint:' "$1" | grep . | tail -n 1
}

# check NAME CAP MIN CMD...: a step that passes when CMD exits 0
check() {
    c_name=$1
    step "$@"
    c_rc=$?
    [ $c_rc -eq 200 ] && return $c_rc
    if [ $c_rc -eq 0 ]; then
        say "PASS  $c_name (${dt} s)"
    else
        fail "$c_name (exit $c_rc, ${dt} s): $(tail_msg "$L/$c_name.log")"
    fi
    return $c_rc
}

# -- a. probe ------------------------------------------------------------------
say "== a. probe"
nvidia-smi >"$L/nvidia-smi.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
cuda_drv=$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$L/nvidia-smi.log" | head -n 1)
nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
torch_v=$("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)
say "GPU: ${gpu:-?} | driver's CUDA ${cuda_drv:-?} | nvcc ${nvcc_v:-none} | glibc ${glibc:-?} (kit needs >= $(info glibc_min)) | torch ${torch_v:-none}"
say "kit: cuda kernels $(info cuda_kernels), nccl $(info nccl); CUDA libraries it loads: $(info cuda_libs)"

# CUDA's libraries: the toolkit's lib64 (or one the loader already knows),
# else python3's nvidia wheels; each one's directory goes on the path
wheel_dirs=
nv=$("$PYTHON" -c 'import nvidia; print("\n".join(list(nvidia.__path__)))' 2>/dev/null)
for d in $nv; do
    wheel_dirs="$wheel_dirs $(find "$d" -maxdepth 3 -name 'lib*.so*' 2>/dev/null |
        sed 's|/[^/]*$||' | sort -u | tr '\n' ' ')"
done
sys_dirs="${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib"
cuda_path=
missing=
for lib in $(info cuda_libs); do
    where=
    for d in $sys_dirs; do
        [ -e "$d/$lib" ] && { where="$d (system CUDA)"; break; }
    done
    if [ -z "$where" ] && { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | grep -q "[[:space:]]$lib "; then
        where="the loader's cache (system)"
    fi
    if [ -z "$where" ]; then
        for d in $wheel_dirs; do
            [ -e "$d/$lib" ] && { where="$d (python3's nvidia wheels)"; break; }
        done
    fi
    if [ -z "$where" ]; then
        say "      $lib: not found"
        missing="$missing $lib"
        continue
    fi
    say "      $lib: $where"
    d=${where%% (*}
    case $d in
    /*) case ":$cuda_path:" in *":$d:"*) ;; *) cuda_path=${cuda_path:+$cuda_path:}$d ;; esac ;;
    esac
done
FSDPC_KIT_CUDA_LIBS=$cuda_path
export FSDPC_KIT_CUDA_LIBS
# shellcheck disable=SC1091 # the kit's, found at run time
. "$kit/env.sh"
ldd "$bin/fsdpc-train" >"$L/ldd.log" 2>&1
if grep -q 'not found' "$L/ldd.log"; then
    fail "probe: fsdpc-train cannot load: $(grep 'not found' "$L/ldd.log" | awk '{ print $1 }' | tr '\n' ' ')"
else
    say "PASS  probe: every library fsdpc-train needs is found"
fi
"$bin/fsdpc-train" --help >"$L/help.log" 2>&1
grep -A3 -- '--device' "$L/help.log" | sed 's/^/      /' | tee -a "$summary"
cuda=yes
if [ "$(info cuda_kernels)" != yes ]; then
    cuda="this kit's build has no cuda device (configured without --enable-cuda-kernels)"
elif ! grep -A1 -- '--device' "$L/help.log" | grep -q cuda; then
    cuda="fsdpc-train --help names no cuda device"
elif [ -n "$missing" ]; then
    cuda="CUDA libraries not found:$missing"
fi
[ "$cuda" = yes ] || say "note: no --device cuda: $cuda; every cuda step skips"

# -- b. cuda against cpu -------------------------------------------------------
say "== b. training on cuda against cpu (10 steps)"
sh "$kit/corpus.sh" 300000 >"$D/text"
check fixtures 60 20 sh -c "'$bin/fsdpc-data' tokenize '$D/text' -o '$D/train.bin' &&
    '$bin/fsdpc-ckpt' init --preset tiny --seed 1 -o '$D/gpt2-tiny.h5' &&
    '$bin/fsdpc-ckpt' init --preset llama-tiny --seed 3 -o '$D/llama-tiny.h5'"

# train NAME MODEL DEVICE DTYPE STEPS [FLAGS...]: a run into $L/NAME.{log,jsonl}
train() {
    t_name=$1 t_model=$2 t_dev=$3 t_dt=$4 t_steps=$5
    shift 5
    step "$t_name" 60 10 "$bin/fsdpc-train" --model "$D/$t_model.h5" --data "$D/train.bin" \
        --device "$t_dev" --param-dtype "$t_dt" --steps "$t_steps" --batch-size 4 --seq-len 64 \
        --lr 1e-3 --seed 1 --peak-flops 1e12 --metrics "$L/$t_name.jsonl" "$@"
}

# step loss norm, one line per step of a metrics file
records() {
    grep '"loss"' "$1" | sed 's/.*"step":\([0-9]*\).*"loss":\([^,]*\).*"grad_norm":\([^,}]*\).*/\1 \2 \3/'
}

# compare A B LOSS_TOL NORM_TOL (0: reported only) [STEPS (default 10)]:
# prints the largest relative differences; exit status 0 when within the
# tolerances over at least STEPS steps
compare() {
    records "$1" >"$1.rec"
    records "$2" >"$2.rec"
    paste -d ' ' "$1.rec" "$2.rec" | awk -v tl="$3" -v tn="$4" -v min="${5:-10}" '
        function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
        { n++; l = rel($5, $2); g = rel($6, $3); if (l > ml) ml = l; if (g > mg) mg = g
          if ($1 != $4 || l > tl || (tn > 0 && g > tn)) { if (!bad) first = $1; bad = 1 } }
        END { printf "%d steps, loss max rel %.2e, grad norm max rel %.2e%s", n, ml, mg,
                  bad ? ", first bad step " first : ""
              exit (bad || n < min) }'
}

# variants NAME:PARAM_DTYPE:ACTIVATION_DTYPE[:ckpt]
variants="f32:f32:f32 bf16:bf16:f32 act16:f32:bf16 bf16-act16:bf16:bf16 bf16-act16-ckpt:bf16:bf16:ckpt"
for model in gpt2-tiny llama-tiny; do
    for v in $variants; do
        dt_=${v%%:*}
        pdt=$(echo "$v" | cut -d: -f2)
        adt=$(echo "$v" | cut -d: -f3)
        set -- --activation-dtype "$adt"
        [ "$(echo "$v" | cut -d: -f4)" = ckpt ] && set -- "$@" --activation-checkpointing
        train "$model-$dt_-cpu" "$model" cpu "$pdt" 10 "$@"
        rc=$?
        [ $rc -eq 200 ] && continue
        if [ $rc -ne 0 ]; then
            fail "$model $dt_ on cpu (exit $rc): $(tail_msg "$L/$model-$dt_-cpu.log")"
            continue
        fi
        say "PASS  $model $dt_ on cpu: 10 steps, final loss $(records "$L/$model-$dt_-cpu.jsonl" |
            tail -n 1 | awk '{ print $2 }') (${dt} s)"
        if [ "$cuda" != yes ]; then
            say "SKIP  $model $dt_ cuda = cpu: $cuda"
            continue
        fi
        train "$model-$dt_-cuda" "$model" cuda "$pdt" 10 "$@"
        rc=$?
        [ $rc -eq 200 ] && continue
        if [ $rc -ne 0 ]; then
            fail "$model $dt_ on cuda (exit $rc): $(tail_msg "$L/$model-$dt_-cuda.log")"
            continue
        fi
        if [ "$dt_" = f32 ]; then tl=1e-4 tn=1e-4; else tl=2e-2 tn=0; fi
        if res=$(compare "$L/$model-$dt_-cpu.jsonl" "$L/$model-$dt_-cuda.jsonl" $tl $tn); then
            say "PASS  $model $dt_ cuda = cpu: $res (tolerance: loss $tl$([ "$tn" = 0 ] && echo ', norm reported' || echo ", norm $tn"))"
        else
            fail "$model $dt_ cuda = cpu: $res (tolerance: loss $tl$([ "$tn" = 0 ] || echo ", norm $tn"))"
        fi
    done
done

# -- b2. the sharded engine on device memory ------------------------------------
say "== b2. sharded training on the one GPU: dp=2 and pp=2 over tcp in two processes, nccl at one rank"
# ranks N NAME ARGS...: N processes of fsdpc-train meeting through env://
# (the kit has no mpiexec), every one on the same GPU; the first failure's
# status, after all have ended; the store's port below the kernel's
# ephemeral range (32768 up), where no connection takes it meanwhile
ranks() {
    r_n=$1 r_name=$2
    shift 2
    step "$r_name" 90 20 sh -c '
        n=$1 port=$2
        shift 2
        pids=
        for r in $(seq 0 $((n - 1))); do
            RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
                MASTER_PORT=$port "$@" &
            pids="$pids $!"
        done
        rc=0
        for p in $pids; do wait $p || { [ $rc -eq 0 ] && rc=$?; }; done
        exit $rc' ranks "$r_n" $((20000 + $$ % 12000)) "$@"
}
# shard NAME BATCH MESH BACKEND N [ARGS...]: gpt2-tiny on cuda, 10 steps, f32
shard() {
    s_name=$1 s_batch=$2 s_mesh=$3 s_backend=$4 s_n=$5
    shift 5
    ranks "$s_n" "$s_name" "$bin/fsdpc-train" --model "$D/gpt2-tiny.h5" --data "$D/train.bin" \
        --device cuda --steps 10 --batch-size "$s_batch" --seq-len 64 --lr 1e-3 --seed 1 \
        --peak-flops 1e12 --init env:// --mesh "$s_mesh" --backend "$s_backend" \
        --metrics "$L/$s_name.jsonl" "$@"
}
if [ "$cuda" != yes ]; then
    say "SKIP  sharded training on the GPU: $cuda"
else
    secret=$W/secret
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$secret")
    export FSDPC_SECRET_FILE=$secret
    # same_run RC1 RC2 REF NAME WHAT: run NAME against the one-process run
    # REF with the same global batch, within 1e-4 (a skip, 200, says itself)
    same_run() {
        if [ "$1" -eq 200 ] || [ "$2" -eq 200 ]; then
            :
        elif [ "$1" -ne 0 ] || [ "$2" -ne 0 ]; then
            fail "$5 (exit $1/$2): $(tail_msg "$L/$4.log")"
        elif res=$(compare "$L/$3.jsonl" "$L/$4.jsonl" 1e-4 1e-4); then
            say "PASS  $5 = one process, same global batch: $res"
        else
            fail "$5 = one process: $res (tolerance 1e-4)"
        fi
    }
    shard shard-one 8 dp=1 tcp 1
    rc1=$?
    shard shard-dp2-tcp 4 dp=2 tcp 2
    rc2=$?
    same_run $rc1 $rc2 shard-one shard-dp2-tcp "dp=2 over tcp, two processes on one GPU"
    # the same staged in 4 KiB chunks (many per collective, copied on the
    # copy stream while the chunk before travels): the same bits
    if [ $rc2 -eq 0 ]; then
        export FSDPC_STAGE_CHUNK_BYTES=4K
        shard shard-dp2-tcp-4k 4 dp=2 tcp 2
        rc=$?
        unset FSDPC_STAGE_CHUNK_BYTES
        if [ $rc -eq 0 ] &&
            res=$(compare "$L/shard-dp2-tcp.jsonl" "$L/shard-dp2-tcp-4k.jsonl" 0 1e-300); then
            say "PASS  dp=2 over tcp staged in 4 KiB chunks = in 4 MiB chunks, bit for bit: $res"
        elif [ $rc -ne 200 ]; then
            fail "dp=2 over tcp staged in 4 KiB chunks (exit $rc): ${res:-$(tail_msg "$L/shard-dp2-tcp-4k.log")}"
        fi
    fi
    # the pipeline on device memory: two stages over tcp, gpipe with 4
    # micro-batches (each stage holds 4 activation sets, the later ones on
    # their chunk's first's gradient workspace; sends in flight on their
    # lanes' streams) = one process with 4 accumulation steps
    shard shard-acc4 2 dp=1 tcp 1 --grad-accum 4
    rc1=$?
    shard shard-pp2-tcp 2 pp=2 tcp 2 --grad-accum 4 --pp-schedule gpipe
    same_run $rc1 $? shard-acc4 shard-pp2-tcp "pp=2 gpipe over tcp, two processes on one GPU"
    if [ "$(info nccl)" != yes ]; then
        say "SKIP  fsdpc-train --backend nccl: this kit's build has no nccl backend"
    else
        shard shard-nccl 8 dp=1 nccl 1
        rc=$?
        if [ $rc -eq 0 ] && res=$(compare "$L/shard-one.jsonl" "$L/shard-nccl.jsonl" 1e-4 1e-4); then
            say "PASS  fsdpc-train --backend nccl at one rank = tcp: $res"
        elif [ $rc -ne 200 ]; then
            fail "fsdpc-train --backend nccl at one rank (exit $rc): ${res:-$(tail_msg "$L/shard-nccl.log")}"
        fi
    fi
fi

# -- c. compute-sanitizer --------------------------------------------------------
say "== c. compute-sanitizer (2 steps of gpt2-tiny: f32, and memcheck with bf16 parameters and activations)"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$cuda" != yes ]; then
    say "SKIP  compute-sanitizer: $cuda"
elif [ ! -x "$sanitizer" ]; then
    say "SKIP  compute-sanitizer: not installed"
else
    for run in memcheck racecheck memcheck:bf16; do
        tool=${run%%:*}
        set --
        [ "$run" = memcheck:bf16 ] && set -- --param-dtype bf16 --activation-dtype bf16
        name=sanitizer-$(echo "$run" | tr : -)
        step "$name" 60 20 "$sanitizer" --tool $tool --error-exitcode 99 \
            "$bin/fsdpc-train" --model "$D/gpt2-tiny.h5" --data "$D/train.bin" --device cuda \
            --steps 2 --batch-size 4 --seq-len 64 --lr 1e-3 --peak-flops 1e12 "$@"
        rc=$?
        [ $rc -eq 200 ] && continue
        log=$L/$name.log
        errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
        hazards=$(sed -n 's/.*RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p' "$log" | tail -n 1)
        [ $tool = racecheck ] && [ -n "$hazards" ] && errors=$(sed -n \
            's/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
        if grep -q 'Device not supported' "$log"; then
            say "SKIP  compute-sanitizer $run: the device or runtime refuses it (Device not supported)"
        elif [ $rc -eq 0 ] && [ "${errors:-x}" = 0 ]; then
            say "PASS  compute-sanitizer $run: 0 errors${hazards:+ ($hazards hazards)} (${dt} s)"
        else
            fail "compute-sanitizer $run: ${errors:-?} errors${hazards:+, $hazards hazards} (exit $rc, ${dt} s)"
        fi
    done
fi

# -- d. GPT-2 124M: fsdpc against PyTorch ----------------------------------------
say "== d. GPT-2 124M, bf16, batch 16 x 1024, peak $PEAK_FLOPS FLOP/s"
# median of a field over the steps after the first 2 (warm-up)
median() {
    grep '"loss"' "$1" | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" | tail -n +3 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# bench_report NAME LABEL RC: the figures of a benchmark run, also of one
# killed at its limit once it has done a step past the warm-up
bench_report() {
    b_file=$L/$1.jsonl
    b_n=$(grep -c '"loss"' "$b_file" 2>/dev/null)
    b_fig=
    [ "${b_n:-0}" -ge 3 ] && b_fig="$(median "$b_file" tokens_per_s) tok/s, mfu $(median "$b_file" mfu)%,\
 $(median "$b_file" ms) ms/step (median of steps 3-$b_n), $(median "$b_file" mem_mib) MiB"
    if [ "$3" -eq 0 ]; then
        say "PASS  $2: $b_fig (${dt} s)"
    elif [ "$3" -ne 200 ]; then
        fail "$2 (exit $3, ${dt} s, ${b_n:-0} steps done): $(tail_msg "$L/$1.log")"
        [ -n "$b_fig" ] && say "      $2 so far: $b_fig"
    fi
}
# plan_report NAME MODEL B T: --print-memory's planned total for a benchmark
# run's model and batch, beside the memory it measured (a figure, not a check)
plan_report() {
    "$bin/fsdpc-train" --model "$2" --data "$D/train.bin" --device cuda --param-dtype bf16 \
        --activation-dtype bf16 --batch-size "$3" --seq-len "$4" --print-memory \
        >"$L/$1-plan.log" 2>&1 &&
        say "      $1: planned $(sed -n 's/^  total, held from the first step *[0-9]* *//p' \
            "$L/$1-plan.log") (--print-memory) against $(median "$L/$1.jsonl" mem_mib) MiB measured"
}
if [ "$cuda" != yes ]; then
    say "SKIP  fsdpc-train GPT-2 124M: $cuda"
elif check init-gpt2 60 20 "$bin/fsdpc-ckpt" init --preset gpt2 --seed 1 -o "$D/gpt2.h5"; then
    step bench-gpt2 90 30 "$bin/fsdpc-train" --model "$D/gpt2.h5" --data "$D/train.bin" \
        --device cuda --param-dtype bf16 --activation-dtype bf16 --batch-size 16 --seq-len 1024 \
        --steps 8 --lr 6e-4 --peak-flops "$PEAK_FLOPS" --metrics "$L/bench-gpt2.jsonl"
    bench_report bench-gpt2 "fsdpc-train GPT-2 124M" $?
    plan_report bench-gpt2 "$D/gpt2.h5" 16 1024
fi
peer=$kit/share/torch_gpt2_bench.py
[ -f "$peer" ] || peer=$here/../peers/torch_gpt2_bench.py
if [ -z "$torch_v" ]; then
    say "SKIP  PyTorch GPT-2 124M: no torch in $PYTHON"
else
    for mode in eager compile; do
        if [ $mode = eager ]; then cap=60 min=30; else cap=150 min=60; fi
        step "torch-$mode" $cap $min "$PYTHON" "$peer" --mode $mode --batch 16 --seq 1024 \
            --steps 10 --warmup 3 --peak-flops "$PEAK_FLOPS"
        rc=$?
        if [ $rc -eq 0 ]; then
            say "PASS  $(grep "^torch $mode:" "$L/torch-$mode.log")"
        elif [ $rc -ne 200 ]; then
            fail "PyTorch GPT-2 124M $mode (exit $rc): $(tail_msg "$L/torch-$mode.log")"
        fi
    done
fi

# -- d2. offload ------------------------------------------------------------------
say "== d2. --offload optim and params,optim on the GPU: equal to no offload; GPT-2 124M step time"
# offload_run NAME OFFLOAD ARGS...: gpt2-tiny on cuda, f32, into $L/NAME.{log,jsonl}
offload_run() {
    o_name=$1 o_off=$2
    shift 2
    step "$o_name" 60 10 "$bin/fsdpc-train" --model "$D/gpt2-tiny.h5" --data "$D/train.bin" \
        --device cuda --batch-size 4 --seq-len 64 --lr 1e-3 --seed 1 --peak-flops 1e12 \
        --clip 0.5 --offload "$o_off" --metrics "$L/$o_name.jsonl" "$@"
}
if [ "$cuda" != yes ]; then
    say "SKIP  offload on the GPU: $cuda"
else
    # 10 steps saved at the end (the offloaded pieces go through the save), then
    # 2 more resumed with the other setting: steps 11 and 12 equal as well
    for o in none optim params,optim; do
        offload_run "offload-$o" "$o" --steps 10 --ckpt-dir "$W/ck-offload-$o"
        rc=$?
        [ $rc -eq 200 ] && continue
        if [ $rc -ne 0 ]; then
            fail "offload $o on cuda (exit $rc): $(tail_msg "$L/offload-$o.log")"
            continue
        fi
        [ $o = none ] && continue
        if res=$(compare "$L/offload-none.jsonl" "$L/offload-$o.jsonl" 1e-6 1e-6); then
            say "PASS  --offload $o = no offload on cuda, gpt2-tiny f32, clip 0.5: $res (tolerance 1e-6)"
        else
            fail "--offload $o = no offload on cuda: $res (tolerance 1e-6)"
        fi
        back=none
        [ $o = optim ] && back=params,optim
        offload_run "offload-$o-resumed" "$back" --steps 12 --resume "$W/ck-offload-$o/step_10"
        rc=$?
        [ $rc -eq 200 ] && continue
        offload_run "offload-none-resumed-$o" none --steps 12 --resume "$W/ck-offload-none/step_10"
        rc2=$?
        if [ $rc -ne 0 ] || [ $rc2 -ne 0 ]; then
            fail "resume of an offload $o checkpoint with --offload $back (exit $rc/$rc2): $(tail_msg "$L/offload-$o-resumed.log")"
        elif res=$(compare "$L/offload-none-resumed-$o.jsonl" "$L/offload-$o-resumed.jsonl" \
            1e-6 1e-6 2); then
            say "PASS  an offload $o checkpoint saved on cuda resumes with --offload $back as one without offload: $res"
        else
            fail "an offload $o checkpoint resumed with --offload $back: $res (tolerance 1e-6)"
        fi
    done
    if [ -f "$D/gpt2.h5" ] && [ "$(grep -c '"loss"' "$L/bench-gpt2.jsonl" 2>/dev/null)" -ge 3 ]; then
        step bench-gpt2-offload 120 30 "$bin/fsdpc-train" --model "$D/gpt2.h5" --data "$D/train.bin" \
            --device cuda --param-dtype bf16 --activation-dtype bf16 --batch-size 16 --seq-len 1024 \
            --steps 8 --lr 6e-4 --peak-flops "$PEAK_FLOPS" --offload optim \
            --metrics "$L/bench-gpt2-offload.jsonl"
        rc=$?
        bench_report bench-gpt2-offload "fsdpc-train GPT-2 124M --offload optim" $rc
        if [ $rc -eq 0 ]; then
            ratio=$(awk -v a="$(median "$L/bench-gpt2-offload.jsonl" ms)" \
                -v b="$(median "$L/bench-gpt2.jsonl" ms)" 'BEGIN { printf "%.2f", b > 0 ? a / b : 0 }')
            if awk -v r="$ratio" 'BEGIN { exit !(r > 0 && r <= 1.3) }'; then
                say "PASS  GPT-2 124M step time with --offload optim / without: ${ratio}x (target <= 1.3x)"
            else
                fail "GPT-2 124M step time with --offload optim / without: ${ratio}x (target <= 1.3x)"
            fi
        fi
    else
        say "SKIP  GPT-2 124M with --offload optim: no run without it to compare with (step d)"
    fi
fi

# -- e. the nccl backend -----------------------------------------------------------
say "== e. the nccl backend: its test program, a one-rank allreduce sweep"
if [ ! -x "$kit/tests/test_nccl" ]; then
    say "SKIP  test_nccl: not in this kit"
else
    step test_nccl 60 20 "$kit/tests/test_nccl"
    rc=$?
    if [ $rc -ne 200 ]; then
        counts=$(awk '/^ok /{ok++} /^not ok /{bad++} /# SKIP/{skip++}
            END{printf "%d ok (%d skipped), %d not ok", ok, skip, bad}' "$L/test_nccl.log")
        if grep -q '^# 0 CUDA device(s) visible' "$L/test_nccl.log"; then
            fail "test_nccl: $counts, but it saw no CUDA device although $ngpu GPU(s) are listed"
        elif [ $rc -eq 0 ]; then
            say "PASS  test_nccl: $counts (${dt} s)"
        else
            fail "test_nccl: $counts (exit $rc)"
        fi
        grep '^not ok' "$L/test_nccl.log" | head -n 10 | sed 's/^/      /' | tee -a "$summary"
    fi
fi

if [ "$(info nccl)" != yes ]; then
    say "SKIP  fsdpc-bench --backend nccl: this kit's build has no nccl backend"
else
    step bench-nccl 40 15 "$bin/fsdpc-bench" --backend nccl --op allreduce --min 1M --max 256M
    rc=$?
    # rows: size count type redop root, then time algbw busbw #wrong out of
    # place and in place
    res=$(awk '$1 ~ /^[0-9]+$/ { n++; wrong += $9 + $13; last = $1 " B: " $6 " us out of place, " $10 " us in place" }
        END { printf "%d sizes, %d wrong, %s", n, wrong, last; exit (n == 0 || wrong > 0) }' "$L/bench-nccl.log")
    wrong=$?
    if [ $rc -eq 0 ] && [ $wrong -eq 0 ]; then
        say "PASS  fsdpc-bench --backend nccl, 1 rank, allreduce 1M-256M: $res (${dt} s)"
    elif [ $rc -eq 0 ]; then
        fail "fsdpc-bench --backend nccl: $res"
    elif [ $rc -ne 200 ]; then
        fail "fsdpc-bench --backend nccl (exit $rc): $(tail_msg "$L/bench-nccl.log")"
    fi
fi

# -- f. Llama 1B -------------------------------------------------------------------
say "== f. Llama 1B (Llama 3.2 1B's shape), bf16, batch 4 x 2048"
if [ "$cuda" != yes ]; then
    say "SKIP  fsdpc-train Llama 1B: $cuda"
elif [ "$(left)" -lt 120 ]; then
    say "SKIP  fsdpc-train Llama 1B: out of time ($(left) s left)"
elif check init-llama-1b 60 30 "$bin/fsdpc-ckpt" init --preset llama-1b --dtype bf16 --seed 1 \
    -o "$D/llama-1b.h5"; then
    step bench-llama-1b 120 40 "$bin/fsdpc-train" --model "$D/llama-1b.h5" --data "$D/train.bin" \
        --device cuda --param-dtype bf16 --activation-dtype bf16 --batch-size 4 --seq-len 2048 \
        --steps 6 --lr 3e-4 --peak-flops "$PEAK_FLOPS" --metrics "$L/bench-llama-1b.jsonl"
    bench_report bench-llama-1b "fsdpc-train Llama 1B" $?
    plan_report bench-llama-1b "$D/llama-1b.h5" 4 2048
fi

if [ $failed -eq 0 ]; then
    say "all GPU checks that ran passed ($(($(date +%s) - t_start)) s)"
else
    say "some GPU checks failed ($(($(date +%s) - t_start)) s): see logs.tar.gz"
fi
exit $failed
