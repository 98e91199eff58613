#!/bin/sh
# test_pp_bytes.sh - the bytes a pipeline moves between its stages, as each
# rank counts its boundary messages (FSDPC_LOG=fsdp=debug: the comm layer's
# counters, comm/counts.h), against the analytical volume: every boundary
# carries B x T x C floats forward and the same backward per micro-batch (a
# stage after the first receives its input and a stage before the last its
# output's gradient; with sequence parallelism 1/tp of it per tp rank).
# Rank r of P runs stages c P + r for c < V, so under interleaved it sends
# over more boundaries. pp=2 and pp=4 (1f1b), pp=2 interleaved (V 2),
# pp=2 x tp=2 with sequence parallelism; within 1% of the volume, per rank
# and direction, and what the ranks sent equals what they received.
. "$top_srcdir/tests/tap.sh"

BIN="$top_builddir"
TRAIN="$BIN/fsdpc-train"
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
W=$(mktemp -d "${TMPDIR:-/tmp}/fsdpc-ppbytes.XXXXXX")
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1

sh "$top_srcdir/tests/corpus.sh" 30000 > "$W/text"
"$BIN/fsdpc-data" tokenize "$W/text" -o "$W/tok.bin" > "$W/log" 2>&1 &&
    "$BIN/fsdpc-ckpt" init --preset llama-tiny --width 48 --ffn 72 --context 32 --layers 4 \
        --seed 6 --untied -o "$W/m.h5" >> "$W/log" 2>&1
rc=$?
[ $rc -eq 0 ] || tap_diag "$(cat "$W/log")"
tap_ok $rc "fixtures: a token file, llama-tiny with 4 layers (C 48)"

B=2 T=16 C=48 M=4

# volume NAME NRANKS P V TPDIV ARGS...: one step; each pipeline rank's
# logged sends and receives against M x (its boundaries) x B T C / TPDIV x 4
volume() {
    name=$1 n=$2 P=$3 V=$4 div=$5
    shift 5
    FSDPC_LOG=warn,fsdp=debug FSDPC_LOG_RANKS=all timeout 90 "$MPIEXEC" -n "$n" "$TRAIN" --model "$W/m.h5" \
        --data "$W/tok.bin" --batch-size $B --seq-len $T --grad-accum $M --steps 1 --lr 1e-3 \
        --backend tcp "$@" > "$W/$name.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tap_diag "$(tail -5 "$W/$name.log")"
    grep "step 1: boundary messages" "$W/$name.log" |
        sed 's/.*pipeline rank \([0-9]*\) step 1: boundary messages sent \([0-9]*\) (\([0-9]*\) bytes), received \([0-9]*\) (\([0-9]*\) bytes).*/\1 \2 \3 \4 \5/' \
            > "$W/$name.counts"
    awk -v P="$P" -v V="$V" -v M=$M -v msg=$((B * T * C * 4 / div)) -v want="$n" '
        { r = $1; sent = 0; recv = 0; S = P * V
          for (c = 0; c < V; c++) { s = c * P + r
              sent += (s < S - 1) + (s > 0); recv += (s > 0) + (s < S - 1) }
          es = M * sent * msg; er = M * recv * msg
          d1 = es ? ($3 - es) / es : $3; d2 = er ? ($5 - er) / er : $5
          if (d1 > 0.01 || d1 < -0.01 || d2 > 0.01 || d2 < -0.01) {
              printf "# rank %d: sent %d bytes, volume %d; received %d, volume %d\n", r, $3, es, $5, er
              bad = 1 }
          ts += $3; tr += $5; lines++ }
        END { if (lines != want || ts != tr) { printf "# %d ranks counted of %d; sent %d, received %d\n", lines, want, ts, tr; bad = 1 }
              exit bad }' "$W/$name.counts"
    tap_ok $? "$name: each rank's boundary bytes are the analytical volume (within 1%)"
}

volume "pp=2 1f1b" 2 2 1 1 --mesh pp=2 --pp-schedule 1f1b
volume "pp=4 1f1b" 4 4 1 1 --mesh pp=4 --pp-schedule 1f1b
volume "pp=2 interleaved V 2" 2 2 2 1 --mesh pp=2 --pp-schedule interleaved --pp-virtual 2
volume "pp=2 x tp=2, sequence parallel" 4 2 1 2 --mesh pp=2,tp=2 --sequence-parallel on

tap_done
