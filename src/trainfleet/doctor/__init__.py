"""`trainfleet doctor`: every multi-node pitfall found before launch, with cause, node and fix.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.doctor import run_doctor
    >>> report = run_doctor(load_cluster(), quick=True)  # doctest: +SKIP
    >>> report.exit_code  # doctest: +SKIP
    0

Facts, then decisions: `collect` runs one probe per node (facts + active pairwise tests),
`checks` turns them into findings with pure functions, `collective` (full mode) imports torch
once per node and runs a real gloo all_reduce across all nodes (the checks see the imports'
report too), `report` renders the findings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainfleet.cluster import Cluster
from trainfleet.doctor import collective, netsel
from trainfleet.doctor.checks import run_checks
from trainfleet.doctor.checks.network import LOOPBACK_PREFIXES, chosen_interfaces
from trainfleet.doctor.checks.software import node_versions, python_missing
from trainfleet.doctor.collect import Survey, collect
from trainfleet.doctor.facts import NodeFacts, Resolution
from trainfleet.doctor.findings import Finding, Severity, merge
from trainfleet.remote import Failure


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSummary:
    """One node in the report: what doctor found there and what trainfleet will set. A node
    doctor could not examine has `reachable=False`, its `address` and its `failure` only."""

    reachable: bool
    address: str | None
    """The address ssh connects to (`ssh -G`)."""
    failure: str | None = None
    """Why the node could not be examined (unreachable nodes only)."""
    hostname: str | None = None
    """What the node calls itself."""
    interface: str | None = None
    """The interface trainfleet sets: pinned in cluster.yaml, else the route to the master."""
    subnet: str | None = None
    nccl_default: str | None = None
    """The interface NCCL picks when NCCL_SOCKET_IFNAME is unset."""
    gloo_default: str | None = None
    """What gloo binds when GLOO_SOCKET_IFNAME is unset (the hostname's address)."""
    python: str | None = None
    """The interpreter the probe ran with."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """python, torch, nccl, deepspeed, transformers, accelerate (None: not found)."""
    gpus: int = 0
    slots: int = 0
    """Slots in the cluster spec."""
    probe_seconds: float | None = None

    def to_json(self) -> dict:
        """`doctor --json`'s `nodes` entry: an unreachable node's three keys, else the rest."""
        if not self.reachable:
            return {"reachable": False, "address": self.address, "failure": self.failure}
        return {
            "reachable": True,
            "hostname": self.hostname,
            "address": self.address,
            "interface": self.interface,
            "subnet": self.subnet,
            "nccl_default": self.nccl_default,
            "gloo_default": self.gloo_default,
            "python": self.python,
            "versions": self.versions,
            "gpus": self.gpus,
            "slots": self.slots,
            "probe_seconds": self.probe_seconds,
        }


@dataclass(kw_only=True, slots=True)
class DoctorReport:
    findings: list[Finding]
    nodes: dict[str, NodeSummary]
    """Per node, named as in the cluster spec: what was found and what trainfleet will set."""
    problems: list[str] = field(default_factory=list)
    """Doctor's own failures (a probe that crashed): not findings about the cluster."""
    survey: Survey | None = field(default=None, repr=False)
    """The facts the findings came from (not in the JSON: `nodes` summarizes them)."""
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    """Wall time of each phase: probe; in full mode then collective (torch imported once per node
    and a gloo all_reduce across all), or stack (the imports alone, after an error)."""

    @property
    def exit_code(self) -> int:
        """0: no errors; 1: errors found; 2: doctor could not examine any node."""
        if self.problems and not any(n.reachable for n in self.nodes.values()):
            return 2
        return 1 if any(f.severity is Severity.ERROR for f in self.findings) else 0

    def to_json(self) -> dict:
        return {
            "findings": [f.to_json() for f in self.findings],
            "nodes": {host: summary.to_json() for host, summary in self.nodes.items()},
            "problems": self.problems,
            "seconds": round(self.seconds, 3),
            "phases": {name: round(t, 3) for name, t in self.phases.items()},
            "exit_code": self.exit_code,
        }


def _gloo_default(facts: NodeFacts) -> str:
    """What gloo binds when GLOO_SOCKET_IFNAME is unset: the hostname's address."""
    addresses = facts.resolve.get(facts.hostname or "", Resolution()).addresses
    if not addresses:
        return "127.0.0.1 (hostname does not resolve: loopback fallback)"
    first = addresses[0]
    return f"{first} (loopback!)" if first.startswith(LOOPBACK_PREFIXES) else first


def node_summaries(survey: Survey) -> dict[str, NodeSummary]:
    summaries = {}
    interfaces = chosen_interfaces(survey)
    for node in survey.cluster.nodes:
        host = node.host
        facts = survey.facts.get(host)
        if facts is None:
            result = survey.failed.get(host)
            summaries[host] = NodeSummary(
                reachable=False,
                address=survey.addresses.get(host),
                failure=result.reason() if result else "not probed",
            )
            continue
        ifaces = netsel.ifaces_of(facts)
        chosen = interfaces[host]
        summaries[host] = NodeSummary(
            reachable=True,
            hostname=facts.hostname,
            address=survey.addresses.get(host),
            interface=chosen,
            subnet=netsel.subnet_of(chosen, ifaces),
            nccl_default=netsel.nccl_default(ifaces),
            gloo_default=_gloo_default(facts),
            python=facts.python.executable,
            versions=node_versions(facts),
            gpus=len(facts.gpus.devices) if facts.gpus else 0,
            slots=node.slots,
            probe_seconds=facts.seconds,
        )
    return summaries


def run_doctor(
    cluster: Cluster,
    *,
    quick: bool = False,
    seed: int | None = None,
    read_only: bool = False,
    all_pairs: bool = False,
) -> DoctorReport:
    """Probe every node, run every check, and return the report. `read_only`: nothing is
    written on any node (no shared-storage check); `all_pairs`: every node tests every node,
    however many (`collect.FULL_MATRIX_UP_TO`)."""
    started = time.time()
    survey = collect(cluster, quick=quick, seed=seed, read_only=read_only, all_pairs=all_pairs)
    finished = time.time()
    phases = {"probe": finished - started}
    findings = run_checks(survey, started=started, finished=finished)
    if collective.should_run(survey):
        # After an error the all_reduce is sure to fail (and waits its timeout): the cause is
        # known, and torch is only imported.
        clean = not any(f.severity is Severity.ERROR for f in findings)
        all_reduce = clean and collective.can_all_reduce(survey)
        extra, seconds = collective.run_stack(survey, all_reduce=all_reduce)
        phases["collective" if all_reduce else "stack"] = seconds
        # the checks again, now with what the imports reported
        findings = merge(run_checks(survey, started=started, finished=finished) + extra)
    problems = [
        f"{host}: the probe failed: {result.reason()}"
        for host, result in survey.failed.items()
        if result.failure is Failure.COMMAND_FAILED and not python_missing(result)
    ]
    return DoctorReport(
        findings=findings,
        nodes=node_summaries(survey),
        problems=problems,
        seconds=time.time() - started,
        phases=phases,
        survey=survey,
    )
