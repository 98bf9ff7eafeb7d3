"""Heartbeats: a rank tells the launcher how far it got, at every step (stdlib only).

    >>> import io
    >>> out = io.StringIO()
    >>> beat(12, total_steps=100, loss=1.5, stream=out, run_id="r1", rank=3)  # doctest: +ELLIPSIS
    >>> out.getvalue()  # doctest: +ELLIPSIS
    '@@trainfleet:r1:beat:3:{"step": 12, "pid": ..., "total_steps": 100, "loss": 1.5}\\n'

Any script started by `trainfleet launch` can call `beat(step, ...)` once per step; `trainfleet
train` does on every rank. The line goes to stderr, travels over the node's existing ssh
connection with the rest of the output, and the launcher takes it out of the merged output:
it becomes the rank's row in RUN_DIR/status.json (`trainfleet status`) and the evidence the
hang watchdog (`--hang-timeout`) judges progress by. Outside a launch (no TRAINFLEET_RUN_ID)
nothing is written.

Fields (all optional but `step`): `total_steps` (for the ETA), `loss`, `tokens_per_s`,
`memory_bytes` (peak GPU memory, or host RSS on CPU), `busy_s`: the seconds of the last step
this rank spent computing rather than waiting for the others (in synchronous training every
rank's step takes as long as the slowest rank's, so only this tells a straggler apart);
`phase` (e.g. `saving`, `exporting`): a change of phase counts as progress for the hang
watchdog; `phase_progress`: any number that grows while a long phase advances (the bytes of a
checkpoint written so far, `train.checkpoints.tree_bytes`): each increase counts as progress
too. `beating(...)` sends such beats from a thread while a phase runs, so that a checkpoint
save that takes longer than the hang timeout is not a hang while it is still writing, and is
one once it writes nothing.

The launcher reads a beat as data from a node (`read`): `step`, `total_steps`, `memory_bytes`
whole numbers (0 to MAX_COUNT), `pid` a process id, `loss`, `tokens_per_s`, `busy_s` and
`phase_progress` finite numbers, `phase` short printable text. A beat without a valid `step`
is ignored; a field that is none of these is left out (a NaN loss too: status.json stays JSON),
and the launcher says so once per node.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from trainfleet.node.shim import MARK, RUN_ID_ENV, SAVE_BEAT_EVERY_S, periodically

HANG_TIMEOUT_S = 300.0
"""The default of `--hang-timeout` on `trainfleet launch` and `trainfleet train`: seconds
without a step (or a phase's progress) after the first step before a run is HUNG. Only a run
whose ranks beat is judged: a script that never calls `beat` is never stopped by it."""
STEPPING_PHASES = (None, "training")
"""Phases in which a rank beats at every step; before the first such beat a phase is startup
(loading, tokenizing), after it another phase (saving) is not silence."""


def beat(
    step: int,
    *,
    total_steps: int | None = None,
    loss: float | None = None,
    tokens_per_s: float | None = None,
    memory_bytes: int | None = None,
    busy_s: float | None = None,
    phase: str | None = None,
    phase_progress: float | None = None,
    stream: IO[str] | None = None,
    run_id: str | None = None,
    rank: int | None = None,
) -> None:
    run_id = run_id or os.environ.get(RUN_ID_ENV)
    if not run_id:
        return
    rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
    fields: dict[str, Any] = {"step": int(step), "pid": os.getpid()}
    extra = {
        "total_steps": total_steps,
        "loss": loss,
        "tokens_per_s": tokens_per_s,
        "memory_bytes": memory_bytes,
        "busy_s": busy_s,
        "phase": phase,
        "phase_progress": phase_progress,
    }
    fields.update({k: v for k, v in extra.items() if v is not None})
    stream = stream or sys.stderr
    stream.write(f"{MARK}:{run_id}:beat:{rank}:{json.dumps(fields)}\n")
    stream.flush()


@contextlib.contextmanager
def beating(
    step: int,
    *,
    phase: str,
    measure: Callable[[], float],
    every: float = SAVE_BEAT_EVERY_S,
    **beat_fields: Any,
) -> Iterator[None]:
    """Beat `phase` now, then every `every` seconds with `phase_progress=measure()` until the
    block ends (a daemon thread; `measure` errors count as no progress).

    >>> import io
    >>> out, sizes = io.StringIO(), iter([10, 20, 20, 20])
    >>> with beating(5, phase="saving", measure=lambda: next(sizes), every=0.01, stream=out,
    ...              run_id="r1", rank=0):
    ...     import time; time.sleep(0.05)
    >>> '"phase_progress": 20' in out.getvalue()
    True
    """

    def progress() -> float | None:
        try:
            return measure()
        except (OSError, StopIteration):
            return None

    def send() -> None:
        beat(step, phase=phase, phase_progress=progress(), **beat_fields)

    with periodically(send, every, f"trainfleet-beat-{phase}"):
        yield


MAX_COUNT = 2**63 - 1
"""The largest step, total_steps or memory_bytes the launcher reads (any JSON reader holds it)."""
PID_MAX = 1 << 22
"""Linux's PID_MAX_LIMIT: no process id is larger."""
MAX_PHASE = 64
"""The longest phase name the launcher reads."""


def _count(value: Any, low: int = 0, high: int = MAX_COUNT) -> bool:
    return type(value) is int and low <= value <= high


def _number(value: Any) -> bool:
    """A finite JSON number (not a bool; NaN and infinities are not finite, nor is an integer
    too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "pid": (lambda v: _count(v, 1, PID_MAX), f"a process id (1 to {PID_MAX})"),
    "total_steps": (_count, "a whole number of steps"),
    "memory_bytes": (_count, "a whole number of bytes"),
    "loss": (_number, "a finite number"),
    "tokens_per_s": (lambda v: _number(v) and v >= 0, "a finite number >= 0"),
    "busy_s": (lambda v: _number(v) and v >= 0, "a finite number of seconds >= 0"),
    "phase": (lambda v: isinstance(v, str) and 0 < len(v) <= MAX_PHASE and v.isprintable(),
              f"printable text of 1 to {MAX_PHASE} characters"),
    "phase_progress": (_number, "a finite number"),
}  # fmt: skip
"""What each field of `beat` must be, as the launcher reads it from a node."""


def _shown(value: Any) -> str:
    """A node's value in a note: repr escapes control characters; cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read(payload: str) -> tuple[dict[str, Any], list[str]]:
    """A beat line's payload (after `beat:RANK:`), read as the launcher reads what a node
    sends: (the fields that are what `beat` writes, what was wrong with the others, which are
    left out). ValueError, saying why, when it is no beat at all: not a JSON object, or no
    whole-number `step`. A null field is one not sent; an unknown field is left out without a
    word (a newer trainfleet on a node may send more).

    >>> read('{"step": 3, "loss": NaN, "phase": "saving", "pid": 7}')
    ({'step': 3, 'pid': 7, 'phase': 'saving'}, ['`loss` is nan, not a finite number'])
    >>> read('{"step": "3"}')
    Traceback (most recent call last):
    ValueError: `step` is '3', not a whole number of steps
    """
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):  # (RecursionError: nested too deep to read)
        raise ValueError("not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    if not _count(doc.get("step")):
        raise ValueError(f"`step` is {_shown(doc.get('step'))}, not a whole number of steps")
    fields: dict[str, Any] = {"step": doc["step"]}
    problems = []
    for name, (check, what) in _CHECKS.items():
        value = doc.get(name)
        if value is None:
            continue
        if check(value):
            fields[name] = value
        else:
            problems.append(f"`{name}` is {_shown(value)}, not {what}")
    return fields, problems


def parse(payload: str) -> dict[str, Any] | None:
    """The fields of a beat line's payload that `read` accepts; None when it is no beat.

    >>> parse('{"step": 3, "loss": 0.5}')
    {'step': 3, 'loss': 0.5}
    >>> parse('{"loss": 0.5}') is None
    True
    """
    try:
        return read(payload)[0]
    except ValueError:
        return None
