"""Hugging Face model directories against fsdpc-ckpt import-hf / export-hf.

Subcommands:
  check    exits 0 when torch, h5py, safetensors and transformers 4.38 import
           (prints the reason when not).
  make     writes random-weight models with transformers' save_pretrained,
           one directory per case (make --list names them): Llama (GQA, tied
           and untied, f32 and bf16, sharded by a small max_shard_size so
           that an index is written), Mistral, Qwen2 and GPT-2. The weights
           are moved off their init (weights x5, norms and biases spread
           around 1 and 0) so that attention is far from uniform.
  compare  loads a directory with AutoModelForCausalLM.from_pretrained in
           f32, runs the first batch of a token file as fsdpc's data loader
           yields it and compares with what `oracle_ours --dump` wrote for
           the imported model file: logits and loss (rel 1e-5), every
           gradient (rel 1e-4 of the tensor's largest |gradient|); with
           --export, the exported directory loaded the same way gives the
           same logits (rel 1e-5), holds only what a loader reads, and with
           --exact the very same parameters.
  bad      writes damaged copies of a good sharded Llama directory, one per
           kind of damage, as OUT/<kind>.
  variant  a good directory spelled otherwise: GPT-2 under bare names
           (h.0..., as a base GPT2Model saves them), or Llama 3.1's
           rope_scaling in config.json.
The comparison itself is llama_hf_check.py's (rel), with GPT-2's Conv1D
weights transposed to fsdpc's (out, in).
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
sys.path.insert(0, os.path.join(HERE, "..", "train"))

# name: (class, dtype, max_shard_size or None, config keywords)
SMALL = dict(vocab_size=288, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5)
CASES = {
    "llama-gqa-tied-f32": ("LlamaForCausalLM", "float32", "40KB",
                           dict(SMALL, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-gqa-untied-bf16": ("LlamaForCausalLM", "bfloat16", "20KB",
                              dict(SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                   rope_scaling={"type": "linear", "factor": 2.0})),
    "llama-mqa-untied-f32": ("LlamaForCausalLM", "float32", "60KB",
                             dict(SMALL, num_key_value_heads=1, tie_word_embeddings=False,
                                  rope_theta=500000.0)),
    "mistral": ("MistralForCausalLM", "float32", None,
                dict(SMALL, num_key_value_heads=2, sliding_window=None, rope_theta=1e6)),
    "qwen2": ("Qwen2ForCausalLM", "float32", None,
              dict(SMALL, num_key_value_heads=2, tie_word_embeddings=True)),
    "gpt2": ("GPT2LMHeadModel", "float32", None,
             dict(vocab_size=288, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                  layer_norm_epsilon=1e-5)),
}
CONFIG_CLASS = {"LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
                "Qwen2ForCausalLM": "Qwen2Config", "GPT2LMHeadModel": "GPT2Config"}
CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


def cmd_check(_):
    try:
        import h5py  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import transformers
    except Exception as e:  # any import failure is a reason to skip
        sys.exit("cannot import torch/h5py/safetensors/transformers: %s" % e)
    if not transformers.__version__.startswith("4.38."):
        sys.exit("transformers %s, the comparison is written for 4.38" % transformers.__version__)


def perturb(model, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = torch.rand(p.shape, generator=g, dtype=torch.float32) - 0.5
            if "norm" in name or ".ln_" in name:
                p.copy_(p + u if name.endswith(".weight") else u)
            elif name.endswith(".bias"):
                p.copy_(u)
            else:
                p.mul_(5.0)


def cmd_make(args):
    import torch
    import transformers
    if args.list:
        print(" ".join(CASES))
        return
    for i, (name, (cls, dtype, shard, kw)) in enumerate(CASES.items()):
        cfg = getattr(transformers, CONFIG_CLASS[cls])(**kw)
        torch.manual_seed(100 + i)
        model = getattr(transformers, cls)(cfg).float()
        perturb(model, 200 + i)
        model = model.to(getattr(torch, dtype))
        extra = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(os.path.join(args.out, name), safe_serialization=True, **extra)


def load(path):
    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()
    kw = {}
    with open(os.path.join(path, "config.json")) as f:
        if json.load(f)["model_type"] != "gpt2":
            kw["attn_implementation"] = "eager"
    return transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                             **kw)


def fsdpc_view(name, model_type):
    """fsdpc's parameter name -> (Hugging Face name, transposed)."""
    if name == "lm_head.weight":
        return name, False
    if model_type == "gpt2":
        return "transformer." + name, name.endswith(CONV1D)
    return "model." + name, False


