#!/bin/sh
# test_train.sh - fsdpc-train and fsdpc-sample end to end on a tiny model:
# the loss falls, step lines and JSONL metrics, validation, the config file
# and its precedence, --out reload, gradient accumulation equivalence, the
# sampler's determinism, one-rank runs under mpiexec, and one clear error
# line for every kind of bad input.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-train.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn

# ---------------------------------------------------------------------------
# fixtures: text from the project's sources, a 2-layer byte-level model

sh "$top_srcdir/tests/corpus.sh" 610000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" --val-fraction 0.1 \
    --val-out "$W/val.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
    -o "$W/m.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 1 --heads 2 --width 32 --context 64 --vocab 64 \
    -o "$W/v64.h5" > /dev/null 2>&1
tap_ok $? "fixtures: token files and models"

base="--model $W/m.h5 --data $W/train.bin --batch-size 4 --seq-len 64 --peak-flops 1e11"

# JSON field of line N (1-based) of a JSONL file: json FIELD N FILE
json() {
    sed -n "$2p" "$3" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"
}

# ---------------------------------------------------------------------------
# a 30-step run: loss, step lines, metrics, config printout, validation

# shellcheck disable=SC2086
"$TRAIN" $base --steps 30 --lr 3e-3 --warmup 3 --val-data "$W/val.bin" --val-every 10 \
    --val-batches 4 --metrics "$W/m.jsonl" --out "$W/out.h5" > "$W/run.out" 2> "$W/run.err"
rc=$?
[ $rc -eq 0 ] || tap_diag "$(cat "$W/run.err")"
tap_ok $rc "30 steps run"

first=$(json loss 2 "$W/m.jsonl")
last=$(grep '"loss"' "$W/m.jsonl" | tail -n 3 | sed 's/.*"loss":\([^,]*\).*/\1/' |
       awk '{ s += $1 } END { printf "%.4f", s / NR }')
tap_diag "loss at step 1: $first, mean of the last 3 steps: $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 5.0 && b < a - 1.0) }'
tap_ok $? "loss falls by more than 1 nat over 30 steps"

n=$(grep -cE '^step +[0-9]+/30 \| loss [0-9]+\.[0-9]{4} \| norm [0-9.]+ \| lr [0-9]\.[0-9]{2}e[-+][0-9]+ \| [0-9.]+ ms \| [0-9]+ tok/s \| mfu [0-9.]+% \| mem [0-9]+ MiB( \| eta [0-9hms]+)?$' "$W/run.out")
[ "$n" -eq 30 ]
tap_ok $? "30 step lines in the documented format (got $n)"

n=$(grep -cE '^val +[0-9]+/30 \| val loss [0-9.]+ \| 4 batches$' "$W/run.out")
[ "$n" -eq 3 ] && [ "$(grep -c '"val_loss"' "$W/m.jsonl")" -eq 3 ]
tap_ok $? "val-every 10: 3 validation lines and records"

n=$(grep -cE '^(# )?[a-z0-9-]+ += .*# (file|flag)$' "$W/run.out")
d=$(sed -n 's/^# \([0-9]*\) more keys at their defaults .*/\1/p' "$W/run.out")
[ -n "$d" ] && [ $((n + d)) -eq "$("$TRAIN" --help | grep -c '^  --[a-z]')" ] &&
    ! grep -qE ' += .*# default$' "$W/run.out"
tap_ok $? "the configuration lists the $n keys given and counts the $d at their defaults: every key"

ok=0
for k in step loss grad_norm lr ms tokens_per_s mfu time; do
    [ -n "$(json "$k" 2 "$W/m.jsonl")" ] || ok=1
done
tap_ok $ok "metrics records carry step, loss, grad_norm, lr, ms, tokens_per_s, mfu, time"
if command -v "${PYTHON3:-python3}" > /dev/null 2>&1; then
    "${PYTHON3:-python3}" -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 34, len(recs)
