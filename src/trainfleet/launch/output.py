"""A launch's merged output: every line of every channel prefixed `[node:rank]`, printed and
logged per rank (RUN_DIR/logs); the rank shim's marks taken out of it for the join watchdog
(`Joins`) and the exit codes, heartbeats for RUN_DIR/status.json (`launch/progress.py`), and
every other line fed to the root-cause tracker (`launch/rootcause.py`).

    >>> joins = Joins(world_size=2)
    >>> joins.mark("started", 0, now=0.0); joins.mark("started", 1, now=0.0)
    >>> joins.mark("entered", 0, now=1.0); joins.mark("joined", 0, now=1.5)
    >>> joins.stalled(started_at=0.0, now=70.0, timeout=60.0)
    {1}
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainfleet import heartbeat
from trainfleet.launch.progress import Progress
from trainfleet.launch.rootcause import ErrorTracker
from trainfleet.node import shim

if TYPE_CHECKING:
    from trainfleet.launch.backend import Channel, Plan

_TORCHRUN_PREFIX = re.compile(r"^\[default(\d+)\]:(.*)$", re.DOTALL)
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
"""torch prefixes the lines of a rank's uncaught exception with `[rankN]: `."""


def _exit_code(event: str) -> int | None:
    """N of the shim's `exit=N` mark (None: another mark, or a garbled one)."""
    code = event[5:] if event.startswith("exit=") else ""
    return int(code) if code.lstrip("-").isdigit() else None


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
        elif (code := _exit_code(event)) is not None:
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


class MergedOutput:
    """Prefixes, prints and logs every line; feeds the error tracker and the join watchdog."""

    def __init__(self, plan: Plan, run_dir: Path, out: IO[str], started: float) -> None:
        self.plan = plan
        self.out = out
        self.started = started
        self.logs: dict[str, IO[str]] = {}
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = ErrorTracker()
        self.joins = Joins(plan.world_size)
        self.ranges = plan.rank_ranges()
        self.node_exits: list[tuple[str, int]] = []
        """(node, exit code) where a channel reports a node's end (pdsh, deepspeed backend)."""
        self.mark = f"{shim.MARK}:{plan.options.run_id}:"
        self.width = max(len(h) for h in self.ranges) + len(str(plan.world_size)) + 3
        self.progress = Progress(
            run_id=plan.options.run_id, ranks=self.ranges, started_at=time.time()
        )
        self.progress.hang_timeout_s = plan.options.hang_timeout
        self.progress.startup_timeout_s = plan.options.startup_timeout
        self.quiet = False
        """Once the launcher stops the run: lines go to the logs only (torchrun's shutdown
        tracebacks would bury the cause)."""

    def _log(self, name: str) -> IO[str]:
        if name not in self.logs:
            self.logs[name] = open(self.log_dir / f"{name}.log", "a", encoding="utf-8")
        return self.logs[name]

    def line(self, channel: Channel, stream: str, text: str) -> None:
        now = time.monotonic()
        node, rank = channel.name, None
        said = channel.split(text)
        if said.node_exit and said.node_exit[0] in self.ranges:
            self.node_exits.append(said.node_exit)
        if said.node in self.ranges:
            node, text = said.node, said.text
        match = _TORCHRUN_PREFIX.match(text)
        if match and node in self.ranges:
            rank = self.ranges[node].start + int(match.group(1))
            text = match.group(2)
        at = text.find(self.mark)
        if at > 0:
            # A progress bar ends its updates with "\r", not "\n" (tqdm): a mark written
            # after one arrives behind it on the same line.
            if text[:at].strip():
                self._plain(now, node, rank, stream, text[:at])
            text = text[at:]
        if text.startswith(self.mark):
            event, _, who = text[len(self.mark) :].partition(":")
            if event == "beat":
                who, _, payload = who.partition(":")
                fields = heartbeat.parse(payload)
                if who.isdigit() and fields:
                    self.progress.beat(int(who), fields, now=time.time())
                return
            if who.isdigit():
                self.joins.mark(event, int(who), now)
                if (code := _exit_code(event)) is not None:
                    self.tracker.note_exit(now, node, int(who), code)
            return
        self._plain(now, node, rank, stream, text)

    def _plain(self, now: float, node: str, rank: int | None, stream: str, text: str) -> None:
        """A line of the job's own output: the root-cause tracker, the terminal, the log."""
        self.tracker.feed(now, node, rank, _TORCH_RANK_PREFIX.sub("", text, count=1))
        if not self.quiet:
            prefix = f"[{node}:{rank}]" if rank is not None else f"[{node}]"
            self.out.write(f"{prefix:<{self.width}} {text}\n")
            self.out.flush()
        log = self._log(f"{node}.rank{rank}" if rank is not None else node)
        log.write(f"{now - self.started:10.3f} {stream} {text}\n")
        log.flush()

    def note(self, text: str) -> None:
        self.out.write(f"trainfleet: {text}\n")
        self.out.flush()
        self._log("launch").write(f"{time.monotonic() - self.started:10.3f} {text}\n")

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


async def pump(
    stream: asyncio.StreamReader, node: Channel, name: str, output: MergedOutput
) -> None:
    pending = b""
    while chunk := await stream.read(1 << 16):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            output.line(node, name, raw.decode("utf-8", errors="replace"))
    if pending:
        output.line(node, name, pending.decode("utf-8", errors="replace"))