def check_export(args, model_type, ref_logits, x, fails, checks):
    import torch
    from safetensors import safe_open
    files = sorted(os.listdir(args.export))
    weights = [f for f in files if f.endswith(".safetensors")]
    rest = sorted(set(files) - set(weights))
    want = ["config.json"] + (["model.safetensors.index.json"] if len(weights) > 1 else [])
    if "generation_config.json" in rest:  # transformers reads it too (the special-token ids)
        want.append("generation_config.json")
    if rest != sorted(want):
        fails.append("export holds %s besides the weights, not %s" % (rest, want))
    if len(weights) > 1:
        with open(os.path.join(args.export, "model.safetensors.index.json")) as f:
            index = json.load(f)
        total = 0
        for w in weights:
            with safe_open(os.path.join(args.export, w), "pt") as st:
                if st.metadata().get("format") != "pt":
                    fails.append("%s: metadata format is not pt" % w)
                for k in st.keys():
                    total += st.get_tensor(k).numel() * st.get_tensor(k).element_size()
                    if index["weight_map"].get(k) != w:
                        fails.append("index puts %s in %s, not %s" % (k, index["weight_map"].get(k), w))
        if index["metadata"]["total_size"] != total:
            fails.append("index total_size %s, tensors %d" % (index["metadata"]["total_size"], total))
    print("export: %s" % " ".join(files))
    exported = load(args.export)
    with torch.no_grad():
        logits = exported(input_ids=x).logits
    checks.append(("export logits", logits.numpy(), ref_logits, args.tol_loss))
    if args.exact:
        ref = dict(load(args.hf).named_parameters())
        for n, p in exported.named_parameters():
            if not torch.equal(p, ref[n]):
                fails.append("export: parameter %s differs" % n)


def cmd_compare(args):
    import h5py
    import torch
    import torch.nn.functional as F
    from llama_hf_check import rel
    from torch_oracle import Loader, read_tokens
    torch.set_num_threads(1)
    model = load(args.hf)
    model_type = model.config.model_type
    x, y = Loader(read_tokens(args.data), args.batch_size, args.seq_len).next()
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    hf = dict(model.named_parameters())
    fails, checks = [], []
    with h5py.File(args.ours, "r") as f:
        checks += [("logits", f["logits"][...], logits.detach().numpy(), args.tol_loss),
                   ("loss", float(f["loss"][()]), loss.item(), args.tol_loss)]
        seen = set()
        for n in sorted(f["grads"]):
            key, tr = fsdpc_view(n, model_type)
            if key not in hf:
                fails.append("%s: no parameter %s in %s" % (n, key, type(model).__name__))
                continue
            seen.add(key)
            g = hf[key].grad.numpy()
            checks.append(("grad " + n, f["grads"][n][...], g.T if tr else g, args.tol_grad))
    for key in hf:
        if key not in seen and not (key == "lm_head.weight" and model.config.tie_word_embeddings):
            fails.append("%s has no gradient in the dump" % key)
    if args.export:
        check_export(args, model_type, logits.detach().numpy(), x, fails, checks)
    worst = (0.0, "")
    for what, ours, ref, tol in checks:
        r, how = rel(ours, ref)
        worst = max(worst, (r, what))
        if not r <= tol:
            fails.append("%s: rel %.3g > %g (%s)" % (what, r, tol, how))
    print("%s: %d comparisons, worst %s rel %.3g" % (type(model).__name__, len(checks), worst[1],
                                                     worst[0]))
    if fails:
        sys.exit("\n".join(fails))


# ----------------------------------------------------------------------------
# damaged directories

def shards(d):
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    return index, sorted(set(index["weight_map"].values()))


def rewrite(d, shard, fn):
    from safetensors.torch import load_file, save_file
    path = os.path.join(d, shard)
    t = load_file(path)
    fn(t)
    save_file(t, path, metadata={"format": "pt"})


def edit_json(d, name, fn):
    path = os.path.join(d, name)
    with open(path) as f:
        j = json.load(f)
    fn(j)
    with open(path, "w") as f:
        json.dump(j, f, indent=2)


