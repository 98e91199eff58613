#!/bin/sh
# test_nccl_train_paths.sh - the trainer's other paths over the nccl
# backend on the simulated CUDA device (train_nccl_sim, as in
# test_nccl_train_sim.sh, which has the dp/tp meshes): pipeline stages
# (pp=2 and pp=2,dp=2 under gpipe and 1f1b, pp=2 interleaved, pp=2,tp=2:
# boundary messages by send/recv and the stages' sums over nccl), CPU
# offload (pinned host state and its copy stream; at dp=2 and tp=2), checkpoints (saved on
# cuda-sim over nccl in the loop and in the background, tp=2's save
# exchange, a pipeline's rows brought to stage 0, offloaded state) resumed
# on --device cpu --backend mpi and the reverse, Join with uneven per-rank files (also
# under pp=2,dp=2), and mpi and tcp dimensions staged in small chunks
# (FSDPC_STAGE_CHUNK_BYTES) beside an nccl one. Every run is compared with
# --device cpu --backend mpi bit for bit; the order check of the streams
# covers pinned host buffers too.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
SIM="$BIN/tests/backends/train_nccl_sim"
TRAIN="$BIN/fsdpc-train"
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ncclpaths.XXXXXX")
trap 'rm -rf "$W"' EXIT
export FSDPC_LOG=warn
MPIEXEC=$(command -v mpiexec.mpich)
PY=/usr/bin/python3
CMP="$top_srcdir/tests/fsdp/compare_models.py"

if [ -z "$MPIEXEC" ]; then
    tap_skip_dep mpiexec.mpich "the simulated ranks are MPI processes"
    tap_done
    exit 0
fi
if ! "$PY" -c 'import h5py, numpy' > /dev/null 2>&1; then
    tap_skip_dep python3-h5py "the comparisons"
    tap_done
    exit 0
fi

sh "$top_srcdir/tests/corpus.sh" 100000 > "$W/text"
head -c 150 "$W/text" > "$W/t0"
head -c 260 "$W/text" | tail -c 250 > "$W/t1"
head -c 280 "$W/text" > "$W/t2"
head -c 600 "$W/text" | tail -c 410 > "$W/t3"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/train.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-data" tokenize "$W/t0" -o "$W/uneven_0.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-data" tokenize "$W/t1" -o "$W/uneven_1.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-data" tokenize "$W/t2" -o "$W/pp_0.bin" > /dev/null 2>&1 &&
"$BIN/fsdpc-data" tokenize "$W/t3" -o "$W/pp_1.bin" > /dev/null 2>&1 &&
cp "$W/pp_0.bin" "$W/pp_2.bin" && cp "$W/pp_1.bin" "$W/pp_3.bin" &&
"$BIN/fsdpc-ckpt" init --layers 2 --heads 2 --width 32 --context 64 --seed 1 \
    -o "$W/gpt2.h5" > /dev/null 2>&1 &&
"$BIN/fsdpc-ckpt" init --layers 4 --heads 2 --width 32 --context 64 --seed 2 \
    -o "$W/gpt2-4.h5" > /dev/null 2>&1
tap_ok $? "fixtures: a token file, per-rank files (2 and 3 batches; 4 and 6 for pp), GPT-2 (2 and 4 layers)"

# run NAME RANKS DEVICE STEPS ARGS...: a run into $W/NAME.*, fsdpc-train
# on cpu, the simulation's program on cuda-sim (a --model in ARGS wins)
run() {
    r_name=$1 r_n=$2 r_dev=$3 r_steps=$4
    shift 4
    r_prog=$TRAIN
    [ "$r_dev" = cuda-sim ] && r_prog=$SIM
    rm -f "$W/$r_name.jsonl"
    timeout 300 "$MPIEXEC" -n "$r_n" "$r_prog" --device "$r_dev" --model "$W/gpt2.h5" \
        --batch-size 2 --seq-len 32 --steps "$r_steps" --lr 3e-3 --out "$W/$r_name.h5" \
        --metrics "$W/$r_name.jsonl" "$@" > "$W/$r_name.out" 2>&1 || {
        tap_diag "$r_name: $(grep -h '^fsdpc' "$W/$r_name.out" | head -n 3)"
        tap_diag "$(tail -n 2 "$W/$r_name.out")"
        return 1
    }
}

# cmp A B: A's weights and its steps' losses and gradient norms equal B's
# bit for bit, over the steps A logged (a resumed run logs its own)
cmp() {
    "$PY" "$CMP" models "$W/$1.h5" "$W/$2.h5" --tol 0 > "$W/$1.cmp" 2>&1 &&
        "$PY" - "$W/$1.jsonl" "$W/$2.jsonl" >> "$W/$1.cmp" 2>&1 << 'EOF'
import json, sys
def steps(p):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(p))
            if "step" in r and "loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
bad = [s for s in a if a[s] != b.get(s)]
print("steps %s, differing %s" % (sorted(a), bad))
sys.exit(1 if bad or not a else 0)
EOF
    c_rc=$?
    [ $c_rc -eq 0 ] || tap_diag "$1 against $2: $(tail -n 2 "$W/$1.cmp")"
    return $c_rc
}

# same NAME RANKS BACKEND DATA ARGS...: cuda-sim over BACKEND = cpu over mpi
same() {
    s_name=$1 s_n=$2 s_be=$3 s_data=$4
    shift 4
    run "$s_name.cpu" "$s_n" cpu 3 --data "$s_data" --backend mpi "$@" &&
        run "$s_name.sim" "$s_n" cuda-sim 3 --data "$s_data" --backend "$s_be" "$@" &&
        cmp "$s_name.sim" "$s_name.cpu"
    tap_ok $? "nccl (simulated) on cuda-sim = cpu over mpi, bit for bit: $s_name ($s_be) $*"
}

