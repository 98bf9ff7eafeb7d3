"""The Slurm options of `launch` and `train` (`--backend slurm`, `--nodes`, `--requeue`...):
from a login node they submit the same command as a batch job (`launch/sbatch.py`); inside a
job they describe it, and `--requeue` has the run requeue the job after the time-limit signal.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> parser.add_argument("--backend")  # doctest: +ELLIPSIS
    _StoreAction(...)
    >>> add_slurm_arguments(parser)
    >>> parser.parse_args(["--nodes", "2", "--sbatch-arg=--exclusive"]).sbatch_arg
    ['--exclusive']
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from trainfleet.cli.common import cluster_flags
from trainfleet.cluster.slurm import allocation
from trainfleet.errors import TrainfleetError

SLURM_FLAGS = ("nodes", "partition", "time", "gpus_per_node", "account", "job_name", "sbatch_arg",
               "requeue", "signal_before")  # fmt: skip
"""`add_slurm_arguments`' destinations."""


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Slurm job (with --backend slurm from a login node: what sbatch asks for; inside a job"
        " they are what it was given, and --nodes must match it)"
    )
    group.add_argument("--nodes", "-N", type=int, metavar="N", help="sbatch --nodes")
    group.add_argument("--partition", metavar="P", help="sbatch --partition")
    group.add_argument("--time", metavar="T", help="sbatch --time (MINUTES, HH:MM:SS, D-HH...)")
    group.add_argument("--gpus-per-node", metavar="G", help="sbatch --gpus-per-node (8, h100:8)")
    group.add_argument("--account", metavar="A", help="sbatch --account")
    group.add_argument("--job-name", metavar="NAME", help="sbatch --job-name (default trainfleet)")
    group.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="any other sbatch option, one per flag: --sbatch-arg=--exclusive "
        "--sbatch-arg=--exclude=gpu-node-3",
    )
    group.add_argument(
        "--requeue",
        action="store_true",
        help="before the time limit (or when Slurm requeues the job: preemption, scontrol "
        "requeue), the ranks checkpoint and stop and the job starts again, resuming: train "
        "from its latest checkpoint, a script on TRAINFLEET_PREEMPT_SIGNAL (SIGUSR1) and "
        "TRAINFLEET_RESTART (docs/slurm.md)",
    )
    group.add_argument(
        "--signal-before",
        type=int,
        metavar="S",
        help="with --requeue: seconds before the time limit at which the ranks get SIGUSR1 to "
        "checkpoint (default 180; Slurm may send it up to 60 s early)",
    )


def submits_job(args: argparse.Namespace) -> bool:
    """Whether this command submits itself as a Slurm batch job (`--backend slurm` outside
    one) rather than running here; Slurm options given without it are refused, since they
    would do nothing, and inside a job --nodes must be the job's."""
    if args.signal_before and not args.requeue:
        raise TrainfleetError("--signal-before without --requeue", "add --requeue")
    job = allocation(os.environ)
    if args.backend == "slurm" and job is None:
        return True
    given = [f"--{name.replace('_', '-')}" for name in SLURM_FLAGS if getattr(args, name)]
    if job is None and given:
        raise TrainfleetError(
            f"{given[0]} asks Slurm for the job, and this command runs no Slurm job",
            "add --backend slurm to submit it as one",
        )
    if job is not None and args.nodes and args.nodes != len(job.hosts):
        raise TrainfleetError(
            f"--nodes {args.nodes}, but Slurm job {job.job_id} has {len(job.hosts)} node(s)"
            f" ({', '.join(job.hosts)})",
            "drop --nodes inside a job, or use --num_nodes N for its first N nodes",
        )
    return False


def submit_job(args: argparse.Namespace, *, run_dir: str | None, directory: Path) -> int:
    """`--backend slurm` from a login node: this same command as a batch job, its script in
    `directory`, followed until it ends (launch/sbatch.py). `run_dir`: the launch's, passed on
    so that both ends use one."""
    import json
    import sys

    from trainfleet.launch import sbatch

    cluster_given = cluster_flags(args)
    if cluster_given:
        raise TrainfleetError(
            f"{cluster_given[0]} names nodes, and with --backend slurm Slurm picks them",
            "ask with --nodes N, --partition, --gpus-per-node; leave a node out with"
            " --sbatch-arg=--exclude=NODE, or name them with --sbatch-arg=--nodelist=NODES",
        )
    if not args.nodes:
        raise TrainfleetError("--backend slurm from a login node needs --nodes", "add --nodes N")
    request = sbatch.BatchRequest(
        nodes=args.nodes,
        partition=args.partition,
        time=args.time,
        gpus_per_node=args.gpus_per_node,
        account=args.account,
        job_name=args.job_name or "trainfleet",
        sbatch_args=tuple(args.sbatch_arg),
        requeue=args.requeue,
        signal_before_s=args.signal_before or 180,
    )
    sbatch.check_export(os.environ)
    words = list(args.argv)
    subcommand = args.command_name
    words = words[words.index(subcommand) + 1 :]
    ours = words.index("--") if "--" in words else len(words)
    # The job runs the command itself: --dry-run (of this submission) is not passed on.
    words = [w for w in words[:ours] if w != "--dry-run"] + words[ours:]
    argv = sbatch.inner_argv(sys.executable, subcommand, words, run_dir)
    files = sbatch.BatchFiles.of(request, argv, directory=directory, cwd=os.getcwd(),
                                 written_by=f"trainfleet {subcommand} --backend slurm")  # fmt: skip
    if getattr(args, "dry_run", False):
        print(files.dry_run_text())
        return 0

    def say(text: str) -> None:
        print(f"trainfleet: {text}", file=sys.stderr, flush=True)

    end = sbatch.submit_and_follow(files, out=sys.stderr if args.json else sys.stdout, say=say)
    if end.why:
        say(f"job {end.job} ended {end.state}: {end.why}")
    if args.json:
        print(json.dumps({**end.to_json(), "script": str(files.script)}, indent=2))
    return end.exit_code


@dataclass(frozen=True, slots=True)
class InJob:
    """What a command run inside a Slurm job takes from it for `--requeue`."""

    job_id: str | None
    restart: int
    """SLURM_RESTART_COUNT: how many times Slurm started this job again (0 outside one)."""
    preempt_signal: str | None
    """USR1 when the job was submitted with --requeue: what the ranks get before its end."""


def in_job(args: argparse.Namespace) -> InJob:
    job = allocation(os.environ)
    if job is None:
        return InJob(job_id=None, restart=0, preempt_signal=None)
    count = os.environ.get("SLURM_RESTART_COUNT", "0")
    return InJob(
        job_id=job.job_id,
        restart=int(count) if count.isdigit() else 0,
        preempt_signal="USR1" if args.requeue else None,
    )


def requeue_if_signalled(job: InJob, signalled: str | None) -> bool:
    """After a run that got the job's time-limit signal: `scontrol requeue` (the job starts
    again and resumes); whether it was asked."""
    import sys

    from trainfleet.launch import batch_job

    if job.job_id is None or job.preempt_signal is None or signalled != job.preempt_signal:
        return False
    # Said first: the requeue ends this batch script (Slurm cancels the job to queue it
    # again), often before a line printed after `scontrol` returns reaches the output file.
    print(f"trainfleet: requeuing Slurm job {job.job_id}: its next start resumes from the"
          " checkpoint just saved", file=sys.stderr, flush=True)  # fmt: skip
    batch_job.requeue(job.job_id)
    return True
