"""What a launch runs on each node: argv, environment, ranks. Pure: the same inputs give the
same plan, which `--dry-run` prints and the supervisor executes.

    >>> plan = plan_launch(cluster, NodeFacts.from_survey(survey), LaunchOptions(
    ...     command=("train.py", "--lr", "1e-4")), launch_env=dict(os.environ))  # doctest: +SKIP
    >>> print(render_plan(plan))  # doctest: +SKIP

Each node's environment, from lowest to highest precedence: variables of this machine that
DeepSpeed's runner would drop (PATH, LD_LIBRARY_PATH, CUDA_HOME, HF_*, WANDB_*, TORCH_*);
cluster.yaml's env (cluster-wide, then the node's); the interface for NCCL and gloo (pinned
`interface:`, else the one that routes to the master on that node); DS_ACCELERATOR=cpu on a
node without GPUs; CUDA_VISIBLE_DEVICES for an include like `host:0,2`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainfleet.cluster import Cluster

if TYPE_CHECKING:
    from trainfleet.launch.deepspeed import DeepSpeedPlan

FORWARDED = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME")
FORWARDED_PREFIXES = ("HF_", "WANDB_", "TORCH_")
SECRET = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE
)
MASK = "***"
PORT_RANGE = (29500, 29600)
"""Where a free master port is looked for when the requested one is taken."""


class Backend:
    SSH = "ssh"
    DEEPSPEED = "deepspeed"
    ALL = (SSH, DEEPSPEED)


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchOptions:
    command: tuple[str, ...]
    """The script and its arguments, or ("-m", module, *args)."""
    backend: str = Backend.SSH
    master_port: int | None = None
    """None: the cluster's (29500 unless cluster.yaml says otherwise)."""
    local_rank_arg: str = "auto"
    """Pass `--local_rank=N` to the script: auto (when its source defines it), always, never."""
    run_id: str = "run"
    join_timeout: float = 60.0
    grace: float = 5.0
    """Seconds between SIGTERM and SIGKILL when a node's ranks are stopped."""
    hang_timeout: float | None = None
    """Seconds without any rank advancing a step (heartbeats) before the run is HUNG; None:
    no hang watchdog (a script that sends no heartbeats is never judged)."""
    restart: int = 0
    """How many times this run has been restarted (`--max-restarts`): TRAINFLEET_RESTART on
    every rank, so that a script knows to resume."""


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeFacts:
    """What the plan needs to know about one node (from doctor's probe)."""

    interface: str | None = None
    gpus: int = 0
    listening: tuple[int, ...] = ()


@dataclass(kw_only=True, slots=True)
class NodePlan:
    host: str
    node_rank: int
    first_rank: int
    slots: int
    argv: list[str]
    env: dict[str, str]
    cwd: str

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


def is_secret(name: str) -> bool:
    return bool(SECRET.search(name))


def masked(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def forwarded_env(launch_env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(launch_env.items())
        if k in FORWARDED or k.startswith(FORWARDED_PREFIXES)
    }


def choose_master_port(requested: int, listening: tuple[int, ...]) -> tuple[int, str | None]:
    """`requested` if nothing listens on it on the master, else the first free port above it."""
    if requested not in listening:
        return requested, None
    for port in range(max(requested + 1, PORT_RANGE[0]), PORT_RANGE[1]):
        if port not in listening:
            return port, (
                f"master port {requested} is taken on the master (see `trainfleet doctor`): "
                f"using {port}"
            )
    return requested, f"master port {requested} is taken and no free port found: kept it"


def master_port(
    cluster: Cluster, facts: Mapping[str, NodeFacts], options: LaunchOptions
) -> tuple[int, list[str]]:
    """The port to use on the master (requested, or the first free one) and what to say."""
    listening = facts.get(cluster.master, NodeFacts()).listening
    port, note = choose_master_port(options.master_port or cluster.master_port, listening)
    return port, [note] if note else []


def head_line(plan: LaunchPlan | DeepSpeedPlan) -> str:
    """First line of `--dry-run`, for either backend."""
    return (
        f"backend {plan.options.backend}: {len(plan.rank_ranges())} node(s), world size "
        f"{plan.world_size}, master {plan.master} ({plan.master_addr}:{plan.master_port})"
    )


def node_env(
    cluster: Cluster, host: str, facts: NodeFacts, launch_env: Mapping[str, str]
) -> dict[str, str]:
    node = cluster.node(host)
    env = forwarded_env(launch_env)
    env.update(node.env)  # cluster-wide values, overridden by the node's own
    env["TRAINFLEET_NODE"] = host  # the node's name as in the cluster spec, for tools
    if facts.interface:
        env["NCCL_SOCKET_IFNAME"] = facts.interface
        env["GLOO_SOCKET_IFNAME"] = facts.interface
    if facts.gpus == 0:
        env["DS_ACCELERATOR"] = "cpu"
    if node.gpu_ids != tuple(range(node.slots)):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in node.gpu_ids)
    return env


def torchrun_argv(
    python: str, *, nnodes: int, node_rank: int, slots: int, addr: str, port: int, command
) -> list[str]:
    return [
        python,
        "-u",  # torchrun's stdout is a pipe: unbuffered, or rank lines arrive minutes late
        "-m",
        "torch.distributed.run",
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


def plan_launch(
    cluster: Cluster,
    facts: Mapping[str, NodeFacts],
    options: LaunchOptions,
    *,
    master_addr: str,
    launch_env: Mapping[str, str],
    launch_cwd: str,
) -> LaunchPlan:
    """The ssh-backend plan: torchrun on every node with its rank, size and environment."""
    port, notes = master_port(cluster, facts, options)
    nodes = []
    first_rank = 0
    for node_rank, node in enumerate(cluster.nodes):
        env = node_env(cluster, node.host, facts.get(node.host, NodeFacts()), launch_env)
        env.update(
            TRAINFLEET_RUN_ID=options.run_id,
            TRAINFLEET_RESTART=str(options.restart),
            TRAINFLEET_LOCAL_RANK_ARG=options.local_rank_arg,
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
                ),
                env=env,
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
            f"  argv: {shlex.join(node.argv)}",
            "  env:",
        ]
        lines += [f"    {k}={shlex.quote(v)}" for k, v in sorted(masked(node.env).items())]
    lines += ["", "{SHIM}: trainfleet's rank wrapper, written to a private temp dir on each node"]
    return "\n".join(lines)
