"""One shallow hierarchy of user-facing errors; each carries what went wrong *and* the fix.

    >>> from trainfleet.errors import SpecError
    >>> str(SpecError("hostfile", 3, "slots must be > 0, got 0", "write `node-1 slots=8`"))
    'hostfile:3: slots must be > 0, got 0: write `node-1 slots=8`'

`cli.main` catches `TrainfleetError`, prints `trainfleet: <what>: <fix>` and exits 1. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class TrainfleetError(Exception):
    """A problem the user can fix; `fix` says how."""

    def __init__(self, what: str, fix: str = "") -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"{what}: {fix}" if fix else what)


class SpecError(TrainfleetError):
    """A cluster spec (hostfile, cluster.yaml, --hosts, --include/--exclude) that cannot be used."""

    def __init__(self, source: str, line: int | None, problem: str, fix: str) -> None:
        self.source = source
        self.line = line
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {problem}", fix)


class SandboxError(TrainfleetError):
    """The sandbox cluster cannot be brought up, inspected or taken down."""


class RemoteError(TrainfleetError):
    """Remote execution could not even start (no ssh client, bad arguments)."""


class SetupError(TrainfleetError):
    """`trainfleet setup` or `sync` cannot make a change (a node refuses, a key is not trusted)."""


class ClusterFileError(TrainfleetError):
    """A change to cluster.yaml that cannot be made safely; the file is left as it was."""


class NodeAnswerError(TrainfleetError):
    """A node job's answer (`trainfleet.node.read_answer`) is missing or is not what the job
    answers: something on the node printed in its place, or the job died first."""

    def __init__(self, node: str, answer: str, problem: str) -> None:
        self.node = node
        self.problem = problem
        super().__init__(
            f"{node}: no {answer} came back ({problem})",
            f"see what answers on {node} (`trainfleet exec -- python3 --version`): a wrapper or "
            "a profile script may print in its place, and its errors are on stderr",
        )
