#!/bin/sh
# test_ckpt_tool.sh - fsdpc-ckpt init/inspect, and the one-line error that
# inspect gives (with a non-zero exit) for every kind of bad model file.
. "$top_srcdir/tests/tap.sh"
CKPT="$top_builddir/fsdpc-ckpt"
BAD="$top_builddir/tests/io/bad_model"
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ckpt-test.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1

# --- init and inspect of good files
"$CKPT" init --preset tiny --layers 2 --seed 7 -o good.h5 >init.out 2>&1
tap_ok $? "init --preset tiny --layers 2"
[ -f good.h5 ] && ! ls -a | grep -q -F good.h5.tmp
tap_ok $? "init leaves the final file and no temporary"
"$CKPT" inspect good.h5 >inspect.out 2>&1
tap_ok $? "inspect of a fresh file succeeds"
grep -q "n_layer 2, n_head 4, n_embd 128" inspect.out &&
    grep -q "^h.1.mlp.c_proj.weight .*(128, 512) *f32 *262144$" inspect.out &&
    grep -q "28 tensors, 445952 parameters, 1783808 bytes" inspect.out
tap_ok $? "inspect prints the architecture, the tensor table and the totals"
"$CKPT" init --preset tiny --layers 2 --seed 7 -o again.h5 >/dev/null 2>&1 &&
    "$CKPT" init --preset tiny --layers 2 --seed 7 --untied --width 64 --heads 2 -o untied.h5 >/dev/null 2>&1
tap_ok $? "init with overrides (--untied --width --heads)"
cmp -s good.h5 again.h5
tap_ok $? "the same seed gives a byte-identical file"
"$CKPT" init --preset tiny --layers 2 --seed 8 -o other.h5 >/dev/null 2>&1
if command -v h5diff >/dev/null 2>&1; then
    h5diff -q good.h5 other.h5 /model/wte.weight /model/wte.weight >/dev/null 2>&1
    [ $? -eq 1 ] && h5diff -q good.h5 other.h5 /model/h.0.ln_1.weight /model/h.0.ln_1.weight
    tap_ok $? "another seed changes random tensors, not the constant ones"
else
    tap_skip_dep hdf5-tools "h5diff not installed"
fi
"$CKPT" inspect untied.h5 | grep -q "^lm_head.weight .*(256, 64)"
tap_ok $? "untied file has lm_head.weight (256, 64)"
"$CKPT" init --dtype bf16 --layers 1 -o bf16.h5 >/dev/null 2>&1 &&
    "$CKPT" inspect bf16.h5 | grep -q "^wte.weight .*bf16 *65536$"
tap_ok $? "init --dtype bf16 stores bf16 tensors"

# --- usage errors
"$CKPT" --help | grep -q "inspect"
tap_ok $? "--help lists the subcommands"
"$CKPT" init --help | grep -q -- "--preset"
tap_ok $? "init --help"
"$CKPT" init --preset nosuch -o x.h5 2>err.txt
[ $? -ne 0 ] && grep -q "unknown preset 'nosuch'" err.txt
tap_ok $? "init rejects an unknown preset"
"$CKPT" init --width 100 --heads 3 -o x.h5 2>err.txt
[ $? -ne 0 ] && grep -q "not divisible by n_head" err.txt && [ ! -e x.h5 ]
tap_ok $? "init rejects n_embd not divisible by n_head"
"$CKPT" init --layers abc -o x.h5 2>err.txt
[ $? -ne 0 ] && grep -q -- "--layers 'abc'" err.txt
tap_ok $? "init rejects a non-numeric --layers"
"$CKPT" frobnicate 2>err.txt
[ $? -ne 0 ] && grep -q "unknown command 'frobnicate'" err.txt
tap_ok $? "unknown subcommand"

