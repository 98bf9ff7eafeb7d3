"""Facts about local processes, for whoever on this machine needs them (the sandbox's sshds,
the data cache's lock holders).

    >>> import os
    >>> pid_alive(os.getpid()), pid_alive(None)
    (True, False)
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