D="$W/train.bin"
# pipeline stages: the boundary messages and the stages' sums over nccl
same pp2.gpipe 2 nccl "$D" --mesh pp=2 --pp-schedule gpipe --grad-accum 2
same pp2.1f1b 2 nccl "$D" --mesh pp=2 --pp-schedule 1f1b --grad-accum 2
same pp2.interleaved 2 nccl "$D" --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 \
    --grad-accum 2 --model "$W/gpt2-4.h5"
same pp2dp2.gpipe 4 nccl "$D" --mesh pp=2,dp=2 --pp-schedule gpipe --grad-accum 2
same pp2dp2.1f1b 4 nccl "$D" --mesh pp=2,dp=2 --pp-schedule 1f1b --grad-accum 4
same pp2tp2 4 nccl "$D" --mesh pp=2,tp=2 --grad-accum 2
# offload: on cpu it changes nothing, so the reference is the plain run
same off.optim 2 nccl "$D" --mesh dp=2 --offload optim
same off.params 2 nccl "$D" --mesh dp=2 --offload params,optim
same off.tp 2 nccl "$D" --mesh tp=2 --offload params,optim
# params,optim with bf16 params: the device's bf16 send, cast after the update's copies
same off.bf16 2 nccl "$D" --mesh dp=2 --offload params,optim --param-dtype bf16
# Join: rank 0 has 2 batches, rank 1 3; the third step is rank 1's alone
same join 2 nccl "$W/uneven_{rank}.bin" --mesh dp=2 --epochs 1 --uneven join
grep -q '"step":3' "$W/join.sim.jsonl" && ! grep -q '"step":4' "$W/join.sim.jsonl"
tap_ok $? "join: the run ends after the longer rank's third batch"
# join under pp=2,dp=2: world ranks 0 and 2 (one replica's two stages)
# have 2 steps of 2 micro-batches, 1 and 3 have 3; the first pipeline
# shadows the second's third step, its stages' agreement summed over nccl
same join.pp 4 nccl "$W/pp_{rank}.bin" --mesh pp=2,dp=2 --grad-accum 2 --epochs 1 --uneven join
grep -q '"step":3' "$W/join.pp.sim.jsonl"
tap_ok $? "join under pp=2,dp=2: the run makes the longer replica's third step"
# staging in chunks of 4 KiB beside nccl (units of tens of KiB: many chunks)
export FSDPC_STAGE_CHUNK_BYTES=4096
same staged.mpi 4 rdp=mpi,dp=nccl "$D" --mesh rdp=2,dp=2
same staged.tcp 4 rdp=tcp,dp=nccl "$D" --mesh rdp=2,dp=2
same staged.tcp.tp 4 dp=tcp,tp=nccl "$D" --mesh dp=2,tp=2
unset FSDPC_STAGE_CHUNK_BYTES

# checkpoints: 4 steps saved at step 2, resumed from step 2 on the other
# device and backend, against the uninterrupted run of 4 steps on cpu
# ck NAME MESH ARGS...: $W/NAME.cpu (uninterrupted, saving as it goes),
# NAME.save.<how> (cuda-sim, sync and async), then the resumes
ck() {
    k_name=$1 k_mesh=$2
    shift 2
    ok=0
    run "$k_name.cpu" 2 cpu 4 --backend mpi --mesh "$k_mesh" --data "$D" "$@" \
        --ckpt-dir "$W/ck.$k_name.cpu" --ckpt-every 2 || ok=1
    for how in off on; do
        run "$k_name.save.$how" 2 cuda-sim 4 --backend nccl --mesh "$k_mesh" --data "$D" "$@" \
            --ckpt-dir "$W/ck.$k_name.$how" --ckpt-every 2 --ckpt-async "$how" || ok=1
        for f in "$W/ck.$k_name.cpu/step_2"/shard_*.h5; do
            h5diff "$f" "$W/ck.$k_name.$how/step_2/${f##*/}" > "$W/diff" 2>&1 || {
                ok=1
                tap_diag "$k_name async $how ${f##*/}: $(head -n 3 "$W/diff")"
            }
        done
        run "$k_name.res.$how" 2 cpu 4 --backend mpi --mesh "$k_mesh" --data "$D" "$@" \
            --resume "$W/ck.$k_name.$how/step_2" && cmp "$k_name.res.$how" "$k_name.cpu" || ok=1
    done
    run "$k_name.res.sim" 2 cuda-sim 4 --backend nccl --mesh "$k_mesh" --data "$D" "$@" \
        --resume "$W/ck.$k_name.cpu/step_2" && cmp "$k_name.res.sim" "$k_name.cpu" || ok=1
    tap_ok $ok "checkpoint $k_name ($k_mesh $*): saved on cuda-sim over nccl (in the loop, in the background) = saved on cpu, resumed on cpu, and the reverse, continue as the run that was not stopped"
}
ck dp2 dp=2
ck tp2 tp=2
ck pp2 pp=2 --grad-accum 2
# offload optim: a resume on cuda-sim fetches the host's master copy again
ck dp2.offload dp=2 --offload optim
# offload with tp: the save exchange copies the host moments and master in
ck tp2.offload tp=2 --offload params,optim
tap_done
