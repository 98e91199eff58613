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

  - with --nproc N: N processes x 1 thread, the model wrapped in
    DistributedDataParallel over Gloo on loopback (torch's data-parallel
    peer of fsdpc-train --mesh dp=N), rank r reading the r-th batch of each
    global batch; a step is as slow as the slowest rank.

Run with the venv's interpreter (transformers 4.38.2 on Debian's torch):
  hf-venv/bin/python tests/peers/hf_llama_train_bench.py --model m.h5 \\
      --data tok.bin --batch-size 4 --seq-len 256 --steps 30 --warmup-steps 5
The last line is `result {json}` with median_ms, tokens_per_s (of every
rank), peak_rss_mib (the largest rank's) and the losses (rank 0's).
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


def free_port():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, o, port, result_path):
    """One rank's training (rank 0 of 1 without --nproc); rank 0 writes the result."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    ddp = None
    if o.nproc > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=o.nproc)
    model = build(o.model)
    model.train()
    if o.nproc > 1:
        # bool buffers (the causal mask) are the same on every rank and Gloo cannot
        # broadcast them
        wrap = torch.nn.parallel.DistributedDataParallel
        wrap._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, b in model.named_buffers() if b.dtype == torch.bool])
        ddp = wrap(model, broadcast_buffers=False)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=o.lr, betas=(0.9, 0.95), eps=1e-8)
    toks = read_tokens(o.data)
    B, T, N = o.batch_size, o.seq_len, o.nproc
    cur, times, losses = 0, [], []
    for step in range(o.steps):
        t0 = time.perf_counter()
        if cur + N * B * T + 1 > len(toks):
            cur = 0
        at = cur + rank * B * T
        chunk = torch.from_numpy(toks[at:at + B * T + 1].copy())
        cur += N * B * T
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        logits = (ddp or model)(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if rank == 0:
            print("step %d loss %.4f %.1f ms" % (step + 1, losses[-1], 1e3 * times[-1]),
                  flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if o.nproc > 1:
        import torch.distributed as dist
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
        r = torch.tensor([rss], dtype=torch.float64)
        dist.all_reduce(r, op=dist.ReduceOp.MAX)
        rss = float(r[0])
        dist.destroy_process_group()
    if rank == 0:
        med = statistics.median(times[o.warmup_steps:]) if o.steps > o.warmup_steps else times[-1]
        with open(result_path, "w") as f:
            json.dump({"median_ms": 1e3 * med, "tokens_per_s": N * B * T / med,
                       "peak_rss_mib": rss, "ranks": N, "losses": losses}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--nproc", type=int, default=1)
    o = ap.parse_args()
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        if o.nproc > 1:
            import torch.multiprocessing as mp
            mp.spawn(run, args=(o, free_port(), path), nprocs=o.nproc, join=True)
        else:
            run(0, o, 0, path)
        with open(path) as f:
            print("result " + f.read())


if __name__ == "__main__":
    main()
