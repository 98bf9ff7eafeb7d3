"""How `sync` copies a directory to a node: rsync over ssh, or tar over ssh plus a prune, both
leaving exactly this machine's files (but the excluded ones, never touched) at the same path.

    >>> is_excluded("pkg/__pycache__/m.pyc", ["__pycache__"]), is_excluded("pkg/m.py", ["*.pyc"])
    (True, False)

rsync does it with --delete. tar cannot delete, so after the archive is unpacked a small
stdlib job removes what this machine does not have (the file list travels with it); without
that, a file deleted here would stay on the node, and doctor would still see the code differ.

`stream_tar` (setup pyenv's wheels, DeepSpeed's ops from another node) unpacks as the ssh user
with its umask: no owner from the archive, no setuid, setgid or sticky bit, also as root (GNU
tar's --no-same-owner --no-same-permissions; sync keeps both, as rsync -a does). With `staged`
it unpacks into a new private directory that a node program checks and moves into place.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from trainfleet import node as node_programs
from trainfleet.cluster import Node
from trainfleet.node import files as node_files
from trainfleet.node.files import STAGE_PREFIX, is_excluded
from trainfleet.remote import node_argv, run_on_nodes, ssh_options

COPY_TIMEOUT_S = 3600


def members(directory: str, excludes: Sequence[str]) -> list[str]:
    """Relative paths under `directory` that are copied (directories included), sorted."""
    found = []
    for base, dirs, files in os.walk(directory):
        rel_base = os.path.relpath(base, directory)
        dirs[:] = sorted(d for d in dirs if not is_excluded(_join(rel_base, d), excludes))
        found += [_join(rel_base, d) for d in dirs]
        found += [
            _join(rel_base, f)
            for f in sorted(files)
            if not is_excluded(_join(rel_base, f), excludes)
        ]
    return sorted(found)


def _join(base: str, name: str) -> str:
    return name if base == "." else f"{base}/{name}"


def rsync_argv(node: Node, directory: str, excludes: Sequence[str]) -> list[str]:
    ssh = shlex.join(["ssh", *ssh_options(node.ssh)])  # rsync splits -e like a shell would
    remote = f"[{node.host}]" if ":" in node.host else node.host
    return [
        "rsync",
        "-a",
        # Files only on the node go, but excluded ones (outputs, envs) are never touched.
        "--delete",
        # DIR reaches the remote rsync as one word, whatever characters it holds.
        "--protect-args",
        *[f"--exclude={pattern}" for pattern in excludes],
        "-e",
        ssh,
        f"{directory.rstrip('/')}/",
        f"{remote}:{directory.rstrip('/')}/",
    ]


def tar_create_argv(directory: str) -> list[str]:
    # The exact member list comes on stdin (NUL-separated): what is copied is what `members`
    # says, and the prune on the node keeps exactly that.
    return ["tar", "-C", directory, "--null", "--no-recursion", "-T", "-", "-cf", "-"]


def tar_extract_argv(node: Node, directory: str) -> list[str]:
    """sync's unpacking: the files as they are here, owners (as root) and modes kept."""
    script = 'mkdir -p -- "$1" && exec tar -C "$1" -xf -'
    return node_argv(node, ["sh", "-c", script, "sh", directory])


FOREIGN = ("--no-same-owner", "--no-same-permissions")
"""GNU tar's options for an archive that is not the user's own files: owned by whoever unpacks
it, modes through the umask and without setuid, setgid or sticky bits (root included)."""
_STAGE = f'd=$(mktemp -d "$1/{STAGE_PREFIX}XXXXXXXX") && echo "$d" || exit'


