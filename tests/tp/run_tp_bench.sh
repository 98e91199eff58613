#!/bin/sh
# run_tp_bench.sh - tensor parallelism against data parallelism at 4 ranks
# on one machine (doc/performance.md, "Tensor parallelism"): for gpt2 (124M)
# and llama-small, dp=4 vs dp=2,tp=2 vs tp=4 at the same global batch
# (GLOBAL sequences of the model's SEQ tokens per step), each run's
#   - tokens/s: global tokens per step / the median step time of the steps
#     after the first (the `ms` of --metrics);
#   - peak RSS per rank: GNU time's maximum resident set size, the largest
#     of the 4 ranks, and the engine's accounting of the model's saved
#     activations and its workspace (rank 0's info line);
#   - bytes each rank sends per step, as fsdpc-train's counters report them
#     ("comm per rank per step"), against the analytical Megatron/FSDP
#     volumes of tests/tp/tp_volumes.py (which fails a run off by >1%);
# then the saved activations of one rank at one sequence per rank without
# tensor parallelism, and of tp=2 with and without sequence parallelism on
# the same sequence (the 55% target). Writes markdown to OUT.
#
#   BUILDDIR=build tests/tp/run_tp_bench.sh               # ./tp-bench.md
#   STEPS=2 GPT2=0 tests/tp/run_tp_bench.sh               # llama-small only
#
# Settings (environment): BUILDDIR (.), OUT (tp-bench.md), STEPS (3),
# GLOBAL (4), GPT2 (1), GPT2_SEQ (1024), LLAMA_SEQ (256), BACKEND (mpi),
# MPIEXEC (mpiexec.mpich). One BLAS thread per rank; 4 ranks on fewer cores
# oversubscribe them, which the tokens/s then show.
set -u
BUILDDIR=${BUILDDIR:-.}
OUT=${OUT:-tp-bench.md}
STEPS=${STEPS:-3}
GLOBAL=${GLOBAL:-4}
GPT2=${GPT2:-1}
GPT2_SEQ=${GPT2_SEQ:-1024}
LLAMA_SEQ=${LLAMA_SEQ:-256}
BACKEND=${BACKEND:-mpi}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$BUILDDIR" && pwd)
PY=/usr/bin/python3
VOL="$SRC/tests/tp/tp_volumes.py"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tpbench.XXXXXX")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

for tool in /usr/bin/time "$MPIEXEC" "$BIN/fsdpc-train"; do
    command -v "$tool" > /dev/null 2>&1 || { echo "run_tp_bench: $tool not found" >&2; exit 2; }
done

# data: the repository's own sources, byte-level
find "$SRC/src" "$SRC/io" "$SRC/backends" -name '*.[ch]' | sort | xargs cat > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > /dev/null 2>&1 || exit 2

start=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
{
    echo "- machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores, $(uname -sr)"
    echo "- fsdpc $("$BIN/fsdpc-train" --version 2>/dev/null | head -1 | sed 's/.* //'), tree $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "- settings: STEPS=$STEPS GLOBAL=$GLOBAL GPT2_SEQ=$GPT2_SEQ LLAMA_SEQ=$LLAMA_SEQ BACKEND=$BACKEND; 4 ranks x 1 BLAS thread"
} > "$W/head.md"

# run NAME MODEL MESH B T EXTRA...: 4 (or the mesh's) ranks under GNU time, one per rank
run() {
    r_name=$1 r_model=$2 r_mesh=$3 r_b=$4 r_t=$5
    shift 5
    r_n=$(echo "$r_mesh" | tr ',' '\n' | sed 's/.*=//' | awk '{ n = n ? n * $1 : $1 } END { print n }')
    rm -f "$W/$r_name".rss.* "$W/$r_name.jsonl"
    # shellcheck disable=SC2086
    FSDPC_LOG=info timeout 3600 "$MPIEXEC" -n "$r_n" sh -c '/usr/bin/time -f "%M" -o "$0.rss.$PMI_RANK" "$@"' \
        "$W/$r_name" "$BIN/fsdpc-train" --model "$r_model" --data "$W/tok.bin" --lr 1e-4 \
        --warmup 0 --batch-size "$r_b" --seq-len "$r_t" --steps "${R_STEPS:-$STEPS}" --threads 1 \
        --mesh "$r_mesh" --backend "$BACKEND" --peak-flops 1e11 --timeout 600 --log-every 1 \
        --metrics "$W/$r_name.jsonl" "$@" > "$W/$r_name.log" 2>&1
    r_rc=$?
    [ $r_rc -eq 0 ] || { echo "run_tp_bench: $r_name failed ($r_rc): $(tail -3 "$W/$r_name.log")" >&2; }
    return $r_rc
}

