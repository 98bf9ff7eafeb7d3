"""Every rank adds rank+1 with a real gloo all_reduce and prints the sum and its interface:
the smallest multi-node job (`make demo`, the launch tests and bench/launch_compare.py run it).

    python -c "import trainfleet.examples as e; print(e.ALLREDUCE)"  # where it is
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
iface = os.environ.get("GLOO_SOCKET_IFNAME")
print(f"rank {rank}/{world} sum={total.item()} GLOO_SOCKET_IFNAME={iface}", flush=True)
dist.destroy_process_group()
