"""`--backend slurm` from a login node: the same trainfleet command, submitted as a batch job
whose script runs it inside the allocation, then followed from here until the job ends.

    >>> request = BatchRequest(nodes=2, partition="gpu", time="02:00:00")
    >>> print(batch_script(request, ["python3", "-m", "trainfleet", "launch", "--", "t.py"],
    ...                    cwd="/home/me", output="/home/me/runs/r1/slurm-%j.out",
    ...                    written_by="trainfleet launch --backend slurm"))
    #!/bin/bash
    # Written by `trainfleet launch --backend slurm`; submit it again with `sbatch FILE`.
    #SBATCH --job-name=trainfleet
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=1
    #SBATCH --output=/home/me/runs/r1/slurm-%j.out
    #SBATCH --partition=gpu
    #SBATCH --time=02:00:00
    # Slurm runs this on the job's first node, with the environment of the shell that
    # submitted it (sbatch's --export=ALL). trainfleet then starts each node's torchrun as a
    # step of this job (srun, one task per node, the job's CPUs) and merges every rank's output
    # into this job's output file.
    cd /home/me || exit 1
    exec python3 -m trainfleet launch -- t.py
    <BLANKLINE>

Inside the job the command finds SLURM_JOB_ID and runs on the allocation: its preflight, plan,
merged output, watchdogs and restarts are those of `salloc ... trainfleet launch`. Here,
`follow` prints the job's state as it changes (`scontrol show job`) and the output file as it
grows; it needs the run directory on storage the login node and the first node share, as the
user's home is on a Slurm cluster. Ctrl-C asks trainfleet in the running job to stop its ranks
(`scancel --batch --signal=INT`), then cancels the job if it still runs (`scancel`), and waits
until Slurm says it ended; a closed terminal leaves the job running. `--requeue` adds the
directives that have Slurm signal the job before its time limit and requeue it
(`BatchRequest.requeue`), and the follower stays with the job across its starts.
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainfleet.errors import TrainfleetError
from trainfleet.privatefiles import write_private

GONE = "GONE"
"""What `look` says of a job slurmctld no longer holds (`Invalid job id specified`): it
forgets an ended job MinJobAge (300 s by default) after its end."""
ENDED = frozenset(
    ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
     "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", GONE)
)  # fmt: skip
"""Job states after which nothing of the job runs any more (COMPLETING still has steps)."""
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


@dataclass(kw_only=True, slots=True, frozen=True)
class BatchRequest:
    """What the job asks Slurm for: sbatch's own options, by their sbatch names."""

    nodes: int
    partition: str | None = None
    time: str | None = None
    """sbatch's --time: `MINUTES`, `HH:MM:SS`, `D-HH`..."""
    gpus_per_node: str | None = None
    """sbatch's --gpus-per-node: `8` or `h100:8`."""
    account: str | None = None
    job_name: str = "trainfleet"
    sbatch_args: tuple[str, ...] = ()
    """More sbatch options, one `--name=value` each, written as given."""
    requeue: bool = False
    """Requeueable, its output appended to on each start, and SIGUSR1 to trainfleet in the job
    `signal_before_s` before the time limit (`--signal=B:USR1@S`): the ranks checkpoint and
    stop, the job is requeued, and its next start resumes (SLURM_RESTART_COUNT)."""
    signal_before_s: int = 180

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise TrainfleetError(f"--nodes {self.nodes}", "ask for 1 or more nodes")
        for arg in (self.partition, self.time, self.gpus_per_node, self.account, self.job_name):
            if arg is not None and not re.fullmatch(r"[\w.:,+@/-]+", arg):
                raise TrainfleetError(
                    f"{arg!r} is not a Slurm name or value",
                    "give letters, digits and . : , + @ / - only",
                )
        for arg in self.sbatch_args:
            if not arg.startswith("-") or not arg.isprintable():
                raise TrainfleetError(
                    f"--sbatch-arg {arg!r} is not one sbatch option on one line",
                    "give one option per --sbatch-arg, e.g. --sbatch-arg=--exclusive",
                )

    def directives(self, output: str) -> list[str]:
        options = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            # One task per node: trainfleet starts each node's ranks itself, as a step.
            "--ntasks-per-node=1",
            f"--output={output}",
        ]
        asked = {"partition": self.partition, "time": self.time,
                 "gpus-per-node": self.gpus_per_node, "account": self.account}  # fmt: skip
        for name, value in asked.items():
            if value is not None:
                options.append(f"--{name}={value}")
        if self.requeue:
            # B: the batch script alone, that is trainfleet, which passes it on to the ranks.
            options += [
                "--requeue",
                "--open-mode=append",
                f"--signal=B:USR1@{self.signal_before_s}",
            ]
        return [f"#SBATCH {option}" for option in (*options, *self.sbatch_args)]


