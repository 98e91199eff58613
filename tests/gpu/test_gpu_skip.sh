#!/bin/sh
# test_gpu_skip.sh - the GPU checks skip cleanly where no GPU is visible:
# run_gpu_checks.sh with every GPU hidden (CUDA_VISIBLE_DEVICES empty) must
# exit 0 at once, say SKIP in its summary, and configure nothing. Runs the
# same on a GPU machine, whose GPUs the variable hides.
. "$top_srcdir/tests/tap.sh"

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-gpu-skip.XXXXXX")
trap 'rm -rf "$W"' EXIT

CUDA_VISIBLE_DEVICES='' OUT="$W/logs" BUILD="$W/build" STEP_TIMEOUT=60 \
    sh "$top_srcdir/tests/gpu/run_gpu_checks.sh" -j 1 >"$W/out" 2>&1
rc=$?
[ $rc -ne 0 ] && tap_diag "$(tail -n 5 "$W/out")"
tap_ok $rc "run_gpu_checks.sh without a visible GPU exits 0"
grep -q '^SKIP  all GPU checks: no GPU visible' "$W/logs/summary.txt" 2>/dev/null
tap_ok $? "its summary says the GPU checks were skipped and why"
[ ! -e "$W/build/config.status" ] && [ ! -e "$W/logs/configure.log" ]
tap_ok $? "nothing was configured or built"
tap_done
