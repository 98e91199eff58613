#!/bin/sh
# run_tp_save_bench.sh - tensor-parallel checkpoint saves (doc/performance.md,
# "Tensor-parallel saves: exchange against reduce-scatters"): for each mesh,
# REPS repetitions of two training steps, each followed by a save in the
# loop, alternating FSDPC_CKPT_TP_SAVE=reduce-scatter and exchange (rs, ex,
# rs, ex, ...), and from each run's second save (the first one also makes the exchange's
# group and allocates the re-layout buffer)
#   - the bytes each rank sent for the save and its seconds in the re-layout
#     (inside save_rows, the shard writes between its calls left out; every
#     rank's line at FSDPC_LOG=fsdp=debug), against its shard of the state
#     (parameters and both AdamW moments);
#   - the save time rank 0 logs (from the first rank entering the save to
#     the commit: re-layout, shard writes, fsyncs, index, renames).
# Prints one markdown table row per mesh and method: medians over the
# repetitions, the bytes of the rank that sent most.
#
#   tests/tp/run_tp_save_bench.sh BUILD_DIR [REPS] [PRESET] [MESHES]
#
# PRESET: a fsdpc-ckpt init preset (gpt2); MESHES: "dp=2,tp=2 tp=2".
# Settings (environment): BACKEND (tcp), MPIEXEC (mpiexec.mpich), SEQ (64).
# One BLAS thread per rank.
set -u
BIN=$(cd "${1:?usage: run_tp_save_bench.sh BUILD_DIR [REPS] [PRESET] [MESHES]}" && pwd)
REPS=${2:-3}
PRESET=${3:-gpt2}
MESHES=${4:-dp=2,tp=2 tp=2}
BACKEND=${BACKEND:-tcp}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
SEQ=${SEQ:-64}
PY=/usr/bin/python3
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tpsavebench.XXXXXX")
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

SRC=$(cd "$(dirname "$0")/../.." && pwd)
sh "$SRC/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset "$PRESET" --seed 1 -o "$W/m.h5" > /dev/null 2>&1 || {
    echo "cannot make the token file or the $PRESET model" >&2
    exit 1
}

: > "$W/rows"
for mesh in $MESHES; do
    n=$(echo "$mesh" | tr ',' '\n' | sed 's/.*=//' | awk '{ p *= $1 } BEGIN { p = 1 } END { print p }')
    r=0
    while [ "$r" -lt "$REPS" ]; do
        for m in reduce-scatter exchange; do
            rm -rf "$W/ck"
            FSDPC_CKPT_TP_SAVE=$m FSDPC_LOG=warn,fsdp=debug,train=info FSDPC_LOG_RANKS=all \
                timeout 900 "$MPIEXEC" -n "$n" "$BIN/fsdpc-train" --model "$W/m.h5" \
                --data "$W/tok.bin" --seq-len "$SEQ" --batch-size 1 --steps 2 --lr 1e-4 \
                --ckpt-every 1 --ckpt-keep 1 \
                --mesh "$mesh" --backend "$BACKEND" --ckpt-dir "$W/ck" --ckpt-async off \
                --timeout 300 > "$W/log" 2>&1 || {
                echo "$mesh $m: run failed" >&2
                tail -5 "$W/log" >&2
                exit 1
            }
            "$PY" - "$W/log" "$mesh" "$m" >> "$W/rows" << 'EOF'
import re, sys
log, mesh, mode = sys.argv[1:]
ranks = {}
save = None
for line in open(log):  # the second save's lines come last
    m = re.search(r"checkpoint shard (\d+) of \d+ sent (\d+) bytes in \d+ operations and kept "
                  r"\d+; its state is (\d+) bytes.*; ([0-9.]+) s in the re-layout", line)
    if m:
        ranks[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), float(m.group(4)))
    m = re.search(r"checkpoint step 2 written to .*\(([0-9.]+) GiB in ([0-9.]+) s", line)
    if m:
        save = (float(m.group(1)), float(m.group(2)))
v = list(ranks.values())
print(mesh, mode, max(x[0] for x in v), max(x[1] for x in v), max(x[2] for x in v), save[1],
      save[0])
EOF
        done
        r=$((r + 1))
    done
done

echo "| mesh | method | bytes sent, the largest rank | its state | relayout s (slowest rank) | save s (rank 0, commit included) | checkpoint GiB |"
echo "|---|---|---|---|---|---|---|"
"$PY" - "$W/rows" << 'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    mesh, mode, sent, state, secs, save, gib = line.split()
    rows.setdefault((mesh, mode), []).append((int(sent), int(state), float(secs), float(save), float(gib)))
for (mesh, mode), v in rows.items():
    med = lambda k: statistics.median(x[k] for x in v)
    print("| %s | %s | %d (%.2fx its state) | %d | %.3f | %.2f | %.2f |"
          % (mesh, mode, med(0), med(0) / med(1), med(1), med(2), med(3), med(4)))
print("(medians of %d runs per row; the save times of each run: %s)"
      % (len(v), "; ".join("%s %s: %s" % (k[0], k[1], ", ".join("%.2f" % x[3] for x in rows[k]))
                           for k in rows)))
EOF
