#!/bin/sh
# test_ckpt_resume.sh - sharded checkpoints round trip through training:
# 10 steps + save + resume + 10 steps equals 20 steps bitwise (per-step
# losses and final weights) on one rank and on 2 ranks over tcp and mpi; a
# bare --resume resumes exactly as --resume latest;
# resuming on another world size or mesh (2 -> 3, 4 -> 2, dp=4 -> rdp=2,dp=2,
# and an offline reshard) matches the uninterrupted run to float tolerance;
# index.h5 is a model file (fsdpc-train --model loads the trainer's saved
# weights through it, byte for byte; h5diff and h5py full tensors equal to the
# consolidated ones); retention; the fsdpc-ckpt subcommands.
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/ckpt/ckpt_lib.sh"

# ---------------------------------------------------------------------------
# same mesh: bitwise

# same NAME N_RANKS ARGS...: 20 straight vs 10 + resume + 10
same() {
    name=$1
    n=$2
    shift 2
    d="$W/$name"
    mkdir -p "$d"
    train "$n" "$@" --steps 20 --metrics "$d/a.jsonl" --out "$d/a.h5" &&
    train "$n" "$@" --steps 10 --ckpt-dir "$d/ck" --metrics "$d/b.jsonl" &&
    train "$n" "$@" --steps 20 --ckpt-dir "$d/ck" --resume latest --metrics "$d/b.jsonl" \
        --out "$d/b.h5"
    tap_ok $? "$name: 20 steps, and 10 + checkpoint + resume + 10"
    losses "$d/a.jsonl" > "$d/a.loss"
    losses "$d/b.jsonl" > "$d/b.loss"
    [ "$(wc -l < "$d/a.loss")" -eq 20 ] && cmp -s "$d/a.loss" "$d/b.loss"
    r=$?
    [ $r -eq 0 ] || tap_diag "$(diff "$d/a.loss" "$d/b.loss" | head -n 6)"
    tap_ok $r "$name: the 20 per-step losses are bitwise identical"
    cmp -s "$d/a.h5" "$d/b.h5"
    tap_ok $? "$name: final model files are byte-identical"
}

same local 1 --batch-size 4
same tcp2 2 --batch-size 2 --backend tcp
same mpi2 2 --batch-size 2 --backend mpi
same hsdp 4 --batch-size 1 --backend tcp --mesh rdp=2,dp=2
same f16scaled 2 --batch-size 2 --backend tcp --param-dtype f16 --reduce-dtype f16 \
    --loss-scale dynamic --loss-scale-init 1e6

# a bare --resume is --resume latest: three copies of one 10-step checkpoint
# directory, resumed with --resume latest, a bare --resume at the end of the
# command line and a bare --resume followed by another option, end alike
d="$W/bare"
mkdir -p "$d"
train 1 --batch-size 4 --steps 10 --ckpt-dir "$d/ck1" &&
    cp -R "$d/ck1" "$d/ck2" && cp -R "$d/ck1" "$d/ck3" &&
    train 1 --batch-size 4 --steps 20 --ckpt-dir "$d/ck1" --resume latest \
        --metrics "$d/1.jsonl" --out "$d/1.h5" &&
    train 1 --batch-size 4 --steps 20 --ckpt-dir "$d/ck2" --metrics "$d/2.jsonl" \
        --out "$d/2.h5" --resume &&
    grep -qE '^resume += latest +# flag$' "$W/last.out" &&
    train 1 --batch-size 4 --resume --steps 20 --ckpt-dir "$d/ck3" --metrics "$d/3.jsonl" \
        --out "$d/3.h5"
tap_ok $? "bare --resume: runs, at the end and before --steps; printed as 'resume = latest'"
for i in 1 2 3; do
    losses "$d/$i.jsonl" > "$d/$i.loss"
