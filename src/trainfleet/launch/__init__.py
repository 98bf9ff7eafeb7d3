"""`trainfleet launch`: any training script on every node from one command; fail fast; explain
hangs.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.launch import LaunchOptions, prepare, launch
    >>> cluster = load_cluster(cluster_file="cluster.yaml")  # doctest: +SKIP
    >>> plan, report = prepare(cluster, LaunchOptions(command=("train.py",)))  # doctest: +SKIP
    >>> result = launch(plan, cluster)  # doctest: +SKIP

`prepare` runs a quick doctor (the preflight: its facts give each node's interface, GPUs and
the master's busy ports; its errors stop the launch) and makes the plan (`plan.py`, pure);
`launch` executes it (`supervisor.py`) and, when ranks did not join, asks doctor why.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport, run_doctor
from trainfleet.doctor.checks.network import check_port_in_use
from trainfleet.doctor.findings import Severity
from trainfleet.errors import TrainfleetError
from trainfleet.launch.plan import LaunchOptions, LaunchPlan, NodeFacts, plan_launch
from trainfleet.launch.supervisor import LaunchResult, RunState, supervise

__all__ = ["LaunchOptions", "LaunchPlan", "LaunchResult", "RunState", "launch", "prepare"]

HANDLED_BY_LAUNCH = ("port-in-use", "hostname-loopback")
"""Findings the launch resolves itself: a busy master port (it moves to a free one), a host
name that resolves to loopback (MASTER_ADDR is an address and gloo/NCCL get an interface, so
no rank binds or connects by that name)."""


class PreflightFailed(TrainfleetError):
    def __init__(self, report: DoctorReport) -> None:
        super().__init__(
            "the preflight doctor found errors: nothing was started",
            "fix them (see above), or pass --no-preflight to launch anyway",
        )
        self.report = report


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def node_facts(report: DoctorReport) -> dict[str, NodeFacts]:
    survey = report.survey
    facts = {}
    for host, info in report.nodes.items():
        if not info.get("reachable"):
            continue
        listening: set[int] = set()
        if survey and host == survey.cluster.master:
            sheet = survey.facts.get(host, {})
            listening = {
                e["port"]
                for e in sheet.get("listening", [])
                if e.get("pid") != sheet.get("pid") and isinstance(e.get("port"), int)
            }
            if check_port_in_use(survey):
                listening.add(survey.cluster.master_port)
        facts[host] = NodeFacts(
            interface=info.get("interface"), gpus=info.get("gpus") or 0, listening=tuple(listening)
        )
    return facts


def blocking(report: DoctorReport) -> list:
    return [
        f for f in report.findings if f.severity is Severity.ERROR and f.id not in HANDLED_BY_LAUNCH
    ]


def prepare(
    cluster: Cluster, options: LaunchOptions, *, preflight: bool = True
) -> tuple[LaunchPlan, DoctorReport]:
    """The quick doctor, then the plan. Raises PreflightFailed on its errors (with preflight),
    or TrainfleetError when a node could not be examined at all."""
    report = run_doctor(cluster, quick=True)
    if preflight and blocking(report):
        raise PreflightFailed(report)
    unreachable = [h for h, info in report.nodes.items() if not info.get("reachable")]
    if unreachable:
        raise TrainfleetError(
            f"cannot reach {', '.join(unreachable)}", "run `trainfleet doctor` for the cause"
        )
    master_addr = report.survey.master_addr if report.survey else None
    if not master_addr:
        raise TrainfleetError(
            f"the master {cluster.master} has no address this machine can resolve",
            "use its address in the cluster spec, or add it to /etc/hosts",
        )
    plan = plan_launch(
        cluster,
        node_facts(report),
        options,
        master_addr=master_addr,
        launch_env=dict(os.environ),
        launch_cwd=os.getcwd(),
    )
    return plan, report


def launch(plan: LaunchPlan, cluster: Cluster, *, run_dir: Path, out=None) -> LaunchResult:
    """Run the plan; a run whose ranks did not all join gets doctor's findings as diagnosis."""

    def diagnose() -> list:
        report = run_doctor(cluster, quick=True)
        return [f for f in report.findings if f.severity >= Severity.WARNING]

    return supervise(plan, cluster, run_dir=run_dir, out=out, diagnose=diagnose)
