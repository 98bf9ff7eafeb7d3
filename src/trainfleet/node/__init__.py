"""Every program trainfleet runs on a node, and the one way they are shipped there.

    >>> from trainfleet.node import jitlocks
    >>> needs("probe")[-1], "system" in needs("probe")
    ('probe', True)
    >>> argv("python3", jitlocks.remove_main)[-1]
    'trainfleet-jitlocks'
    >>> said = 'a profile script\\n@@trainfleet-answer {"outcome": {}}\\n'
    >>> read_answer(said, jitlocks.RemoveAnswer, node="n1")
    {'outcome': {}}

The modules of this package run on nodes, whose python may be old and holds nothing of
trainfleet: stdlib only, Python 3.8 syntax, and between each other only `from trainfleet.node
import NAME` (tests/unit/test_node_package.py checks all three). The launch node imports them
too (for their constants and for tests).

`argv(python, FUNCTION)` starts `python -u -c LOADER trainfleet-NAME` on a node (NAME: the node
module FUNCTION is defined in); LOADER reads one line from stdin, `line(FUNCTION, *ARGS)`: a
program that makes NAME and the node modules it imports real modules there (`_install`), then
exits with FUNCTION(*ARGS)'s return value (None: 0). The arguments travel as JSON inside that
line, never on a command line (where `ps` would show them). Whatever stdin holds after the line
is the program's own: the bootstrap reads it as its lifeline.

A job's input and its answer are TypedDicts in its node module, built by the launch side and
read there without defaults. The answer comes back as one line on stdout, `answer.MARK` then
JSON (`answer.send`), and is read here by `read_answer` (the last such line; `read_answers`:
all of them, for a job that answers once per item), which names the node when it is missing or
is not the TypedDict. Lines read while the job runs (the probe's `started`/`alive` marks on
stderr, the bootstrap's and porthold's streams) are not answers.

    bootstrap   starts a node's share of a launch; nothing of it outlives the launcher
    shim        every rank's first code: its node's environment, join and exit marks
    probe       doctor's fact sheet, with `system`, `network`, `software`, `peers`, `jitlocks`,
                `gpus`
    sshkeys     `setup ssh`'s job: keys, known_hosts, authorized_keys
    files       private files (the deepspeed backend's), known_hosts lines, sync's prune
    procs       ending a run's processes by id; stack dumps of ranks (py-spy)
    pyenv       `setup pyenv`'s jobs: what a node's environment holds; installing wheels
    dsops       `setup pyenv`'s DeepSpeed ops: built for the environment or not; building them
    collective  doctor's stack phase: torch imported once, then a real all_reduce
    porthold    a port held on purpose (the sandbox's `port-in-use` fault)
    answer      a job's answer: one marked line on stdout (`answer.send`)
    isolated    Python started without the current directory on sys.path
"""

import ast
import base64
import functools
import importlib
import inspect
import json
import os
import types
from collections.abc import Callable
from typing import Any

from trainfleet.errors import NodeAnswerError
from trainfleet.node import answer, isolated

PACKAGE = "trainfleet.node"
LOADER = (
    isolated.ABSOLUTE_PATH_ONLY + ";import base64;"
    "exec(compile(base64.b64decode(sys.stdin.readline()),'trainfleet-node','exec'))"
)
"""Imports nothing from the directory it starts in (a `base64.py` there would run first):
`trainfleet.node.isolated`."""


def argv(python: str, program: Callable[..., Any] | types.ModuleType) -> list[str]:
    """The command that runs a node program with `python` (the node's); `program` is the node
    function `line` calls, or its module. Its last word, `trainfleet-NAME` (NAME: the module),
    is what `ps` shows of it (and what tests look for)."""
    return [python, "-u", "-c", LOADER, "trainfleet-" + module_name(program)]


def module_name(program: Callable[..., Any] | types.ModuleType) -> str:
    """NAME of node module trainfleet.node.NAME that holds `program` (a function or the module);
    ValueError for anything else: only node modules are shipped."""
    module = program.__name__ if isinstance(program, types.ModuleType) else program.__module__
    package, _, name = module.rpartition(".")
    if package != PACKAGE or not name:
        raise ValueError("%r is not a node program (trainfleet.node.NAME)" % (program,))
    return name