done
[ "$(wc -l < "$d/1.loss")" -eq 10 ] && [ "$(head -n 1 "$d/1.loss" | cut -d' ' -f1)" = 11 ] &&
    cmp -s "$d/1.loss" "$d/2.loss" && cmp -s "$d/1.loss" "$d/3.loss" &&
    cmp -s "$d/1.h5" "$d/2.h5" && cmp -s "$d/1.h5" "$d/3.h5"
r=$?
[ $r -eq 0 ] || tap_diag "$(diff "$d/1.loss" "$d/2.loss" | head -n 4; diff "$d/1.loss" "$d/3.loss" | head -n 4)"
tap_ok $r "bare --resume continues from step 11 exactly as --resume latest (losses and model bitwise)"

d="$W/local/ck"
[ "$(readlink "$d/latest")" = step_20 ] && [ -f "$d/step_10/index.h5" ] &&
    [ -f "$d/step_20/shard_0.h5" ] && ! ls -a "$d" | grep -q '^\.tmp_'
tap_ok $? "layout: step_10/, step_20/ (saved at the end), latest -> step_20, no .tmp_*"

d="$W/tcp2/ck/step_10"
[ -f "$d/shard_0.h5" ] && [ -f "$d/shard_1.h5" ] && [ ! -e "$d/shard_2.h5" ]
tap_ok $? "2 ranks: one shard file per rank"

d="$W/hsdp/ck/step_10"
[ -f "$d/shard_0.h5" ] && [ -f "$d/shard_1.h5" ] && [ ! -e "$d/shard_2.h5" ]
tap_ok $? "rdp=2,dp=2: one shard file per dp rank (replicas write none)"

"$CKPT" inspect "$W/f16scaled/ck/step_10" > "$W/f16.out" 2>&1 &&
    sed -n 's/^optimizer .*loss scale \([^ ]*\) (\([0-9]*\) good steps, \([0-9]*\) skipped)/\1 \2 \3/p' \
        "$W/f16.out" > "$W/f16.scale" && tap_diag "f16 loss scale, good steps, skipped: $(cat "$W/f16.scale")" &&
    awk '{ exit !($1 < 1e6 && $2 > 0 && $3 > 0) }' "$W/f16.scale"
tap_ok $? "f16 dynamic loss scaling: the scaler's backed-off scale and skip count are stored"

# ---------------------------------------------------------------------------
# another world size or mesh: same global batch, float tolerance

# reshard NAME N_FROM B_FROM N_TO B_TO [ARGS_TO...]
reshard() {
    name=$1
    nf=$2
    bf=$3
    nt=$4
    bt=$5
    shift 5
    d="$W/$name"
    mkdir -p "$d"
    train "$nf" --backend tcp --batch-size "$bf" --steps 10 --metrics "$d/a.jsonl" &&
    train "$nf" --backend tcp --batch-size "$bf" --steps 5 --ckpt-dir "$d/ck" \
        --metrics "$d/b.jsonl" &&
    train "$nt" --backend tcp --batch-size "$bt" --steps 10 --resume "$d/ck/step_5" \
        --metrics "$d/b.jsonl" "$@" &&
    "$PY" "$COMPARE" losses "$d/b.jsonl" "$d/a.jsonl" --tol 1e-5 > "$d/cmp" 2>&1
    r=$?
    tap_diag "$(cat "$d/cmp")"
    tap_ok $r "$name: resumed on another layout, losses match the uninterrupted run (1e-5)"
}

reshard 2to3 2 6 3 4
reshard 4to2 4 2 2 4
reshard dp4to-rdp2dp2 4 2 4 2 --mesh rdp=2,dp=2

# offline reshard of the 2 -> 3 checkpoint, resumed on 3 ranks: same as resuming the original
d="$W/2to3"
"$CKPT" reshard "$d/ck/step_5" --world-size 3 -o "$d/r3" > /dev/null 2>&1 &&
    "$CKPT" verify "$d/r3" > /dev/null 2>&1 &&
    [ -f "$d/r3/shard_2.h5" ] &&
    train 3 --backend tcp --batch-size 4 --steps 10 --resume "$d/r3" --metrics "$d/c.jsonl" &&
    losses "$d/c.jsonl" > "$d/c.loss" && losses "$d/b.jsonl" | tail -n 5 > "$d/b.loss" &&
    cmp -s "$d/b.loss" "$d/c.loss"
