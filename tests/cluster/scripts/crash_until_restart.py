"""The last rank exits 3 at step 3 while TRAINFLEET_RESTART < the first argument
(`--max-restarts` tests); then every rank finishes 6 steps and rank 0 prints which restart it
ran in. (DeepSpeed's runner adds --local_rank=N.)"""

import os
import sys

import torch
import torch.distributed as dist

crashing_attempts = int([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
restart = int(os.environ["TRAINFLEET_RESTART"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(6):
    if rank == world - 1 and step == 3 and restart < crashing_attempts:
        print(f"rank {rank} crashing in attempt {restart}", flush=True)
        sys.exit(3)
    dist.all_reduce(torch.ones(1))
if rank == 0:
    print(f"finished with TRAINFLEET_RESTART={restart}", flush=True)
dist.destroy_process_group()
