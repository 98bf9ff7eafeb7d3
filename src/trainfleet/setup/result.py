"""What a setup step changed (with --dry-run: would change), and what doctor says afterwards.

    >>> result = SetupResult(step="ssh", checks=["ssh"])
    >>> result.add("gpu-node-1", "added 4 line(s) to ~/.ssh/known_hosts")
    >>> result.add("gpu-node-2", "added 4 line(s) to ~/.ssh/known_hosts")
    >>> print(render(result))
    trainfleet setup ssh: 2 change(s)
      gpu-node-[1-2]: added 4 line(s) to ~/.ssh/known_hosts
    doctor (ssh): no problems found

Changes are data, one per node and action; identical ones fold into one line. `--json` emits
`to_json()`, the same data. The exit code is 1 when the doctor checks that end the step still
find a problem at or above the step's `fail_at` severity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainfleet.doctor.findings import Finding, Severity
from trainfleet.untrusted import printable_lines

THIS_MACHINE = "this machine"
"""The launch machine, in changes and messages."""

Confirm = Callable[..., bool]
"""confirm(question_with_details, changed_keys=False) -> True to go ahead. The CLI asks on a
terminal, says yes for --yes, and says no (printing why) when there is no terminal. Replacing
CHANGED host keys (`changed_keys=True`, the man-in-the-middle case) takes a yes typed on the
terminal or --replace-changed-host-keys: --yes alone is a no."""


@dataclass(kw_only=True, slots=True)
class Change:
    node: str
    what: str

    def to_json(self) -> dict:
        return {"node": self.node, "what": self.what}


@dataclass(kw_only=True, slots=True)
class SetupResult:
    step: str
    dry_run: bool = False
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the user should know that is not a change (defaults filled in, things left)."""
    checks: list[str] = field(default_factory=list)
    """The doctor checks that ended the step (empty when they could not run)."""
    findings: list[Finding] = field(default_factory=list)
    fail_at: Severity | None = Severity.ERROR
    """Findings at or above it make the exit code 1 (None: findings are expected, e.g. after
    a revert)."""
    files: dict[str, str] = field(default_factory=dict)
    """Files written (or, dry run, that would be), by role: {"hostfile": path, ...}."""
    seconds: float | None = None
    """How long the step took, its doctor checks included (set by `trainfleet setup` with no
    step, which runs them one after the other; in --json)."""

    def add(self, node: str, what: str) -> None:
        self.changes.append(Change(node=node, what=what))

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def exit_code(self) -> int:
        if self.fail_at is None:
            return 0
        return 1 if any(f.severity >= self.fail_at for f in self.findings) else 0

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "dry_run": self.dry_run,
            "changed": bool(self.changes) and not self.dry_run,
            "changes": [c.to_json() for c in self.changes],
            "notes": self.notes,
            "files": self.files,
            "checks": self.checks,
            "findings": [f.to_json() for f in self.findings],
            "exit_code": self.exit_code,
            "seconds": None if self.seconds is None else round(self.seconds, 1),
        }


def fold_notes(notes: Sequence[str]) -> list[str]:
    """`NODE: text` notes with the same text folded into one (`gpu-node-[1-3]: text`)."""
    from trainfleet.nodeset import fold_names

    by_text: dict[str, list[str]] = {}
    for note in notes:
        host, _, text = note.partition(": ")
        by_text.setdefault(text, []).append(host)
    return [f"{fold_names(hosts)}: {text}" for text, hosts in by_text.items()]


def folded_changes(changes: Sequence[Change]) -> list[str]:
    from trainfleet.nodeset import fold_names

    by_text: dict[str, list[str]] = {}
    for change in changes:
        by_text.setdefault(change.what, [])
        if change.node not in by_text[change.what]:
            by_text[change.what].append(change.node)
    return [f"  {fold_names(nodes)}: {what}" for what, nodes in by_text.items()]


def render(result: SetupResult) -> str:
    from trainfleet.doctor.report import finding_lines

    name = f"trainfleet setup {result.step}" if result.step != "sync" else "trainfleet sync"
    count = len(result.changes)
    if result.dry_run:
        head = f"{name} (dry run): would make {count} change(s)" if count else ""
        head = head or f"{name} (dry run): nothing to change"
    else:
        head = f"{name}: {count} change(s)" if count else f"{name}: nothing changed"
    lines = [head, *folded_changes(result.changes)]
    lines += [f"note: {note}" for note in result.notes]
    if result.checks:
        checks = ", ".join(result.checks)
        shown = [f for f in result.findings if f.severity > Severity.INFO]
        if not shown:
            lines.append(f"doctor ({checks}): no problems found")
        else:
            lines.append(f"doctor ({checks}): {len(shown)} problem(s):")
            for finding in shown:
                lines += finding_lines(finding, indent="  ", max_evidence=8)
    return printable_lines("\n".join(lines))  # paths and notes quote the nodes
