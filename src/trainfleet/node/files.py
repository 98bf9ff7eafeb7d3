"""Files a launch or a fix puts on a node: the deepspeed backend's private directory, lines
appended to known_hosts, sync's removal of what the launch node no longer has, directories
unpacked from another node's archive (`take_staged`: DeepSpeed's ops), and /etc/hosts lines
(`edit_hosts`: `setup hosts`).

    >>> import tempfile; home = tempfile.mkdtemp()
    >>> append_lines(AppendJob(file=home + "/kh", lines=["a ssh-ed25519 K", "a ssh-ed25519 K"]))
    @@trainfleet-answer {"added": 1}
    >>> append_lines(AppendJob(file=home + "/kh", lines=["a ssh-ed25519 K"]))
    @@trainfleet-answer {"added": 0}

Each job's input is a TypedDict here; those that answer send one (`answer.send`); put_private
answers with its exit code only.
"""

import fnmatch
import os
import shutil
import stat
import sys
from typing import Dict, List, TypedDict

from trainfleet.node import answer


class PrivateJob(TypedDict):
    dir: str
    files: Dict[str, str]
    """{name: text}"""
    remove: bool
    """Remove the directory instead (`files` is then empty)."""


class AppendJob(TypedDict):
    file: str
    lines: List[str]


class AppendAnswer(TypedDict):
    added: int


class HostsJob(TypedDict):
    file: str
    add: List[str]
    remove: List[str]


class HostsAnswer(TypedDict):
    added: List[str]
    removed: List[str]


class PruneJob(TypedDict):
    root: str
    keep: List[str]
    excludes: List[str]


class PruneAnswer(TypedDict):
    removed: int


class StagedJob(TypedDict):
    root: str
    stage: str
    names: List[str]


class StagedAnswer(TypedDict):
    taken: List[str]