def cmd_bad(args):
    import torch
    index, files = shards(args.good)
    where = index["weight_map"]
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    up = "model.layers.1.mlp.up_proj.weight"
    other = [f for f in files if f != where[k_proj]][0]

    def variant(kind, fn):
        d = os.path.join(args.out, kind)
        shutil.copytree(args.good, d)
        fn(d)

    variant("model_type", lambda d: edit_json(d, "config.json",
                                              lambda j: j.update(model_type="falcon")))
    variant("nokey", lambda d: edit_json(d, "config.json", lambda j: j.pop("hidden_size")))
    variant("notjson", lambda d: open(os.path.join(d, "config.json"), "w").write('{"model_type": '))
    variant("shape", lambda d: rewrite(d, where[k_proj], lambda t: t.update(
        {k_proj: torch.zeros(t[k_proj].shape[0] * 2, t[k_proj].shape[1])})))

    def missing(d):
        rewrite(d, where[up], lambda t: t.pop(up))
        edit_json(d, "model.safetensors.index.json", lambda j: j["weight_map"].pop(up))
    variant("missing", missing)
    variant("noshard", lambda d: os.remove(os.path.join(d, files[-1])))
    variant("twoshards", lambda d: rewrite(d, other, lambda t: t.update(
        {k_proj: torch.zeros(32, 64)})))

    def unexpected(d):
        rewrite(d, files[0], lambda t: t.update({"model.layers.0.mlp.extra.weight":
                                                 torch.zeros(4, 4)}))
        edit_json(d, "model.safetensors.index.json", lambda j: j["weight_map"].update(
            {"model.layers.0.mlp.extra.weight": files[0]}))
    variant("unexpected", unexpected)
    variant("wrongshard", lambda d: edit_json(d, "model.safetensors.index.json", lambda j: j[
        "weight_map"].update({k_proj: other})))
    variant("escape", lambda d: edit_json(d, "model.safetensors.index.json", lambda j: j[
        "weight_map"].update({k_proj: "../" + where[k_proj]})))
    variant("window", lambda d: edit_json(d, "config.json", lambda j: j.update(
        model_type="mistral", sliding_window=16)))
    variant("attention_bias", lambda d: edit_json(d, "config.json",
                                                  lambda j: j.update(attention_bias=True)))
    variant("rope_dynamic", lambda d: edit_json(d, "config.json", lambda j: j.update(
        rope_scaling={"type": "dynamic", "factor": 2.0})))
    variant("tied_head", lambda d: edit_json(d, "config.json",
                                             lambda j: j.update(tie_word_embeddings=True)))
    variant("heads", lambda d: edit_json(d, "config.json",
                                         lambda j: j.update(num_key_value_heads=3)))
    norm = "model.norm.weight"

    def alias(d):
        rewrite(d, where[norm], lambda t: t.update({norm[len("model."):]: t[norm].clone()}))
        edit_json(d, "model.safetensors.index.json", lambda j: j["weight_map"].update(
            {norm[len("model."):]: where[norm]}))
    variant("alias", alias)


def cmd_variant(args):
    """Good directories in other spellings: GPT-2 under a base model's bare
    names (as the hub's gpt2 holds them), Llama with Llama 3.1's rope_scaling
    (which transformers 4.38 cannot load: checked by its fields only)."""
    shutil.copytree(args.src, args.out)
    if args.kind == "bare":
        rewrite(args.out, "model.safetensors", lambda t: t.update(
            {k[len("transformer."):]: t.pop(k) for k in list(t) if k.startswith("transformer.")}))
    else:
        edit_json(args.out, "config.json", lambda j: j.update(rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    m = sub.add_parser("make")
    m.add_argument("--out")
    m.add_argument("--list", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("--hf", required=True)
    c.add_argument("--ours", required=True, help="oracle_ours --dump output")
    c.add_argument("--data", required=True)
    c.add_argument("--batch-size", type=int, required=True)
    c.add_argument("--seq-len", type=int, required=True)
    c.add_argument("--export", help="the directory export-hf wrote from the imported file")
    c.add_argument("--exact", action="store_true", help="the export holds the same parameters")
    c.add_argument("--tol-loss", type=float, default=1e-5)
    c.add_argument("--tol-grad", type=float, default=1e-4)
    b = sub.add_parser("bad")
    b.add_argument("--good", required=True)
    b.add_argument("--out", required=True)
    v = sub.add_parser("variant")
    v.add_argument("--kind", choices=("bare", "llama3"), required=True)
    v.add_argument("--src", required=True)
    v.add_argument("--out", required=True)
    args = p.parse_args()
    {"check": cmd_check, "make": cmd_make, "compare": cmd_compare, "bad": cmd_bad,
     "variant": cmd_variant}[args.cmd](args)


if __name__ == "__main__":
    main()
