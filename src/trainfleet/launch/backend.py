"""What every launch backend provides, and the local processes (channels) a launch runs.

    >>> Channel(name="gpu-node-1", argv=["ssh", "gpu-node-1", "python3"]).split("text")
    ChannelLine(node=None, text='text', node_exit=None)

A backend turns a cluster and a command into a plan (pure; `--dry-run` renders it), then the
plan into channels, and cleans up after the run whatever ended it. The supervisor only runs
channels; nothing outside a backend's own module knows which backend it is. The backends, one
module each, and the registry the CLI reads are in `launch/backends/`; this module is what they
and the supervisor share, and imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trainfleet.cluster import Cluster
    from trainfleet.launch.options import LaunchFacts, LaunchOptions


@dataclass(frozen=True, slots=True)
class ChannelLine:
    """One output line of a channel, as its backend reads it."""

    node: str | None
    """The node the line came from, where the channel says (pdsh's `node: ` prefix)."""
    text: str
    node_exit: tuple[str, int] | None = None
    """(node, exit code) where the line reports a node's end (pdsh's `ssh exited with`)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Channel:
    """One local process of a run: an ssh to a node's bootstrap, or DeepSpeed's runner."""

    name: str
    """The node (ssh backend), or the backend's name."""
    argv: list[str]
    payload: bytes | None = None
    """First bytes on stdin, which then stays open as the node's lifeline; None: no stdin,
    and the process is stopped with SIGINT (DeepSpeed's runner then stops its nodes)."""
    demux: Callable[[str], ChannelLine] | None = None
    """Reads the node (and a node's end) out of a line, for a channel that carries several
    nodes' output; None: every line is the channel's own node's."""
    cwd: str | None = None
    env: dict[str, str] | None = None
    """The whole environment of the local process (None: this one's). Bootstraps get the
    job's environment on stdin."""

    def split(self, text: str) -> ChannelLine:
        return self.demux(text) if self.demux else ChannelLine(node=None, text=text)


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


class LaunchBackend(Protocol):
    name: str
    """Its `--backend` name."""
    summary: str
    """What it runs, for `--backend`'s help."""

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
    ) -> Plan:
        """Pure: the same inputs give the same plan."""
        ...

    def render(self, plan: Plan) -> str:
        """`--dry-run`: what runs where, with every variable's source, secrets masked."""
        ...

    def node_envs(self, plan: Plan) -> dict[str, Mapping[str, str]]:
        """Each node's environment (secrets unmasked: the caller masks what it writes)."""
        ...

    def start(self, plan: Plan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """What must be on the nodes and in the run dir before the channels start; then
        the channels."""
        ...

    def stop(self, plan: Plan, cluster: Cluster) -> None:
        """After the run, whatever ended it: nothing of it left on any node."""
        ...
