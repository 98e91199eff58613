#!/usr/bin/env python3
"""fsdpc-plot - training curves from fsdpc-train metrics files.

    fsdpc-plot metrics.jsonl [more.jsonl ...] -o curves.png [--dump runs.json]

Draws, against the step, the training loss (and the validation loss where
there is one), the learning rate, tokens per second and the gradient norm,
one line per run, several runs overlaid. A metrics file may hold several
runs appended to it; each launch starts with a start record. A launch that
resumed from a checkpoint (its start record names the step) continues the
run before it in the same file: the steps that run had logged past that
step were abandoned (a crash, a kill -9) and are drawn faint, apart from
the run's line, which then never goes back. Runs are labelled by what tells
them apart: the shortest end of their files' paths that differs (the
directory when every file is called metrics.jsonl), and within one file the
run's number and the settings that differ from the file's first run. The
output format follows the name (png, svg, pdf). Needs matplotlib (Debian:
python3-matplotlib); --dump alone does not.
"""

import argparse
import json
import os
import sys

VERSION = "@PACKAGE_VERSION@"
# settings that name files: they tell nothing about how a run trained
PATH_KEYS = {"model", "data", "val-data", "out", "metrics", "ckpt-dir", "resume", "config"}


class PlotError(Exception):
    pass


class Attempt:
    """One launch: the records between its start record and the next."""

    def __init__(self, start):
        self.start = start or {}
        self.resumed_from = self.start.get("resumed_from")
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

    def cut(self, upto):
        """(kept, superseded): this launch's records split at step upto (None: all kept)."""
        keep, drop = Attempt(self.start), Attempt(self.start)
        for i, st in enumerate(self.steps):
            (keep if upto is None or st <= upto else drop).add(
                {"step": st, "loss": self.loss[i], "lr": self.lr[i],
                 "tokens_per_s": self.tps[i], "grad_norm": self.norm[i]})
        for st, v in zip(self.val_steps, self.val_loss):
            (keep if upto is None or st <= upto else drop).add({"step": st, "val_loss": v})
        return keep, drop


class Series:
    """One run: a first launch and the launches that resumed it."""

    def __init__(self, path, number, start):
        self.path, self.number, self.label = path, number, ""
        self.attempts = [Attempt(start)]
        self.config = (start or {}).get("config") or {}

    def split(self):
        """The run's line (each launch up to where the next one resumed) and the
        superseded pieces, one per launch that was abandoned past that point."""
        kept, superseded = [], []
        for i, a in enumerate(self.attempts):
            upto = None  # the lowest step a later launch resumed from
            for b in self.attempts[i + 1:]:
                if b.resumed_from is not None and (upto is None or b.resumed_from < upto):
                    upto = b.resumed_from
            k, d = a.cut(upto)
            kept.append(k)
            if d.steps or d.val_steps:
                superseded.append(d)
        line = Attempt(None)
        for k in kept:
            for i, st in enumerate(k.steps):
                line.add({"step": st, "loss": k.loss[i], "lr": k.lr[i],
                          "tokens_per_s": k.tps[i], "grad_norm": k.norm[i]})
            for st, v in zip(k.val_steps, k.val_loss):
                line.add({"step": st, "val_loss": v})
        return line, superseded


def cut_short(lines, n):
    """Line n (0-based) is a record a killed run left half-written: it starts
    like one and nothing but a new launch's start record follows it."""
    if not lines[n].startswith("{"):
        return False
    rest = [ln for ln in lines[n + 1:] if ln.strip()]
    return not rest or rest[0].startswith('{"event":"start"')


def read_runs(path):
    """The runs of one metrics file, in the order they were written."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise PlotError("%s: %s" % (path, e.strerror)) from None
    runs, cur = [], None
    for n, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            if cut_short(lines, n):
                print("fsdpc-plot: %s:%d: a record cut short (a run killed while writing it): "
                      "skipped" % (path, n + 1), file=sys.stderr)
                continue
            raise PlotError("%s:%d: not a JSON record (%s)" % (path, n + 1, e)) from None
        if not isinstance(rec, dict):
            raise PlotError("%s:%d: not a JSON object" % (path, n + 1))
        if rec.get("event") == "start":
            if cur is None or rec.get("resumed_from") is None:
                cur = Series(path, len(runs) + 1, rec)
                runs.append(cur)
            else:
                cur.attempts.append(Attempt(rec))
            continue
        if "step" not in rec or not isinstance(rec["step"], (int, float)):
            raise PlotError("%s:%d: a record without a step" % (path, n + 1))
        if cur is None:  # written before start records existed
            cur = Series(path, 1, None)
            runs.append(cur)
        cur.attempts[-1].add(rec)
    runs = [r for r in runs if any(a.steps or a.val_steps for a in r.attempts)]
    if not runs:
        raise PlotError("%s: no step records (is it the file of fsdpc-train --metrics?)" % path)
    return runs


def path_labels(paths):
    """The shortest end of each path that tells it from the others; the file
    name left out when every file has the same one (runs/a/metrics.jsonl: a)."""
    parts = {p: os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths}
    same_name = len({v[-1] for v in parts.values()}) == 1 and len(paths) > 1
    labels = {}
    for p, v in parts.items():
        k = 1
        while k < len(v) and sum(1 for w in parts.values() if w[-k:] == v[-k:]) > 1:
            k += 1
        end = v[-k:]
        if same_name and k > 1:
            end = end[:-1]
        labels[p] = os.sep.join(end) or p
    return labels


def config_diff(run, first):
    """The settings of run that differ from first's (file names left out)."""
    keys = sorted(k for k in set(run.config) | set(first.config)
                  if k not in PATH_KEYS and run.config.get(k) != first.config.get(k))
    return ", ".join("%s %s" % (k, run.config.get(k)) for k in keys[:3])


