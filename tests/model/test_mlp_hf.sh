#!/bin/sh
# test_mlp_hf.sh - an architecture defined under tests/ ("mlp", with its
# Hugging Face-style map as data in mlp_hf.c) through the unchanged
# fsdpc-ckpt commands (tests/model/mlp_ckpt: fsdpc-ckpt with mlp
# registered): a directory written here with numpy (mlp_hf_dir.py) is
# imported, exported and imported again bit for bit, tied and untied; its
# safetensors export imports from the metadata alone; and the imported
# model trains on --device guarded exactly as on --device cpu.
# Needs numpy for /usr/bin/python3, h5py for the model-file checks.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
CKPT="$BIN/tests/model/mlp_ckpt"
MLP="$BIN/tests/model/mlp_train"
PY=/usr/bin/python3
DIR="$top_srcdir/tests/model/mlp_hf_dir.py"
CMP="$top_srcdir/tests/fsdp/compare_models.py"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-mlphf.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

if ! "$PY" -c 'import numpy, h5py' > /dev/null 2>&1; then
    tap_skip_dep numpy "numpy/h5py not importable by $PY"
    tap_done
    exit 0
fi

# check NAME CMD...: one test, its output as diagnostics
check() {
    c_name=$1
    shift
    "$@" > "$W/out" 2>&1
    c_rc=$?
    tap_diag "$(tail -n 5 "$W/out")"
    tap_ok $c_rc "$c_name"
}

for m in tied untied; do
    tied=0
    [ $m = tied ] && tied=1
    check "$m: a Hugging Face-style mlp directory written with numpy" \
        "$PY" "$DIR" write "$W/$m.src" 256 16 12 20 2 $tied 7
    check "$m: import-hf" "$CKPT" import-hf "$W/$m.src" -o "$W/$m.h5"
    grep -q "mlp (mlp_lm)" "$W/out"
    tap_ok $? "$m: import-hf names the architecture and its model_type"
    check "$m: the model file holds the source's tensors, fc2 turned to (out, in)" \
        "$PY" "$DIR" model "$W/$m.src" "$W/$m.h5"
    check "$m: export-hf" "$CKPT" export-hf "$W/$m.h5" -o "$W/$m.out"
    check "$m: the export's tensors and config are the source's, bit for bit" \
        "$PY" "$DIR" same "$W/$m.src" "$W/$m.out"
    "$CKPT" import-hf "$W/$m.out" -o "$W/$m.2.h5" > /dev/null 2>&1 &&
        "$CKPT" export-hf "$W/$m.2.h5" -o "$W/$m.out2" > /dev/null 2>&1 &&
        cmp -s "$W/$m.out/model.safetensors" "$W/$m.out2/model.safetensors" &&
        cmp -s "$W/$m.out/config.json" "$W/$m.out2/config.json"
    tap_ok $? "$m: import of the export, exported again: byte-identical"
    "$CKPT" export-safetensors "$W/$m.h5" -o "$W/$m.st" > /dev/null 2>&1 &&
        "$CKPT" import-safetensors "$W/$m.st" -o "$W/$m.3.h5" > "$W/out" 2>&1 &&
        "$CKPT" export-safetensors "$W/$m.3.h5" -o "$W/$m.st2" > /dev/null 2>&1 &&
        cmp -s "$W/$m.st" "$W/$m.st2"
    r=$?
    tap_diag "$(cat "$W/out")"
    tap_ok $r "$m: safetensors export imports from its metadata alone, byte-identical"
done

"$BIN/fsdpc-ckpt" export-hf "$W/tied.h5" -o "$W/x" > /dev/null 2> "$W/err"
[ $? -ne 0 ] && grep -q "mlp" "$W/err" && [ ! -e "$W/x" ]
r=$?
tap_diag "$(cat "$W/err")"
tap_ok $r "fsdpc-ckpt, which has no mlp registered, refuses the model, naming it"

sed 's/"relu"/"gelu"/' "$W/tied.src/config.json" > "$W/cfg" && mkdir "$W/gelu" &&
    cp "$W/tied.src/model.safetensors" "$W/gelu/" && mv "$W/cfg" "$W/gelu/config.json"
"$CKPT" import-hf "$W/gelu" -o "$W/gelu.h5" > /dev/null 2> "$W/err"
[ $? -ne 0 ] && grep -q "'hidden_act' is \"gelu\"; fsdpc reads only \"relu\"" "$W/err" &&
    [ ! -e "$W/gelu.h5" ]
r=$?
tap_diag "$(cat "$W/err")"
tap_ok $r "the architecture's own config reader refuses another activation"

# the imported model trains on the guarded device exactly as on the CPU
sh "$top_srcdir/tests/corpus.sh" 20000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1
tap_ok $? "token file"
"$CKPT" import-hf "$W/untied.src" -o "$W/train.h5" > /dev/null 2>&1
for dev in cpu guarded; do
    timeout 120 "$MLP" --model "$W/train.h5" --data "$W/tok.bin" --seq-len 16 --batch-size 4 \
        --steps 3 --lr 1e-2 --warmup 1 --clip 1 --log-every 1 --device $dev \
        --metrics "$W/$dev.jsonl" --out "$W/$dev.h5" > "$W/$dev.log" 2>&1
    r=$?
    [ $r -eq 0 ] || tap_diag "$(tail -n 5 "$W/$dev.log")"
    tap_ok $r "mlp trains 3 steps on --device $dev"
done
out=$("$PY" "$CMP" losses "$W/cpu.jsonl" "$W/guarded.jsonl" --tol 0 2>&1) &&
    out="$out
$("$PY" "$CMP" models "$W/cpu.h5" "$W/guarded.h5" --tol 0 2>&1)"
r=$?
tap_diag "$out"
tap_ok $r "guarded equals cpu: losses, gradient norms and final weights bit for bit"
check "the trained model exports as a Hugging Face-style directory" \
    "$CKPT" export-hf "$W/guarded.h5" -o "$W/trained"
tap_done
