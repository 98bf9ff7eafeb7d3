"""Every rank's progress from its heartbeats (`trainfleet.heartbeat`), kept by the launcher and
written to RUN_DIR/status.json, which `trainfleet status` reads while the job runs and after.

    >>> p = Progress(run_id="r1", ranks={"gpu-node-1": range(0, 2)}, started_at=1000.0)
    >>> p.beat(0, {"step": 1, "total_steps": 10, "loss": 2.0}, now=1005.0)
    >>> p.beat(1, {"step": 1}, now=1005.1)
    >>> p.beat(0, {"step": 2}, now=1007.0)
    >>> p.to_json(state="running", now=1008.0)["ranks"][0]["step_times_s"]
    [2.0]
    >>> p.stuck_for(now=1010.0)  # since the last time any rank advanced
    3.0

Startup: beats that carry a phase (`beat(0, phase="tokenizing", phase_progress=n)`) before any
rank's first plain step beat are the run's startup; while it lasts, `in_startup` is True and the
launcher judges it by its own bound (`--startup-timeout`), not the hang timeout: a long
tokenization that keeps advancing is neither a hang nor a reason to raise the training one.
So is the end, once every rank has beaten its last step (`finishing`): a final save or export
advances no step.

    >>> s = Progress(run_id="r2", ranks={"n": range(0, 1)}, started_at=0.0)
    >>> s.beat(0, {"step": 0, "phase": "tokenizing", "phase_progress": 100}, now=10.0)
    >>> s.in_startup, s.stuck_for(now=40.0)
    (True, 30.0)
    >>> s.beat(0, {"step": 1}, now=50.0)
    >>> s.in_startup, s.training_started_at
    (False, 50.0)

status.json (version 1): `run_id`, `state` (the supervisor's RunState value, or `hung`),
`started_at`, `updated_at` (Unix seconds), `world_size`, `hang_timeout_s` (null: off), `nodes`
(node -> its ranks), `ranks` (per rank: `rank`, `node`, `step`, `total_steps`, `loss`,
`tokens_per_s`, `memory_bytes`, `busy_s`, `pid`, `phase`, `phase_progress`, `last_beat_at`;
`step_times_s` and `busy_times_s`: the last STEP_HISTORY seconds between a rank's successive
steps, and its busy seconds per step), `startup_timeout_s`, `training_started_at` (null while
the run is starting up: before the first plain step beat), `hang` (null, or what the watchdog
found: `status/hang.py`'s `Hang.to_json`), and `restarts`
(each `at`, `attempt`, `after_run`, `cause`), and `launcher` (`host`, `pid`, `pid_start`: the
process that writes the file, so that `trainfleet status` on that host can tell a launcher
that ended at once).
A rank that has not beaten yet has `step` null.
The file is replaced atomically, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import socket
from collections import deque
from pathlib import Path
from typing import Any

from trainfleet.heartbeat import STEPPING_PHASES
from trainfleet.localprocs import pid_start
from trainfleet.status.hang import Hang

STEP_HISTORY = 20
VERSION = 1
_FIELDS = ("total_steps", "loss", "tokens_per_s", "memory_bytes", "busy_s", "pid", "phase",
           "phase_progress")  # fmt: skip


class Progress:
    def __init__(self, *, run_id: str, ranks: dict[str, range], started_at: float) -> None:
        self.run_id = run_id
        self.started_at = started_at
        self.nodes = {node: list(r) for node, r in ranks.items()}
        self.rows: dict[int, dict[str, Any]] = {
            rank: {"rank": rank, "node": node, "step": None, "last_beat_at": None}
            for node, r in ranks.items()
            for rank in r
        }
        self.step_times: dict[int, deque[float]] = {
            rank: deque(maxlen=STEP_HISTORY) for rank in self.rows
        }
        self.busy_times: dict[int, deque[float]] = {
            rank: deque(maxlen=STEP_HISTORY) for rank in self.rows
        }
        self.last_advance: float | None = None
        """When any rank last reached a new step (None before the first beat)."""
        self.hang: Hang | None = None
        self.restarts: list[dict[str, Any]] = []
        self.hang_timeout_s: float | None = None
        self.startup_timeout_s: float | None = None
        self.training_started_at: float | None = None
        """When the first plain step beat (no phase, or `training`) came; None in startup."""
        pid = os.getpid()
        self.launcher = {"host": socket.gethostname(), "pid": pid, "pid_start": pid_start(pid)}

    def beat(self, rank: int, fields: dict[str, Any], *, now: float) -> None:
        """Rank `rank`'s heartbeat. `fields` are as `heartbeat.read` gives them (each of the
        type `beat` writes: what a node sent is checked there, and its rank against the node's
        own ranks in `launch/output.py`); a rank not in the run changes nothing."""
        row = self.rows.get(rank)
        if row is None:
            return
        step = fields["step"]
        if self.training_started_at is None and fields.get("phase") in STEPPING_PHASES:
            self.training_started_at = now
        if "phase" in fields and fields["phase"] != row.get("phase"):
            self.last_advance = now  # a new phase (saving, exporting) is progress too
            row.pop("phase_progress", None)  # it counts within one phase
        elif (fields.get("phase_progress") or 0) > (row.get("phase_progress") or 0):
            self.last_advance = now  # so is a long phase's advance (a save still writing)
        if row["step"] is None or step > row["step"]:
            # A step time is between two training steps, not from a startup beat to step 1.
            last, training = row["last_beat_at"], self.training_started_at
            timed = row["step"] is not None and last is not None and training is not None
            if timed and last >= training:
                per_step = (now - last) / (step - row["step"])
                self.step_times[rank].append(round(per_step, 4))
            row["step"], row["last_beat_at"] = step, now
            self.last_advance = now
        for name in _FIELDS:
            if name in fields:
                row[name] = fields[name]
        if "busy_s" in fields:
            self.busy_times[rank].append(fields["busy_s"])

    def stuck_for(self, *, now: float) -> float | None:
        """Seconds since any rank last advanced; None before the first beat."""
        return None if self.last_advance is None else now - self.last_advance

    @property
    def in_startup(self) -> bool:
        """Some rank has beaten, and every beat so far was a startup phase's."""
        return self.last_advance is not None and self.training_started_at is None

    @property
    def finishing(self) -> bool:
        """Every rank has beaten its last step (`step` == `total_steps`): what follows (the
        final save, an export, the teardown) advances no step."""
        rows = self.rows.values()
        return bool(rows) and all(
            row["step"] is not None and row.get("total_steps") and row["step"] >= row["total_steps"]
            for row in rows
        )

    def behind(self) -> list[int]:
        """The ranks at the lowest step (all of them when they are level): where a hang is."""
        steps = {
            rank: row["step"] if row["step"] is not None else -1 for rank, row in self.rows.items()
        }
        lowest = min(steps.values())
        return sorted(rank for rank, step in steps.items() if step == lowest)

    def rank_rows(self) -> list[dict[str, Any]]:
        """status.json's `ranks`: each rank's row with its recent step and busy times."""
        return [
            {**row, "step_times_s": list(self.step_times[rank]),
             "busy_times_s": list(self.busy_times[rank])}
            for rank, row in sorted(self.rows.items())
        ]  # fmt: skip

    def to_json(self, *, state: str, now: float) -> dict[str, Any]:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "state": state,
            "started_at": self.started_at,
            "updated_at": now,
            "world_size": len(self.rows),
            "hang_timeout_s": self.hang_timeout_s,
            "startup_timeout_s": self.startup_timeout_s,
            "training_started_at": self.training_started_at,
            "nodes": self.nodes,
            "ranks": self.rank_rows(),
            "hang": self.hang.to_json() if self.hang else None,
            "restarts": self.restarts,
            "launcher": self.launcher,
        }

    def write(self, path: Path, *, state: str, now: float) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(state=state, now=now), indent=1) + "\n")
        os.replace(tmp, path)
