"""Test tiers: `unit` (no root, no network) and `cluster` (root + `ip netns`: a real sandbox).

A cluster test on a machine without root or `ip netns` is skipped with the reason; CI runs as
root, so both tiers run there. The `make_sandbox` fixture always takes its sandboxes down,
also when the test fails; each test process (an xdist worker is one) takes down at its end
every sandbox of its own left up (SIGTERM, a CI time limit, ends it like Ctrl-C, so that this
still runs), and a session running alone takes down at its start what a killed one left
(tests/session_scope.py says what is a process's own).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cluster_schedule
from session_scope import TEST_SANDBOX, own_sandbox_name, own_sandboxes_up, sandboxes_up


def _cluster_tier_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd): run as root, e.g. in CI"
    for tool in ("ip", "ssh", "iptables", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}`: apt-get install openssh-client iproute2 iptables"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "needs sshd: apt-get install openssh-server"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` does not work on this machine"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster-bins", action="store_true",
        help="with -n N: each test file whole on the worker tests/cluster_schedule.py gives it "
        "(the files that run DeepSpeed's runner on one worker; the longest first)",
    )  # fmt: skip
    parser.addoption(
        "--record-durations", nargs="?", const=str(cluster_schedule.DURATIONS), default=None,
        metavar="FILE",
        help="at the end, write what each test file that ran whole took (setup, call and "
        "teardown summed) into FILE (default: the table --cluster-bins reads); run the whole "
        "parallel cluster tier with it",
    )  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> object | None:
    if config.getoption("cluster_bins"):
        return cluster_schedule.FileBinScheduling(config, log)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cluster tests skipped where the tier cannot run. A test whose tier mark and directory
    disagree stops the session: each of make's tiers collects only its own directory
    (tests/unit or tests/cluster), so such a test would never run."""
    astray = [
        item.nodeid
        for item in items
        if ("cluster" in item.keywords) != (item.path.parent.name == "cluster")
    ]
    if astray:
        raise pytest.UsageError(
            f"marked for another tier than their directory's: {astray}: cluster tests go in "
            "tests/cluster (pytestmark = pytest.mark.cluster), every other test in tests/unit"
        )
    missing = _cluster_tier_missing()
    for item in items:
        if "cluster" in item.keywords and missing:
            item.add_marker(pytest.mark.skip(reason=f"cluster tier: {missing}"))


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


_SESSIONS_LOCK = "/run/trainfleet-test-sessions.lock"
"""Every process running cluster tests holds this lock shared for its whole session; the one
that gets it exclusively first is alone, and only then may it take down test sandboxes that
are not its own (those a killed session left)."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session with cluster tests takes down first what a killed session left, if no other
    test session (another xdist worker, another checkout's run) is running beside it."""
    if _cluster_tier_missing() or not any("cluster" in i.keywords for i in session.items):
        return
    import fcntl

    from trainfleet import sandbox

    lock = open(_SESSIONS_LOCK, "w")  # held until the process ends
    session.config.stash[_SESSIONS_LOCK_KEY] = lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another session runs beside this one: its sandboxes are no leftovers
    else:
        left = sorted(name for name in sandboxes_up() if TEST_SANDBOX.match(name))
        for name in left:
            sandbox.down(name)
        if left:
            warnings.warn(f"an earlier test session left sandboxes, now down: {left}", stacklevel=1)
    fcntl.flock(lock, fcntl.LOCK_SH)
    signal.signal(signal.SIGTERM, _interrupted)  # so that pytest_sessionfinish runs


