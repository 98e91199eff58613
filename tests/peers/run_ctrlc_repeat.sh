#!/bin/sh
# run_ctrlc_repeat.sh - Ctrl-C to mpiexec.mpich, N times in a row: each time
# SIGINT goes to the launcher after a few steps (and at a random point of a
# step), and the run must end with a checkpoint that verifies, the ranks'
# "preempted" line, and no launcher abort. Prints one line per try and the
# count. Not part of make check (it takes about a minute per 10 tries).
#
#   BUILD=build tests/peers/run_ctrlc_repeat.sh [N]
set -u
B=${BUILD:-build}
N=${1:-10}
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ctrlc.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
sh "$srcdir/tests/corpus.sh" 300000 > "$W/text"
"$B/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1
"$B/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 -o "$W/m.h5" > /dev/null 2>&1
good=0
for i in $(seq 1 "$N"); do
    d="$W/ck$i"
    mpiexec.mpich -n 2 "$B/fsdpc-train" --model "$W/m.h5" --data "$W/train.bin" --batch-size 4 \
        --seq-len 64 --lr 1e-3 --steps 100000 --backend tcp --ckpt-dir "$d" \
        --metrics "$W/m$i.jsonl" > "$W/o$i" 2>&1 &
    mp=$!
    t=0
    while n=$(cat "$W/m$i.jsonl" 2>/dev/null | grep -c '"loss"'); [ "${n:-0}" -lt 10 ] &&
        [ $t -lt 300 ]; do
        sleep 0.1
        t=$((t + 1))
    done
    sleep "0.0$(( $(od -An -N1 -tu1 /dev/urandom) % 10 ))"
    kill -INT "$mp"
    wait "$mp"
    rc=$?
    ok=no
    if "$B/fsdpc-ckpt" verify "$d" > /dev/null 2>&1 && grep -q '^preempted: ' "$W/o$i" &&
        ! grep -q 'BAD TERMINATION\|assert' "$W/o$i"; then
        ok=yes
        good=$((good + 1))
    fi
    echo "try $i: mpiexec status $rc, checkpoint that verifies and no launcher abort: $ok"
done
echo "$good of $N tries left a checkpoint"
