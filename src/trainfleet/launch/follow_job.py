"""Following a submitted batch job from the login node until it ends (`follow`): its state
as it changes (`scontrol show job`, once a second), its output file as it grows, and how it
ended (`JobEnd`: its exit code as a shell would give it, and why, where Slurm ended it).

    >>> import io
    >>> end = follow("9", Path("/nonexistent/slurm-9.out"), out=io.StringIO(), say=print,
    ...              poll_s=0, look_at=lambda job: JobState(state=GONE))
    job 9: GONE
    >>> end.exit_code, end.why
    (1, "slurmctld no longer holds it, and Slurm's accounting (`sacct -j JOB`) has its end")

Ctrl-C asks trainfleet in the running job to stop its ranks (`scancel --batch --signal=INT`),
then cancels the job if it still runs (`scancel`), and waits until Slurm says it ended; a
closed terminal leaves the job running. A job submitted with `--requeue` is followed across
its starts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainfleet.launch.batch_job import GONE, JobState, cancel, look

REQUEUED_FROM = frozenset(("PREEMPTED", "NODE_FAIL", "REQUEUED"))
"""States a requeueable job (`--requeue`) passes through on its way back to PENDING."""
REQUEUE_WAIT_S = 120.0
"""How long a requeueable job may stay in one of them before it is taken as its end."""
WHY_ENDED = {
    GONE: "slurmctld no longer holds it, and Slurm's accounting (`sacct -j JOB`) has its end",
    "TIMEOUT": "it reached its time limit (--time)",
    "NODE_FAIL": "one of its nodes failed (Slurm's reason above)",
    "OUT_OF_MEMORY": "a step exceeded the memory Slurm gave it (--mem, --mem-per-gpu)",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "it reached its --deadline",
    "PREEMPTED": "a job of a higher priority took its nodes",
}
STOP_WAIT_S = 30.0
"""How long Ctrl-C lets trainfleet in the job stop its ranks (it gives each node 5 s between
SIGTERM and SIGKILL) before Slurm is asked to end the job."""
CANCEL_WAIT_S = 90.0
"""How long it then waits for Slurm to end the job: its steps get SIGTERM, then SIGKILL after
KillWait (30 s by default)."""
NO_OUTPUT_AFTER_S = 30.0
"""A running job whose output file has not appeared here by then is said to write it where
this machine does not see it."""


class OutputTail:
    """The job's output file, read as it grows: whole lines out, a partial one kept."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path = path
        self.out = out
        self.offset = 0
        self.partial = b""

    @property
    def seen(self) -> bool:
        return self.offset > 0 or self.path.exists()

    def read(self, *, final: bool = False) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        data = self.partial + data
        cut = len(data) if final else data.rfind(b"\n") + 1
        whole, self.partial = data[:cut], data[cut:]
        if whole:
            text = whole.decode(errors="replace")
            self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()


@dataclass(kw_only=True, slots=True, frozen=True)
class JobEnd:
    job: str
    state: str
    exit_code: int
    cancelled_here: bool = False
    why: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"job_id": self.job, "state": self.state, "exit_code": self.exit_code,
                "cancelled_here": self.cancelled_here, "why": self.why}  # fmt: skip


