#!/bin/sh
# test_tp_save.sh - tensor-parallel checkpoint saves by exchange
# (src/parallel/shard_save.c): each rank sends the cuts of its blocks only
# to the ranks that write their rows. For dp=2,tp=2 and tp=2 over tcp and
# mpi, tp=4, dp=3,tp=2 (six shards, uneven rows), tp=3 (an odd count: the
# rounds have byes), rdp=2,dp=1,tp=2 (the second replica writes nothing)
# and tp=2,dp=2 (tp outermost: shard s is not world rank s),
# fsdpc-train writes a checkpoint at step 4 through the exchange and through
# the reduce-scatters (FSDPC_CKPT_TP_SAVE=reduce-scatter, the re-layout it
# replaces), and:
#   - every dataset of every shard file is equal (h5diff -d 0);
#   - every writing rank sent at most 1% (+ 4 KiB) more than its shard of
#     the state (params and AdamW moments), what it sent plus what it kept
#     is exactly that shard less the replicated copies only tp rank 0 sends,
#     and over the ranks that is exactly the checkpoint's bytes (read from
#     its shard files): no cut sent twice, none missing;
#   - the reduce-scatters on dp=2,tp=2 send more than that bound (what the
#     check is for).
# Saves in the background (--ckpt-async on) write the same shards on
# dp=2,tp=2 and, by either method, on rdp=2,dp=1,tp=2; the guarded device
# (tests/train/test_guarded.sh) writes the same shards. Then the exchange
# under FSDPC_DEBUG=DETAIL (each message's count checked
# against its sender's) and a band of one column at a time
# (FSDPC_CKPT_RELAYOUT_BYTES=256) write the same shards, and an unknown
# FSDPC_CKPT_TP_SAVE is one line and no hang. Needs h5py for /usr/bin/python3.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
PY=/usr/bin/python3
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-tpsave.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_FLIGHT_DIR="$W/flight" # a planted hang's dumps stay out of the build tree

if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep h5py "h5py/numpy not importable by $PY"
    tap_done
    exit 0
fi
if ! command -v "$MPIEXEC" > /dev/null 2>&1; then
    tap_skip_dep mpiexec "$MPIEXEC not found"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 40000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 4 --width 32 --vocab 256 --context 32 --seed 6 \
        --untied -o "$W/h4.h5" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --layers 2 --heads 3 --width 24 --vocab 256 --context 32 --seed 7 \
        --untied -o "$W/h3.h5" > "$W/log" 2>&1
tap_ok $? "token file; untied gpt2 models with 4 and 3 heads"

# save NAME NRANKS MODEL MESH BACKEND [ARGS...]: 4 steps and a checkpoint in
# $W/NAME, every rank's re-layout line in $W/NAME.log (environment from the
# caller)
save() {
    s_name=$1 s_n=$2 s_model=$3 s_mesh=$4 s_be=$5
    shift 5
    timeout 90 "$MPIEXEC" -n "$s_n" env FSDPC_LOG=warn,fsdp=debug,train=info FSDPC_LOG_RANKS=all \
        "$TRAIN" --model "$W/$s_model.h5" --data "$W/tok.bin" --seq-len 24 --batch-size 2 \
        --steps 4 --lr 3e-3 --lr-schedule constant --timeout 30 --mesh "$s_mesh" \
        --backend "$s_be" --ckpt-dir "$W/$s_name" "$@" > "$W/$s_name.log" 2>&1
    s_rc=$?
    [ $s_rc -eq 0 ] || tap_diag "$(grep -v DEBUG "$W/$s_name.log" | tail -5)"
    return $s_rc
}

# same A B N: the N shard files of A's and B's step 4, every dataset equal
same() {
    q=0
    while [ "$q" -lt "$3" ]; do
        h5diff -d 0 "$W/$1/step_4/shard_$q.h5" "$W/$2/step_4/shard_$q.h5" > "$W/diff" 2>&1 ||
            { tap_diag "shard $q differs: $(head -3 "$W/diff")"; return 1; }
        q=$((q + 1))
    done
}

# bytes NAME N MODE: the re-layout lines of NAME's N writing ranks against
# the bound and the checkpoint's bytes; MODE over: each rank must pass the
# bound instead (the reduce-scatters)
bytes() {
    "$PY" - "$W/$1.log" "$W/$1/step_4" "$2" "$3" << 'EOF'
import glob, re, sys
import h5py
log, step, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pat = re.compile(r"checkpoint shard (\d+) of \d+ sent (\d+) bytes in \d+ operations and kept "
                 r"(\d+); its state is (\d+) bytes \((\d+) of them copies")
ranks = {}
for line in open(log):
    m = pat.search(line)
    if m:
        ranks[int(m.group(1))] = tuple(int(x) for x in m.groups()[1:])
total = 0
for path in glob.glob(step + "/shard_*.h5"):
    with h5py.File(path, "r") as f:
        def add(name, obj):
            global total
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f":
                total += obj.size * obj.dtype.itemsize
        f.visititems(add)
bad = []
if sorted(ranks) != list(range(n)):
    bad.append("re-layout lines from shards %s, expected 0..%d" % (sorted(ranks), n - 1))
moved = 0
for s, (sent, kept, state, copies) in sorted(ranks.items()):
    bound = 1.01 * state + 4096
    print("shard %d: sent %d, kept %d; state %d (copies %d); bound %.0f"
          % (s, sent, kept, state, copies, bound))
    if mode == "over":
        if sent <= bound:
            bad.append("shard %d sent %d, within the bound" % (s, sent))
        continue
    if sent > bound:
        bad.append("shard %d sent %d bytes, over 1.01 x %d + 4096" % (s, sent, state))
    if sent + kept != state - copies:
        bad.append("shard %d: sent %d + kept %d != state %d - copies %d"
                   % (s, sent, kept, state, copies))
    moved += sent + kept
if mode != "over" and moved != total:
    bad.append("sent and kept over the ranks: %d bytes; the checkpoint holds %d" % (moved, total))
print("checkpoint: %d bytes of state in its shards" % total)
for b in bad:
    print("BAD: " + b)
sys.exit(1 if bad else 0)
EOF
}

