"""How long doctor waits for each node's probe: as long as the probe works, not a fixed guess.

Each probe says `started` on stderr as soon as it runs (ssh logged in, the login shell and
Python started), then `alive PHASE` every second (`trainfleet.node.probe`). `Pace` reads those
lines as they come and decides, per node:

- before the probe started: wait while the other probes keep starting (this machine or the
  nodes are busy, not down): until START_GAP_S after the last start, and never less than
  `start_min` (ssh's own connect timeout and then some, so that a node that does not answer
  ssh is named by ssh's error, `ssh-unreachable`);
- once it started: wait while it says it is alive, up to `cap`; STALL_S of silence ends it.

The barrier: the probes test each other only once every probe that is going to start has
started (or the start wait above ran out): then each gets one stdin line naming the peers that
started and how many connections to expect. A probe that starts after that tests no one.

    >>> now = [0.0]
    >>> pace = Pace(["a", "b"], start_min=12.0, cap=90.0, go_line=lambda host, up: b"go\\n",
    ...             clock=lambda: now[0])
    >>> now[0] = 5.0; pace.on_line("a", "stderr", "trainfleet-probe: started")
    >>> pace.ready(), pace.deadline("b")  # b not started: 10 s after the last start (>= 12 s)
    (False, 15.0)
    >>> now[0] = 6.0; pace.on_line("b", "stderr", "trainfleet-probe: started")
    >>> pace.ready(), pace.deadline("a")  # both started; a: STALL_S after its last word
    (True, 50.0)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainfleet.node.probe import MARK
from trainfleet.remote import Watch

START_GAP_S = 10.0
"""After the last probe started, how long one that has not started yet is waited for."""
STALL_S = 45.0
"""A started probe that has said nothing for this long has stopped. It says `alive` every
second, but a name lookup holds the whole process in some Python builds (Debian's 3.11 keeps
the GIL in getaddrinfo and getnameinfo), and the probe resolves up to three names itself (its
own, the master's, its FQDN): 10 s each where the resolver never answers (glibc's defaults)."""
_POLL_S = 0.2

GoLine = Callable[[str, frozenset[str]], bytes]
"""go_line(node, started): the stdin line that lets `node`'s probe test the nodes `started`."""


@dataclass(frozen=True, slots=True)
class ProbeTimes:
    """What the launch node saw of one node's probe, in seconds from the moment its ssh began."""

    started_s: float | None = None
    """When it said `started` (None: never)."""
    phase: str | None = None
    """The phase it last named (`facts`, `waiting`, `peers`, `sheet`)."""
    bound: str | None = None
    """The bound its run was held to last: `start` (not started yet), `silence` or `cap`; for
    a run stopped at its deadline, why it was stopped."""


class Pace(Watch):
    """Deadlines and the barrier for one `collect`, from the probes' own lines (module doc)."""

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        start_min: float,
        cap: float,
        go_line: GoLine,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.hosts = list(hosts)
        self.start_min = start_min
        self.cap = cap
        self._go_line = go_line
        self._clock = clock
        self._began = clock()
        self._started: dict[str, float] = {}
        self._said: dict[str, float] = {}
        self._phase: dict[str, str] = {}
        self._ended: set[str] = set()
        self._bound: dict[str, str] = {}
        self._go: frozenset[str] | None = None

    # ---------------------------------------------------------------- the probes' lines
    def on_line(self, node: str, stream: str, text: str) -> None:
        if stream != "stderr" or not text.startswith(MARK) or node not in self.hosts:
            return
        words = text[len(MARK) :].split()
        now = self._clock()
        if words[:1] == ["started"]:
            self._started.setdefault(node, now)
        elif words[:1] == ["alive"] and len(words) == 2 and words[1].isalpha():
            self._phase[node] = words[1][:20]
        else:
            return
        self._said[node] = now

    def ended(self, node: str) -> None:
        self._ended.add(node)

    # ---------------------------------------------------------------- the decisions
    def _start_by(self) -> float:
        last = max(self._started.values(), default=self._began)
        return max(self._began + self.start_min, last + START_GAP_S)

    def ready(self) -> bool:
        """Whether the barrier is open (it opens once and stays open)."""
        if self._go is None:
            waiting = [h for h in self.hosts if h not in self._started and h not in self._ended]
            if not waiting or self._clock() >= self._start_by():
                self._go = frozenset(self._started)
        return self._go is not None

    def deadline(self, node: str) -> float | None:
        if node in self._ended:
            return None
        if node not in self._started:
            limit, bound = self._start_by(), "start"
        else:
            silent_by = self._said[node] + STALL_S
            capped_by = self._started[node] + self.cap
            limit, bound = (silent_by, "silence") if silent_by < capped_by else (capped_by, "cap")
        self._bound[node] = bound
        return limit

    async def more_stdin(self, node: str) -> bytes | None:
        while not self.ready():
            await asyncio.sleep(_POLL_S)
        return self._go_line(node, self._go or frozenset())

    # ---------------------------------------------------------------- what was seen
    def times(self, node: str) -> ProbeTimes:
        started = self._started.get(node)
        return ProbeTimes(
            started_s=None if started is None else started - self._began,
            phase=self._phase.get(node),
            bound=self._bound.get(node),
        )
