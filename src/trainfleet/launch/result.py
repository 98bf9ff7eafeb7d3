"""How a launch ends: the run's states, the result `supervise` returns (`launch --json` prints
its `to_json`) and the exit code each state gives.

    >>> exit_code(RunState.INTERRUPTED, None, None), exit_code(RunState.FAILED, 3, None)
    (130, 3)
    >>> channel_end(255), channel_end(-9)
    ('its connection dropped', 'its connection ended: its ssh was killed by signal 9')

Lifecycle of a run (RunState): STARTING -> RUNNING -> (DONE | FAILED | STALLED | HUNG |
INTERRUPTED).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from trainfleet.launch.rootcause import RankError
from trainfleet.status.hang import Hang

SSH_DROPPED = 255


def channel_end(code: int) -> str:
    """A channel's end in words: ssh's 255 is its connection, a negative code a signal here."""
    if code == SSH_DROPPED:
        return "its connection dropped"
    if code < 0:
        return f"its connection ended: its ssh was killed by signal {-code}"
    return f"exit code {code}"


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STALLED = "stalled"
    """Not every rank joined the rendezvous within the join timeout."""
    INTERRUPTED = "interrupted"
    HUNG = "hung"
    """Every rank had joined, then no rank advanced a step for the hang timeout."""


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    state: RunState
    exit_code: int
    run_dir: Path
    seconds: float
    node_codes: dict[str, int | None]
    root_cause: RankError | None = None
    first_failure: str | None = None
    """The node whose command ended first with an error (or whose connection dropped)."""
    not_joined: dict[str, list[int]] = field(default_factory=dict)
    """STALLED: per node, the ranks that had not joined."""
    diagnosis: list = field(default_factory=list)
    """STALLED: doctor's findings between the nodes (filled by the caller)."""
    hang: Hang | None = None
    """HUNG: what the watchdog and the stack dumps found; the same record as status.json's."""
    restarts: list = field(default_factory=list)
    """The restarts before this run (`launch/restarts.py`), as given to `supervise`."""
    signalled: str | None = None
    """USR1 or USR2 when trainfleet got that signal during the run and passed it on to every
    rank (a Slurm job's time-limit signal under `--requeue`)."""

    def to_json(self) -> dict:
        return {
            "state": self.state.value,
            "exit_code": self.exit_code,
            "run_dir": str(self.run_dir),
            "seconds": round(self.seconds, 3),
            "node_codes": self.node_codes,
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            "first_failure": self.first_failure,
            "not_joined": self.not_joined,
            "diagnosis": [f.to_json() for f in self.diagnosis],
            "hang": self.hang.to_json() if self.hang else None,
            "restarts": self.restarts,
            "signalled": self.signalled,
        }


def exit_code(state: RunState, failure_code: int | None, root: RankError | None) -> int:
    """A FAILED run's is its root cause's own exit code (when positive), else the first failed
    channel's; Ctrl-C's 130; 1 for STALLED and HUNG; 0 for DONE."""
    if state is RunState.FAILED:
        code = failure_code or 1
        return root.exitcode if root and root.exitcode and root.exitcode > 0 else code
    if state is RunState.INTERRUPTED:
        return 130
    if state in (RunState.STALLED, RunState.HUNG):
        return 1
    return 0
