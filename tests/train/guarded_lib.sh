# guarded_lib.sh - sourced by test_guarded.sh and test_offload.sh (after
# tests/tap.sh, with GUARDED_TAG set): the programs, a work directory W
# removed at exit, the fixtures (a token file, GPT-2 of 2 and 4 layers,
# llama-tiny, uneven per-rank token files for join) and records().

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-$GUARDED_TAG.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn FSDPC_GUARDED_BYTES=4294967296
MPIEXEC=$(command -v mpiexec.mpich)

sh "$top_srcdir/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
    -o "$W/gpt2.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 4 --heads 2 --width 48 --context 64 --seed 2 \
    -o "$W/gpt2-4.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --preset llama-tiny --seed 3 -o "$W/llama.h5" > /dev/null 2>&1
tap_ok $? "fixtures: a token file, GPT-2 (2 and 4 layers) and llama-tiny"

# uneven per-rank token files for join: 3000 and 1500 tokens
python3 - "$W" <<'PY'
import struct, sys
w = sys.argv[1]
d = open(w + "/train.bin", "rb").read()
for r, n in ((0, 3000), (1, 1500)):
    h = bytearray(d[:1024]); struct.pack_into("<i", h, 8, n)
    open("%s/u%d.bin" % (w, r), "wb").write(bytes(h) + d[1024:1024 + 2 * n])
PY

# the step records' loss, norm and scale, as text: equal strings, equal bits
records() {
    grep '"loss"' "$1" | sed 's/.*"step":\([0-9]*\).*"loss":\([^,]*\).*"grad_norm":\([^,]*\).*/\1 \2 \3/'
}
