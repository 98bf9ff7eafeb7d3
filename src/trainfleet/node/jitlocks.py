"""torch's JIT build locks on this node: which there are, which are stale, and their removal
(`doctor --fix`).
"""

import glob
import os
import time
from typing import Dict, List, Optional, TypedDict

from trainfleet.node import answer

JIT_LOCK_STALE_S = 60
"""A JIT build lock this old that no process holds or builds under is a leftover (the margin
covers a holder on another node of a shared file system, which no probe here can see)."""


def _holders(paths):
    """pid -> the reason it may be using a lock of `paths`: it holds the lock open (torch's
    FileBaton keeps the fd it created the lock with until it removes it), or it works in the
    lock's directory (ninja and the compilers of a build). Only processes this user may
    inspect."""
    dirs = set(os.path.dirname(p) for p in paths)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % entry)
            if cwd in dirs:
                found[int(entry)] = cwd
                continue
            for fd in os.listdir("/proc/%s/fd" % entry):
                target = os.readlink("/proc/%s/fd/%s" % (entry, fd))
                if target in paths:
                    found[int(entry)] = target
                    break
        except OSError:
            continue
    return found


def jit_locks(extensions_dir=None):
    """torch's JIT build locks: cpp_extension creates BUILD_DIR/lock before it builds or loads an
    op (DeepSpeed's fused_adam, cpu_adam, shm comm...) and removes it when done; every other
    process that wants the op waits while it exists. A process killed in between leaves it, and
    every later start waits for it forever. Per lock: its age and the pids that hold it or
    work in its directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    roots = [extensions_dir, os.environ.get("TORCH_EXTENSIONS_DIR")]
    roots.append(os.path.join(cache, "torch_extensions"))
    paths = set()
    for root in roots:
        if root:  # TORCH_EXTENSIONS_DIR/OP/lock, or the default root/pyXY_cuZ/OP/lock
            paths.update(glob.glob(os.path.join(root, "*", "lock")))
            paths.update(glob.glob(os.path.join(root, "*", "*", "lock")))
    if not paths:
        return []
    real = dict((path, os.path.realpath(path)) for path in paths)  # as /proc names them
    holders = _holders(set(real.values()))
    now = time.time()
    locks = []
    for path in sorted(paths):
        try:
            age = now - os.stat(path).st_mtime
        except OSError:
            continue  # released while we looked
        here = (real[path], os.path.dirname(real[path]))
        mine = [pid for pid, what in holders.items() if what in here]
        locks.append({"path": path, "age_s": round(age, 1), "busy_pids": sorted(mine)})
    return locks


def stale_jit_locks(extensions_dir=None):
    """The locks no process works under and older than JIT_LOCK_STALE_S."""
    return [
        lock
        for lock in jit_locks(extensions_dir)
        if not lock["busy_pids"] and lock["age_s"] >= JIT_LOCK_STALE_S
    ]


def remove_stale_jit_locks(paths, extensions_dir=None):
    """Removes those of `paths` that are stale now (checked again here, at the last moment):
    never a lock a build holds, never a path that is not one of torch's JIT locks.
    -> {path: what was done}."""
    stale = set(lock["path"] for lock in stale_jit_locks(extensions_dir))
    outcome = {}
    for path in paths:
        if path not in stale:
            outcome[path] = "kept: gone already, or a build is under way there now"
            continue
        try:
            os.remove(path)
            outcome[path] = "removed"
        except OSError as exc:
            outcome[path] = "not removed: %s" % (exc.strerror or exc)
    return outcome


class RemoveJob(TypedDict):
    """`remove_main`'s input (doctor --fix)."""

    paths: List[str]
    """The locks the launch node found stale."""
    extensions_dir: Optional[str]
    """TORCH_EXTENSIONS_DIR as the node's env in the cluster file sets it."""


class RemoveAnswer(TypedDict):
    outcome: Dict[str, str]
    """{path: what was done} (`remove_stale_jit_locks`)."""


def remove_main(job: RemoveJob) -> None:
    """doctor --fix on a node: sends RemoveAnswer."""
    outcome = remove_stale_jit_locks(job["paths"], job["extensions_dir"])
    answer.send(RemoveAnswer(outcome=outcome))
