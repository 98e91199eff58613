#!/bin/sh
# run_ckpt_io_bench.sh - the checkpoint io layer's save and load against dd
# on the same disk with the same number of streams, interleaved.
#
#   tests/peers/run_ckpt_io_bench.sh BUILD_DIR PRESET SHARDS [WORK_DIR] [REPS] [OTHER_BENCH]
#
# Per repetition, each step after `sync; echo 3 > /proc/sys/vm/drop_caches`
# (root; without it the figures are warm-cache and the script says so):
#   - save: tests/ckpt/bench_ckpt_io save (SHARDS processes, one shard file
#     each, every tensor of the preset's model and both AdamW moments, the
#     commit's fsync per file; then index.h5), from all processes ready to
#     index.h5 written, over the step directory's bytes;
#   - dd write: SHARDS parallel `dd if=/dev/zero bs=1M conv=fsync` of the
#     same total size, through the page cache and with oflag=direct;
#   - load: bench_ckpt_io load (SHARDS processes, each opens lazily and reads
#     its rows of every tensor through the checksums, values checked);
#   - dd read: SHARDS parallel `dd of=/dev/null bs=1M` of the dd files,
#     through the page cache and with iflag=direct.
#   - with TRAINER=1 (the gpt2 presets: a model the machine can train), the
#     trainer's own lines: fsdpc-train on SHARDS ranks (tcp), one step then a
#     checkpoint ("checkpoint step 1 written ... GB/s, all ranks, fsync and
#     commit included"), and a --resume of it ("resumed from ... read ...
#     GB/s"), each after the page cache is dropped.
# OTHER_BENCH (a bench_ckpt_io built from another commit) is run the same
# way, interleaved, for a before/after. Medians are printed, with every
# repetition's figure (the spread) and the load average at the start and end.
set -eu
B=$(cd "${1:?usage: run_ckpt_io_bench.sh BUILD_DIR PRESET SHARDS [WORK_DIR] [REPS] [OTHER_BENCH]}" && pwd)
P=${2:?preset}
N=${3:?shards}
W=${4:-${TMPDIR:-/tmp}/fsdpc-ckpt-io-bench}
REPS=${5:-3}
OTHER=${6:-}
BENCH=$B/tests/ckpt/bench_ckpt_io
[ -x "$BENCH" ] || { echo "run_ckpt_io_bench.sh: build $BENCH first (make check builds it)" >&2; exit 1; }
rm -rf "$W"
mkdir -p "$W"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${TRAINER:-0}" = 1 ]; then
    "$B/fsdpc-ckpt" init --preset "$P" --seed 1 -o "$W/model.h5" > /dev/null
    python3 -c '
import struct, sys
n = 1 << 16
sys.stdout.buffer.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
sys.stdout.buffer.write(struct.pack("<%dH" % n, *[(i * 7919) % 50257 for i in range(n)]))
' > "$W/tokens.bin"
fi
can_drop=0
[ -w /proc/sys/vm/drop_caches ] && can_drop=1
drop() { sync; if [ $can_drop = 1 ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }
now() { date +%s.%N; }
rate() { awk -v b="$1" -v a="$2" -v c="$3" 'BEGIN {printf "%.3f", b / (c - a) / 1e9}'; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
run() { # NAME BENCH MODE: seconds of BENCH MODE into $W/NAME.MODE
    d="$W/ck_$1"
    if [ "$3" = save ]; then rm -rf "$d"; mkdir -p "$d"; fi
    drop
    "$2" "$3" "$P" "$d" "$N" > "$W/out" || { cat "$W/out"; exit 1; }
    bytes=$(du -sb "$d" | cut -f1)
    # the program's own seconds: from every process ready (buffers filled)
    # to the last one done (save: index.h5 written too)
    secs=$(sed -n 's/.*with index.h5 \([0-9.]*\) s.*/\1/p; s/^load .*: \([0-9.]*\) s [(].*/\1/p' "$W/out")
    awk -v b="$bytes" -v s="$secs" 'BEGIN {printf "%.3f\n", b / s / 1e9}' >> "$W/$1.$3"
    echo "$bytes" > "$W/bytes"
}
ddw() { # NAME FLAGS: N parallel dd writes of the checkpoint's size, into $W/NAME.save
    bytes=$(cat "$W/bytes"); mib=$((bytes / 1048576 / N))
    drop
    t0=$(now)
    for i in $(seq 1 "$N"); do
        # shellcheck disable=SC2086
        dd if=/dev/zero of="$W/raw$i" bs=1M count=$mib conv=fsync $2 status=none &
    done
    wait; t1=$(now)
    rate $((mib * N * 1048576)) "$t0" "$t1" >> "$W/$1.save"; echo >> "$W/$1.save"
}
ddr() { # NAME FLAGS: N parallel dd reads of those files, into $W/NAME.load
    drop
    t0=$(now)
    for i in $(seq 1 "$N"); do
        # shellcheck disable=SC2086
        dd if="$W/raw$i" of=/dev/null bs=1M $2 status=none &
    done
    wait; t1=$(now)
    rate $(($(cat "$W/bytes") / 1048576 / N * N * 1048576)) "$t0" "$t1" >> "$W/$1.load"; echo >> "$W/$1.load"
}
train() { # args...: fsdpc-train on N ranks
    OPENBLAS_NUM_THREADS=1 "${MPIEXEC:-mpiexec.mpich}" -n "$N" "$B/fsdpc-train" --model "$W/model.h5" \
        --data "$W/tokens.bin" --batch-size 1 --seq-len 64 --lr 1e-4 --backend tcp \
        --peak-flops 1e11 --ckpt-dir "$W/ck_train" "$@" > "$W/train.log" 2>&1 ||
        { cat "$W/train.log"; exit 1; }
}
trainer() { # save and resume, the trainer's own GB/s into $W/train.save, $W/train.load
    rm -rf "$W/ck_train"
    drop
    train --steps 1
    sed -n 's/.*checkpoint step 1 written.*, \([0-9.]*\) GB\/s.*/\1/p' "$W/train.log" >> "$W/train.save"
    drop
    train --steps 2 --resume latest
    sed -n 's/.*resumed from.*, \([0-9.]*\) GB\/s.*/\1/p' "$W/train.log" >> "$W/train.load"
    rm -rf "$W/ck_train"
}
for r in $(seq 1 "$REPS"); do
    if [ "${TRAINER:-0}" = 1 ]; then trainer; fi
    if [ -n "$OTHER" ] && [ $((r % 2)) = 1 ]; then run other "$OTHER" save; fi
    run new "$BENCH" save
    if [ -n "$OTHER" ] && [ $((r % 2)) = 0 ]; then run other "$OTHER" save; fi
    ddw dd ""
    ddw dd_direct "oflag=direct"
    if [ -n "$OTHER" ]; then run other "$OTHER" load; fi
    run new "$BENCH" load
    ddr dd ""
    ddr dd_direct "iflag=direct"
    rm -f "$W"/raw*
    [ -z "$OTHER" ] || rm -rf "$W/ck_other"
done
echo "preset $P, $N streams, checkpoint $(cat "$W/bytes") bytes, $REPS reps, page cache dropped: $can_drop"
echo "load average at the start $load0, at the end $(cut -d' ' -f1-3 /proc/loadavg)"
for f in dd.save dd_direct.save new.save other.save train.save dd.load dd_direct.load new.load other.load train.load; do
    [ -s "$W/$f" ] || continue
    printf "%-10s median %s GB/s  (runs: %s)\n" "$f" "$(grep . "$W/$f" | median)" "$(grep . "$W/$f" | tr '\n' ' ')"
done
rm -rf "$W"
