"""What every launch backend provides, and the local processes (channels) a launch runs.

    >>> Channel(name="gpu-node-1", argv=["ssh", "gpu-node-1", "python3"]).split("text")
    ChannelLine(node=None, text='text', node_exit=None)

A backend turns a cluster and a command into a plan (pure; `--dry-run` renders it), then the
plan into channels, and cleans up after the run whatever ended it; it also says how its nodes
are examined before a launch (`preflight`) and how its ranks' stacks are dumped when a run
hangs. Each channel says how it is stopped (`StopBy`). The supervisor only runs channels;
nothing outside a backend's own module knows which backend it is. The backends, one module
each, and the registry the CLI reads are in `launch/backends/`; this module is what they and
the supervisor share, and imports none of them.
"""

from __future__ import annotations

import asyncio
import enum
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from trainfleet.cluster import Cluster
    from trainfleet.doctor import DoctorReport
    from trainfleet.launch.options import LaunchFacts, LaunchOptions


@dataclass(frozen=True, slots=True)
class ChannelLine:
    """One output line of a channel, as its backend reads it."""

    node: str | None
    """The node the line came from, where the channel says (pdsh's `node: ` prefix)."""
    text: str
    node_exit: tuple[str, int] | None = None
    """(node, exit code) where the line reports a node's end (pdsh's `ssh exited with`)."""


KEEPALIVE_EVERY_S = 5.0
LIFELINE_S = 30.0
"""A bootstrap that has heard nothing from the launcher for this long stops its node's job
(`bootstrap.py`): the launcher writes an empty line to each every KEEPALIVE_EVERY_S. The
launcher's side gives up on a silent node after 15 s (ssh's ServerAliveInterval=5 x 3)."""


class StopBy(enum.Enum):
    """How the supervisor asks a channel's process to stop; past the grace period it kills
    whatever is left of it here, either way."""

    CLOSING_STDIN = "closing stdin"
    """Its stdin is the node's lifeline (trainfleet's bootstrap): an empty line every few
    seconds while the run goes on; closed, the bootstrap stops every process of the job on its
    node."""
    SIGINT = "SIGINT"
    """SIGINT, as Ctrl-C would: DeepSpeed's runner then stops its nodes."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Channel:
    """One local process of a run: an ssh to a node's bootstrap, a Slurm step of every node's
    bootstrap, or DeepSpeed's runner."""

    name: str
    """The node (ssh backend), or what runs the nodes (DeepSpeed's runner, a Slurm step)."""
    argv: list[str]
    payload: bytes | None = None
    """First bytes on stdin (None: no stdin, unless it is the lifeline)."""
    stop_by: StopBy = StopBy.SIGINT
    demux: Callable[[str], ChannelLine] | None = None
    """Reads the node (and a node's end) out of a line, for a channel that carries several
    nodes' output; None: every line is the channel's own node's."""
    nodes: tuple[str, ...] = ()
    """The nodes it runs, where they are several and their bootstraps read its stdin (one
    Slurm step for them all); empty: its name is its node, if any."""
    cwd: str | None = None
    env: dict[str, str] | None = None
    """The whole environment of the local process (None: this one's). Bootstraps get the
    job's environment on stdin."""

    def split(self, text: str) -> ChannelLine:
        return self.demux(text) if self.demux else ChannelLine(node=None, text=text)

    @property
    def reaches(self) -> tuple[str, ...]:
        """The nodes its stdin reaches: its `nodes`, else its name (a node's own channel)."""
        return self.nodes or (self.name,)

    @property
    def lifeline(self) -> bool:
        """Whether its stdin stays open as the node's lifeline (a bootstrap over ssh): its
        connection lost, the node's job stops by itself, unconfirmed here."""
        return self.stop_by is StopBy.CLOSING_STDIN

    @property
    def has_stdin(self) -> bool:
        return self.payload is not None or self.lifeline

    def keep_alive(self, proc: asyncio.subprocess.Process) -> None:
        """An empty line down a lifeline (its bootstrap stops the job when they stop coming);
        nothing for another channel."""
        if self.lifeline and proc.stdin is not None and proc.returncode is None:
            try:
                proc.stdin.write(b"\n")
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass  # its end is seen by the supervisor's watch

    def pass_signal(self, proc: asyncio.subprocess.Process, name: str) -> bool:
        """`signal NAME` down a lifeline: its bootstrap passes SIGNAME on to the node's ranks
        (`bootstrap.FORWARDED`); False for a channel without one (DeepSpeed's runner)."""
        if not self.lifeline or proc.stdin is None or proc.returncode is not None:
            return False
        try:
            proc.stdin.write(f"signal {name}\n".encode())
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False
        return True

    def ask_to_stop(self, proc: asyncio.subprocess.Process) -> None:
        """The first step of every stop, as `stop_by` says."""
        try:
            if self.stop_by is StopBy.CLOSING_STDIN and proc.stdin is not None:
                proc.stdin.close()
            elif self.stop_by is StopBy.SIGINT:
                proc.send_signal(signal.SIGINT)
        except (BrokenPipeError, ConnectionResetError, RuntimeError, ProcessLookupError):
            pass


class Plan(Protocol):
    """What the supervisor, the output and the run directory read of any backend's plan."""

    options: LaunchOptions
    master: str
    master_addr: str
    master_port: int
    notes: list[str]

    @property
    def world_size(self) -> int: ...

    def rank_ranges(self) -> dict[str, range]: ...


def head_line(plan: Plan) -> str:
    """First line of `--dry-run`, for any backend."""
    return (
        f"backend {plan.options.backend}: {len(plan.rank_ranges())} node(s), world size "
        f"{plan.world_size}, master {plan.master} ({plan.master_addr}:{plan.master_port})"
    )


PlanT = TypeVar("PlanT", bound=Plan)
"""A backend's own plan type: what its `plan` returns is what its other methods take."""


class LaunchBackend(Protocol[PlanT]):
    name: str
    """Its `--backend` name."""
    summary: str
    """What it runs, for `--backend`'s help."""
    lookup_rounds: int
    """How many times each node's processes wait on c10d's reverse lookups before the ranks
    connect (torchrun: its agent, then the ranks): what a silent resolver costs a launch."""

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        """The quick doctor, as this backend reaches its nodes: its facts give each node's
        interface, GPUs and the master's busy ports, its errors stop a launch; again after a
        run whose ranks did not all join, for why. `read_only`: nothing written anywhere."""
        ...

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
    ) -> PlanT:
        """Pure: the same inputs give the same plan."""
        ...

    def render(self, plan: PlanT) -> str:
        """`--dry-run`: what runs where, with every variable's source, secrets masked."""
        ...

    def node_envs(self, plan: PlanT) -> dict[str, Mapping[str, str]]:
        """Each node's environment (secrets unmasked: the caller masks what it writes)."""
        ...

    def start(self, plan: PlanT, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """What must be on the nodes and in the run dir before the channels start; then
        the channels."""
        ...

    def dump_stacks(
        self, plan: PlanT, cluster: Cluster, pids: dict[str, dict[int, int]]
    ) -> dict[str, str]:
        """{node: {rank: pid}} -> {node: what `trainfleet.node.procs.dump_stacks` printed
        there} (`launch/stacks.py` reads it), while a hung run's ranks still run."""
        ...

    def stop(self, plan: PlanT, cluster: Cluster) -> None:
        """After the run, whatever ended it: nothing of it left on any node."""
        ...
