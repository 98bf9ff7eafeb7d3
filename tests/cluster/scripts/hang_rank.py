"""Every rank beats a step every 0.1 s; rank 1 stops itself (SIGSTOP) at step 20, so the
others wait in their all_reduce: a hang that neither gloo (30 min) nor torchrun notices."""

import os
import signal
import time

import torch
import torch.distributed as dist

from trainfleet import heartbeat

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 600):
    if rank == 1 and step == 20:
        print(f"rank {rank} stopping itself at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
    heartbeat.beat(step, total_steps=599, busy_s=0.001)
    time.sleep(0.1)
