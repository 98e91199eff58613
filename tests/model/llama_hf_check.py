"""fsdpc's Llama family against Hugging Face transformers 4.38.

Subcommands:
  perturb  copies an fsdpc model file with every tensor moved off its init
           (weights x5, norm weights and biases spread around 1 and 0), so
           that attention is far from uniform and RoPE and the biases matter;
           the changed tensors lose their checksums and are read unchecked.
  check    exits 0 when torch, h5py and transformers 4.38 import (prints the
           reason when not).
  compare  builds the Hugging Face model of an fsdpc model file (its
           attributes: LlamaForCausalLM, Qwen2ForCausalLM when the q/k/v
           projections have biases, or MistralForCausalLM without a sliding
           window with --family mistral), loads its weights ("model." + the
           file's names, and lm_head), runs the first batch of a token file
           as fsdpc's data loader yields it, and compares with what
           `oracle_ours --dump` wrote for the same model and batch: the
           logits and the loss (rel 1e-5) and the gradient of every
           parameter (rel 1e-4 of the tensor's largest |gradient|), in f32.
           Exits 1 naming the worst tensor when a tolerance fails.

transformers 4.38 has no "llama3" rope_scaling type (it arrived in 4.43).
For a model file with llama3 scaling the Hugging Face model is built
without scaling and each layer's inverse frequencies are then replaced by
this file's port of transformers' _compute_llama3_parameters (llama3_freqs
below): the comparison then checks fsdpc against that port, and the rest of
the model against transformers itself.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))

ROPE_TYPES = {0: None, 1: "linear", 2: "llama3"}


def cmd_check(_):
    try:
        import h5py  # noqa: F401
        import torch  # noqa: F401
        import transformers
    except Exception as e:  # any import failure is a reason to skip
        sys.exit("cannot import torch/h5py/transformers: %s" % e)
    if not transformers.__version__.startswith("4.38."):
        sys.exit("transformers %s, the comparison is written for 4.38" % transformers.__version__)


def cmd_perturb(args):
    import shutil
    import h5py
    import numpy as np
    shutil.copyfile(args.model, args.out)
    rs = np.random.RandomState(args.seed)
    with h5py.File(args.out, "r+") as f:
        for name, ds in f["model"].items():
            v = ds[...].astype(np.float64)
            if "norm" in name:
                v = v + rs.uniform(-0.5, 0.5, v.shape)
            elif name.endswith(".bias"):
                v = v + rs.uniform(-0.5, 0.5, v.shape)
            else:
                v = v * 5.0
            ds[...] = v.astype(ds.dtype)
            for k in [k for k in ds.attrs if k.startswith("xxh3_64")]:
                del ds.attrs[k]  # the data changed: read unchecked (doc/formats.md)


def read_attrs(path):
    import h5py
    with h5py.File(path, "r") as f:
        a = dict(f.attrs)
        if a.get("architecture", b"") not in ("llama", b"llama"):
            sys.exit("%s: architecture %r, not llama" % (path, a.get("architecture")))
        params = {name: ds[...] for name, ds in f["model"].items()}
    return a, params


def llama3_freqs(inv_freq, a):
    """transformers' _compute_llama3_parameters (4.43), in f32 as it runs."""
    import torch
    factor = float(a["rope_factor"])
    low, high = float(a["rope_low_freq_factor"]), float(a["rope_high_freq_factor"])
    old = float(a["rope_original_context"])
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, scaled)


