#!/usr/bin/python3
"""torch_train_bench.py - the PyTorch peer of fsdpc-train on one process.

Trains the same GPT-2 as fsdpc-train, the same way, and reports the median
step time and tokens/s after warm-up. It is a peer for timing, written to do
the work fsdpc does and nothing more or less:

  - f32 throughout, ONE thread: OMP/MKL/OpenBLAS thread counts are set to 1
    in the environment before torch is imported, then torch.set_num_threads(1)
    and torch.set_num_interop_threads(1). (Debian's torch calls OpenBLAS, the
    BLAS fsdpc uses; OPENBLAS_NUM_THREADS is what holds it to one thread.)
  - GPT-2 pre-LayerNorm blocks: explicit causal attention
    softmax(Q K^T / sqrt(d) + mask) V (no fused SDPA kernel), GELU with the
    tanh approximation, LayerNorm eps from the model, head tied to wte.
  - loss: mean cross-entropy over every token of the batch.
  - AdamW (betas 0.9/0.95, eps 1e-8), decoupled weight decay on the matmul
    weights of the blocks only (c_attn, attn.c_proj, c_fc, mlp.c_proj; not
    the embedding tables, biases or LayerNorm), as fsdpc does; global
    gradient-norm clipping at 1.0; fsdpc-train's learning-rate schedule
    (linear warm-up, then cosine/linear/constant to --min-lr).
  - data: an llm.c token file (256 x int32 header, magic 20240520, version 1,
    count at [2], then uint16 tokens), read in fsdpc's order: step s takes
    the B*T + 1 tokens at the cursor, which advances by B*T and wraps to 0
    when the next batch would not fit.
  - a step is timed from reading its batch to the end of the optimizer
    update and zeroing of the gradients (perf_counter), like fsdpc's step.

With --model FILE the weights come from an fsdpc model file (HDF5, read with
h5py), so the loss of each step can be compared with fsdpc-train's on the
same file and data: the two should agree to about 1e-3 at step 1.

  /usr/bin/python3 tests/peers/torch_train_bench.py --data tok.bin \\
      --preset bench-small --batch-size 4 --seq-len 256 --steps 30 --warmup-steps 5

The last line of output is `result {json}` with median_ms, tokens_per_s,
peak_rss_mib and the losses; tests/peers/run_train_bench.sh reads it.
"""
import os

# Before torch is imported: its OpenMP pool and OpenBLAS read these once.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import math
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "torch_train_bench"

TOKENS_MAGIC = 20240520
TOKENS_VERSION = 1
HEADER_INTS = 256

# (vocab_size, context, n_layer, n_head, n_embd), as src/model/gpt2_spec.c
PRESETS = {
    "tiny": (256, 128, 4, 4, 128),
    "bench-small": (256, 256, 4, 4, 256),
    "gpt2": (50257, 1024, 12, 12, 768),
    "gpt2-medium": (50257, 1024, 24, 16, 1024),
    "gpt2-large": (50257, 1024, 36, 20, 1280),
    "gpt2-xl": (50257, 1024, 48, 25, 1600),
}


def die(msg):
    """One line naming what was wrong, exit status 2."""
    sys.stderr.write("%s: %s\n" % (PROG, msg))
    sys.exit(2)


def set_one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (e.g. a second call in the same process)


# ----------------------------------------------------------------------------
# model


