"""What `trainfleet status` shows, as data: per rank, per node and for the job. `rules.py`
fills it from a status.json; `human.py` draws it; `--json` prints `StatusView.to_json()`.

    >>> exit_code("running"), exit_code("done"), exit_code("hung")
    (0, 0, 1)
    >>> fold_ranks([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainfleet.status.hang import Hang

LIVE_STATES = ("starting", "running")
ENDED_STATES = ("done", "failed", "stalled", "hung", "interrupted")


def exit_code(state: str) -> int:
    """0 while a run is starting or running and once it is done; 1 when it ended otherwise."""
    return 0 if state in (*LIVE_STATES, "done") else 1


@dataclass(kw_only=True, slots=True)
class RankRow:
    rank: int
    node: str
    step: int | None
    """None: no heartbeat yet."""
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    memory_bytes: int | None
    phase: str | None
    """What it said it is doing (training, saving, exporting); None: it did not say."""
    pid: int | None
    since_beat_s: float | None
    """Since its last heartbeat: to now while the run lives, to the file's last update after."""
    median_step_s: float | None
    """Median of its recent seconds per step."""
    median_busy_s: float | None
    """Median of its recent busy_s; None below MIN_BUSY_SAMPLES samples."""
    busy_samples: int
    eta_s: float | None
    """Steps left x median_step_s, while the run lives."""
    slower_by: float | None = None
    """median_busy_s over others_busy_s, minus 1 (0.3: 30% slower)."""
    others_busy_s: float | None = None
    """The median of the other ranks' median_busy_s: what this rank is compared with."""
    straggler: bool = False
    silent: bool = False
    silent_after_s: float | None = None
    """No heartbeat for longer than this while the run lives is silent."""


@dataclass(kw_only=True, slots=True)
class NodeRow:
    node: str
    ranks: list[int]
    min_step: int | None
    max_step: int | None
    since_beat_s: float | None
    """Its oldest rank's."""
    tokens_per_s: float | None
    """Summed over its ranks."""
    memory_bytes: int | None
    """Its largest rank's."""
    slowest_rank: int | None
    """Highest median busy_s; without busy_s, the furthest behind (then the oldest beat)."""
    flagged: list[int]
    """Its straggler and silent ranks."""


@dataclass(kw_only=True, slots=True)
class StatusView:
    run_id: str
    state: str
    live: bool
    """The run is starting or running: the file is still being rewritten."""
    exit_code: int
    status_file: str
    now: float
    updated_ago_s: float
    stale: bool
    """Live, but the file was not rewritten for STALE_AFTER_S, or its launcher has ended:
    what it says is the launcher's last word."""
    launcher_gone: bool = False
    """Live, and its launcher's pid (on this host) no longer runs trainfleet."""
    launcher: dict[str, Any] | None = None
    """`host` and `pid` of the process that writes the file."""
    elapsed_s: float
    world_size: int
    restarts: int
    last_restart: dict[str, Any] | None
    hang: Hang | None
    """The hang watchdog's finding, as the launcher wrote it (`status/hang.py`)."""
    hang_timeout_s: float | None
    startup_timeout_s: float | None = None
    starting_up: bool = False
    """Some rank has beaten, all of it startup phases (loading, tokenizing): no step yet."""
    step: int | None
    """The lowest step of the ranks that have beaten."""
    total_steps: int | None
    eta_s: float | None
    """The slowest rank's."""
    margin: float
    straggler_check: str
    """ok, no busy_s, too few samples, or one rank."""
    reference_busy_s: float | None
    """The median over all ranks of their median busy_s."""
    stragglers: list[int]
    silent: list[int]
    not_beaten: list[int]
    notes: list[str] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """What `--json` prints: the fields the human view (`human.render`) draws, as JSON."""
        return {**asdict(self), "hang": self.hang.to_json() if self.hang else None}


def fold_ranks(ranks: list[int]) -> str:
    """Ranks as ranges: [0, 1, 2, 5] -> '0-2,5'."""
    parts: list[list[int]] = []
    for rank in sorted(ranks):
        if parts and rank == parts[-1][-1] + 1:
            parts[-1].append(rank)
        else:
            parts.append([rank])
    return ",".join(str(p[0]) if len(p) == 1 else f"{p[0]}-{p[-1]}" for p in parts)