def build_model(a, family):
    import torch
    import transformers
    kw = dict(vocab_size=int(a["vocab_size"]), hidden_size=int(a["n_embd"]),
              intermediate_size=int(a["ffn_hidden"]), num_hidden_layers=int(a["n_layer"]),
              num_attention_heads=int(a["n_head"]), num_key_value_heads=int(a["n_kv_head"]),
              max_position_embeddings=int(a["context"]), rms_norm_eps=float(a["norm_eps"]),
              rope_theta=float(a["rope_theta"]), hidden_act="silu",
              tie_word_embeddings=bool(int(a["tied_embeddings"])),
              attn_implementation="eager")
    rope = ROPE_TYPES[int(a["rope_scaling"])]
    bias = bool(int(a["attn_bias"]))
    if bias:
        if rope is not None:
            sys.exit("q/k/v biases (Qwen2) with rope scaling %s: no Hugging Face model" % rope)
        cls, cfg = transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
            use_sliding_window=False, **kw)
    elif family == "mistral":
        if rope is not None:
            sys.exit("Mistral has no rope scaling (the file has %s)" % rope)
        cls, cfg = transformers.MistralForCausalLM, transformers.MistralConfig(
            sliding_window=None, **kw)
    else:
        scaling = None
        if rope == "linear":
            scaling = {"type": "linear", "factor": float(a["rope_factor"])}
        cls, cfg = transformers.LlamaForCausalLM, transformers.LlamaConfig(
            attention_bias=False, rope_scaling=scaling, **kw)
    torch.manual_seed(0)
    model = cls(cfg).float()
    if rope == "llama3":
        for layer in model.model.layers:
            rot = layer.self_attn.rotary_emb
            rot.inv_freq.copy_(llama3_freqs(rot.inv_freq.clone(), a))
    return model, cls.__name__


def load_weights(model, params, tied):
    import torch
    state = {}
    for n, v in params.items():
        key = n if n == "lm_head.weight" else "model." + n
        state[key] = torch.tensor(v, dtype=torch.float32)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        sys.exit("weights do not fit the Hugging Face model: missing %s, unexpected %s"
                 % (missing, unexpected))


def rel(ours, ref):
    import numpy as np
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf"), "shape %s vs %s" % (ours.shape, ref.shape)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-30)
    err = float(np.max(np.abs(ours - ref))) if ref.size else 0.0
    return err / scale, "max abs %.3g, max |ref| %.3g" % (err, scale)


def cmd_compare(args):
    import h5py
    import torch
    import torch.nn.functional as F
    from torch_oracle import Loader, read_tokens
    torch.set_num_threads(1)
    a, params = read_attrs(args.model)
    model, name = build_model(a, args.family)
    tied = bool(int(a["tied_embeddings"]))
    load_weights(model, params, tied)
    x, y = Loader(read_tokens(args.data), args.batch_size, args.seq_len).next()
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    hf = {n[len("model."):] if n.startswith("model.") else n: p
          for n, p in model.named_parameters()}
    fails = []
    with h5py.File(args.ours, "r") as f:
        checks = [("logits", f["logits"][...], logits.detach().numpy(), args.tol_loss),
                  ("loss", float(f["loss"][()]), loss.item(), args.tol_loss)]
        for n in sorted(f["grads"]):
            g = hf[n].grad if n in hf else None
            if g is None:
                fails.append("%s: no such parameter in %s" % (n, name))
                continue
            checks.append(("grad " + n, f["grads"][n][...], g.numpy(), args.tol_grad))
        ours_names = set(f["grads"])
    for n in hf:
        if n not in ours_names and not (tied and n == "lm_head.weight"):
            fails.append("%s of %s has no gradient in the dump" % (n, name))
    worst = (0.0, "")
    for what, ours, ref, tol in checks:
        r, how = rel(ours, ref)
        print("%-48s rel %.3g (%s)" % (what, r, how))
        worst = max(worst, (r, what))
        if not r <= tol:
            fails.append("%s: rel %.3g > %g (%s)" % (what, r, tol, how))
    print("%s: %d comparisons, worst %s rel %.3g" % (name, len(checks), worst[1], worst[0]))
    if fails:
        sys.exit("\n".join(fails))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    pp = sub.add_parser("perturb")
    pp.add_argument("--model", required=True)
    pp.add_argument("--out", required=True)
    pp.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--ours", required=True, help="oracle_ours --dump output")
    c.add_argument("--batch-size", type=int, required=True)
    c.add_argument("--seq-len", type=int, required=True)
    c.add_argument("--family", choices=("llama", "mistral"), default="llama",
                   help="the Hugging Face class for a model without q/k/v biases")
    c.add_argument("--tol-loss", type=float, default=1e-5)
    c.add_argument("--tol-grad", type=float, default=1e-4)
    args = p.parse_args()
    {"check": cmd_check, "perturb": cmd_perturb, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    main()
