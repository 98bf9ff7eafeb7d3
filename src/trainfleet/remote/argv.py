"""The ssh argv, built in one place: the user's options first (OpenSSH keeps the first value
it sees), then trainfleet's, each with the reason; shared connections; what ssh resolves a
node to.

    >>> from trainfleet.cluster import SshOptions
    >>> ssh_options(SshOptions(port=2222), multiplex=False)[:3]
    ['-p', '2222', '-oBatchMode=yes']
"""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

from trainfleet.cluster import DEFAULT_CONNECT_TIMEOUT, Node, SshOptions
from trainfleet.cluster.model import SlurmStep
from trainfleet.errors import RemoteError

CONTROL_PERSIST_S = 60
"""How long an idle shared connection stays open for the next command."""


def control_dir() -> Path:
    """Where shared-connection sockets live; short (sun_path is ~108 bytes) and private."""
    path = Path(os.environ.get("TRAINFLEET_CONTROL_DIR", f"/tmp/trainfleet-{os.getuid()}-ssh"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The name is predictable: one another user made first (or a link) would put this user's
    # ssh connections into their hands. OpenSSH refuses such a directory too, less clearly.
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RemoteError(
            f"{path} (ssh's shared connections) is not this user's private directory"
            f" (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})",
            "remove it (another user may have made it), or set TRAINFLEET_CONTROL_DIR to a"
            " directory only you can write",
        )
    return path


def ssh_options(ssh: SshOptions, *, multiplex: bool = True) -> list[str]:
    """The options of every ssh trainfleet runs (no `ssh`, no host). User options first:
    OpenSSH keeps the first value it sees for an option, so the user's settings win over
    trainfleet's defaults."""
    argv = []
    if ssh.config_file:
        argv += ["-F", ssh.config_file]
    argv += list(ssh.options)
    if ssh.identity_file:
        argv += ["-i", ssh.identity_file]
    if ssh.known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    if ssh.user is not None:
        argv += ["-l", ssh.user]
    argv += [
        # Never prompt: a password or host-key question would hang a parallel run silently.
        "-oBatchMode=yes",
        # A dead or firewalled node is reported in seconds, not after the kernel's 2 minutes.
        f"-oConnectTimeout={ssh.connect_timeout or DEFAULT_CONNECT_TIMEOUT}",
        # A node that dies mid-command is noticed within 15 s.
        "-oServerAliveInterval=5",
        "-oServerAliveCountMax=3",
        # No terminal: output stays byte-exact and the remote side gets no job-control signals.
        "-T",
    ]
    if multiplex:
        argv += [
            # Reuse one connection per node: the handshake is paid once, not per command.
            "-oControlMaster=auto",
            f"-oControlPath={control_dir()}/%C",
            f"-oControlPersist={CONTROL_PERSIST_S}",
        ]
    return argv


def ssh_base_argv(host: str, ssh: SshOptions, *, multiplex: bool = True) -> list[str]:
    """`ssh ... host` without the remote command."""
    return ["ssh", *ssh_options(ssh, multiplex=multiplex), "--", host]


def node_argv(node: Node, argv: Sequence[str], *, multiplex: bool = True) -> list[str]:
    """The local argv that runs `argv` on `node`: argv itself for this machine, a step of the
    node's Slurm job for a node of an allocation (`srun_argv`), ssh otherwise.

    ssh hands the remote shell one string, so each word is quoted: the remote side runs exactly
    `argv`, whatever characters it holds.
    """
    if not argv:
        raise RemoteError("empty command", "give the command to run after `--`")
    if node.is_local:
        return list(argv)
    if node.slurm is not None:
        return srun_argv(node.slurm, node.host, argv)
    return [*ssh_base_argv(node.host, node.ssh, multiplex=multiplex), shlex.join(argv)]


def srun_argv(step: SlurmStep, host: str, argv: Sequence[str]) -> list[str]:
    """`argv` as one task on `host`, a step of the Slurm job beside the steps running there
    (`--overlap`: it takes no CPUs from them), with the job's CPUs on that node, stdin
    forwarded to it. `--kill-on-bad-exit` and `--quiet`: the step ends with the task, and
    srun's own progress lines stay out of the task's output. `--export=ALL`: the task has the
    job's environment even where the job was submitted with --export=NONE (SLURM_EXPORT_ENV).
    srun runs argv itself: no shell, no quoting."""
    return srun_step_argv(step, [host], argv)


def srun_step_argv(
    step: SlurmStep, hosts: Sequence[str], argv: Sequence[str], *, label: bool = False
) -> list[str]:
    """`argv` as one task on each of `hosts`, all one step of the job, with `srun_argv`'s
    options; every task reads the same stdin. `label`: each line the tasks print comes with
    its task number (`1: text`), which Slurm gives in the job's node order, whatever order
    `hosts` is in."""
    cpus = [f"--cpus-per-task={step.cpus}"] if step.cpus else []
    labelled = ["--label"] if label else []
    return [
        "srun", f"--jobid={step.job}", "--overlap", f"--nodes={len(hosts)}",
        f"--ntasks={len(hosts)}", "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}",
        *cpus, "--export=ALL", "--kill-on-bad-exit=1", "--quiet", *labelled, "--input=all",
        "--", *argv,
    ]  # fmt: skip


async def _ssh_hostname(node: Node) -> str:
    if not node.via_ssh:
        return "127.0.0.1" if node.host == "localhost" else node.host
    proc = await asyncio.create_subprocess_exec(
        "ssh",
        *ssh_options(node.ssh, multiplex=False),
        "-G",
        "--",
        node.host,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    for line in out.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value.strip()
    return node.host


def ssh_hostnames(nodes: Sequence[Node]) -> dict[str, str]:
    """The name or address ssh really connects to for each node (`ssh -G`: HostName from the
    ssh config applied); no connection is made."""

    async def _all() -> list[str]:
        return list(await asyncio.gather(*(_ssh_hostname(n) for n in nodes)))

    return dict(zip((n.host for n in nodes), asyncio.run(_all()), strict=True))


def close_connections(nodes: Sequence[Node]) -> None:
    """Ask the shared ssh connections to these nodes to exit (`ssh -O exit`), all at once."""
    procs = [
        subprocess.Popen(
            ["ssh", *ssh_options(node.ssh), "-O", "exit", "--", node.host],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in nodes
        if node.via_ssh
    ]
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
