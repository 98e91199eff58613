#!/bin/sh
# run_gpu_checks.sh - the checks that need a CUDA GPU, for a person (or a
# lent GPU machine) with one. It builds fsdpc with CUDA and NCCL in a
# scratch build directory (the source tree is left unconfigured), runs the
# nccl backend's tests (test_nccl covers, with two or more GPUs: the
# collectives across ranks, the send-first exchange, cudaStreamPerThread
# refused on every rank, no context on cuda:0 from a second thread, and two
# groups on one stream with a stuck peer aborted by the watchdog), a short
# allreduce sweep with fsdpc-bench, and the small-message latency against
# nccl-tests' all_reduce_perf when nccl-tests is at hand. Every step's
# output is saved under $OUT; the last lines of summary.txt say what passed.
#
# Without a GPU it does nothing and says so (exit 0): the GPU checks skip
# cleanly on every other machine.
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
#   NCCL_TESTS_DIR a checkout (or build) of github.com/NVIDIA/nccl-tests;
#                  built here when its all_reduce_perf is missing (default:
#                  the first of ../nccl-tests next to the source, /opt/nccl-tests)
#   NCCL_TESTS_MAKE_ARGS  extra make arguments for that build (e.g.
#                  NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90)
#   LAT_FACTOR     the small-message check fails when fsdpc-bench's 8-byte
#   LAT_SLACK_US   allreduce takes longer than LAT_FACTOR x all_reduce_perf's
#                  + LAT_SLACK_US (defaults 2 and 10)
#
# Exit status: 0 when every step that ran passed (or there is no GPU), 1
# otherwise.

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
LAT_FACTOR=${LAT_FACTOR:-2}
LAT_SLACK_US=${LAT_SLACK_US:-10}
mkdir -p "$OUT" || { echo "$0: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
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

say "fsdpc GPU checks: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"

# -- the machine -------------------------------------------------------------
ngpu=$(count_gpus)
say "GPUs visible: $ngpu (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>})"
if [ "$ngpu" -eq 0 ]; then
    say "SKIP  all GPU checks: no GPU visible on this machine"
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
    nvidia-smi topo -m >>"$OUT/nvidia-smi.log" 2>&1
fi
[ "$ngpu" -lt 2 ] && say "note: 1 GPU: the checks that need two are skipped (test_nccl says which)"

# -- build -------------------------------------------------------------------
BUILD=${BUILD:-$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-gpu.XXXXXX")}
mkdir -p "$BUILD" || { echo "$0: cannot create $BUILD" >&2; exit 1; }
say "source $src, build $BUILD, logs $OUT"
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
    say "FAIL  no CUDA device visible to the tests although $ngpu GPU(s) are listed"
    nodev=1
    failed=1
fi
run test_nccl_sim ./tests/backends/test_nccl_sim
tap_counts "$OUT/test_nccl_sim.log"

# -- fsdpc-bench with the nccl backend ---------------------------------------
mpiexec=${MPIEXEC:-$(sed -n 's/^MPIEXEC = //p' Makefile)}
mpiexec=${mpiexec:-mpiexec}
nbench=$ngpu
[ "$nbench" -gt 8 ] && nbench=8
if [ $nodev -eq 1 ]; then
    say "SKIP  fsdpc-bench (no CUDA device)"
elif [ -x ./fsdpc-bench ]; then
    # $mpiexec may carry its own arguments (e.g. "srun --mpi=pmi2"): split it
    # shellcheck disable=SC2086
    run bench_allreduce_n1 $mpiexec -n 1 ./fsdpc-bench --backend nccl --op allreduce \
        --min 1M --max 256M
    if [ "$ngpu" -ge 2 ]; then
        for op in allreduce allgather reduce_scatter; do
            # shellcheck disable=SC2086
            run "bench_${op}_n$nbench" $mpiexec -n "$nbench" ./fsdpc-bench --backend nccl \
                --op "$op" --min 1M --max 256M
        done
    fi
else
    say "SKIP  fsdpc-bench (not built)"
fi

# -- small-message latency against nccl-tests --------------------------------
# out-of-place time (us) of the row of `size` bytes: column 6 in both tools
time_at() {
    awk -v s="$2" '$1 !~ /^#/ && $1 == s { print $6; exit }' "$1"
}

# Sets perf to nccl-tests' all_reduce_perf, building a checkout when needed.
find_nccl_tests() {
    perf=
    for d in ${NCCL_TESTS_DIR:-} "$src/../nccl-tests" /opt/nccl-tests; do
        [ -n "$d" ] || continue
        for p in "$d/build/all_reduce_perf" "$d/all_reduce_perf"; do
            if [ -x "$p" ]; then
                perf=$p
                return 0
            fi
        done
        if [ -f "$d/Makefile" ] && [ -d "$d/src" ]; then
            cuda_home=$(sed -n 's/^NVCC = \(.*\)\/bin\/nvcc$/\1/p' Makefile)
            nccl_home=$(sed -n 's/^NCCL_CFLAGS = -I\(.*\)\/include *$/\1/p' Makefile)
            # shellcheck disable=SC2086 # NCCL_TESTS_MAKE_ARGS is a list
            run nccl_tests_build make -C "$d" -j"$jobs" src.build \
                CUDA_HOME="${cuda_home:-/usr/local/cuda}" NCCL_HOME="${nccl_home:-/usr/local/cuda}" \
                ${NCCL_TESTS_MAKE_ARGS:-}
            if [ -x "$d/build/all_reduce_perf" ]; then
                perf=$d/build/all_reduce_perf
                return 0
            fi
        fi
    done
    return 1
}

if [ $nodev -eq 1 ] || [ ! -x ./fsdpc-bench ]; then
    say "SKIP  latency against all_reduce_perf (no device or no fsdpc-bench)"
elif [ "$ngpu" -lt 2 ]; then
    say "SKIP  latency against all_reduce_perf: needs 2 GPUs (a 1-rank allreduce moves nothing)"
elif ! find_nccl_tests; then
    say "SKIP  latency against all_reduce_perf: nccl-tests not found (set NCCL_TESTS_DIR to a" \
        "checkout of github.com/NVIDIA/nccl-tests; it is built here when needed)"
else
    n=2
    # one process per GPU for fsdpc, one process driving both GPUs for
    # nccl-tests (-g): the same NCCL transports inside one machine
    # shellcheck disable=SC2086
    run latency_fsdpc $mpiexec -n "$n" ./fsdpc-bench --backend nccl --op allreduce \
        --sizes 8,1K,64K --iters 500 --warmup 50 --stat median --check 0
    run latency_nccl_tests "$perf" -b 8 -e 65536 -f 128 -g "$n" -w 50 -n 500 -c 0
    say "      allreduce latency, $n GPUs, out of place (us): size fsdpc-bench all_reduce_perf"
    worst=0
    for size in 8 1024 65536; do
        a=$(time_at "$OUT/latency_fsdpc.log" $size)
        b=$(time_at "$OUT/latency_nccl_tests.log" $size)
        say "      $size ${a:-?} ${b:-?}"
        if [ -n "$a" ] && [ -n "$b" ] && [ "$size" -eq 8 ]; then
            worst=$(awk -v a="$a" -v b="$b" -v f="$LAT_FACTOR" -v s="$LAT_SLACK_US" \
                'BEGIN { print (a > f * b + s) ? 1 : 0 }')
        fi
    done
    if [ -z "$(time_at "$OUT/latency_fsdpc.log" 8)" ] || [ -z "$(time_at "$OUT/latency_nccl_tests.log" 8)" ]; then
        say "FAIL  latency: a tool printed no 8-byte row (see the latency_*.log files)"
        failed=1
    elif [ "$worst" -eq 1 ]; then
        say "FAIL  latency: fsdpc-bench's 8-byte allreduce is over $LAT_FACTOR x all_reduce_perf's + $LAT_SLACK_US us"
        failed=1
    else
        say "PASS  latency: fsdpc-bench's 8-byte allreduce within $LAT_FACTOR x all_reduce_perf's + $LAT_SLACK_US us"
    fi
fi

cd "$OUT" || exit 1
if [ $failed -eq 0 ]; then
    say "all GPU checks passed"
    [ $keep -eq 1 ] || rm -rf "$BUILD"
else
    say "some GPU checks failed; build kept in $BUILD"
fi
exit $failed
