"""A training loop's shape that reports heartbeats (`trainfleet.heartbeat.beat`): each step
computes (matrix products, timed as busy_s), all-reduces, and beats. `--slow-rank R` makes
rank R do `--slow-factor` times the work: a straggler for `trainfleet status` to find.

    trainfleet launch -c cluster.yaml -- "$(python -c 'import trainfleet.examples as e;
        print(e.HEARTBEAT_LOOP)')" --steps 200 --slow-rank 1
    trainfleet status --follow        # from another terminal
"""

import argparse
import time

import torch
import torch.distributed as dist

from trainfleet.heartbeat import beat

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--size", type=int, default=256, help="matrix side")
parser.add_argument("--work", type=int, default=16, help="matrix products per step")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-factor", type=int, default=4)
args = parser.parse_known_args()[0]  # DeepSpeed's runner adds --local_rank

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
weight = torch.randn(args.size, args.size) / args.size**0.5
work = args.work * (args.slow_factor if rank == args.slow_rank else 1)
for step in range(1, args.steps + 1):
    started = time.perf_counter()
    x = torch.randn(args.size, args.size)
    for _ in range(work):
        x = torch.tanh(x @ weight)
    loss = x.pow(2).mean()
    busy = time.perf_counter() - started
    dist.all_reduce(loss)  # every rank waits here for the slowest
    beat(step, total_steps=args.steps, loss=loss.item() / dist.get_world_size(), busy_s=busy)
if rank == 0:
    print(f"done: {args.steps} steps", flush=True)
dist.destroy_process_group()
