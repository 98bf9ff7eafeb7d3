"""The `ssh` backend (the default): torchrun on every node, each started by trainfleet's
bootstrap over one ssh per node. Its plan is pure: the same inputs give the same plan, which
`--dry-run` prints and `start` turns into one channel per node.

    >>> BACKEND.name
    'ssh'
    >>> plan = plan_launch(cluster, launch_facts(report), LaunchOptions(
    ...     command=("train.py", "--lr", "1e-4")), launch_env=dict(os.environ))  # doctest: +SKIP
    >>> print(render_plan(plan))  # doctest: +SKIP

Each node's environment is built in `launch/environment.py`, source by source (the launch
shell as DeepSpeed's runner exports it, ~/.deepspeed_env and ./.deepspeed_env, cluster.yaml,
the node's interface and GPUs, trainfleet's own), and `--dry-run` shows which source set each
variable.

Each node's job (environment and secrets included) travels on the bootstrap's stdin, never in
an argv that `ps` shows, never in a file; that stdin then stays open as the node's lifeline
(`bootstrap.py`): closing it, or the launcher's keepalives stopping, ends every process of the
job on that node (`StopBy.CLOSING_STDIN`). Nothing is left on a node to clean up afterwards.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport
from trainfleet.launch import environment
from trainfleet.launch.backend import LIFELINE_S, Channel, LaunchBackend, StopBy, head_line
from trainfleet.launch.backends import over_ssh
from trainfleet.launch.masking import masked, masked_argv
from trainfleet.launch.options import LaunchFacts, LaunchOptions, master_port
from trainfleet.node import bootstrap, isolated, shim
from trainfleet.remote import node_argv


@dataclass(kw_only=True, slots=True)
class NodePlan:
    host: str
    node_rank: int
    first_rank: int
    slots: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    env_sources: dict[str, str] = field(default_factory=dict)
    """Per variable of `env`, where it came from (environment.py's sources)."""

    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.slots)


@dataclass(kw_only=True, slots=True)
class LaunchPlan:
    options: LaunchOptions
    master: str
    master_addr: str
    master_port: int
    nodes: list[NodePlan]
    notes: list[str] = field(default_factory=list)
    """What was filled in or changed (a busy master port moved), said to the user."""

    def rank_ranges(self) -> dict[str, range]:
        return {node.host: node.ranks() for node in self.nodes}

    @property
    def world_size(self) -> int:
        return sum(node.slots for node in self.nodes)


def torchrun_argv(
    python: str,
    *,
    nnodes: int,
    node_rank: int,
    slots: int,
    addr: str,
    port: int,
    command: Sequence[str],
    python_version: tuple[int, int] | None = None,
) -> list[str]:
    """`python -u -m torch.distributed.run ...`, the agent importing nothing from the working
    directory (`trainfleet.node.isolated`); the ranks' script runs as Python runs it."""
    torchrun = [
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={slots}",
        f"--master-addr={addr}",
        f"--master-port={port}",
        # Each rank's output comes back prefixed with its local rank: `[default3]:...`.
        "--tee=3",
        "{SHIM}",
        *command,
    ]
    # -u: torchrun's stdout is a pipe: unbuffered, or rank lines arrive minutes late.
    return isolated.module_argv(
        python, "torch.distributed.run", torchrun, unbuffered=True, version=python_version
    )