# --- bad files: each one line naming file and field, non-zero exit
# expect NAME KIND PATTERN: make bad-NAME.h5 with bad_model KIND, check inspect
expect() {
    "$BAD" "$2" good.h5 "bad-$1.h5" || { tap_ok 1 "$1: could not build the file"; return; }
    "$CKPT" inspect "bad-$1.h5" >out.txt 2>err.txt
    rc=$?
    if [ $rc -ne 0 ] && grep -q "bad-$1.h5: $3" err.txt && [ "$(wc -l <err.txt)" -eq 1 ]; then
        tap_ok 0 "$1: $(cat err.txt | sed 's/^.*inspect: //')"
    else
        tap_diag "exit $rc; stderr:"; tap_diag "$(cat err.txt)"
        tap_ok 1 "$1: expected '$3'"
    fi
}
expect attr-missing attr-missing:n_layer "root attribute 'n_layer' is missing"
expect no-format attr-missing:format "root attribute 'format' is missing: not an fsdpc model file"
expect attr-string attr-string:n_head "root attribute 'n_head' has string type, expected integer"
expect attr-float attr-float:vocab_size "root attribute 'vocab_size' has float type, expected integer"
expect eps-int attr-int:ln_eps=1 "root attribute 'ln_eps' has integer type, expected float"
expect attr-array attr-array:n_embd "root attribute 'n_embd' must hold one value, not 2"
expect version attr-int:format_version=2 "attribute 'format_version' is 2; this build reads version 1"
expect format attr-str:format=other-model "attribute 'format' is 'other-model', expected 'fsdpc-model'"
expect arch attr-str:architecture=falcon "attribute 'architecture' is 'falcon'; supported"
expect heads attr-int:n_head=3 "n_embd 128 is not divisible by n_head 3"
expect tied attr-int:tied_embeddings=2 "attribute 'tied_embeddings' must be 0 or 1, not 2"
expect shape shape:h.0.ln_1.weight "dataset /model/h.0.ln_1.weight has shape (127,) but n_embd=128 needs (128,)"
expect shape2 shape:wte.weight "dataset /model/wte.weight has shape (255, 128) but vocab_size=256, n_embd=128 needs (256, 128)"
expect missing missing:h.1.attn.c_attn.bias "dataset /model/h.1.attn.c_attn.bias is missing"
expect extra extra:h.0.attn.bias "unexpected entry /model/h.0.attn.bias"
expect lm-head-tied extra:lm_head.weight "unexpected entry /model/lm_head.weight (not a parameter of this gpt2 model: L=2 NH=4 C=128 V=256 context=128 tied)"
expect int int:h.0.mlp.c_fc.weight "dataset /model/h.0.mlp.c_fc.weight has integer type; parameters must be floating point"
expect group group:ln_f.bias "/model/ln_f.bias is not a dataset"
expect no-model no-model "group /model is missing"

head -c 20000 good.h5 >bad-truncated.h5
"$CKPT" inspect bad-truncated.h5 2>err.txt
[ $? -ne 0 ] && grep -q "bad-truncated.h5: cannot open HDF5 file (truncated or damaged?): truncated file" err.txt
tap_ok $? "truncated file: $(sed 's/^.*inspect: //' err.txt)"
printf 'this is text, not HDF5\n' >bad-text.h5
"$CKPT" inspect bad-text.h5 2>err.txt
[ $? -ne 0 ] && grep -q "bad-text.h5: not an HDF5 file" err.txt
tap_ok $? "non-HDF5 file: $(sed 's/^.*inspect: //' err.txt)"
"$CKPT" inspect does-not-exist.h5 2>err.txt
[ $? -ne 0 ] && grep -q "does-not-exist.h5: cannot open: No such file" err.txt
tap_ok $? "missing file"

# --- a virtual dataset outside a checkpoint index: its bytes would come from
# another file (present or gone), so it is refused either way
"$BAD" vds:wpe.weight good.h5 virtual.h5 && "$CKPT" inspect virtual.h5 >/dev/null 2>err.txt
[ $? -ne 0 ] && grep -q "virtual.h5: dataset /model/wpe.weight is a virtual dataset" err.txt
tap_ok $? "a virtual dataset in a model file is refused: $(sed 's/^.*inspect: //' err.txt)"
rm -f virtual.h5.src.h5
"$CKPT" inspect virtual.h5 2>err.txt
[ $? -ne 0 ] && grep -q "virtual.h5: dataset /model/wpe.weight is a virtual dataset" err.txt
tap_ok $? "... and so it is when its source is gone: $(sed 's/^.*inspect: //' err.txt)"

# --- valid files in other float types
for k in f64 f16be bf16; do
    "$BAD" "$k:h.0.attn.c_attn.weight" good.h5 "$k.h5" &&
        "$CKPT" inspect "$k.h5" >out.txt 2>err.txt
    want=$k; [ "$k" = f16be ] && want=f16
    grep -q "^h.0.attn.c_attn.weight .* $want " out.txt
    tap_ok $? "a $k dataset is accepted and listed as $want"
done
tap_done
