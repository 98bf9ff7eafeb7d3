"""The finding ids: one registry (`trainfleet.catalog`), used by every module that reports or
compares an id, documented in docs/findings.md, and backed by cluster tests where the sandbox
can reproduce the failure."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from trainfleet.catalog import CATALOG, Area, FindingId, markdown
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.sandbox.faults import FAULTS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
SRC = ROOT / "src" / "trainfleet"
REGISTRY = SRC / "catalog"
CLUSTER_TESTS = ROOT / "tests" / "cluster"


def _sources() -> list[tuple[Path, ast.Module]]:
    return [
        (p, ast.parse(p.read_text()))
        for p in sorted(SRC.rglob("*.py"))
        if REGISTRY not in p.parents
    ]


def test_docs_findings_md_is_the_generated_text():
    committed = (ROOT / "docs" / "findings.md").read_text()
    assert committed == markdown(), (
        "docs/findings.md is out of date: python -m trainfleet.catalog --markdown > "
        "docs/findings.md"
    )


def test_every_id_has_one_entry_with_its_words():
    assert list(CATALOG) == list(FindingId)
    for finding, entry in CATALOG.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", finding.value), finding
        assert isinstance(entry.area, Area)
        assert entry.title and entry.seen and entry.detect and entry.fix, finding
    assert {entry.area for entry in CATALOG.values()} == set(Area)


def test_an_id_is_its_text_in_comparisons_formatting_and_json():
    assert FindingId.SSH_UNREACHABLE == "ssh-unreachable"
    assert f"{FindingId.RANK_HUNG}: x" == str(FindingId.RANK_HUNG) + ": x" == "rank-hung: x"
    assert json.dumps([FindingId.PORT_IN_USE]) == '["port-in-use"]'
    assert "port-in-use" in {FindingId.PORT_IN_USE: 1}


def test_a_finding_takes_only_a_catalogued_id():
    finding = Finding(id="port-in-use", severity=Severity.ERROR, nodes=("n1",))
    assert finding.id is FindingId.PORT_IN_USE
    assert type(finding.to_json()["id"]) is str
    with pytest.raises(ValueError, match="no-such-thing"):
        Finding(id="no-such-thing", severity=Severity.ERROR, nodes=("n1",))


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes that are docstrings (modules, classes, functions, and the
    string right under an assignment)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
        for before, after in zip(body, body[1:], strict=False):
            if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                found.add(id(after.value))
    return found


def _help_texts(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes inside a module's HELP and DESCRIPTION (a command's prose)."""
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("HELP", "DESCRIPTION") for t in node.targets
        ):
            found |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return found


_ANY_ID = re.compile(
    r"(?<![\w-])(" + "|".join(re.escape(f.value) for f in FindingId) + r")(?![\w-])"
)


def test_no_code_spells_an_id_as_a_bare_string():
    """Outside the registry, code names an id as `FindingId.X` (a misspelt one fails at import).
    Allowed: prose (docstrings, a command's help) and the sandbox's fault names, some of which
    are spelt like the id they cause."""
    bare = []
    for path, tree in _sources():
        prose = _docstrings(tree) | _help_texts(tree)
        fault_names = path.parent.name == "sandbox" or path.name == "demo.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in prose:
                continue
            for word in _ANY_ID.findall(node.value):
                if not (fault_names and word in FAULTS):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {word}")
    assert bare == []


def _referenced_ids() -> dict[FindingId, list[str]]:
    used: dict[FindingId, list[str]] = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "FindingId"
            ):
                used.setdefault(FindingId[node.attr], []).append(str(path.relative_to(ROOT)))
    return used


def test_the_ids_code_uses_are_exactly_those_not_planned():
    """`planned` is true of an entry exactly when no code reports or compares its id."""
    used = _referenced_ids()
    planned = {f for f, entry in CATALOG.items() if entry.planned}
    assert {f: used[f] for f in planned if f in used} == {}
    assert [f for f in FindingId if f not in used and f not in planned] == []


def test_every_sandbox_fault_is_in_the_entry_of_the_id_it_causes():
    for name, kind in FAULTS.items():
        if kind.pitfall_id is None:  # a hostile node (sandbox/hostile.py): no pitfall
            continue
        assert isinstance(kind.pitfall_id, FindingId), name
        box = CATALOG[kind.pitfall_id].sandbox
        assert box is not None and name in box.faults, (name, kind.pitfall_id)
    named = {n: f for f, e in CATALOG.items() if e.sandbox for n in e.sandbox.faults}
    assert set(named) <= set(FAULTS)


@pytest.mark.parametrize("finding", [f for f, entry in CATALOG.items() if entry.sandbox], ids=str)
def test_each_reproducible_entry_has_cluster_tests_that_name_it(finding):
    box = CATALOG[finding].sandbox
    assert box.tests and (box.faults or box.setup)
    for name in box.tests:
        assert finding.value in (CLUSTER_TESTS / name).read_text(), name
