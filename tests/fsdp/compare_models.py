"""compare_models.py - compares two fsdpc model files or two metrics files.

  compare_models.py models A.h5 B.h5 --tol X
      same tensors; ||a - b|| / ||b|| <= X and max|a - b| / max|b| <= X
      over the whole model
  compare_models.py losses A.jsonl B.jsonl --tol X
      per step: the training and validation losses, the gradient norm
      before clipping and, with f16 loss scaling, the loss scale:
      |a - b| / |b| <= X, same steps and keys. A step skipped on overflow
      has no gradient norm (null): it must be skipped in both runs.
      Gradient norms are compared because losses and weights barely see a
      gradient off by a constant factor once clipping or AdamW rescale it.

Prints the worst relative difference; exit status 1 when above the tolerance.
"""
import argparse
import json
import math
import sys


def models(a, b, tol):
    """Relative to the whole model: the L2 norm of the difference over the
    L2 norm of b, and the largest element difference over the largest |b|.
    Per-tensor ratios are not used: the key part of c_attn.bias has an
    analytically zero gradient, so its values follow rounding noise that
    AdamW normalises to full-size steps (doc/sharding.md, tolerances)."""
    import h5py
    import numpy as np
    dsq = bsq = dmax = bmax = 0.0
    where = ""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        na, nb = sorted(fa["model"].keys()), sorted(fb["model"].keys())
        if na != nb:
            print("tensor names differ: %s vs %s" % (na, nb))
            return 1
        for name in na:
            x = np.asarray(fa["model"][name], dtype=np.float64)
            y = np.asarray(fb["model"][name], dtype=np.float64)
            if x.shape != y.shape:
                print("%s: shape %s vs %s" % (name, x.shape, y.shape))
                return 1
            d = np.abs(x - y)
            if not np.all(np.isfinite(d)):
                print("%s: not finite" % name)
                return 1
            dsq += float(np.sum(d * d))
            bsq += float(np.sum(y * y))
            bmax = max(bmax, float(np.max(np.abs(y))))
            if float(np.max(d)) > dmax:
                dmax, where = float(np.max(d)), name
    l2 = math.sqrt(dsq / bsq) if bsq > 0 else math.sqrt(dsq)
    mx = dmax / bmax if bmax > 0 else dmax
    print("models: relative L2 difference %.3g, largest element difference %.3g of max |w| (%s), "
          "tolerance %g" % (l2, mx, where, tol))
    return 0 if l2 <= tol and mx <= tol else 1


STEP_KEYS = ("loss", "val_loss", "grad_norm", "loss_scale")


def read_losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            for key in STEP_KEYS:
                if key in rec:
                    out[(rec["step"], key)] = rec[key]
    return out


def losses(a, b, tol):
    la, lb = read_losses(a), read_losses(b)
    if sorted(la) != sorted(lb) or not la:
        only_a = sorted(set(la) - set(lb))[:6]
        only_b = sorted(set(lb) - set(la))[:6]
        print("steps or keys differ: only in %s: %s; only in %s: %s" % (a, only_a, b, only_b))
        return 1
    worst = {}
    for step in sorted(la):
        x, y = la[step], lb[step]
        if x is None and y is None and step[1] == "grad_norm":
            continue  # skipped in both
        if x is None or y is None:
            print("step %d %s: %s vs %s" % (step[0], step[1], x, y))
            return 1
        rel = abs(x - y) / max(abs(y), 1e-30)
        if rel >= worst.get(step[1], (-1.0, 0))[0]:
            worst[step[1]] = (rel, step[0])
    bad = False
    for key in STEP_KEYS:
        if key in worst:
            rel, step = worst[key]
            print("%s: worst relative difference %.3g (step %d), tolerance %g"
                  % (key, rel, step, tol))
            bad = bad or rel > tol
    print("steps: %d records" % len(la))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["models", "losses"])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, required=True)
    args = ap.parse_args()
    fn = models if args.what == "models" else losses
    return fn(args.a, args.b, args.tol)


if __name__ == "__main__":
    sys.exit(main())
