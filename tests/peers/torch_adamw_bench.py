#!/usr/bin/env python3
"""torch.optim.AdamW over one flat f32 shard on the CPU, in elements per
second: the peer of tests/bench/bench_adamw.c (run both with
tests/peers/run_adamw_bench.sh).

Measured as bench_adamw measures: per size, one parameter of n elements
with its gradient set (values in [-1, 1)), lr 1e-3, betas (0.9, 0.95), eps
1e-8, weight decay 0.1; warm-up steps (the first creates the state), then
each optimizer.step() timed alone, median. torch.set_num_threads(threads)
and nothing else runs in the process.

Implementations: foreach (foreach=True, the multi-tensor path), single
(foreach=False, one tensor op after another) and fused (fused=True), the
last only where this torch's AdamW accepts fused on the CPU (torch >= 2.4);
where it does not, the line says so.

Output: one line per size and implementation,
  torch <impl> <elements> <threads> <ms/step> <Melem/s>
"""
import argparse
import inspect
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # the driver reports the skip
    print(f"torch_adamw_bench: cannot import torch ({e}); install python3-torch", file=sys.stderr)
    sys.exit(77)


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"bad size '{s}' (elements, e.g. 1M)")


def make_opt(impl, param):
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if impl == "fused":
        if "fused" not in inspect.signature(torch.optim.AdamW.__init__).parameters:
            return None
        kw["fused"] = True
    else:
        kw["foreach"] = impl == "foreach"
    try:
        return torch.optim.AdamW([param], **kw)
    except (RuntimeError, ValueError):  # fused without a CPU kernel
        return None


def bench(impl, n, warmup, iters):
    gen = torch.Generator().manual_seed(42)
    param = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
    param.grad = torch.rand(n, generator=gen) * 2 - 1
    opt = make_opt(impl, param)
    if opt is None:
        return None
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    if not bool(torch.isfinite(param).all()):
        print(f"torch_adamw_bench: {impl} n={n}: non-finite parameters", file=sys.stderr)
        sys.exit(1)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--impl", default="foreach,single,fused",
                    help="comma-separated: foreach, single, fused")
    ap.add_argument("sizes", nargs="+", type=parse_size)
    a = ap.parse_args()
    impls = a.impl.split(",")
    if a.threads < 1 or a.iters < 1 or a.warmup < 1 or any(i not in ("foreach", "single", "fused")
                                                           for i in impls):
        ap.error("--threads, --iters and --warmup must be >= 1; --impl from foreach,single,fused")
    torch.set_num_threads(a.threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{a.warmup} warm-up + {a.iters} timed steps per size, median")
    for n in a.sizes:
        for impl in impls:
            t = bench(impl, n, a.warmup, a.iters)
            if t is None:
                print(f"# torch {impl}: not available for CPU tensors in torch {torch.__version__}")
                continue
            print(f"torch {impl} {n} {a.threads} {t * 1e3:.3f} {n / t * 1e-6:.1f}", flush=True)


if __name__ == "__main__":
    main()
