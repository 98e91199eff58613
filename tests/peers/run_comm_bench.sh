#!/bin/bash
# run_comm_bench.sh - fsdpc-bench side by side with its peers, in one run, on
# one machine: fsdpc's tcp and mpi backends, MPICH's own collectives (default
# transport settings and UCX_TLS variants), Gloo's ring algorithms, and the
# physical limits (loopback TCP between two processes, memcpy on pre-faulted
# and fresh pages). Writes one markdown table per (collective, ranks) with a
# column per implementation, then the limits.
#
#   tests/peers/run_comm_bench.sh --builddir /tmp/build --out comm.md
#   tests/peers/run_comm_bench.sh --builddir /tmp/build --sizes 4,4K,64K --iters 3 \
#       --ranks 2 --mpi-envs 'default' --no-limits          # a dry run in seconds
#
# Every implementation measures the same way (see doc/performance.md): sizes
# in total bytes as in nccl-tests, buffers allocated once and reused, warm-up
# iterations, a barrier, timed iterations each completed on its own, the
# per-rank mean (or median, --stat) and its max over ranks, one checked run.
# Implementations run one after another, never at the same time.
set -u

usage() {
    cat <<'EOF'
usage: run_comm_bench.sh [options]
  --builddir DIR      build directory holding fsdpc-bench (default: .)
  --out FILE          markdown output (default: comm_bench.md)
  --workdir DIR       logs, CSVs and peer binaries (default: a fresh temp dir, kept)
  --ranks "2 3 4"     world sizes to run
  --ops "allreduce allgather reduce_scatter"
  --sizes LIST        sizes in total bytes (default 4,64,1K,4K,64K,1M,16M,64M,256M)
  --iters N           timed iterations per size (default 10)
  --warmup N          warm-up iterations per size (default 3)
  --stat avg|median   which per-rank statistic the tables use (default avg)
  --backends "tcp mpi"            fsdpc backends to run
  --mpi-envs 'default;UCX_TLS=sm,self;UCX_TLS=shm,self;UCX_TLS=tcp,self'
                      MPICH runs, ';'-separated; each is 'default' or VAR=VALUE
                      words set for that run only
  --fsdpc-env 'VAR=VALUE ...'     environment for the fsdpc runs
  --no-gloo           skip Gloo even when libgloo-dev is installed
  --no-limits         skip the loopback TCP and memcpy limits
  --limit-bytes B     bytes per direction for the TCP limit (default 256M)
  --run-timeout S     kill any single run after S seconds (default 900)
EOF
}

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
builddir=.
out=comm_bench.md
workdir=
ranks="2 3 4"
ops="allreduce allgather reduce_scatter"
sizes="4,64,1K,4K,64K,1M,16M,64M,256M"
iters=10
warmup=3
stat=avg
backends="tcp mpi"
mpi_envs='default;UCX_TLS=sm,self;UCX_TLS=shm,self;UCX_TLS=tcp,self'
fsdpc_env=
gloo=1
limits=1
limit_bytes=256M
run_timeout=900
cmdline="$0 $*"

while [ $# -gt 0 ]; do
    case $1 in
    --builddir) builddir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --stat) stat=$2; shift 2 ;;
    --backends) backends=$2; shift 2 ;;
    --mpi-envs) mpi_envs=$2; shift 2 ;;
    --fsdpc-env) fsdpc_env=$2; shift 2 ;;
    --no-gloo) gloo=0; shift ;;
    --no-limits) limits=0; shift ;;
    --limit-bytes) limit_bytes=$2; shift 2 ;;
    --run-timeout) run_timeout=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run_comm_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

MPIEXEC=${MPIEXEC:-mpiexec.mpich}
PYTHON3=${PYTHON3:-python3}
bench=$builddir/fsdpc-bench
if [ ! -x "$bench" ]; then
    echo "run_comm_bench.sh: no fsdpc-bench in '$builddir' (build it, or pass --builddir)" >&2
    exit 2
fi
case $stat in avg | median) ;; *) echo "run_comm_bench.sh: --stat avg|median" >&2; exit 2 ;; esac
[ -n "$workdir" ] || workdir=$(mktemp -d "${TMPDIR:-/tmp}/comm_bench.XXXXXX")
mkdir -p "$workdir/bin" "$workdir/csv" "$workdir/logs" || exit 1
: >"$workdir/runs.txt"

# one thread per rank for every library that would start its own
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

