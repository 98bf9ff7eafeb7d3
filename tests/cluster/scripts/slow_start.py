"""A startup longer than the hang timeout: every rank "tokenizes" for SECONDS before its first
step, beating its progress (a startup phase) every 0.5 s, then all ranks meet in a barrier and
run 10 steps. With `stall`, rank 1's tokenization stops advancing after 1 s and never ends
(alive, beating, no progress): rank 0 finishes and waits in the barrier rank 1 never enters.

    slow_start.py SECONDS [stall]
"""

import sys
import time

import torch
import torch.distributed as dist

from trainfleet import heartbeat

words = [a for a in sys.argv[1:] if not a.startswith("--")]  # DeepSpeed's runner adds --local_rank
seconds, stall = float(words[0]), words[1:] == ["stall"]
dist.init_process_group("gloo")
rank = dist.get_rank()
stalls = stall and rank == 1
done = [0]
with heartbeat.beating(0, phase="tokenizing", measure=lambda: done[0], every=0.5):
    started = time.monotonic()
    while stalls or time.monotonic() - started < seconds:
        time.sleep(0.1)
        if not (stalls and time.monotonic() - started > 1):
            done[0] += 1
print(f"rank {rank} tokenized {done[0]} batches", flush=True)
dist.barrier()
for step in range(1, 11):
    dist.all_reduce(torch.ones(1))
    heartbeat.beat(step, total_steps=10, busy_s=0.001)
    time.sleep(0.1)
