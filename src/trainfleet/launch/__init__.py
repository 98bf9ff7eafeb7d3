"""`trainfleet launch`: any training script on every node from one command; fail fast; explain
hangs.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.launch import LaunchOptions, prepare, launch
    >>> cluster = load_cluster(cluster_file="cluster.yaml")  # doctest: +SKIP
    >>> run_dir = Path("trainfleet-runs/r1")
    >>> options = LaunchOptions(command=("train.py", "--lr", "1e-4"))
    >>> plan, report = prepare(cluster, options, run_dir=run_dir)  # doctest: +SKIP
    >>> result = launch(plan, cluster, run_dir=run_dir)  # doctest: +SKIP

`prepare` has the backend run its preflight (a quick doctor: its facts give each node's
interface, GPUs and the master's busy ports; its errors stop the launch) and make its plan
(`launch/backends/`: the registry, one module per backend; plans pure); `launch` has the
backend start its channels, runs them (`supervisor.py`), has the backend dump the stacks of a
hung run and clean up, and, when ranks did not join, asks the backend's preflight why.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport
from trainfleet.doctor.checks.network import (
    LOOKUP_OPTIONS,
    listeners_besides_probe,
    mapped_lookup_wait,
    unnamed_mapped,
)
from trainfleet.doctor.findings import Severity
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import Plan
from trainfleet.launch.backends import BACKENDS, backend_for
from trainfleet.launch.masking import masked, masked_argv
from trainfleet.launch.options import LaunchFacts, LaunchOptions
from trainfleet.launch.output import TextOut
from trainfleet.launch.result import LaunchResult, RunState
from trainfleet.launch.supervisor import supervise
from trainfleet.privatefiles import write_private

__all__ = [
    "BACKENDS",
    "LaunchOptions",
    "LaunchResult",
    "RunState",
    "backend_for",
    "launch",
    "prepare",
]

HANDLED_BY_LAUNCH = (
    FindingId.PORT_IN_USE,
    FindingId.HOSTNAME_LOOPBACK,
    FindingId.IFACE_MISMATCH,
)
"""Findings the launch resolves itself: a busy master port (it moves to a free one), a host
name that resolves to loopback (MASTER_ADDR is an address and gloo/NCCL get an interface, so
no rank binds or connects by that name), one interface variable for nodes whose interfaces
differ (every node's ranks get NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set to its own interface,
over the launch shell's, cluster.yaml's and the login shell's; the plan says so per node)."""


class PreflightFailed(TrainfleetError):
    def __init__(self, report: DoctorReport) -> None:
        super().__init__(
            "the preflight doctor found errors: nothing was started",
            "fix them (see above), or pass --no-preflight to launch anyway",
        )
        self.report = report


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def launch_facts(report: DoctorReport) -> dict[str, LaunchFacts]:
    survey = report.survey
    silent = set(unnamed_mapped(survey)) if survey else set()
    facts = {}
    for host, info in report.nodes.items():
        if not info.reachable:
            continue
        listening: set[int] = set()
        if survey and host == survey.cluster.master:
            sheet = survey.facts.get(host)
            held = listeners_besides_probe(sheet) if sheet else []
            listening = {e.port for e in held if e.port is not None}
            if any(f.id is FindingId.PORT_IN_USE for f in report.findings):  # doctor's verdict
                listening.add(survey.cluster.master_port)
        sheet = survey.facts.get(host) if survey else None
        facts[host] = LaunchFacts(
            interface=info.interface,
            gpus=info.gpus,
            listening=tuple(listening),
            python_version=_minor_version(sheet.python.version if sheet else None),
            silent_resolver=host in silent,
        )
    return facts


def _minor_version(version: str | None) -> tuple[int, int] | None:
    """ "3.11.7" -> (3, 11); None where the probe said nothing readable."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not all(p.isdecimal() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def blocking(report: DoctorReport) -> list:
    return [
        f for f in report.findings if f.severity is Severity.ERROR and f.id not in HANDLED_BY_LAUNCH
    ]


def check_slots(cluster: Cluster, facts: Mapping[str, LaunchFacts]) -> None:
    """A slot beyond a node's GPUs (a hostfile's `slots=8` on a 4-GPU node, `-i node:5`) is an
    error before anything starts; DeepSpeed's runner would start the ranks and fail there.
    Nodes without GPUs run their ranks on CPU and are not checked."""
    for node in cluster.nodes:
        gpus = facts.get(node.host, LaunchFacts()).gpus
        beyond = [i for i in node.gpu_ids if gpus and i >= gpus]
        if beyond:
            raise TrainfleetError(
                f"{node.host} has {gpus} GPU(s) (0-{gpus - 1}), but its slots name GPU "
                f"{beyond[0]} ({cluster.source})",
                f"give {node.host} at most slots={gpus} in the hostfile, or pick GPUs it has "
                f"with -i {node.host}:0,1",
            )


def prepare(
    cluster: Cluster,
    options: LaunchOptions,
    *,
    preflight: bool = True,
    run_dir: Path,
    dry_run: bool = False,
) -> tuple[Plan, DoctorReport]:
    """The quick doctor, then the plan for options.backend. Raises PreflightFailed on its
    errors (with preflight), or TrainfleetError when a node could not be examined at all.
    `dry_run`: nothing is written anywhere, on the nodes or here (the run dir is only named)."""
    backend = backend_for(options.backend)
    report = backend.preflight(cluster, read_only=dry_run)
    if preflight and blocking(report):
        raise PreflightFailed(report)
    unreachable = [h for h, info in report.nodes.items() if not info.reachable]
    if unreachable:
        raise TrainfleetError(
            f"cannot reach {', '.join(unreachable)}", "run `trainfleet doctor` for the cause"
        )
    check_slots(cluster, launch_facts(report))
    master_addr = options.master_addr or (report.survey.master_addr if report.survey else None)
    if not master_addr:
        raise TrainfleetError(
            f"the master {cluster.master} has no address this machine can resolve",
            "use its address in the cluster spec, or add it to /etc/hosts",
        )
    plan = backend.plan(
        cluster,
        launch_facts(report),
        options,
        master_addr=master_addr,
        launch_env=dict(os.environ),
        launch_cwd=os.getcwd(),
        run_dir=run_dir,
    )
    wait = mapped_lookup_wait(report.survey) if report.survey else None
    if wait is not None and wait[0] >= 1:
        plan.notes.append(_lookup_note(plan, *wait))
    return plan, report


def _lookup_note(plan: Plan, seconds: float, host: str) -> str:
    """What the nodes' silent resolver costs this launch (doctor's `err=-3` warning)."""
    backend = backend_for(plan)
    waits = backend.lookup_rounds
    envs = backend.node_envs(plan)
    ours = any(env.get("RES_OPTIONS") == LOOKUP_OPTIONS for env in envs.values())
    each = 1.0 if ours else seconds
    what = (
        f" (RES_OPTIONS={LOOKUP_OPTIONS} set for its processes: 1 s per lookup instead of"
        f" {seconds:g}; RES_OPTIONS in cluster.yaml's env wins)"
        if ours
        else ""
    )
    return (
        f"{host} cannot name the IPv4-mapped addresses c10d looks up and its resolver does not"
        f" answer: every process that joins waits once before it connects, this launch about"
        f" {waits * each:g} s more to start{what} (`err=-3` lines);"
        " `trainfleet setup hosts` adds the /etc/hosts lines that end it"
    )


def _env_record(plan: Plan) -> str:
    """Each node's environment, secrets masked: what the run dir keeps."""
    envs = backend_for(plan).node_envs(plan)
    return "".join(
        f"{host}: {k}={v}\n" for host, env in envs.items() for k, v in sorted(masked(env).items())
    )


