#!/bin/bash
# run_train_bench.sh - fsdpc-train side by side with PyTorch, in one run, on
# one machine: the bench-small model on one thread (fsdpc vs torch eager,
# alternating rounds, median), the gpt2 124M preset for one or two steps at
# context 1024 (tokens/s and peak RSS), and, once fsdpc-train has a --mesh
# option, 2-rank data parallel runs next to torch DDP over Gloo. Writes
# markdown tables to stdout and to $OUT.
#
#   tests/peers/run_train_bench.sh                       # from a build dir
#   BUILDDIR=/tmp/build OUT=train.md tests/peers/run_train_bench.sh
#   STEPS=6 WARMUP=2 ROUNDS=1 GPT2=0 tests/peers/run_train_bench.sh   # dry run
#
# Settings (environment):
#   BUILDDIR     build directory holding fsdpc-train, fsdpc-ckpt, fsdpc-data [.]
#   OUT          markdown output [./train-bench.md]
#   WORKDIR      models, token file, logs [a fresh temp dir, kept]
#   STEPS        steps per bench-small run [30]
#   WARMUP       leading steps left out of each run's median step time [5]
#   ROUNDS       bench-small rounds; each runs fsdpc then torch [3]
#   BATCH, SEQ   bench-small sequences per step (per rank) and length [4, 256]
#   GPT2         1: the gpt2 section, 0: skip it [1]
#   GPT2_STEPS   steps of the gpt2 runs (the last one is reported) [2]
#   GPT2_SEQ     tokens per gpt2 sequence (batch 1) [1024]
#   TORCH_GPT2   1: also the torch peer on gpt2 [1]
#   DIST         auto: the 2-rank section when `fsdpc-train --help` mentions
#                --mesh; 1: always; 0: never [auto]
#   DIST_BACKENDS  fsdpc backends of the 2-rank section ["tcp mpi"]
#   DIST_FLAGS   fsdpc-train flags of a 2-rank run, {b} = backend
#                ["--mesh dp=2 --backend {b}"]
#   PYTHON       interpreter with torch [/usr/bin/python3]
#   RUN_TIMEOUT  seconds before any single run is killed [900]
#
# Method (doc/performance.md, "Training"): every run is one process per rank
# with ONE BLAS/OpenMP thread (OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=
# MKL_NUM_THREADS=1), runs never overlap, a run's figure is the median step
# time after WARMUP steps, and the table gives the median over rounds with
# the range. MFU uses fsdpc's FLOPs per token (6N + 12LCT, N without wpe) and
# the peak of fsdpc-train's single-thread sgemm probe (the best over its
# runs), for both columns.
# With the defaults a full run takes about 6-8 minutes on 2 cores.
set -u

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
builddir=${BUILDDIR:-.}
out=${OUT:-./train-bench.md}
workdir=${WORKDIR:-}
steps=${STEPS:-30}
warmup=${WARMUP:-5}
rounds=${ROUNDS:-3}
batch=${BATCH:-4}
seq=${SEQ:-256}
gpt2=${GPT2:-1}
gpt2_steps=${GPT2_STEPS:-2}
gpt2_seq=${GPT2_SEQ:-1024}
torch_gpt2=${TORCH_GPT2:-1}
dist=${DIST:-auto}
dist_backends=${DIST_BACKENDS:-tcp mpi}
dist_flags=${DIST_FLAGS:-"--mesh dp=2 --backend {b}"}
python=${PYTHON:-/usr/bin/python3}
run_timeout=${RUN_TIMEOUT:-900}
mpiexec=${MPIEXEC:-mpiexec.mpich}
lr=3e-4

die() { echo "run_train_bench.sh: $*" >&2; exit 2; }

is_uint() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
for v in steps warmup rounds batch seq gpt2_steps gpt2_seq run_timeout; do
    is_uint "${!v}" || die "${v^^}=${!v}: not a non-negative integer"
done
[ "$steps" -gt "$warmup" ] || die "STEPS=$steps must be larger than WARMUP=$warmup"
[ "$rounds" -ge 1 ] || die "ROUNDS=$rounds: at least 1"
[ "$gpt2_steps" -ge 1 ] || die "GPT2_STEPS=$gpt2_steps: at least 1"
case $dist in auto | 0 | 1) ;; *) die "DIST=$dist: auto, 0 or 1" ;; esac

builddir=$(cd "$builddir" 2>/dev/null && pwd) || die "BUILDDIR ${BUILDDIR:-.}: no such directory"
for p in fsdpc-train fsdpc-ckpt fsdpc-data; do
    [ -x "$builddir/$p" ] || die "$builddir/$p: not built (set BUILDDIR to a build directory)"
