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
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

MARK = "@@trainfleet"  # the shim's; the launcher reads both
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
    run_id = run_id or os.environ.get("TRAINFLEET_RUN_ID")
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


SAVE_BEAT_EVERY_S = 10.0


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
    stop = threading.Event()

    def progress() -> float | None:
        try:
            return measure()
        except (OSError, StopIteration):
            return None

    def loop() -> None:
        while not stop.wait(every):
            beat(step, phase=phase, phase_progress=progress(), **beat_fields)

    beat(step, phase=phase, phase_progress=progress(), **beat_fields)
    thread = threading.Thread(target=loop, name=f"trainfleet-beat-{phase}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def parse(payload: str) -> dict[str, Any] | None:
    """The fields of a beat line's payload (after `beat:RANK:`); None when malformed.

    >>> parse('{"step": 3, "loss": 0.5}')
    {'step': 3, 'loss': 0.5}
    >>> parse('{"loss": 0.5}') is None
    True
    """
    try:
        fields = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("step"), int):
        return None
    return fields
