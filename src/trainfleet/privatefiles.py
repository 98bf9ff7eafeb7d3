"""Files trainfleet writes that can hold a secret or a rule (cluster.yaml's env, a run's
environment, the firewall state): created 0600, and an existing file's mode never loosened.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "cluster.yaml")
    >>> write_private(path, "nodes: [a]\\n")
    >>> oct(os.stat(path).st_mode & 0o777)
    '0o600'
    >>> keep_copy(path, path + ".old"); replace_atomically(path, "nodes: [b]\\n")
    >>> open(path + ".old").read(), oct(os.stat(path).st_mode & 0o777)
    ('nodes: [a]\\n', '0o600')
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def write_private(path: str | Path, text: str, *, exclusive: bool = False) -> None:
    """Write `text` to `path`: a new file is 0600; an existing one keeps its own mode, made no
    wider than it was. `exclusive`: fail (FileExistsError) when the file is there."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def replace_atomically(path: str | Path, text: str, *, exclusive: bool = False) -> None:
    """Put `text` at `path` in one step: a reader, or a crash halfway, sees the old file or the
    new one, never half of one. It keeps the old file's mode (a new file: 0600); a symlink
    stays and its target is replaced. `exclusive`: fail (FileExistsError) when a file is
    there, even one that appeared a moment ago."""
    target = Path(os.path.realpath(path))
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o600
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:  # mkstemp made it 0600
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if exclusive:
            os.link(tmp, target)  # unlike rename, never replaces what is there
        else:
            os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def keep_copy(path: str | Path, backup: str | Path) -> None:
    """Copy `path` to a new file `backup` (never overwriting one) with the original's mode and
    times; it is 0600 until the mode is copied, so never readable wider than the original."""
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(path, "rb") as source, os.fdopen(fd, "wb") as copy:
        shutil.copyfileobj(source, copy)
    shutil.copystat(path, backup)
