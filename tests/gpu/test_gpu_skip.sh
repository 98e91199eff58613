#!/bin/sh
# test_gpu_skip.sh - the GPU kit's scripts parse, and the GPU checks skip
# cleanly where no GPU is visible: run_gpu_checks.sh with every GPU hidden
# (CUDA_VISIBLE_DEVICES empty) must exit 0 within seconds, say SKIP in its
# summary, and neither look for the kit (it is given one that does not
# exist) nor unpack anything. Runs the same on a GPU machine, whose GPUs
# the variable hides.
. "$top_srcdir/tests/tap.sh"

W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-gpu-skip.XXXXXX")
trap 'rm -rf "$W"' EXIT

for s in kit.sh run_gpu_checks.sh; do
    sh -n "$top_srcdir/tests/gpu/$s" 2>"$W/parse"
    rc=$?
    [ $rc -ne 0 ] && tap_diag "$(head -n 5 "$W/parse")"
    tap_ok $rc "$s parses (sh -n)"
done

mkdir -p "$W/tmp"
t0=$(date +%s)
CUDA_VISIBLE_DEVICES='' OUT="$W/logs" TMPDIR="$W/tmp" \
    timeout 60 sh "$top_srcdir/tests/gpu/run_gpu_checks.sh" "$W/no-such-kit.tar.gz" >"$W/out" 2>&1
rc=$?
dt=$(($(date +%s) - t0))
[ $rc -ne 0 ] && tap_diag "$(tail -n 5 "$W/out")"
tap_ok $rc "run_gpu_checks.sh without a visible GPU exits 0"
[ $dt -le 10 ]
tap_ok $? "and does so quickly (${dt} s)"
grep -q '^SKIP  all GPU checks: no GPU visible' "$W/logs/summary.txt" 2>/dev/null
tap_ok $? "its summary says the GPU checks were skipped and why"
[ -z "$(ls -A "$W/tmp")" ] && ! grep -q 'kit' "$W/logs/summary.txt"
tap_ok $? "it looked for no kit and unpacked nothing"
[ "$(ls -A "$W/logs")" = summary.txt ]
tap_ok $? "it left only summary.txt in OUT"
tap_done
