"""The stack phase (full mode): one process per node imports torch, once, and reports what it
found (versions, CUDA, NCCL, gloo); when the checks before found no error, the same processes
then run the definitive check, a real rendezvous and gloo all_reduce across all nodes.

    >>> findings, seconds = run_stack(survey, all_reduce=True)  # doctest: +SKIP

Each process (`trainfleet.node.collective`) is started over ssh like the probe, bound
(GLOO_SOCKET_IFNAME) to the interface trainfleet sets for that node; the rendezvous goes
through a TCPStore on the master at a free port. The imports' report replaces nothing the probe
found: it is added to each node's facts (`NodeFacts.imports`), and the software checks are run
again on it by the caller. A failed all_reduce is reported with each rank's own last error
line, classified into the pitfall it points to.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

from trainfleet import node as node_programs
from trainfleet.catalog import FindingId
from trainfleet.doctor.checks.network import LOOKUP_OPTIONS, chosen_interfaces, unnamed_mapped
from trainfleet.doctor.checks.software import node_versions
from trainfleet.doctor.collect import EPHEMERAL_PORTS, Survey
from trainfleet.doctor.facts import Imports, NodeFacts, parse_imports
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.errors import NodeAnswerError
from trainfleet.node import collective
from trainfleet.remote import Failure, NodeResult, run_on_nodes

STARTUP_S = 60
"""How long the ranks wait at the rendezvous for every rank to have imported torch (a
loaded node, torch on a cold shared filesystem); a clean cluster does not wait it out."""
TIMEOUT_S = 20
"""The process group's timeout, from the moment every rank has imported: the all_reduce's own
bound."""
SPARE_S = 15
"""The launch node's bound on the phase is STARTUP_S + TIMEOUT_S + this."""
_RETRIED = "willRetry=1"
"""gloo's log line for a connect it retries (e.g. `No route to host` while ARP resolves on a
busy host): not the rank's verdict."""

# (text in a rank's error, the finding it points to)
_SIGNATURES = (
    ("Unable to find address for", FindingId.IFACE_MISMATCH),
    ("127.0.1.1", FindingId.HOSTNAME_LOOPBACK),
    ("Address already in use", FindingId.PORT_IN_USE),
    ("No route to host", FindingId.FIREWALL_BLOCKS_PORTS),
)


def _has_stack(facts: NodeFacts) -> bool:
    return bool(facts.packages.torch or facts.packages.deepspeed)


def should_run(survey: Survey) -> bool:
    """The stack phase at all: full mode, and some examined node has torch or deepspeed."""
    return not survey.quick and any(_has_stack(f) for f in survey.facts.values())


def can_all_reduce(survey: Survey) -> bool:
    """The all_reduce needs every node examined, with torch, and the master's address."""
    return (
        len(survey.cluster.nodes) > 1
        and len(survey.facts) == len(survey.cluster.nodes)
        and all(node_versions(f)["torch"] for f in survey.facts.values())
        and survey.master_addr is not None
    )


def _verdict_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and _RETRIED not in ln]


def _last_error(text: str) -> str:
    lines = _verdict_lines(text)
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "failed" in ln]
    return (errors or lines or ["no output"])[-1][:300]


def _reports(result: NodeResult) -> dict[str, dict]:
    """The node's answers (`collective.StepReport`) by step (`imports`, `all_reduce`); none
    where one is malformed (the node then counts as one that did not report)."""
    try:
        said = node_programs.read_answers(result.stdout, collective.StepReport, node=result.node)
    except NodeAnswerError:
        return {}
    found: dict[str, dict] = {}
    for step in said:
        if isinstance(step["step"], str) and isinstance(step["report"], dict):
            found.setdefault(step["step"], step["report"])
    return found


def _imports_of(result: NodeResult, reports: dict[str, dict]) -> Imports:
    imports = parse_imports(reports.get("imports"))
    if imports is not None:
        return imports
    if result.failure is Failure.TIMED_OUT:
        why = f"importing torch did not finish in {result.duration_s:.0f} s"
    else:
        why = _last_error(result.stderr or result.stdout) if not result.ok else "no report"
    return Imports(import_error=why)


def run_stack(
    survey: Survey, *, all_reduce: bool, rng: random.Random | None = None
) -> tuple[list[Finding], float]:
    """torch imported on every node with the stack (torch or deepspeed installed; the reports
    added to `survey.facts`), and, with
    `all_reduce`, the all_reduce on every node. -> the all_reduce's findings (empty when it
    passed or did not run) and the phase's wall time."""
    rng = rng or random.Random()
    port = rng.randrange(*EPHEMERAL_PORTS)
    world = len(survey.cluster.nodes)
    if all_reduce:
        nodes = list(survey.cluster.nodes)
    else:
        nodes = [n for n in survey.cluster.nodes if n.host in survey.facts]
        nodes = [n for n in nodes if _has_stack(survey.facts[n.host])]
    argv, calls = {}, {}
    chosen = chosen_interfaces(survey)  # the interface launch would set, pinned or routed
    silent = unnamed_mapped(survey)  # each rank's store lookup: 1 s there, as in a launch
    for rank, node in enumerate(nodes):
        iface = chosen[node.host]
        env = [f"GLOO_SOCKET_IFNAME={iface}"] if iface else []
        env += [f"RES_OPTIONS={LOOKUP_OPTIONS}"] if node.host in silent else []
        argv[node.host] = ["env", *env, *node_programs.argv(node.python, collective.run)]
        group = collective.Group(
            addr=survey.master_addr or "", port=port, rank=rank, world=world,
            startup_s=STARTUP_S, timeout_s=TIMEOUT_S,
        )  # fmt: skip
        calls[node.host] = node_programs.line(
            collective.run, collective.StackJob(all_reduce=group if all_reduce else None)
        )
    start = time.monotonic()
    bound = STARTUP_S + (TIMEOUT_S if all_reduce else 0) + SPARE_S
    results = run_on_nodes(nodes, argv, stdin=calls, timeout=bound)
    seconds = time.monotonic() - start
    reported = {r.node: _reports(r) for r in results}
    for result in results:
        facts = survey.facts.get(result.node)
        if facts is not None:
            imports = _imports_of(result, reported[result.node])
            survey.facts[result.node] = replace(facts, imports=imports)
    if not all_reduce:
        return [], seconds
    failed = [r for r in results if not (r.ok and reported[r.node].get("all_reduce", {}).get("ok"))]
    if not failed:
        return [], seconds
    return [_all_reduce_failed(survey, failed, reported, port, seconds)], seconds


def _all_reduce_failed(
    survey: Survey,
    failed: list[NodeResult],
    reported: dict[str, dict],
    port: int,
    seconds: float,
) -> Finding:
    evidence = []
    for r in failed:
        outcome = reported[r.node].get("all_reduce", {})
        if outcome.get("joined") is False:
            evidence.append(f"{r.node}: did not join: torch did not import there")
        elif r.ok:  # the process ended well but the sum was wrong
            evidence.append(f"{r.node}: wrong sum {outcome.get('sum')!r}, expected "
                            f"{outcome.get('expected')!r}")  # fmt: skip
        else:
            evidence.append(f"{r.node}: {_last_error(r.stderr or r.stdout)}")
    text = " ".join(" ".join(_verdict_lines(r.stderr)) for r in failed)
    pitfall = next((p for needle, p in _SIGNATURES if needle in text), FindingId.RENDEZVOUS_TIMEOUT)
    world = len(survey.cluster.nodes)
    return Finding(
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
