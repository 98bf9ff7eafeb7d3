"""ssh from this machine to every node, and from every node to every node (itself included).

>>> check_launch_ssh(survey)  # doctest: +SKIP
[Finding(id=<FindingId.SSH_AUTH_FAILED: 'ssh-auth-failed'>, severity=<Severity.ERROR: 2>, ...)]
"""

from __future__ import annotations

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.remote import Failure, classify


def check_launch_ssh(survey: Survey) -> list[Finding]:
    """Nodes this machine could not probe, and why."""
    findings = []
    for host, result in survey.failed.items():
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
                    id=FindingId.SSH_UNREACHABLE,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"the probe did not finish in {result.duration_s:.0f} s"],
                    fix=f"check that {host} is responsive: `ssh {host} uptime`",
                )
            )
    return findings


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
