#!/bin/sh
# test_safetensors.sh - fsdpc-ckpt export-safetensors / import-safetensors:
# the Hugging Face layout (prefix, Conv1D transposes, tied lm_head omitted,
# 8-byte aligned data), bit-identical round trips for tied and untied models
# and from a checkpoint, bf16 export, the per-tensor checksums in
# __metadata__ (a flipped byte fails the import, a file without them
# imports), and one clear error line for each kind of malformed file.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

"$CKPT" export-safetensors "$W/m.h5" -o "$W/a.st" > /dev/null 2>&1 &&
    "$CKPT" import-safetensors "$W/a.st" -o "$W/b.h5" > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/b.h5" -o "$W/b.st" > /dev/null 2>&1 && cmp -s "$W/a.st" "$W/b.st"
tap_ok $? "tied model: export, import, export gives a byte-identical file"

"$PY" - "$W/a.st" > "$W/layout.out" 2>&1 <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
assert (8 + n) % 8 == 0, "data not 8-byte aligned"
assert "lm_head.weight" not in h, "tied lm_head exported"
t = h["transformer.h.0.attn.c_attn.weight"]
assert t["shape"] == [32, 96] and t["dtype"] == "F32", t
assert h["transformer.wte.weight"]["shape"] == [256, 32]
assert h["__metadata__"]["fsdpc_n_head"] == "2"
spans = sorted(v["data_offsets"] for k, v in h.items() if k != "__metadata__")
assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
assert spans[-1][1] == len(raw) - 8 - n
sums = {k[14:]: v for k, v in h["__metadata__"].items() if k.startswith("fsdpc.xxh3_64.")}
assert sorted(sums) == sorted(k for k in h if k != "__metadata__"), sorted(sums)
assert all(len(v) == 16 and int(v, 16) >= 0 for v in sums.values()), sums
print("layout ok: %d tensors, a checksum each" % (len(h) - 1))
PY
r=$?
tap_diag "$(cat "$W/layout.out")"
tap_ok $r "Hugging Face layout: names, (in, out) Conv1D shapes, no tied lm_head, contiguous offsets, checksum metadata"

if have_h5py; then
    "$PY" - "$W/a.st" "$W/m.h5" "$W/b.h5" > "$W/tr.out" 2>&1 <<'PY'
import json, struct, sys
import h5py, numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
m, b = h5py.File(sys.argv[2], "r"), h5py.File(sys.argv[3], "r")
for k in m["model"]:
    t = h["transformer." + k]
    s, e = t["data_offsets"]
    a = np.frombuffer(raw[8 + n + s:8 + n + e], dtype="<f4").reshape(t["shape"])
    ours = m["model"][k][...]
    conv = k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight"))
    assert np.array_equal(a.T if conv else a, ours), k
    assert np.array_equal(b["model"][k][...], ours), k
print("tensors equal, Conv1D transposed")
PY
    r=$?
    tap_diag "$(cat "$W/tr.out")"
    tap_ok $r "safetensors bytes equal the model's tensors (Conv1D transposed); import is exact"
else
    tap_skip_dep h5py "not importable by /usr/bin/python3"
fi

"$CKPT" init --layers 1 --heads 4 --width 32 --context 16 --untied -o "$W/u.h5" > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/u.h5" -o "$W/u.st" > /dev/null 2>&1 &&
    "$CKPT" import-safetensors "$W/u.st" -o "$W/u2.h5" > "$W/u.out" 2>&1 &&
    grep -q 'NH=4 .* untied' "$W/u.out" &&
    "$CKPT" export-safetensors "$W/u2.h5" -o "$W/u2.st" > /dev/null 2>&1 && cmp -s "$W/u.st" "$W/u2.st"
tap_ok $? "untied model: lm_head exported, imported untied, byte-identical round trip"

