"""Files trainfleet writes that can hold a secret or a rule (cluster.yaml's env, a run's
environment, the firewall state): created 0600, and an existing file's mode never loosened.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "cluster.yaml")
    >>> write_private(path, "nodes: [a]\\n")
    >>> oct(os.stat(path).st_mode & 0o777)
    '0o600'
"""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: str | Path, text: str, *, exclusive: bool = False) -> None:
    """Write `text` to `path`: a new file is 0600; an existing one keeps its own mode, made no
    wider than it was. `exclusive`: fail (FileExistsError) when the file is there."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
