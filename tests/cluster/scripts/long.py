"""Joins, says so, then waits 300 s: something to interrupt."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"joined {dist.get_rank()}", flush=True)
time.sleep(300)