def foreign_extract_argv(node: Node, directory: str, *, staged: bool = False) -> list[str]:
    """`stream_tar`'s unpacking (FOREIGN) into `directory`, or with `staged` into a new
    directory in it that only this user can enter (`mktemp -d`, mode 0700), whose path it
    prints first and removes again when tar fails."""
    tar = f'tar {" ".join(FOREIGN)} -C "${"d" if staged else "1"}" -xf -'
    if staged:
        script = f'mkdir -p -- "$1" && {_STAGE}; {tar} || {{ s=$?; rm -rf -- "$d"; exit $s; }}'
    else:
        script = f'mkdir -p -- "$1" && exec {tar}'
    return node_argv(node, ["sh", "-c", script, "sh", directory])


@dataclass(frozen=True, slots=True)
class TarStream:
    """How both ends of `stream_tar` ended (exit code, stderr; the unpacking's stdout)."""

    created: int
    created_err: str
    extracted: int
    extracted_err: str
    extracted_out: str = ""
    """With `staged`: the directory it unpacked into."""


def stream_tar(
    create: Sequence[str], node: Node, directory: str, *, staged: bool = False
) -> TarStream:
    """`create`, a tar writing its archive to stdout (here, or on another node through ssh),
    piped into a tar that unpacks it in `directory` on `node` (`foreign_extract_argv`)."""
    with subprocess.Popen(create, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tar:
        # Popen types the pipes Optional; both were asked for (PIPE) just above.
        assert tar.stdout is not None and tar.stderr is not None
        extract = subprocess.run(
            foreign_extract_argv(node, directory, staged=staged),
            stdin=tar.stdout,
            capture_output=True,
            timeout=COPY_TIMEOUT_S,
            check=False,
        )
        tar.stdout.close()
        created_err = tar.stderr.read().decode(errors="replace")
    return TarStream(created=tar.returncode, created_err=created_err.strip(),
                     extracted=extract.returncode,
                     extracted_err=extract.stderr.decode(errors="replace").strip(),
                     extracted_out=extract.stdout.decode(errors="replace").strip())  # fmt: skip


def _tar_copy(node: Node, directory: str, excludes: Sequence[str]) -> str:
    keep = members(directory, excludes)
    create = subprocess.Popen(
        tar_create_argv(directory),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    extract = subprocess.Popen(
        tar_extract_argv(node, directory),
        stdin=create.stdout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # Popen types the pipes Optional; all three were asked for (PIPE) just above.
    assert create.stdin is not None and create.stdout is not None and create.stderr is not None
    create.stdout.close()  # the extracting ssh holds the pipe now
    create.stdin.write(b"".join(m.encode() + b"\0" for m in keep))
    create.stdin.close()
    _, extract_err = extract.communicate(timeout=COPY_TIMEOUT_S)
    create_err = create.stderr.read().decode(errors="replace")
    create.wait()
    if create.returncode != 0:
        return f"tar here: {create_err.strip()}"
    if extract.returncode != 0:
        return extract_err.decode(errors="replace").strip() or f"exit {extract.returncode}"
    job = node_files.PruneJob(root=directory, keep=keep, excludes=list(excludes))
    prune = node_programs.line(node_files.prune, job)
    argv = node_programs.argv("python3", node_files.prune)
    [pruned] = run_on_nodes([node], argv, stdin=prune, timeout=120)
    return "" if pruned.ok else f"removing files only on the node: {pruned.reason()}"


def copy_to(node: Node, directory: str, method: str, excludes: Sequence[str]) -> str:
    """Copy `directory` to the same path on the node; '' when done, else the error text."""
    if method == "tar":
        return _tar_copy(node, directory, excludes)
    done = subprocess.run(
        rsync_argv(node, directory, excludes),
        capture_output=True,
        text=True,
        timeout=COPY_TIMEOUT_S,
        check=False,
    )
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def choose_method(requested: str, remote_has_rsync: dict[str, bool]) -> dict[str, str]:
    """Per node: rsync where it and this machine have it (auto), else tar."""
    here = shutil.which("rsync") is not None
    if requested == "tar":
        return {host: "tar" for host in remote_has_rsync}
    return {
        host: "rsync" if requested == "rsync" or (here and has) else "tar"
        for host, has in remote_has_rsync.items()
    }
