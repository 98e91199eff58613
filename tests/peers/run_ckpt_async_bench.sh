#!/bin/sh
# run_ckpt_async_bench.sh - what a checkpoint save costs the training loop,
# saved in the loop (--ckpt-async off) against in the background (on).
#
#   tests/peers/run_ckpt_async_bench.sh BUILD_DIR [WORK_DIR] [REPS] [PRESET]
#
# PRESET (default gpt2, 124M) on 2 ranks (tcp), batch 1 x 64, 12 steps, a
# checkpoint every 4 steps (steps 4 and 8 are measured; step 12's save is
# the last and is left out). The runs alternate off, on, off, on ... so
# that both see the same load on the machine. For each measured save:
#   - stall: the wall time between the end of the step saved and the start
#     of the next, from the metrics file (the step's end is its "time", the
#     next step's start is its own "time" less its "ms"); the steps before
#     a save give the baseline gap (the per-step vote); in the background
#     the commit (index, renames, fsyncs) runs at a later boundary: the
#     largest gap of the 3 after the save is counted with it;
#   - snapshot: with --ckpt-async on, the copy of the rank's pieces into
#     the snapshot, as rank 0 logs it (FSDPC_LOG=train=debug);
#   - the first two steps after the save (during the background write) and
#     the steps before it, to show what the write costs the steps it
#     overlaps.
# Medians over the saves of every repetition are printed as a Markdown table.
# Not part of `make check`: it writes about 2 x 1.5 GiB per save.
set -eu

B=${1:?usage: run_ckpt_async_bench.sh BUILD_DIR [WORK_DIR] [REPS] [PRESET]}
B=$(cd "$B" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
W=${2:-/tmp/fsdpc-ckpt-async-bench}
REPS=${3:-3}
PRESET=${4:-gpt2}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
rm -rf "$W"
mkdir -p "$W"
cd "$W"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

"$B/fsdpc-ckpt" init --preset "$PRESET" --seed 1 -o model.h5 > /dev/null
sh "$SRC/tests/corpus.sh" 200000 > text
"$B/fsdpc-data" tokenize text -o tokens.bin > /dev/null

# gaps FILE: "step gap_s ms" per step: the wall time from the end of the
# step before to the start of this one, and the step's own time
gaps() {
    sed -n 's/^{"step":\([0-9]*\),.*"ms":\([^,]*\),.*"time":\([^,}]*\).*/\1 \2 \3/p' "$1" |
        awk 'NR > 1 { printf "%d %.4f %.1f\n", $1 - 1, $3 - $2 / 1000 - t, $2 } { t = $3 }'
}

: > off_stall.txt; : > on_stall.txt; : > off_commit.txt; : > on_commit.txt; : > off_total.txt
: > on_total.txt; : > on_snap.txt; : > base_gap.txt
: > on_after.txt; : > off_after.txt; : > before.txt
for r in $(seq 1 "$REPS"); do
    for mode in off on; do
        rm -rf ck m.jsonl
        FSDPC_LOG=warn,train=debug OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 2 "$B/fsdpc-train" \
            --model model.h5 --data tokens.bin --batch-size 1 --seq-len 64 --lr 1e-4 \
            --backend tcp --peak-flops 1e11 --steps 12 --ckpt-every 4 --ckpt-dir ck \
            --ckpt-async "$mode" --metrics m.jsonl > "run_$mode.$r.log" 2>&1
        gaps m.jsonl > "gaps_$mode.$r.txt"
        # stall after the saves of steps 4 and 8; the largest of the 3 boundaries after
        # each (in the background: the one where the commit ran); their sum
        awk '$1 == 4 || $1 == 8 { print $2 }' "gaps_$mode.$r.txt" >> "${mode}_stall.txt"
        awk '$1 == 4 || $1 == 8 { s = $1; c = 0 } s > 0 && $1 > s && $1 <= s + 3 && $2 > c { c = $2 }
            s > 0 && $1 == s + 3 { print c }' "gaps_$mode.$r.txt" >> "${mode}_commit.txt"
        awk '$1 == 4 || $1 == 8 { s = $1; a = $2; c = 0 } s > 0 && $1 > s && $1 <= s + 3 && $2 > c { c = $2 }
            s > 0 && $1 == s + 3 { print a + c }' "gaps_$mode.$r.txt" >> "${mode}_total.txt"
        awk '$1 == 2 || $1 == 3 || $1 == 6 || $1 == 7 { print $2 }' "gaps_$mode.$r.txt" \
            >> base_gap.txt
        # the two steps after each save (5, 6, 9, 10), and the steps before (2, 3, 7)
        awk '$1 == 4 || $1 == 5 || $1 == 8 || $1 == 9 { print $3 }' "gaps_$mode.$r.txt" \
            >> "${mode}_after.txt"
        awk '$1 == 1 || $1 == 2 || $1 == 6 { print $3 }' "gaps_$mode.$r.txt" >> before.txt
        if [ "$mode" = on ]; then
            sed -n 's/.*checkpoint step [48]: snapshot of [0-9]* bytes taken in \([0-9.]*\) s.*/\1/p' \
                "run_$mode.$r.log" >> on_snap.txt
        fi
    done
done
bytes=$(du -sb ck/step_4 | cut -f1)
echo "| measure ($PRESET, 2 ranks, checkpoint $bytes bytes) | median | samples |"
echo "|---|---|---|"
printf '| loop stall per save, --ckpt-async off | %.3f s | %d |\n' "$(median < off_stall.txt)" "$(wc -l < off_stall.txt)"
printf '| loop stall per save, --ckpt-async on | %.3f s | %d |\n' "$(median < on_stall.txt)" "$(wc -l < on_stall.txt)"
printf '| of which the snapshot copy (rank 0) | %.3f s | %d |\n' "$(median < on_snap.txt)" "$(wc -l < on_snap.txt)"
printf '| largest gap of the 3 step boundaries after a save, off | %.3f s | %d |\n' "$(median < off_commit.txt)" "$(wc -l < off_commit.txt)"
printf '| largest gap of the 3 step boundaries after a save, on (the commit) | %.3f s | %d |\n' "$(median < on_commit.txt)" "$(wc -l < on_commit.txt)"
printf '| stall per save in all (save point + that gap), off | %.3f s | %d |\n' "$(median < off_total.txt)" "$(wc -l < off_total.txt)"
printf '| stall per save in all (save point + that gap), on | %.3f s | %d |\n' "$(median < on_total.txt)" "$(wc -l < on_total.txt)"
printf '| gap between steps without a save (the vote) | %.4f s | %d |\n' "$(median < base_gap.txt)" "$(wc -l < base_gap.txt)"
printf '| step time, no save under way | %.0f ms | %d |\n' "$(median < before.txt)" "$(wc -l < before.txt)"
printf '| step time, the 2 steps after a save, off | %.0f ms | %d |\n' "$(median < off_after.txt)" "$(wc -l < off_after.txt)"
printf '| step time, the 2 steps after a save, on (write under way) | %.0f ms | %d |\n' "$(median < on_after.txt)" "$(wc -l < on_after.txt)"