def put_private(job: PrivateJob) -> int:
    """Writes job["files"] into job["dir"], a directory only this user can use;
    with job["remove"], removes it. The name is predictable (/tmp/trainfleet-RUN_ID, the same
    for every node and restart): one that is already there is used only when it is this user's
    and no one else can write it, else another user of the node could have put a shim of their
    own there, run as the launching user. -> exit code (3: refused)."""
    if job["remove"]:
        shutil.rmtree(job["dir"], ignore_errors=True)
        return 0
    try:
        os.mkdir(job["dir"], 0o700)
    except FileExistsError:
        st = os.lstat(job["dir"])
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            sys.stderr.write(
                "%s was already there and is not this user's private directory (uid %d, mode %o):"
                " another user may have made it to run their code as you; remove it\n"
                % (job["dir"], st.st_uid, stat.S_IMODE(st.st_mode))
            )
            return 3
    for name, text in job["files"].items():
        fd = os.open(os.path.join(job["dir"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return 0


def append_lines(job: AppendJob) -> None:
    """Appends job["lines"] to job["file"] (`~` expanded; created 0600 in a 0700 directory)
    unless already there; sends AppendAnswer."""
    path = os.path.expanduser(job["file"])
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    present = set(old.splitlines())
    new = []
    for line in job["lines"]:
        if line not in present:
            present.add(line)
            new.append(line)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    gap = "\n" if old and not old.endswith("\n") and new else ""
    with os.fdopen(fd, "a") as f:
        f.write(gap + "".join(line + "\n" for line in new))
    answer.send(AppendAnswer(added=len(new)))


def edit_hosts(job: HostsJob) -> int:
    """Adds job["add"] to job["file"] (/etc/hosts) where not there yet, and removes every line
    that is exactly one of job["remove"]; every other byte stays. The file is rewritten in
    place, never replaced: /etc/hosts is often a bind mount (containers, `ip netns`), which a
    rename cannot replace. Sends HostsAnswer."""
    with open(job["file"]) as f:
        old = f.read()
    lines = old.splitlines(True)
    remove = set(job["remove"])
    kept = [line for line in lines if line.rstrip("\n") not in remove]
    removed = [line.rstrip("\n") for line in lines if line.rstrip("\n") in remove]
    present = set(line.rstrip("\n") for line in kept)
    added = []
    for line in job["add"]:
        if line not in present:
            present.add(line)
            added.append(line)
    text = "".join(kept)
    if added and text and not text.endswith("\n"):
        text += "\n"
    text += "".join(line + "\n" for line in added)
    if text != old:
        with open(job["file"], "r+") as f:
            f.write(text)
            f.truncate()
    answer.send(HostsAnswer(added=added, removed=removed))
    return 0


def is_excluded(rel, patterns):
    """A path is left out when any of its components matches a pattern (as rsync and tar do
    for patterns without '/')."""
    return any(fnmatch.fnmatch(part, p) for part in rel.split("/") for p in patterns)


def prune(job: PruneJob) -> int:
    """Removes files, then empty directories, under job["root"] that are neither in job["keep"]
    nor excluded (`is_excluded` by job["excludes"]); symlinks are removed, never followed.
    Sends PruneAnswer."""
    root, keep, patterns = job["root"], set(job["keep"]), job["excludes"]
    removed = 0
    for base, dirs, files in os.walk(root, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            rel = os.path.relpath(os.path.join(base, name), root)
            if rel not in keep and not is_excluded(rel, patterns):
                os.unlink(os.path.join(base, name))
                removed += 1
        for name in dirs:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            if rel not in keep and not is_excluded(rel, patterns) and not os.path.islink(path):
                if not os.listdir(path):
                    os.rmdir(path)
                    removed += 1
    answer.send(PruneAnswer(removed=removed))
    return 0


STAGE_PREFIX = ".trainfleet-stage-"
"""How the private directories an archive is unpacked into are named (setup/sync/transfer.py)."""


def _kind(mode):
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a fifo"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a file or directory"


def _checked_stage(root, stage):
    """`stage` if it is a private directory of this user's directly in `root` named as
    `STAGE_PREFIX` says (what `mktemp -d` made for this copy), else None."""
    if os.path.dirname(stage) != root.rstrip("/") or not os.path.basename(stage).startswith(
        STAGE_PREFIX
    ):
        return None
    try:
        st = os.lstat(stage)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return stage


def take_staged(job: StagedJob) -> int:
    """Moves the directories job["names"] from job["stage"], where another node's archive was
    unpacked, to job["root"] (each replacing what was there), then removes the stage. Only
    directories and regular files are taken, each without setuid, setgid or sticky bits: a
    symlink (which could point anywhere), a device, a fifo or a socket is never part of a build
    directory, so one anywhere makes it take nothing (exit 3, with what and where on stderr).
    Sends StagedAnswer."""
    root = job["root"]
    stage = _checked_stage(root, job["stage"])
    if stage is None:
        sys.stderr.write("%s is not a directory this copy unpacked into\n" % job["stage"])
        return 3
    refused = []
    for base, dirs, files in os.walk(stage):
        for name in dirs + files:
            path = os.path.join(base, name)
            st = os.lstat(path)
            mode, where = st.st_mode, os.path.relpath(path, stage)
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                refused.append("%s (%s)" % (where, _kind(mode)))
            elif mode & 0o7000 and stat.S_ISREG(mode) and st.st_nlink > 1:
                refused.append("%s (a hard link with mode %o)" % (where, stat.S_IMODE(mode)))
            elif mode & 0o7000:  # GNU tar clears them already (--no-same-permissions)
                os.chmod(path, stat.S_IMODE(mode) & 0o777)
    if refused:
        shutil.rmtree(stage)
        sys.stderr.write(
            "the archive holds %s, which a build directory never does: nothing of it was taken\n"
            % ", ".join(refused[:5])
        )
        return 3
    taken = []
    for name in job["names"]:
        source, target = os.path.join(stage, name), os.path.join(root, name)
        if "/" in name or name in ("", ".", "..") or not os.path.isdir(source):
            continue  # not a plain name, or not in the archive
        if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        os.rename(source, target)
        taken.append(name)
    shutil.rmtree(stage)
    answer.send(StagedAnswer(taken=taken))
    return 0
