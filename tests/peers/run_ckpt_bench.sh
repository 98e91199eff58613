#!/bin/sh
# run_ckpt_bench.sh - checkpoint save/load throughput against the raw
# sequential bandwidth of the same disk, and the memory of the offline tools.
#
#   tests/peers/run_ckpt_bench.sh BUILD_DIR [WORK_DIR] [REPS]
#
# In one run, on the filesystem holding WORK_DIR (default /tmp/fsdpc-ckpt-bench):
#   - raw write: dd if=/dev/zero conv=fsync, one stream of the checkpoint's
#     size and two streams of half each in parallel (the trainer writes one
#     shard per rank, in parallel);
#   - raw read: dd of those files to /dev/null after dropping the page cache
#     (needs root; without it the read figures are warm-cache and say so);
#   - save: gpt2 (124M) preset, 2 ranks, tcp, one step then a checkpoint; the
#     trainer logs the bytes and seconds of the save (all ranks, fsync and
#     commit included);
#   - load: --resume of that checkpoint, cold (page cache dropped) and warm;
#   - fsdpc-ckpt consolidate and reshard (2 -> 3 shards): wall time and peak
#     RSS from /usr/bin/time -v, against the largest tensor (wte, 154 MB).
# Medians over REPS (default 3) repetitions are printed as a Markdown table.
# Not part of `make check`: it writes about 6 GiB and takes a few minutes.
set -eu

B=${1:?usage: run_ckpt_bench.sh BUILD_DIR [WORK_DIR] [REPS]}
B=$(cd "$B" && pwd)
W=${2:-/tmp/fsdpc-ckpt-bench}
REPS=${3:-3}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
for p in fsdpc-train fsdpc-ckpt fsdpc-data; do
    [ -x "$B/$p" ] || { echo "run_ckpt_bench.sh: $B/$p not found" >&2; exit 1; }
done
rm -rf "$W"
mkdir -p "$W"
cd "$W"