start, recs = recs[0], recs[1:]
assert start["event"] == "start" and len(start["run_id"]) == 16, start
assert start["resumed_from"] is None and start["world_size"] == 1, start
assert start["global_batch_tokens"] == 256 and start["config"]["steps"] == 30, start
assert all(("loss" in r) != ("val_loss" in r) for r in recs)
assert all(r["time"] >= start["time"] for r in recs)' "$W/m.jsonl"
    tap_ok $? "metrics file is valid JSONL (a start record, 30 steps + 3 validations, timestamps)"
else
    tap_skip_dep python3 "to parse JSON"
fi

# ---------------------------------------------------------------------------
# --out: the written model loads, continues training, and samples

# shellcheck disable=SC2086
"$TRAIN" --model "$W/out.h5" --data "$W/train.bin" --batch-size 4 --seq-len 64 \
    --peak-flops 1e11 --steps 3 --lr 1e-3 --metrics "$W/c.jsonl" > /dev/null 2> "$W/c.err"
rc=$?
cont=$(json loss 2 "$W/c.jsonl")
awk -v a="$first" -v b="$cont" 'BEGIN { exit !(b < a - 1.0) }' && [ $rc -eq 0 ]
tap_ok $? "--out model reloads and continues (step 1 loss $cont, fresh model $first)"

S="$BIN/fsdpc-sample"
a=$("$S" --model "$W/out.h5" --prompt "int " --tokens 40 --seed 7 --top-k 20 2>/dev/null | od -c)
b=$("$S" --model "$W/out.h5" --prompt "int " --tokens 40 --seed 7 --top-k 20 2>/dev/null | od -c)
c=$("$S" --model "$W/out.h5" --prompt "int " --tokens 40 --seed 8 --top-k 20 2>/dev/null | od -c)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]
tap_ok $? "fsdpc-sample: same seed same text, other seed other text"
n=$("$S" --model "$W/out.h5" --prompt "int " --tokens 40 --temperature 0 2>/dev/null | wc -c)
[ "$n" -eq 45 ]
tap_ok $? "fsdpc-sample: prompt + 40 bytes + newline ($n bytes)"
n=$("$S" --model "$W/v64.h5" --prompt "1 2 3" --tokens 5 --seed 1 2>/dev/null | wc -w)
[ "$n" -eq 8 ]
tap_ok $? "fsdpc-sample: a non-byte vocabulary prints token ids ($n)"

# ---------------------------------------------------------------------------
# config file and precedence

cat > "$W/run.cfg" <<EOF
# a training config
model = $W/m.h5
data  = $W/train.bin   # trailing comment
batch-size = 2
seq-len = 32
steps = 4
lr = 2e-3
lr-schedule = linear
peak-flops = 1e11
EOF
"$TRAIN" --config "$W/run.cfg" --steps 2 > "$W/cfg.out" 2> "$W/cfg.err"
rc=$?
[ $rc -eq 0 ] && grep -q '^step 2/2 ' "$W/cfg.out" &&
    grep -qE '^steps += 2 +# flag$' "$W/cfg.out" &&
    grep -qE '^lr += 0.002 +# file$' "$W/cfg.out" &&
    grep -qE '^lr-schedule += linear +# file$' "$W/cfg.out"
tap_ok $? "--config sets keys and a flag overrides the file"

# the printed configuration is the keys given, then a count of the rest; it is
# itself a config file that reproduces the run
sed -n '/^# fsdpc-train/,/^# [0-9]* more keys at their defaults/p' "$W/cfg.out" > "$W/again.cfg"
n=$(grep -c ' = ' "$W/again.cfg")
! grep -q '# default$' "$W/again.cfg" && [ "$n" -ge 8 ] && [ "$n" -le 12 ] &&
    grep -qE '^# [0-9]+ more keys at their defaults \(fsdpc-train --help lists them' "$W/again.cfg"
