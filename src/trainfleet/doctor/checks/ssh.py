"""ssh from this machine to every node, and from every node to every node (itself included).

>>> check_launch_ssh(survey)  # doctest: +SKIP
[Finding(id=<FindingId.SSH_AUTH_FAILED: 'ssh-auth-failed'>, severity=<Severity.ERROR: 2>, ...)]
"""

from __future__ import annotations

import statistics

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import CAP_FACTOR, Survey
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.doctor.pace import STALL_S
from trainfleet.remote import Failure, classify


def check_launch_ssh(survey: Survey) -> list[Finding]:
    """Nodes this machine could not probe, and why."""
    findings = []
    for host, result in survey.failed.items():
        if survey.cluster.node(host).slurm is not None:
            continue  # a step of a Slurm job, not ssh: `slurm.check_unreachable`
        if result.failure.is_connection_failure:
            findings.append(
                Finding(
                    id=result.failure.pitfall_id or FindingId.SSH_UNREACHABLE,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"ssh from this machine: {result.reason()}"],
                    fix=result.failure.fix(host),
                )
            )
        elif result.failure is Failure.TIMED_OUT:
            findings.append(
                Finding(
                    id=FindingId.SLOW_NODE,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[_stopped(survey, host, result.duration_s)],
                    fix=_slow_fix(host),
                )
            )
    return findings


SLOW_FACTOR = 3
"""A probe is late when its start or its own work takes this many times the other nodes'
median..."""
SLOW_FLOOR_S = 5.0
"""...and more than this many seconds."""


def _slow_fix(host: str) -> str:
    return (
        f"see what keeps {host} busy (`ssh {host} uptime`, `top`) and time its login "
        f"(`time ssh {host} true`): a startup file that waits (conda or pyenv init, a network "
        "home) should return early for non-interactive shells"
    )


def _starts(survey: Survey) -> dict[str, float]:
    """When each probe said it started, in seconds from its ssh (those that did)."""
    return {h: t.started_s for h, t in survey.times.items() if t.started_s is not None}


def _others_median(seconds: dict[str, float], host: str) -> float | None:
    others = [s for h, s in seconds.items() if h != host]
    return statistics.median(others) if others else None


def _stopped(survey: Survey, host: str, seconds: float) -> str:
    """Why doctor stopped waiting for a probe, from what the launch node saw of it (`Pace`)."""
    times = survey.times.get(host)
    if times is None or times.bound is None:
        return f"the probe did not finish in {seconds:.0f} s"
    if times.started_s is None:
        median = _others_median(_starts(survey), host)
        others = f" (the other nodes' started in {median:.1f} s)" if median is not None else ""
        return (
            f"ssh did not fail, but the probe had not started after {seconds:.0f} s{others}: "
            "the login shell or Python there is slow or waits"
        )
    phase = f" ({times.phase})" if times.phase else ""
    if times.bound == "silence":
        return (
            f"the probe started after {times.started_s:.1f} s, then said nothing for "
            f"{STALL_S:.0f} s{phase}: the node stopped answering"
        )
    return (
        f"the probe started after {times.started_s:.1f} s and was still working{phase} "
        f"{seconds:.0f} s after ssh began ({CAP_FACTOR}x what this cluster's probe needs)"
    )


def check_slow_nodes(survey: Survey) -> list[Finding]:
    """Probes that came back, but far later than the others: their start (ssh login, shell,
    Python) or their own work (facts, tests) took over SLOW_FACTOR x the other nodes' median."""
    starts = _starts(survey)
    works = {
        host: facts.seconds - (facts.active.go_wait or 0.0)
        for host, facts in survey.facts.items()
        if facts.seconds is not None
    }
    evidence: dict[str, list[str]] = {}
    for host in survey.facts:
        for seconds, what in ((starts, "started after"), (works, "did its own work in")):
            median = _others_median(seconds, host)
            if median is None or seconds.get(host, 0.0) <= max(SLOW_FLOOR_S, SLOW_FACTOR * median):
                continue
            evidence.setdefault(host, []).append(
                f"{host}'s probe {what} {seconds[host]:.1f} s; the other nodes' median: "
                f"{median:.1f} s"
            )
    return [
        Finding(
            id=FindingId.SLOW_NODE,
            severity=Severity.WARNING,
            nodes=(host,),
            evidence=[*lines, "a launch waits for this node as long at every start"],
            fix=_slow_fix(host),
        )
        for host, lines in evidence.items()
    ]


def check_node_to_node_ssh(survey: Survey) -> list[Finding]:
    """The N x N matrix: DeepSpeed's runner (pdsh) needs every node to reach every node."""
    findings = []
    for src, facts in survey.facts.items():
        for dst, outcome in facts.active.ssh.items():
            if dst in survey.failed:
                continue  # already an error from this machine; one finding is enough
            failure = classify(outcome.rc, outcome.stderr, outcome.rc == 124, True)
            if failure is Failure.NONE:
                continue
            detail = outcome.stderr.splitlines()[-1] if outcome.stderr else failure.value
            # Killed by the probe's timeout: the connect hung (a firewall dropping port 22).
            pitfall = failure.pitfall_id or FindingId.SSH_UNREACHABLE
            fix = failure.fix(dst) if failure.pitfall_id else f"check that port 22 of {dst} is open"
            findings.append(
                Finding(
                    id=pitfall,
                    severity=Severity.WARNING,
                    nodes=(dst,),
                    evidence=[f"{src} -> {dst}: {detail}"],
                    fix=f"on each source node above: {fix}"
                    " (DeepSpeed's pdsh runner ssh's from the master to every node)",
                )
            )
    return findings
