#!/usr/bin/env python3
"""fsdpc-plot - training curves from fsdpc-train metrics files.

    fsdpc-plot metrics.jsonl [more.jsonl ...] -o curves.png

Draws, against the step, the training loss (and the validation loss where
there is one), the learning rate, tokens per second and the gradient norm,
one line per run, several runs overlaid. A metrics file may hold several
runs appended to it (each starts with a start record); a run that resumed
from a checkpoint continues the line of the run before it in the same file.
The output format follows the name (png, svg, pdf). Needs matplotlib
(Debian: python3-matplotlib).
"""

import argparse
import json
import os
import sys

VERSION = "@PACKAGE_VERSION@"


class PlotError(Exception):
    pass


class Series:
    """One line on the plot: a run, or a run and the resumes that continued it."""

    def __init__(self, label):
        self.label = label
        self.steps, self.loss, self.lr, self.tps, self.norm = [], [], [], [], []
        self.val_steps, self.val_loss = [], []

    def add(self, rec):
        if "loss" in rec:
            self.steps.append(rec["step"])
            self.loss.append(rec["loss"])
            self.lr.append(rec.get("lr"))
            self.tps.append(rec.get("tokens_per_s"))
            self.norm.append(rec.get("grad_norm"))
        elif "val_loss" in rec:
            self.val_steps.append(rec["step"])
            self.val_loss.append(rec["val_loss"])


def read_runs(path):
    """The series of one metrics file, in the order they were written."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise PlotError("%s: %s" % (path, e.strerror)) from None
    base = os.path.basename(path)
    runs, cur = [], None
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise PlotError("%s:%d: not a JSON record (%s)" % (path, n, e)) from None
            if not isinstance(rec, dict):
                raise PlotError("%s:%d: not a JSON object" % (path, n))
            if rec.get("event") == "start":
                if cur is None or rec.get("resumed_from") is None:
                    label = base if not runs else "%s (run %d)" % (base, len(runs) + 1)
                    cur = Series(label)
                    runs.append(cur)
                continue
            if "step" not in rec or not isinstance(rec["step"], (int, float)):
                raise PlotError("%s:%d: a record without a step" % (path, n))
            if cur is None:  # written before start records existed
                cur = Series(base)
                runs.append(cur)
            cur.add(rec)
    runs = [r for r in runs if r.steps or r.val_steps]
    if not runs:
        raise PlotError("%s: no step records (is it the file of fsdpc-train --metrics?)" % path)
    return runs


def parse_size(text):
    try:
        w, h = (float(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not WIDTHxHEIGHT in inches, e.g. 12x8" % text)
    if not (0 < w <= 100 and 0 < h <= 100):
        raise argparse.ArgumentTypeError("'%s': each side must be in (0, 100] inches" % text)
    return (w, h)


def points(xs, ys):
    """The pairs whose value is a number (null: a skipped step, a non-finite value)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if isinstance(y, (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def need_matplotlib(argv):
    """Imports matplotlib; where this interpreter has none (a virtual environment
    on PATH), runs again under the system's, which Debian's package serves."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get("FSDPC_PLOT_REEXEC")):
        os.environ["FSDPC_PLOT_REEXEC"] = "1"
        os.execv(system, [system, os.path.abspath(__file__)] + argv)
    raise PlotError("needs matplotlib (Debian: apt-get install python3-matplotlib)")


def draw(series, out, size, dpi, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=size, dpi=dpi, sharex=True)
    (ax_loss, ax_lr), (ax_tps, ax_norm) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(series):
        c = colors[i % len(colors)]
        ax_loss.plot(*points(s.steps, s.loss), color=c, lw=1.2, label=s.label + " train")
        if s.val_steps:
            ax_loss.plot(*points(s.val_steps, s.val_loss), color=c, lw=1.2, ls="--", marker="o",
                         ms=3, label=s.label + " val")
        ax_lr.plot(*points(s.steps, s.lr), color=c, lw=1.2, label=s.label)
        ax_tps.plot(*points(s.steps, s.tps), color=c, lw=1.0, label=s.label)
        ax_norm.plot(*points(s.steps, s.norm), color=c, lw=1.0, label=s.label)
    for ax, name in ((ax_loss, "loss (nats per token)"), (ax_lr, "learning rate"),
                     (ax_tps, "tokens/s (all ranks)"), (ax_norm, "gradient norm (before clipping)")):
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    ax_tps.set_xlabel("step")
    ax_norm.set_xlabel("step")
    ax_loss.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=dpi)
    except (OSError, ValueError) as e:
        raise PlotError("%s: %s" % (out, getattr(e, "strerror", None) or e)) from None
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(
        prog="fsdpc-plot",
        description="Training curves (loss, validation loss, learning rate, tokens/s, gradient "
                    "norm) from fsdpc-train --metrics files, several runs overlaid.")
    ap.add_argument("files", nargs="+", metavar="METRICS.jsonl")
    ap.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="image to write; the format follows the name (png, svg, pdf)")
    ap.add_argument("--size", type=parse_size, default=(12.0, 8.0), metavar="WxH",
                    help="figure size in inches (default 12x8)")
    ap.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
    ap.add_argument("--title", default="", help="a title above the panels")
    ap.add_argument("--version", action="version", version="fsdpc-plot fsdpc " + VERSION)
    args = ap.parse_args(argv)
    if not 10 <= args.dpi <= 1000:
        ap.error("--dpi %d is outside [10, 1000]" % args.dpi)
    try:
        series = [s for path in args.files for s in read_runs(path)]
        need_matplotlib(argv)
        draw(series, args.output, args.size, args.dpi, args.title)
    except PlotError as e:
        print("fsdpc-plot: %s" % e, file=sys.stderr)
        return 1
    steps = sum(len(s.steps) for s in series)
    print("%s: %d run%s, %d step records" % (args.output, len(series),
                                            "" if len(series) == 1 else "s", steps))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
