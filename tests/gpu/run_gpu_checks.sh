#!/bin/sh
# run_gpu_checks.sh - the checks that need a CUDA GPU, for a person on a GPU
# machine. It builds fsdpc with CUDA and NCCL in a scratch build directory
# (the source tree is left unconfigured), runs the nccl backend's tests, and,
# when fsdpc-bench was built, a short allreduce sweep with the nccl backend.
# Every step's output is saved under $OUT; the last lines of summary.txt say
# what passed.
#
# Usage: tests/gpu/run_gpu_checks.sh [-j JOBS] [-k]
#   -j JOBS   parallel make jobs (default: the number of CPUs)
#   -k        keep the build directory (default: removed when all passed)
# Environment:
#   OUT            where logs go (default ./gpu-logs)
#   BUILD          build directory (default: a new one under ${TMPDIR:-/tmp})
#   CONFIGURE_ARGS extra configure arguments (e.g. --with-nccl=/opt/nccl)
#   STEP_TIMEOUT   seconds each test or benchmark may run (default 600)
#   MPIEXEC        launcher for fsdpc-bench (default: what configure found)
#
# Exit status: 0 when every step that ran passed, 1 otherwise.

set -u

jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
keep=0
while getopts "j:k" opt; do
    case $opt in
    j) jobs=$OPTARG ;;
    k) keep=1 ;;
    *) echo "usage: $0 [-j JOBS] [-k]" >&2; exit 2 ;;
    esac
done

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
OUT=${OUT:-./gpu-logs}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
mkdir -p "$OUT" || { echo "$0: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
BUILD=${BUILD:-$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-gpu.XXXXXX")}
mkdir -p "$BUILD" || { echo "$0: cannot create $BUILD" >&2; exit 1; }
summary="$OUT/summary.txt"
failed=0
: >"$summary"

say() {
    echo "$*" | tee -a "$summary"
}

# run NAME CMD...: runs CMD with a time limit, output to $OUT/NAME.log
run() {
    name=$1
    shift
    t0=$(date +%s)
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
    else
        "$@" >"$OUT/$name.log" 2>&1
    fi
    rc=$?
    dt=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        say "PASS  $name (${dt} s)"
    else
        [ $rc -eq 124 ] && say "      $name: killed after $STEP_TIMEOUT s"
        say "FAIL  $name (exit $rc, ${dt} s): see $OUT/$name.log"
        failed=1
    fi
    return $rc
}

# TAP summary of a test log: counts of ok, not ok and skips.
tap_counts() {
    awk '/^ok /{ok++} /^not ok /{bad++} /# SKIP/{skip++}
         END{printf "      %d ok (%d skipped), %d not ok\n", ok, skip, bad}' "$1" | tee -a "$summary"
    grep '^not ok' "$1" | head -20 | sed 's/^/      /' | tee -a "$summary"
}

say "fsdpc GPU checks: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
say "source $src, build $BUILD, logs $OUT"

# -- the machine -------------------------------------------------------------
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
    nvidia-smi topo -m >>"$OUT/nvidia-smi.log" 2>&1
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    say "GPUs: $ngpu (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>})"
else
    say "nvidia-smi not found: the tests will report what CUDA sees"
fi

# -- build -------------------------------------------------------------------
if [ -f "$src/config.status" ]; then
    say "$src is configured in place; run 'make distclean' there first (builds here are out of tree)"
    exit 1
fi
if [ ! -x "$src/configure" ]; then
    run autogen sh "$src/autogen.sh" || { say "cannot generate configure"; exit 1; }
fi
cd "$BUILD" || exit 1
# shellcheck disable=SC2086 # CONFIGURE_ARGS is a list of arguments
run configure "$src/configure" --with-cuda --with-nccl ${CONFIGURE_ARGS:-} ||
    { say "configure failed (CUDA or NCCL not found?)"; exit 1; }
grep -E 'CUDA:|NCCL:' "$OUT/configure.log" | sed 's/^ */      /' | tee -a "$summary"
# the whole tree must build with CUDA; the tests below still run if only
# something unrelated failed
run build make -j"$jobs"
run build-tests make -j"$jobs" tests/backends/test_nccl tests/backends/test_nccl_sim || exit 1

# -- the nccl backend's tests ------------------------------------------------
NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_DEBUG
run test_nccl ./tests/backends/test_nccl
tap_counts "$OUT/test_nccl.log"
nodev=0
if grep -q '^# 0 CUDA device(s) visible' "$OUT/test_nccl.log"; then
    say "FAIL  no CUDA device visible to the tests: nothing ran on a GPU"
    nodev=1
    failed=1
fi
run test_nccl_sim ./tests/backends/test_nccl_sim
tap_counts "$OUT/test_nccl_sim.log"

# -- fsdpc-bench with the nccl backend ---------------------------------------
if [ $nodev -eq 1 ]; then
    say "SKIP  fsdpc-bench (no CUDA device)"
elif [ -x ./fsdpc-bench ]; then
    mpiexec=${MPIEXEC:-$(sed -n 's/^MPIEXEC = //p' Makefile)}
    mpiexec=${mpiexec:-mpiexec}
    # $mpiexec may carry its own arguments (e.g. "srun --mpi=pmi2"): split it
    # shellcheck disable=SC2086
    run bench_allreduce_n1 $mpiexec -n 1 ./fsdpc-bench --backend nccl --op allreduce \
        --min 1M --max 256M
    if [ "$ngpu" -ge 2 ]; then
        n=$ngpu
        [ "$n" -gt 8 ] && n=8
        for op in allreduce allgather reduce_scatter; do
            # shellcheck disable=SC2086
            run "bench_${op}_n$n" $mpiexec -n "$n" ./fsdpc-bench --backend nccl --op "$op" \
                --min 1M --max 256M
        done
    fi
else
    say "SKIP  fsdpc-bench (not built)"
fi

cd "$OUT" || exit 1
if [ $failed -eq 0 ]; then
    say "all GPU checks passed"
    [ $keep -eq 1 ] || rm -rf "$BUILD"
else
    say "some GPU checks failed; build kept in $BUILD"
fi
exit $failed
