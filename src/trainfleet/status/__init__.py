"""`trainfleet status`: every node's and rank's progress, from the RUN_DIR/status.json that the
launcher rewrites every second while a job runs and once at its end (stdlib only).

    >>> import json, tempfile
    >>> run_dir = Path(tempfile.mkdtemp())
    >>> row = {"rank": 0, "node": "n1", "step": 10, "total_steps": 20, "last_beat_at": 50.0,
    ...        "step_times_s": [1.5, 2.0, 2.5]}
    >>> doc = {"version": 1, "run_id": "r1", "state": "running", "started_at": 0.0,
    ...        "updated_at": 50.5, "world_size": 1, "nodes": {"n1": [0]}, "ranks": [row]}
    >>> _ = (run_dir / "status.json").write_text(json.dumps(doc))
    >>> view = read_view(find_status_file(run_dir, cwd=Path("/")), now=51.0)
    >>> view.state, view.eta_s, view.ranks[0].since_beat_s  # 10 steps left x 2.0 s
    ('running', 20.0, 1.0)

Modules: `rundir` (finding the file: a run dir, a `trainfleet train` OUTPUT, where a launch was
started; reading and checking it), `view` (the data shown), `rules` (ETA, stragglers, silent
ranks), `human` (the human view: header, table, notes), `hang` (the hang record, which the
launcher writes too). `launch/progress.py` documents the file's schema.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainfleet.localprocs import pid_start
from trainfleet.status.human import render
from trainfleet.status.rules import MARGIN, build_view
from trainfleet.status.rundir import find_status_file, load_status
from trainfleet.status.view import StatusView

__all__ = ["MARGIN", "StatusView", "find_status_file", "read_view", "render", "watch"]


def read_view(path: Path, *, now: float | None = None, margin: float = MARGIN) -> StatusView:
    """The view of the status.json at `path`, at `now` (default: the clock)."""
    now = time.time() if now is None else now
    status = load_status(path)
    return build_view(
        status,
        now=now,
        margin=margin,
        status_file=str(path),
        launcher_gone=launcher_gone(status.get("launcher")),
    )


def launcher_gone(launcher: dict[str, Any] | None) -> bool | None:
    """Whether the launcher that writes the file has ended: known only on its own host (no
    process has its pid and start time now); None elsewhere, or without `launcher`."""
    if not launcher or launcher.get("host") != socket.gethostname():
        return None
    pid, started = launcher.get("pid"), launcher.get("pid_start")
    if not isinstance(pid, int) or not isinstance(started, int):
        return None
    return pid_start(pid) != started  # None: no such process; another start: a reused pid


def watch(
    path: Path,
    *,
    interval: float,
    margin: float = MARGIN,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[StatusView]:
    """A view every `interval` seconds while the run is starting or running; the last one is
    the first that is not (the final view)."""
    while True:
        view = read_view(path, margin=margin)
        yield view
        if not view.live:
            return
        sleep(interval)
