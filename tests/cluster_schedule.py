"""Which cluster test files run on which xdist worker (`make test`: `-n 2 --cluster-bins`).

    >>> took = {"test_a.py": 150, "test_b.py": 40, "test_launch.py": 120, "test_migration.py": 60}
    >>> bins(sorted(took), 2, took)
    {'test_a.py': 1, 'test_b.py': 1, 'test_launch.py': 0, 'test_migration.py': 0}
    >>> file_seconds([("cluster/test_a.py::test_x[1]", 2.5), ("cluster/test_a.py::test_y", 1.0)])
    {'test_a.py': 4}

Two rules. The files that run DeepSpeed's runner share one worker: the runner ends a failed
job with `pkill -f "python -u -m deepspeed.launcher.launch"` on every node, and sandbox nodes
share this machine's process namespace, so a failing job of one file ended the other file's
jobs whenever the two ran side by side (docs/tests.md). Then the longest first, each to the
worker with the least so far: xdist's own order hands files out as workers free up, and a long
file handed out last left the other worker idle at the end of the tier. Each worker runs its
files in collection order (longest first within a worker was tried and measured no better).

How long a file takes is not written here: it is what pytest recorded for it, every test's
setup, call and teardown summed (`file_seconds`), kept in DURATIONS. A cluster tier run with
`--record-durations` rewrites that file for the files it ran whole (not skipped):

    pytest -n 2 --cluster-bins --record-durations -m "cluster and not serial" tests/cluster
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

DEEPSPEED_RUNNER_FILES = (
    "test_launch.py",
    "test_migration.py",
    "test_slurm_deepspeed.py",
    "test_third_party.py",
)
"""The files whose tests run DeepSpeed's runner (`--backend deepspeed`, `deepspeed --hostfile`):
some fail its jobs on purpose, and the runner's cleanup of a failed job ends every DeepSpeed
launcher on the machine, those of a file that only runs a job to its end included."""

DURATIONS = Path(__file__).parent / "cluster" / "durations.json"
"""file name -> seconds its tests took in the last recorded cluster tier (`--record-durations`),
beside the other worker's tests, as the tier runs them."""

UNMEASURED_S = 60
"""What a file missing from DURATIONS counts as, until a recorded tier measures it."""


def recorded_seconds(path: Path = DURATIONS) -> dict[str, int]:
    """The file's `seconds` table; empty where nothing was recorded yet."""
    if not path.exists():
        return {}
    return {name: int(s) for name, s in json.loads(path.read_text())["seconds"].items()}


def file_seconds(phases: Iterable[tuple[str, float]]) -> dict[str, int]:
    """(test node id, seconds of one phase) -> each file's seconds, rounded."""
    summed: dict[str, float] = {}
    for nodeid, seconds in phases:
        name = file_name(nodeid)
        summed[name] = summed.get(name, 0.0) + seconds
    return {name: round(s) for name, s in sorted(summed.items())}


def record(measured: dict[str, int], existing: Iterable[str], path: Path = DURATIONS) -> None:
    """Writes `measured` over what `path` held; a file neither measured nor existing is dropped."""
    kept = set(existing) | set(measured)
    seconds = {**recorded_seconds(path), **measured}
    table = {"seconds": {name: seconds[name] for name in sorted(seconds) if name in kept}}
    path.write_text(json.dumps(table, indent=1) + "\n")


def bins(files: list[str], workers: int, seconds: dict[str, int]) -> dict[str, int]:
    """file name -> worker index (0 .. workers-1)."""
    units: list[tuple[int, tuple[str, ...]]] = []
    together = tuple(f for f in files if f in DEEPSPEED_RUNNER_FILES)
    if together:
        units.append((sum(seconds.get(f, UNMEASURED_S) for f in together), together))
    units += [(seconds.get(f, UNMEASURED_S), (f,)) for f in files if f not in together]
    load = [0] * workers
    placed: dict[str, int] = {}
    for cost, unit in sorted(units, key=lambda u: (-u[0], u[1])):
        worker = load.index(min(load))
        load[worker] += cost
        placed.update((f, worker) for f in unit)
    return dict(sorted(placed.items()))


class FileBinScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per worker: the files `bins` gives it. (Marking
    the tests with `xdist_group` and `--dist loadgroup` would say the same, but xdist 3.8 names
    the groups through an attribute pytest 9.2 no longer reads, and the groups are silently
    ignored: seen here, and pytest-dev/pytest-xdist#1386.)"""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._worker_of: dict[str, int] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._worker_of is None:  # every worker has sent its collection by now
            collection = next(iter(self.registered_collections.values()))
            files = sorted({file_name(n) for n in collection})
            self._worker_of = bins(files, self.numnodes, recorded_seconds())
        return f"worker-{self._worker_of[file_name(nodeid)]}"


def file_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
