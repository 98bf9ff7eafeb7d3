"""doctor's stack phase on a node: torch imported once, in this process, and (when
the checks before found no error) one rank of a real gloo all_reduce across all nodes. Sends
one StepReport per step (`imports`, then `all_reduce`), so the launch node reads the versions
even when the collective fails. torch is imported inside `run`, so the module
loads with stdlib only.

Two bounds, apart: `startup_s` for every rank to import and reach the rendezvous (a barrier on
the master's store, whose timeout it is), then `timeout_s` for the process group and the
collective. A rank that imports slowly (a loaded node, a cold shared filesystem) delays the
others without using up the collective's bound.
"""

import datetime
import time
from typing import Any, Dict, Optional, TypedDict

from trainfleet.node import answer, stack_imports

READY = "trainfleet-doctor/ready"
GO = "trainfleet-doctor/go"


class Group(TypedDict):
    """This rank's place in the all_reduce."""

    addr: str
    port: int
    rank: int
    world: int
    startup_s: float
    timeout_s: float


class StackJob(TypedDict):
    all_reduce: Optional[Group]
    """None: the imports only."""


class StepReport(TypedDict):
    """One answer per step."""

    step: str
    """imports|all_reduce"""
    report: Dict[str, Any]


def _say(step: str, report: Dict[str, Any]) -> None:
    answer.send(StepReport(step=step, report=report))


def run(spec: StackJob) -> int:
    """-> 0; 3 when the sum is wrong; 4 when torch did not import (the rank does not join)."""
    start = time.time()
    imports = stack_imports.report()
    imports["seconds"] = round(time.time() - start, 3)
    _say("imports", imports)
    group = spec["all_reduce"]
    if not group:
        return 0
    if "torch_error" in imports or not imports.get("gloo"):
        _say("all_reduce", {"ok": False, "joined": False, "error": "torch did not import"})
        return 4
    return _all_reduce(**group)


def _all_reduce(addr, port, rank, world, startup_s, timeout_s):
    """Joins at tcp://ADDR:PORT once every rank has imported, all_reduces rank + 1 and checks
    the sum."""
    import torch
    import torch.distributed as dist

    waited = time.time()
    store = dist.TCPStore(
        addr, port, world, rank == 0, timeout=datetime.timedelta(seconds=startup_s)
    )
    if store.add(READY, 1) == world:
        store.set(GO, "1")
    store.wait([GO])  # the store's timeout: startup_s
    waited = time.time() - waited
    start = time.time()
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    tensor = torch.full((1024,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    ok = bool((tensor == expected).all())
    dist.destroy_process_group()
    _say(
        "all_reduce",
        {
            "ok": ok,
            "joined": True,
            "sum": float(tensor[0]),
            "expected": expected,
            "waited_s": round(waited, 3),
            "seconds": round(time.time() - start, 3),
        },
    )
    return 0 if ok else 3
