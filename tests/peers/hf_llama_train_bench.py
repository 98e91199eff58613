#!/usr/bin/python3
"""hf_llama_train_bench.py - Hugging Face transformers' LlamaForCausalLM
trained by a short eager PyTorch loop: the peer of fsdpc-train on a llama
model file, for timing (doc/performance.md, "Llama: fsdpc against
transformers").

  - the model: LlamaForCausalLM built from the fsdpc model file's attributes
    (read with h5py), its weights loaded from the file; f32; eager attention
    (attn_implementation="eager"), ONE thread (OMP/MKL/OpenBLAS thread
    counts set to 1 before torch is imported, torch.set_num_threads(1));
  - the step: the batch at the token file's cursor (fsdpc's order), forward
    with labels (mean cross-entropy), backward, global gradient-norm
    clipping at 1.0, AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
    the 2-D weights but the embedding, as fsdpc does), zeroing the
    gradients; timed from the batch read to the end of the update.

Run with the venv's interpreter (transformers 4.38.2 on Debian's torch):
  hf-venv/bin/python tests/peers/hf_llama_train_bench.py --model m.h5 \\
      --data tok.bin --batch-size 4 --seq-len 256 --steps 30 --warmup-steps 5
The last line is `result {json}` with median_ms, tokens_per_s, peak_rss_mib
and the losses.
"""
import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import resource
import statistics
import sys
import time

import h5py
import numpy as np
import torch


def read_tokens(path):
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(1024), dtype="<i4")
        if head[0] != 20240520 or head[1] not in (1, 2):
            sys.exit("%s: not an llm.c token file" % path)
        dt = "<u2" if head[1] == 1 else "<u4"
        return np.frombuffer(f.read(), dtype=dt)[: int(head[2])].astype(np.int64)


def build(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    with h5py.File(path, "r") as f:
        a = {k: f.attrs[k] for k in f.attrs}
        arch = a["architecture"]
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        if arch != "llama":
            sys.exit("%s: architecture %s, not llama" % (path, arch))
        cfg = LlamaConfig(
            vocab_size=int(a["vocab_size"]), hidden_size=int(a["n_embd"]),
            intermediate_size=int(a["ffn_hidden"]), num_hidden_layers=int(a["n_layer"]),
            num_attention_heads=int(a["n_head"]), num_key_value_heads=int(a["n_kv_head"]),
            max_position_embeddings=int(a["context"]), rms_norm_eps=float(a["norm_eps"]),
            rope_theta=float(a["rope_theta"]), tie_word_embeddings=bool(a["tied_embeddings"]),
            attention_bias=bool(a.get("attn_bias", 0)), attn_implementation="eager")
        model = LlamaForCausalLM(cfg)
        sd = {}
        for name in f["model"]:
            sd[("lm_head.weight" if name == "lm_head.weight" else "model." + name)] = \
                torch.from_numpy(np.asarray(f["model"][name], dtype=np.float32))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)
               and "rotary_emb" not in m]
    if missing or unexpected:
        sys.exit("weights do not match: missing %s, unexpected %s" % (missing, unexpected))
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    o = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model = build(o.model)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=o.lr, betas=(0.9, 0.95), eps=1e-8)
    toks = read_tokens(o.data)
    B, T = o.batch_size, o.seq_len
    cur, times, losses = 0, [], []
    for step in range(o.steps):
        t0 = time.perf_counter()
        if cur + B * T + 1 > len(toks):
            cur = 0
        chunk = torch.from_numpy(toks[cur:cur + B * T + 1].copy())
        cur += B * T
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        print("step %d loss %.4f %.1f ms" % (step + 1, losses[-1], 1e3 * times[-1]), flush=True)
    med = statistics.median(times[o.warmup_steps:]) if o.steps > o.warmup_steps else times[-1]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("result " + json.dumps({"median_ms": 1e3 * med, "tokens_per_s": B * T / med,
                                  "peak_rss_mib": rss, "losses": losses}))


if __name__ == "__main__":
    main()
