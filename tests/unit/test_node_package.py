"""trainfleet.node: what runs on nodes is real modules, old-Python safe and stdlib-only, shipped
one way; and no Python is left in string literals elsewhere."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet import node
from trainfleet.errors import NodeAnswerError
from trainfleet.node import files, jitlocks, procs

pytestmark = pytest.mark.unit

PACKAGE_DIR = Path(node.__file__).parent
SRC = PACKAGE_DIR.parent
MODULES = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__")
IMPORTED_INSIDE_A_FUNCTION = {"torch", "deepspeed"}
"""What a node's own python may or may not have: only imported where it is used."""


def _tree(name: str) -> ast.Module:
    return ast.parse(node.source(name), feature_version=(3, 8))


@pytest.mark.parametrize("name", MODULES)
def test_every_node_module_is_python_3_8_and_imports_only_the_stdlib(name):
    tree = _tree(name)  # raises SyntaxError on 3.9+ syntax
    top_level = {id(n) for n in tree.body}
    for found in ast.walk(tree):
        if isinstance(found, ast.Import):
            roots = [alias.name.split(".")[0] for alias in found.names]
        elif isinstance(found, ast.ImportFrom):
            if found.module == node.PACKAGE:
                assert id(found) in top_level, f"{name}: imports a node module inside a function"
                assert all(alias.name in MODULES for alias in found.names), name
                continue
            assert found.level == 0 and found.module, f"{name}: relative import"
            roots = [found.module.split(".")[0]]
        else:
            continue
        for root in roots:
            if root in sys.stdlib_module_names:
                continue
            assert root in IMPORTED_INSIDE_A_FUNCTION, f"{name} imports {root}"
            assert id(found) not in top_level, f"{name} imports {root} at module level"


def _annotations(tree: ast.Module):
    for found in ast.walk(tree):
        if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = found.args.posonlyargs + found.args.args + found.args.kwonlyargs
            yield from (a.annotation for a in arguments if a.annotation)
            if found.returns:
                yield found.returns
        elif isinstance(found, ast.AnnAssign):
            yield found.annotation


@pytest.mark.parametrize("name", MODULES)
def test_no_annotation_that_python_3_8_cannot_evaluate(name):
    """`X | None` and `list[int]` parse on 3.8 but raise when the def runs there."""
    for annotation in _annotations(_tree(name)):
        for part in ast.walk(annotation):
            assert not isinstance(part, ast.BinOp), f"{name}:{part.lineno}: X | Y"
            if isinstance(part, ast.Subscript) and isinstance(part.value, ast.Name):
                assert part.value.id not in {"list", "dict", "tuple", "set", "type"}, (
                    f"{name}:{part.lineno}: {part.value.id}[...]"
                )


def test_what_a_module_needs_is_shipped_with_it_dependencies_first():
    assert node.needs("probe")[-1] == "probe"
    order = node.needs("probe")
    assert set(order) == {
        "answer", "system", "network", "software", "peers", "jitlocks", "gpus", "probe"
    }  # fmt: skip
    assert order.index("system") < order.index("gpus")
    assert node.needs("collective") == ("answer", "stack_imports", "collective")
    assert order.index("system") < order.index("network")
    assert node.needs("files") == ("answer", "files")


def test_a_shipped_program_runs_its_function_and_exits_with_its_code(tmp_path):
    directory = tmp_path / "run"
    job = files.PrivateJob(dir=str(directory), files={"a.txt": "x"}, remove=False)
    argv, line = node.argv(sys.executable, files), node.line(files.put_private, job)
    done = subprocess.run(argv, input=line, capture_output=True, check=False)
    assert done.returncode == 0 and (directory / "a.txt").read_text() == "x"
    os.chmod(directory, 0o777)  # another user could write it now: refused, exit 3
    again = subprocess.run(argv, input=line, capture_output=True, check=False)
    assert again.returncode == 3 and b"not this user's private directory" in again.stderr


def test_a_node_programs_traceback_shows_its_own_file_and_line():
    broken = node.line(files.put_private, {"files": {}, "remove": False})  # no "dir"
    done = subprocess.run(node.argv(sys.executable, files), input=broken, capture_output=True,
                          check=False)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1 and "KeyError: 'dir'" in err
    assert 'trainfleet/node/files.py", line' in err
    assert 'os.mkdir(job["dir"], 0o700)' in err  # the source line itself


def test_stdin_after_the_program_line_is_the_programs_own():
    """The bootstrap's lifeline: the loader reads one line and leaves the rest."""
    line = node.line(procs.dump_stacks, [f"0={os.getpid()}"])
    argv = node.argv(sys.executable, procs)
    done = subprocess.run(argv, input=line + b"more\n", capture_output=True, check=True)
    out = done.stdout.decode()
    assert out.startswith(f"@@rank 0 pid {os.getpid()}\nState:\t")


