# guarded_lib.sh - sourced by test_guarded.sh and test_offload.sh (after
# tests/tap.sh, with GUARDED_TAG set): the programs, a work directory W
# removed at exit, the fixtures (a token file, GPT-2 of 2 and 4 layers,
# llama-tiny, uneven per-rank token files for join), records() and plan().

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

# the memory plan (--print-memory) part by part against the buffers the
# guarded device holds after the first step (rank 0, the plan's largest;
# under pp the rank the plan names the largest, PP_D the mesh's dp after
# pp, and every pipeline rank's total without dp). The plan's batches are
# the step's K micro-batches (the trainer's arrays); the device holds one
# for each model, and a loss scalar (under pp a model per activation set,
# as many as the plan's line of the rank says). What the trainer reserved
# for the device's arena (ops->reserve, logged) is the plan's total with
# its checkpoint re-layout.
plan() {
    name=$1 n=$2
    shift 2
    if [ "$n" -gt 1 ]; then
        FSDPC_LOG=train=debug,fsdp=info FSDPC_LOG_RANKS=all "$MPIEXEC" -n "$n" "$TRAIN" \
            --device guarded \
            --data "$W/train.bin" --batch-size 4 --seq-len 64 --steps 1 --lr 1e-3 "$@" \
            > "$W/mem.run" 2>&1
    else
        FSDPC_LOG=train=debug,fsdp=info "$TRAIN" --device guarded --data "$W/train.bin" \
            --batch-size 4 --seq-len 64 --steps 1 --lr 1e-3 "$@" > "$W/mem.run" 2>&1
    fi
    "$TRAIN" --print-memory --batch-size 4 --seq-len 64 "$@" > "$W/mem.plan" 2>&1
    PP_D=${PP_D:-1} PP_K=${PP_K:-1} PP_V=${PP_V:-1} python3 - "$W/mem.plan" "$W/mem.run" <<'PY'
import os, re, sys
plan = {}
text = open(sys.argv[1]).read()
D, K, V = int(os.environ["PP_D"]), int(os.environ["PP_K"]), int(os.environ["PP_V"])
for l in text.splitlines():
    m = re.match(r"  (\S.*?)\s{2,}(\d+)\s+[\d.]+ MiB$", l)
    if m:
        plan[m.group(1).split(" (")[0]] = int(m.group(2))
m = re.search(r"the largest: pp rank (\d+), dp rank (\d+)", text)
rank = int(m.group(1)) * D + int(m.group(2)) if m else 0
sets = {int(r): int(n) for r, n in re.findall(r"  pp rank (\d+) .*?, (\d+) activation sets;", text)}
S = sets.get(int(m.group(1)), V) if m else V  # the planned rank's models
bufs = {}
host = 0  # pinned host bytes of --offload, as the engine counts them (the device names none)
reserve = -1  # what the trainer reserved (the device's arena, ops->reserve)
totals = {}
run = open(sys.argv[2]).read().splitlines()
for l in run:
    m = re.search(r"\[fsdpc r%d .*device buffer after the first step: (\d+) bytes '(.*)'" % rank, l)
    if m:
        bufs[m.group(2)] = bufs.get(m.group(2), 0) + int(m.group(1))
    m = re.search(r"\[fsdpc r%d INFO fsdp\] fsdp: .*\| host pinned (\d+) bytes \(offload\)" % rank, l)
    if m:
        host = int(m.group(1))
    m = re.search(r"\[fsdpc r%d .*device reserve: (\d+) bytes of plan and batches" % rank, l)
    if m:
        reserve = int(m.group(1))
    m = re.search(r"\[fsdpc r(\d+) .*device buffers after the first step: \d+, (\d+) bytes in all", l)
    if m:
        totals[int(m.group(1))] = int(m.group(2))
def take(*names):
    return sum(bufs.pop(k) for k in list(bufs) if any(re.fullmatch(n, k) for n in names))
parts = [
    ("shards, gradients, moments",
     plan["parameter shards"] + plan["gradient shards"] + plan["AdamW moments"],
     take("fsdp parameter, gradient and AdamW shards", "fsdp parameter and gradient shards",
          "fsdp gradient shards and parameter send shards")),
    ("host, pinned: offloaded state (engine's count)",
     sum(v for k, v in plan.items() if k.startswith("+ host, pinned:") and "snapshot" not in k),
     host),
    ("slots and communication",
     plan["gathered parameters"] + plan["unsharded gradients"] + plan["communication"],
     take(r"fsdp parameter slot.*", r"fsdp gradient slot.*", "fsdp packing scratch")),
    ("activations", plan["activations saved for the backward"], take(r"\w+ activations")),
    ("workspace", plan["activation gradients and workspace"],
     take(r"\w+ activation gradients", r"llama RoPE (cos|sin)")),
    ("batches (one micro-batch a model)", plan["batches"] // K * S,
     take("batch tokens", "batch targets")),
    ("the loss and norm scalars (not in the plan)", 8 * S + 8,
     take("loss sum", "fsdp gradient norm")),
    ("pipeline boundary buffers", sum(v for k, v in plan.items() if k.startswith("pipeline")),
     take(r"pipeline .*")),
]
for l in text.splitlines():  # pipeline ranks without dp: world rank = pp rank
    m = re.match(r"  pp rank (\d+) .* total (\d+)$", l)
    if m and D == 1:
        r = int(m.group(1))
        parts.append(("pp rank %d: all it holds" % r, int(m.group(2)),
                      totals.get(r, 0) - 8 * sets.get(r, V) - 8 - plan["batches"] // K * sets.get(r, V)))
parts.append(("device reserve: the total, checkpoint re-layout too",
              plan["total, held from the first step"] + plan.get("+ from the first checkpoint on", 0),
              reserve))
bad = [p for p in parts if p[1] != p[2]]
for p in parts:
    print("# %-45s plan %10d  held %10d" % p)
if bufs:
    print("# held but in no part of the plan: %s" % bufs)
sys.exit(1 if bad or bufs or not plan else 0)
PY
    tap_ok $? "the memory plan equals what the device holds after the first step, part by part: $name"
}
