#!/bin/sh
# test_plot_resume.sh - fsdpc-plot after a crash: a run killed with SIGKILL
# past its checkpoint and resumed leaves the abandoned steps in its metrics
# file; fsdpc-plot --dump must give the run one line whose steps only go
# forward (each launch up to where the next resumed), the abandoned steps
# apart as superseded, each launch's own steps in order, and two runs whose
# files are both called metrics.jsonl labelled by their directories. A
# record the kill cut short is skipped with a warning; the image is drawn
# when matplotlib is there.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-plot-resume.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
PY=/usr/bin/python3
[ -x "$PY" ] || PY=${PYTHON3:-python3}

sh "$top_srcdir/tests/corpus.sh" 200000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset tiny -o "$W/m.h5" > /dev/null 2>&1 &&
    mkdir "$W/crashed" "$W/plain"
tap_ok $? "fixtures: a token file and the tiny model"

base="--model $W/m.h5 --data $W/train.bin --batch-size 8 --seq-len 128 --lr 1e-3 --peak-flops 1e11"
a="--steps 60 --ckpt-dir $W/crashed/ck --ckpt-every 5 --metrics $W/crashed/metrics.jsonl"
# shellcheck disable=SC2086
"$TRAIN" $base $a > "$W/a1.out" 2>&1 &
pid=$!
i=0
# the newest step record reaching 12: past the checkpoint of step 10
while [ $i -lt 1200 ] && kill -0 $pid 2> /dev/null &&
    ! grep -qE '^\{"step":(1[2-9]|[2-9][0-9]),"loss"' "$W/crashed/metrics.jsonl" 2> /dev/null; do
    sleep 0.02
    i=$((i + 1))
done
kill -9 $pid 2> /dev/null
wait $pid
rc=$?
[ $rc -eq 137 ] && [ -e "$W/crashed/ck/latest" ]
r=$?
[ $r -eq 0 ] || tap_diag "rc $rc; $(tail -3 "$W/a1.out")"
tap_ok $r "a run killed with SIGKILL after step $(grep -c '"loss"' "$W/crashed/metrics.jsonl"), past a checkpoint (rc $rc)"
# shellcheck disable=SC2086
"$TRAIN" $base $a --resume > "$W/a2.out" 2>&1 &&
    "$TRAIN" $base --steps 10 --lr 5e-4 --metrics "$W/plain/metrics.jsonl" > /dev/null 2>&1
tap_ok $? "resumed to step 60; another run (--lr 5e-4) in another directory"

"$BIN/fsdpc-plot" "$W/crashed/metrics.jsonl" "$W/plain/metrics.jsonl" --dump "$W/d.json" \
    > "$W/plot.out" 2>&1
r=$?
[ $r -eq 0 ] || tap_diag "$(cat "$W/plot.out")"
tap_ok $r "fsdpc-plot --dump ($(cat "$W/plot.out"))"

out=$("$PY" - "$W/d.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
bad = []
def up(xs):
    return all(b > a for a, b in zip(xs, xs[1:]))
if [r["label"] for r in runs] != ["crashed", "plain"]:
    bad.append("labels %s, not crashed and plain" % [r["label"] for r in runs])
c = runs[0]
l1, l2 = (c["launches"] + [None, None])[:2]
if len(c["launches"]) != 2 or l1["resumed_from"] is not None or l2["resumed_from"] is None:
    bad.append("launches %s" % [(l["resumed_from"], len(l["steps"])) for l in c["launches"]])
else:
    r = l2["resumed_from"]
    if not (up(l1["steps"]) and up(l2["steps"])):
        bad.append("a launch's steps go back")
    if c["steps"] != list(range(1, 61)):
        bad.append("the run's line is %s, not steps 1..60 in order" % c["steps"])
    if c["superseded_steps"] != [s for s in l1["steps"] if s > r]:
        bad.append("superseded %s, not launch 1's steps past %d" % (c["superseded_steps"], r))
    if l2["resumed_dir"] is None or not l2["resumed_dir"].endswith("step_%d" % r):
        bad.append("resumed_dir %s" % l2["resumed_dir"])
    print("launch 1: steps 1..%d; launch 2 resumed from %d; %d superseded"
          % (l1["steps"][-1], r, len(c["superseded_steps"])))
if runs[1]["steps"] != list(range(1, 11)) or runs[1]["superseded_steps"]:
    bad.append("the plain run: %s" % runs[1]["steps"])
print("; ".join(bad) if bad else "ok")
sys.exit(1 if bad else 0)
PY
)
r=$?
tap_diag "$out"
tap_ok $r "the crashed run is one line going forward, the abandoned steps apart, runs labelled by directory"

# two runs in one file: told apart by their number and the settings that differ
mkdir "$W/twice"
# shellcheck disable=SC2086
"$TRAIN" $base --steps 3 --metrics "$W/twice/metrics.jsonl" > /dev/null 2>&1 &&
    "$TRAIN" $base --steps 4 --lr 5e-4 --metrics "$W/twice/metrics.jsonl" > /dev/null 2>&1 &&
    "$BIN/fsdpc-plot" "$W/twice/metrics.jsonl" --dump - 2> /dev/null |
    "$PY" -c 'import json, sys; print("|".join(r["label"] for r in json.load(sys.stdin)["runs"]))' \
        > "$W/labels"
r=$?
[ $r -eq 0 ] && [ "$(cat "$W/labels")" = "metrics.jsonl run 1|metrics.jsonl run 2 (lr 0.0005, steps 4)" ]
r=$?
tap_ok $r "two runs of one file: labelled $(cat "$W/labels")"

# a record the kill cut short: skipped when a start record or the end follows
cp "$W/crashed/metrics.jsonl" "$W/cut.jsonl"
printf '{"step":61,"loss":3.1,"gra' >> "$W/cut.jsonl"
"$BIN/fsdpc-plot" "$W/cut.jsonl" --dump "$W/cut.json" > /dev/null 2> "$W/cut.err" &&
    grep -q "cut.jsonl:[0-9]*: a record cut short (a run killed while writing it): skipped" "$W/cut.err"
tap_ok $? "a last record cut short is skipped with a warning"
printf '\n{"step":62,"loss":3.0}\n' >> "$W/cut.jsonl"
"$BIN/fsdpc-plot" "$W/cut.jsonl" --dump "$W/cut.json" > /dev/null 2> "$W/cut.err"
rc=$?
[ $rc -eq 1 ] && grep -q "cut.jsonl:[0-9]*: not a JSON record" "$W/cut.err"
tap_ok $? "... but not one in the middle of a launch (rc $rc)"

if "$PY" -c 'import matplotlib' 2> /dev/null; then
    "$BIN/fsdpc-plot" "$W/crashed/metrics.jsonl" "$W/plain/metrics.jsonl" -o "$W/c.png" \
        > "$W/png.out" 2>&1 && [ -s "$W/c.png" ] &&
        grep -qE "c.png: 2 runs, 70 step records(, [0-9]+ superseded by a resume \(drawn faint\))?$" "$W/png.out"
    tap_ok $? "the image: $(cat "$W/png.out")"
else
    tap_skip_dep python3-matplotlib "fsdpc-plot draws with matplotlib"
fi

tap_done
