"""Rank 3 exits with code 3 after a few steps; the others would go on for 120 s."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(600):
    if rank == 3 and step == 5:
        print(f"rank {rank} giving up at step {step}", flush=True)
        sys.exit(3)
    dist.all_reduce(torch.ones(1))
    time.sleep(0.2)