def launch(
    plan: Plan,
    cluster: Cluster,
    *,
    run_dir: Path,
    out: TextOut | None = None,
    restarts: list | None = None,
) -> LaunchResult:
    """Run the plan; a run whose ranks did not all join gets doctor's findings as diagnosis."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(run_dir / "env.txt", _env_record(plan))
    about = {
        "run_id": plan.options.run_id,
        "backend": plan.options.backend,
        "command": masked_argv(plan.options.command),
        "master": f"{plan.master_addr}:{plan.master_port}",
        "world_size": plan.world_size,
        "ranks": {host: [r.start, r.stop - 1] for host, r in plan.rank_ranges().items()},
    }
    write_private(run_dir / "run.json", json.dumps(about, indent=2) + "\n")

    backend = backend_for(plan)

    def diagnose() -> list:
        report = backend.preflight(cluster, read_only=False)
        return [f for f in report.findings if f.severity >= Severity.WARNING]

    channels = backend.start(plan, cluster, run_dir)
    try:
        return supervise(plan, channels, run_dir=run_dir, out=out, diagnose=diagnose,
                         dump_stacks=lambda pids: backend.dump_stacks(plan, cluster, pids),
                         restarts=restarts)  # fmt: skip
    finally:
        backend.stop(plan, cluster)
