#!/usr/bin/python3
"""torch_ddp_bench.py - the PyTorch peer of data-parallel fsdpc-train.

The model, optimizer, data order and timing of torch_train_bench.py, under
torch.nn.parallel.DistributedDataParallel over Gloo: --nproc processes
(default 2) started with torch.multiprocessing.spawn, rendezvous env:// on
127.0.0.1, ONE thread per process. Every rank takes --batch-size sequences
per step: rank r the r-th slice of the global batch at the cursor, as
fsdpc's data loader, so the losses match fsdpc-train with the same file,
--batch-size and world size.

Reports the global tokens/s (world * B * T / median step time, where a
step's time is the slowest rank's) and each rank's peak RSS
(getrusage ru_maxrss; the parent's own is not included).

  /usr/bin/python3 tests/peers/torch_ddp_bench.py --data tok.bin --nproc 2 \\
      --batch-size 4 --seq-len 256 --steps 30 --warmup-steps 5

The last line of output is `result {json}`.
"""
import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import socket
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_train_bench as tb  # noqa: E402

tb.PROG = "torch_ddp_bench"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port, result_path):
    tb.set_one_thread()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(args.nproc)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=args.nproc)
    torch.manual_seed(1337)

    model, cfg = tb.build(args)  # same seed or file: identical on every rank
    tokens = tb.TokenFile(args.data)
    tb.check_vocab(tokens, cfg.vocab_size)
    loader = tb.DataLoader(tokens, args.batch_size, args.seq_len, rank, args.nproc)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = tb.make_optimizer(model, args)
    fpt = model.flops_per_token(args.seq_len)
    if rank == 0:
        print("# torch %s DDP gloo | %d ranks x 1 thread | model %s | batch %d x %d per rank | "
              "steps %d (first %d not timed)" %
              (torch.__version__, args.nproc, cfg.describe(), args.batch_size, args.seq_len,
               args.steps, args.warmup_steps))
        sys.stdout.flush()
    log = None if (args.quiet or rank != 0) else (lambda s: (print(s), sys.stdout.flush()))
    times, losses, _ = tb.train_loop(model, ddp, opt, loader, args, log,
                                    loss_label="rank-0 loss")

    # A step is as slow as its slowest rank; the loss is the global batch's mean.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lt = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(lt, op=dist.ReduceOp.SUM)
    rss = torch.zeros(args.nproc, dtype=torch.float64)
    rss[rank] = tb.peak_rss_mib()
    dist.all_reduce(rss, op=dist.ReduceOp.SUM)
    if rank == 0:
        timed = t.tolist()[args.warmup_steps:]
        med = statistics.median(timed)
        mean_losses = (lt / args.nproc).tolist()
        res = {
            "impl": "torch-ddp-gloo",
            "torch": torch.__version__,
            "ranks": args.nproc,
            "threads_per_rank": torch.get_num_threads(),
            "model": cfg.describe(),
            "batch_size_per_rank": args.batch_size,
            "seq_len": args.seq_len,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "median_ms": med * 1e3,
            "min_ms": min(timed) * 1e3,
            "max_ms": max(timed) * 1e3,
            "tokens_per_s": args.nproc * args.batch_size * args.seq_len / med,
            "flops_per_token": fpt,
            "peak_rss_mib_per_rank": rss.tolist(),
            "loss_first": mean_losses[0],
            "loss_last": mean_losses[-1],
        }
        with open(result_path, "w") as fp:
            json.dump(res, fp)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(prog=tb.PROG, description=__doc__.split("\n")[0])
    tb.add_common_args(ap)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (processes) [2]")
    ap.add_argument("--bucket-mb", type=float, default=25.0,
                    help="DDP gradient bucket size, MiB (torch's default) [25]")
    ap.add_argument("--result", default=None,
                    help="where rank 0 writes the JSON result (default: a temp file)")
    args = ap.parse_args()
    tb.check_common_args(args)
    if args.nproc < 1:
        tb.die("--nproc %d: must be at least 1" % args.nproc)
    # Fail here, once, on bad input rather than in every spawned rank.
    if args.model:
        h5, cfg = tb.model_config_from_h5(args.model)
        h5.close()
    else:
        cfg = tb.Config(*tb.PRESETS[args.preset])
    if args.seq_len > cfg.context:
        tb.die("--seq-len %d: longer than the model's context %d" % (args.seq_len, cfg.context))
    tokens = tb.TokenFile(args.data)
    tb.check_vocab(tokens, cfg.vocab_size)
    tb.DataLoader(tokens, args.batch_size, args.seq_len, 0, args.nproc)

    result_path = args.result or "/tmp/torch_ddp_bench.%d.json" % os.getpid()
    if os.path.exists(result_path):
        os.unlink(result_path)
    mp.spawn(worker, args=(args, free_port(), result_path), nprocs=args.nproc, join=True)
    try:
        with open(result_path) as fp:
            res = json.load(fp)
    except (OSError, ValueError) as e:
        tb.die("rank 0 wrote no result to %s: %s" % (result_path, e))
    if not args.result:
        os.unlink(result_path)
    print("result " + json.dumps(res))


if __name__ == "__main__":
    main()