done
"$python" -c 'import torch, numpy, h5py' 2>/dev/null ||
    die "$python cannot import torch, numpy and h5py (Debian: python3-torch python3-h5py)"
timev=/usr/bin/time
if ! "$timev" -v true >/dev/null 2>&1; then
    echo "note: GNU time is missing (apt-get install time): peak RSS from the programs' own getrusage" >&2
    timev=
fi
if [ -z "$workdir" ]; then
    workdir=$(mktemp -d /tmp/train-bench.XXXXXX) || die "cannot make a work directory"
fi
mkdir -p "$workdir" || die "WORKDIR $workdir: cannot create"
workdir=$(cd "$workdir" && pwd)

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
manifest=$workdir/runs.tsv
: >"$manifest"
t_start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# run NAME SECTION IMPL ROUND METRICS -- command...: runs one program under
# timeout and GNU time, logs to $workdir/NAME.log, appends a manifest row.
run() {
    local name=$1 section=$2 impl=$3 round=$4 metrics=$5
    shift 6
    local log=$workdir/$name.log tfile=$workdir/$name.time t0 t1 rc
    echo "== $name: $*" >&2
    t0=$(date +%s.%N)
    if [ -n "$timev" ]; then
        timeout "$run_timeout" "$timev" -v -o "$tfile" "$@" >"$log" 2>&1
    else
        timeout "$run_timeout" "$@" >"$log" 2>&1
    fi
    rc=$?
    t1=$(date +%s.%N)
    [ $rc -eq 0 ] || { echo "   failed with status $rc; last lines of $log:" >&2; tail -n 5 "$log" >&2; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$section" "$impl" "$round" "$rc" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$log" "$tfile" "$metrics" >>"$manifest"
}

# ----------------------------------------------------------------------------
# inputs: a byte-level token file from the repository's own sources, models

echo "== work directory: $workdir" >&2
find "$srcdir/src" "$srcdir/backends" "$srcdir/io" "$srcdir/tests" "$srcdir/doc" -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.md' -o -name '*.sh' -o -name '*.py' \) \
    -print0 | LC_ALL=C sort -z | xargs -0 cat >"$workdir/corpus.txt"
"$builddir/fsdpc-data" tokenize "$workdir/corpus.txt" -o "$workdir/tokens.bin" >&2 ||
    die "fsdpc-data tokenize failed"
"$builddir/fsdpc-ckpt" init --preset bench-small -o "$workdir/bench-small.h5" >&2 ||
    die "fsdpc-ckpt init --preset bench-small failed"

train=("$builddir/fsdpc-train" --data "$workdir/tokens.bin" --lr "$lr" --log-every 1)
torch_args=(--data "$workdir/tokens.bin" --lr "$lr")

# ----------------------------------------------------------------------------
# bench-small, 1 process x 1 thread: fsdpc and torch alternately

for r in $(seq 1 "$rounds"); do
    m=$workdir/small-fsdpc-$r.jsonl
    rm -f "$m"
    run "small-fsdpc-$r" small fsdpc "$r" "$m" -- "${train[@]}" --model "$workdir/bench-small.h5" \
        --steps "$steps" --batch-size "$batch" --seq-len "$seq" --threads 1 --metrics "$m"
    run "small-torch-$r" small torch "$r" - -- "$python" "$srcdir/tests/peers/torch_train_bench.py" \
        "${torch_args[@]}" --model "$workdir/bench-small.h5" --steps "$steps" \
        --warmup-steps "$warmup" --batch-size "$batch" --seq-len "$seq"
done

# ----------------------------------------------------------------------------
# gpt2 124M, context 1024, batch 1: a step or two, tokens/s and peak RSS

if [ "$gpt2" = 1 ]; then
    if "$builddir/fsdpc-ckpt" init --preset gpt2 -o "$workdir/gpt2.h5" >&2; then
        m=$workdir/gpt2-fsdpc.jsonl
        rm -f "$m"
        run gpt2-fsdpc gpt2 fsdpc 1 "$m" -- "${train[@]}" --model "$workdir/gpt2.h5" \
            --steps "$gpt2_steps" --batch-size 1 --seq-len "$gpt2_seq" --threads 1 --metrics "$m"
        if [ "$torch_gpt2" = 1 ]; then
            run gpt2-torch gpt2 torch 1 - -- "$python" "$srcdir/tests/peers/torch_train_bench.py" \
                "${torch_args[@]}" --model "$workdir/gpt2.h5" --steps "$gpt2_steps" \
                --warmup-steps $((gpt2_steps - 1)) --batch-size 1 --seq-len "$gpt2_seq"
        fi
        rm -f "$workdir/gpt2.h5" # 500 MB
    else
        echo "   fsdpc-ckpt init --preset gpt2 failed: gpt2 section skipped" >&2
    fi
fi

# ----------------------------------------------------------------------------
# 2 ranks x 1 thread, data parallel: fsdpc backends and torch DDP (Gloo)

if [ "$dist" = auto ]; then
    if "$builddir/fsdpc-train" --help 2>&1 | grep -q -- '--mesh'; then dist=1; else dist=0; fi
    [ "$dist" = 1 ] || echo "== 2-rank section skipped: fsdpc-train has no --mesh option" >&2
fi
if [ "$dist" = 1 ]; then
    for r in $(seq 1 "$rounds"); do
        for b in $dist_backends; do
            m=$workdir/dp2-$b-$r.jsonl
            rm -f "$m"
            # each rank under its own GNU time, its file named by hydra's PMI_RANK
            rankwrap=()
            if [ -n "$timev" ]; then
                # shellcheck disable=SC2016
                rankwrap=(sh -c 'exec /usr/bin/time -v -o "$0.$PMI_RANK" "$@"' "$workdir/dp2-$b-$r.rank")
            fi
            # shellcheck disable=SC2086
            run "dp2-$b-$r" dp2 "fsdpc-$b" "$r" "$m" -- "$mpiexec" -n 2 "${rankwrap[@]}" \
                "${train[@]}" ${dist_flags//\{b\}/$b} --model "$workdir/bench-small.h5" \
                --steps "$steps" --batch-size "$batch" --seq-len "$seq" --threads 1 --metrics "$m"
        done
        run "dp2-torch-$r" dp2 torch-ddp "$r" - -- "$python" "$srcdir/tests/peers/torch_ddp_bench.py" \
            "${torch_args[@]}" --nproc 2 --model "$workdir/bench-small.h5" --steps "$steps" \
            --warmup-steps "$warmup" --batch-size "$batch" --seq-len "$seq"
    done
fi

# ----------------------------------------------------------------------------
# tables

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
t_total=$(($(date +%s) - t_start))
{
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "cores=$(getconf _NPROCESSORS_ONLN)" # nproc would honour OMP_NUM_THREADS=1
    echo "kernel=$(uname -r)"
    echo "host=$(hostname)"
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "load_start=$load_start"
    echo "load_end=$load_end"
    echo "elapsed=$t_total"
    blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null)
    echo "blas=$blas"
    # Debian's libblas.so.3 alternative lives in the directory of its variant
    case $blas in
    */openblas-*/*) pkg=libopenblas0-${blas#*/openblas-}; pkg=${pkg%%/*} ;;
    *) pkg= ;;
    esac
    echo "openblas=${pkg:+$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)}"
    echo "fsdpc_version=$("$builddir/fsdpc-ckpt" --help 2>&1 | sed -n 's/.*(fsdpc \(.*\)).*/\1/p' | head -n1)"
    echo "git=$(git -C "$srcdir" describe --always --dirty 2>/dev/null)"
    echo "settings=STEPS=$steps WARMUP=$warmup ROUNDS=$rounds BATCH=$batch SEQ=$seq GPT2=$gpt2 GPT2_STEPS=$gpt2_steps GPT2_SEQ=$gpt2_seq TORCH_GPT2=$torch_gpt2 DIST=$dist"
    echo "tokens=$workdir/tokens.bin"
    echo "workdir=$workdir"
} >"$workdir/machine.txt"

"$python" - "$workdir" "$warmup" >"$workdir/report.md" <<'PYEOF' || die "report failed (logs in $workdir)"
# Reads runs.tsv, the logs, metrics and GNU time files of one run and
# prints the markdown tables. argv: WORKDIR WARMUP
import glob
import json
import os
import re
import statistics
import sys

work, warmup = sys.argv[1], int(sys.argv[2])
machine = dict(line.rstrip("\n").split("=", 1) for line in open(os.path.join(work, "machine.txt")))


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, spec="%.0f", none="-"):
    return none if x is None else spec % x