class Config:
    def __init__(self, vocab_size, context, n_layer, n_head, n_embd, ln_eps=1e-5):
        self.vocab_size = vocab_size
        self.context = context
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.ln_eps = ln_eps

    def describe(self):
        return "L=%d NH=%d C=%d V=%d context=%d tied" % (
            self.n_layer, self.n_head, self.n_embd, self.vocab_size, self.context)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        # Additive causal mask (0 on and below the diagonal, -inf above), a
        # plain attribute rather than a buffer: constant, so DDP has nothing
        # to broadcast (Gloo cannot broadcast bool tensors either).
        full = torch.full((cfg.context, cfg.context), float("-inf"))
        self.mask = torch.triu(full, diagonal=1).view(1, 1, cfg.context, cfg.context)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        att = F.softmax(att + self.mask[:, :, :T, :T], dim=-1)
        y = att @ v  # (B, NH, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.context, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.init_weights(seed=0)

    def init_weights(self, seed):
        """fsdpc-ckpt init's distribution (not its values): N(0, 0.02), the
        residual projections N(0, 0.02 / sqrt(2 L)), LayerNorm 1, biases 0."""
        g = torch.Generator().manual_seed(seed)
        res_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, res_std, generator=g)
                elif p.dim() == 2:
                    p.normal_(0.0, 0.02, generator=g)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                        name == "ln_f.weight":
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # tied head: (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    def optimizer_groups(self):
        """Decay the blocks' matmul weights only, as fsdpc's parameter table."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            is_matmul = name.startswith("h.") and name.endswith(".weight") and p.dim() == 2
            (decay if is_matmul else no_decay).append(p)
        return decay, no_decay

    def flops_per_token(self, T):
        """Training FLOPs per token, fsdpc's formula: 6 N + 12 L C T, where N
        leaves out wpe (a lookup, not a product)."""
        c = self.cfg
        n = sum(p.numel() for p in self.parameters()) - c.context * c.n_embd
        return 6.0 * n + 12.0 * c.n_layer * c.n_embd * T


def model_config_from_h5(path):
    try:
        import h5py
    except ImportError:
        die("--model %s: reading fsdpc model files needs h5py (apt-get install python3-h5py)" % path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        die("--model %s: cannot open as HDF5: %s" % (path, e))
    a = f.attrs
    if a.get("format") not in ("fsdpc-model", b"fsdpc-model"):
        die("--model %s: not an fsdpc model file (format attribute %r)" % (path, a.get("format")))
    if int(a.get("tied_embeddings", 1)) != 1:
        die("--model %s: untied head; this peer models the tied GPT-2 only" % path)
    cfg = Config(int(a["vocab_size"]), int(a["context"]), int(a["n_layer"]), int(a["n_head"]),
                 int(a["n_embd"]), float(a.get("ln_eps", 1e-5)))
    return f, cfg


def load_h5_weights(model, f, path):
    group = f["model"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = name  # the module tree mirrors the file's tensor names
            if key not in group:
                die("--model %s: tensor %s missing" % (path, key))
            arr = np.asarray(group[key][...])
            if arr.dtype.kind != "f":
                die("--model %s: tensor %s is stored as %s; store the model as f32 or f16" %
                    (path, key, arr.dtype))
            if tuple(arr.shape) != tuple(p.shape):
                die("--model %s: tensor %s has shape %s, expected %s" %
                    (path, key, tuple(arr.shape), tuple(p.shape)))
            p.copy_(torch.from_numpy(arr.astype(np.float32)))
    f.close()


# ----------------------------------------------------------------------------
# data: llm.c token files, read in fsdpc-train's order


class TokenFile:
    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fp:
                header = np.frombuffer(fp.read(HEADER_INTS * 4), dtype="<i4")
        except OSError as e:
            die("--data %s: %s" % (path, e.strerror))
        if header.size != HEADER_INTS:
            die("--data %s: %d bytes, shorter than the 1024-byte header" % (path, size))
        if header[0] != TOKENS_MAGIC:
            die("--data %s: magic %d, expected %d (not an llm.c token file)" %
                (path, header[0], TOKENS_MAGIC))
        if header[1] != TOKENS_VERSION:
            die("--data %s: version %d, expected %d" % (path, header[1], TOKENS_VERSION))
        count = int(header[2])
        if size != HEADER_INTS * 4 + 2 * count:
            die("--data %s: header says %d tokens but the file has %d bytes (expected %d)" %
                (path, count, size, HEADER_INTS * 4 + 2 * count))
        self.tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4, shape=(count,))
        self.count = count


class DataLoader:
    """Global batch of world*B sequences at the cursor; rank r takes slice r."""

    def __init__(self, tokens, B, T, rank=0, world=1):
        self.tokens, self.B, self.T, self.rank, self.world = tokens, B, T, rank, world
        self.step_tokens = B * T * world
        if self.step_tokens + 1 > tokens.count:
            die("--data %s: %d tokens, a step needs %d (world %d x batch %d x seq %d + 1)" %
                (tokens.path, tokens.count, self.step_tokens + 1, world, B, T))
        self.position = 0

    def next_batch(self):
        if self.position + self.step_tokens + 1 > self.tokens.count:
            self.position = 0
        n = self.B * self.T
        start = self.position + self.rank * n
        buf = torch.from_numpy(self.tokens.tokens[start:start + n + 1].astype(np.int64))
        self.position += self.step_tokens
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


def check_vocab(tokens, vocab_size):
    top = int(tokens.tokens.max()) if tokens.count else 0
    if top >= vocab_size:
        die("--data %s: token %d is outside the vocabulary (%d)" % (tokens.path, top, vocab_size))


def lr_at(args, step):
    """fsdpc-train's schedule (src/train/schedule.c); step is 0-based."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if args.lr_schedule == "constant" or args.steps <= args.warmup:
        return args.lr
    p = min(1.0, (step - args.warmup) / (args.steps - args.warmup))
    frac = 0.5 * (1.0 + math.cos(math.pi * p)) if args.lr_schedule == "cosine" else 1.0 - p
    return args.min_lr + (args.lr - args.min_lr) * frac


