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
    # submitted it (sbatch's --export=ALL). trainfleet then starts every node's torchrun in
    # one step of this job (srun, one task per node, the job's CPUs) and merges every rank's
    # output into this job's output file.
    cd /home/me || exit 1
    exec python3 -m trainfleet launch -- t.py
    <BLANKLINE>

Inside the job the command finds SLURM_JOB_ID and runs on the allocation: its preflight, plan,
merged output, watchdogs and restarts are those of `salloc ... trainfleet launch`. Here,
`submit_and_follow` writes this script, submits it (`launch/batch_job.py`: sbatch, scontrol,
scancel) and follows the job until it ends (`launch/follow_job.py`: its state as it changes,
its output file as it grows, Ctrl-C stopping it); following needs the run directory on
storage the login node and the first node share, as the user's home is on a Slurm cluster.
`--requeue` adds the directives that have Slurm signal the job before its time limit and
requeue it (`BatchRequest.requeue`), and the follower stays with the job across its starts.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainfleet.errors import TrainfleetError
from trainfleet.launch.batch_job import submit
from trainfleet.launch.follow_job import JobEnd, follow
from trainfleet.privatefiles import write_private


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
        "# submitted it (sbatch's --export=ALL). trainfleet then starts every node's torchrun in",
        "# one step of this job (srun, one task per node, the job's CPUs) and merges every rank's",
        "# output into this job's output file.",
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
