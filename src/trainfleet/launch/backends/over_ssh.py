"""What the backends whose nodes this machine reaches over ssh (`ssh.py`, `deepspeed.py`) do
alike: the preflight is doctor's quick survey, and a hung run's stacks are dumped by
`trainfleet.node.procs` on every node at once.

    >>> dump_stacks(cluster, {"gpu-node-1": {0: 4242}})  # doctest: +SKIP
    {'gpu-node-1': '@@rank 0 pid 4242\\nState:\\tS (sleeping)\\n...'}
    >>> print(no_dump({1: 77}, "connect timed out"), end="")
    @@rank 1 pid 77
    no stack: the node did not answer (connect timed out)
"""

from __future__ import annotations

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport, run_doctor
from trainfleet.node import procs
from trainfleet.remote import run_on_nodes


def preflight(cluster: Cluster, *, read_only: bool) -> DoctorReport:
    """Doctor's quick survey of every node over ssh."""
    return run_doctor(cluster, quick=True, read_only=read_only)


def dump_stacks(cluster: Cluster, pids: dict[str, dict[int, int]]) -> dict[str, str]:
    """{node: {rank: pid}} -> {node: what `trainfleet.node.procs.dump_stacks` printed there},
    every node at once; a node that does not answer within the bound gets a line per rank
    saying so (a node whose link is down must not hold up the stop for long)."""
    nodes = [n for n in cluster.nodes if n.host in pids]
    argv = {n.host: node_programs.argv(n.python, procs.dump_stacks) for n in nodes}
    ranks = {n.host: [f"{r}={pid}" for r, pid in pids[n.host].items()] for n in nodes}
    job = {host: node_programs.line(procs.dump_stacks, ranks[host]) for host in ranks}
    results = run_on_nodes(nodes, argv, stdin=job, timeout=procs.DUMP_TIMEOUT_S + 5)
    return {r.node: r.stdout if r.ok else no_dump(pids[r.node], r.reason()) for r in results}


def no_dump(pids: dict[int, int], why: str) -> str:
    """dump_stacks's output for ranks whose node did not answer."""
    return "".join(f"@@rank {r} pid {pid}\nno stack: the node did not answer ({why})\n"
                   for r, pid in pids.items())  # fmt: skip