# ----------------------------------------------------------------------------
# shared setup and the timed loop (also used by torch_ddp_bench.py)


def add_common_args(ap):
    ap.add_argument("--data", required=True, help="llm.c token file")
    ap.add_argument("--model", help="fsdpc model file (HDF5) to take the config and weights from")
    ap.add_argument("--preset", default="bench-small", choices=sorted(PRESETS),
                    help="model shape when no --model is given [bench-small]")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per step (per rank) [4]")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence [256]")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps [30]")
    ap.add_argument("--warmup-steps", type=int, default=5,
                    help="leading steps left out of the median [5]")
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate [3e-4]")
    ap.add_argument("--warmup", type=int, default=0, help="learning-rate warm-up steps [0]")
    ap.add_argument("--lr-schedule", default="cosine", choices=("cosine", "linear", "constant"))
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="global norm clip (0: off) [1]")
    ap.add_argument("--foreach", type=int, default=1, choices=(0, 1),
                    help="AdamW multi-tensor implementation (torch's fastest on CPU) [1]")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")


def check_common_args(args):
    for name in ("batch_size", "seq_len", "steps"):
        if getattr(args, name) < 1:
            die("--%s %d: must be at least 1" % (name.replace("_", "-"), getattr(args, name)))
    if args.warmup_steps < 0 or args.warmup_steps >= args.steps:
        die("--warmup-steps %d: must be in [0, --steps) so that some steps are timed" %
            args.warmup_steps)


def build(args):
    """Model, optimizer and config, from --model or --preset."""
    h5 = None
    if args.model:
        h5, cfg = model_config_from_h5(args.model)
    else:
        cfg = Config(*PRESETS[args.preset])
    if args.seq_len > cfg.context:
        die("--seq-len %d: longer than the model's context %d" % (args.seq_len, cfg.context))
    if cfg.n_embd % cfg.n_head:
        die("n_embd %d is not divisible by n_head %d" % (cfg.n_embd, cfg.n_head))
    model = GPT(cfg)
    if h5 is not None:
        load_h5_weights(model, h5, args.model)
    return model, cfg


def make_optimizer(model, args):
    decay, no_decay = model.optimizer_groups()
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                             foreach=bool(args.foreach))


def train_loop(model, ddp_model, opt, loader, args, log, loss_label="loss"):
    """Runs args.steps steps; returns (per-step seconds, per-step losses, norms)."""
    times, losses, norms = [], [], []
    params = [p for p in model.parameters()]
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = loader.next_batch()
        lr = lr_at(args, step)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = ddp_model(x, y)
        loss.backward()
        if args.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, args.clip))
        else:
            norm = float(torch.norm(torch.stack([p.grad.norm() for p in params])))
        opt.step()
        opt.zero_grad(set_to_none=True)
        lval = float(loss)  # the step's work is done: nothing runs asynchronously on CPU
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(lval)
        norms.append(norm)
        if log is not None:
            log("step %d/%d | %s %.4f | norm %.4f | lr %.2e | %.1f ms" %
                (step + 1, args.steps, loss_label, lval, norm, lr, dt * 1e3))
    return times, losses, norms


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_common_args(ap)
    args = ap.parse_args()
    check_common_args(args)
    set_one_thread()
    torch.manual_seed(1337)

    model, cfg = build(args)
    tokens = TokenFile(args.data)
    check_vocab(tokens, cfg.vocab_size)
    loader = DataLoader(tokens, args.batch_size, args.seq_len)
    opt = make_optimizer(model, args)
    n_params = sum(p.numel() for p in model.parameters())
    fpt = model.flops_per_token(args.seq_len)
    print("# torch %s | threads %d | model %s | %.2fM parameters | %.2f MFLOP per token" %
          (torch.__version__, torch.get_num_threads(), cfg.describe(), n_params / 1e6, fpt / 1e6))
    print("# batch %d x %d | steps %d (first %d not timed) | data %s (%d tokens)" %
          (args.batch_size, args.seq_len, args.steps, args.warmup_steps, args.data, tokens.count))
    sys.stdout.flush()

    log = None if args.quiet else (lambda s: (print(s), sys.stdout.flush()))
    times, losses, norms = train_loop(model, model, opt, loader, args, log)
    timed = times[args.warmup_steps:]
    med = statistics.median(timed)
    tok = args.batch_size * args.seq_len
    res = {
        "impl": "torch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": cfg.describe(),
        "params": n_params,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "median_ms": med * 1e3,
        "min_ms": min(timed) * 1e3,
        "max_ms": max(timed) * 1e3,
        "tokens_per_s": tok / med,
        "flops_per_token": fpt,
        "peak_rss_mib": peak_rss_mib(),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    print("result " + json.dumps(res))


if __name__ == "__main__":
    main()