def rss_mib(path):
    try:
        for line in open(path):
            if "Maximum resident set size" in line:
                return int(line.rsplit(":", 1)[1]) / 1024.0
    except OSError:
        pass
    return None


def fsdpc_run(row, section):
    """Median step of the metrics file after the warm-up (gpt2: the last step)."""
    out = {"ok": False}
    header = open(row["log"], errors="replace").read()
    m = re.search(r"peak ([0-9.]+) GFLOP/s per rank", header)
    out["peak"] = float(m.group(1)) * 1e9 if m else None
    m = re.search(r"([0-9.]+) MFLOP per token", header)
    out["fpt"] = float(m.group(1)) * 1e6 if m else None
    steps = []
    try:
        for line in open(row["metrics"]):
            rec = json.loads(line)
            if "ms" in rec:
                steps.append(rec)
    except (OSError, ValueError):
        return out
    if not steps:
        return out
    step_tokens = steps[0]["tokens"]
    timed = steps[-1:] if section == "gpt2" else steps[warmup:]
    if not timed:
        return out
    out["ms"] = med([s["ms"] for s in timed])
    out["ms_first"] = steps[0]["ms"]
    out["tps"] = step_tokens / (out["ms"] / 1e3)
    out["loss1"] = steps[0]["loss"]
    out["rss"] = [rss_mib(row["time"])]
    ranks = sorted(glob.glob(os.path.join(work, row["name"] + ".rank.*")))
    if ranks:
        out["rss"] = [rss_mib(p) for p in ranks]
    if out["rss"] == [None]:
        out["rss"] = [max(s["mem_mib"] for s in steps)]
    out["ok"] = row["rc"] == "0"
    return out


