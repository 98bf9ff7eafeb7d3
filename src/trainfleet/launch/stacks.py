"""Where every rank is: a Python stack dump of each rank on each node (py-spy), when the hang
watchdog fires.

    >>> where_it_waits(SAMPLE)
    'wait (torch/distributed/distributed_c10d.py:4817)'
    >>> where_it_waits("State:\\tT (stopped)\\n" + SAMPLE)
    'stopped (SIGSTOP or a debugger), in wait (torch/distributed/distributed_c10d.py:4817)'

On each node, `trainfleet.node.procs.dump_stacks` prints, per pid: the kernel's state of the
process (/proc/PID/status: `T (stopped)` is a SIGSTOP) and `py-spy dump --nonblocking`. py-spy
is looked up beside the node's python, then on PATH; without it the state line is all there
is, and the dump says how to install it (`pip install py-spy`). This module reads that output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SAMPLE = """Process 4242: python -u shim.py -m trainfleet.train.worker
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:4817)
    barrier (deepspeed/comm/torch.py:402)
"""

_RANK_HEADER = re.compile(r"^@@rank ([0-9]{1,9}) pid ([0-9]{1,10})$", re.M)
"""ASCII digits, bounded: the node writes it (`int()` of 5,000 digits raises)."""
_MAIN_THREAD = re.compile(r'^Thread \d+ \(\w+\): "MainThread"\n\s+(.+)$', re.M)
_ANY_THREAD = re.compile(r"^Thread \d+ \(\w+\).*\n\s+(.+)$", re.M)


def split_dump(text: str) -> dict[int, str]:
    """A node's dump_stacks output -> each rank's part."""
    parts = _RANK_HEADER.split(text)
    return {int(parts[i]): parts[i + 2].strip() + "\n" for i in range(1, len(parts) - 2, 3)}


_FLIGHT = re.compile(r"^@@flight (.*)\n?", re.M)


def take_flight_record(dump: str) -> tuple[dict[str, Any] | None, str]:
    """A rank's part of the dump -> (its Flight Recorder summary, when it wrote a readable one;
    the rest of the part).

    >>> take_flight_record('@@flight {"rank": 1}\\nState:\\tS (sleeping)\\n')
    ({'rank': 1}, 'State:\\tS (sleeping)\\n')
    >>> take_flight_record("@@flight {not json\\n")[0] is None
    True
    """
    found = _FLIGHT.search(dump)
    if not found:
        return None, dump
    rest = dump[: found.start()] + dump[found.end() :]
    try:
        record = json.loads(found.group(1))
    except (ValueError, RecursionError):  # (RecursionError: nested too deep to read)
        return None, rest
    return (record if isinstance(record, dict) else None), rest


def where_it_waits(dump: str) -> str:
    """The innermost frame of the main thread, and whether the process is stopped."""
    frame = _MAIN_THREAD.search(dump) or _ANY_THREAD.search(dump)
    where = frame.group(1).strip() if frame else None
    unanswered = re.search(r"^no stack: the node did not answer.*$", dump, re.M)
    if unanswered:
        return unanswered.group(0)
    if "State:\tgone" in dump:
        return "gone (the process has exited)"
    if re.search(r"^State:\s+T", dump, re.M):
        return "stopped (SIGSTOP or a debugger)" + (f", in {where}" if where else "")
    return where or "unknown (no stack: see the dump)"


def write_dumps(run_dir: Path, node: str, dumps: dict[int, str]) -> list[Path]:
    directory = run_dir / "stacks"
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for rank, text in sorted(dumps.items()):
        path = directory / f"{node}.rank{rank}.txt"
        path.write_text(text)
        written.append(path)
    return written


def write_flight_records(
    run_dir: Path, rows: dict[int, dict[str, Any]], records: dict[int, dict[str, Any] | None]
) -> None:
    """RUN_DIR/flight/NODE.rankN.json: each rank's Flight Recorder summary, as it came."""
    directory = run_dir / "flight"
    for rank, record in sorted(records.items()):
        if record is not None and rank in rows:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{rows[rank]['node']}.rank{rank}.json"
            path.write_text(json.dumps(record, indent=1) + "\n")