# case NAME NRANKS MODEL MESH BACKEND WRITERS
case_run() {
    save "$1" "$2" "$3" "$4" "$5" &&
        FSDPC_CKPT_TP_SAVE=reduce-scatter save "$1_rs" "$2" "$3" "$4" "$5"
    tap_ok $? "$4 over $5: a checkpoint by the exchange and one by the reduce-scatters"
    same "$1" "$1_rs" "$6"
    tap_ok $? "$4 over $5: the exchange writes the reduce-scatters' shards ($6, every dataset)"
    out=$(bytes "$1" "$6" within 2>&1)
    r=$?
    tap_diag "$out"
    tap_ok $r "$4 over $5: each rank sent at most its state (+1%), sent + kept = its state less copies, all = the checkpoint"
}

case_run d2t2tcp 4 h4 dp=2,tp=2 tcp 4
out=$(bytes d2t2tcp_rs 4 over 2>&1)
r=$?
tap_diag "$out"
tap_ok $r "dp=2,tp=2: the reduce-scatters send more than a rank's state (O(model))"
case_run d2t2mpi 4 h4 dp=2,tp=2 mpi 4
case_run t2tcp 2 h4 tp=2 tcp 2
case_run t2mpi 2 h4 tp=2 mpi 2
case_run t4 4 h4 tp=4 mpi 4
case_run d3t2 6 h4 dp=3,tp=2 tcp 6
case_run t3 3 h3 tp=3 tcp 3
case_run hsdp 4 h4 rdp=2,dp=1,tp=2 mpi 2
# tp outermost: the save group's ranks are not in checkpoint-shard order
case_run t2d2 4 h4 tp=2,dp=2 tcp 4

# in the background (--ckpt-async on, a save every 2 steps): the snapshot
# holds this shard's rows after the exchange (or the reduce-scatters) and
# the thread writes the shards a save in the loop writes
for a in "d2t2tcp 4 dp=2,tp=2 tcp exchange" "hsdp 4 rdp=2,dp=1,tp=2 mpi exchange" \
    "hsdp 4 rdp=2,dp=1,tp=2 mpi reduce-scatter"; do
    set -- $a
    FSDPC_CKPT_TP_SAVE=$5 save "bg$1$5" "$2" h4 "$3" "$4" --ckpt-every 2 --ckpt-async on &&
        grep -q "checkpoint step 4 written to .* in the background" "$W/bg$1$5.log" &&
        grep -q "checkpoint step 2 written to .* in the background" "$W/bg$1$5.log" &&
        same "bg$1$5" "$1" "$( [ "$3" = dp=2,tp=2 ] && echo 4 || echo 2)"
    tap_ok $? "$3 over $4, $5, saved in the background: the shards of a save in the loop"
done

# on the guarded device (memory the host cannot read): the cuts are packed
# and placed by the device, the messages staged through host memory
save guarded 4 h4 dp=2,tp=2 tcp --device guarded && same guarded d2t2tcp 4 &&
    save bgguarded 4 h4 dp=2,tp=2 mpi --device guarded --ckpt-every 2 --ckpt-async on &&
    same bgguarded d2t2tcp 4
tap_ok $? "dp=2,tp=2 on the guarded device, in the loop (tcp) and in the background (mpi): the same shards"

FSDPC_DEBUG=DETAIL save detail 4 h4 dp=2,tp=2 tcp && same detail d2t2tcp 4
tap_ok $? "dp=2,tp=2 under FSDPC_DEBUG=DETAIL (every message checked against its sender's): the same shards"
FSDPC_CKPT_RELAYOUT_BYTES=256 save band 4 h4 dp=2,tp=2 mpi && same band d2t2mpi 4 &&
    bytes band 4 within > "$W/out" 2>&1
r=$?
tap_diag "$(tail -2 "$W/out")"
tap_ok $r "dp=2,tp=2 one column at a time: the same shards and bytes within the bound"

FSDPC_CKPT_TP_SAVE=bogus timeout 60 "$MPIEXEC" -n 2 "$TRAIN" --model "$W/h4.h5" --data "$W/tok.bin" \
    --seq-len 24 --batch-size 2 --steps 2 --lr 3e-3 --timeout 30 --mesh tp=2 --backend tcp \
    --ckpt-dir "$W/bogus" > "$W/bogus.log" 2>&1
r=$?
tap_diag "exit $r: $(grep -m1 'FSDPC_CKPT_TP_SAVE' "$W/bogus.log")"
[ $r -ne 0 ] && [ $r -ne 124 ] && grep -q "FSDPC_CKPT_TP_SAVE=bogus: unknown method" "$W/bogus.log"
tap_ok $? "FSDPC_CKPT_TP_SAVE=bogus: one line naming it, no hang"

tap_done
