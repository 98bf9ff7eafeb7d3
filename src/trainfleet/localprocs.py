"""Facts about local processes, for whoever on this machine needs them (the sandbox's sshds,
the data cache's lock holders, status's launcher, the tests' leftover-process checks).

    >>> import os
    >>> pid_alive(os.getpid()), pid_alive(None)
    (True, False)
    >>> pid_start(os.getpid()) == pid_start(os.getpid()) is not None
    True
"""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not serving anything.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pid_start(pid: int) -> int | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22): with its pid,
    it names one process, even after the pid is reused. None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def cmdline(pid: int) -> str:
    """A process's command line, its words joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cmdlines() -> dict[int, str]:
    """Every process on this machine: pid -> command line (kernel threads have none)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (words := cmdline(int(entry))):
            found[int(entry)] = words
    return found
