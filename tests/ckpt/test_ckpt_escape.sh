#!/bin/sh
# test_ckpt_escape.sh - model files and checkpoints that would make a reader
# take bytes from another file (make_escape.py: external raw storage,
# external and soft links, virtual datasets over a stranger's file, a
# missing file, a shard beyond n_shards, the wrong source dataset, unmapped
# rows) are refused by every reader, fsdpc-ckpt inspect / verify /
# consolidate / convert / export-safetensors and fsdpc-train (--model and
# --resume), with one line naming the file and the dataset, and no byte of
# the planted secrets reaches any output.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

if ! have_h5py; then
    tap_skip_dep h5py "not importable by /usr/bin/python3 (the attack files are made with it)"
    tap_done
    exit 0
fi

train 1 --batch-size 4 --steps 2 --ckpt-dir "$W/ck" --ckpt-every 2 &&
    "$CKPT" reshard "$W/ck/step_2" --world-size 2 -o "$W/s2" > /dev/null 2>&1 &&
    mkdir "$W/x" && "$PY" "$top_srcdir/tests/ckpt/make_escape.py" "$W/m.h5" "$W/s2" "$W/x" \
    > "$W/mk.out" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/mk.out")"
tap_ok $r "fixtures: a 2-shard checkpoint and the escaping variants"

# leaked FILE...: does any FILE hold a byte run of a planted secret (the
# text marker, or 16 bytes of the secret f32 1234.5)?
leaked() {
    "$PY" - "$@" <<'PY'
import os, struct, sys
needles = (b"SECRET-7f3a", struct.pack("<f", 1234.5) * 4)
hit = [p for p in sys.argv[1:] if os.path.isfile(p)
       and any(n in open(p, "rb").read() for n in needles)]
print(" ".join(hit))
sys.exit(0 if hit else 1)
PY
}

# refused NAME PATTERN CMD...: CMD exits non-zero with one line on stderr
# that matches PATTERN, writes no output file, and leaks nothing
refused() {
    name=$1
    pat=$2
    shift 2
    rm -rf "$W/o" && mkdir "$W/o"
    "$@" > "$W/o/stdout" 2> "$W/o/stderr"
    rc=$?
    n=$(grep -c . "$W/o/stderr")
    bad=""
    [ $rc -ne 0 ] || bad="exit 0"
    [ "$n" -eq 1 ] || bad="$bad; $n lines on stderr"
    grep -q -- "$pat" "$W/o/stderr" || bad="$bad; no match for '$pat'"
    outs=$(find "$W/o" -type f ! -name stdout ! -name stderr)
    [ -z "$outs" ] || bad="$bad; wrote $outs"
    # shellcheck disable=SC2046
    l=$(leaked $(find "$W/o" -type f)) && bad="$bad; secret bytes in $l"
    if [ -n "$bad" ]; then
        tap_diag "$name: $* -> $bad: $(head -c 600 "$W/o/stderr")"
        return 1
    fi
    return 0
}

# model NAME FILE PATTERN: every model-file reader refuses FILE
model() {
    ok=0
    refused "$1" "$3" "$CKPT" inspect "$2" || ok=1
    refused "$1" "$3" "$CKPT" export-safetensors "$2" -o "$W/o/out.st" || ok=1
    refused "$1" "$3" "$CKPT" convert "$2" --dtype bf16 -o "$W/o/out.h5" || ok=1
    # shellcheck disable=SC2086
    refused "$1" "$3" "$TRAIN" $COMMON --model "$2" --batch-size 4 --steps 3 \
        --out "$W/o/trained.h5" --metrics "$W/o/metrics.jsonl" || ok=1
    tap_diag "$(cat "$W/o/stderr")"
    tap_ok $ok "$1: inspect, export-safetensors, convert and fsdpc-train --model refuse it"
}

