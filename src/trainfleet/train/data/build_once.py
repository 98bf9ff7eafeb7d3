"""A directory built once, by whichever process takes its lock, while the others wait; it
appears complete or not at all (built in a temp directory, its files synced, then renamed into
place). `tokenize_to_cache` builds the data cache this way, so that racing callers tokenize once.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from trainfleet.train.data.build_once import _build_once
    >>> with tempfile.TemporaryDirectory() as root:
    ...     built = _build_once(Path(root) / "x", lambda tmp: (tmp / "a").write_text("1"), 5.0)
    ...     print(sorted(path.relative_to(root).as_posix() for path in Path(root).rglob("*")))
    ['x', 'x/a']
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from trainfleet.errors import TrainfleetError
from trainfleet.localprocs import pid_alive


@contextmanager
def _synced(path: Path) -> Iterator[BinaryIO]:
    """A file that is on disk when the block ends: before a rename makes it visible."""
    with path.open("wb") as out:
        yield out
        out.flush()
        os.fsync(out.fileno())


def _build_once(final: Path, build: Callable[[Path], None], timeout_s: float) -> Path:
    """`final`, built by `build(tmp)` by whichever caller takes the lock; the others wait. A
    directory appears complete or not at all (rename); a lock left by a dead process on this
    host is taken over. At worst two builders race (a stale lock taken twice): the first
    rename wins and the other's identical copy is discarded."""
    lock = final.with_name(final.name + ".lock")
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not final.is_dir():
        if _take_lock(lock):
            try:
                if not final.is_dir():
                    _build_atomically(final, build)
            finally:
                lock.unlink(missing_ok=True)
            break
        if time.monotonic() > deadline:
            raise TrainfleetError(
                f"{final}: still being written by {_lock_holder(lock)} after {timeout_s:.0f}s",
                f"if that process is gone, delete {lock} and run again; a large dataset may "
                "need a longer wait",
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    return final


def _build_atomically(final: Path, build: Callable[[Path], None]) -> None:
    tmp = final.with_name(f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():  # else another builder renamed its identical copy first
            raise


def _take_lock(lock: Path) -> bool:
    try:
        handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        host, _, pid = _lock_holder(lock).partition(" pid ")
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            lock.unlink(missing_ok=True)
        return False
    with os.fdopen(handle, "w") as out:
        out.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    return True


def _lock_holder(lock: Path) -> str:
    try:
        return lock.read_text().strip() or "another process"
    except OSError:
        return "another process"
