#!/bin/sh
# test_records.sh - what a run leaves and says: the run header names the
# compute device; step lines carry an ETA, which counts the time validations
# take (one of 150 batches every 2 steps); a run that keeps neither --out nor
# --ckpt-dir warns that its weights are discarded; a mesh whose shard
# dimension is not the innermost warns; two runs appended to one metrics file
# stay apart (a start record each, a timestamp on every record); fsdpc-plot
# draws a real run's curves into a PNG of the asked size (checked by parsing
# the file, not by trusting the exit status); every program answers
# --version with "NAME fsdpc VERSION", the trainer once under a launcher.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-records.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
# the plot needs Debian's matplotlib, which serves the system interpreter
PY=/usr/bin/python3
[ -x "$PY" ] || PY=${PYTHON3:-python3}

sh "$top_srcdir/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" --val-fraction 0.1 --val-out "$W/val.bin" \
    > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 -o "$W/m.h5" \
        > /dev/null 2>&1
tap_ok $? "fixtures: token files and a model"

base="--model $W/m.h5 --data $W/train.bin --batch-size 4 --seq-len 32 --lr 2e-3 --peak-flops 1e11"

# ---------------------------------------------------------------------------
# two runs into one metrics file; what they print

# shellcheck disable=SC2086
"$TRAIN" $base --steps 40 --warmup 4 --val-data "$W/val.bin" --val-every 10 --val-batches 2 \
    --metrics "$W/m.jsonl" > "$W/a.out" 2> "$W/a.err" &&
    "$TRAIN" $base --steps 30 --lr 5e-4 --metrics "$W/m.jsonl" --out "$W/b.h5" \
        > "$W/b.out" 2> "$W/b.err"
tap_ok $? "two runs append to one metrics file"

grep -q '^compute: cpu on every rank, host memory, 1 BLAS thread per rank$' "$W/a.out"
tap_ok $? "the run header says where it computes"
[ "$(grep -cE '^step +[0-9]+/40 .* \| eta [0-9]+(s|m[0-9]{2}s|h[0-9]{2}m)$' "$W/a.out")" -eq 39 ] &&
    grep -qE '^step 40/40 .* MiB$' "$W/a.out"
tap_ok $? "step lines end with an ETA (the last one, with nothing left, without)"
# the ETA counts validations: with one every 2 steps costing many steps' time, the
# ETA at step 10 foresees the time the remaining 20 steps then took (at least a
# tenth of it, against the load of other tests; without the validations: 1/30)
# shellcheck disable=SC2086
"$TRAIN" $base --steps 30 --val-data "$W/val.bin" --val-every 2 --val-batches 150 \
    --metrics "$W/eta.jsonl" > "$W/eta.out" 2>&1 &&
    "$PY" - "$W/eta.jsonl" > "$W/eta.txt" 2>&1 <<'PY'
import json, sys
recs = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
eta, took = recs[10]["eta_s"], recs[30]["time"] - recs[10]["time"]
print("eta at step 10 %.3f s, the last 20 steps took %.3f s" % (eta, took))
sys.exit(0 if took > 0 and eta >= 0.1 * took and "eta_s" not in recs[30] else 1)
PY
r=$?
tap_diag "$(cat "$W/eta.txt")"
tap_ok $r "the ETA includes validation time ($(cat "$W/eta.txt"))"
grep -q "WARN train\] neither --out nor --ckpt-dir is set: the trained weights are discarded when the run ends" "$W/a.err" &&
    ! grep -q "discarded" "$W/b.err"
tap_ok $? "a run that keeps no weights warns; one with --out does not"

"$PY" - "$W/m.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
starts = [i for i, r in enumerate(recs) if r.get("event") == "start"]
assert starts == [0, 45], starts  # 40 steps + 4 validations, then the second run
a, b = recs[0], recs[45]
assert a["run_id"] != b["run_id"] and len(a["run_id"]) == 16
assert a["version"] and a["world_size"] == 1 and a["resumed_from"] is None
assert a["global_batch_seqs"] == 4 and a["global_batch_tokens"] == 128 and a["steps"] == 40
assert a["config"]["lr"] == 0.002 and b["config"]["lr"] == 0.0005 and b["config"]["out"].endswith("b.h5")
assert a["start"].endswith("Z") and b["time"] >= a["time"]
times = [r["time"] for r in recs]
assert times == sorted(times), "records in time order"
assert sum("loss" in r for r in recs) == 70 and sum("val_loss" in r for r in recs) == 4
PY
tap_ok $? "each run starts with a start record (run id, version, config, ranks, batch) and every record has a time"

# ---------------------------------------------------------------------------
# the mesh: a shard dimension that is not the innermost

