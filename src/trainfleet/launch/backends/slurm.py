"""The `slurm` backend: inside a Slurm allocation (`salloc`, an `sbatch` script), torchrun on
every node of the job, all started by one step of it (`srun --ntasks-per-node=1`, one task per
node running that node's bootstrap, the job's CPUs there) instead of over ssh, which Slurm
clusters block.

    >>> BACKEND.name, BACKEND.lookup_rounds
    ('slurm', 2)
    >>> split = srun_lines(["gpu-node-1", "gpu-node-2"])
    >>> split("1: [default0]:loss 2.1")
    ChannelLine(node='gpu-node-2', text='[default0]:loss 2.1', node_exit=None)
    >>> split("srun: error: gpu-node-2: task 1: Exited with exit code 3").node_exit
    ('gpu-node-2', 3)

The plan, the environment and the stack dumps are the ssh backend's (a dump reaches a node as
a step of its own: `remote/argv.py`'s `node_argv` gives `srun` for a node of the allocation).
The step's stdin, which srun gives every task, carries every node's job and then is the
nodes' one lifeline: keepalives, `signal USR1` and its closing reach every bootstrap at once.
From a login node (no allocation), `--backend slurm` submits the same command as a batch job
instead (`launch/sbatch.py`).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.cluster.model import SlurmStep
from trainfleet.doctor import DoctorReport
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import Channel, ChannelLine, LaunchBackend, StopBy
from trainfleet.launch.backends.ssh import LaunchPlan, SshBackend, bootstrap_job
from trainfleet.launch.masking import holds_secret
from trainfleet.launch.options import LaunchFacts, LaunchOptions
from trainfleet.node import bootstrap
from trainfleet.remote.argv import srun_step_argv

STEP_CHANNEL = "srun"
"""The name of the launch's one local process, the step's srun client."""

_LABEL = re.compile(r"^\s*(\d+): (.*)$", re.DOTALL)
_TASK_END = re.compile(r"^srun: error: ([^\s:]+): task \d+: (.*)$")
_SIGNAL_CODES = {signal.strsignal(s) or s.name: 128 + s for s in signal.Signals}
"""srun says a task killed by a signal ended with the signal's description (strsignal):
`Killed` is 137 as the shell counts it."""


def srun_lines(hosts: Sequence[str]) -> Callable[[str], ChannelLine]:
    """The step's line splitter: `N: text` is task N's, which runs on hosts[N] (the bootstrap
    checks it); srun's `HOST: task N: Exited with exit code C` (or a signal's name) reports that
    node's end."""

    def split(text: str) -> ChannelLine:
        ended = _TASK_END.match(text)
        if ended:
            how = ended.group(2).removesuffix(" (core dumped)")
            code = re.fullmatch(r"Exited with exit code (\d+)", how)
            return ChannelLine(
                node=None,
                text=text,
                node_exit=(
                    ended.group(1),
                    int(code.group(1)) if code else _SIGNAL_CODES.get(how, 1),
                ),
            )
        label = _LABEL.match(text)
        if label and int(label.group(1)) < len(hosts):
            return ChannelLine(node=hosts[int(label.group(1))], text=label.group(2))
        return ChannelLine(node=None, text=text)

    return split


def launch_step(cluster: Cluster) -> SlurmStep:
    """The step every node's bootstrap runs in: the job's, with the fewest CPUs the job has on
    any of its nodes (srun gives every task of a step the same `--cpus-per-task`)."""
    steps = [node.slurm for node in cluster.nodes if node.slurm]
    cpus = [step.cpus for step in steps if step.cpus]
    return SlurmStep(job=steps[0].job, cpus=min(cpus) if len(cpus) == len(steps) else None)


def uneven_cpus(cluster: Cluster) -> list[str]:
    """The plan's note when the job has more CPUs on some nodes than on others."""
    cpus = [node.slurm.cpus for node in cluster.nodes if node.slurm]
    known = {c for c in cpus if c is not None}
    if len(known) < 2 or len(known) != len(set(cpus)):
        return []
    counts = [str(c) for c in sorted(known)]
    said = f"{', '.join(counts[:-1])} and {counts[-1]}"
    return [
        f"the job's nodes have {said} CPUs; the launch's one step gives each node's torchrun"
        f" {counts[0]} (--cpus-per-task is one number for every task of a step)"
    ]


def refuse_node_secrets(plan: LaunchPlan) -> None:
    """Every task of the step reads every node's job: a secret whose value differs from node
    to node would reach nodes it was not meant for. Inside an allocation the nodes'
    environments differ only in what their probes found; this keeps it so."""
    first = plan.nodes[0].env
    for node in plan.nodes[1:]:
        for name in sorted(set(first) | set(node.env)):
            value = node.env.get(name)
            if value != first.get(name) and holds_secret(name, value or ""):
                raise TrainfleetError(
                    f"{name} holds a secret and differs between {plan.nodes[0].host} and"
                    f" {node.host}: the launch's one Slurm step hands every node's environment"
                    " to every node",
                    f"give {name} the same value on every node of the job",
                )


class SlurmBackend(SshBackend):
    name = "slurm"
    summary = (
        "torchrun on every node of the Slurm job, all started by one step of it (srun); from a"
        " login node, the command is submitted with sbatch and followed here"
    )

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        """The ssh backend's, once every node is known to be the job's: the first thing a
        launch asks of its backend, so that nothing is probed or planned otherwise."""
        outside = [node.host for node in cluster.nodes if node.slurm is None]
        if outside:
            raise TrainfleetError(
                f"--backend slurm starts ranks as steps of a Slurm job, and {outside[0]} is not"
                f" a node of one ({cluster.source})",
                "run inside an allocation (salloc, sbatch) without --hostfile/--hosts/-c, or"
                " from a login node with --nodes N to submit one",
            )
        return super().preflight(cluster, read_only=read_only)

    def plan(
        self,
        cluster: Cluster,
        facts: Mapping[str, LaunchFacts],
        options: LaunchOptions,
        *,
        master_addr: str,
        launch_env: Mapping[str, str],
        launch_cwd: str,
        run_dir: Path,
    ) -> LaunchPlan:
        plan = super().plan(
            cluster,
            facts,
            options,
            master_addr=master_addr,
            launch_env=launch_env,
            launch_cwd=launch_cwd,
            run_dir=run_dir,
        )
        plan.notes += uneven_cpus(cluster)
        return plan

    def start(self, plan: LaunchPlan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """One step for the whole launch: a task on every node running its bootstrap
        (`bootstrap.step`), the step's stdin their lifeline, its labelled lines split back
        into nodes (`srun_lines`). Its end is every node's: `--kill-on-bad-exit` ends the
        other tasks when one fails, and srun names the node that did."""
        refuse_node_secrets(plan)
        hosts = [node.host for node in plan.nodes]
        python = cluster.node(hosts[0]).python  # one allocation, one launch shell's Python
        argv = node_programs.argv(python, bootstrap.step)
        jobs = [bootstrap_job(plan, node, shim_source="") for node in plan.nodes]
        payload = node_programs.line(bootstrap.step, hosts, node_programs.source("shim"), jobs)
        step = srun_step_argv(launch_step(cluster), hosts, argv, label=True)
        return [
            Channel(name=STEP_CHANNEL, argv=step, payload=payload, stop_by=StopBy.CLOSING_STDIN,
                    demux=srun_lines(hosts), nodes=tuple(hosts))
        ]  # fmt: skip


BACKEND: LaunchBackend[LaunchPlan] = SlurmBackend()
