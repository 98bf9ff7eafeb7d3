"""A launch's merged output: every line of every channel prefixed `[node:rank]`, printed and
logged per rank (RUN_DIR/logs), and turned into the run's events (`launch/runfacts.py`): the
rank shim's marks (started, joined, exit codes) and heartbeats taken out of it, every other
line given as the job's own output (the root-cause tracker reads those).

What a node sends is data: a line is cut at LINE_CAP bytes (`remote/lines.py`); a mark counts
only for a rank of the node it came from, and a heartbeat only with the fields
`heartbeat.read` accepts. Anything else is a note, the first one per node on the terminal
and every one in logs/launch.log, and reading goes on: a node whose output is not read would
block in its next write.

    >>> import io, tempfile
    >>> from types import SimpleNamespace
    >>> from trainfleet.launch.backend import ChannelLine
    >>> options = SimpleNamespace(run_id="r1", hang_timeout=None, startup_timeout=None)
    >>> plan = SimpleNamespace(options=options, world_size=1, rank_ranges=lambda: {"n1": range(1)})
    >>> out, facts = io.StringIO(), RunFacts(plan)
    >>> output = MergedOutput(plan, Path(tempfile.mkdtemp()), out, 0.0, facts)
    >>> channel = SimpleNamespace(name="n1", split=lambda text: ChannelLine(node=None, text=text))
    >>> output.line(channel, "stderr", "[default0]:@@trainfleet:r1:started:0")
    >>> output.line(channel, "stdout", "[default0]:hello")
    >>> out.getvalue(), facts.joins.started
    ('[n1:0] hello\\n', {0})
"""

from __future__ import annotations

import asyncio
import re
import time
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from trainfleet import heartbeat
from trainfleet.launch.runfacts import RunFacts, marked_exit_code
from trainfleet.node import shim
from trainfleet.remote.lines import LINE_CAP, READ_CHUNK, CappedLines, Line
from trainfleet.untrusted import printable

if TYPE_CHECKING:
    from trainfleet.launch.backend import Channel, Plan

_TORCHRUN_PREFIX = re.compile(r"^\[default([0-9]{1,9})\]:(.*)$", re.DOTALL)
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
"""torch prefixes the lines of a rank's uncaught exception with `[rankN]: `."""


_RANK = re.compile(r"[0-9]{1,9}")


def _shown(text: str) -> str:
    """A node's words in a note: printable, and short."""
    return printable(text if len(text) <= 40 else text[:37] + "...")


class TextOut(Protocol):
    """Where the merged output is shown: a terminal's stream, or what filters it on the way
    there (commtest's `_Progress`)."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> None: ...


class MergedOutput:
    """Prefixes, prints and logs every line; gives the run's events to `facts`."""

    def __init__(
        self, plan: Plan, run_dir: Path, out: TextOut, started: float, facts: RunFacts
    ) -> None:
        self.plan = plan
        self.out = out
        self.started = started
        self.facts = facts
        self.logs: dict[str, IO[str]] = {}
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ranges = plan.rank_ranges()
        self.mark = f"{shim.MARK}:{plan.options.run_id}:"
        self.width = max(len(h) for h in self.ranges) + len(str(plan.world_size)) + 3
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
            self.facts.node_ended(*said.node_exit)
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
            self.facts.beat(rank, fields, now=time.time())
            return
        if event.startswith("exit=") and marked_exit_code(event) is None:
            self.warn(node, "mark", f"{node}: rank {rank}'s exit mark {_shown(event)} has no "
                                    "exit code: ignored")  # fmt: skip
            return
        self.facts.mark(node, rank, event, now)

    def _plain(self, now: float, node: str, rank: int | None, stream: str, text: str) -> None:
        """A line of the job's own output: the run's facts, the terminal, the log."""
        self.facts.line(now, node, rank, _TORCH_RANK_PREFIX.sub("", text, count=1))
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
