#!/usr/bin/python3
"""PyTorch reference for fsdpc's GPT-2 training step.

Subcommands:
  reference  builds GPT-2 in PyTorch from an fsdpc HDF5 model file, runs the
             same optimizer steps fsdpc-train runs (same batches, grad
             accumulation, global-norm clipping, AdamW with decay on matmul
             weights only, warm-up + cosine/linear/constant schedule) and
             writes an HDF5 file with:
               logits (B, T, V)     first micro-batch, before any update
               loss ()              its mean cross-entropy
               grads/<name>         gradients of the first step (after
                                    accumulation, before clipping)
               losses (steps,)      per-step mean loss
               grad_norms (steps,)  per-step global norm before clipping
               params/<name>        every parameter after the last step
               exp_avg/<name>       AdamW's moments after the last step
               exp_avg_sq/<name>
  compare    compares such a file with the one fsdpc wrote and exits 1 with
             the worst tensor, max abs and rel error when a tolerance fails:
             logits, loss, grads, losses (with grad_norms), or one of the
             state groups params, exp_avg, exp_avg_sq.
  check      exits 0 when torch and h5py import (prints the reason if not).

The model is written out here on purpose (no torch.nn.Transformer, no
scaled_dot_product_attention): an explicit causal mask, tanh GELU,
torch.nn.LayerNorm semantics, (out, in) Linear weights, tied or untied head.
"""
import argparse
import math
import struct
import sys

TOKENS_MAGIC = 20240520


def read_tokens(path):
    import numpy as np
    with open(path, "rb") as f:
        header = f.read(256 * 4)
        magic, version, count = struct.unpack("<3i", header[:12])
        if magic != TOKENS_MAGIC or version != 1:
            sys.exit("%s: not an llm.c token file (magic %d version %d)" % (path, magic, version))
        toks = np.frombuffer(f.read(2 * count), dtype="<u2")
    if toks.size != count:
        sys.exit("%s: %d tokens in header, %d in file" % (path, count, toks.size))
    return toks.astype("int64")


class Loader:
    """The fsdpc data loader on one rank: B*T + 1 tokens from the cursor,
    advance by B*T, wrap to 0 when fewer than B*T + 1 tokens remain."""

    def __init__(self, toks, B, T):
        self.toks, self.B, self.T, self.pos = toks, B, T, 0

    def next(self):
        import torch
        n = self.B * self.T
        if self.pos + n + 1 > self.toks.size:
            self.pos = 0
        buf = torch.from_numpy(self.toks[self.pos:self.pos + n + 1].copy())
        self.pos += n
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


def load_model(path):
    import h5py
    import torch
    with h5py.File(path, "r") as f:
        a = f.attrs
        cfg = {k: int(a[k]) for k in ("vocab_size", "context", "n_layer", "n_head", "n_embd",
                                      "tied_embeddings")}
        cfg["ln_eps"] = float(a["ln_eps"])
        params = {}
        for name, ds in f["model"].items():
            params[name] = torch.tensor(ds[...], dtype=torch.float32, requires_grad=True)
    return cfg, params


