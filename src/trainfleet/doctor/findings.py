"""A finding: one problem, the nodes it is on, what shows it, and the fix.

    >>> f = Finding(id="port-in-use", severity=Severity.WARNING, nodes=("gpu-node-1",),
    ...             evidence=["29500 held by pid 4242: python train.py"], fix="kill 4242")
    >>> f.to_json()["severity"]
    'warning'

`id` is always a PITFALLS.md id; tests and `--json` consumers rely on it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field


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
    id: str
    severity: Severity
    nodes: tuple[str, ...]
    evidence: list[str] = field(default_factory=list)
    fix: str = ""

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "severity": str(self.severity),
            "nodes": list(self.nodes),
            "evidence": self.evidence,
            "fix": self.fix,
        }


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (id, severity, fix): their nodes and evidence joined, order kept."""
    merged: dict[tuple[str, Severity, str], Finding] = {}
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
