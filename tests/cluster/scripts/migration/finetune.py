"""What run_finetune.sh starts on every rank."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
args = " ".join(sys.argv[1:])
tag = os.environ.get("FINETUNE_TAG")
print(f"finetune rank {rank}/{world} sum={total.item()} tag={tag} args={args}", flush=True)
dist.destroy_process_group()
