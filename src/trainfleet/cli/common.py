"""Options shared by every subcommand that acts on a cluster.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_cluster_arguments(parser)
>>> cluster_from_args(parser.parse_args(["--hosts", "a,b"])).world_size
2
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.cluster import Cluster, load_cluster
from trainfleet.cluster.slurm import allocation
from trainfleet.errors import TrainfleetError

if TYPE_CHECKING:
    from trainfleet.doctor.findings import Finding

CLUSTER_YAML_EXAMPLE = """\
cluster.yaml example:
  master: gpu-node-1            # rank 0 and the rendezvous store (default: first node)
  master_port: 29500
  workdir: /data/project        # where jobs run on every node
  env: {HF_HOME: /data/hf}      # for every node
  ssh: {user: root, port: 22, identity_file: ~/.ssh/id_ed25519}
  nodes:
    - host: gpu-node-1          # ssh alias, host name or address
      slots: 8                  # ranks (GPUs) on this node
      interface: ens14f0        # optional: pin NCCL/gloo to it
    - host: gpu-node-2
      slots: 8
      python: /opt/conda/envs/train/bin/python
      env: {NCCL_IB_HCA: mlx5}
"""


def add_hang_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """`--hang-timeout`, the same on launch and train (`heartbeat.HANG_TIMEOUT_S`)."""
    from trainfleet.heartbeat import HANG_TIMEOUT_S

    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=HANG_TIMEOUT_S,
        metavar="S",
        help="once a step was made, stop when no rank advanced a step (or a phase: saving, "
        "exporting) for S seconds, after dumping every rank's stack into RUN_DIR/stacks "
        "(py-spy); judged only where the ranks beat (trainfleet.heartbeat.beat; `trainfleet "
        f"train` does) (default {HANG_TIMEOUT_S:g}; 0: off)",
    )


def add_startup_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """`--startup-timeout`, the same on launch and train (`launch/progress.py`: startup)."""
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="before the first step, while the ranks beat startup phases (loading, "
        "tokenizing: trainfleet.heartbeat.beating), stop when none made progress for S seconds;"
        " the hang timeout starts at the first step, and this bound comes back once every rank"
        " has beaten its last step (a final save, an export) (default 1800; 0: off)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cluster (one of --hostfile, --cluster, --hosts; default: inside a Slurm allocation its"
        " nodes, reached through srun; else this machine alone, its GPUs or"
        " CUDA_VISIBLE_DEVICES)"
    )
    group.add_argument(
        "--hostfile", metavar="FILE", help="DeepSpeed/MPI hostfile: one `HOST slots=N` per line"
    )
    group.add_argument(
        "-c", "--cluster", metavar="FILE", dest="cluster_file", help="cluster.yaml (see below)"
    )
    group.add_argument("--hosts", metavar="A,B:8", help="comma-separated hosts, optional :slots")
    group.add_argument(
        "-i",
        "--include",
        default="",
        metavar="SPEC",
        help="only these nodes/slots, DeepSpeed syntax: worker-0@worker-1:0,2",
    )
    group.add_argument(
        "-e", "--exclude", default="", metavar="SPEC", help="all but these nodes/slots"
    )
    group.add_argument(
        "--num_nodes",
        "--num-nodes",
        type=int,
        dest="num_nodes",
        metavar="N",
        help="only the first N nodes (DeepSpeed's runner flag; not with -i/-e)",
    )
    group.add_argument(
        "--num_gpus",
        "--num-gpus",
        type=int,
        dest="num_gpus",
        metavar="N",
        help="slots 0..N-1 on every node (DeepSpeed's runner flag; not with -i/-e)",
    )
    group.add_argument(
        "--ssh-config", metavar="FILE", help="ssh config file for every node (like `ssh -F`)"
    )
    group.add_argument(
        "--connect-timeout", type=int, metavar="S", help="ssh connect timeout in seconds"
    )


def cluster_flags(args: argparse.Namespace) -> list[str]:
    """The cluster options the user gave (`add_cluster_arguments`), to put in a command we
    suggest: the same nodes, found the same way."""
    flags = []
    for option, value in (
        ("--hostfile", args.hostfile), ("-c", args.cluster_file), ("--hosts", args.hosts),
        ("-i", args.include), ("-e", args.exclude), ("--ssh-config", args.ssh_config),
        ("--num_nodes", getattr(args, "num_nodes", None)),
    ):  # fmt: skip
        if value:
            flags += [option, str(value)]
    return flags


def preflight_lines(findings: Sequence[Finding], args: argparse.Namespace) -> list[str]:
    """What launch and train print when the preflight doctor stops them: the findings, then
    the commands that fix them, then the way around."""
    from trainfleet.catalog import commands_that_fix
    from trainfleet.doctor.report import finding_lines

    lines = ["trainfleet: the preflight doctor found errors; nothing was started:"]
    lines += [line for f in findings for line in finding_lines(f, indent="  ", max_evidence=6)]
    commands = commands_that_fix(findings, cluster_flags(args))
    if commands:
        lines += ["fix with:", *(f"  {command}" for command in commands)]
    lines.append("then run the same command again, or pass --no-preflight to start anyway")
    return lines


def command_after_dashes(words: list[str]) -> list[str]:
    """The command after `--` (argparse's REMAINDER keeps the `--` itself)."""
    return words[1:] if words[:1] == ["--"] else list(words)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    cluster = load_cluster(
        hostfile=args.hostfile,
        cluster_file=args.cluster_file,
        hosts=args.hosts,
        include=args.include,
        exclude=args.exclude,
        ssh_config=args.ssh_config,
        num_nodes=getattr(args, "num_nodes", None),
        num_gpus=getattr(args, "num_gpus", None),
        # With no cluster source, this machine's slots are CUDA_VISIBLE_DEVICES, as DeepSpeed
        # reads it.
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Inside a Slurm allocation (salloc, sbatch) its nodes are the default cluster.
        slurm=allocation(os.environ),
    )
    if args.connect_timeout:
        nodes = tuple(
            replace(n, ssh=replace(n.ssh, connect_timeout=args.connect_timeout))
            for n in cluster.nodes
        )
        cluster = replace(cluster, nodes=nodes)
    return cluster


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

    cluster_given = [flag for flag, value in (
        ("--hostfile", args.hostfile), ("-c", args.cluster_file), ("--hosts", args.hosts),
        ("-i", args.include), ("-e", args.exclude), ("--num_nodes", args.num_nodes),
        ("--num_gpus", args.num_gpus), ("--ssh-config", args.ssh_config),
    ) if value]  # fmt: skip
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
    written_by = f"trainfleet {subcommand} --backend slurm"
    if getattr(args, "dry_run", False):
        output = str((directory / "slurm-%j.out").absolute())
        script = sbatch.batch_script(
            request, argv, cwd=os.getcwd(), output=output, written_by=written_by
        )
        print(sbatch.dry_run_text(directory / "job.sbatch", script, output))
        return 0

    def say(text: str) -> None:
        print(f"trainfleet: {text}", file=sys.stderr, flush=True)

    end = sbatch.submit_and_follow(
        request,
        argv,
        directory=directory,
        cwd=os.getcwd(),
        written_by=written_by,
        out=sys.stderr if args.json else sys.stdout,
        say=say,
    )
    if end.why:
        say(f"job {end.job} ended {end.state}: {end.why}")
    if args.json:
        print(json.dumps({**end.to_json(), "script": str(directory / "job.sbatch")}, indent=2))
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
    import subprocess
    import sys

    if job.job_id is None or job.preempt_signal is None or signalled != job.preempt_signal:
        return False
    done = subprocess.run(["scontrol", "requeue", job.job_id], capture_output=True, text=True)
    if done.returncode != 0:
        raise TrainfleetError(
            f"`scontrol requeue {job.job_id}` failed: {done.stderr.strip()}",
            "the ranks' checkpoint is saved: submit the same command again to resume",
        )
    print(f"trainfleet: requeued Slurm job {job.job_id}: its next start resumes from the"
          " checkpoint just saved", file=sys.stderr, flush=True)  # fmt: skip
    return True