_SESSIONS_LOCK_KEY = pytest.StashKey[object]()
"""The lock's open file, held by a session that runs cluster tests (and only such a one)."""
_TOKENS_AT_START = pytest.StashKey[set]()
_DOCTOR_TOKENS = ".trainfleet-doctor-*"


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_TOKENS_AT_START] = set(Path.cwd().glob(_DOCTOR_TOKENS))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """--record-durations: each file's tests' phases summed (the xdist controller sees every
    worker's reports), a file with a skipped test left as it was recorded; nothing written
    where the session was interrupted or collected nothing."""
    if config.getoption("record_durations") is None or _is_xdist_worker(config):
        return
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        terminalreporter.write_line(f"durations not recorded: the session ended {exitstatus!r}")
        return
    reports = [
        r
        for category in terminalreporter.stats.values()
        for r in category
        if isinstance(r, pytest.TestReport)
    ]
    skipped = {cluster_schedule.file_name(r.nodeid) for r in reports if r.skipped}
    measured = cluster_schedule.file_seconds(
        (r.nodeid, r.duration)
        for r in reports
        if cluster_schedule.file_name(r.nodeid) not in skipped
    )
    existing = {p.name for p in (Path(__file__).parent / "cluster").glob("test_*.py")}
    path = Path(config.getoption("record_durations"))
    cluster_schedule.record(measured, existing, path)
    terminalreporter.write_line(
        f"recorded in {path}: {sorted(measured)}; left as they were: {sorted(skipped)} (skipped)"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Down every sandbox of this process left up, failed tests' included. Then, once all
    workers are done: doctor's shared-storage tokens (.trainfleet-doctor-RUN_ID) are removed by
    every run, and a run that left one in the directory the tests run from fails the session."""
    if _SESSIONS_LOCK_KEY in session.config.stash:
        from trainfleet import sandbox

        left = own_sandboxes_up()
        for name in left:
            sandbox.down(name)
        if left:
            print(f"\ntests left sandboxes up; now down: {left}", file=sys.stderr)
    before = session.config.stash.get(_TOKENS_AT_START, None)
    if before is not None:
        left = sorted(str(p) for p in set(Path.cwd().glob(_DOCTOR_TOKENS)) - before)
        if left:
            print(f"\ndoctor runs left their tokens behind: {left}", file=sys.stderr)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


JIT_OPS = {"deepspeed_shm_comm": "ShareMemCommBuilder", "fused_adam": "FusedAdamBuilder"}
"""DeepSpeed's CPU ops that the tests' DeepSpeed jobs JIT-build on first use (op -> builder)."""

_JIT_BUILD = """
import sys
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder(sys.argv[1])
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load()
"""


def _unbuilt_jit_ops() -> list[str]:
    """Those of JIT_OPS with no built library where torch's JIT puts it."""
    import glob
    from pathlib import Path

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    dirs = (
        [root]
        if root
        else glob.glob(f"{cache}/torch_extensions/py{sys.version_info[0]}{sys.version_info[1]}_*")
    )
    return [op for op in JIT_OPS if not any(glob.glob(f"{d}/{op}/{op}*.so") for d in dirs)]


ONE_NINJA = Path(sys.prefix) / "trainfleet-test-ninja"
"""A directory with only this venv's `ninja`, first on every test's PATH (and so on the PATH
of the ranks they launch, which inherit it). torch's JIT build runs the first `ninja` on PATH,
and this venv's (pip's 1.13) and Debian's (1.11) hash the commands in .ninja_log differently:
while the tests that put the venv's bin first on PATH (the migration table's) ran beside the
ones that did not, each side's DeepSpeed jobs found the other's ops out of date and rebuilt
them (deepspeed_shm_comm 25 s, fused_adam 60 s of CPU, each time)."""


def _one_ninja_for_every_jit_build() -> None:
    ninja = Path(sys.executable).parent / "ninja"
    if not ninja.exists():
        return
    ONE_NINJA.mkdir(exist_ok=True)
    try:
        (ONE_NINJA / "ninja").symlink_to(ninja)
    except FileExistsError:
        pass
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != str(ONE_NINJA):
        os.environ["PATH"] = os.pathsep.join([str(ONE_NINJA), path])


SANDBOXES_IN_MEMORY = Path("/dev/shm/trainfleet-test-sandboxes")
"""Where the tests' sandboxes keep their state (nodes' homes and private disks) when this
machine's /dev/shm can hold it: `setup pyenv`'s sandbox test installs the whole training
environment on two nodes' own disks (3.3 GB at the peak of a tier). Alone, that test took 178 s
with them on disk (/run is no tmpfs here; 11 s of it the teardown, 35 s in the loaded cluster
tier), 161 s with them in memory."""
_IN_MEMORY_NEEDS = 8 << 30  # free in /dev/shm, and again in MemAvailable beyond it


def _sandboxes_in_memory() -> None:
    """Points TRAINFLEET_SANDBOX_DIR at SANDBOXES_IN_MEMORY, unless it is set already or the
    memory is not there (a container's 64 MiB /dev/shm, a small machine): then the sandboxes
    stay where they always are."""
    if "TRAINFLEET_SANDBOX_DIR" in os.environ:
        return
    try:
        shm = os.statvfs("/dev/shm")
        with open("/proc/meminfo") as f:
            meminfo = dict(line.split(":", 1) for line in f)
    except OSError:
        return
    available = int(meminfo.get("MemAvailable", "0 kB").split()[0]) << 10
    if shm.f_bavail * shm.f_frsize >= _IN_MEMORY_NEEDS and available >= 2 * _IN_MEMORY_NEEDS:
        os.environ["TRAINFLEET_SANDBOX_DIR"] = str(SANDBOXES_IN_MEMORY)


def pytest_configure(config: pytest.Config) -> None:
    """On a machine where DeepSpeed has not built its CPU ops yet (a fresh clone with an empty
    extensions directory), start building each in the background as the session begins, all at
    once: otherwise the first DeepSpeed job (test_plan_zero's ranks) builds them one after the
    other (about 60 s + 85 s here) while everything else waits on it. The build is DeepSpeed's
    own JIT build, so a job that needs an op meanwhile waits on torch's lock for it, as it
    would for another rank's build; nothing is skipped and every job still loads the ops. Once
    per session (the xdist controller, not each worker); nothing starts where they are built.
    Before that, every process of the session gets ONE_NINJA first on its PATH, and the
    sandboxes' state goes to memory where it fits (SANDBOXES_IN_MEMORY)."""
    import importlib.util

    _one_ninja_for_every_jit_build()
    _sandboxes_in_memory()
    if hasattr(config, "workerinput") or importlib.util.find_spec("deepspeed") is None:
        return
    for op in _unbuilt_jit_ops():
        subprocess.Popen(
            [sys.executable, "-c", _JIT_BUILD, JIT_OPS[op]],
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


_names = itertools.count(1)


@pytest.fixture
def make_sandbox():
    """make_sandbox(nodes=3, faults=[...]) -> Sandbox; all of them are down after the test."""
    from trainfleet import sandbox

    made: list[str] = []

    def _make(**kwargs):
        name = own_sandbox_name("t", f"{next(_names):04d}")
        made.append(name)
        return sandbox.up(name=name, **kwargs)

    yield _make
    for name in made:
        sandbox.down(name)


@pytest.fixture(scope="session", autouse=True)
def no_stale_jit_lock_from_an_earlier_session():
    """A session killed while DeepSpeed built or loaded an op (Ctrl-C, a CI time limit) leaves
    torch's JIT lock in this machine's extensions cache, and every DeepSpeed start of the next
    session would wait for it forever. The session begins by removing such leftovers, by the
    rule `doctor --fix` uses (no process holds or builds under it, older than a minute)."""
    import warnings

    from trainfleet.node import jitlocks

    stale = [lock["path"] for lock in jitlocks.stale_jit_locks()]
    if stale:
        outcome = jitlocks.remove_stale_jit_locks(stale)
        warnings.warn(f"an earlier session left torch JIT locks: {outcome}", stacklevel=1)
    yield
