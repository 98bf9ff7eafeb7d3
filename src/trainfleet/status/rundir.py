"""Where a run's status.json is, and reading it: every way it can be wrong is an error that
names the file and the fix.

    >>> try:
    ...     check_status({"version": 9}, "runs/r1/status.json")
    ... except TrainfleetError as exc:
    ...     print(exc.what)
    ...     print(exc.fix)
    runs/r1/status.json: status.json version 9, this trainfleet reads version 1
    upgrade trainfleet on this machine to the launcher's version

Run directories: `trainfleet launch` writes RUN_DIR/status.json, RUN_DIR being --run-dir or
trainfleet-runs/RUN_ID under the directory it was started from; `trainfleet train` uses
OUTPUT/runs/RUN_ID. `find_status_file` takes any of: the run dir, its status.json, a
`trainfleet train` OUTPUT dir, a trainfleet-runs dir, or the directory a launch was started
from; a directory with several runs gives its newest (the latest `started_at`). A launch's
run dir that was restarted (`--max-restarts`: RUN_DIR.restart-1, -2... beside it; a Slurm
job's later starts, `--requeue`: RUN_DIR.requeue-1...) gives its latest attempt; its own
status.json, passed as a file, gives the first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainfleet.errors import TrainfleetError

STATUS_FILE = "status.json"
VERSION = 1
"""The status.json version this reads (`launch.progress.VERSION`, which a test holds it to)."""
KNOWN_STATES = ("starting", "running", "done", "failed", "stalled", "interrupted", "hung")
RUN_PARENTS = ("runs", "trainfleet-runs")
"""Where runs are, under an OUTPUT dir (`trainfleet train`) or a launch's directory."""
_HOW = (
    "pass the run directory (`trainfleet launch` puts it in trainfleet-runs/RUN_ID, or "
    "--run-dir) or a `trainfleet train` OUTPUT directory: trainfleet status RUN_DIR"
)
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "run_id": str,
    "state": str,
    "started_at": (int, float),
    "updated_at": (int, float),
    "world_size": int,
    "ranks": list,
}
_RANK_FIELDS: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "node": (str,),
    "step": (int, type(None)),
    "last_beat_at": (int, float, type(None)),
    "total_steps": (int, type(None)),
    "loss": (int, float, type(None)),
    "tokens_per_s": (int, float, type(None)),
    "memory_bytes": (int, float, type(None)),
    "phase": (str, type(None)),
    "phase_progress": (int, float, type(None)),
    "pid": (int, type(None)),
}
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "nodes": (dict, type(None)),
    "hang_timeout_s": (int, float, type(None)),
    "startup_timeout_s": (int, float, type(None)),
    "training_started_at": (int, float, type(None)),
    "hang": (dict, type(None)),
    "restarts": (list, type(None)),
    "launcher": (dict, type(None)),
}


def _started_at(path: Path) -> float:
    """For picking the newest run: its start, else when its file was last written."""
    try:
        started = json.loads(path.read_text()).get("started_at")
        if isinstance(started, int | float):
            return float(started)
    except (OSError, ValueError, AttributeError):
        pass
    return path.stat().st_mtime


def _latest_attempt(run_dir: Path) -> Path:
    """`launch --max-restarts` runs attempt M in RUN_DIR.restart-M beside the first; a Slurm
    job's start N (`--requeue`) runs in RUN_DIR.requeue-N, its restarts in
    RUN_DIR.requeue-N.restart-M."""
    attempts = {run_dir: (0, 0)}
    for later in run_dir.parent.glob(f"{run_dir.name}.*/{STATUS_FILE}"):
        found = re.fullmatch(r"(?:\.requeue-(\d+))?(?:\.restart-(\d+))?",
                             later.parent.name.removeprefix(run_dir.name))  # fmt: skip
        if found and any(found.groups()):
            attempts[later.parent] = (int(found[1] or 0), int(found[2] or 0))
    return max(attempts, key=attempts.__getitem__)


