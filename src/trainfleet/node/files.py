"""Files a launch or a fix puts on a node: the deepspeed backend's private directory, lines
appended to known_hosts, and sync's removal of what the launch node no longer has.

    >>> import tempfile; home = tempfile.mkdtemp()
    >>> append_lines({"file": home + "/kh", "lines": ["a ssh-ed25519 K", "a ssh-ed25519 K"]})
    1
    >>> append_lines({"file": home + "/kh", "lines": ["a ssh-ed25519 K"]})
    0
"""

import fnmatch
import os
import shutil
import stat
import sys


def put_private(job):
    """Writes job["files"] ({name: text}) into job["dir"], a directory only this user can use;
    with job["remove"], removes it. The name is predictable (/tmp/trainfleet-RUN_ID, the same
    for every node and restart): one that is already there is used only when it is this user's
    and no one else can write it, else another user of the node could have put a shim of their
    own there, run as the launching user. -> exit code (3: refused)."""
    if job.get("remove"):
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


def append_lines(job):
    """Appends job["lines"] to job["file"] (`~` expanded; created 0600 in a 0700 directory)
    unless already there; prints how many were added."""
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
    print(len(new))


def is_excluded(rel, patterns):
    """A path is left out when any of its components matches a pattern (as rsync and tar do
    for patterns without '/')."""
    return any(fnmatch.fnmatch(part, p) for part in rel.split("/") for p in patterns)


def prune(job):
    """Removes files, then empty directories, under job["root"] that are neither in job["keep"]
    nor excluded (`is_excluded` by job["excludes"]); symlinks are removed, never followed.
    Prints how many."""
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
    print(removed)
    return 0
