"""Which cluster test files run on which xdist worker (`make test`: `-n 2 --cluster-bins`).

    >>> took = {"test_a.py": 150, "test_b.py": 40, "test_launch.py": 120, "test_migration.py": 60}
    >>> bins(sorted(took), 2, took)
    {'test_a.py': 1, 'test_b.py': 1, 'test_launch.py': 0, 'test_migration.py': 0}

Two rules. The files that run DeepSpeed's runner share one worker: the runner ends a failed
job with `pkill -f "python -u -m deepspeed.launcher.launch"` on every node, and sandbox nodes
share this machine's process namespace, so a failing job of one file ended the other file's
jobs whenever the two ran side by side (docs/tests.md). Then the longest first, each to the
worker with the least so far, by what each file took in a measured tier: xdist's own order
hands files out as workers free up, and a long file handed out last (test_train, 204 s) left
the other worker idle for the last 74 s of the tier. (Each worker running its files longest
first was tried: test_setup then ran beside test_launch and took 307 s instead of 378 s, but
the 80 longest test phases summed 1,624 s against 1,588 s, and the tier took 820 s against 813 s;
each worker runs its files in collection order.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

DEEPSPEED_RUNNER_FILES = ("test_launch.py", "test_migration.py", "test_third_party.py")
"""The files whose tests run DeepSpeed's runner (`--backend deepspeed`, `deepspeed --hostfile`)
and fail some of its jobs on purpose."""

SECONDS = {
    "test_setup.py": 387,
    "test_chaos.py": 316,
    "test_launch.py": 315,
    "test_train.py": 201,
    "test_migration.py": 143,
    "test_third_party.py": 122,
    "test_doctor.py": 87,
    "test_doctor_load.py": 30,
    "test_commtest.py": 28,
    "test_sandbox_exec.py": 17,
    "test_sandbox_faults.py": 10,
}
"""What each file's tests took beside the other worker's, setup and teardown included: the
mean of two cluster tiers of 2026-11-25 (a timeline of every test's start and end), one with
xdist's own order of files and one with these bins. A file missing here counts as
UNMEASURED_S until it is measured."""
UNMEASURED_S = 60


def bins(files: list[str], workers: int, seconds: dict[str, int] = SECONDS) -> dict[str, int]:
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
            files = sorted({_file_name(n) for n in collection})
            self._worker_of = bins(files, self.numnodes)
        return f"worker-{self._worker_of[_file_name(nodeid)]}"


def _file_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
