"""Every finding id trainfleet reports, with what it means: the one registry of ids.

    >>> FindingId.SSH_UNREACHABLE == "ssh-unreachable"
    True
    >>> f"{FindingId.PORT_IN_USE}: 29500 is taken"
    'port-in-use: 29500 is taken'
    >>> CATALOG[FindingId.SLOW_LINK].area
    <Area.NETWORK: 'network'>
    >>> CATALOG[FindingId.SLOW_LINK].sandbox.faults
    ('slow-link',)

An id is a `str` (doctor's `--json`, restart causes and tests see the same text), and each is
a member of `FindingId`, so that code names ids by attribute and a misspelt one fails at
import. `Finding` (doctor/findings.py) turns the id it is given into a member and refuses
one that is not catalogued. `CATALOG` holds each id's entry: its area, what a user sees
without trainfleet, how trainfleet finds it, the fix, and how the sandbox reproduces it.
Entries marked `planned` are known failures that trainfleet does not report yet.

docs/findings.md is generated from here: `python -m trainfleet.catalog --markdown >
docs/findings.md` (a unit test keeps the two equal).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from trainfleet.catalog import connectivity, node, scheduler
from trainfleet.catalog.ids import Area, Entry, FindingId, Sandbox

if TYPE_CHECKING:  # doctor's findings are built on this catalog: no import at run time
    from trainfleet.doctor.findings import Finding

__all__ = [
    "CATALOG", "Area", "Entry", "FindingId", "Sandbox", "commands_that_fix", "main", "markdown"
]  # fmt: skip

CATALOG: dict[FindingId, Entry] = {**connectivity.ENTRIES, **node.ENTRIES, **scheduler.ENTRIES}
"""Every id's entry, in the order of docs/findings.md."""


def commands_that_fix(findings: Iterable[Finding], cluster_flags: Sequence[str]) -> list[str]:
    """One line per trainfleet command that fixes some of `findings` (`Entry.fixed_by`), in
    the order `setup`'s steps run, each with the ids and nodes it fixes; `cluster_flags` are
    the cluster options as the user gave them.

        >>> from trainfleet.doctor.findings import Finding, Severity
        >>> found = [Finding(id="firewall-blocks-ports", severity=Severity.ERROR,
        ...                  nodes=("gpu-node-1",), evidence=[], fix="")]
        >>> print(*commands_that_fix(found, ["-c", "cluster.yaml"]))
        trainfleet setup firewall --apply -c cluster.yaml   (firewall-blocks-ports on gpu-node-1)
    """
    from trainfleet.nodeset import fold_names
    from trainfleet.setup.steps import STEPS  # the order `setup` runs them in

    order = [step.command for step in STEPS]

    fixes: dict[str, list[str]] = {}
    for finding in findings:
        command = CATALOG[FindingId(finding.id)].fixed_by
        if command:
            fixes.setdefault(command, []).append(f"{finding.id} on {fold_names(finding.nodes)}")
    flags = shlex.join(cluster_flags)
    return [
        f"trainfleet {command} {flags}".rstrip() + f"   ({', '.join(fixes[command])})"
        for command in sorted(fixes, key=lambda c: order.index(c.split(" --")[0]))
    ]


# ----------------------------------------------------------------------------- docs/findings.md

_HOW = "python -m trainfleet.catalog --markdown > docs/findings.md"
_COLUMNS = ("id", "what you see", "how trainfleet finds it", "fix", "sandbox test")


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def _sandbox_cell(entry: Entry) -> str:
    box = entry.sandbox
    if box is None:
        return "no"
    how = [f"`--fault {name}`" for name in box.faults] + ([box.setup] if box.setup else [])
    return "; ".join(how) + " (" + ", ".join(box.tests) + ")"


def markdown() -> str:
    """docs/findings.md: one section per area, one table row per id."""
    lines = [
        f"<!-- Generated from src/trainfleet/catalog/ by `{_HOW}`: edit that, not this. -->",
        "# Findings",
        "",
        "Every id trainfleet reports (`doctor`, `--json`, launch diagnoses, restart causes),",
        "grouped by where the failure lives. *Planned*: a known failure trainfleet does not",
        "report yet; its row says what it should do. The sandbox column names the",
        "`trainfleet sandbox up --fault` or the set-up that reproduces it and the tests under",
        "tests/cluster/ that assert the id; `no`: no sandbox test (no GPU, InfiniBand or clock",
        "there, or none written yet).",
    ]
    for area in Area:
        lines += ["", f"## {area.value}", ""]
        lines += ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
        for finding, entry in CATALOG.items():
            if entry.area is not area:
                continue
            name = f"`{finding}`" + (" (planned)" if entry.planned else "") + f": {entry.title}"
            row = (name, entry.seen, entry.detect, entry.fix, _sandbox_cell(entry))
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainfleet.catalog", description="the finding ids trainfleet reports"
    )
    parser.add_argument("--markdown", action="store_true", help="docs/findings.md's text")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
    else:
        for finding, entry in CATALOG.items():
            print(f"{finding:24} {entry.area.value:9} {entry.title}")
    return 0