train 1 --batch-size 4 --steps 2 --ckpt-dir "$W/ck" &&
    "$CKPT" export-safetensors "$W/ck" -o "$W/ck.st" > /dev/null 2>&1 &&
    "$CKPT" consolidate "$W/ck" -o "$W/ck.h5" > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/ck.h5" -o "$W/ck2.st" > /dev/null 2>&1 &&
    cmp -s "$W/ck.st" "$W/ck2.st"
tap_ok $? "a checkpoint exports the same bytes as its consolidated model"

"$CKPT" export-safetensors "$W/m.h5" --dtype bf16 -o "$W/h.st" > /dev/null 2>&1 &&
    "$CKPT" import-safetensors "$W/h.st" -o "$W/h.h5" --dtype bf16 > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/h.h5" --dtype bf16 -o "$W/h2.st" > /dev/null 2>&1 &&
    cmp -s "$W/h.st" "$W/h2.st" && [ "$(wc -c < "$W/h.st")" -lt "$(wc -c < "$W/a.st")" ]
tap_ok $? "bf16: export, import to a bf16 model file, export: byte-identical"

mkdir "$W/bad" && "$PY" "$top_srcdir/tests/ckpt/make_bad_st.py" "$W/a.st" "$W/bad"
tap_ok $? "malformed variants written"

# bad KIND PATTERN [ARGS]: import fails with one line matching PATTERN, nothing written
bad() {
    kind=$1
    pat=$2
    shift 2
    "$CKPT" import-safetensors "$W/bad/$kind.safetensors" -o "$W/out.h5" "$@" > /dev/null 2> "$W/err"
    rc=$?
    n=$(grep -c . "$W/err")
    [ $rc -ne 0 ] && [ "$n" -eq 1 ] && grep -q -- "$pat" "$W/err" && [ ! -e "$W/out.h5" ]
    r=$?
    tap_diag "$(cat "$W/err")"
    tap_ok $r "$kind: one clear line (rc $rc)"
}
bad short 'too short for a safetensors header'
bad beyond 'not a safetensors file: the header length in its first 8 bytes is beyond the end of the file'
bad cap 'not a safetensors file: the header length in its first 8 bytes is above the 100 MiB cap'
bad notjson "header does not start with '{'"
bad truncjson 'header JSON: '
bad overlap '(overlap)'
bad uncovered 'tensors cover [0-9]* data bytes but the file holds [0-9]*'
bad sizemismatch 'hold [0-9]* bytes but its dtype and shape need [0-9]*'
bad dtype "has dtype 'F8_E4M3'"
bad dup 'appears twice'
bad negative 'expected a non-negative integer'
bad unknown 'tensor transformer.h.0.mlp.c_fc.weight is missing'
bad notransp "c_attn.weight' has 2 dims (96, 32) but the model needs (32, 96) (Conv1D layout"
bad noheads 'n_head is not in the file: pass --heads N'
bad badeps "metadata fsdpc_ln_eps '1e-5x' is not a number in (0, 1); pass --ln-eps X"
bad flipped "flipped.safetensors: tensor 'transformer.h.0.attn.c_attn.weight' checksum mismatch (stored 0x[0-9a-f]\{16\}, computed 0x[0-9a-f]\{16\}): the file is damaged"
bad badsum "metadata 'fsdpc.xxh3_64.transformer.wte.weight' is '12345', not 16 hex digits"

"$CKPT" import-safetensors "$W/bad/nosum.safetensors" -o "$W/nosum.h5" > /dev/null 2>&1 &&
    "$CKPT" export-safetensors "$W/nosum.h5" -o "$W/nosum.st" > /dev/null 2>&1 &&
    cmp -s "$W/a.st" "$W/nosum.st"
tap_ok $? "a file without checksums (another tool's) imports unchecked, to the same tensors"

"$CKPT" import-safetensors "$W/bad/noheads.safetensors" --heads 2 -o "$W/nh.h5" > /dev/null 2>&1 &&
    "$CKPT" inspect "$W/nh.h5" > /dev/null 2>&1
tap_ok $? "--heads supplies n_head for a file without metadata"

tap_done
