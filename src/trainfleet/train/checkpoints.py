"""Checkpoints that a crash cannot spoil: HF Trainer writes `checkpoint-N/` in place; only after
every rank has finished it does rank 0 mark it complete and switch the `latest` pointer (a file
replaced atomically), then delete all but the last K complete checkpoints. A restart resumes
from the newest complete checkpoint and removes any half-written checkpoint of its own; a stop
between the mark and the pointer's switch (Ctrl-C, a kill) leaves `latest` one behind, which the
restart's rank 0 sets right (`repoint_latest`).

Its own: every rank marks a checkpoint directory (TRAINFLEET_SAVING) before it writes there, so
a `checkpoint-N` without a mark (a plain Hugging Face run's, in the same output directory) is
never removed or rotated; `foreign_checkpoints` lets train refuse such a directory up front.
Complete means durable: the files, the mark, the directories and the pointer are fsynced in
that order, so after a power loss `latest` never names a torn checkpoint.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> begin_save(out, "checkpoint-10"); mark_complete(out, "checkpoint-10", keep=2)
    >>> latest_checkpoint(out).name
    'checkpoint-10'
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from trainfleet.errors import TrainfleetError

LATEST = "latest"
COMPLETE = "TRAINFLEET_COMPLETE"
SAVING = "TRAINFLEET_SAVING"
_STEP = re.compile(r"^checkpoint-(\d+)$")


def step_of(path: Path) -> int:
    match = _STEP.match(path.name)
    return int(match.group(1)) if match else -1


def _checkpoints(output: Path) -> list[Path]:
    return sorted((p for p in output.glob("checkpoint-*") if step_of(p) >= 0), key=step_of)


def _complete(output: Path) -> list[Path]:
    return [p for p in _checkpoints(output) if (p / COMPLETE).exists()]


def latest_checkpoint(output: Path) -> Path | None:
    """The newest complete checkpoint: the one `latest` names, or a newer one whose mark was
    written (after everything in it reached the disk) but whose pointer switch was cut short."""
    complete = _complete(output)
    return complete[-1] if complete else None


def _point_latest(output: Path, name: str) -> None:
    pointer = output / f".{LATEST}.tmp"
    pointer.write_text(name + "\n")
    _fsync(pointer)
    os.replace(pointer, output / LATEST)
    _fsync(output)


def repoint_latest(output: Path) -> str | None:
    """Rank 0, before a resume: `latest` names the newest complete checkpoint again if a stop
    between mark_complete's mark and its pointer switch left it behind. Returns the name it
    now points at when it had to change it."""
    newest = latest_checkpoint(output)
    if newest is None:
        return None
    try:
        named = (output / LATEST).read_text().strip()
    except FileNotFoundError:
        named = None
    if named == newest.name:
        return None
    _point_latest(output, newest.name)
    return newest.name


def begin_save(output: Path, name: str) -> None:
    """Every rank, before it writes any part of checkpoint `name`: marks it as trainfleet's."""
    path = output / name
    path.mkdir(parents=True, exist_ok=True)
    (path / SAVING).touch()


def _ours(path: Path) -> bool:
    return (path / SAVING).exists() or (path / COMPLETE).exists()


def _empty(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def foreign_checkpoints(output: Path) -> list[Path]:
    """`checkpoint-N` directories trainfleet did not write (no mark of its own; an empty one is
    what a kill between begin_save's mkdir and its mark leaves, and holds nothing)."""
    if not output.is_dir():
        return []
    return [p for p in _checkpoints(output) if not _ours(p) and not _empty(p)]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Every file, then every directory, under `root` (bottom up), then `root` itself."""
    for parent, dirs, files in os.walk(root, topdown=False):
        for name in files:
            _fsync(Path(parent) / name)
        for name in dirs:
            _fsync(Path(parent) / name)
    _fsync(root)


def mark_complete(output: Path, name: str, *, keep: int) -> None:
    """Rank 0, after every rank's part of `name` is written (a barrier before this)."""
    _fsync_tree(output / name)
    (output / name / COMPLETE).write_text("")
    _fsync(output / name / COMPLETE)
    _fsync(output / name)
    _point_latest(output, name)
    for old in _complete(output)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def remove_partial(output: Path) -> list[Path]:
    """trainfleet's checkpoints never marked complete (a crash during their save): removed
    before a resume, so that nothing can pick them up. Returns what was removed."""
    removed = [
        p
        for p in _checkpoints(output)
        if ((p / SAVING).exists() and not (p / COMPLETE).exists()) or _empty(p)
    ]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def tree_bytes(path: Path) -> int:
    """The bytes of every file under `path` (0 while it does not exist): a checkpoint's size,
    and a save's progress while it is written."""
    path = Path(path)
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def checkpoint_bytes(output: Path) -> int:
    """Size of the newest complete checkpoint (0 if none): the next one will be about as big."""
    latest = latest_checkpoint(output)
    return 0 if latest is None else tree_bytes(latest)


def check_free_space(output: Path, needed: int) -> None:
    free = shutil.disk_usage(output).free
    if needed > free:
        raise TrainfleetError(
            f"{output}: {free / 2**30:.2f} GiB free, the next checkpoint needs about"
            f" {needed / 2**30:.2f} GiB; not saving a checkpoint that would be cut short",
            "free space there (or lower keep_checkpoints), then run the same command again:"
            " it resumes from the latest complete checkpoint",
        )