echo "# building the peers into $workdir/bin"
if ! make -s -C "$srcdir/tests/peers" OUT="$workdir/bin" >"$workdir/logs/build.log" 2>&1; then
    echo "run_comm_bench.sh: building the peers failed, see $workdir/logs/build.log" >&2
    exit 1
fi
[ -x "$workdir/bin/gloo_bench" ] || { [ $gloo -eq 1 ] && echo "# Gloo not installed (apt-get install libgloo-dev): skipping it"; gloo=0; }

oplist=$(echo $ops | tr ' ' ',')
gloo_ops=$(for o in $ops; do case $o in allreduce | allgather) printf '%s,' "$o" ;; esac; done)
gloo_ops=${gloo_ops%,}

# run LABEL N ENV -- COMMAND...: one measurement, logged, bounded in time.
# A run that fails quickly is tried once more (Gloo's rendezvous was seen to
# lose a connection now and then); a timeout (124) or MPICH's finalize hang
# (mpi_raw_bench's status 3, results complete) is not.
run() {
    local label=$1 n=$2 envs=$3
    shift 4
    local log="$workdir/logs/$label-n$n.log"
    local t0=$(date +%s) rc tries=0
    echo "# [$(date +%T)] $label, $n ranks ${envs:+($envs)}"
    while :; do
        tries=$((tries + 1))
        env $envs timeout "$run_timeout" "$@" >"$log" 2>&1
        rc=$?
        case $rc in 0 | 3 | 124 | 137) break ;; esac
        [ $tries -lt 2 ] || break
        echo "#   failed with status $rc, trying once more"
        cp "$log" "$log.try$tries"
    done
    echo "$label $n $rc $(($(date +%s) - t0)) $tries" >>"$workdir/runs.txt"
    [ $rc -eq 0 ] || echo "#   failed with status $rc: see $log"
}

start=$(date +%s)
for n in $ranks; do
    for be in $backends; do
        run "fsdpc-$be" "$n" "$fsdpc_env" -- $MPIEXEC -n "$n" "$bench" --backend "$be" \
            --op "$oplist" --sizes "$sizes" --iters "$iters" --warmup "$warmup" \
            --timeout 120 --csv "$workdir/csv/fsdpc-$be-n$n.csv"
    done
    IFS=';' read -r -a variants <<<"$mpi_envs"
    for v in "${variants[@]}"; do
        if [ "$v" = default ] || [ -z "$v" ]; then
            label=mpich envs=
        else
            label="mpich:$(echo "$v" | tr ', ' '+/')" envs=$v
        fi
        run "$label" "$n" "$envs" -- $MPIEXEC -n "$n" "$workdir/bin/mpi_raw_bench" \
            --op "$oplist" --sizes "$sizes" --iters "$iters" --warmup "$warmup" \
            --impl "$label" --csv "$workdir/csv/$label-n$n.csv"
    done
    if [ $gloo -eq 1 ] && [ -n "$gloo_ops" ]; then
        store="$workdir/gloo-store-n$n"
        rm -rf "$store" && mkdir -p "$store"
        run gloo-ring "$n" "" -- $MPIEXEC -n "$n" "$workdir/bin/gloo_bench" --store "$store" \
            --op "$gloo_ops" --sizes "$sizes" --iters "$iters" --warmup "$warmup" \
            --timeout 120 --csv "$workdir/csv/gloo-ring-n$n.csv"
    fi
done
if [ $limits -eq 1 ]; then
    run tcp-loopback 2 "" -- "$workdir/bin/tcp_loopback" --bytes "$limit_bytes" \
        --csv "$workdir/csv/limit-tcp.csv"
    run memcpy 1 "" -- "$workdir/bin/memcpy_bench" --sizes 4K,64K,1M,16M,256M \
        --csv "$workdir/csv/limit-memcpy.csv"
fi
elapsed=$(($(date +%s) - start))

# the machine, for the record
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(uname -n), $(uname -sr), $(nproc --all) CPUs ($(env -u OMP_NUM_THREADS nproc) usable here): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "MPICH: $(mpichversion 2>/dev/null | awk -F'\t' '/Version|Device/ {printf "%s ", $NF}')"
    echo "Gloo: $(dpkg-query -W -f '${Version}' libgloo-dev 2>/dev/null || echo 'not installed')"
    echo "UCX: $(dpkg-query -W -f '${Version}' libucx0 2>/dev/null || echo unknown)"
    echo "transparent hugepages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "command: $cmdline"
    echo "elapsed: ${elapsed} s"
} >"$workdir/machine.txt"

