"""What a launch's output has said so far, in one place: which ranks started, joined and ended
(`Joins`, from the rank shim's marks), every rank's progress (`launch/progress.py`, from the
heartbeats; what RUN_DIR/status.json holds), the errors (`launch/rootcause.py`) and the nodes
whose end a channel reported (pdsh). `MergedOutput` (`launch/output.py`) turns lines into
these events; the supervisor and its watchdogs (`launch/watchdogs.py`) decide from them.

    >>> joins = Joins(world_size=2)
    >>> joins.mark("started", 0, now=0.0); joins.mark("started", 1, now=0.0)
    >>> joins.mark("entered", 0, now=1.0); joins.mark("joined", 0, now=1.5)
    >>> joins.stalled(started_at=0.0, now=70.0, timeout=60.0)
    {1}
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainfleet.launch.progress import Progress
from trainfleet.launch.rootcause import ErrorTracker

if TYPE_CHECKING:
    from trainfleet.launch.backend import Plan

_EXIT_CODE = re.compile(r"-?[0-9]{1,10}")
"""ASCII digits only: `str.isdigit()` is true for `²`, which `int()` refuses."""


def marked_exit_code(event: str) -> int | None:
    """N of the shim's `exit=N` mark (None: another mark, or a garbled one).

    >>> marked_exit_code("exit=-9"), marked_exit_code("exit=²"), marked_exit_code("joined")
    (-9, None, None)
    """
    code = event[5:] if event.startswith("exit=") else ""
    return int(code) if _EXIT_CODE.fullmatch(code) else None


@dataclass(slots=True)
class Joins:
    """Join watchdog state, from the rank shim's marks (and which ranks have ended)."""

    world_size: int
    started: set = field(default_factory=set)
    exited: dict = field(default_factory=dict)
    """rank -> its exit code, from the shim's exit mark."""
    joined: set = field(default_factory=set)
    first_entered: float | None = None

    def mark(self, event: str, rank: int, now: float) -> None:
        if event == "started":
            self.started.add(rank)
        elif event == "entered":
            self.first_entered = self.first_entered or now
        elif event == "joined":
            self.joined.add(rank)
        elif (code := marked_exit_code(event)) is not None:
            self.exited[rank] = code

    @property
    def all_exited(self) -> bool:
        return len(self.exited) == self.world_size

    def stalled(self, started_at: float, now: float, timeout: float) -> set[int] | None:
        """The ranks that have not joined, once the join timeout has run out; else None."""
        everyone = set(range(self.world_size))
        if len(self.started) < self.world_size and now - started_at > timeout:
            return everyone - self.joined
        if self.first_entered and len(self.joined) < self.world_size:
            if now - self.first_entered > timeout:
                return everyone - self.joined
        return None


class RunFacts:
    """A run's state as its output told it. Ranks and nodes given to the events are checked
    by the output first (a node speaks only for its own ranks)."""

    def __init__(self, plan: Plan) -> None:
        self.joins = Joins(plan.world_size)
        self.progress = Progress(
            run_id=plan.options.run_id, ranks=plan.rank_ranges(), started_at=time.time()
        )
        self.progress.hang_timeout_s = plan.options.hang_timeout
        self.progress.startup_timeout_s = plan.options.startup_timeout
        self.tracker = ErrorTracker()
        self.node_exits: list[tuple[str, int]] = []
        """(node, exit code) where a channel reports a node's end (pdsh, deepspeed backend)."""

    def line(self, now: float, node: str, rank: int | None, text: str) -> None:
        """A line of the job's own output (the root cause is looked for in them)."""
        self.tracker.feed(now, node, rank, text)

    def mark(self, node: str, rank: int, event: str, now: float) -> None:
        """The shim's `started`, `entered`, `joined` or `exit=N` for `rank` of `node`."""
        self.joins.mark(event, rank, now)
        if (code := marked_exit_code(event)) is not None:
            self.tracker.note_exit(now, node, rank, code)

    def beat(self, rank: int, fields: dict[str, Any], *, now: float) -> None:
        """A heartbeat's fields as `heartbeat.read` gives them; `now` in Unix seconds."""
        self.progress.beat(rank, fields, now=now)

    def node_ended(self, node: str, code: int) -> None:
        self.node_exits.append((node, code))
