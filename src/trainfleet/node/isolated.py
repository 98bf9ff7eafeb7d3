"""Every Python trainfleet starts imports nothing from the directory it starts in.

    >>> argv = module_argv("python3", "pip", ["config", "list"])
    >>> argv[:2], argv[-3:]
    (['python3', '-c'], ['pip', 'config', 'list'])
    >>> module_argv("python3", "pip", ["config", "list"], version=(3, 12))
    ['python3', '-P', '-m', 'pip', 'config', 'list']

`python -c CODE` and `python -m MODULE` put the current directory first on sys.path, so a
`base64.py` or `pip.py` there runs before the real module, as whoever started Python. Where
trainfleet starts Python (its node programs here and on nodes, pip, venv, compileall, torchrun,
DeepSpeed's runner) the current directory is the user's launch directory or a home directory,
often shared storage that other nodes write to. `-P` does it from Python 3.11 on, and is used
where the interpreter is known to have it; nodes may run 3.8, so elsewhere the code given to
`-c` first keeps only the absolute entries of sys.path (`sys` is built in: importing it reads no
file), then imports what it needs. (Not PYTHONSAFEPATH: the ranks would inherit it, and a user's
script would no longer import from its own directory.)

What a user's own script imports from its own directory is the user's business: the rank shim
runs it as Python would (node/shim.py). trainfleet's own modules run without that directory.
"""

ABSOLUTE_PATH_ONLY = 'import sys;sys.path[:]=[p for p in sys.path if p[:1]=="/"]'
"""Drops '' (the current directory of `-c`), '.' and relative PYTHONPATH entries. (Double
quotes inside: a shell quotes it in single ones, and --dry-run shows it as written.)"""

RUN_MODULE = (
    ABSOLUTE_PATH_ONLY
    + ";import runpy;del sys.argv[0];"
    + 'runpy.run_module(sys.argv[0],run_name="__main__",alter_sys=True)'
)
"""`python -m` for the module named by the first argument after `-c RUN_MODULE`."""


def module_argv(python, module, args=(), unbuffered=False, version=None):
    """`python [-u] -m MODULE ARGS...`, run without the current directory on sys.path: with -P
    where `python`'s (major, minor) `version` is known to be 3.11 or newer, else with
    RUN_MODULE."""
    flags = ["-u"] if unbuffered else []
    if version is not None and tuple(version[:2]) >= (3, 11):
        return [python] + flags + ["-P", "-m", module] + list(args)
    return [python] + flags + ["-c", RUN_MODULE, module] + list(args)