if command -v "$MPIEXEC" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    timeout 120 "$MPIEXEC" -n 4 "$TRAIN" $base --steps 1 --batch-size 1 --mesh dp=2,rdp=2 \
        --backend tcp > "$W/mesh.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] &&
        [ "$(grep -c "mesh dp=2,rdp=2: the shard dimension dp is not the innermost" "$W/mesh.out")" -eq 1 ] &&
        grep -q -- "--mesh rdp=2,dp=2 keeps them within a node" "$W/mesh.out"
    tap_ok $? "--mesh dp=2,rdp=2 warns once that shard groups are not neighbours (rc $rc)"
    # shellcheck disable=SC2086
    timeout 120 "$MPIEXEC" -n 4 "$TRAIN" $base --steps 1 --batch-size 1 --mesh rdp=2,dp=2 \
        --backend tcp > "$W/mesh2.out" 2>&1 && ! grep -q "not the innermost" "$W/mesh2.out"
    tap_ok $? "--mesh rdp=2,dp=2 does not"
else
    tap_skip_dep mpiexec "no MPIEXEC"
    tap_skip_dep mpiexec "no MPIEXEC"
fi

# ---------------------------------------------------------------------------
# fsdpc-plot: a real image from the real runs

# png_size FILE: "WIDTH HEIGHT" of a PNG whose chunks all check out (CRCs,
# IHDR first, IEND last, the image data inflating to exactly its rows)
png_size() {
    "$PY" - "$1" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
pos, chunks, idat = 8, [], b""
while pos < len(data):
    n, = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + body) & 0xffffffff == crc, "bad CRC in %r" % kind
    chunks.append(kind)
    if kind == b"IDAT":
        idat += body
    pos += 12 + n
assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", chunks
w, h, depth, color = struct.unpack(">IIBB", data[16:26])
channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
assert len(zlib.decompress(idat)) == h * (1 + w * channels * depth // 8), "image data size"
print(w, h)
PY
}

if "$PY" -c 'import matplotlib' 2> /dev/null; then
    "$BIN/fsdpc-plot" "$W/m.jsonl" -o "$W/curves.png" > "$W/plot.out" 2>&1 &&
        [ "$(png_size "$W/curves.png")" = "1200 800" ] &&
        grep -q "curves.png: 2 runs, 70 step records" "$W/plot.out"
    tap_ok $? "fsdpc-plot draws both runs of one file into a 1200 x 800 PNG that parses"
    "$BIN/fsdpc-plot" "$W/m.jsonl" "$W/m.jsonl" -o "$W/small.png" --size 6x4 --dpi 50 \
        > /dev/null 2>&1 && [ "$(png_size "$W/small.png")" = "300 200" ]
    tap_ok $? "fsdpc-plot: several files overlaid, --size 6x4 --dpi 50 gives 300 x 200"
    printf '{"step":1,"loss":3.0}\nnot json\n' > "$W/bad.jsonl"
    "$BIN/fsdpc-plot" "$W/bad.jsonl" -o "$W/bad.png" > /dev/null 2> "$W/bad.err"
    rc=$?
    [ $rc -eq 1 ] && [ "$(grep -c . "$W/bad.err")" -eq 1 ] &&
        grep -q "^fsdpc-plot: $W/bad.jsonl:2: not a JSON record" "$W/bad.err" && [ ! -e "$W/bad.png" ]
    tap_ok $? "fsdpc-plot: a bad line is one error naming file and line (rc $rc)"
else
    for i in 1 2 3; do tap_skip_dep python3-matplotlib "fsdpc-plot draws with matplotlib"; done
fi

# ---------------------------------------------------------------------------
# --version

version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$top_builddir/config.h")
ok=0
for p in fsdpc-train fsdpc-ckpt fsdpc-sample fsdpc-data fsdpc-bench fsdpc-flight fsdpc-plot; do
    out=$("$BIN/$p" --version 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || [ "$out" != "$p fsdpc $version" ]; then
        tap_diag "$p --version: rc $rc: $out"
        ok=1
    fi
done
[ -n "$version" ] && [ $ok -eq 0 ]
tap_ok $? "every program prints 'NAME fsdpc $version' for --version and exits 0"

# under a launcher the trainer's --version and --help print once, not once per rank
if command -v "$MPIEXEC" > /dev/null 2>&1; then
    v=$(timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --version 2>&1 | grep -c "^fsdpc-train fsdpc ")
    h=$(timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --help 2>&1 | grep -c -- "--print-memory")
    [ "$v" = 1 ] && [ "$h" = 1 ]
    tap_ok $? "under mpiexec -n 2, --version and --help print once ($v, $h)"
else
    tap_skip_dep "$MPIEXEC" "the launcher check needs MPICH's mpiexec"
fi

tap_done
