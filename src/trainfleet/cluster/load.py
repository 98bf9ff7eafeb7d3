"""The one entry point: the cluster from a hostfile, a cluster.yaml, `--hosts` or this machine
alone, then DeepSpeed's --include/--exclude or --num_nodes/--num_gpus.

    >>> cluster = load_cluster(hosts="gpu-node-1:8,gpu-node-2:8", num_gpus=2)
    >>> [(n.host, n.slots) for n in cluster.nodes]
    [('gpu-node-1', 2), ('gpu-node-2', 2)]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from trainfleet.cluster.dshostfile import filter_nodes, parse_hostfile
from trainfleet.cluster.model import Cluster, Node, SlurmStep, SshOptions
from trainfleet.cluster.slurm import Allocation
from trainfleet.cluster.validate import SLOTS_RE, check_host, parse_slots
from trainfleet.cluster.yaml_spec import parse_cluster_yaml, resolve_path
from trainfleet.errors import SpecError


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(
            path,
            None,
            f"{what} not found",
            "pass an existing file (DeepSpeed would quietly run on this node alone; we stop)",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            path, None, f"cannot read {what} ({exc})", "check the path and its permissions"
        ) from None


def _parse_hosts_flag(hosts: str) -> list[tuple[str, int]]:
    entries = []
    for item in hosts.split(","):
        item = item.strip()
        host, sep, slots_text = item.rpartition(":")
        if not sep or ":" in host:  # no slots given, or an IPv6 literal (several ':')
            host, slots = item, 1
        else:
            slots = parse_slots(slots_text, "--hosts", None, host)
        check_host(host, "--hosts", None)
        entries.append((host, slots))
    if len({h for h, _ in entries}) != len(entries):
        raise SpecError("--hosts", None, "a host appears twice", "name each node once")
    return entries


def load_cluster(
    *,
    hostfile: str | None = None,
    cluster_file: str | None = None,
    hosts: str | None = None,
    include: str = "",
    exclude: str = "",
    ssh_config: str | None = None,
    num_nodes: int | None = None,
    num_gpus: int | None = None,
    visible_devices: str | None = None,
    local_gpus: int | None = None,
    slurm: Allocation | None = None,
) -> Cluster:
    """The cluster from exactly one source (or this machine alone), filtered by include/exclude
    or cut by num_nodes/num_gpus, as DeepSpeed's runner does.

    `ssh_config` (an ssh config file, like `ssh -F`) applies to every node that does not name
    its own. `visible_devices` (the launch shell's CUDA_VISIBLE_DEVICES) gives this machine's
    slots when no source is given, as DeepSpeed's runner does; `local_gpus` is this machine's
    GPU count (None: counted from /dev/nvidia*). `slurm`: the allocation this runs in (from
    its variables: `cluster.slurm.allocation`), whose nodes are the cluster when no source is
    given; commands reach them as steps of its job.
    """
    _check_num_flags(num_nodes, num_gpus, include, exclude)
    given = [
        name
        for name, value in (
            ("--hostfile", hostfile),
            ("--cluster", cluster_file),
            ("--hosts", hosts),
        )
        if value
    ]
    if len(given) > 1:
        raise SpecError(
            " and ".join(given),
            None,
            "more than one cluster source given",
            "pass only one of --hostfile, --cluster, --hosts",
        )
    base_ssh = SshOptions(config_file=resolve_path(ssh_config, Path.cwd()) if ssh_config else None)
    python = sys.executable
    if cluster_file:
        cluster = parse_cluster_yaml(_read(cluster_file, "cluster file"), cluster_file)
        nodes = [replace(n, ssh=n.ssh.merged_over(base_ssh)) for n in cluster.nodes]
    elif slurm is not None and not (hostfile or hosts):
        slots = slurm.gpus_per_node or 1
        cpus = slurm.cpus or (None,) * len(slurm.hosts)
        nodes = [
            Node(host=h, slots=slots, gpu_ids=tuple(range(slots)), python=python,
                 ssh=base_ssh, slurm=SlurmStep(job=slurm.job_id, cpus=c))
            for h, c in zip(slurm.hosts, cpus, strict=True)
        ]  # fmt: skip
        cluster = Cluster(
            nodes=tuple(nodes),
            master=nodes[0].host,
            master_port=slurm.master_port,
            source=f"Slurm job {slurm.job_id}",
        )
    else:
        if hostfile:
            pool = parse_hostfile(_read(hostfile, "hostfile"), hostfile)
            entries = [(host, slots) for host, (slots, _) in pool.items()]
            source = hostfile
        elif hosts:
            entries = _parse_hosts_flag(hosts)
            source = "--hosts"
        else:
            gpus = _local_gpu_count() if local_gpus is None else local_gpus
            entries = [("localhost", gpus or 1)]
            source = "<local>"
            if visible_devices and not (include or exclude or num_gpus or (num_nodes or 0) > 1):
                # DeepSpeed's runner: `--include localhost:<CUDA_VISIBLE_DEVICES>`.
                ids = _visible_ids(visible_devices, gpus)
                include = "localhost:" + ",".join(map(str, ids))
                entries = [("localhost", max(gpus, max(ids) + 1))]
            elif (num_nodes or 0) > 1:
                raise SpecError(
                    "--num_nodes",
                    None,
                    f"{num_nodes} nodes asked for, but no hostfile names other nodes",
                    "pass --hostfile, -c cluster.yaml or --hosts",
                )
        nodes = [
            Node(host=h, slots=s, gpu_ids=tuple(range(s)), python=python, ssh=base_ssh)
            for h, s in entries
        ]
        cluster = Cluster(nodes=tuple(nodes), master=nodes[0].host, source=source)
    nodes = filter_nodes(nodes, include, exclude)
    nodes = _apply_num_flags(nodes, num_nodes, num_gpus)
    master = cluster.master if any(n.host == cluster.master for n in nodes) else nodes[0].host
    return replace(cluster, nodes=tuple(nodes), master=master)


def _check_num_flags(
    num_nodes: int | None, num_gpus: int | None, include: str, exclude: str
) -> None:
    for flag, value in (("--num_nodes", num_nodes), ("--num_gpus", num_gpus)):
        if value is not None and value < 1:
            raise SpecError(flag, None, f"must be 1 or more, got {value}", f"pass {flag} N")
    if (num_nodes is not None or num_gpus is not None) and (include or exclude):
        # DeepSpeed's runner: "Cannot specify num_nodes/gpus with include/exclude".
        raise SpecError(
            "--num_nodes/--num_gpus",
            None,
            "cannot be combined with --include/--exclude (as in DeepSpeed's runner)",
            "choose the nodes and slots with one of them",
        )


def _apply_num_flags(nodes: list[Node], num_nodes: int | None, num_gpus: int | None) -> list[Node]:
    """DeepSpeed's --num_nodes (the first N nodes) and --num_gpus (slots 0..N-1 on each)."""
    if num_nodes is not None:
        nodes = nodes[:num_nodes]
    if num_gpus is not None:
        short = [n for n in nodes if num_gpus > n.slots]
        if short:
            # DeepSpeed would start the ranks anyway and fail on the node.
            raise SpecError(
                "--num_gpus",
                None,
                f"{num_gpus} slots asked for, but {short[0].host} has {short[0].slots}",
                "pass a --num_gpus no larger than every node's slots",
            )
        nodes = [replace(n, slots=num_gpus, gpu_ids=tuple(range(num_gpus))) for n in nodes]
    return nodes


def _visible_ids(visible: str, gpus: int) -> list[int]:
    """CUDA_VISIBLE_DEVICES as a slot list, checked against this machine's GPUs (none found:
    taken as given)."""
    ids = [item.strip() for item in visible.split(",") if item.strip()]
    if not all(SLOTS_RE.match(item) for item in ids):
        raise SpecError(
            "CUDA_VISIBLE_DEVICES",
            None,
            f"{visible!r} is not a list of GPU indices (UUIDs and MIG names are not slots)",
            "set CUDA_VISIBLE_DEVICES=0,2 (indices), or pass -i localhost:0,2",
        )
    missing = [i for i in ids if gpus and int(i) >= gpus]
    if missing:
        raise SpecError(
            "CUDA_VISIBLE_DEVICES",
            None,
            f"names GPU {missing[0]}, but this machine has {gpus} (0-{gpus - 1})",
            "name GPUs this machine has",
        )
    return [int(i) for i in ids]


def _local_gpu_count() -> int:
    """NVIDIA GPUs on this machine, from device nodes (no driver call, no torch import)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*"))