# ckpt NAME DIR PATTERN: every checkpoint reader refuses DIR
ckpt() {
    ok=0
    refused "$1" "$3" "$CKPT" inspect "$2" || ok=1
    refused "$1" "$3" "$CKPT" verify --scan-nan "$2" || ok=1
    refused "$1" "$3" "$CKPT" consolidate "$2" -o "$W/o/out.h5" || ok=1
    refused "$1" "$3" "$CKPT" export-safetensors "$2" -o "$W/o/out.st" || ok=1
    # shellcheck disable=SC2086
    refused "$1" "$3" "$TRAIN" $COMMON --batch-size 4 --steps 3 --resume "$2" \
        --out "$W/o/trained.h5" --metrics "$W/o/metrics.jsonl" || ok=1
    tap_diag "$(cat "$W/o/stderr")"
    tap_ok $ok "$1: inspect, verify --scan-nan, consolidate, export-safetensors and --resume refuse it"
}

X="$W/x"
model "external raw storage" "$X/m_extstore.h5" \
    "m_extstore.h5: dataset /model/wte.weight keeps its data in external file '.*secret.txt'"
model "external link" "$X/m_extlink.h5" \
    "m_extlink.h5: /model/wte.weight is an external link (to another file)"
model "soft link" "$X/m_softlink.h5" "m_softlink.h5: /model/wte.weight is a soft link"
model "/model an external link" "$X/m_groupext.h5" "m_groupext.h5: /model is an external link"
model "virtual dataset in a model file" "$X/m_vds.h5" \
    "m_vds.h5: dataset /model/wte.weight is a virtual dataset"

ckpt "shard with external raw storage" "$X/c_extstore" \
    "c_extstore/shard_0.h5: dataset /model/wte.weight keeps its data in external file"
ckpt "shard with an external link" "$X/c_extlink" \
    "c_extlink/shard_1.h5: /optim/exp_avg/wte.weight is an external link"
ckpt "shard whose /optim is a soft link" "$X/c_groupsoft" "c_groupsoft/shard_1.h5: /optim is a soft link"
ckpt "shard tensor virtual over a missing file" "$X/c_shardvds" \
    "c_shardvds/shard_0.h5: dataset /model/wte.weight is a virtual dataset"
ckpt "index mapping a stranger's file" "$X/c_idx_stranger" \
    "c_idx_stranger/index.h5: virtual dataset /model/wte.weight maps file '.*secret.h5'"
ckpt "index mapping shard_5 of 2" "$X/c_idx_range" \
    "c_idx_range/index.h5: virtual dataset /model/wte.weight maps file './shard_5.h5'"
ckpt "index mapping the wrong dataset" "$X/c_idx_dset" \
    "c_idx_dset/index.h5: virtual dataset /model/h.0.ln_1.weight maps dataset 'model/h.0.ln_1.bias'"
ckpt "index leaving rows unmapped" "$X/c_idx_gap" \
    "c_idx_gap/index.h5: virtual dataset /model/wte.weight does not map rows \[128, 256) (shard 1)"
ckpt "index mapping a file that is not there" "$X/c_idx_missing" \
    "c_idx_missing/index.h5: virtual dataset /model/wte.weight maps file './shard_1.h5.old'"

# the index variants read as model files (fsdpc-train --model D/index.h5)
ok=0
for v in "c_idx_stranger:maps file '.*secret.h5'" "c_idx_range:maps file './shard_5.h5'" \
    "c_idx_dset:maps dataset 'model/h.0.ln_1.bias'" "c_idx_gap:does not map rows" \
    "c_idx_missing:maps file './shard_1.h5.old'"; do
    d=${v%%:*}
    # shellcheck disable=SC2086
    refused "$d" "$d/index.h5: virtual dataset .*${v#*:}" "$TRAIN" $COMMON \
        --model "$X/$d/index.h5" --batch-size 4 --steps 3 --out "$W/o/trained.h5" \
        --metrics "$W/o/metrics.jsonl" || ok=1
done
tap_ok $ok "fsdpc-train --model index.h5 refuses each bad index"

# the untouched checkpoint still reads, also through its index
"$CKPT" verify --scan-nan "$W/s2" > /dev/null 2>&1 &&
    readback "$W/s2/index.h5" "$W/rb.h5" && [ -s "$W/rb.h5" ]
tap_ok $? "the good 2-shard checkpoint verifies and trains from --model index.h5"

tap_done