def plan_launch(
    cluster: Cluster,
    facts: Mapping[str, LaunchFacts],
    options: LaunchOptions,
    *,
    master_addr: str,
    launch_env: Mapping[str, str],
    launch_cwd: str,
) -> LaunchPlan:
    """The ssh-backend plan: torchrun on every node with its rank, size and environment."""
    port, notes = master_port(cluster, facts, options)
    user = environment.user_env(launch_env, launch_cwd)
    nodes = []
    first_rank = 0
    for node_rank, node in enumerate(cluster.nodes):
        node_facts = facts.get(node.host, LaunchFacts())
        env, env_notes = environment.node_env(cluster, node.host, node_facts, user)
        notes += env_notes
        env.update(
            {
                shim.RUN_ID_ENV: options.run_id,
                shim.RESTART_ENV: str(options.restart),
                shim.LOCAL_RANK_ARG_ENV: options.local_rank_arg,
                **({shim.NO_PYTHON_ENV: "1"} if options.no_python else {}),
                **(
                    {shim.PREEMPT_SIGNAL_ENV: options.preempt_signal}
                    if options.preempt_signal
                    else {}
                ),  # fmt: skip
            },
            environment.TRAINFLEET,
        )
        nodes.append(
            NodePlan(
                host=node.host,
                node_rank=node_rank,
                first_rank=first_rank,
                slots=node.slots,
                argv=torchrun_argv(
                    node.python,
                    nnodes=len(cluster.nodes),
                    node_rank=node_rank,
                    slots=node.slots,
                    addr=master_addr,
                    port=port,
                    command=options.command,
                    python_version=node_facts.python_version,
                ),
                env=env.values,
                env_sources=env.sources,
                cwd=cluster.workdir or launch_cwd,
            )
        )
        first_rank += node.slots
    return LaunchPlan(
        options=options,
        master=cluster.master,
        master_addr=master_addr,
        master_port=port,
        nodes=nodes,
        notes=notes,
    )


def render_plan(plan: LaunchPlan) -> str:
    """`--dry-run`: per node, the exact argv and environment (secrets masked)."""
    lines = [head_line(plan), *plan.notes]
    for node in plan.nodes:
        last = node.first_rank + node.slots - 1
        lines += [
            "",
            f"{node.host}: node_rank {node.node_rank}, ranks {node.first_rank}-{last}, "
            f"cwd {node.cwd}",
            f"  argv: {shlex.join(masked_argv(node.argv))}",
            "  env:",
        ]
        lines += environment.env_lines(masked(node.env), node.env_sources)
    lines += ["", "{SHIM}: trainfleet's rank wrapper, written to a private temp dir on each node"]
    return "\n".join(lines)


def bootstrap_job(plan: LaunchPlan, node: NodePlan, shim_source: str) -> bootstrap.BootstrapJob:
    """What a node's bootstrap runs (`trainfleet.node.bootstrap`)."""
    return {
        "run_id": plan.options.run_id,
        "cwd": node.cwd,
        "env": node.env,
        "argv": node.argv,
        "shim": shim_source,
        "grace": plan.options.grace,
        "lifeline": LIFELINE_S,
    }


class SshBackend:
    name = "ssh"
    summary = "torchrun on every node over ssh"
    lookup_rounds = 2  # torchrun's agent, then its ranks

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        return over_ssh.preflight(cluster, read_only=read_only)

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
        return plan_launch(
            cluster,
            facts,
            options,
            master_addr=master_addr,
            launch_env=launch_env,
            launch_cwd=launch_cwd,
        )

    def render(self, plan: LaunchPlan) -> str:
        return render_plan(plan)

    def node_envs(self, plan: LaunchPlan) -> dict[str, Mapping[str, str]]:
        return {node.host: node.env for node in plan.nodes}

    def start(self, plan: LaunchPlan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """One bootstrap per node, its stdin the node's lifeline."""
        shim_source = node_programs.source("shim")
        channels = []
        for node_plan in plan.nodes:
            node = cluster.node(node_plan.host)
            job = bootstrap_job(plan, node_plan, shim_source)
            argv = node_argv(node, node_programs.argv(node.python, bootstrap.main), multiplex=False)
            payload = node_programs.line(bootstrap.main, job)
            channels.append(
                Channel(name=node.host, argv=argv, payload=payload, stop_by=StopBy.CLOSING_STDIN)
            )
        return channels

    def dump_stacks(
        self, plan: LaunchPlan, cluster: Cluster, pids: dict[str, dict[int, int]]
    ) -> dict[str, str]:
        return over_ssh.dump_stacks(cluster, pids)

    def stop(self, plan: LaunchPlan, cluster: Cluster) -> None:
        """Nothing: each bootstrap ends its node's job when its stdin closes."""


BACKEND: LaunchBackend[LaunchPlan] = SshBackend()
