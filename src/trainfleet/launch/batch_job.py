"""A submitted batch job, through Slurm's own commands on this machine (the login node):
`submit` (sbatch), `look` (scontrol show job, read into a JobState), `cancel` (scancel, or
SIGINT to trainfleet in the job), `requeue` (scontrol requeue, from inside the job). A command
not on PATH is a TrainfleetError that says where to run trainfleet instead.

    >>> JobState.parse("JobId=7 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15").said()
    'TIMEOUT (TimeLimit)'
    >>> JobState.parse("JobId=7 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15").exit_code
    143
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainfleet.errors import TrainfleetError

GONE = "GONE"
"""What `look` says of a job slurmctld no longer holds (`Invalid job id specified`): it
forgets an ended job MinJobAge (300 s by default) after its end."""
ENDED = frozenset(
    ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
     "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", GONE)
)  # fmt: skip
"""Job states after which nothing of the job runs any more (COMPLETING still has steps)."""


@functools.cache
def _slurm_command(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise TrainfleetError(
            f"{name} is not on PATH: --backend slurm from this machine submits through Slurm's"
            " own commands",
            "run it on the cluster's login node (where `sinfo` works), or load Slurm's module",
        )
    return found


def submit(script: Path) -> str:
    """`sbatch --parsable SCRIPT`; the job id."""
    done = subprocess.run(
        [_slurm_command("sbatch"), "--parsable", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    if done.returncode != 0:
        raise TrainfleetError(
            f"sbatch refused the job: {said[-1] if said else f'exit {done.returncode}'}",
            f"check the options it was given with `sinfo` and `sacctmgr show assoc`; the script"
            f" is {script}",
        )
    job = done.stdout.strip().split(";")[0]  # `42` or `42;cluster`
    if not job.isdigit():
        raise TrainfleetError(
            f"sbatch answered {done.stdout.strip()!r}, not a job id",
            f"see `squeue --me` for a job of {script} before submitting it again",
        )
    return job


@dataclass(kw_only=True, slots=True, frozen=True)
class JobState:
    """One look at the job (`scontrol show job -o`)."""

    state: str
    reason: str = "None"
    nodes: str = ""
    exit_status: int = 0
    signal: int = 0
    restarts: int = 0
    """How many times Slurm started the job again (requeue, preemption)."""
    eligible: str = ""
    """When a job held by its BeginTime may start: Slurm holds a requeued job 120 s."""

    @classmethod
    def parse(cls, text: str) -> JobState | None:
        """scontrol's one-line record; None when it holds no JobState.

        >>> JobState.parse("JobId=7 JobName=t JobState=FAILED Reason=NonZeroExitCode "
        ...                "Restarts=1 ExitCode=3:0 NodeList=n[1-2] BatchHost=n1").said()
        'FAILED on n[1-2] (NonZeroExitCode)'
        >>> JobState.parse("JobId=7 JobState=FAILED ExitCode=3:0 Restarts=1").exit_code
        3
        """
        keys = r"(?:^|\s)(JobState|Reason|NodeList|ExitCode|Restarts|EligibleTime)=(\S*)"
        fields = dict(re.findall(keys, text))
        if "JobState" not in fields:
            return None
        status, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return cls(
            state=fields["JobState"],
            reason=fields.get("Reason", "None"),
            nodes=fields.get("NodeList", "") if fields.get("NodeList") != "(null)" else "",
            exit_status=_count(status),
            signal=_count(sig),
            restarts=_count(fields.get("Restarts", "")),
            eligible=fields.get("EligibleTime", "").partition("T")[2],
        )

    def said(self) -> str:
        where = f" on {self.nodes}" if self.nodes and self.state != "PENDING" else ""
        why = f" ({self.reason})" if self.reason not in ("None", "") else ""
        if self.reason == "BeginTime" and self.eligible:
            why = f" (BeginTime: may start at {self.eligible})"
        return f"{self.state}{where}{why}"

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def exit_code(self) -> int:
        """The batch script's exit code, as a shell reports it; 1 for an end without one."""
        if self.state == "COMPLETED":
            return 0
        if self.exit_status:
            return self.exit_status
        return 128 + self.signal if self.signal else 1


def _count(text: str) -> int:
    return int(text) if text.isdigit() else 0


def look(job: str) -> JobState | None:
    """The job as slurmctld has it; None when it could not say (busy, or the job long gone)."""
    try:
        done = subprocess.run(
            [_slurm_command("scontrol"), "show", "job", "-o", job],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return None
    if "Invalid job id" in done.stderr:
        return JobState(state=GONE)
    return JobState.parse(done.stdout) if done.returncode == 0 else None


def cancel(job: str, *, ask_trainfleet: bool = False) -> None:
    """`scancel JOB`: Slurm ends every step (SIGTERM to each, then SIGKILL). `ask_trainfleet`:
    SIGINT to the batch script alone (`--batch`: not its children, not the steps), which is
    trainfleet in the job: it stops the ranks as Ctrl-C stops them under salloc, every node's
    bootstrap ending its ranks, and the job ends when it exits."""
    signal = ["--batch", "--signal=INT"] if ask_trainfleet else []
    subprocess.run([_slurm_command("scancel"), *signal, job], capture_output=True, timeout=60)


def requeue(job: str) -> None:
    """`scontrol requeue JOB`, from inside the job after its ranks saved their checkpoint."""
    done = subprocess.run(
        [_slurm_command("scontrol"), "requeue", job], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise TrainfleetError(
            f"`scontrol requeue {job}` failed: {done.stderr.strip()}",
            "the ranks' checkpoint is saved: submit the same command again to resume",
        )