def label_runs(series):
    paths = sorted({s.path for s in series})
    labels = path_labels(paths)
    for s in series:
        label = labels[s.path]
        in_file = [r for r in series if r.path == s.path]
        if len(in_file) > 1:
            diff = config_diff(s, in_file[0]) if s is not in_file[0] else ""
            label += " run %d" % s.number + (" (%s)" % diff if diff else "")
        s.label = label


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
        line, gone = s.split()
        for j, d in enumerate(gone):  # abandoned past a resume: faint, apart from the line
            lab = s.label + " superseded" if j == 0 else None
            for ax, ys in ((ax_loss, d.loss), (ax_lr, d.lr), (ax_tps, d.tps), (ax_norm, d.norm)):
                ax.plot(*points(d.steps, ys), color=c, lw=0.8, alpha=0.3, ls=":",
                        label=lab if ax is ax_loss else None)
        ax_loss.plot(*points(line.steps, line.loss), color=c, lw=1.2, label=s.label + " train")
        if line.val_steps:
            ax_loss.plot(*points(line.val_steps, line.val_loss), color=c, lw=1.2, ls="--",
                         marker="o", ms=3, label=s.label + " val")
        for a in s.attempts[1:]:
            ax_loss.axvline(a.resumed_from, color=c, lw=0.6, alpha=0.4)
        ax_lr.plot(*points(line.steps, line.lr), color=c, lw=1.2, label=s.label)
        ax_tps.plot(*points(line.steps, line.tps), color=c, lw=1.0, label=s.label)
        ax_norm.plot(*points(line.steps, line.norm), color=c, lw=1.0, label=s.label)
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
    ap.add_argument("-o", "--output", metavar="FILE",
                    help="image to write; the format follows the name (png, svg, pdf)")
    ap.add_argument("--dump", metavar="FILE",
                    help="also write what is drawn as JSON: per run its label, its line's "
                         "steps and each launch's steps, kept and superseded ('-': stdout)")
    ap.add_argument("--size", type=parse_size, default=(12.0, 8.0), metavar="WxH",
                    help="figure size in inches (default 12x8)")
    ap.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
    ap.add_argument("--title", default="", help="a title above the panels")
    ap.add_argument("--version", action="version", version="fsdpc-plot fsdpc " + VERSION)
    args = ap.parse_args(argv)
    if not 10 <= args.dpi <= 1000:
        ap.error("--dpi %d is outside [10, 1000]" % args.dpi)
    if not args.output and not args.dump:
        ap.error("give -o FILE (the image), --dump FILE, or both")
    try:
        series = [s for path in args.files for s in read_runs(path)]
        label_runs(series)
        if args.dump:
            dump(series, args.dump)
        if args.output:
            need_matplotlib(argv)
            draw(series, args.output, args.size, args.dpi, args.title)
    except PlotError as e:
        print("fsdpc-plot: %s" % e, file=sys.stderr)
        return 1
    split = [s.split() for s in series]
    steps = sum(len(line.steps) for line, _ in split)
    gone = sum(len(d.steps) for _, ds in split for d in ds)
    print("%s: %d run%s, %d step records%s" % (
        args.output or args.dump, len(series), "" if len(series) == 1 else "s", steps,
        ", %d superseded by a resume (drawn faint)" % gone if gone else ""),
        file=sys.stderr if args.dump == "-" else sys.stdout)
    return 0


def dump(series, out):
    runs = []
    for s in series:
        line, gone = s.split()
        runs.append({
            "label": s.label, "file": s.path, "steps": line.steps, "val_steps": line.val_steps,
            "superseded_steps": [st for d in gone for st in d.steps],
            "launches": [{"resumed_from": a.resumed_from, "resumed_dir": a.start.get("resumed_dir"),
                          "steps": a.steps} for a in s.attempts]})
    text = json.dumps({"runs": runs}, indent=1) + "\n"
    try:
        if out == "-":
            sys.stdout.write(text)
        else:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
    except OSError as e:
        raise PlotError("%s: %s" % (out, e.strerror)) from None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