def find_status_file(run_dir: Path | None, *, cwd: Path) -> Path:
    """The status.json for `trainfleet status [RUN_DIR]` run from `cwd`."""
    given = run_dir is not None
    directory = (cwd / run_dir) if run_dir is not None else cwd
    if given and directory.is_file():
        return directory
    if given and not directory.exists():
        raise TrainfleetError(f"{run_dir}: no such directory", _HOW)
    if (directory / STATUS_FILE).is_file():
        return _latest_attempt(directory) / STATUS_FILE
    candidates = [p for sub in RUN_PARENTS for p in (directory / sub).glob(f"*/{STATUS_FILE}")]
    if given or directory.name in RUN_PARENTS:  # (not any */status.json under a project)
        candidates += directory.glob(f"*/{STATUS_FILE}")
    if candidates:
        return max(candidates, key=lambda p: (_started_at(p), str(p)))
    runs = [p for sub in RUN_PARENTS for p in (directory / sub).glob("*/") if p.is_dir()]
    without = f" ({len(runs)} run dir(s) there have none)" if runs else ""
    places = f"{STATUS_FILE}, runs/*/{STATUS_FILE} or trainfleet-runs/*/{STATUS_FILE}"
    if given:
        raise TrainfleetError(f"{run_dir}: no {places} in it{without}", _HOW)
    raise TrainfleetError(f"no run found from here ({cwd}): no {places}{without}", _HOW)


def load_status(path: Path) -> dict[str, Any]:
    """status.json, read and checked (`check_status`)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TrainfleetError(
            f"{path}: no such file", "the run may have been moved or deleted; " + _HOW
        ) from None
    except PermissionError:
        raise TrainfleetError(
            f"{path}: permission denied",
            "run dirs are private (mode 700): run this as the user who launched the job",
        ) from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TrainfleetError(
            f"{path}: not valid JSON ({exc})",
            "the launcher replaces it whole, so something else wrote or damaged it; "
            f"the run's logs are in {path.parent / 'logs'}",
        ) from None
    return check_status(doc, str(path))


def _bad(source: str, problem: str) -> TrainfleetError:
    return TrainfleetError(
        f"{source}: {problem}",
        "not a status.json written by `trainfleet launch` (see trainfleet.launch.progress)",
    )


def check_status(doc: Any, source: str) -> dict[str, Any]:
    """`doc` if it is a status.json this version of trainfleet reads; else TrainfleetError."""
    if not isinstance(doc, dict):
        raise _bad(source, f"a JSON {type(doc).__name__}, not an object")
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise TrainfleetError(
            f"{source}: status.json version {version}, this trainfleet reads version {VERSION}",
            "upgrade trainfleet on this machine to the launcher's version",
        )
    if version != VERSION:
        raise _bad(source, f"version {version!r}, expected {VERSION}")
    for key, kind in _REQUIRED.items():
        if not isinstance(doc.get(key), kind):
            raise _bad(source, f"`{key}` is {doc.get(key)!r}")
    for key, kinds in _OPTIONAL.items():
        if not isinstance(doc.get(key), kinds):
            raise _bad(source, f"`{key}` is {doc.get(key)!r}")
    if not all(isinstance(r, dict) for r in doc.get("restarts") or []):
        raise _bad(source, f"`restarts` is {doc['restarts']!r}, not a list of objects")
    if doc["state"] not in KNOWN_STATES:
        raise TrainfleetError(
            f"{source}: unknown state {doc['state']!r} (known: {', '.join(KNOWN_STATES)})",
            "upgrade trainfleet on this machine to the launcher's version",
        )
    for i, row in enumerate(doc["ranks"]):
        if not isinstance(row, dict):
            raise _bad(source, f"ranks[{i}] is {row!r}")
        for key, kinds in _RANK_FIELDS.items():
            if not isinstance(row.get(key), kinds) or isinstance(row.get(key), bool):
                raise _bad(source, f"ranks[{i}].{key} is {row.get(key)!r}")
        for key in ("step_times_s", "busy_times_s"):
            values = row.get(key, [])
            if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
                raise _bad(source, f"ranks[{i}].{key} is {values!r}, not a list of seconds")
    return doc
