"""Why a run ended, in one line, for the restart log (`--max-restarts`) and the give-up message.

    >>> from pathlib import Path
    >>> from trainfleet.launch.supervisor import LaunchResult, RunState
    >>> hung = LaunchResult(state=RunState.HUNG, exit_code=1, run_dir=Path("r"), seconds=9.0,
    ...     node_codes={}, hang={"step": 19, "stuck_s": 3.2, "behind": [
    ...         {"node": "gpu-node-2", "rank": 1, "where": "stopped (SIGSTOP or a debugger)"}]})
    >>> print(cause_of(hung))  # doctest: +ELLIPSIS
    rank-hung: no rank advanced past step 19 for 3 s; gpu-node-2 rank 1: stopped (SIGSTOP...)

A run restarts (up to --max-restarts times) after FAILED (a rank crashed, a node's connection
dropped), HUNG and STALLED; never after DONE or INTERRUPTED (Ctrl-C is the user's). Every
restart is a new launch: the quick preflight again, a new run id and run directory, and the
training resumes from its latest complete checkpoint. Each one is appended to
OUTPUT/restarts.jsonl and carried into the next run's status.json.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from trainfleet.launch.supervisor import LaunchResult, RunState, channel_end

RESTARTABLE = (RunState.FAILED, RunState.HUNG, RunState.STALLED)
_DISK_FULL = re.compile(r"No space left on device|the next checkpoint needs about")
"""train's free-space check (`train/checkpoints.py`) and the kernel's ENOSPC text."""


def cause_of(result: LaunchResult) -> str:
    if result.state is RunState.HUNG and result.hang:
        hang = result.hang
        behind = "; ".join(f"{b['node']} rank {b['rank']}: {b['where']}" for b in hang["behind"])
        return (
            f"rank-hung: no rank advanced past step {hang.get('step')} for"
            f" {hang.get('stuck_s', 0):.0f} s; {behind}"
        )
    if result.state is RunState.STALLED:
        missing = ", ".join(f"{node} (ranks {ranks})" for node, ranks in result.not_joined.items())
        return f"rendezvous-timeout: not joined: {missing}"
    root = result.root_cause
    first = result.first_failure
    if first and (root is None or (root.consequence and root.node != first)):
        # The node that failed first printed nothing of its own (a lost connection, a kill);
        # what the others printed is the stop reaching them.
        code = result.node_codes.get(first)
        why = channel_end(code) if code is not None else "no exit code"
        return f"rank-crashed: {first} failed first ({why})"
    if root is not None:
        where = f"{root.node} rank {root.rank}" if root.rank is not None else root.node
        finding = "disk-low" if _DISK_FULL.search(root.text) else "rank-crashed"
        return f"{finding}: {where}: {root.text}"
    return f"{result.state.value} (exit code {result.exit_code})"


def record(log: Path, *, attempt: int, run_id: str, cause: str) -> dict:
    """Append one restart to `log` (JSON lines) and return it."""
    entry = {"at": time.time(), "attempt": attempt, "after_run": run_id, "cause": cause}
    with open(log, "a") as file:
        file.write(json.dumps(entry) + "\n")
    return entry