class _Watch:
    """What following one job has seen so far: its last state, since when it runs, whether
    it was cancelled from here, and its output file read so far."""

    def __init__(
        self, job: str, output: Path, out: TextIO, say: Callable[[str], None], requeue: bool
    ) -> None:
        self.job = job
        self.requeue = requeue
        self.requeuing_since: float | None = None
        self.output = output
        self.tail = OutputTail(output, out)
        self.say = say
        self.last: JobState | None = None
        self.heard_at = time.monotonic()
        self.running_since: float | None = None
        self.stop_asked_at: float | None = None
        self.cancelled_at: float | None = None
        self.warned_no_output = False

    def saw(self, now: JobState | None) -> bool:
        """One look; whether following is over."""
        self.tail.read()
        clock = time.monotonic()
        if now is None:
            # slurmctld forgot the job (MinJobAge) or has not answered for two minutes.
            return clock - self.heard_at > 120
        self.heard_at = clock
        if self.last is not None and now.restarts > self.last.restarts:
            self.say(f"job {self.job}: Slurm requeued it: start {now.restarts + 1} follows")
        if self.last is None or now.said() != self.last.said():
            self.say(f"job {self.job}: {now.said()}")
        self.last = now
        if now.state == "RUNNING" and self.running_since is None:
            self.running_since = clock
        if self.requeue and now.state in REQUEUED_FROM and not self.stopping:
            # On its way back to the queue, unless it stays there.
            self.requeuing_since = self.requeuing_since or clock
            return clock - self.requeuing_since > REQUEUE_WAIT_S
        self.requeuing_since = None
        if now.ended:
            return True
        if (self.running_since is not None and not self.tail.seen and not self.warned_no_output
                and clock - self.running_since > NO_OUTPUT_AFTER_S):  # fmt: skip
            self.warned_no_output = True
            self.say(
                f"{self.output} has not appeared {NO_OUTPUT_AFTER_S:g} s after job {self.job}"
                " started: this machine may not share that directory with the job's first node."
                f" The job goes on: `squeue -j {self.job}`, `scancel {self.job}`"
            )
        if self.stop_asked_at is not None and clock - self.stop_asked_at > STOP_WAIT_S:
            self.say(f"job {self.job} still runs {STOP_WAIT_S:g} s on: scancel {self.job}")
            self.cancel()
        if self.cancelled_at is not None and clock - self.cancelled_at > CANCEL_WAIT_S:
            self.say(f"job {self.job} still runs {CANCEL_WAIT_S:g} s after scancel: `squeue`")
            return True
        return False

    @property
    def stopping(self) -> bool:
        return self.stop_asked_at is not None or self.cancelled_at is not None

    def stop(self) -> None:
        """Ctrl-C: a running job's trainfleet is asked to stop its ranks; a job not running yet
        is cancelled."""
        if self.last is not None and self.last.state == "RUNNING":
            self.say(
                f"Ctrl-C: stopping job {self.job} (scancel --batch --signal=INT {self.job}: its"
                " trainfleet stops every rank, then the job ends)"
            )
            cancel(self.job, ask_trainfleet=True)
            self.stop_asked_at = time.monotonic()
        else:
            self.say(f"Ctrl-C: cancelling job {self.job} (scancel {self.job})")
            self.cancel()

    def cancel(self) -> None:
        cancel(self.job)
        self.stop_asked_at = None
        self.cancelled_at = time.monotonic()

    def end(self) -> JobEnd:
        self.tail.read(final=True)
        cancelled = self.stopping
        last = self.last
        if last is None or not last.ended:
            return JobEnd(
                job=self.job,
                state=last.state if last else "UNKNOWN",
                exit_code=130 if cancelled else 1,
                cancelled_here=cancelled,
                why=f"Slurm no longer says how it ended (see `sacct -j {self.job}`)",
            )
        if cancelled:
            return JobEnd(job=self.job, state=last.state, exit_code=130, cancelled_here=True)
        return JobEnd(
            job=self.job, state=last.state, exit_code=last.exit_code, why=WHY_ENDED.get(last.state)
        )


def follow(
    job: str,
    output: Path,
    *,
    out: TextIO,
    say: Callable[[str], None],
    poll_s: float = 1.0,
    look_at: Callable[[str], JobState | None] = look,
    requeue: bool = False,
) -> JobEnd:
    """Until the job ends: its state when it changes (`say`), its output as it grows (`out`).
    Ctrl-C stops it (`_Watch.stop`) and waits for it to end; a second Ctrl-C stops waiting.
    `requeue`: the job was submitted requeueable, and its passing through PREEMPTED, NODE_FAIL
    or REQUEUED on its way back to the queue is not its end."""
    watch = _Watch(job, output, out, say, requeue)
    with _ctrl_c_raises():
        while True:
            try:
                if watch.saw(look_at(job)):
                    break
                time.sleep(poll_s)
            except KeyboardInterrupt:
                if watch.stopping:
                    say(f"stopped waiting: job {job} is being stopped (`squeue -j {job}`)")
                    break
                watch.stop()
    return watch.end()


@contextlib.contextmanager
def _ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt while following, even in a process that started with
    it ignored: Python then installs no handler, and a shell script's `cmd &` starts its
    command so (seen: a test suite run that way, whose follower had SIGINT ignored and slept
    on through the test's Ctrl-C). A launch inside the job reacts to SIGINT either way: its
    supervisor installs its own handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