tap_ok $? "the printed configuration holds the $n keys given and counts the others"
"$TRAIN" --config "$W/again.cfg" > "$W/again.out" 2>&1
[ "$(grep '^step ' "$W/cfg.out" | cut -d'|' -f2-4)" = "$(grep '^step ' "$W/again.out" | cut -d'|' -f2-4)" ]
tap_ok $? "the printed configuration reads back as a config file with the same result"

# ---------------------------------------------------------------------------
# gradient accumulation: K=2 x B=2 equals K=1 x B=4 (same tokens, mean loss)

# shellcheck disable=SC2086
"$TRAIN" --model "$W/m.h5" --data "$W/train.bin" --seq-len 64 --peak-flops 1e11 --steps 4 \
    --lr 3e-3 --batch-size 2 --grad-accum 2 --metrics "$W/k2.jsonl" > /dev/null 2>&1 &&
"$TRAIN" --model "$W/m.h5" --data "$W/train.bin" --seq-len 64 --peak-flops 1e11 --steps 4 \
    --lr 3e-3 --batch-size 4 --grad-accum 1 --metrics "$W/k1.jsonl" > /dev/null 2>&1
tap_ok $? "grad-accum runs"
ok=0
for i in 1 2 3 4; do
    l=$((i + 1)) # line 1 is the start record
    x=$(json loss $l "$W/k2.jsonl") y=$(json loss $l "$W/k1.jsonl")
    gx=$(json grad_norm $l "$W/k2.jsonl") gy=$(json grad_norm $l "$W/k1.jsonl")
    tap_diag "step $i: K=2 loss $x norm $gx | K=1 loss $y norm $gy"
    awk -v a="$x" -v b="$y" -v c="$gx" -v d="$gy" 'BEGIN {
        r1 = (a - b) / b; r2 = (c - d) / d;
        exit !(r1 < 1e-5 && r1 > -1e-5 && r2 < 1e-4 && r2 > -1e-4) }' || ok=1
done
tap_ok $ok "grad-accum 2 x batch 2 equals batch 4: loss to 1e-5, norm to 1e-4, 4 steps"

# ---------------------------------------------------------------------------
# launchers: one rank under mpiexec works; more ranks run the sharding engine

if [ -n "$MPIEXEC" ] && [ -x "$MPIEXEC" ]; then
    # shellcheck disable=SC2086
    timeout 30 "$MPIEXEC" -n 1 "$TRAIN" $base --steps 2 --lr 1e-3 > "$W/mpi.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q '^step 2/2 ' "$W/mpi.out"
    tap_ok $? "mpiexec -n 1 runs"
    # shellcheck disable=SC2086
    timeout 30 "$MPIEXEC" -n 2 "$TRAIN" $base --steps 2 --lr 1e-3 > "$W/mpi2.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q '^step 2/2 ' "$W/mpi2.out" && grep -q '^engine: fsdp' "$W/mpi2.out"
    tap_ok $? "mpiexec -n 2 trains with the sharding engine (rc $rc)"
else
    tap_skip_dep mpiexec "no MPIEXEC"
    tap_skip_dep mpiexec "no MPIEXEC"
fi

# ---------------------------------------------------------------------------
# bad input: non-zero exit, exactly one error line that names the problem

# expect_error "description" "pattern" args...
expect_error() {
    what=$1 pattern=$2
    shift 2
    "$TRAIN" "$@" > "$W/bad.out" 2> "$W/bad.err"
    rc=$?
    lines=$(grep -v '^fsdpc: hint: ' "$W/bad.err" | grep -c .)
    if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$W/bad.err"; then
        tap_ok 0 "$what"
    else
        tap_diag "rc $rc, $lines stderr lines:"
        tap_diag "$(cat "$W/bad.err")"
        tap_ok 1 "$what"
    fi
}

# shellcheck disable=SC2086
expect_error "unknown flag, with a suggestion" "unknown option --bach-size (did you mean --batch-size?)" \
    $base --steps 2 --lr 1e-3 --bach-size 4
