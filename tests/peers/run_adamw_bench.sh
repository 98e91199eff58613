#!/bin/bash
# run_adamw_bench.sh - fsdpc's CPU AdamW (tests/bench/bench_adamw) against
# torch.optim.AdamW (tests/peers/torch_adamw_bench.py) over flat f32 shards,
# in one run, interleaved: ROUNDS rounds, each round running, for every
# thread count, bench_adamw then torch (torch first in even rounds), same
# sizes, same threads, same hyper-parameters. A program's figure in a round
# is its median step time over ITERS timed steps after WARMUP; the table
# gives the median over rounds of elements/s and of the per-round ratio
# fsdpc/torch, beside the memory-bandwidth bound bench_adamw measured in
# the same rounds (AdamW's 28-byte-an-element traffic at the memory's speed,
# and STREAM's triad). For doc/performance.md, "CPU AdamW (offload)".
#
#   BUILD=build tests/peers/run_adamw_bench.sh
#
# Settings: BUILD [build] (a configured build directory: bench_adamw is made
# there on request), SIZES [1M,16M,64M] (elements), THREADS ["1 2"],
# ROUNDS [5], ITERS [10], WARMUP [3], IMPLS [foreach,single,fused] (torch's;
# fused is reported as absent where this torch has no CPU kernel for it),
# PYTHON [/usr/bin/python3, Debian's, with python3-torch].
set -eu
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${BUILD:-build}" && pwd)
sizes=${SIZES:-1M,16M,64M}
threads_list=${THREADS:-1 2}
rounds=${ROUNDS:-5}
iters=${ITERS:-10}
warmup=${WARMUP:-3}
impls=${IMPLS:-foreach,single,fused}
python=${PYTHON:-/usr/bin/python3}
w=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-adamw.XXXXXX")
# torch and OpenBLAS take their threads from here too: only set_num_threads counts
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

make -s -C "$build" tests/bench/bench_adamw > "$w/make.log" 2>&1 || {
    cat "$w/make.log" >&2
    echo "run_adamw_bench: could not build tests/bench/bench_adamw in $build" >&2
    exit 1
}
"$python" -c 'import torch' 2> /dev/null || {
    echo "run_adamw_bench: $python cannot import torch (apt-get install python3-torch, or set PYTHON)" >&2
    exit 77
}
lscpu | sed -n 's/^Model name: *//p; s/^CPU(s): *//p' | paste -sd ' ' | sed 's/^/# cpu: /'
echo "# sizes $sizes, threads $threads_list, $rounds rounds x ($warmup warm-up + $iters timed steps), medians"

ours() {
    # shellcheck disable=SC2046
    "$build/tests/bench/bench_adamw" --threads "$1" --iters "$iters" --warmup "$warmup" \
        $(echo "$sizes" | tr ',' ' ') | sed '/^#/d; s/^/fsdpc /; s/$/ '"$2"'/'
}
theirs() {
    # shellcheck disable=SC2046
    "$python" "$srcdir/tests/peers/torch_adamw_bench.py" --threads "$1" --iters "$iters" \
        --warmup "$warmup" --impl "$impls" $(echo "$sizes" | tr ',' ' ') | sed '/^#/!s/$/ '"$2"'/'
}
for r in $(seq 1 "$rounds"); do
    for t in $threads_list; do
        if [ $((r % 2)) -eq 1 ]; then
            ours "$t" "$r" >> "$w/results"
            theirs "$t" "$r" >> "$w/results"
        else
            theirs "$t" "$r" >> "$w/results"
            ours "$t" "$r" >> "$w/results"
        fi
    done
    echo "# round $r of $rounds done" >&2
done
grep '^# torch' "$w/results" | sed 's/, [0-9]* thread(s)//' | sort -u || true

"$python" - "$w/results" <<'PY'
import collections, statistics, sys
# fsdpc lines: fsdpc n threads ms Melem/s GB/s patternGB/s boundM/s ofbound triadGB/s wrong round
# torch lines: torch impl n threads ms Melem/s round
ours, theirs, impls = {}, collections.defaultdict(dict), []
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "fsdpc":
        n, t, r = int(f[1]), int(f[2]), int(f[11])
        ours.setdefault((n, t), {})[r] = dict(ms=float(f[3]), me=float(f[4]), gbs=float(f[5]),
                                             pat=float(f[6]), bound=float(f[7]),
                                             triad=float(f[9]), wrong=int(f[10]))
    elif f[0] == "torch":
        impl, n, t, r = f[1], int(f[2]), int(f[3]), int(f[6])
        theirs[(impl, n, t)][r] = float(f[5])
        if impl not in impls:
            impls.append(impl)
med = statistics.median
head = "| elements | threads | fsdpc Melem/s | GB/s (28 B/elem) | bound Melem/s | of bound | triad GB/s |"
sep = "|---:|---:|---:|---:|---:|---:|---:|"
for impl in impls:
    head += f" torch {impl} Melem/s | fsdpc/{impl} | per-round fsdpc/{impl} |"
    sep += "---:|---:|---|"
print(head)
print(sep)
worst = {}
for (n, t), runs in sorted(ours.items()):
    rs = sorted(runs)
    row = (f"| {n} | {t} | {med(runs[r]['me'] for r in rs):.1f} | "
           f"{med(runs[r]['gbs'] for r in rs):.2f} | {med(runs[r]['bound'] for r in rs):.1f} | "
           f"{med(runs[r]['me'] / runs[r]['bound'] for r in rs):.2f} | "
           f"{med(runs[r]['triad'] for r in rs):.2f} |")
    if any(runs[r]["wrong"] for r in rs):
        row += " #wrong!"
    for impl in impls:
        tr = theirs.get((impl, n, t), {})
        common = [r for r in rs if r in tr]
        if not common:
            row += " - | - | - |"
            continue
        ratios = [runs[r]["me"] / tr[r] for r in common]
        worst[impl] = min(worst.get(impl, 1e30), med(ratios))
        row += (f" {med(tr[r] for r in common):.1f} | {med(ratios):.2f} | "
                f"{' '.join(f'{x:.2f}' for x in ratios)} |")
    print(row)
for impl, x in worst.items():
    print(f"# smallest median ratio fsdpc/torch {impl}: {x:.2f}")
PY
echo "# raw results: $w/results"
