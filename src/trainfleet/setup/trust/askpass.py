"""Log in once with a password to install a key, without sshpass and without storing it.

    >>> argv = password_ssh_argv(Node(host="gpu-node-2", slots=1, gpu_ids=(0,), python="python3"),
    ...                          ["python3", "-"])
    >>> argv[:3], argv[-3:]
    (['ssh', '-oBatchMode=no', '-oStrictHostKeyChecking=yes'], ['--', 'gpu-node-2', 'python3 -'])

OpenSSH asks the program named by SSH_ASKPASS for the password when SSH_ASKPASS_REQUIRE=force
(OpenSSH 8.4+). That program is a two-line shell script in a private temporary directory that
prints one environment variable; the password lives only in the environment of that one ssh
process and its askpass child, for the one copy. It is never written to a file, never put on
a command line (where `ps` would show it), never logged, and forgotten when setup ends. No
ssh master keeps it (ControlMaster=no). A node behind a ProxyJump/ProxyCommand is refused before
the password is asked (setup/trust/step.py): the jump's own ssh would inherit that environment and
answer the jump host's password question with it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainfleet.cluster import DEFAULT_CONNECT_TIMEOUT, Node
from trainfleet.remote import NodeResult, classify, ssh_options

_SECRET_VAR = "TRAINFLEET_ASKPASS_SECRET"
_HELPER = f'#!/bin/sh\nprintf "%s\\n" "${_SECRET_VAR}"\n'
COPY_TIMEOUT_S = 60
PARALLEL = 16


def password_ssh_argv(node: Node, remote_argv: Sequence[str]) -> list[str]:
    """ssh that may ask for a password, for this one command. These options come before the
    user's: for this command only, a password prompt is the point."""
    return [
        "ssh",
        # Allow the password question that every other trainfleet ssh forbids.
        "-oBatchMode=no",
        # Never ask the askpass helper to accept an unknown host key: it would answer with the
        # password. The key was confirmed and written before this runs.
        "-oStrictHostKeyChecking=yes",
        # One try: a wrong password fails fast instead of being sent again and again.
        "-oNumberOfPasswordPrompts=1",
        "-oPreferredAuthentications=keyboard-interactive,password",
        # No shared connection: a user's `ControlMaster auto` + `ControlPersist` in
        # ~/.ssh/config would keep a master, with the password in its environment, for minutes.
        "-oControlMaster=no",
        "-oControlPath=none",
        *ssh_options(node.ssh, multiplex=False),
        "--",
        node.host,
        shlex.join(remote_argv),
    ]


def _run_one(node: Node, argv: list[str], stdin: bytes, env: dict[str, str]) -> NodeResult:
    try:
        proc = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            env=env,
            timeout=COPY_TIMEOUT_S + (node.ssh.connect_timeout or DEFAULT_CONNECT_TIMEOUT),
            start_new_session=True,  # no controlling terminal: ssh must use the helper
            check=False,
        )
        code, out, err, timed_out = proc.returncode, proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as exc:
        code, out, err, timed_out = None, exc.stdout or b"", exc.stderr or b"", True
    stderr = err.decode(errors="replace")
    return NodeResult(
        node=node.host,
        returncode=code,
        stdout=out.decode(errors="replace"),
        stderr=stderr,
        duration_s=0.0,
        failure=classify(code, stderr, timed_out, via_ssh=True),
    )


def run_with_password(
    nodes: Sequence[Node],
    remote_argv: Sequence[str],
    stdin: Mapping[str, bytes],
    password: str,
) -> list[NodeResult]:
    """Run `remote_argv` on each node (`stdin[host]` on its stdin), logging in with
    `password`; results in node order."""
    with tempfile.TemporaryDirectory(prefix="trainfleet-askpass-") as private:
        helper = Path(private) / "askpass"
        helper.write_text(_HELPER)
        helper.chmod(0o700)
        env = {
            **os.environ,
            "SSH_ASKPASS": str(helper),
            "SSH_ASKPASS_REQUIRE": "force",
            "DISPLAY": os.environ.get("DISPLAY", ":0"),  # OpenSSH before 8.4 wants one
            _SECRET_VAR: password,
        }
        argvs = [password_ssh_argv(node, remote_argv) for node in nodes]
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            inputs = [stdin[node.host] for node in nodes]
            results = list(pool.map(_run_one, nodes, argvs, inputs, [env] * len(nodes)))
        env.clear()
    return results