def test_a_call_names_a_node_function_never_another_one():
    assert node.argv("python3", files)[-1] == node.argv("python3", files.prune)[-1]
    with pytest.raises(ValueError, match="not a node program"):
        node.line(json.dumps, {})

    def prune(job):  # says it is files.prune, but is not the module's
        return job

    prune.__module__ = files.__name__
    with pytest.raises(ValueError, match="prune is not a function of trainfleet.node.files"):
        node.line(prune, {})


def test_a_job_answers_in_one_marked_line_that_read_answer_takes_back(tmp_path):
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    lock.touch()  # fresh: kept
    job = jitlocks.RemoveJob(paths=[str(lock)], extensions_dir=str(tmp_path))
    argv, line = node.argv(sys.executable, jitlocks), node.line(jitlocks.remove_main, job)
    done = subprocess.run(argv, input=line, capture_output=True, check=True)
    answer = node.read_answer("motd\n" + done.stdout.decode(), jitlocks.RemoveAnswer, node="n1")
    assert list(answer["outcome"]) == [str(lock)] and answer["outcome"][str(lock)].startswith(
        "kept"
    )


@pytest.mark.parametrize(
    ("stdout", "problem"),
    [
        ("{}\n", "it printed no answer line"),
        ("@@trainfleet-answer {\n", "its answer line is not JSON"),
        ("@@trainfleet-answer []\n", "its answer is not an object"),
        ("@@trainfleet-answer {}\n", "no ['outcome']"),
    ],
)
def test_a_missing_or_malformed_answer_is_an_error_naming_the_node(stdout, problem):
    with pytest.raises(NodeAnswerError) as caught:
        node.read_answer(stdout, jitlocks.RemoveAnswer, node="gpu-node-2")
    assert caught.value.node == "gpu-node-2" and caught.value.problem == problem
    assert str(caught.value).startswith("gpu-node-2: no RemoveAnswer came back")


def _python_like(text: str) -> bool:
    if "import " not in text or "\n" not in text.strip():
        return False
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Import | ast.ImportFrom) for n in tree.body) and len(tree.body) > 2


def test_no_python_program_is_left_in_a_string_literal_outside_the_node_package():
    """Such a program is never linted or imported by a test; it belongs in trainfleet.node."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if PACKAGE_DIR in path.parents:
            continue
        for constant in ast.walk(ast.parse(path.read_text())):
            if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                if _python_like(constant.value):
                    found.append(f"{path.relative_to(SRC)}:{constant.lineno}")
    assert found == []


PLANTED = ("base64", "json", "runpy", "pip", "compileall", "venv", "trainfleet")
"""Modules a file in the current directory would shadow if it came first on sys.path."""


def _plant(directory: Path) -> Path:
    """A `NAME.py` for each of PLANTED in `directory` that leaves a mark when it runs."""
    marks = directory / "ran"
    marks.mkdir()
    for name in PLANTED:
        code = f"open({str(marks / name)!r}, 'w').close()\n"
        (directory / f"{name}.py").write_text(code)
    return marks


def test_no_program_trainfleet_starts_imports_from_the_directory_it_starts_in(tmp_path):
    """The launch directory is often shared storage that nodes write to: a `base64.py` there
    ran as trainfleet when the node-program loader started in it (doctor --fix's known_hosts
    append, every localhost node), a `pip.py` when setup pyenv asked pip for its config."""
    from trainfleet.node import isolated
    from trainfleet.setup.pyenv import wheels

    marks = _plant(tmp_path)
    line = node.line(
        files.put_private, {"dir": str(tmp_path / "run"), "files": {"a": "x"}, "remove": False}
    )
    loaded = subprocess.run(node.argv(sys.executable, files), input=line, cwd=tmp_path,
                            capture_output=True, check=False)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert (tmp_path / "run" / "a").read_text() == "x"
    module = isolated.module_argv(sys.executable, "compileall", ["-q", str(tmp_path / "run")])
    assert subprocess.run(module, cwd=tmp_path, capture_output=True, check=False).returncode == 0
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        wheels.pip_find_links()
    finally:
        os.chdir(here)
    assert sorted(p.name for p in marks.iterdir()) == []
    # ... and the planted files would have run without it (the test can fail):
    plain = [sys.executable, "-c", "import base64, json"]
    subprocess.run(plain, cwd=tmp_path, check=True)
    assert sorted(p.name for p in marks.iterdir()) == ["base64", "json"]


def test_the_rank_contracts_variable_names_are_written_only_in_the_shim():
    """TRAINFLEET_RUN_ID and the others: the launch side sets them through shim's constants."""
    from trainfleet.node import shim

    names = {shim.RUN_ID_ENV, shim.RESTART_ENV, shim.LOCAL_RANK_ARG_ENV, shim.NO_PYTHON_ENV}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == PACKAGE_DIR / "shim.py":
            continue
        for constant in ast.walk(ast.parse(path.read_text())):
            if isinstance(constant, ast.Constant) and constant.value in names:
                found.append(f"{path.relative_to(SRC)}:{constant.lineno}")
    assert found == []