def batch_script(
    request: BatchRequest, argv: Sequence[str], *, cwd: str, output: str, written_by: str
) -> str:
    """The script sbatch gets: the request as #SBATCH lines, then `argv` from `cwd`."""
    lines = [
        "#!/bin/bash",
        f"# Written by `{written_by}`; submit it again with `sbatch FILE`.",
        *request.directives(output),
        "# Slurm runs this on the job's first node, with the environment of the shell that",
        "# submitted it (sbatch's --export=ALL). trainfleet then starts each node's torchrun as a",
        "# step of this job (srun, one task per node, the job's CPUs) and merges every rank's"
        " output",
        "# into this job's output file.",
        f"cd {shlex.quote(cwd)} || exit 1",
        f"exec {shlex.join(argv)}",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class BatchFiles:
    """What a submission writes: its script (DIRECTORY/job.sbatch) and the text in it, and
    where the job's output goes (`%j`: the job id)."""

    script: Path
    text: str
    output: str
    requeue: bool
    """Submitted requeueable (`BatchRequest.requeue`): followed across its starts."""

    @classmethod
    def of(
        cls,
        request: BatchRequest,
        argv: Sequence[str],
        *,
        directory: Path,
        cwd: str,
        written_by: str,
    ) -> BatchFiles:
        output = str((directory / "slurm-%j.out").absolute())
        text = batch_script(request, argv, cwd=cwd, output=output, written_by=written_by)
        return cls(
            script=directory / "job.sbatch", text=text, output=output, requeue=request.requeue
        )

    def dry_run_text(self) -> str:
        return "\n".join(
            [
                f"would write {self.script}:",
                "",
                self.text,
                f"then run: sbatch --parsable {self.script}",
                f"then follow the job (scontrol show job -o JOB) and its output ({self.output});"
                " Ctrl-C: scancel JOB",
            ]
        )


def check_export(env: Mapping[str, str]) -> None:
    """The job must start with this shell's environment (PATH, the venv, HF_*): sbatch's
    default. SBATCH_EXPORT in the environment overrides any `#SBATCH --export` of the script,
    and NONE or a list without ALL gives the script almost nothing.

    >>> check_export({"SBATCH_EXPORT": "ALL,HF_HOME=/data"})
    >>> check_export({"SBATCH_EXPORT": "NONE"})
    Traceback (most recent call last):
    ...
    trainfleet.errors.TrainfleetError: SBATCH_EXPORT=NONE in this shell: ...
    """
    given = env.get("SBATCH_EXPORT")
    if given is not None and given.split(",")[0] != "ALL":
        raise TrainfleetError(
            f"SBATCH_EXPORT={given} in this shell: the job would start without its environment"
            " (PATH, this Python, the variables trainfleet passes to the ranks)",
            "unset SBATCH_EXPORT for this command, or set it to ALL,NAME=VALUE...",
        )


def inner_argv(python: str, subcommand: str, args: Sequence[str], run_dir: str | None) -> list[str]:
    """The command the job runs: this very trainfleet command with this machine's python,
    its run directory made explicit (`launch`'s --run-dir) so that both ends use one.

    >>> " ".join(inner_argv("/v/bin/python", "launch", ["--backend", "slurm", "--", "t.py"], "/r"))
    '/v/bin/python -m trainfleet launch --run-dir /r --backend slurm -- t.py'
    """
    head = [python, "-m", "trainfleet", subcommand]
    return [*head, "--run-dir", run_dir, *args] if run_dir else [*head, *args]


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


def submit_and_follow(
    files: BatchFiles, *, out: TextIO = sys.stdout, say: Callable[[str], None]
) -> JobEnd:
    """Writes the script, submits it, follows the job to its end."""
    files.script.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(files.script, files.text)
    job = submit(files.script)
    job_output = Path(files.output.replace("%j", job))
    say(f"submitted batch job {job} ({files.script}); its output: {job_output}")
    return follow(job, job_output, out=out, say=say, requeue=files.requeue)
