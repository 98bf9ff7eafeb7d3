"""A launch's merged output: every line of every channel prefixed `[node:rank]`, printed and
logged per rank (RUN_DIR/logs); the rank shim's marks taken out of it for the join watchdog
(`Joins`) and the exit codes, heartbeats for RUN_DIR/status.json (`launch/progress.py`), and
every other line fed to the root-cause tracker (`launch/rootcause.py`).

What a node sends is data: a line is cut at LINE_CAP bytes (`remote/lines.py`); a mark counts
only for a rank of the node it came from, and a heartbeat only with the fields
`heartbeat.read` accepts. Anything else is a note, the first one per node on the terminal
and every one in logs/launch.log, and reading goes on: a node whose output is not read would
block in its next write.

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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainfleet import heartbeat
from trainfleet.launch.progress import Progress
from trainfleet.launch.rootcause import ErrorTracker
from trainfleet.node import shim
from trainfleet.remote.lines import LINE_CAP, READ_CHUNK, CappedLines, Line
from trainfleet.untrusted import printable

if TYPE_CHECKING:
    from trainfleet.launch.backend import Channel, Plan

_TORCHRUN_PREFIX = re.compile(r"^\[default([0-9]{1,9})\]:(.*)$", re.DOTALL)
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
"""torch prefixes the lines of a rank's uncaught exception with `[rankN]: `."""


_RANK = re.compile(r"[0-9]{1,9}")
_EXIT_CODE = re.compile(r"-?[0-9]{1,10}")
"""ASCII digits only: `str.isdigit()` is true for `²`, which `int()` refuses."""


def _exit_code(event: str) -> int | None:
    """N of the shim's `exit=N` mark (None: another mark, or a garbled one).

    >>> _exit_code("exit=-9"), _exit_code("exit=²"), _exit_code("joined")
    (-9, None, None)
    """
    code = event[5:] if event.startswith("exit=") else ""
    return int(code) if _EXIT_CODE.fullmatch(code) else None


def _shown(text: str) -> str:
    """A node's words in a note: printable, and short."""
    return printable(text if len(text) <= 40 else text[:37] + "...")


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
        self.warned: dict[tuple[str, str], int] = {}
        """(node, kind) -> how many notes `warn` had about what that node sent."""
        self.quiet = False
        """Once the launcher stops the run: lines go to the logs only (torchrun's shutdown
        tracebacks would bury the cause)."""

    def _log(self, name: str) -> IO[str]:
        if name not in self.logs:
            self.logs[name] = open(self.log_dir / f"{name}.log", "a", encoding="utf-8")
        return self.logs[name]

    def line(self, channel: Channel, stream: str, text: str, *, dropped: int = 0) -> None:
        """One line of `channel`'s `stream`; `dropped`: the bytes cut off its end."""
        now = time.monotonic()
        node, rank = channel.name, None
        said = channel.split(text)
        if said.node_exit and said.node_exit[0] in self.ranges:
            self.node_exits.append(said.node_exit)
        if said.node in self.ranges:
            node, text = said.node, said.text
        match = _TORCHRUN_PREFIX.match(text)
        if match and node in self.ranges:
            local = self.ranges[node].start + int(match.group(1))
            if local in self.ranges[node]:
                rank, text = local, match.group(2)
        at = text.find(self.mark)
        if at > 0:
            # A progress bar ends its updates with "\r", not "\n" (tqdm): a mark written
            # after one arrives behind it on the same line.
            if text[:at].strip():
                self._plain(now, node, rank, stream, text[:at])
            text = text[at:]
        if text.startswith(self.mark):
            self._mark(node, text[len(self.mark) :], now)
        else:
            self._plain(now, node, rank, stream, text)
        if dropped:
            self.warn(node, "long", f"{node}: {dropped} bytes of a line on its {stream} dropped "
                                    f"(a line is cut at {LINE_CAP} bytes)")  # fmt: skip

    def _mark(self, node: str, said: str, now: float) -> None:
        """The shim's `EVENT:RANK` or a heartbeat's `beat:RANK:FIELDS`, from `node`: it speaks
        only for its own ranks (a channel that is no node, DeepSpeed's runner, is this
        machine: pdsh puts its node before every line of a node's)."""
        event, _, who = said.partition(":")
        if event == "pid":  # the node's bootstrap naming its own pid (node/bootstrap.py)
            return
        payload = None
        if event == "beat":
            who, _, payload = who.partition(":")
        ranks = self.ranges.get(node, range(self.plan.world_size))
        rank = int(who) if _RANK.fullmatch(who) else None
        if rank is None or rank not in ranks:
            span = f"{ranks.start}-{ranks.stop - 1}" if ranks else "none"
            self.warn(node, "mark", f"{node}: a mark for rank {_shown(who)}, not one of its "
                                    f"ranks ({span}): ignored")  # fmt: skip
            return
        if payload is not None:
            try:
                fields, problems = heartbeat.read(payload)
            except ValueError as exc:
                self.warn(node, "mark", f"{node}: rank {rank}'s heartbeat is no beat ({exc}): "
                                        "ignored")  # fmt: skip
                return
            for problem in problems:
                self.warn(node, "mark", f"{node}: rank {rank}'s heartbeat: {printable(problem)}"
                                        ": that field left out")  # fmt: skip
            self.progress.beat(rank, fields, now=time.time())
            return
        code = _exit_code(event)
        if event.startswith("exit=") and code is None:
            self.warn(node, "mark", f"{node}: rank {rank}'s exit mark {_shown(event)} has no "
                                    "exit code: ignored")  # fmt: skip
            return
        self.joins.mark(event, rank, now)
        if code is not None:
            self.tracker.note_exit(now, node, rank, code)

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

    def warn(self, node: str, kind: str, text: str) -> None:
        """A note about what `node` sent: the first of each `kind` per node on the terminal
        too, every one in logs/launch.log (a node's flood of bad lines is no flood here)."""
        seen = self.warned.get((node, kind), 0)
        self.warned[(node, kind)] = seen + 1
        if seen:
            self._log("launch").write(f"{time.monotonic() - self.started:10.3f} {text}\n")
        else:
            self.note(f"{text} (more like it from {node}: {self.log_dir / 'launch.log'})")

    def unreadable(self, node: str, stream: str) -> None:
        """Reading a line raised (a bug): said, its traceback logged; reading goes on."""
        self.warn(node, "error", f"{node}: a line of its {stream} could not be read (a "
                                 "trainfleet bug: please report it)")  # fmt: skip
        self._log("launch").write(traceback.format_exc())

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


async def pump(
    stream: asyncio.StreamReader, channel: Channel, name: str, output: MergedOutput
) -> None:
    """Read `channel`'s `name` stream to its end into `output`, each line cut at LINE_CAP
    bytes; what goes wrong with one line costs that line only."""
    lines = CappedLines()
    while chunk := await stream.read(READ_CHUNK):
        for line in lines.feed(chunk):
            _take(output, channel, name, line)
    for line in lines.end():
        _take(output, channel, name, line)


def _take(output: MergedOutput, channel: Channel, name: str, line: Line) -> None:
    try:
        output.line(channel, name, line.text(), dropped=line.dropped)
    except Exception:  # a bug: said and logged, and the node's output is still read
        output.unreadable(channel.name, name)
