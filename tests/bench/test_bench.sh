#!/bin/sh
# test_bench.sh - smoke test of fsdpc-bench: every collective from 4 B to
# 64 KiB on 2 ranks over the mpi and tcp backends (checked results, table
# rows, CSV rows), a non-power-of-two group, one dimension of a 2-D mesh, and
# bad flags failing with one clear line.
. "$top_srcdir/tests/tap.sh"

BENCH="$top_builddir/fsdpc-bench"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# rows: data lines of the table (they start with the size, not '#')
rows() { grep -c '^ *[0-9]' "$1"; }
# wrong_cells: #wrong cells (fields 9 and 13) that are neither 0 nor '-'
wrong_cells() { awk '/^ *[0-9]/ { if ($9 != "0" && $9 != "-") n++; if ($13 != "0") n++ } END { print n + 0 }' "$1"; }

for be in mpi tcp; do
    out="$tmp/$be.out"
    timeout 60 $MPIEXEC -n 2 "$BENCH" --backend $be --op all --min 4 --max 64K \
        --timeout 20 --csv "$tmp/$be.csv" >"$out" 2>&1
    rc=$?
    tap_ok $rc "$be: 2 ranks, all collectives, 4 B..64 KiB: exit 0"
    [ $rc -eq 0 ] || tap_diag "$(tail -n 20 "$out")"
    # allreduce and broadcast 4..64K: 15 sizes each; allgather and
    # reduce_scatter skip 4 B (less than one f32 per rank): 14 each
    n=$(rows "$out")
    [ "$n" -eq 58 ]
    tap_ok $? "$be: 58 table rows (got $n)"
    n=$(wrong_cells "$out")
    [ "$n" -eq 0 ]
    tap_ok $? "$be: #wrong is 0 in every row ($n bad cells)"
    n=$(grep -c 'Out of bounds values : 0 OK' "$out")
    [ "$n" -eq 4 ]
    tap_ok $? "$be: 4 collectives report 0 out-of-bounds values (got $n)"
    grep -q "^# mesh dp=2.*backend $be" "$out"
    tap_ok $? "$be: header names the mesh and backend"
    # CSV: header + 2 placements x (15 + 14 + 14) + 15 in-place broadcasts
    n=$(wc -l <"$tmp/$be.csv" 2>/dev/null || echo 0)
    [ "$n" -eq 102 ]
    tap_ok $? "$be: CSV has 101 rows and a header (got $n lines)"
done

out="$tmp/three.out"
timeout 60 $MPIEXEC -n 3 "$BENCH" --backend tcp --op allgather,reduce_scatter --dtype bf16 \
    --redop max --min 6 --max 48K --step-factor 4 --iters 5 --warmup 1 --timeout 20 >"$out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(wrong_cells "$out")" -eq 0 ] && [ "$(rows "$out")" -gt 0 ]
tap_ok $? "tcp: 3 ranks, bf16 max, odd sizes: exit 0 and no wrong element (rc $rc)"
[ $rc -eq 0 ] || tap_diag "$(tail -n 20 "$out")"

out="$tmp/mesh.out"
timeout 60 $MPIEXEC -n 4 "$BENCH" --mesh dp=2,tp=2 --dim tp --backend dp=tcp,tp=mpi \
    --op allreduce,broadcast --root 1 --max 4K --iters 3 --warmup 1 --timeout 20 >"$out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(wrong_cells "$out")" -eq 0 ] && grep -q 'group tp\[0\] of 2 ranks, backend mpi' "$out"
tap_ok $? "mesh dp=2,tp=2 --dim tp: measures the tp slice with its backend (rc $rc)"
[ $rc -eq 0 ] || tap_diag "$(tail -n 20 "$out")"

# bad flags: non-zero exit and one line naming the flag, printed once
check_bad() {
    desc=$1
    pattern=$2
    shift 2
    timeout 30 $MPIEXEC -n 2 "$BENCH" "$@" >"$tmp/bad.out" 2>&1
    rc=$?
    n=$(grep -c -- "$pattern" "$tmp/bad.out")
    [ $rc -ne 0 ] && [ "$n" -eq 1 ]
    tap_ok $? "$desc: exit $rc, message printed $n time(s)"
    [ "$n" -eq 1 ] || tap_diag "$(head -n 5 "$tmp/bad.out")"
}
check_bad "unknown --op" "--op 'allfoo': unknown collective" --op allfoo
check_bad "unknown flag" "unknown option --frobnicate" --frobnicate 3
check_bad "bad size" "--max 'lots'" --max lots
check_bad "min above max" "--min 1024 is larger than --max 64" --min 1K --max 64
check_bad "dimension not in the mesh" "--dim 'tp': the mesh dp=2 has no such dimension" \
    --backend mpi --dim tp --max 64

timeout 30 $MPIEXEC -n 1 "$BENCH" --help >"$tmp/help.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q -- '--backend SPEC' "$tmp/help.out"
tap_ok $? "--help prints the usage and exits 0"

tap_done