def source(name: str) -> str:
    """The text of the node module `name` (a file written on nodes: the shim)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")) as f:
        return f.read()


@functools.cache
def needs(name: str) -> tuple[str, ...]:
    """`name` and every node module it imports, each after the ones it needs."""
    order: list[str] = []

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in order:
            return
        if module in path:
            raise ImportError("node modules import each other in a cycle: %s" % " -> ".join(path))
        for dependency in _imports(module):
            visit(dependency, path + (module,))
        order.append(module)

    visit(name, ())
    return tuple(order)


def _imports(name: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source(name))):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found += [alias.name for alias in node.names]
    return found


def line(function: Callable[..., Any], *args: Any) -> bytes:
    """The first stdin line for `argv`: `function`'s node module (and what it imports), then the
    call `function(*args)` (JSON values), whose return value is the exit code."""
    name = module_name(function)
    module = importlib.import_module("%s.%s" % (PACKAGE, name))
    if getattr(module, function.__name__, None) is not function:
        raise ValueError("%s is not a function of %s" % (function.__qualname__, module.__name__))
    call = "import json, sys\nsys.stdout.flush()\nsys.exit(sys.modules[%r].%s(*json.loads(%r)))" % (
        "%s.%s" % (PACKAGE, name),
        function.__name__,
        json.dumps(list(args)),
    )
    return base64.b64encode(_modules(name) + call.encode()) + b"\n"


def read_answers(stdout: str, kind: type, *, node: str) -> list[Any]:
    """Every answer line (`answer.MARK` + JSON) in a node job's `stdout`, in order, each checked
    to be a dict holding the keys of `kind` (the job's answer TypedDict). NodeAnswerError,
    naming `node`, when one is not JSON or lacks a key (a node's words are untrusted: callers
    still check each value before use)."""
    found = []
    for text in stdout.splitlines():
        if not text.startswith(answer.MARK):
            continue
        try:
            value = json.loads(text[len(answer.MARK) :])
        except ValueError:
            raise NodeAnswerError(node, kind.__name__, "its answer line is not JSON") from None
        # A TypedDict class's own attribute: no type says "any TypedDict class" (kind: type).
        required = kind.__required_keys__  # type: ignore[attr-defined]
        missing = sorted(required - set(value)) if isinstance(value, dict) else None
        if missing is None or missing:
            problem = "its answer is not an object" if missing is None else "no %s" % missing
            raise NodeAnswerError(node, kind.__name__, problem)
        found.append(value)
    return found


def read_answer(stdout: str, kind: type, *, node: str) -> Any:
    """The answer of a node job that answers once: the last answer line of `stdout`, as
    `read_answers` checks it; NodeAnswerError naming `node` when there is none."""
    answers = read_answers(stdout, kind, node=node)
    if not answers:
        raise NodeAnswerError(node, kind.__name__, "it printed no answer line")
    return answers[-1]


@functools.lru_cache(maxsize=None)
def _modules(name: str) -> bytes:
    """The part of `line` that is the same for every node and call: the modules, installed."""
    parts = [inspect.getsource(_install)]
    parts += ["_install(%r, %r)" % (module, source(module)) for module in needs(name)]
    return ("\n".join(parts) + "\n").encode()


def _install(name, text):
    """Runs on the node: `text` becomes module trainfleet.node.NAME (its packages made empty
    where missing; tracebacks show its lines). The text stays in `__source__`."""
    import linecache
    import sys
    import traceback
    import types

    sys.excepthook = traceback.print_exception  # reads linecache; the built-in hook does not

    full = "trainfleet.node." + name
    for parent in ("trainfleet", "trainfleet.node"):
        if parent not in sys.modules:
            package = types.ModuleType(parent)
            package.__path__ = []
            sys.modules[parent] = package
    filename = "<node>/trainfleet/node/%s.py" % name
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    module = types.ModuleType(full)
    module.__dict__["__source__"] = text  # read back by getattr: system.own_source
    sys.modules[full] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    setattr(sys.modules["trainfleet.node"], name, module)
    return module
