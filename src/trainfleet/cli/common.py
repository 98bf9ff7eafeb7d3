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
from dataclasses import replace
from typing import TYPE_CHECKING

from trainfleet.cluster import Cluster, load_cluster
from trainfleet.cluster.slurm import allocation

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
        ("--num_gpus", getattr(args, "num_gpus", None)),
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