"$PYTHON3" - "$workdir" "$stat" "$iters" "$warmup" "$sizes" >"$out" <<'PY'
import csv, glob, os, sys

workdir, stat, iters, warmup, sizes = sys.argv[1:6]
col = "time_median_us" if stat == "median" else "time_avg_us"

def factor(op, n):
    return {"allreduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)

def human(b):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return "%d %s" % (b >> s, unit)
    return "%d B" % b

rows, impls = {}, []
for path in sorted(glob.glob(os.path.join(workdir, "csv", "*.csv"))):
    if os.path.basename(path).startswith("limit-"):
        continue
    with open(path) as f:
        for r in csv.DictReader(f):
            key = (r["op"], int(r["nranks"]), int(r["size_bytes"]), r["impl"])
            # out of place where the implementation has it (Gloo's allreduce is in place only)
            if key in rows and rows[key]["placement"] == "out":
                continue
            rows[key] = r
            if r["impl"] not in impls:
                impls.append(r["impl"])

# columns in the order the runs were made: fsdpc first, then its peers
run_order = [l.split()[0] for l in open(os.path.join(workdir, "runs.txt"))]
impls.sort(key=lambda i: run_order.index(i) if i in run_order else len(run_order))
print("# Collective comparison\n")
print("```")
print(open(os.path.join(workdir, "machine.txt")).read().rstrip())
print("```\n")
print("Cells: busbw in GB/s (time per iteration in us). Time: per-rank %s of %s timed iterations "
      "after %s warm-up, max over ranks. busbw = size / time x 2(n-1)/n for allreduce, "
      "(n-1)/n for allgather and reduce_scatter (nccl-tests). Sizes are total bytes. "
      "Out-of-place where the implementation offers it; Gloo's allreduce is in place. "
      "A cell with `!` had wrong elements in its checked run.\n" % (stat, iters, warmup))

for op in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
    for n in sorted({k[1] for k in rows if k[0] == op}):
        here = [i for i in impls if any(k[0] == op and k[1] == n and k[3] == i for k in rows)]
        szs = sorted({k[2] for k in rows if k[0] == op and k[1] == n})
        print("## %s, %d ranks\n" % (op, n))
        print("| size | " + " | ".join(here) + " |")
        print("|---:|" + "---:|" * len(here))
        best = {}
        for s in szs:
            cells = []
            for i in here:
                r = rows.get((op, n, s, i))
                if not r:
                    cells.append("")
                    continue
                t = float(r[col])
                bw = s / t * 1e-3 * factor(op, n) if t > 0 else 0.0
                flag = "!" if int(r["wrong"]) > 0 else ""
                cells.append("%.2f (%.1f)%s" % (bw, t, flag))
                best.setdefault(s, []).append((bw, t, i))
            print("| %s | %s |" % (human(s), " | ".join(cells)))
        if szs:
            lo, hi = szs[0], szs[-1]
            fast = min(best[lo], key=lambda x: x[1])
            wide = max(best[hi], key=lambda x: x[0])
            print("\nLowest time at %s: %s (%.1f us). Highest busbw at %s: %s (%.2f GB/s)."
                  % (human(lo), fast[2], fast[1], human(hi), wide[2], wide[0]))
        print()

limits = sorted(glob.glob(os.path.join(workdir, "csv", "limit-*.csv")))
if limits:
    print("## Physical limits on this machine\n")
    print("| limit | test | size | value | unit |")
    print("|---|---|---:|---:|---|")
    for path in limits:
        with open(path) as f:
            for r in csv.DictReader(f):
                print("| %s | %s | %s | %s | %s |" % (r["limit"], r["test"],
                      human(int(r["size_bytes"])), r["value"], r["unit"]))
    print()

print("## Runs\n")
print("| run | ranks | status | seconds | tries |")
print("|---|---:|---:|---:|---:|")
for line in open(os.path.join(workdir, "runs.txt")):
    label, n, rc, secs, tries = line.split()
    print("| %s | %s | %s | %s | %s |" % (label, n, "ok" if rc == "0" else "failed (%s)" % rc,
                                          secs, tries))
PY
status=$?
cat "$out"
echo "# wrote $out; logs and CSVs in $workdir"
exit $status
