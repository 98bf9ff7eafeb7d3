"""The human report: findings grouped by severity, identical node rows folded.

>>> print(render(report))  # doctest: +SKIP
"""

from __future__ import annotations

from trainfleet.doctor import DoctorReport
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.nodeset import fold_groups, fold_names
from trainfleet.untrusted import printable_lines

_LABEL = {Severity.ERROR: "ERROR", Severity.WARNING: "WARNING", Severity.INFO: "info"}


def _counts(report: DoctorReport) -> str:
    parts = []
    for severity in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        n = sum(1 for f in report.findings if f.severity is severity)
        if n:
            parts.append(f"{n} {str(severity)}{'s' if n > 1 else ''}")
    return ", ".join(parts) or "no problems found"


def finding_lines(finding: Finding, indent: str = "", max_evidence: int | None = None) -> list[str]:
    """One finding as the reports show it: label, id, folded nodes; evidence; fix. Evidence
    quotes nodes (a torch import error, a path): control characters are shown as `?`."""
    where = fold_names(finding.nodes) if finding.nodes else "this machine"
    lines = [f"{indent}{_LABEL[finding.severity]:7} {finding.id}  [{where}]"]
    lines += [f"{indent}  {line}" for line in finding.evidence[:max_evidence]]
    if finding.fix:
        lines.append(f"{indent}  fix: {finding.fix}")
    return [printable_lines(line) for line in lines]


def render(report: DoctorReport) -> str:
    head = f"trainfleet doctor: {len(report.nodes)} node(s), {_counts(report)}"
    phases = ", ".join(f"{name} {t:.1f} s" for name, t in report.phases.items())
    lines = [f"{head} ({report.seconds:.1f} s{': ' + phases if len(report.phases) > 1 else ''})"]
    for finding in report.findings:
        lines += ["", *finding_lines(finding)]
    for problem in report.problems:
        lines += ["", f"doctor could not examine {problem}"]
    lines += [
        "",
        "nodes (interface = what trainfleet sets per node: pinned in cluster.yaml, else the "
        "route to the master):",
    ]
    rows = {}
    for host, info in report.nodes.items():
        if not info.reachable:
            rows[host] = f"not examined: {info.failure}"
            continue
        versions = info.versions
        rows[host] = (
            f"{info.interface or '?'} ({info.subnet or '-'})  NCCL default: "
            f"{info.nccl_default or '-'}  gloo default: {info.gloo_default}  "
            f"python {versions.get('python')}  torch {versions.get('torch') or '-'}  "
            f"GPUs {info.gpus}/{info.slots} slots"
        )
    for names, text in fold_groups(rows):
        lines.append(f"  {names}: {text}")
    return printable_lines("\n".join(lines))