tap_ok $? "fsdpc-ckpt reshard --world-size 3, resumed on 3 ranks: losses identical"

# a resume checks and opens the shards each rank reads, not all of them: on 3
# ranks each reads its own rows (one shard), on 1 rank all 3
FSDPC_LOG=io=debug FSDPC_LOG_RANKS=all train 3 --backend tcp --batch-size 4 --steps 6 \
    --resume "$d/r3" && cp "$W/last.out" "$d/lazy3.out" &&
    FSDPC_LOG=io=debug train 1 --batch-size 12 --steps 6 --resume "$d/r3" &&
    cp "$W/last.out" "$d/lazy1.out"
r=$?
got3=$(grep -o 'r[0-9] DEBUG io [^]]*\] .*: shard [0-9] of 3 checked at its first read' "$d/lazy3.out" |
    sed 's/^r\([0-9]\) .*shard \([0-9]\) of 3.*/\1:\2/' | sort | tr '\n' ' ')
got1=$(grep -c 'shard [0-9] of 3 checked at its first read' "$d/lazy1.out")
tap_diag "3 ranks (rank:shard): $got3; 1 rank: $got1 shards"
[ $r -eq 0 ] && [ "$got3" = "0:0 1:1 2:2 " ] && [ "$got1" -eq 3 ]
tap_ok $? "a resume on 3 ranks opens one shard per rank (its own rows), on 1 rank all 3"

# ---------------------------------------------------------------------------
# index.h5 is a model file; the tool subcommands

d="$W/tcp2/ck/step_20"
train 1 --batch-size 4 --steps 3 --model "$d/index.h5"
tap_ok $? "fsdpc-train --model step_20/index.h5 trains from the virtual datasets"

"$CKPT" consolidate "$d" -o "$W/cons.h5" --with-optimizer > "$W/cons.out" 2>&1 &&
    "$CKPT" inspect "$W/cons.h5" > /dev/null 2>&1
tap_ok $? "consolidate --with-optimizer writes a valid model file"

# An exit status alone passes an index whose virtual datasets take rows from
# the wrong shard file; the weights loaded through it must be the ones the
# trainer saved at step 20 (tcp2/b.h5). Consolidate reads the shard files
# directly, never the index, so it tells a bad index from bad shards.
readback "$d/index.h5" "$W/rb-index.h5" && readback "$W/tcp2/b.h5" "$W/rb-saved.h5" &&
    readback "$W/cons.h5" "$W/rb-cons.h5"
tap_ok $? "the model in index.h5, in the saved final model and in the consolidated file load"
# rb_same A B WHAT: readbacks A and B are the same bytes; else their losses and
# (with h5diff) the first differing tensors
rb_same() {
    cmp -s "$W/rb-$1.h5" "$W/rb-$2.h5"
    r=$?
    if [ $r -ne 0 ]; then
        tap_diag "losses with $1: $(losses "$W/rb-$1.h5.jsonl" | tr '\n' ' ')"
        tap_diag "losses with $2: $(losses "$W/rb-$2.h5.jsonl" | tr '\n' ' ')"
        if command -v h5diff > /dev/null 2>&1; then
            tap_diag "$(h5diff -r "$W/rb-$1.h5" "$W/rb-$2.h5" /model /model 2>&1 | head -n 8)"
        fi
    fi
    tap_ok $r "$3"
}
rb_same index saved "fsdpc-train loads from step_20/index.h5 the saved step-20 weights, bitwise"
rb_same cons saved "the consolidated step_20 (read from the shard files) loads the same weights"

