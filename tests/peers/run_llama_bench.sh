#!/bin/bash
# run_llama_bench.sh - fsdpc-train on llama-small against Hugging Face
# transformers' LlamaForCausalLM trained by an eager PyTorch loop
# (hf_llama_train_bench.py), in one run, on one machine: rounds alternate
# fsdpc 1 rank x 1 thread, fsdpc 2 ranks x 1 thread (dp=2, tcp, the same
# batch per rank), transformers at 1 thread and transformers in DDP over
# Gloo at 2 ranks x 1 thread; the medians of each run's median step time
# after warm-up, tokens/s and peak RSS (GNU time; the DDP ranks' own).
#
#   BUILDDIR=build HF_PYTHON=build/hf-venv/bin/python tests/peers/run_llama_bench.sh
#
# Settings: BUILDDIR [.], HF_PYTHON [$BUILDDIR/hf-venv/bin/python], ROUNDS [3],
# STEPS [20], WARMUP [5], BATCH [4], SEQ [256], WORKDIR [a fresh temp dir].
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
b=${BUILDDIR:-.}
py=${HF_PYTHON:-$b/hf-venv/bin/python}
rounds=${ROUNDS:-3} steps=${STEPS:-20} warm=${WARMUP:-5} B=${BATCH:-4} T=${SEQ:-256}
w=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-llamabench.XXXXXX")}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
[ -x "$py" ] || { echo "no transformers venv at $py (see tests/model/test_llama_hf.sh)" >&2; exit 1; }
sh "$src/tests/corpus.sh" 2000000 > "$w/text"
"$b/fsdpc-data" tokenize "$w/text" -o "$w/tok.bin" > /dev/null || exit 1
"$b/fsdpc-ckpt" init --preset llama-small -o "$w/m.h5" > /dev/null || exit 1

# median of the step times (ms) after the warm-up, from fsdpc's metrics file
fsdpc_median() {
    /usr/bin/python3 -c "
import json, statistics, sys
ms = [r['ms'] for r in map(json.loads, open(sys.argv[1])) if 'step' in r and 'ms' in r]
print('%.1f' % statistics.median(ms[int(sys.argv[2]):]))" "$1" "$warm"
}
rss() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1" | sort -n | tail -1; }

for r in $(seq "$rounds"); do
    rm -f "$w/f1.jsonl" "$w/f2.jsonl"
    /usr/bin/time -v "$b/fsdpc-train" --model "$w/m.h5" --data "$w/tok.bin" --batch-size "$B" \
        --seq-len "$T" --steps "$steps" --lr 3e-4 --threads 1 --metrics "$w/f1.jsonl" \
        > "$w/f1.log" 2> "$w/f1.time"
    /usr/bin/time -v mpiexec.mpich -n 2 "$b/fsdpc-train" --model "$w/m.h5" --data "$w/tok.bin" \
        --batch-size "$B" --seq-len "$T" --steps "$steps" --lr 3e-4 --threads 1 --mesh dp=2 \
        --backend tcp --metrics "$w/f2.jsonl" > "$w/f2.log" 2> "$w/f2.time"
    /usr/bin/time -v "$py" "$src/tests/peers/hf_llama_train_bench.py" --model "$w/m.h5" \
        --data "$w/tok.bin" --batch-size "$B" --seq-len "$T" --steps "$steps" \
        --warmup-steps "$warm" > "$w/hf.log" 2> "$w/hf.time"
    "$py" "$src/tests/peers/hf_llama_train_bench.py" --model "$w/m.h5" --data "$w/tok.bin" \
        --batch-size "$B" --seq-len "$T" --steps "$steps" --warmup-steps "$warm" --nproc 2 \
        > "$w/hf2.log" 2> "$w/hf2.err"
    f1=$(fsdpc_median "$w/f1.jsonl") f2=$(fsdpc_median "$w/f2.jsonl")
    res() { sed -n 's/^result //p' "$1" | /usr/bin/python3 -c "import json,sys; print('%.1f' % json.load(sys.stdin)['$2'])"; }
    hf=$(res "$w/hf.log" median_ms) hf2=$(res "$w/hf2.log" median_ms)
    echo "round $r: fsdpc 1x1 $f1 ms (rss $(rss "$w/f1.time") KiB), fsdpc 2x1 $f2 ms" \
        "(rss per rank $(rss "$w/f2.time") KiB), transformers $hf ms" \
        "(rss $(rss "$w/hf.time") KiB), transformers DDP 2x1 $hf2 ms" \
        "(rss per rank $(res "$w/hf2.log" peak_rss_mib) MiB)" | tee -a "$w/rounds"
done
echo "tokens per step: $B x $T per rank; workdir $w"
