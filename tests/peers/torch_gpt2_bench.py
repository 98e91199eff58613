#!/usr/bin/python3
"""torch_gpt2_bench.py - GPT-2 training throughput of PyTorch on one GPU: the
peer that tests/gpu/run_gpu_checks.sh measures beside fsdpc-train --device
cuda, on the same GPU, with the same model shape and batch.

The model is nanoGPT's GPT-2 (pre-LayerNorm blocks with biases, fused causal
attention through scaled_dot_product_attention, GELU with the tanh
approximation, head tied to the token embedding, vocabulary 50257 unpadded
as fsdpc's), trained the way people train it fast in PyTorch: bf16 autocast
over f32 weights, fused AdamW (betas 0.9/0.95, weight decay 0.1 on the
matrices), gradient clipping at 1.0, and either eager execution or
torch.compile. Tokens are random (torch's generator, fixed seed): the
throughput does not depend on them, and nothing but torch is needed.

Method: --warmup steps untimed (they include torch.compile's compilation),
then --steps steps each timed from the batch's copy to the GPU to the end of
zero_grad, with torch.cuda.synchronize() at both ends; the median is
reported. FLOPs per token are fsdpc's count, 6 N + 12 L C T with N the
parameters less the position embedding (nanoGPT's estimate_mfu), so the MFU
is comparable with fsdpc-train's at the same --peak-flops. Peak memory is
torch.cuda.max_memory_allocated over the timed run.

Output, one line per mode:
  torch eager: 123456 tok/s | 130.1 ms/step (median of 10 after 3 warm-up) | mfu 40.1% of 989 TFLOP/s | peak mem 20.3 GiB | loss 10.98
Usage:
  torch_gpt2_bench.py [--mode eager|compile|both] [--batch 16] [--seq 1024]
                      [--steps 10] [--warmup 3] [--peak-flops 989e12]
                      [--layers 12 --heads 12 --width 768 --vocab 50257]
                      [--device cuda|cpu]
--device cpu (f32, no autocast) is for checking the script on a machine
without a GPU; its figures mean nothing.
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------
# the model (nanoGPT's GPT-2)

class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the CPU check only)
            a = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            a = a.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = a.softmax(dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, V, ctx):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(ctx, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


# ----------------------------------------------------------------------------
# the benchmark

def make_optimizer(model, fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **kw)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def run(args, mode):
    dev = args.device
    torch.manual_seed(1337)
    model = GPT(args.layers, args.heads, args.width, args.vocab, args.seq).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6.0 * (n_params - args.seq * args.width) + \
        12.0 * args.layers * args.width * args.seq
    opt = make_optimizer(model, fused=(dev == "cuda"))
    step_fn = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator().manual_seed(1)
    # one batch on the host, pinned, copied each step as a loader would
    data = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
    if dev == "cuda":
        data = data.pin_memory()
        torch.cuda.reset_peak_memory_stats()
    amp = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev == "cuda" \
        else torch.autocast(device_type="cpu", enabled=False)
    times = []
    loss = float("nan")
    for s in range(args.warmup + args.steps):
        sync(dev)
        t0 = time.perf_counter()
        batch = data.to(dev, non_blocking=True)
        x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        with amp:
            out = step_fn(x, y)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        if s >= args.warmup:
            times.append(time.perf_counter() - t0)
        loss = out.item()
    ms = statistics.median(times) * 1e3
    tok_s = args.batch * args.seq / (ms / 1e3)
    mfu = 100.0 * tok_s * flops_per_token / args.peak_flops
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
    print(f"torch {mode}: {tok_s:.0f} tok/s | {ms:.1f} ms/step (median of {args.steps} after "
          f"{args.warmup} warm-up) | mfu {mfu:.1f}% of {args.peak_flops / 1e12:.0f} TFLOP/s | "
          f"peak mem {mem:.1f} GiB | loss {loss:.4f} | {n_params / 1e6:.1f}M parameters, "
          f"{flops_per_token / 1e6:.1f} MFLOP per token", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["eager", "compile", "both"], default="both")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-flops", type=float, default=989e12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpt2_bench.py: no CUDA device visible to torch", file=sys.stderr)
        return 2
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
              f"{torch.cuda.get_device_name()}", flush=True)
    for mode in (["eager", "compile"] if args.mode == "both" else [args.mode]):
        run(args, mode)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