# the virtual datasets of every group, optimizer moments included, read by
# the HDF5 library itself: a second reader that needs no Python
if command -v h5diff > /dev/null 2>&1; then
    h5diff "$d/index.h5" "$W/cons.h5" /model /model > "$W/h5diff.out" 2>&1 &&
        h5diff "$d/index.h5" "$W/cons.h5" /optim /optim >> "$W/h5diff.out" 2>&1
    r=$?
    [ $r -eq 0 ] || tap_diag "$(head -n 12 "$W/h5diff.out")"
    tap_ok $r "h5diff: /model and /optim of index.h5 equal the consolidated file"
    h5diff "$W/rb-saved.h5" "$W/tcp2/b.h5" /model /model > "$W/h5diff.out" 2>&1
    r=$?
    [ $r -eq 0 ] || tap_diag "$(head -n 12 "$W/h5diff.out")"
    tap_ok $r "h5diff: a readback (lr 0) holds the weights it loaded"
else
    tap_skip "h5diff not available"
    tap_skip "h5diff not available"
fi

if have_h5py; then
    "$PY" - "$d/index.h5" "$W/cons.h5" "$W/tcp2/b.h5" > "$W/h5.out" 2>&1 <<'PY'
import sys, h5py, numpy as np
idx, cons, final = (h5py.File(p, "r") for p in sys.argv[1:])
n = 0
for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in idx[g]:
        a, b = idx[g][k][...], cons[g][k][...]
        if a.shape != b.shape or not np.array_equal(a, b):
            sys.exit("%s/%s differs" % (g, k))
        n += 1
for k in final["model"]:
    if not np.array_equal(idx["model"][k][...], final["model"][k][...]):
        sys.exit("model/%s differs from the final model file" % k)
if not np.any(idx["optim/exp_avg_sq/wte.weight"][...]):
    sys.exit("exp_avg_sq is all zero")
print("%d full tensors equal" % n)
PY
    r=$?
    tap_diag "$(cat "$W/h5.out")"
    tap_ok $r "h5py: full tensors of index.h5 equal the consolidated ones and the final model"
else
    tap_skip_dep h5py "not importable by /usr/bin/python3"
fi

"$CKPT" inspect "$W/tcp2/ck" > "$W/insp.out" 2>&1 &&
    grep -q '^step          20 ' "$W/insp.out" && grep -q 'mesh dp=2' "$W/insp.out" &&
    grep -q '^  batch-size = 2$' "$W/insp.out" && grep -q '^h.1.mlp.c_fc.weight ' "$W/insp.out"
tap_ok $? "inspect CKPT_ROOT: step, mesh, stored config, tensor table"

"$CKPT" verify --scan-nan "$W/tcp2/ck/latest" > "$W/ver.out" 2>&1 &&
    grep -q '^ok: .*step 20, 2 shards' "$W/ver.out"
tap_ok $? "verify --scan-nan passes on a good checkpoint"

"$CKPT" convert "$d" --dtype bf16 -o "$W/bf16.h5" > /dev/null 2>&1 &&
    "$CKPT" inspect "$W/bf16.h5" | grep -q 'wte.weight .* bf16' &&
    "$CKPT" convert "$W/bf16.h5" --dtype f32 -o "$W/f32.h5" > /dev/null 2>&1 &&
    "$CKPT" inspect "$W/f32.h5" | grep -q 'wte.weight .* f32'
tap_ok $? "convert: checkpoint -> bf16 model file -> f32 model file"

for c in inspect verify consolidate reshard convert; do
    "$CKPT" "$c" --help | grep -q "^usage: fsdpc-ckpt $c" || break
done
tap_ok $? "every subcommand has --help"

# retention: keep the newest 2
train 1 --batch-size 4 --steps 5 --ckpt-dir "$W/keep" --ckpt-every 1 --ckpt-keep 2 &&
    [ "$(ls "$W/keep" | tr '\n' ' ')" = "latest step_4 step_5 " ]
tap_ok $? "ckpt-keep 2 leaves step_4 and step_5 (got: $(ls "$W/keep" 2> /dev/null | tr '\n' ' '))"

tap_done