can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then can_drop=1; fi
drop() { if [ $can_drop = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }

"$B/fsdpc-ckpt" init --preset gpt2 --seed 1 -o model.h5 > /dev/null
# a token file: the gpt2 vocabulary's ids cycling, enough for a few steps
python3 -c '
import struct, sys
n = 1 << 16
hdr = [20240520, 1, n] + [0] * 253
sys.stdout.buffer.write(struct.pack("<256i", *hdr))
sys.stdout.buffer.write(struct.pack("<%dH" % n, *[(i * 7919) % 50257 for i in range(n)]))
' > tokens.bin

train() { # extra args...
    OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 2 "$B/fsdpc-train" --model model.h5 --data tokens.bin \
        --batch-size 1 --seq-len 64 --lr 1e-4 --backend tcp --peak-flops 1e11 "$@" 2>&1
}

: > save.txt; : > load_cold.txt; : > load_warm.txt; : > ddw1.txt; : > ddw2.txt; : > ddr1.txt
: > ddr2.txt; : > cons_s.txt; : > cons_rss.txt; : > resh_s.txt; : > resh_rss.txt
ck_bytes=0
for r in $(seq 1 "$REPS"); do
    rm -rf ck
    train --steps 1 --ckpt-dir ck > save.log
    line=$(grep "checkpoint step 1 written" save.log) || { cat save.log; exit 1; }
    echo "$line" | sed -n 's/.*in \([0-9.]*\) s, \([0-9.]*\) GB\/s.*/\2/p' >> save.txt
    ck_bytes=$(du -sb ck/step_1 | cut -f1)

    drop
    train --steps 2 --ckpt-dir ck --resume latest > load.log
    grep "resumed from" load.log | sed -n 's/.*in \([0-9.]*\) s, \([0-9.]*\) GB\/s.*/\2/p' >> load_cold.txt
    rm -rf ck/step_2; ln -sfn step_1 ck/latest
    train --steps 2 --ckpt-dir ck --resume latest > load.log
    grep "resumed from" load.log | sed -n 's/.*in \([0-9.]*\) s, \([0-9.]*\) GB\/s.*/\2/p' >> load_warm.txt

    mib=$((ck_bytes / 1048576))
    t0=$(now); dd if=/dev/zero of=raw1 bs=1M count=$mib conv=fsync status=none; t1=$(now)
    echo "$ck_bytes $t0 $t1" | awk '{printf "%.3f\n", $1 / ($3 - $2) / 1e9}' >> ddw1.txt
    t0=$(now)
    dd if=/dev/zero of=raw2a bs=1M count=$((mib / 2)) conv=fsync status=none &
    dd if=/dev/zero of=raw2b bs=1M count=$((mib / 2)) conv=fsync status=none
    wait; t1=$(now)
    echo "$ck_bytes $t0 $t1" | awk '{printf "%.3f\n", $1 / ($3 - $2) / 1e9}' >> ddw2.txt
    drop
    t0=$(now); dd if=raw1 of=/dev/null bs=1M status=none; t1=$(now)
    echo "$ck_bytes $t0 $t1" | awk '{printf "%.3f\n", $1 / ($3 - $2) / 1e9}' >> ddr1.txt
    drop
    t0=$(now)
    dd if=raw2a of=/dev/null bs=1M status=none &
    dd if=raw2b of=/dev/null bs=1M status=none
    wait; t1=$(now)
    echo "$ck_bytes $t0 $t1" | awk '{printf "%.3f\n", $1 / ($3 - $2) / 1e9}' >> ddr2.txt
    rm -f raw1 raw2a raw2b

    rm -f cons.h5
    /usr/bin/time -v "$B/fsdpc-ckpt" consolidate ck/step_1 -o cons.h5 > /dev/null 2> time.txt
    sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' time.txt |
        awk -F: '{print (NF == 3) ? $1 * 3600 + $2 * 60 + $3 : $1 * 60 + $2}' >> cons_s.txt
    sed -n 's/.*Maximum resident set size (kbytes): //p' time.txt >> cons_rss.txt
    rm -rf resh
    /usr/bin/time -v "$B/fsdpc-ckpt" reshard ck/step_1 --world-size 3 -o resh > /dev/null 2> time.txt
    sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' time.txt |
        awk -F: '{print (NF == 3) ? $1 * 3600 + $2 * 60 + $3 : $1 * 60 + $2}' >> resh_s.txt
    sed -n 's/.*Maximum resident set size (kbytes): //p' time.txt >> resh_rss.txt
done

largest=$((50257 * 768 * 4))
echo "checkpoint: $ck_bytes bytes; largest tensor (wte) $largest bytes; page cache dropped: $can_drop; reps $REPS"
echo
echo "| measure | median |"
echo "|---|---|"
echo "| dd write + fsync, 1 stream (GB/s) | $(median < ddw1.txt) |"
echo "| dd write + fsync, 2 streams (GB/s) | $(median < ddw2.txt) |"
echo "| fsdpc save, 2 ranks (GB/s) | $(median < save.txt) |"
echo "| dd read cold, 1 stream (GB/s) | $(median < ddr1.txt) |"
echo "| dd read cold, 2 streams (GB/s) | $(median < ddr2.txt) |"
echo "| fsdpc load cold, 2 ranks (GB/s) | $(median < load_cold.txt) |"
echo "| fsdpc load warm, 2 ranks (GB/s) | $(median < load_warm.txt) |"
echo "| consolidate wall (s) | $(median < cons_s.txt) |"
echo "| consolidate peak RSS (MB) | $(median < cons_rss.txt | awk '{printf "%.0f", $1 * 1024 / 1e6}') |"
echo "| reshard 2->3 wall (s) | $(median < resh_s.txt) |"
echo "| reshard 2->3 peak RSS (MB) | $(median < resh_rss.txt | awk '{printf "%.0f", $1 * 1024 / 1e6}') |"
echo
echo "raw values (one line per repetition):"
paste ddw1.txt ddw2.txt save.txt ddr1.txt ddr2.txt load_cold.txt load_warm.txt cons_s.txt cons_rss.txt resh_s.txt resh_rss.txt
