"""launch/'s modules import each other without a cycle: each one imported first, before any
other trainfleet module, works; and the graph of their imports has no cycle, `if
TYPE_CHECKING:` imports included (a type checker follows them; plan.py, backend.py and
deepspeed.py once imported each other that way). Imports inside functions are not counted:
they run after every module has loaded."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainfleet.launch

pytestmark = pytest.mark.unit

LAUNCH = Path(trainfleet.launch.__file__).parent
SRC = LAUNCH.parents[1]


def _modules() -> dict[str, Path]:
    """Every module of trainfleet.launch, by its dotted name."""
    found = {}
    for path in sorted(LAUNCH.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_level(body: list[ast.stmt]):
    """The import statements that run when the module loads, or that a type checker reads."""
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        elif isinstance(statement, ast.If):
            yield from _module_level(statement.body)
            yield from _module_level(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from _module_level(block)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the launch modules it imports (`from package import submodule` is the
    submodule; any other name imported from a package is the package)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for statement in _module_level(ast.parse(path.read_text()).body):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            elif statement.level == 0 and statement.module:
                base = statement.module
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in statement.names
                ]
            else:
                targets = []
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the modules along it, or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name) :] + [name]
        if name in done:
            return None
        for target in sorted(graph[name]):
            cycle = visit(target, [*path, name])
            if cycle:
                return cycle
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = visit(name, [])
        if cycle:
            return cycle
    return None


def test_the_launch_modules_import_each_other_without_a_cycle():
    graph = import_graph(_modules())
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
    # The layers a newcomer reads: the contract imports no backend, the registry every one.
    assert not graph["trainfleet.launch.backend"] & {n for n in graph if ".backends" in n}
    assert {"trainfleet.launch.backends.ssh", "trainfleet.launch.backends.deepspeed"} <= graph[
        "trainfleet.launch.backends"
    ]


def test_the_cycle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_each_launch_module_imports_first_in_a_fresh_interpreter():
    """One interpreter, trainfleet's modules dropped from it before each import: every launch
    module is the first trainfleet module that loads, as when a program imports only it."""
    names = sorted(_modules())
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'trainfleet']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'{name}: {exc!r}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
