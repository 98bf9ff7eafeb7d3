"""A script written for `--requeue`: it counts steps 0.2 s apart and saves its step to CKPT
every 5 steps, and when it gets TRAINFLEET_PREEMPT_SIGNAL (every rank stops after the same
step: the flag is all-reduced), then exits 0. Started again (TRAINFLEET_RESTART > 0) it
resumes from CKPT; the second start (restart 2) runs three more steps and ends, the first
runs until it is stopped (the test preempts it)."""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

CKPT = Path(os.environ["CKPT"])
assert os.environ.get("TRAINFLEET_PREEMPT_SIGNAL") == "USR1", os.environ.get(
    "TRAINFLEET_PREEMPT_SIGNAL"
)
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
dist.init_process_group("gloo")
rank = dist.get_rank()
restart = int(os.environ.get("TRAINFLEET_RESTART", "0"))
start = int(CKPT.read_text()) if restart and CKPT.exists() else 0
if restart:
    print(f"rank {rank} resumed at step {start} (restart {restart})", flush=True)
for step in range(start + 1, 10_000):
    time.sleep(0.2)
    heard = torch.tensor([float(len(got))])
    dist.all_reduce(heard, op=dist.ReduceOp.MAX)
    if heard.item():
        if rank == 0:
            CKPT.write_text(str(step))
        print(f"rank {rank} saved step {step} on SIGUSR1", flush=True)
        sys.exit(0)
    if rank == 0 and step % 5 == 0:
        CKPT.write_text(str(step))
    if step == 3 and not restart:
        print(f"rank {rank} running", flush=True)
    if restart == 2 and step >= start + 3:
        print(f"rank {rank} done at step {step}", flush=True)
        sys.exit(0)
