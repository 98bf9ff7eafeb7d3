"""The sandbox's `cpu-throttle` fault: a node whose processes get a CPU quota (a throttled or
shared server), made with a cgroup, v2 or v1, whichever this machine mounts.

    >>> quota_line(0.75, version=2), quota_line(0.75, version=1)
    ('75000 100000', '75000')

The node's sshd is moved into the group once it runs; every session, launcher and rank it
starts inherits it. `down` removes the group (cgroup_prefix) once the node's processes are
gone.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainfleet.errors import SandboxError

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
THROTTLE_SHARE = 0.75
"""The node's processes together get 75% of one CPU."""


def cgroup_prefix(sandbox_name: str) -> str:
    return f"trainfleet-{sandbox_name}-"


def quota_line(share: float, *, version: int) -> str:
    quota = int(share * PERIOD_US)
    return f"{quota} {PERIOD_US}" if version == 2 else str(quota)


def _group(name: str) -> tuple[Path, int]:
    """The group's directory and the cgroup version that holds it."""
    if (ROOT / "cgroup.controllers").exists():
        return ROOT / name, 2
    return ROOT / "cpu" / name, 1


def throttle(name: str, pids: list[int], share: float = THROTTLE_SHARE) -> Path:
    """Creates cgroup `name` with `share` of one CPU and moves `pids` into it (each process
    with all its threads; the children it starts later follow it). Processes that ended in
    the meantime are skipped."""
    group, version = _group(name)
    try:
        if version == 2:
            controllers = (ROOT / "cgroup.subtree_control").read_text().split()
            if "cpu" not in controllers:
                (ROOT / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir(exist_ok=True)
        if version == 2:
            (group / "cpu.max").write_text(quota_line(share, version=2))
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(quota_line(share, version=1))
    except OSError as exc:
        raise SandboxError(
            f"cannot throttle the node's CPU with a cgroup at {group}: {exc}",
            "the cpu-throttle fault needs root and a writable cgroup cpu controller",
        ) from exc
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it ended
    return group


def remove_all(prefix: str, wait_s: float = 5.0) -> list[str]:
    """Removes every cgroup whose name starts with `prefix` once its processes are gone;
    returns the removed groups' paths."""
    group, _ = _group(prefix)
    removed = []
    for path in sorted(group.parent.glob(f"{prefix}*")):
        deadline = time.monotonic() + wait_s
        while True:
            try:
                path.rmdir()
                removed.append(str(path))
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
    return removed
