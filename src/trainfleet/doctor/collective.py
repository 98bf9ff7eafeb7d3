"""The definitive check: a real rendezvous and gloo all_reduce across all nodes, 20 s at most.

    >>> findings, seconds = run_collective(survey)  # doctest: +SKIP

One process per node (`trainfleet.node.collective`), started over ssh like the probe, each
bound (GLOO_SOCKET_IFNAME) to the interface trainfleet sets for that node, rendezvous through a
TCPStore on the master at a free port. Every rank checks the sum. A failure is reported with
the rank's own last error line, classified into the pitfall it points to.
"""

from __future__ import annotations

import random
import time

from trainfleet import node as node_programs
from trainfleet.catalog import FindingId
from trainfleet.doctor.checks.network import chosen_interfaces
from trainfleet.doctor.checks.software import node_versions
from trainfleet.doctor.collect import EPHEMERAL_PORTS, Survey
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.remote import run_on_nodes

TIMEOUT_S = 20
"""The process group's timeout; the whole phase is bounded by it plus start-up."""

# (text in a rank's error, the finding it points to)
_SIGNATURES = (
    ("Unable to find address for", FindingId.IFACE_MISMATCH),
    ("127.0.1.1", FindingId.HOSTNAME_LOOPBACK),
    ("Address already in use", FindingId.PORT_IN_USE),
    ("No route to host", FindingId.FIREWALL_BLOCKS_PORTS),
)


def should_run(survey: Survey) -> bool:
    return (
        not survey.quick
        and len(survey.cluster.nodes) > 1
        and len(survey.facts) == len(survey.cluster.nodes)
        and all(node_versions(f)["torch"] for f in survey.facts.values())
        and survey.master_addr is not None
    )


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "failed" in ln]
    return (errors or lines or ["no output"])[-1][:300]


def run_collective(survey: Survey, rng: random.Random | None = None) -> tuple[list[Finding], float]:
    """Findings of the all_reduce phase (empty when it passed) and its wall time."""
    rng = rng or random.Random()
    port = rng.randrange(*EPHEMERAL_PORTS)
    world = len(survey.cluster.nodes)
    argv, calls = {}, {}
    chosen = chosen_interfaces(survey)  # the interface launch would set, pinned or routed
    for rank, node in enumerate(survey.cluster.nodes):
        iface = chosen[node.host]
        env = [f"GLOO_SOCKET_IFNAME={iface}"] if iface else []
        argv[node.host] = ["env", *env, *node_programs.argv(node.python, "collective")]
        calls[node.host] = node_programs.line(
            "collective", "all_reduce", survey.master_addr, port, rank, world, TIMEOUT_S
        )
    start = time.monotonic()
    results = run_on_nodes(survey.cluster.nodes, argv, stdin=calls, timeout=TIMEOUT_S + 30)
    seconds = time.monotonic() - start
    failed = [r for r in results if not r.ok]
    if not failed:
        return [], seconds
    evidence = [f"{r.node}: {_last_error(r.stderr or r.stdout)}" for r in failed]
    text = " ".join(r.stderr for r in failed)
    pitfall = next((p for needle, p in _SIGNATURES if needle in text), FindingId.RENDEZVOUS_TIMEOUT)
    return [
        Finding(
            id=pitfall,
            severity=Severity.ERROR,
            nodes=tuple(r.node for r in failed),
            evidence=[
                f"a real gloo all_reduce across all {world} nodes failed "
                f"(master {survey.master_addr}:{port}, {seconds:.1f} s):",
                *evidence,
            ],
            fix="see the other findings for the cause; this is what a training launch would hit",
        )
    ], seconds
