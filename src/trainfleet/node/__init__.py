"""Every program trainfleet runs on a node, and the one way they are shipped there.

    >>> needs("probe")[-1], "system" in needs("probe")
    ('probe', True)
    >>> argv("python3", "probe")[-1]
    'trainfleet-probe'

The modules of this package run on nodes, whose python may be old and holds nothing of
trainfleet: stdlib only, Python 3.8 syntax, and between each other only `from trainfleet.node
import NAME` (tests/unit/test_node_package.py checks all three). The launch node imports them
too (for their constants and for tests).

`argv(python, NAME)` starts `python -u -c LOADER trainfleet-NAME` on a node; LOADER reads one
line from stdin, `line(NAME, FUNCTION, *ARGS)`: a program that makes NAME and the node modules
it imports real modules there (`_install`), then exits with FUNCTION(*ARGS)'s return value
(None: 0). The arguments travel as JSON inside that line, never on a command line (where `ps`
would show them). Whatever stdin holds after the line is the program's own: the bootstrap
reads it as its lifeline.

    bootstrap   starts a node's share of a launch; nothing of it outlives the launcher
    shim        every rank's first code: its node's environment, join and exit marks
    probe       doctor's fact sheet, with `system`, `network`, `software`, `peers`, `jitlocks`
    sshkeys     `setup ssh`'s job: keys, known_hosts, authorized_keys
    files       private files (the deepspeed backend's), known_hosts lines, sync's prune
    procs       ending a run's processes by id; stack dumps of ranks (py-spy)
    pyenv       `setup pyenv`'s jobs: what a node's environment holds; installing wheels
    dsops       `setup pyenv`'s DeepSpeed ops: built for the environment or not; building them
    collective  doctor's stack phase: torch imported once, then a real all_reduce
    porthold    a port held on purpose (the sandbox's `port-in-use` fault)
    isolated    Python started without the current directory on sys.path
"""

import ast
import base64
import functools
import inspect
import json
import os

from trainfleet.node import isolated

PACKAGE = "trainfleet.node"
LOADER = (
    isolated.ABSOLUTE_PATH_ONLY + ";import base64;"
    "exec(compile(base64.b64decode(sys.stdin.readline()),'trainfleet-node','exec'))"
)
"""Imports nothing from the directory it starts in (a `base64.py` there would run first):
`trainfleet.node.isolated`."""


def argv(python, name):
    """The command that runs node module `name`'s program with `python` (the node's); its last
    word, `trainfleet-NAME`, is what `ps` shows of it (and what tests look for)."""
    return [python, "-u", "-c", LOADER, "trainfleet-" + name]


def source(name):
    """The text of the node module `name` (a file written on nodes: the shim)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")) as f:
        return f.read()


@functools.cache
def needs(name):
    """`name` and every node module it imports, each after the ones it needs."""
    order = []

    def visit(module, path):
        if module in order:
            return
        if module in path:
            raise ImportError("node modules import each other in a cycle: %s" % " -> ".join(path))
        for dependency in _imports(module):
            visit(dependency, path + (module,))
        order.append(module)

    visit(name, ())
    return tuple(order)


def _imports(name):
    found = []
    for node in ast.walk(ast.parse(source(name))):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found += [alias.name for alias in node.names]
    return found


def line(name, function, *args):
    """The first stdin line for `argv`: node module `name` (and what it imports), then the call
    `function(*args)` (JSON values), whose return value is the exit code."""
    call = "import json, sys\nsys.stdout.flush()\nsys.exit(sys.modules[%r].%s(*json.loads(%r)))" % (
        "%s.%s" % (PACKAGE, name),
        function,
        json.dumps(list(args)),
    )
    return base64.b64encode(_modules(name) + call.encode()) + b"\n"


@functools.lru_cache(maxsize=None)
def _modules(name):
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
    module.__source__ = text
    sys.modules[full] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    setattr(sys.modules["trainfleet.node"], name, module)
    return module
