"""The Slurm allocation trainfleet runs in (`salloc`, `sbatch`): its nodes as a cluster, read
from the variables Slurm sets, with no hostfile and no `scontrol` (missing inside many
containers).

    >>> env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-node-[1-2]",
    ...        "SLURM_GPUS_ON_NODE": "8"}
    >>> found = allocation(env)
    >>> found.job_id, found.hosts, found.gpus_per_node
    ('42', ('gpu-node-1', 'gpu-node-2'), 8)
    >>> allocation({}) is None
    True

GPUs per node: SLURM_GPUS_ON_NODE (set inside a step and in batch scripts), else the count of
SLURM_JOB_GPUS (the allocated indices on the first node), else SLURM_GPUS_PER_NODE (`8` or
`h100:8`); none: a CPU allocation, one slot per node unless the user says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainfleet.cluster.model import DEFAULT_MASTER_PORT
from trainfleet.errors import TrainfleetError
from trainfleet.nodeset import expand_names


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    job_id: str
    hosts: tuple[str, ...]
    gpus_per_node: int | None
    cpus: tuple[int, ...] = ()
    """The job's CPUs on each of `hosts`, in order (SLURM_JOB_CPUS_PER_NODE, `72(x2),36`);
    empty where Slurm did not say."""

    @property
    def master_port(self) -> int:
        """29500 plus the job id's last three digits: two jobs sharing a node (their first)
        do not pick one port, as they would both pick 29500.

        >>> Allocation(job_id="4242", hosts=("n1",), gpus_per_node=None).master_port
        29742
        """
        digits = "".join(c for c in self.job_id.split("_")[0] if c.isdigit())
        return DEFAULT_MASTER_PORT + int(digits or 0) % 1000


def allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation these variables describe; None outside one."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        return None
    try:
        hosts = tuple(expand_names(nodelist))
    except ValueError as exc:
        raise TrainfleetError(
            f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm host list: {exc}",
            "run inside a job Slurm started (salloc, sbatch), or pass --hostfile",
        ) from None
    cpus = cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""))
    return Allocation(
        job_id=job,
        hosts=hosts,
        gpus_per_node=_gpus(env),
        cpus=cpus if len(cpus) == len(hosts) else (),
    )


def cpus_per_node(text: str) -> tuple[int, ...]:
    """SLURM_JOB_CPUS_PER_NODE's counts, one per node: `COUNT(xREPEAT)` groups.

    >>> cpus_per_node("72(x2),36"), cpus_per_node("2"), cpus_per_node("two")
    ((72, 72, 36), (2,), ())
    """
    counts: list[int] = []
    for group in filter(None, text.split(",")):
        count, _, repeat = group.partition("(x")
        repeat = repeat.rstrip(")") or "1"
        if not (count.isdigit() and repeat.isdigit()):
            return ()
        counts += [int(count)] * int(repeat)
    return tuple(counts)


def _gpus(env: Mapping[str, str]) -> int | None:
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit():
        return int(on_node)
    job_gpus = env.get("SLURM_JOB_GPUS", "")
    if job_gpus:
        return len([g for g in job_gpus.split(",") if g.strip()])
    per_node = env.get("SLURM_GPUS_PER_NODE", "").rpartition(":")[2]
    return int(per_node) if per_node.isdigit() else None
