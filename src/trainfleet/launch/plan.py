"""What a launch runs on each node: argv, environment, ranks. Pure: the same inputs give the
same plan, which `--dry-run` prints and the supervisor executes.

    >>> plan = plan_launch(cluster, launch_facts(report), LaunchOptions(
    ...     command=("train.py", "--lr", "1e-4")), launch_env=dict(os.environ))  # doctest: +SKIP
    >>> print(render_plan(plan))  # doctest: +SKIP

Each node's environment is built in `environment.py`, source by source (the launch shell as
DeepSpeed's runner exports it, ~/.deepspeed_env and ./.deepspeed_env, cluster.yaml, the node's
interface and GPUs, trainfleet's own), and `--dry-run` shows which source set each variable.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainfleet.cluster import Cluster, check_host
from trainfleet.doctor.checks.network import LOOKUP_OPTIONS
from trainfleet.launch import environment
from trainfleet.launch.environment import EnvBuilder
from trainfleet.launch.masking import masked, masked_argv
from trainfleet.node import isolated, shim

if TYPE_CHECKING:
    from trainfleet.launch.deepspeed import DeepSpeedPlan

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
    master_addr: str | None = None
    """The rendezvous address every rank connects to (DeepSpeed's --master_addr); None: the
    master's address as the launch node resolves it."""

    def __post_init__(self) -> None:
        if self.master_addr is not None:
            check_host(self.master_addr, "--master_addr", None)

    local_rank_arg: str = "auto"
    """Pass `--local_rank=N` to the script: auto (when its source defines it), always, never."""
    no_python: bool = False
    """Run command[0] as an executable even when it is Python (torchrun's --no-python)."""
    run_id: str = "run"
    join_timeout: float = 60.0
    grace: float = 5.0
    """Seconds between SIGTERM and SIGKILL when a node's ranks are stopped."""
    hang_timeout: float | None = None
    """Seconds without any rank advancing a step (heartbeats) before the run is HUNG; None:
    no hang watchdog (a script that sends no heartbeats is never judged)."""
    startup_timeout: float | None = 1800.0
    """Seconds without startup progress (a new phase, or a phase's progress growing, in the
    beats before the first step: loading, tokenizing) before the run is HUNG in its startup;
    None: not judged. The hang timeout starts at the first step; once every rank has beaten its
    last step (the final save, an export), this bound applies again."""
    restart: int = 0
    """How many times this run has been restarted (`--max-restarts`): TRAINFLEET_RESTART on
    every rank, so that a script knows to resume."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchFacts:
    """What the plan needs to know about one node: the few values `launch.launch_facts` takes
    from the preflight doctor's report (its `NodeFacts`, doctor/facts/, are the whole sheet)."""

    interface: str | None = None
    gpus: int = 0
    listening: tuple[int, ...] = ()
    python_version: tuple[int, int] | None = None
    """(major, minor) of the node's python, where its probe said."""
    silent_resolver: bool = False
    """The node's resolver did not answer the reverse lookups c10d makes there (doctor's
    `hostname-unresolvable` warning with its seconds): RES_OPTIONS shortens each wait."""


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


def choose_master_port(requested: int, listening: tuple[int, ...]) -> tuple[int, str | None]:
    """`requested` if nothing listens on it on the master, else the first free port above it.

    >>> choose_master_port(29500, (29500, 29501))[0], choose_master_port(29500, ())
    (29502, (29500, None))
    """
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
    cluster: Cluster, facts: Mapping[str, LaunchFacts], options: LaunchOptions
) -> tuple[int, list[str]]:
    """The port to use on the master (requested, or the first free one) and what to say."""
    listening = facts.get(cluster.master, LaunchFacts()).listening
    port, note = choose_master_port(options.master_port or cluster.master_port, listening)
    return port, [note] if note else []


def head_line(plan: LaunchPlan | DeepSpeedPlan) -> str:
    """First line of `--dry-run`, for either backend."""
    return (
        f"backend {plan.options.backend}: {len(plan.rank_ranges())} node(s), world size "
        f"{plan.world_size}, master {plan.master} ({plan.master_addr}:{plan.master_port})"
    )


UserEnv = list[tuple[str, dict[str, str]]]
"""(source, variables) pairs, lowest precedence first: environment.user_env's result."""


def node_env(
    cluster: Cluster, host: str, facts: LaunchFacts, user: UserEnv
) -> tuple[EnvBuilder, list[str]]:
    """The node's environment with each variable's source, and what to tell the user about it
    (a global interface variable that would not work on this node)."""
    node = cluster.node(host)
    env = EnvBuilder()
    env.update(environment.FLIGHT_RECORDER, environment.DEFAULTS)
    if facts.silent_resolver:
        env.update({"RES_OPTIONS": LOOKUP_OPTIONS}, environment.SILENT_RESOLVER)
    for source, values in user:
        env.update(values, source)
    env.update(cluster.env, environment.CLUSTER_YAML)
    env.update({k: v for k, v in node.env.items() if cluster.env.get(k) != v},
               f"cluster.yaml ({host})")  # fmt: skip
    notes: list[str] = []
    if facts.interface:
        given = {
            name: (env.values[name], env.sources[name])
            for name in environment.INTERFACE_VARIABLES
            if name in env.values
        }
        notes = environment.interface_notes(host, facts.interface, given)
        env.update(dict.fromkeys(environment.INTERFACE_VARIABLES, facts.interface),
                   environment.INTERFACE)  # fmt: skip
    env.update({"TRAINFLEET_NODE": host}, environment.TRAINFLEET)  # its name in the spec
    if facts.gpus == 0:
        env.update({"DS_ACCELERATOR": "cpu"}, environment.NO_GPU)
    if node.gpu_ids != tuple(range(node.slots)):
        visible = ",".join(str(i) for i in node.gpu_ids)
        env.update({"CUDA_VISIBLE_DEVICES": visible}, environment.SLOT_LIST)
    return env, notes


def torchrun_argv(
    python: str,
    *,
    nnodes: int,
    node_rank: int,
    slots: int,
    addr: str,
    port: int,
    command,
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
        env, env_notes = node_env(cluster, node.host, node_facts, user)
        notes += env_notes
        env.update(
            {
                shim.RUN_ID_ENV: options.run_id,
                shim.RESTART_ENV: str(options.restart),
                shim.LOCAL_RANK_ARG_ENV: options.local_rank_arg,
                **({shim.NO_PYTHON_ENV: "1"} if options.no_python else {}),
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


def env_lines(env: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """`    NAME=value` lines, sorted, each with its source where it is not trainfleet."""
    lines = []
    for key, value in sorted(env.items()):
        source = sources.get(key, environment.TRAINFLEET)
        said = f"    {key}={shlex.quote(value)}"
        lines.append(said if source == environment.TRAINFLEET else f"{said}  # {source}")
    return lines


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
        lines += env_lines(masked(node.env), node.env_sources)
    lines += ["", "{SHIM}: trainfleet's rank wrapper, written to a private temp dir on each node"]
    return "\n".join(lines)