# shellcheck disable=SC2086
expect_error "malformed number" "--lr 'fast' is not a finite number" $base --steps 2 --lr fast
# shellcheck disable=SC2086
expect_error "out-of-range value" "--steps '-1' is out of range \[0, " $base --steps -1 --lr 1e-3
# shellcheck disable=SC2086
expect_error "bad choice" "--lr-schedule 'step' is not one of cosine|linear|constant" $base --steps 2 \
    --lr 1e-3 --lr-schedule step
expect_error "missing required key" "missing required option 'lr'" --model "$W/m.h5" \
    --data "$W/train.bin" --steps 2 --batch-size 2 --seq-len 8
# shellcheck disable=SC2086
expect_error "flag without a value" "--lr needs a value" $base --steps 2 --lr
# shellcheck disable=SC2086
expect_error "positional argument" "unexpected argument 'extra'" $base --steps 2 --lr 1e-3 extra
printf 'steps = 2\nlearning-rate = 1e-3\n' > "$W/bad.cfg"
# shellcheck disable=SC2086
expect_error "unknown config key names file and line" "bad.cfg:2: unknown key 'learning-rate'" \
    $base --config "$W/bad.cfg" --lr 1e-3
printf 'steps = many\n' > "$W/bad2.cfg"
# shellcheck disable=SC2086
expect_error "malformed config value" "bad2.cfg:1: steps = 'many' is not an integer" \
    $base --config "$W/bad2.cfg" --lr 1e-3
printf 'steps 2\n' > "$W/bad3.cfg"
# shellcheck disable=SC2086
expect_error "config line without '='" "bad3.cfg:1: expected 'key = value'" \
    $base --config "$W/bad3.cfg" --lr 1e-3
# shellcheck disable=SC2086
expect_error "missing config file" "config file $W/nope.cfg" $base --config "$W/nope.cfg" --lr 1e-3
# shellcheck disable=SC2086
expect_error "seq-len beyond the model's context" "seq-len 128 is longer than the context 64" \
    --model "$W/m.h5" --data "$W/train.bin" --batch-size 2 --seq-len 128 --steps 2 --lr 1e-3
expect_error "missing model file" "$W/none.h5" --model "$W/none.h5" --data "$W/train.bin" \
    --batch-size 2 --seq-len 8 --steps 2 --lr 1e-3
expect_error "missing data file" "$W/none.bin" --model "$W/m.h5" --data "$W/none.bin" \
    --batch-size 2 --seq-len 8 --steps 2 --lr 1e-3
expect_error "tokens beyond the model's vocabulary" "data: " --model "$W/v64.h5" \
    --data "$W/train.bin" --batch-size 2 --seq-len 8 --steps 2 --lr 1e-3 --peak-flops 1e11
# shellcheck disable=SC2086
expect_error "unwritable --out, before training" "cannot write in directory $W/no/such" $base \
    --steps 2 --lr 1e-3 --out "$W/no/such/m.h5"
# shellcheck disable=SC2086
expect_error "unwritable --metrics" "metrics file $W/no/m.jsonl" $base --steps 2 --lr 1e-3 \
    --metrics "$W/no/m.jsonl"
# shellcheck disable=SC2086
expect_error "val-every without val-data" "val-every 5 needs val-data" $base --steps 2 --lr 1e-3 \
    --val-every 5
# shellcheck disable=SC2086
expect_error "min-lr above lr" "min-lr 0.1 is above lr 0.001" $base --steps 2 --lr 1e-3 --min-lr 0.1
"$BIN/fsdpc-sample" --model "$W/m.h5" --top-k -1 > /dev/null 2> "$W/bad.err"
rc=$?
[ $rc -ne 0 ] && [ "$(grep -vc '^fsdpc: hint: ' "$W/bad.err")" -eq 1 ] &&
    grep -q -- "--top-k '-1' is out of range" "$W/bad.err"
tap_ok $? "fsdpc-sample: bad value is one clear line"

tap_done
