"""Why a run ended, in one line, for the restart log (`--max-restarts`) and the give-up message.

    >>> from pathlib import Path
    >>> from trainfleet.launch.result import LaunchResult, RunState
    >>> from trainfleet.status.hang import Hang
    >>> hang = Hang.from_json({"step": 19, "stuck_s": 3.2, "behind": [
    ...     {"node": "gpu-node-2", "rank": 1, "where": "stopped (SIGSTOP or a debugger)"}]})
    >>> hung = LaunchResult(state=RunState.HUNG, exit_code=1, run_dir=Path("r"), seconds=9.0,
    ...     node_codes={}, hang=hang)
    >>> print(cause_of(hung))  # doctest: +ELLIPSIS
    rank-hung: no rank advanced past step 19 for 3 s; gpu-node-2 rank 1: stopped (SIGSTOP...)

A run restarts (up to --max-restarts times) after FAILED (a rank crashed, a node's connection
dropped), HUNG and STALLED; never after DONE or INTERRUPTED (Ctrl-C is the user's). Every
restart is a new launch (`launch_with_restarts`): the quick preflight again, a new run id and
run directory, TRAINFLEET_RESTART=N on every rank; `trainfleet train` resumes from its latest
complete checkpoint, a script given to `trainfleet launch` resumes from its own. Each restart
is appended to a JSON-lines log (OUTPUT/restarts.jsonl for train, the first run directory's
restarts.jsonl for launch) and carried into the next run's status.json. A cause starts with
its finding id (docs/findings.md); whether to restart is decided by that id (`PERMANENT`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport
from trainfleet.errors import TrainfleetError
from trainfleet.launch import launch, new_run_id, prepare
from trainfleet.launch.backend import Plan
from trainfleet.launch.options import LaunchOptions
from trainfleet.launch.result import LaunchResult, RunState, channel_end

RESTARTABLE = (RunState.FAILED, RunState.HUNG, RunState.STALLED)
_DISK_FULL = re.compile(r"No space left on device|the next checkpoint needs about")
"""train's free-space check (`train/checkpoints.py`) and the kernel's ENOSPC text."""
_NOT_SHARED = re.compile(r"is not shared storage")
"""train's check that every rank sees OUTPUT (`train/worker.py`): a restart meets it again."""
PERMANENT = (FindingId.OUTPUT_NOT_SHARED,)
"""Causes that a restart would meet again: no restart is made after them."""


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a run ended: its finding id (None when nothing names one) and what happened."""

    id: FindingId | None
    detail: str

    def __str__(self) -> str:
        return self.detail if self.id is None else f"{self.id}: {self.detail}"


def end_cause(result: LaunchResult) -> Cause:
    if result.state is RunState.HUNG and result.hang:
        behind = "; ".join(f"{b.node} rank {b.rank}: {b.where}" for b in result.hang.behind)
        finding, headline = result.hang.headline()
        return Cause(finding, f"{headline}; {behind}")
    if result.state is RunState.STALLED:
        missing = ", ".join(f"{node} (ranks {ranks})" for node, ranks in result.not_joined.items())
        return Cause(FindingId.RENDEZVOUS_TIMEOUT, f"not joined: {missing}")
    root = result.root_cause
    first = result.first_failure
    if first and (root is None or (root.consequence and root.node != first)):
        # The node that failed first printed nothing of its own (a lost connection, a kill);
        # what the others printed is the stop reaching them.
        code = result.node_codes.get(first)
        why = channel_end(code) if code is not None else "no exit code"
        return Cause(FindingId.RANK_CRASHED, f"{first} failed first ({why})")
    if root is not None:
        where = f"{root.node} rank {root.rank}" if root.rank is not None else root.node
        finding = FindingId.RANK_CRASHED
        if _DISK_FULL.search(root.text):
            finding = FindingId.DISK_LOW
        elif _NOT_SHARED.search(root.text):
            finding = FindingId.OUTPUT_NOT_SHARED
        return Cause(finding, f"{where}: {root.text}")
    return Cause(None, f"{result.state.value} (exit code {result.exit_code})")


def cause_of(result: LaunchResult) -> str:
    """`end_cause` in the one line the restart log and the messages keep."""
    return str(end_cause(result))


def record(log: Path, *, attempt: int, run_id: str, cause: str) -> dict:
    """Append one restart to `log` (JSON lines) and return it."""
    entry = {"at": time.time(), "attempt": attempt, "after_run": run_id, "cause": cause}
    with open(log, "a") as file:
        file.write(json.dumps(entry) + "\n")
    return entry


def launch_with_restarts(
    cluster: Cluster,
    options: LaunchOptions,
    *,
    max_restarts: int,
    run_dir_of: Callable[[LaunchOptions], Path],
    log: Path,
    then: str,
    preflight: bool = True,
    on_first_plan: Callable[[Plan, DoctorReport], None] | None = None,
    out: TextIO | None = None,
    requeued: list[dict] | None = None,
) -> tuple[LaunchResult, Plan]:
    """Prepare and launch; after a restartable end, up to `max_restarts` times again with a new
    run id (`run_dir_of` names each attempt's run directory). The first attempt's preflight
    errors are raised as they are (PreflightFailed: nothing started); a later one's give up
    with every cause so far. `on_first_plan` runs once, before the first launch; `then` ends
    the restart message ("the command starts again"). `requeued`: the starts of this Slurm
    job before this one (`--requeue`), shown with the restarts in status, not counted."""
    out = out or sys.stdout
    restarts: list[dict] = []
    while True:
        attempt = options
        if restarts:
            # Counted on from the Slurm job's own restarts (`--requeue`), if any.
            restart = options.restart + len(restarts)
            attempt = dataclasses.replace(options, run_id=new_run_id(), restart=restart)
        run_dir = run_dir_of(attempt)
        try:
            plan, report = prepare(cluster, attempt, preflight=preflight, run_dir=run_dir)
        except TrainfleetError as exc:
            if not restarts:
                raise
            raise TrainfleetError(
                f"gave up restarting: the preflight before restart {len(restarts)} found:"
                f" {exc.what}; " + causes(restarts),
                exc.fix,
            ) from None
        if not restarts and on_first_plan:
            on_first_plan(plan, report)
        result = launch(plan, cluster, run_dir=run_dir, out=out,
                        restarts=[*(requeued or []), *restarts])  # fmt: skip
        if result.state not in RESTARTABLE or len(restarts) >= max_restarts:
            return result, plan
        if result.signalled:  # the job's time is up: Slurm requeues it (`--requeue`)
            return result, plan
        ended = end_cause(result)
        cause = str(ended)
        if ended.id in PERMANENT:
            print(f"trainfleet: no restart: a restart would meet {cause}", file=out, flush=True)
            return result, plan
        attempts = len(restarts) + 1
        restarts.append(record(log, attempt=attempts, run_id=attempt.run_id, cause=cause))
        print(
            f"trainfleet: restart {attempts} of {max_restarts} after {cause}: quick preflight,"
            f" then {then}",
            file=out,
            flush=True,
        )


def slurm_restart(log: Path, *, job: str, restart: int, run_id: str) -> list[dict]:
    """This Slurm job started again (SLURM_RESTART_COUNT `restart`, `--requeue`): logged as
    an attempt; every attempt logged so far, for status."""
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    record(log, attempt=restart, run_id=run_id, cause=f"Slurm started job {job} again")
    entries = []
    for line in log.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue  # a line cut short when the job was killed
    return entries


def causes(restarts: list[dict]) -> str:
    return "causes: " + "; ".join(f"{r['attempt']}. {r['cause']}" for r in restarts)