# row NAME MODEL MESH B T: the table row of one run
row() {
    ms=$($PY -c '
import json, sys
ms = [r["ms"] for r in map(json.loads, open(sys.argv[1])) if "ms" in r]
ms = sorted(ms[1:] or ms)
print("%.0f" % ms[len(ms) // 2])' "$W/$1.jsonl")
    rss=$(cat "$W/$1".rss.* | sort -n | tail -1)
    act=$(sed -n 's/.*activations [0-9]* (saved \([0-9]*\), workspace \([0-9]*\)).*/\1 \2/p' "$W/$1.log" | head -1)
    vol=$($PY "$VOL" "$2" "$W/$1.log" --mesh "$3" --batch "$4" --seq "$5" --markdown x 2>&1)
    vrc=$?
    echo "$vol" > "$W/$1.vol"
    md=$(echo "$vol" | sed -n 's/^MD|x|//p')
    set -- $act
    echo "$ms $rss $1 $2 $vrc|$md"
}

table() { # MODELNAME MODELFILE SEQ
    m_name=$1 m_file=$2 m_t=$3
    echo
    echo "#### $m_name, $GLOBAL sequences x $m_t tokens per step, 4 ranks"
    echo
    echo "| mesh | batch per rank | tokens/s | step ms (median) | peak RSS per rank | saved activations / workspace (MiB) | sent per rank per step, counted / analytical (MiB) | ratio | within 1% |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    for mesh in dp=4 dp=2,tp=2 tp=4; do
        dp=$(echo "$mesh" | sed -n 's/.*dp=\([0-9]*\).*/\1/p')
        b=$((GLOBAL / ${dp:-1}))
        tag="$(echo "$m_name" | tr -c 'a-z0-9\n' '_')-$(echo "$mesh" | tr ',=' '__')"
        if run "$tag" "$m_file" "$mesh" "$b" "$m_t"; then
            r=$(row "$tag" "$m_file" "$mesh" "$b" "$m_t")
            nums=${r%%|*} md=${r#*|}
            set -- $nums
            tps=$(awk -v ms="$1" -v n="$((GLOBAL * m_t))" 'BEGIN { printf "%.0f", n / (ms / 1000) }')
            cg=$(echo "$md" | cut -d'|' -f1) cw=$(echo "$md" | cut -d'|' -f2)
            ratio=$(echo "$md" | cut -d'|' -f3)
            echo "| $mesh | $b x $m_t | $tps | $1 | $(($2 / 1024)) MiB | $(($3 >> 20)) / $(($4 >> 20)) | $cg / $cw | $ratio | $([ "$5" -eq 0 ] && echo yes || echo NO) |"
        else
            echo "| $mesh | $b x $m_t | failed | | | | | | |"
        fi
    done
    echo
    echo "Counted per category (fsdp: the units' collectives over dp; tp: the tensor-parallel operators; rows: GPT-2's unit 0 by rows over dp):"
    echo
    for mesh in dp=4 dp=2,tp=2 tp=4; do
        tag="$(echo "$m_name" | tr -c 'a-z0-9\n' '_')-$(echo "$mesh" | tr ',=' '__')"
        [ -f "$W/$tag.vol" ] && echo "- $mesh: $(sed -n 's/^MD|x|[^|]*|[^|]*|[^|]*|//p' "$W/$tag.vol")"
    done
}

# act MODELNAME MODELFILE SEQ: saved activations at one sequence per rank
act() {
    a_name=$1 a_file=$2 a_t=$3
    echo
    echo "#### $a_name, saved activations per rank at 1 sequence x $a_t tokens per rank"
    echo
    echo "| mesh | saved activations | of dp | workspace |"
    echo "|---|---:|---:|---:|"
    base=""
    for cfg in "dp=4 on" "tp=2 off" "tp=2 on" "tp=4 on"; do
        set -- $cfg
        tag="act-$(echo "$a_name" | tr -c 'a-z0-9\n' '_')-$1-$2"
        R_STEPS=1
        run "$tag" "$a_file" "$1" 1 "$a_t" --sequence-parallel "$2" || continue
        R_STEPS=
        # shellcheck disable=SC2086
        set -- $(sed -n 's/.*activations [0-9]* (saved \([0-9]*\), workspace \([0-9]*\)).*/\1 \2/p' "$W/$tag.log" | head -1) $cfg
        base=${base:-$1}
        echo "| $3$( [ "$3" != dp=4 ] && echo ", sequence parallel $4") | $(($1 >> 20)) MiB ($1 B) | $(awk -v a="$1" -v b="$base" 'BEGIN { printf "%.1f%%", 100 * a / b }') | $(($2 >> 20)) MiB |"
    done
}

{
    echo "### Run"
    echo
    cat "$W/head.md"
    if [ "$GPT2" -ne 0 ]; then
        "$BIN/fsdpc-ckpt" init --preset gpt2 -o "$W/gpt2.h5" > /dev/null 2>&1
        table gpt2 "$W/gpt2.h5" "$GPT2_SEQ"
        act gpt2 "$W/gpt2.h5" "$GPT2_SEQ"
    fi
    # llama-small's 2 key/value heads do not split 4 ways: 4 here (multi-head)
    "$BIN/fsdpc-ckpt" init --preset llama-small --kv-heads 4 -o "$W/llama-small.h5" \
        > /dev/null 2>&1
    table "llama-small (NKV 4)" "$W/llama-small.h5" "$LLAMA_SEQ"
    act "llama-small (NKV 4)" "$W/llama-small.h5" "$LLAMA_SEQ"
    echo
    echo "- started $start, load $load0; ended $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg); work directory $W"
} > "$OUT"
cat "$OUT"