def torch_run(row, section):
    out = {"ok": False}
    res = None
    for line in open(row["log"], errors="replace"):
        if line.startswith("result "):
            res = json.loads(line[len("result "):])
    if res is None:
        return out
    out["ms"] = res["median_ms"]
    out["tps"] = res["tokens_per_s"]
    out["fpt"] = res["flops_per_token"]
    out["loss1"] = res["loss_first"]
    m = [float(x) for x in re.findall(r"^step 1/\d+ .*\| ([0-9.]+) ms$", open(row["log"]).read(), re.M)]
    out["ms_first"] = m[0] if m else None
    if "peak_rss_mib_per_rank" in res:
        out["rss"] = res["peak_rss_mib_per_rank"]
    else:
        r = rss_mib(row["time"])
        out["rss"] = [r if r is not None else res["peak_rss_mib"]]
    out["ok"] = row["rc"] == "0"
    return out


rows = []
for line in open(os.path.join(work, "runs.tsv")):
    f = line.rstrip("\n").split("\t")
    row = dict(zip(("name", "section", "impl", "round", "rc", "secs", "log", "time", "metrics"), f))
    row["res"] = (fsdpc_run if row["metrics"] != "-" else torch_run)(row, row["section"])
    rows.append(row)

peaks = [r["res"]["peak"] for r in rows if r["res"].get("peak")]
# Load only ever lowers a probe, so the best of the runs' probes is the
# closest to this machine's peak.
peak = max(peaks) if peaks else None


mfus = []


def mfu(tps, fpt, ranks=1):
    if not (tps and fpt and peak):
        return None
    mfus.append(100.0 * tps * fpt / (ranks * peak))
    return mfus[-1]


def impls(section):
    seen = []
    for r in rows:
        if r["section"] == section and r["impl"] not in seen:
            seen.append(r["impl"])
    return seen


def label(impl):
    return {"fsdpc": "fsdpc-train", "torch": "torch %s eager" % torch_version,
            "torch-ddp": "torch %s DDP (Gloo)" % torch_version}.get(impl, impl.replace(
                "fsdpc-", "fsdpc-train --backend "))


torch_version = "?"
for r in rows:
    for line in open(r["log"], errors="replace"):
        m = re.match(r"# torch (\S+)", line)
        if m:
            torch_version = m.group(1)
            break

p = print
p("## Training benchmark: fsdpc-train and PyTorch")
p()
p("- machine: %s, %s cores, Linux %s (%s)" % (machine["cpu"], machine["cores"], machine["kernel"],
                                              machine["host"]))
p("- date: %s; load average at start %s, at end %s; %s s in all" %
  (machine["date"], machine["load_start"], machine["load_end"], machine["elapsed"]))
p("- BLAS: %s (%s), used by fsdpc and by torch; torch %s from Debian" %
  (machine["openblas"] or "?", machine["blas"] or "?", torch_version))
p("- fsdpc %s, tree %s" % (machine["fsdpc_version"] or "?", machine["git"] or "?"))
p("- settings: %s; 1 BLAS/OpenMP thread per process" % machine["settings"])
p("- peak for MFU: %s GFLOP/s per process, fsdpc-train's sgemm 1024^3 probe (1 thread), "
  "best of its %d runs' probes" % (fmt(peak and peak / 1e9, "%.1f"), len(peaks)))
p()


