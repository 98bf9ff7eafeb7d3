"""doctor's definitive check on a node: one rank of a real gloo all_reduce across all nodes.
torch is imported inside `all_reduce` (the node's own), so the module loads with stdlib only.
"""

import datetime
import json
import sys
import time


def all_reduce(addr, port, rank, world, timeout_s):
    """Joins the group at tcp://ADDR:PORT, all_reduces rank + 1 and checks the sum; prints the
    outcome as JSON. -> 0, or 3 when the sum is wrong."""
    start = time.time()
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method="tcp://%s:%d" % (addr, port),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    tensor = torch.full((1024,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    ok = bool((tensor == expected).all())
    dist.destroy_process_group()
    outcome = {"ok": ok, "sum": float(tensor[0]), "expected": expected}
    outcome["seconds"] = round(time.time() - start, 3)
    print(json.dumps(outcome))
    sys.stdout.flush()
    return 0 if ok else 3