def gpt2_forward(cfg, p, idx, targets):
    import torch
    import torch.nn.functional as F
    B, T = idx.shape
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["ln_eps"]
    hs = C // NH
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        w = lambda s: p["h.%d.%s" % (l, s)]
        h = F.layer_norm(x, (C,), w("ln_1.weight"), w("ln_1.bias"), eps)
        qkv = h @ w("attn.c_attn.weight").t() + w("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ w("attn.c_proj.weight").t() + w("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), w("ln_2.weight"), w("ln_2.bias"), eps)
        h = F.gelu(h @ w("mlp.c_fc.weight").t() + w("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ w("mlp.c_proj.weight").t() + w("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps)
    head = p["wte.weight"] if cfg["tied_embeddings"] else p["lm_head.weight"]
    logits = x @ head.t()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def lr_at(a, step):
    """fsdpc's schedule (src/train/schedule.h), 0-based step."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if a.lr_schedule == "constant" or a.steps <= a.warmup:
        return a.lr
    p = min(1.0, (step - a.warmup) / (a.steps - a.warmup))
    frac = 0.5 * (1.0 + math.cos(math.pi * p)) if a.lr_schedule == "cosine" else 1.0 - p
    return a.min_lr + (a.lr - a.min_lr) * frac


def decays(name):
    """GPT-2 / nanoGPT's weight-decay groups, stated by name and independent
    of fsdpc's parameter table: matmul weights decay; biases, layer norms and
    the embeddings (wte, and so a head tied to it, and wpe) do not."""
    if not name.endswith(".weight") or name in ("wte.weight", "wpe.weight"):
        return False
    return "ln_" not in name


def cmd_reference(a):
    import h5py
    import numpy as np
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    cfg, p = load_model(a.model)
    names = sorted(p)
    decay = [p[n] for n in names if decays(n)]
    other = [p[n] for n in names if not decays(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=False)
    loader = Loader(read_tokens(a.data), a.batch_size, a.seq_len)
    losses, norms = [], []
    with h5py.File(a.out, "w") as out:
        for step in range(a.steps):
            opt.zero_grad(set_to_none=False)
            total = 0.0
            for k in range(a.grad_accum):
                x, y = loader.next()
                logits, loss = gpt2_forward(cfg, p, x, y)
                (loss / a.grad_accum).backward()
                total += loss.item()
                if step == 0 and k == 0:
                    out["logits"] = logits.detach().numpy()
                    out["loss"] = np.float64(loss.item())
            params = [p[n] for n in names]
            if step == 0:
                g = out.create_group("grads")
                for n in names:
                    g[n] = p[n].grad.numpy()
            if a.clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, a.clip).item()
            else:
                norm = torch.norm(torch.stack([q.grad.norm() for q in params])).item()
            for group in opt.param_groups:
                group["lr"] = lr_at(a, step)
            opt.step()
            losses.append(total / a.grad_accum)
            norms.append(norm)
        out["losses"] = np.array(losses, dtype=np.float64)
        out["grad_norms"] = np.array(norms, dtype=np.float64)
        for group, get in (("params", lambda q: q.detach()),
                           ("exp_avg", lambda q: opt.state[q]["exp_avg"]),
                           ("exp_avg_sq", lambda q: opt.state[q]["exp_avg_sq"])):
            g = out.create_group(group)
            for n in names:
                g[n] = get(p[n]).numpy()


def rel_err(ours, ref, scale=None):
    """Largest |ours - ref| over max |ref| (or over scale when given)."""
    import numpy as np
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return None, None, None
    diff = np.abs(ours - ref)
    if scale is None:
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    scale = max(scale, 1e-30)
    i = int(np.argmax(diff)) if diff.size else 0
    return float(np.max(diff)) if diff.size else 0.0, float(np.max(diff)) / scale, i


def split_key_bias(items):
    """The key third of attn.c_attn.bias has an analytically zero gradient
    (a constant added to every key shifts each query's scores equally, and
    softmax ignores that), so after AdamW its values are each library's
    rounding noise divided by eps. It is compared against the scale of the
    whole model, to show it stays noise; the query and value thirds against
    their own."""
    import numpy as np
    model_max = max(float(np.max(np.abs(np.asarray(ref)))) for _, ref, _ in items)
    out = []
    for name, ref, ours in items:
        if not name.endswith("attn.c_attn.bias") or ours is None or ref.shape != ours.shape:
            out.append((name, ref, ours))
            continue
        c = ref.shape[0] // 3
        out.append((name + "[q]", ref[:c], ours[:c]))
        out.append((name + "[k]", ref[c:2 * c], ours[c:2 * c], model_max))
        out.append((name + "[v]", ref[2 * c:], ours[2 * c:]))
    return out


def cmd_compare(a):
    import h5py
    import numpy as np
    with h5py.File(a.ref, "r") as r, h5py.File(a.ours, "r") as o:
        if a.what in ("grads", "params", "exp_avg", "exp_avg_sq"):
            w = a.what
            items = [(w + "/" + n, r[w][n][...], o[w][n][...] if n in o[w] else None)
                     for n in r[w]]
            extra = sorted(set(o[w]) - set(r[w]))
            if extra:
                print("# fsdpc has %s torch does not: %s" % (w, ", ".join(extra)))
                return 1
            if w == "params":
                items = split_key_bias(items)
        elif a.what == "losses":
            # per step: each loss relative to itself
            ref, ours = r["losses"][...], o["losses"][...]
            items = [("losses[%d]" % i, ref[i:i + 1], ours[i:i + 1] if i < ours.size else None)
                     for i in range(ref.size)]
            items += [("grad_norms[%d]" % i, r["grad_norms"][i:i + 1], o["grad_norms"][i:i + 1])
                      for i in range(r["grad_norms"].size)]
        else:
            items = [(a.what, r[a.what][...], o[a.what][...] if a.what in o else None)]
    worst = (None, -1.0, 0.0, 0)
    for item in items:
        name, ref, ours = item[:3]
        if ours is None:
            print("# %s: missing in %s" % (name, a.ours))
            return 1
        mabs, rel, idx = rel_err(ours, ref, item[3] if len(item) > 3 else None)
        if rel is None:
            print("# %s: shape %s in fsdpc, %s in torch" % (name, np.shape(ours), np.shape(ref)))
            return 1
        if not np.isfinite(rel) or rel > worst[1]:
            worst = (name, rel, mabs, idx)
    name, rel, mabs, idx = worst
    ok = bool(np.isfinite(rel) and rel <= a.tol)
    print("# %s: worst %s max abs err %.3g rel err %.3g at flat index %d (tolerance %g)"
          % (a.what, name, mabs, rel, idx, a.tol))
    if not ok:
        shown = items if a.what == "losses" else [it for it in items if it[0] == name]
        for it in shown:
            print("#   %s torch %s fsdpc %s" % (it[0], np.ravel(it[1])[:4], np.ravel(it[2])[:4]))
    return 0 if ok else 1


def cmd_check(_a):
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "skip"
        print("%s: %s" % (type(e).__name__, e))
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--model", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--batch-size", type=int, required=True)
    r.add_argument("--seq-len", type=int, required=True)
    r.add_argument("--grad-accum", type=int, default=1)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--warmup", type=int, default=0)
    r.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"], default="cosine")
    r.add_argument("--min-lr", type=float, default=0.0)
    r.add_argument("--weight-decay", type=float, default=0.1)
    r.add_argument("--beta1", type=float, default=0.9)
    r.add_argument("--beta2", type=float, default=0.95)
    r.add_argument("--eps", type=float, default=1e-8)
    r.add_argument("--clip", type=float, default=1.0)
    c = sub.add_parser("compare")
    c.add_argument("what", help="logits, loss, grads or losses")
    c.add_argument("ref")
    c.add_argument("ours")
    c.add_argument("--tol", type=float, required=True)
    sub.add_parser("check")
    a = ap.parse_args()
    if a.cmd == "reference":
        return cmd_reference(a) or 0
    if a.cmd == "compare":
        return cmd_compare(a)
    return cmd_check(a)


if __name__ == "__main__":
    sys.exit(main())
