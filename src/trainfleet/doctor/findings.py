"""A finding: one problem, the nodes it is on, what shows it, and the fix.

    >>> f = Finding(id="port-in-use", severity=Severity.WARNING, nodes=("gpu-node-1",),
    ...             evidence=["29500 held by pid 4242: python train.py"], fix="kill 4242")
    >>> f.to_json()["severity"]
    'warning'

`id` is always a catalogued id (`trainfleet.catalog.FindingId`, docs/findings.md): a Finding
turns the text it is given into its member and refuses an id the catalog does not hold. Tests
and `--json` consumers rely on the id's text.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainfleet.catalog import FindingId


class Severity(enum.IntEnum):
    """ERROR: the launch will fail or hang. WARNING: it may, or it will be slow. INFO: worth
    knowing (what NCCL/gloo would pick, what trainfleet will set)."""

    INFO = 0
    WARNING = 1
    ERROR = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(kw_only=True, slots=True)
class Finding:
    id: FindingId
    """A str such as "port-in-use" is taken and becomes its member; an unknown id raises."""
    severity: Severity
    nodes: tuple[str, ...]
    evidence: list[str] = field(default_factory=list)
    fix: str = ""

    def __post_init__(self) -> None:
        self.id = FindingId(self.id)

    def to_json(self) -> dict:
        return {
            "id": self.id.value,
            "severity": str(self.severity),
            "nodes": list(self.nodes),
            "evidence": self.evidence,
            "fix": self.fix,
        }


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (id, severity, fix): their nodes and evidence joined, order kept."""
    merged: dict[tuple[FindingId, Severity, str], Finding] = {}
    for finding in findings:
        key = (finding.id, finding.severity, finding.fix)
        if key not in merged:
            merged[key] = Finding(
                id=finding.id, severity=finding.severity, nodes=(), evidence=[], fix=finding.fix
            )
        into = merged[key]
        into.nodes += tuple(n for n in finding.nodes if n not in into.nodes)
        into.evidence += [e for e in finding.evidence if e not in into.evidence]
    return sorted(merged.values(), key=lambda f: -f.severity)
