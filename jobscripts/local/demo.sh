#!/bin/sh
# demo.sh - fsdpc end to end in about a minute on a workstation: make a
# byte-level corpus from this source tree, hold out every 20th file as
# validation data (so that it is drawn from across the corpus, not its last
# part), create the built-in tiny GPT-2 (4 layers, 128 wide, 0.84M
# parameters), train it, and print a sample from the trained model. What it
# prints fits on one screen; the trainer's whole output is in WORK/train.log.
#
#   jobscripts/local/demo.sh
#   BIN=build WORK=/tmp/demo STEPS=300 jobscripts/local/demo.sh
#
# Environment (all optional):
#   BIN      directory holding fsdpc-train, fsdpc-sample, fsdpc-data, fsdpc-ckpt
#            (default: found on PATH, else <repo>/build, else <repo>)
#   WORK     where the corpus, token files, models, logs and metrics go (./demo)
#   STEPS    optimizer steps (800: about a minute on 2 cores)
#   RANKS    data-parallel ranks; more than 1 launches with mpiexec.mpich and
#            shards the model over them (2)
#   BATCH    sequences per rank per step (8 / RANKS: a global batch of 8)
#   THREADS  BLAS threads per rank (cores / RANKS)
# Nothing is downloaded: the corpus is the *.c, *.h and *.md files of the
# tree this script sits in, concatenated at run time.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

if [ -z "${BIN:-}" ]; then
    if command -v fsdpc-train > /dev/null 2>&1; then
        BIN=$(dirname "$(command -v fsdpc-train)")
    elif [ -x "$repo/build/fsdpc-train" ]; then
        BIN=$repo/build
    else
        BIN=$repo
    fi
fi
for p in fsdpc-train fsdpc-sample fsdpc-data fsdpc-ckpt; do
    if [ ! -x "$BIN/$p" ]; then
        echo "demo.sh: $BIN/$p not found: build fsdpc first, or set BIN to the build directory" >&2
        exit 1
    fi
done
BIN=$(cd "$BIN" && pwd)
WORK=${WORK:-./demo}
STEPS=${STEPS:-800}
RANKS=${RANKS:-2}
for v in STEPS RANKS; do
    eval "x=\$$v"
    case $x in
    '' | *[!0-9]* | 0) echo "demo.sh: $v=$x is not a positive integer" >&2; exit 1 ;;
    esac
done
BATCH=${BATCH:-$(( 8 / RANKS > 0 ? 8 / RANKS : 1 ))}
cores=$(nproc 2>/dev/null || echo 2)
THREADS=${THREADS:-$(( cores / RANKS > 0 ? cores / RANKS : 1 ))}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# every 20th file (in name order) is held out: validation text from across the tree
find "$repo" \( -name .git -o -name autom4te.cache -o -path "$WORK" -o -path "$BIN" \) -prune -o \
    -type f \( -name '*.c' -o -name '*.h' -o -name '*.md' \) -print | LC_ALL=C sort > "$WORK/files.txt"
: > "$WORK/train.txt"
: > "$WORK/val.txt"
n=0
while IFS= read -r f; do
    n=$((n + 1))
    if [ $((n % 20)) -eq 10 ]; then cat "$f" >> "$WORK/val.txt"; else cat "$f" >> "$WORK/train.txt"; fi
done < "$WORK/files.txt"
if ! { "$BIN/fsdpc-data" tokenize "$WORK/train.txt" -o "$WORK/train.bin" &&
    "$BIN/fsdpc-data" tokenize "$WORK/val.txt" -o "$WORK/val.bin" &&
    "$BIN/fsdpc-ckpt" init --preset tiny --seed 1 -o "$WORK/tiny.h5"; } > "$WORK/data.log" 2>&1; then
    cat "$WORK/data.log" >&2
    exit 1
fi
echo "== data: $n files of $repo (*.c *.h *.md), every 20th held out for validation:" \
    "$(wc -c < "$WORK/train.txt") + $(wc -c < "$WORK/val.txt") bytes; model: the tiny preset"

launch=""
if [ "$RANKS" -gt 1 ]; then
    launch="mpiexec.mpich -n $RANKS"
fi
rm -f "$WORK/metrics.jsonl"
# 8 sequences of 128 bytes per step (BATCH on each of RANKS ranks); the learning rate warms up over 50
# steps (a tenth of a shorter run) and decays along a cosine to a tenth of its peak; a step line
# every fifth of the run and a validation at its middle and end
warmup=$(( STEPS / 10 < 50 ? STEPS / 10 : 50 ))
log_every=$(( STEPS / 5 > 0 ? STEPS / 5 : 1 ))
val_every=$(( STEPS / 2 > 0 ? STEPS / 2 : 1 ))
echo "== training: $STEPS steps, $RANKS rank(s) x $THREADS BLAS thread(s) (all output: $WORK/train.log)"
{
    $launch "$BIN/fsdpc-train" \
        --model "$WORK/tiny.h5" --data "$WORK/train.bin" --val-data "$WORK/val.bin" \
        --steps "$STEPS" --batch-size "$BATCH" --seq-len 128 \
        --lr 2e-3 --warmup "$warmup" --lr-schedule cosine --min-lr 2e-4 --weight-decay 0.1 \
        --clip 1.0 --log-every "$log_every" --val-every "$val_every" --val-batches 20 \
        --threads "$THREADS" --metrics "$WORK/metrics.jsonl" --out "$WORK/trained.h5"
    echo $? > "$WORK/train.rc"
} 2>&1 | tee "$WORK/train.log" | { grep --line-buffered -E '^(step +[0-9]|val +[0-9]|done:)' || true; }
if [ "$(cat "$WORK/train.rc")" != 0 ]; then
    echo "demo.sh: training failed; the end of $WORK/train.log:" >&2
    tail -n 5 "$WORK/train.log" >&2
    exit 1
fi

echo "== sample from $WORK/trained.h5"
FSDPC_LOG=warn "$BIN/fsdpc-sample" --model "$WORK/trained.h5" --prompt "int fsdp_" --tokens 160 \
    --temperature 0.8 --top-k 40 --seed 1 --threads "$THREADS"
# training curves, when matplotlib is there (python3-matplotlib)
curves=""
if [ -x "$BIN/fsdpc-plot" ] && "$BIN/fsdpc-plot" "$WORK/metrics.jsonl" -o "$WORK/curves.png" \
    > /dev/null 2>&1; then
    curves=", curves.png (fsdpc-plot)"
fi
echo "== done: files in $WORK: train.log, metrics.jsonl (a JSON record per logged step)$curves"