def small_table(section, title, ranks):
    names = impls(section)
    if not names:
        return
    p("### " + title)
    p()
    p("| implementation | tokens/s | range over rounds | step ms | MFU | peak RSS MiB%s | loss step 1 | rounds ok |" %
      (" per rank" if ranks > 1 else ""))
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    tps_by = {}
    loss1 = {}
    for impl in names:
        rs = [r["res"] for r in rows if r["section"] == section and r["impl"] == impl]
        ok = [x for x in rs if x["ok"]]
        tps = [x["tps"] for x in ok]
        tps_by[impl] = med(tps)
        fpt = next((x["fpt"] for x in ok if x.get("fpt")), None)
        nrank = max((len(x["rss"]) for x in ok), default=0)
        rss = [max(x["rss"][i] or 0 for x in ok) for i in range(nrank)]
        loss1[impl] = ok[0]["loss1"] if ok else None
        p("| %s | %s | %s | %s | %s | %s | %s | %d/%d |" % (
            label(impl), fmt(med(tps)),
            ("%.0f-%.0f" % (min(tps), max(tps))) if tps else "-",
            fmt(med([x["ms"] for x in ok]), "%.1f"),
            fmt(mfu(med(tps), fpt, ranks), "%.1f%%"),
            " / ".join("%.0f" % v for v in rss) or "-",
            fmt(loss1[impl], "%.4f"), len(ok), len(rs)))
    p()
    fs = [i for i in names if i.startswith("fsdpc")]
    ts = [i for i in names if i.startswith("torch")]
    for f in fs:
        for t in ts:
            if tps_by.get(f) and tps_by.get(t):
                p("%s / %s: **%.2fx** tokens/s" % (label(f), label(t), tps_by[f] / tps_by[t]))
            if loss1.get(f) is not None and loss1.get(t) is not None:
                d = abs(loss1[f] - loss1[t])
                if d > 1e-2:
                    p("WARNING: step-1 losses differ by %.4f: the two do not train the same "
                      "model on the same data" % d)
    p()


def gpt2_table():
    names = impls("gpt2")
    if not names:
        return
    p("### gpt2 (124M), batch 1 x %s tokens, 1 process x 1 thread" %
      re.search(r"GPT2_SEQ=(\d+)", machine["settings"]).group(1))
    p()
    p("| implementation | step 1 ms | last step ms | tokens/s (last step) | MFU | peak RSS MiB | loss step 1 | status |")
    p("|---|---:|---:|---:|---:|---:|---:|---|")
    for impl in names:
        for r in rows:
            if r["section"] != "gpt2" or r["impl"] != impl:
                continue
            x = r["res"]
            p("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                label(impl), fmt(x.get("ms_first"), "%.0f"), fmt(x.get("ms"), "%.0f"),
                fmt(x.get("tps")), fmt(mfu(x.get("tps"), x.get("fpt")), "%.1f%%"),
                fmt(x.get("rss") and x["rss"][0], "%.0f"), fmt(x.get("loss1"), "%.4f"),
                "ok" if x["ok"] else "failed (status %s)" % r["rc"]))
    p()
    p("The last step is after the first has faulted in every buffer; peak RSS is GNU time's "
      "maximum resident set size of the whole process (for torch, the interpreter and libraries too).")
    p()


small_table("small", "bench-small (3.3M), batch %s, 1 process x 1 thread, median of rounds" %
            re.search(r"BATCH=(\d+) SEQ=(\d+)", machine["settings"]).group(0).replace(
                "BATCH=", "").replace(" SEQ=", " x "), 1)
gpt2_table()
small_table("dp2", "bench-small, 2 ranks x 1 thread, data parallel (global tokens/s), median of rounds", 2)

if any(m > 100.0 for m in mfus):
    p("Note: an MFU above 100%% means the sgemm probe ran while the machine was busy and "
      "measured a peak below the real one (%s GFLOP/s); rerun on a quiet machine." %
      fmt(peak and peak / 1e9, "%.1f"))
    p()
p("### Runs")
p()
p("| run | status | seconds | log |")
p("|---|---|---:|---|")
for r in rows:
    p("| %s | %s | %s | %s |" % (r["name"], "ok" if r["rc"] == "0" else "failed (%s)" % r["rc"],
                                r["secs"], os.path.basename(r["log"])))
p()
p("Logs, metrics and GNU time files: `%s`." % machine["workdir"])
PYEOF
cat "$workdir/report.md"
cp "$workdir/report.md" "$out" || die "OUT $out: cannot write"
echo "== tables written to $out (logs in $workdir, $t_total s)" >&2
